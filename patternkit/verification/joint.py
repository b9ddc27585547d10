"""One build for a rewrite's before, after and per-site checks.

The job checks a rewrite three ways, each on a build for ``llvm``: the model as it was,
the model rewritten, and the per-site module (every site's region and replacement, and
a probe: the model again, returning the values each site reads).  Built apart, that is
three builds of the whole model.  Built as one module, the kernels the three share are
compiled once and the weights are loaded once (Relax's build deduplicates both): on a
12-layer GPT-2 one build of the three costs about 1.2 builds' time instead of 3.

The joint module holds ``before``'s functions under their own names, ``after``'s entry
function under :data:`AFTER_PREFIX` + its name, and the extra functions.  It is made only
where that is the same program: ``after``'s other functions must be ``before``'s own
(same global, equal function), and no name may clash; otherwise :func:`joint_module`
returns ``None`` and each side builds apart.  A joint module that does not build is no
verdict either: the caller builds each side apart, so that a failure is reported for
the side that caused it, exactly as without the joint build.  With builds shared off
(``PATTERNKIT_BUILD_CACHE=0``, :func:`patternkit.verification.builds.caching`), there is
no joint build either.
"""

from __future__ import annotations

from typing import Any, Mapping

import tvm
import tvm_ffi
from tvm import relax

from ..ir import compat as C
from . import builds, numeric

__all__ = ["AFTER_PREFIX", "Joint", "build_joint", "joint_module"]

#: The name of ``after``'s entry function in the joint module (prefix).
AFTER_PREFIX = "__patternkit_after__"


class Joint:
    """A joint build: :attr:`vm` runs ``before``'s functions, ``after``'s entry as
    :attr:`after_func`, and the extra functions under their names.
    """

    def __init__(self, vm: Any, after_func: str):
        self.vm = vm
        self.after_func = after_func

    def comparison(self) -> numeric.Built:
        """The builds :func:`patternkit.verification.numeric.compare` takes (``built=``)."""
        return numeric.Built(self.vm, self.after_func)


def joint_module(before: tvm.IRModule, after: tvm.IRModule, entry: str,
                 extra: Mapping[str, relax.Function] | None = None) -> tvm.IRModule | None:
    """``before``, ``after``'s ``entry`` and ``extra`` as one module, or ``None`` where
    they cannot share one (see the module docstring).  Neither module is modified.
    """
    extra = dict(extra or {})
    after_name = AFTER_PREFIX + entry
    names = {gv.name_hint for gv in before.functions}
    if after_name in names or any(name in names or name == after_name for name in extra):
        return None
    if entry not in names or not any(gv.name_hint == entry for gv in after.functions):
        return None
    for gv, func in after.functions.items():
        if gv.name_hint == entry:
            continue
        if gv.name_hint not in names:
            return None
        mine = before.get_global_var(gv.name_hint)
        if not mine.same_as(gv) or not tvm_ffi.structural_equal(before[mine], func):
            return None
    functions: dict[Any, Any] = dict(before.functions.items())
    renamed = after[entry]
    if renamed.attrs is not None and "global_symbol" in renamed.attrs:
        renamed = renamed.with_attr("global_symbol", after_name)
    functions[C.typed_global_var(after_name, renamed)] = renamed
    for name, func in extra.items():
        functions[C.typed_global_var(name, func)] = func
    return C.copy_module(before, functions)


def build_joint(before: tvm.IRModule, after: tvm.IRModule, entry: str,
                extra: Mapping[str, relax.Function] | None = None) -> Joint | None:
    """The joint build (:func:`joint_module`), or ``None`` where there is none or it does
    not build: the caller then builds each side apart.
    """
    mod = joint_module(before, after, entry, extra) if builds.enabled() else None
    if mod is None:
        return None
    try:
        return Joint(numeric.build(mod), AFTER_PREFIX + entry)
    except Exception:  # noqa: BLE001 - the sides apart say which one fails, and why
        return None
