"""Moving between Relay-style bare expressions and Relax modules.

Relay examples build a graph as one nested expression over free variables
(``gamma * (x - mean) / sqrt(var + eps) + beta``) and hand it to passes.  Relax passes
want an ``IRModule`` whose functions are in A-normal form; ``tvm.IRModule.from_expr``
gives ``main = None`` for such an expression in TVM 0.27.  :func:`from_expr` and
:func:`to_expr` convert both ways, and :func:`target_kind` lets every patternkit entry
point accept an expression, a function or a module and return the same kind.
"""

from __future__ import annotations

from typing import Any, Callable

import tvm
from tvm import relax

from ..errors import MalformedIRError
from . import compat as C
from .kinds import is_fused
from .walk import substitute


def from_expr(expr: Any, name: str = "main") -> tvm.IRModule:
    """A well-formed module whose ``main`` computes ``expr`` from its free variables.

    Parameters are the free variables in first-use order (as Relay's ``from_expr``);
    the body is one dataflow block in A-normal form.
    """
    if isinstance(expr, tvm.IRModule):
        return expr
    if isinstance(expr, relax.Function):
        return tvm.IRModule({name: expr.with_attr("global_symbol", name)})
    if not isinstance(expr, tvm.ir.Expr) or isinstance(expr, tvm.ir.Op):
        raise MalformedIRError(f"from_expr expects a Relax expression, found {type(expr).__name__}")
    params = list(relax.analysis.free_vars(expr))
    bb = relax.BlockBuilder()
    with bb.function(name, params):
        with bb.dataflow():
            out = bb.emit_output(expr)
        bb.emit_func_output(out)
    return bb.get()


def to_expr(func: relax.Function) -> Any:
    """The nested expression a function computes (inverse of :func:`from_expr`).

    Only functions made of bindings of calls, tuples and tuple items can be nested back;
    a shared intermediate becomes a shared sub-expression.
    """
    env: dict[Any, Any] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                raise MalformedIRError("to_expr cannot nest a match_cast binding "
                                       f"('{C.var_name(binding.var)}')")
            # Untyped, like an expression built with relax.op.*: a nested expression
            # is typed when it is bound again (from_expr).
            env[binding.var] = substitute(binding.value, env, keep_types=False)
    return substitute(func.body.body, env, keep_types=False)


def rewritable_functions(mod: tvm.IRModule) -> list[tuple[tvm.ir.GlobalVar, relax.Function]]:
    """Relax functions of ``mod`` a pass should look into, in a stable order."""
    out = []
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        if is_fused(func):
            continue
        out.append((gv, func))
    out.sort(key=lambda item: item[0].name_hint)
    return out


def apply_to_target(target: Any, transform: Callable[[tvm.IRModule], tvm.IRModule]) -> Any:
    """Run a module transformation on an IRModule, a Function or a bare expression.

    The result has the same kind as ``target``; the caller's object is never modified.
    """
    if isinstance(target, tvm.IRModule):
        return transform(target)
    if isinstance(target, relax.Function):
        mod = tvm.IRModule({"main": target})
        return transform(mod)["main"]
    if isinstance(target, tvm.ir.Expr) and not isinstance(target, tvm.ir.Op):
        return to_expr(transform(from_expr(target))["main"])
    raise MalformedIRError("expected a tvm.IRModule, a relax.Function or a Relax expression, "
                           f"found {type(target).__name__}")
