"""A match's bindings copied into a local function in one native call.

:func:`patternkit.engine.outline.build_group_function` builds a composite through about
twenty FFI constructors and field reads, each a crossing of the FFI from Python: for a
12-layer GPT-2's 85 composites that was a third of ``MergeComposite``'s time.
``outline.cc`` does the same reads and calls the same registered constructors from C++,
one crossing per composite.  It takes the common case only, a match whose bindings are
operator calls over leaves, and :func:`outline` returns ``None`` for anything else, when
native code is off (``PATTERNKIT_NATIVE=0``), while it is being built (in the background,
on a machine's first run) or when it cannot be built: the caller then builds the function
in Python.  Both give structurally equal functions, with the same names, types and
attributes (held to each other in the tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..native_build import NativeFunction, enabled, kind_table

__all__ = ["OUTLINE", "outline"]

#: The compiled outliner (``outline_group`` of ``outline.cc``).
OUTLINE = NativeFunction("patternkit_outline", Path(__file__).with_name("outline.cc"),
                         "outline_group", "native composite outliner", background=True)


def outline(inputs: list[Any], input_types: list[Any], members: list[Any], prefix: str,
            attrs_of: Callable[[str], Any], set_type: bool) -> Any:
    """The local function built natively, or ``None``.

    ``inputs`` / ``input_types``: the parameters' expressions and types, each parameter
    named ``prefix + i``; ``members``: the match's ``VarBinding`` s in program order, the
    root last; ``attrs_of(names)``: the function's ``DictAttrs``, given the operator names
    of the match in post-order, each followed by a space (``"relax.matmul relax.add "``);
    ``set_type``: give the body the root's type (for a caller that does not normalise the
    function).
    """
    if not enabled():
        return None
    build = OUTLINE.get()
    if build is None:
        return None
    try:
        return build(inputs, input_types, members, prefix, attrs_of, set_type, kind_table())
    except Exception as exc:  # noqa: BLE001 - a native failure must not end the run
        OUTLINE.fail("failed", exc)
        return None
