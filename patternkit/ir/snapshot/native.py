"""The native reader behind :func:`~patternkit.ir.snapshot.snapshot`: one C++ call.

``walker.cc`` is compiled at first use (:mod:`patternkit.ir.native_build`: g++ and
ninja, cached by tvm-ffi).  It is optional: ``PATTERNKIT_NATIVE=0`` turns it off, and a
failed build (or a failure of the walk itself) warns once and leaves the pure-Python
reader in charge for the rest of the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from tvm import relax

from ..native_build import NATIVE_VARIABLE, NativeFunction, enabled, kind_table
from .reading import RawRead

__all__ = ["NATIVE_VARIABLE", "WALK", "enabled", "read", "walker"]

_FIELDS = ("var", "block", "dataflow", "kind", "op", "item", "arg_start", "args", "uses",
           "param_uses", "dtype", "rank", "dims_start", "dims")

#: The compiled walk (``snapshot_walk`` of ``walker.cc``).
WALK = NativeFunction("patternkit_snapshot", Path(__file__).with_name("walker.cc"),
                      "snapshot_walk", "native snapshot reader")


def walker() -> Callable[..., Any] | None:
    """The compiled walk, built on first call; ``None`` if it cannot be built."""
    return WALK.get()


def read(func: relax.Function) -> RawRead | None | bool:
    """The raw record of ``func``; ``None`` if its body is not a ``SeqExpr``; ``False``
    if the native walk is not available or met a type it does not know.
    """
    walk = walker()
    if walk is None:
        return False
    try:
        out = walk(func, kind_table())
    except Exception as exc:  # noqa: BLE001 - a native failure must not end the run
        WALK.fail("failed", exc)
        return False
    if int(out[0]) == 0:
        if type(func.body) is not relax.SeqExpr:
            return None
        return False
    fields: dict[str, Any] = {name: list(out[i + 1]) for i, name in enumerate(_FIELDS)}
    fields["dataflow"] = [bool(d) for d in fields["dataflow"]]
    fields["dataflow_var"] = [bool(d) for d in out[22]]
    fields["result"] = int(out[19])
    free_at, free_vars = list(out[17]), list(out[18])
    return RawRead(fields=fields, ops=list(out[15]), dtypes=list(out[16]),
                   free=list(zip(free_at, free_vars)), not_normal=int(out[20]),
                   result_not_normal=bool(int(out[21])))
