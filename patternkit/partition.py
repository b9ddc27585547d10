"""``partition``: wrap every match of a pattern in its own function, as Relay did.

Relay's ``pattern.partition(expr)`` replaced each match with a call to a function literal
tagged ``PartitionedFromPattern``; external-compiler flows (``MergeComposite``) are built
on it.  On Relax, each match becomes a *local* function bound right where the match was,
and the match's root binding becomes a call to it::

    lv_fn = R.function(FunctionVar_0_0, ...)  # attrs PartitionedFromPattern=..., **attrs
    gv = lv_fn(x, mean, ...)

Rules (Relay's, see :mod:`patternkit.grouping`): matches do not overlap; a match whose
intermediate result is read outside it is not partitioned; ``check(pre)`` may veto a
match (return ``False`` or :func:`patternkit.reject`).  Every match gets its own function,
even when two are identical (Relay semantics; TVM's ``FuseOpsByPattern`` shares them).

Parameters are the match's inputs in pattern order, named ``FunctionVar_<group>_<i>``;
constants matched by ``is_constant()`` or ``is_expr`` stay inside the function, constants
matched by a wildcard become parameters (Relay's rule).

Local functions must be lifted before ``relax.build`` (``relax.transform.LambdaLift()``);
:func:`patternkit.numeric.build` does that for you, and :func:`patternkit.DefuseOps`
inlines them back.
"""

from __future__ import annotations

from typing import Any, Callable

import tvm
from tvm import relax

from . import _compat as C
from .bindings import FunctionIndex, describe_binding, has_candidates
from .callback import NodeMap
from .errors import CallbackError, PatternError
from .exprs import apply_to_target, from_expr, rewritable_functions
from .grouping import Group, Skipped, adapt_check, find_groups
from .opnames import relay_short_name
from .pattern import DFPattern, as_pattern, root_op_names
from .rewrite import emit_function

PARTITIONED_FROM_PATTERN = "PartitionedFromPattern"


def partition(pattern: DFPattern, expr: Any, attrs: dict[str, Any] | None = None,
              check: Callable | None = None, *, skipped: list | None = None) -> Any:
    """Wrap each match of ``pattern`` in ``expr`` in its own function.

    Parameters
    ----------
    pattern : DFPattern
    expr : tvm.IRModule, relax.Function or Relax expression
        A module or function is returned as the same kind; a bare expression is turned
        into a module with :func:`patternkit.from_expr` and the module is returned (Relax
        cannot print a function literal in expression position).  Never modified.
    attrs : dict, optional
        Extra function attributes (e.g. ``{"Composite": "ccompiler.conv_add_relu"}``).
    check : callable, optional
        ``check(pre)`` or ``check(pre, node_map)``; a falsy result vetoes the match.
        ``pre`` is the root binding's value (a Call whose arguments are Vars).
    skipped : list, optional
        Receives a :class:`~patternkit.grouping.Skipped` for every match left alone.
    """
    pattern = as_pattern(pattern)
    attrs = dict(attrs or {})
    if PARTITIONED_FROM_PATTERN in attrs:
        raise PatternError(f"attrs may not set {PARTITIONED_FROM_PATTERN}; it is computed")
    checker = _adapt_check(check)

    def transform(mod: tvm.IRModule) -> tvm.IRModule:
        with C.gc_paused():
            return _partition_module(mod)

    def _partition_module(mod: tvm.IRModule) -> tvm.IRModule:
        functions = dict(mod.functions.items())
        changed = False
        for gv, func in rewritable_functions(mod):
            new_func = _partition_function(pattern, gv.name_hint, func, attrs, checker, skipped)
            if new_func is not func:
                functions[gv] = new_func
                changed = True
        return C.copy_module(mod, functions) if changed else mod

    if not isinstance(expr, (tvm.IRModule, relax.Function)):
        expr = from_expr(expr)
    return apply_to_target(expr, transform)


def _adapt_check(check: Callable | None) -> Callable[[Any, NodeMap], Any] | None:
    if check is None:
        return None
    if not callable(check):
        raise PatternError(f"check must be callable, found {type(check).__name__}")
    return adapt_check(check)


