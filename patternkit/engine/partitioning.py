"""``partition``: wrap every match of a pattern in its own function, as Relay did.

Relay's ``pattern.partition(expr)`` replaced each match with a call to a function literal
tagged ``PartitionedFromPattern``; external-compiler flows (``MergeComposite``) are built
on it.  On Relax, each match becomes a *local* function bound right where the match was,
and the match's root binding becomes a call to it::

    lv_fn = R.function(FunctionVar_0_0, ...)  # attrs PartitionedFromPattern=..., **attrs
    gv = lv_fn(x, mean, ...)

Rules (Relay's, see :mod:`patternkit.engine.proposal`): matches do not overlap; a match whose
intermediate result is read outside it is not partitioned; ``check(pre)`` may veto a
match (return ``False`` or :func:`patternkit.reject`).  Every match gets its own function,
even when two are identical (Relay semantics; TVM's ``FuseOpsByPattern`` shares them).

Parameters are the match's inputs in pattern order, named ``FunctionVar_<group>_<i>``;
constants matched by ``is_constant()`` or ``is_expr`` stay inside the function, constants
matched by a wildcard become parameters (Relay's rule).

Local functions must be lifted before ``relax.build`` (``relax.transform.LambdaLift()``);
:func:`patternkit.verification.numeric.build` does that for you, and :func:`patternkit.DefuseOps`
inlines them back.
"""

from __future__ import annotations

from typing import Any, Callable

import tvm
from tvm import relax

from ..dpl.dominator import AmbiguousDominator
from ..dpl.pattern import DFPattern, as_pattern, root_op_names
from ..errors import CallbackError, PatternError
from ..ir import compat as C
from ..ir.kinds import PARTITIONED_FROM_PATTERN
from ..ir.targets import apply_to_target, from_expr, rewritable_functions
from .emit import emit_function
from .index import FunctionIndex, describe_binding, has_candidates
from .outline import build_group_function, lifted_inputs
from .proposal import Group, adapt_check, find_groups, group_check
from .rule import MatchCheck
from .skip import Skip
from .wellformed import check_input, check_shape, checked


def partition(pattern: DFPattern, expr: Any, attrs: dict[str, Any] | None = None,
              check: Callable[..., Any] | None = None, *, skipped: list[Skip] | None = None,
              debug: bool | None = None) -> Any:
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
        ``check(pre)`` or ``check(pre, node_map)``; a falsy result or
        :func:`patternkit.reject` (returned or raised) vetoes the match.  ``pre`` is the
        root binding's value (a Call whose arguments are Vars).
    skipped : list, optional
        Receives a :class:`~patternkit.engine.skip.Skip` for every match left alone.
    debug : bool, optional
        Run TVM's ``relax.analysis.well_formed`` on the input and the output (default:
        the ``PATTERNKIT_DEBUG`` environment variable).  The cheap checks of
        :mod:`~patternkit.engine.wellformed` run always.
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
    return apply_to_target(expr, checked("partition", transform, debug))


def _adapt_check(check: Callable[..., Any] | None) -> MatchCheck | None:
    """``check`` (Relay's signature) on a :class:`RuleMatch`, refused if not callable."""
    if check is None:
        return None
    if not callable(check):
        raise PatternError(f"check must be callable, found {type(check).__name__}")
    return adapt_check(check)


def _partition_function(pattern: DFPattern, func_name: str, func: relax.Function,
                        attrs: dict[str, Any], check: MatchCheck | None,
                        skipped: list[Skip] | None) -> relax.Function:
    check_shape(func, "partition", func_name)
    if not func.body.blocks or not has_candidates(func, root_op_names(pattern)):
        return func
    index = FunctionIndex.build(func)
    check_input(index, "partition", func_name)

    def check_error(group: Group, err: Exception) -> CallbackError:
        where = describe_binding(func_name, group.binding)
        return CallbackError(f"partition check raised {type(err).__name__}: {err} "
                             f"(while checking binding '{where}')", "check", where)

    accept = None if check is None else group_check(check, {}, check_error)
    try:
        groups, skips = find_groups(index, pattern, accept, report_claimed=skipped is not None,
                                    rule="partition", function=func_name)
    except AmbiguousDominator as err:  # the pattern cannot say where a diamond ends
        raise err.in_rule("partition", func_name) from err
    if skipped is not None:
        skipped.extend(skips)
    if not groups:
        return func
    replacements = {}
    for group in groups:
        inputs = lifted_inputs(group)
        local = build_group_function(index, group, attrs, inputs)
        replacements[C.handle(group.root_var)] = relax.Call(local, inputs)
    return emit_function(func, index, replacements, "partition", func_name)

