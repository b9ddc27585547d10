"""``offload``: hand a whole backward function to an external compiler, as Relay users did.

The Relay-era flow wrapped the differentiated function in
``fn (...) Primitive=1, Compiler="xpucompiler", global_symbol="xpu" { ... }`` and called it
from ``main``.  In Relax the external function is a global function with those attributes
(``Codegen`` is Relax's spelling of Relay's ``Compiler``, both are set) called from a thin
wrapper that keeps the adjoint's name, so code that calls ``main_adjoint`` keeps working.
``patternkit.byoc.inline_external`` inlines it back to run on llvm.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..errors import GradientError
from ..ir import type_of
from ..ir.kinds import CODEGEN, COMPILER, GLOBAL_SYMBOL, PRIMITIVE


def offload(mod: tvm.IRModule, func: str = "main_adjoint", compiler: str = "xpucompiler",
            global_symbol: str = "xpu") -> tvm.IRModule:
    """A copy of ``mod`` where ``func``'s body runs as the external function ``global_symbol``.

    Raises
    ------
    GradientError
        ``func`` is not a Relax function of ``mod``, or ``global_symbol`` is taken.
    """
    names = {gv.name_hint for gv in mod.get_global_vars()}
    if func not in names or not isinstance(mod[func], relax.Function):
        raise GradientError(f"offload: the module has no Relax function {func!r} "
                            f"(it has {sorted(names)})")
    if global_symbol in names:
        raise GradientError(f"offload: the module already has a function named {global_symbol!r}")
    target = mod[func]
    external = relax.utils.copy_with_new_vars(target)
    for key, value in ((PRIMITIVE, 1), (COMPILER, compiler), (CODEGEN, compiler),
                       (GLOBAL_SYMBOL, global_symbol)):
        external = external.with_attr(key, value)
    rest = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != func},
                        attrs=mod.attrs)
    bb = relax.BlockBuilder(rest)
    external_gv = bb.add_func(external, global_symbol)
    params = [relax.Var(p.name, type_of(p)) for p in target.params]
    attrs = {str(k): v for k, v in target.attrs.items()} if target.attrs is not None else {}
    with bb.function(func, params, attrs=attrs, pure=target.is_pure):
        result = bb.emit(relax.Call(external_gv, params))
        bb.emit_func_output(result)
    return bb.get()