def _partition_function(pattern: DFPattern, func_name: str, func: relax.Function,
                        attrs: dict[str, Any], check, skipped: list | None) -> relax.Function:
    if not isinstance(func.body, relax.SeqExpr) or not func.body.blocks:
        return func
    if not has_candidates(func, root_op_names(pattern)):
        return func
    index = FunctionIndex.build(func)

    def group_check(group: Group):
        if check is None:
            return True
        try:
            return check(group.binding.value, NodeMap(group.match))
        except Exception as err:
            where = describe_binding(func_name, group.binding)
            raise CallbackError(f"partition check raised {type(err).__name__}: {err} "
                                f"(while checking binding '{where}')", "check", where) from err

    groups, skips = find_groups(index, pattern, group_check)
    if skipped is not None:
        skipped.extend(skips)
    if not groups:
        return func
    replacements = {}
    for group in groups:
        local = build_group_function(index, group, group.gid, attrs)
        inputs = _lifted_inputs(group)
        replacements[C.handle(group.root_var)] = relax.Call(local, inputs)
    return emit_function(func, index, replacements, "partition", func_name)


def _lifted_inputs(group: Group) -> list:
    """Inputs that become parameters: Vars, and constants captured by wildcards."""
    return [e for e in group.match.inputs
            if isinstance(e, relax.Var) or isinstance(e, tvm.ir.GenericConst)]


def build_group_function(index: FunctionIndex, group: Group, group_id: int,
                         attrs: dict[str, Any]) -> relax.Function:
    """The local function computing ``group``, tagged ``PartitionedFromPattern``."""
    inputs = _lifted_inputs(group)
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
        bindings.append(relax.VarBinding(new_var, _substitute(value, mapping)))
        mapping[C.handle(var)] = new_var
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], mapping[C.handle(root)])
    local = relax.Function(params, body, ret_ty=root.ty, is_pure=True)
    local = local.with_attr(PARTITIONED_FROM_PATTERN, partition_name(index, group))
    for key, value in attrs.items():
        local = local.with_attr(key, value)
    return relax.BlockBuilder().normalize(local)


def _substitute(expr: Any, mapping: dict[int, Any]) -> Any:
    """``expr`` with every sub-expression whose handle is in ``mapping`` replaced."""
    key = C.handle(expr)
    if key in mapping:
        return mapping[key]
    if isinstance(expr, relax.Call):
        op = expr.op
        op = mapping.get(C.handle(op), op) if isinstance(op, relax.Var) else op
        return relax.Call(op, [_substitute(a, mapping) for a in expr.args], expr.attrs,
                          expr.ty_args)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_substitute(f, mapping) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_substitute(expr.tuple_value, mapping), expr.index)
    return expr


def partition_name(index: FunctionIndex, group: Group) -> str:
    """Relay's ``PartitionedFromPattern`` string: op names in post-order, each + ``_``.

    ``add(divide(multiply(g, subtract(x, m)), sqrt(add(v, eps))), b)`` gives
    ``"subtract_multiply_add_sqrt_divide_add_"``.
    """
    interior = {C.handle(v) for v in group.interior}
    parts: list[str] = []
    seen: set[int] = set()

    def visit(expr):
        if isinstance(expr, relax.Var):
            key = C.handle(expr)
            if key in interior and key not in seen:
                seen.add(key)
                visit(index.binding_at(index.position[key]).value)
            return
        if isinstance(expr, relax.Call):
            for arg in expr.args:
                visit(arg)
            name = C.op_name(expr)
            parts.append(relay_short_name(name) if name else "Call")
        elif isinstance(expr, relax.Tuple):
            for f in expr.fields:
                visit(f)
            parts.append("Tuple")
        elif isinstance(expr, relax.TupleGetItem):
            visit(expr.tuple_value)
            parts.append(f"TupleGetItem{int(expr.index)}")

    visit(group.binding.value)
    return "".join(p + "_" for p in parts)


__all__ = ["partition", "partition_name", "build_group_function", "PARTITIONED_FROM_PATTERN",
           "Skipped"]
