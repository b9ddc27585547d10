"""The rewrite driver: apply ``RewriteRule`` rules to Relax IR in linear time.

Algorithm (one *pass* = one callback over every function of the module):

1. Index the function's bindings in one walk (:class:`~patternkit.engine.index.FunctionIndex`):
   values per block, users, and bindings by operator.
2. Group matches as Relay did (:func:`~patternkit.engine.proposal.find_groups`): candidate roots
   are only the bindings that call the pattern's root operator, tried from the result
   back to the inputs; a match claims its interior bindings, and a match that would
   reuse a claimed binding, or whose interior result is read outside it, is skipped.
3. Call the rule's ``check`` for every group, then its rewrite with what the check
   returned (the *plan*), and validate the result: it must be a Relax expression whose
   type fits the replaced binding.
4. Emit the function once: unchanged bindings as they were, each replacement normalised
   in place (nested calls become new bindings just before it), and bindings that the
   rewrite made dead dropped (one reverse liveness pass; dead code that was already
   there is left alone).

Passes repeat, callbacks in list order, until a whole round changes nothing (callbacks
with ``rewrite_once`` take part in the first round only).  A round that still changes
the graph after ``max_passes`` rounds raises :class:`RewriteDidNotConverge` naming the
rules that were still firing, instead of looping forever as ``rewrite_call`` does.

Every step is linear in the number of bindings, and the C++ side is only called on
small, local objects, which is why this driver is 30-100x faster than
``tvm.relax.dpl.rewrite_call`` on large functions (see ``benchmarks/README.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import tvm
from tvm import relax

from ..dpl.dominator import AmbiguousDominator
from ..dpl.pattern import DFPattern, root_op_names
from ..errors import CallbackError, PatternError, RewriteDidNotConverge
from ..ir import compat as C
from ..ir.targets import apply_to_target, rewritable_functions
from .emit import emit_function
from .index import FunctionIndex, describe_binding, has_candidates
from .multi import BindingsRewriteRule, rewrite_function_bindings
from .proposal import Group, find_groups, group_check
from .rule import Reject, RewriteRule, RuleMatch
from .ruleset import RuleSet

DEFAULT_MAX_PASSES = 100


@dataclass(frozen=True)
class RewriteRecord:
    """One binding replaced by a rule: what the visualiser and reports show.

    ``root`` and ``replaced`` are variable names, computed on first use (reading a
    name crosses the FFI, and most records are only counted).
    """

    rule: str
    function: str
    root_var: Any
    replaced_vars: tuple
    round: int

    @property
    def root(self) -> str:
        return C.var_name(self.root_var)

    @property
    def replaced(self) -> tuple[str, ...]:
        return tuple(C.var_name(v) for v in self.replaced_vars)


@dataclass(frozen=True)
class SkippedMatch:
    """A match a rule found but did not rewrite, and why.

    ``rejection`` is the :class:`~patternkit.engine.rule.Reject` the rule's check gave
    (``None`` when the match was skipped for overlapping or escaping); its ``site``
    names the guard that refused.
    """

    rule: str
    function: str
    root: str
    reason: str
    rejection: Reject | None = field(default=None, compare=False, repr=False)


@dataclass
class RewriteLog:
    """Collects what a :func:`rewrite` call did; pass one in with ``log=``."""

    records: list[RewriteRecord] = field(default_factory=list)
    skipped: list[SkippedMatch] = field(default_factory=list)
    rounds: int = 0

    def count(self, rule: str | None = None) -> int:
        return sum(1 for r in self.records if rule is None or r.rule == rule)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for record in self.records:
            out[record.rule] = out.get(record.rule, 0) + 1
        return out

    def reasons(self, rule: str | None = None) -> list[str]:
        return [s.reason for s in self.skipped if rule is None or s.rule == rule]


def rewrite(callbacks: RewriteRule | Sequence[RewriteRule] | RuleSet, target: Any, *,
            max_passes: int = DEFAULT_MAX_PASSES, allow_escaping_intermediates: bool = False,
            log: RewriteLog | None = None) -> Any:
    """Apply rewrite rules until nothing changes; Relay's ``rewrite``.

    Parameters
    ----------
    callbacks : RewriteRule (or DFPatternCallback), a sequence of them, or a RuleSet
        Applied in order, one full pass each per round.  Of a :class:`RuleSet`, the
        rewrite rules are applied (its composites are for ``MergeComposite``).
    target : tvm.IRModule, relax.Function or Relax expression
        Returned as the same kind; never modified.  In a module, every Relax function
        is rewritten except those created by fusion or partitioning (``Primitive``,
        ``Composite``, ``Codegen``, ``PartitionedFromPattern``).
    max_passes : int
        Maximum number of rounds before :class:`RewriteDidNotConverge` (Relay used 100).
    allow_escaping_intermediates : bool
        By default (as in Relay) a match whose interior result is also read outside the
        match is not rewritten; with ``True`` it is, and the interior binding is kept for
        its other readers (``tvm.relax.dpl.rewrite_call``'s behaviour).
    log : RewriteLog, optional
        Receives a record of every replaced binding and every skipped match.

    Notes
    -----
    Overlapping matches: roots are taken from the function's result backwards and each
    match claims its interior bindings, so of two overlapping matches the one nearer the
    output wins; the other may match in the next round, against the rewritten graph.
    Dead bindings: bindings that a rewrite leaves unused are removed at the end of the
    pass that made them dead; non-dataflow (user-visible) bindings are never removed.
    """
    rules = _as_rule_list(callbacks)
    if max_passes < 1:
        raise ValueError(f"max_passes must be at least 1, got {max_passes}")

    def transform(mod: tvm.IRModule) -> tvm.IRModule:
        with C.gc_paused():
            return _run_rounds(rules, mod, max_passes, allow_escaping_intermediates, log)

    return apply_to_target(target, transform)


def Rewrite(callbacks: RewriteRule | Sequence[RewriteRule] | RuleSet, *,
            max_passes: int = DEFAULT_MAX_PASSES, allow_escaping_intermediates: bool = False,
            name: str | None = None) -> tvm.transform.Pass:
    """:func:`rewrite` as a ``tvm.transform.Pass`` for ``tvm.transform.Sequential``."""
    rules = _as_rule_list(callbacks)
    pass_name = name or "patternkit.Rewrite(" + ",".join(r.rule_name for r in rules) + ")"

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite(rules, mod, max_passes=max_passes,
                       allow_escaping_intermediates=allow_escaping_intermediates)

    return C.module_pass(transform, pass_name)


# -- rounds ------------------------------------------------------------------------------
def _as_rule_list(callbacks: Any) -> list[RewriteRule]:
    if isinstance(callbacks, RuleSet):
        rules = list(callbacks.rewrite_rules())
        if not rules:
            raise PatternError(f"rewrite needs at least one rule; {callbacks!r} has no "
                               f"rewrite rules (its composites are for MergeComposite)")
        return _as_rule_list(rules)
    rules = [callbacks] if isinstance(callbacks, RewriteRule) else list(callbacks)
    if not rules:
        raise PatternError("rewrite needs at least one rule (a DFPatternCallback)")
    for rule in rules:
        if not isinstance(rule, RewriteRule):
            raise PatternError(f"expected a DFPatternCallback (a rewrite rule), found "
                               f"{type(rule).__name__}: "
                               f"{rule!r}")
        if isinstance(rule, BindingsRewriteRule):  # several roots: a context, no pattern
            rule.validate()
            continue
        if not isinstance(rule.pattern, DFPattern):
            found = "None (set self.pattern in __init__)" if rule.pattern is None \
                else f"a {type(rule.pattern).__module__}.{type(rule.pattern).__name__}"
            raise PatternError(f"{rule.rule_name}.pattern must be a patternkit pattern "
                               f"(wildcard(), is_op(...), ...); found {found}")
    return rules


def _run_rounds(rules: list[RewriteRule], mod: tvm.IRModule, max_passes: int,
                allow_escaping: bool, log: RewriteLog | None) -> tvm.IRModule:
    """Apply ``rules`` in rounds until a round changes nothing.

    ``log`` is ``None`` when the caller asked for none: then nothing is recorded, so
    no per-rewrite object outlives the pass (see :func:`patternkit.ir.compat.gc_paused`).
    """
    active = list(rules)
    roles = {id(rule): rule.roles() for rule in rules}
    for round_index in range(max_passes):
        firing: list[tuple[str, tuple]] = []
        for rule in active:
            mod, fired = _apply_rule(rule, roles[id(rule)], mod, allow_escaping, log,
                                     round_index)
            if fired:
                firing.append((rule.rule_name, fired))
        if log is not None:
            log.rounds = round_index + 1
        active = [r for r in active if not r.rewrite_once]
        if not firing or not active:
            return mod
    names = ", ".join(sorted({name for name, _ in firing}))
    last = describe_binding(*firing[-1][1])
    raise RewriteDidNotConverge(
        f"rewrite did not converge after {max_passes} passes; rules still changing the "
        f"graph: {names} (last rewrite at {last}). A rule whose replacement "
        f"matches its own pattern, or two rules undoing each other, never settle; set "
        f"rewrite_once=True or change the pattern")


def _apply_rule(rule: RewriteRule, roles: dict, mod: tvm.IRModule, allow_escaping: bool,
                log: RewriteLog | None, round_index: int) -> tuple[tvm.IRModule, tuple | None]:
    """One pass of one rule over every function.

    Returns the module and ``(function name, binding)`` of the last rewrite (``None`` if
    nothing changed), formatted only if it ends up in an error message.
    """
    updates: dict[tvm.ir.GlobalVar, relax.Function] = {}
    last = None
    for gv, func in rewritable_functions(mod):
        new_func, changed = _rewrite_function(rule, roles, gv.name_hint, func, allow_escaping,
                                              log, round_index)
        if changed:
            updates[gv] = new_func
            last = changed
    if not updates:
        return mod, None
    functions = dict(mod.functions.items())
    functions.update(updates)
    return C.copy_module(mod, functions), last


def _rewrite_function(rule: RewriteRule, roles: dict, func_name: str, func: relax.Function,
                      allow_escaping: bool, log: RewriteLog | None,
                      round_index: int) -> tuple[relax.Function, tuple | None]:
    if isinstance(rule, BindingsRewriteRule):  # several roots: engine/multi.py
        done = rewrite_function_bindings(rule, roles, func_name, func, collect=log is not None)
        if log is not None:
            log.records.extend(RewriteRecord(rule.rule_name, func_name, root, replaced,
                                             round_index) for root, replaced in done.rewritten)
            log.skipped.extend(SkippedMatch(rule.rule_name, func_name, root, reason, refusal)
                               for root, reason, refusal in done.refused)
        return done.function, done.last
    if not isinstance(func.body, relax.SeqExpr) or not func.body.blocks:
        return func, None
    if not has_candidates(func, root_op_names(rule.pattern)):
        return func, None
    index = FunctionIndex.build(func)
    checker = rule.match_check()  # None: the rule accepts every match, skip the calls
    check = None if checker is None else group_check(
        checker, roles, lambda group, err: _callback_error(rule, "check", func_name, group, err))
    try:
        groups, skipped = find_groups(index, rule.pattern, check, allow_escaping)
    except AmbiguousDominator as err:  # the pattern cannot say where a diamond ends
        raise err.in_rule(rule.rule_name, func_name) from err
    if log is not None:
        for s in skipped:
            log.skipped.append(SkippedMatch(rule.rule_name, func_name, s.root, s.reason,
                                            s.rejection))
    replacements: dict[Any, Any] = {}
    for group in groups:
        new_value = _call_rule(rule, roles, func_name, group)
        if new_value is None:
            continue
        root_var = group.root_var
        replacements[C.handle(root_var)] = new_value
        if log is not None:
            log.records.append(RewriteRecord(rule.rule_name, func_name, root_var,
                                             (*group.match.internal, root_var), round_index))
    if not replacements:
        return func, None
    new_func = emit_function(func, index, replacements, rule.rule_name, func_name)
    last_group = next(g for g in reversed(groups) if C.handle(g.root_var) in replacements)
    return new_func, (func_name, last_group.binding)


def _call_rule(rule: RewriteRule, roles: dict, func_name: str, group: Group) -> Any:
    """Run the rewrite; ``None`` means "leave this binding as it is"."""
    pre = group.match.root  # the binding's value, as the matcher saw it
    try:
        result = rule.rewrite_match(RuleMatch(group.match, roles, group.plan))
    except Exception as err:
        raise _callback_error(rule, "callback", func_name, group, err) from err
    if result is None:
        return None
    if not isinstance(result, tvm.ir.Expr) or isinstance(result, (tvm.ir.Op, relax.Function)):
        raise CallbackError(
            f"rule {rule.rule_name}: callback returned {type(result).__name__} ({result!r:.80}) "
            f"where a Relax expression was expected, at binding "
            f"'{describe_binding(func_name, group.binding)}'",
            rule.rule_name, describe_binding(func_name, group.binding))
    key = C.handle(result)
    if key == C.handle(pre) or key == C.handle(group.root_var):
        return None
    if type(result) is type(pre) and C.structural_equal(result, pre):
        return None
    return result


def _callback_error(rule: RewriteRule, what: str, func_name: str, group: Group,
                    err: Exception) -> CallbackError:
    where = describe_binding(func_name, group.binding)
    return CallbackError(f"rule {rule.rule_name}: {what} raised {type(err).__name__}: {err} "
                         f"(while rewriting binding '{where}')", rule.rule_name, where)
