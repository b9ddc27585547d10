"""The adjoint's primal half with the user's fused ops back: ``gradient(collapse_forward=True)``.

``relax.transform.Gradient`` differentiates the *expanded* copy of the function, so the
forward half of ``<func>_adjoint`` computes every fused op (``layer_norm``, ``gelu``,
``attention`` ...) written out, and the backward half reads that interior (a layer norm's
normalised input and standard deviation, a GELU's erf).  Collapsing the written-out forms
back is refused there, since the interior is read outside the match.

:func:`restore_fused_forward` takes the other way round: the forward *value* of every op
that was expanded comes from the user's own fused call again (its arguments the adjoint's
forward values, as in the user's function), and of the expansion's interior only what the
backward half reads is kept; the rest is dead and removed.  The values downstream of a
restored op (the next layer's input) read the fused result, so nothing is computed twice
but the interior the backward needs.

The trade-off: the restored forward computes each fused op *and* the part of its
expansion that the backward reads (for a layer norm, its mean and standard deviation; for
a GELU, the polynomial of its erf), so it does somewhat more arithmetic than the expanded
forward, and holds the same saved activations; what it gains is the fused kernels in the
forward (a backend that takes ``R.nn.layer_norm`` runs it) and a primal half that reads as
the user's model.  ``benchmarks/README.md`` has the measured figures.

How the ops are found: the expand rules keep each rewritten binding's Var (the engine
replaces a binding's value, never its variable), so the user's bindings are found in the
expanded function by identity; ``Gradient`` copies the expanded bindings, in order and
with their names, to the start of the adjoint, so they are found there by position (names
and types checked).  Where either does not hold the adjoint is left as it is, and the
reason is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from ..ir import op_name
from ..ir.walk import vars_read
from .ops import has_gradient


@dataclass
class Restoration:
    """What :func:`restore_fused_forward` did.

    Attributes
    ----------
    restored : dict of str to int
        The fused ops whose forward value comes from the user's call again, with counts.
    removed : int
        Bindings of the expansions' interiors that no backward binding reads, removed.
    left : list of str
        Why a fused op (or the whole adjoint) was left written out, one line each.
    """

    restored: dict[str, int] = field(default_factory=dict)
    removed: int = 0
    left: list[str] = field(default_factory=list)


def restore_fused_forward(user: relax.Function, expanded: relax.Function,
                          adjoint: relax.Function,
                          result: Restoration | None = None) -> relax.Function:
    """``adjoint`` whose forward half computes the user's fused ops again (module docstring).

    Parameters
    ----------
    user : relax.Function
        The function as the user wrote it (its fused ops).
    expanded : relax.Function
        The copy ``Gradient`` differentiated: ``user`` with the fused ops written out.
    adjoint : relax.Function
        ``Gradient``'s ``<func>_adjoint`` of ``expanded``.
    result : Restoration, optional
        Filled with what was restored and what was left.

    Returns
    -------
    relax.Function
        The new adjoint (``adjoint`` itself when nothing could be restored).
    """
    result = result if result is not None else Restoration()
    forward = _bindings(expanded)
    block = adjoint.body.blocks[0] if len(adjoint.body.blocks) == 1 else None
    bindings = list(block.bindings) if isinstance(block, relax.DataflowBlock) else []
    mismatch = _prefix_mismatch(forward, bindings)
    if mismatch is not None:
        result.left.append(mismatch)
        return adjoint
    # the user's Vars -> the adjoint's: parameters by position, bindings through expanded
    to_adjoint: dict[Any, Any] = dict(zip(user.params, adjoint.params))
    position = {binding.var: i for i, binding in enumerate(forward)}
    for binding in _bindings(user):
        if binding.var in position:
            to_adjoint[binding.var] = bindings[position[binding.var]].var
    for binding in _bindings(user):
        call = binding.value
        name = op_name(call) if isinstance(call, relax.Call) else None
        if name is None or has_gradient(name):
            continue
        index = position.get(binding.var)
        if index is not None and tvm_ffi.structural_equal(forward[index].value, call):
            continue  # not expanded: off the differentiated path (a mask's arange)
        args = [_substitute(arg, to_adjoint) for arg in call.args]
        if index is None or any(arg is None for arg in args):
            result.left.append(f"{binding.var.name} = {name}: its binding or an argument "
                               f"is not in the differentiated copy")
            continue
        fused = relax.Call(call.op, args, call.attrs, call.ty_args)
        target = bindings[index]
        bindings[index] = relax.VarBinding(target.var, fused)
        result.restored[name] = result.restored.get(name, 0) + 1
    if not result.restored:
        return adjoint
    kept = _live(bindings, adjoint.body.body)
    result.removed = len(bindings) - len(kept)
    body = relax.SeqExpr([relax.DataflowBlock(kept)], adjoint.body.body)
    restored = relax.Function(adjoint.params, body, adjoint.ret_ty, adjoint.is_pure,
                              adjoint.attrs)
    return relax.transform.Normalize()(tvm.IRModule({"f": restored}))["f"]


def _bindings(func: relax.Function) -> list:
    return [b for block in func.body.blocks for b in block.bindings]


def _prefix_mismatch(forward: list, bindings: list) -> str | None:
    """Why the adjoint does not start with copies of ``forward`` (``None``: it does)."""
    if len(bindings) < len(forward):
        return "the adjoint is not one dataflow block starting with the forward bindings"
    for mine, theirs in zip(forward, bindings):
        if mine.var.name != theirs.var.name or not tvm_ffi.structural_equal(
                mine.var.ty, theirs.var.ty):
            return (f"the adjoint's forward half differs from the differentiated copy at "
                    f"{theirs.var.name} (expected {mine.var.name})")
    return None


def _substitute(arg: Any, to_adjoint: dict[Any, Any]) -> Any:
    """``arg`` with the user's Vars replaced by the adjoint's (``None``: one is missing)."""
    if isinstance(arg, relax.Var):
        return to_adjoint.get(arg)
    if isinstance(arg, relax.Tuple):
        fields = [_substitute(item, to_adjoint) for item in arg.fields]
        return None if any(item is None for item in fields) else relax.Tuple(fields)
    return None if vars_read(arg) else arg  # a constant, a shape, a prim value


def _live(bindings: list, result: Any) -> list:
    """``bindings`` without the dataflow bindings nothing live reads (pure by construction)."""
    needed = set(vars_read(result))
    kept = []
    for binding in reversed(bindings):
        var = binding.var
        if isinstance(var, relax.DataflowVar) and var not in needed:
            continue
        kept.append(binding)
        needed.update(vars_read(binding.value))
    kept.reverse()
    return kept
