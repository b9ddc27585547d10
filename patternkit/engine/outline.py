"""Outline a match into a function of its own: the common step of partition and composites.

A match (:class:`~patternkit.engine.proposal.Group`) becomes a local function whose
parameters are the match's inputs and whose body re-binds the match's interior bindings,
tagged with Relay's ``PartitionedFromPattern`` string.  :func:`patternkit.partition` and
``MergeComposite`` call the function in place of the match.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from ..ir import compat as C
from ..ir.kinds import PARTITIONED_FROM_PATTERN
from ..ir.opnames import relay_short_name
from ..ir.walk import substitute
from .index import FunctionIndex
from .proposal import Group


def lifted_inputs(group: Group) -> list:
    """Inputs that become parameters: Vars, constants captured by wildcards, and the
    symbolic dimensions the match uses but its inputs do not define.

    A ``reshape(x, (batch, seq, 16))`` of an ``x`` shaped ``(batch * seq, 16)`` uses
    ``batch`` and ``seq``, which no parameter of type ``(batch * seq, 16)`` defines; they
    are passed in as one ``R.Shape([batch, seq])`` argument (a Relax function's shape
    parameter defines its symbolic variables), so the function keeps its result type.
    """
    inputs = [e for e in group.match.inputs
              if isinstance(e, relax.Var) or isinstance(e, tvm.ir.GenericConst)]
    missing = _undefined_symbolic_vars(group, inputs)
    if missing:
        inputs.append(relax.ShapeExpr(missing))
    return inputs


def _undefined_symbolic_vars(group: Group, inputs: list) -> list:
    """Symbolic variables in the types of the match's bindings that no input type defines."""
    defined = {C.handle(v) for e in inputs
               for v in relax.analysis.definable_tir_vars_in_type(C.type_of(e))}
    missing: dict[int, Any] = {}
    for var in group.interior:
        for v in relax.analysis.tir_vars_in_type(var.ty):
            if C.handle(v) not in defined:
                missing.setdefault(C.handle(v), v)
    return sorted(missing.values(), key=lambda v: v.name)


def build_group_function(index: FunctionIndex, group: Group, attrs: dict[str, Any],
                         inputs: list | None = None) -> relax.Function:
    """The local function computing ``group``, tagged ``PartitionedFromPattern``.

    Parameters are named ``FunctionVar_<group>_<i>`` after the group's number
    (:attr:`Group.gid`), as Relay named them; one per ``inputs`` (default
    :func:`lifted_inputs`, which a caller that also passes them as the call's arguments
    computes once and hands in).
    """
    group_id = group.gid
    inputs = lifted_inputs(group) if inputs is None else inputs
    mapping: dict[Any, Any] = {}
    params = []
    for i, expr in enumerate(inputs):
        param = relax.Var(f"FunctionVar_{group_id}_{i}", C.type_of(expr))
        params.append(param)
        mapping[C.handle(expr)] = param
    interior = sorted(group.interior, key=index.position_of)
    root = group.root_var
    bindings = []
    for var in interior:
        value = index.binding_at(index.position_of(var)).value
        new_var = (relax.Var(C.var_name(var), var.ty) if var.same_as(root)
                   else relax.DataflowVar(C.var_name(var), var.ty))
        # Left untyped: the normalisation at the end types the whole body at once.
        new_value = substitute(value, mapping, by_handle=True, keep_types=False)
        bindings.append(relax.VarBinding(new_var, new_value))
        mapping[C.handle(var)] = new_var
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], mapping[C.handle(root)])
    local = relax.Function(params, body, ret_ty=root.ty, is_pure=True)
    local = local.with_attr(PARTITIONED_FROM_PATTERN, partition_name(index, group))
    for key, value in attrs.items():
        local = local.with_attr(key, value)
    return relax.BlockBuilder().normalize(local)


def partition_name(index: FunctionIndex, group: Group) -> str:
    """Relay's ``PartitionedFromPattern`` string: op names in post-order, each + ``_``.

    ``add(divide(multiply(g, subtract(x, m)), sqrt(add(v, eps))), b)`` gives
    ``"subtract_multiply_add_sqrt_divide_add_"``.
    """
    interior = {C.handle(v) for v in group.interior}
    parts: list[str] = []
    _post_order_names(index, group.binding.value, interior, set(), parts)
    return "".join(p + "_" for p in parts)


def _post_order_names(index: FunctionIndex, expr: Any, interior: set[int], seen: set[int],
                      parts: list[str]) -> None:
    """Append the op names of ``expr`` to ``parts``, looking through ``interior`` Vars.

    A module-level function, not a closure: a closure that calls itself is a reference
    cycle, which kept each group's match and the whole FunctionIndex alive past the pass
    until the garbage collector swept them (180 ms at 24k bindings; see ``gc_paused``).
    """
    if isinstance(expr, relax.Var):
        key = C.handle(expr)
        if key in interior and key not in seen:
            seen.add(key)
            _post_order_names(index, index.binding_at(index.position[key]).value, interior,
                              seen, parts)
        return
    if isinstance(expr, relax.Call):
        for arg in expr.args:
            _post_order_names(index, arg, interior, seen, parts)
        name = C.op_name(expr)
        parts.append(relay_short_name(name) if name else "Call")
    elif isinstance(expr, relax.Tuple):
        for f in expr.fields:
            _post_order_names(index, f, interior, seen, parts)
        parts.append("Tuple")
    elif isinstance(expr, relax.TupleGetItem):
        _post_order_names(index, expr.tuple_value, interior, seen, parts)
        parts.append(f"TupleGetItem{int(expr.index)}")
