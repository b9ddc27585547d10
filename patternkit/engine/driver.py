"""The rewrite driver: apply ``RewriteRule`` rules to Relax IR in linear time.

Algorithm.  The driver works in *rounds*; a round applies every active rule, in list
order, to every function of the module:

1. Index each function once per round (:class:`~patternkit.engine.index.FunctionIndex`),
   if the root operator of some active rule occurs in it (a cheap pre-scan): values
   per block, users, bindings by operator, dead code.  All the round's rules share this
   index, and each rule's candidate roots are looked up in it by the rule's root
   operators, so a rule whose root does not occur costs nothing.
2. For each rule, group its matches as Relay did
   (:func:`~patternkit.engine.proposal.find_groups`): roots are tried from the result
   back to the inputs; a match claims its interior bindings, and a match that would
   reuse a claimed binding, or whose interior result is read outside it, is skipped.
3. Call the rule's ``check`` for every group, then its rewrite with what the check
   returned (the *plan*).  A rewrite returning ``None`` leaves the binding (logged; a
   rule that answers every match so warns once per call,
   :mod:`~patternkit.engine.declines`).
4. Emit each changed function once at the end of the round
   (:func:`~patternkit.engine.emit.emit_rewrites`): unchanged bindings as they were,
   each replacement checked to read only Vars in scope and normalised in place, and the
   bindings the round's rewrites left dead dropped.

Rules of one round see each function as the round found it, less what earlier rules of
the round took:

* a binding an earlier rule *replaced* is opaque: a later match may read its Var (and
  so the new value), but not look through it to its old value, nor replace it;
* a binding an earlier rule *absorbed* (a match's interior) is taken: a later match that
  would include it is skipped as an overlap;
* the Vars an earlier replacement reads count as readers: a later match with one of
  them as an intermediate is skipped as escaping.

What a later rule could only match in the graph an earlier rule produced, it matches
in the next round.  The fixed point is the one Relay's rule-by-rule passes reach, for
one index per function and round instead of one per rule and round; a rewrite may
happen a round later than it would have.

Rules match in one of two ways, the two strategies of the pattern language: a rule with
a ``pattern`` (one root) as above, a rule with a ``context`` (several roots, a
``PatternContext``) over whole blocks (:func:`~patternkit.engine.multi.rewrite_function_bindings`),
after the round's single-root rules and sharing their function indexes.  Both kinds
are the same protocol to the driver: ``check(match)``, then ``rewrite(match)``.

Rounds repeat until a round changes nothing (rules with ``rewrite_once`` take part
in the first round only).  Two guards stop a rule set that never settles, instead of
looping as ``rewrite_call`` does, both with :class:`RewriteDidNotConverge`: after
``max_passes`` rounds, naming the rules still firing; and as soon as a round leaves a
function with more than ``max_growth`` times the bindings it came in with, plus
:data:`GROWTH_SLACK`, naming the rule that grew it (``relu(a) -> relu(relu(a))``
doubles the graph every round: without this guard it reached 17 GB in 10 minutes).

Dead code (removable bindings nothing live reads, see :mod:`~patternkit.engine.index`)
is invisible to rules: it is never a match's root, its reads do not make an
intermediate escape, and it goes when a rewrite removes what it reads; dead code that
reads nothing removed is kept.  What each pass receives and emits is checked
(:mod:`~patternkit.engine.wellformed`).

Every step is linear in the number of bindings, and the C++ side is only called on
small, local objects, which is why this driver is 30-100x faster than
``tvm.relax.dpl.rewrite_call`` on large functions (see ``benchmarks/README.md``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import tvm
from tvm import relax

from ..dpl.dominator import AmbiguousDominator
from ..dpl.pattern import COMMUTATIVE_OPS, DFPattern, required_op_names, root_op_names
from ..errors import CallbackError, PatternError, RewriteDidNotConverge
from ..ir import compat as C
from ..ir.compat import VAR_TYPES
from ..ir.targets import apply_to_target, rewritable_functions
from .declines import DeclineTally, warn_silent_declines
from .emit import Emitted, emit_rewrites
from .index import FunctionIndex, describe_binding, forget_index, has_candidates, reads_of_value
from .module_scope import module_in_scope
from .multi import rewrite_function_bindings
from .near_misses import NearMiss, NearMissDetector, find_near_misses
from .proposal import Group, find_groups, group_check
from .rule import MatchCheck, RewriteRule, Rule, RuleMatch, as_rule, check_of, require_instance
from .ruleset import RuleSet
from .skip import Skip, SkipKind
from .wellformed import assert_well_formed, check_input, check_shape, debug_mode

_LOG = logging.getLogger(__name__)

DEFAULT_MAX_PASSES = 100

#: Default ``max_growth``: a round may leave a function with at most twice the bindings
#: it came in with (plus :data:`GROWTH_SLACK`).
DEFAULT_MAX_GROWTH = 2.0

#: Bindings a function may grow by on top of ``max_growth`` times its input's, so that
#: an expansion of a small function (one fused op into its written-out form) passes.
GROWTH_SLACK = 64

#: The pass named in errors.
PASS_NAME = "rewrite"


@dataclass(frozen=True)
class RewriteRecord:
    """One binding replaced by a rule: what the visualiser and reports show.

    ``root`` and ``replaced`` are variable names, computed on first use (reading a
    name crosses the FFI, and most records are only counted).
    """

    rule: str
    function: str
    root_var: Any
    replaced_vars: tuple[Any, ...]
    round: int
    #: The value the rule put in place of the root (``None`` for a multi-root rule), and
    #: the function as the round found it: with them the matched region and its
    #: replacement can be cut out and run side by side (per-site validation,
    #: :mod:`patternkit.verification.sites`).  References only: nothing is computed.
    replacement: Any = field(default=None, compare=False, repr=False)
    source: Any = field(default=None, compare=False, repr=False)
    #: A multi-root rule's rewrite has no single replacement: the function it emitted,
    #: where the replaced Vars are bound to their new values.
    result: Any = field(default=None, compare=False, repr=False)

    @property
    def root(self) -> str:
        """The name of the rewritten root's Var, for logs that outlive the IR."""
        return C.var_name(self.root_var)

    @property
    def replaced(self) -> tuple[str, ...]:
        """The names of the Vars the rewrite replaced (a match's interior, root last)."""
        return tuple(C.var_name(v) for v in self.replaced_vars)


#: A match a rule found but did not rewrite, and why: the engine's one skip record, by
#: the name the driver's log has always used (``kind`` is ``"declined"`` when the rewrite
#: itself returned ``None``).
SkippedMatch = Skip


@dataclass
class RewriteLog:
    """Collects what a :func:`rewrite` call did; pass one in with ``log=``."""

    records: list[RewriteRecord] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    rounds: int = 0
    #: The module the last rewrite left (what :meth:`near_misses` looks in).
    result: Any = field(default=None, repr=False)

    def count(self, rule: str | None = None) -> int:
        """How many rewrites ``rule`` made (all rules' if ``None``)."""
        return sum(1 for r in self.records if rule is None or r.rule == rule)

    def counts(self) -> dict[str, int]:
        """Rewrites per rule name, in the order the rules first fired."""
        out: dict[str, int] = {}
        for record in self.records:
            out[record.rule] = out.get(record.rule, 0) + 1
        return out

    def reasons(self, rule: str | None = None) -> list[str]:
        """Why ``rule``'s matches were skipped (all rules' if ``None``), in skip order."""
        return [s.reason for s in self.skipped if rule is None or s.rule == rule]

    def near_misses(self, detectors: Sequence[NearMissDetector]) -> list[NearMiss]:
        """Where a family's skeleton is left in the rewritten module, and why its rules
        declined it (:mod:`~patternkit.engine.near_misses`); the library's detectors are
        ``patternkit.patterns.near_misses.NEAR_MISSES``.
        """
        if self.result is None:
            raise ValueError("near_misses(): this log has seen no rewrite yet; pass it as "
                             "rewrite(rules, mod, log=log) first")
        return find_near_misses(self.result, detectors, self.skipped)


def rewrite(rules: Any = None, target: Any = None, mod: tvm.IRModule | None = None, *,
            max_passes: int = DEFAULT_MAX_PASSES, allow_escaping_intermediates: bool = False,
            log: RewriteLog | None = None, max_growth: float | None = DEFAULT_MAX_GROWTH,
            debug: bool | None = None, callbacks: Any = None) -> Any:
    """Apply rewrite rules until nothing changes; Relay's ``rewrite``.

    Parameters
    ----------
    rules : RewriteRule (or DFPatternCallback), a sequence of them, or a RuleSet
        Applied in order, each once per round (see the module docstring for what rules
        of one round see of each other).  Of a :class:`RuleSet`, the rewrite rules are
        applied (its composites are for ``MergeComposite``).  Pass instances, not
        classes.  ``callbacks=`` is accepted for it too (Relay's name).
    target : tvm.IRModule, relax.Function or Relax expression
        Returned as the same kind; never modified.  In a module, every Relax function
        is rewritten except those created by fusion or partitioning (``Primitive``,
        ``Composite``, ``Codegen``, ``PartitionedFromPattern``).
    mod : tvm.IRModule, optional
        Relay's third argument (``rewrite(callbacks, expr, mod)``), which Relay's matcher
        needed to type ``expr``: accepted so that ported code runs, and not needed, since
        Relax expressions carry their types.  It must be an ``IRModule``.
    max_passes : int
        Maximum number of rounds before :class:`RewriteDidNotConverge` (Relay used 100).
    allow_escaping_intermediates : bool
        By default (as in Relay) a match whose interior result is also read outside the
        match is not rewritten; with ``True`` it is, and the interior binding is kept for
        its other readers (``tvm.relax.dpl.rewrite_call``'s behaviour).
    log : RewriteLog, optional
        Receives a record of every replaced binding and every skipped match (including
        the matches a rewrite declined by returning ``None``).
    max_growth : float or None
        Stop with :class:`RewriteDidNotConverge` when a round leaves a function with
        more than ``max_growth`` times its input's bindings plus :data:`GROWTH_SLACK`;
        ``None``: no bound.  Raise it for rule sets that expand on purpose.
    debug : bool, optional
        Also run TVM's full ``relax.analysis.well_formed`` on the input and after every
        round (default: the ``PATTERNKIT_DEBUG`` environment variable).

    Raises
    ------
    PatternError
        Something that is not a rewrite rule (a rule class instead of an instance, a
        rule without a patternkit pattern).
    MalformedIRError
        The input is not well formed or not normalised, or a rewrite returned an
        expression reading a Var that is not in scope; names the function and binding.
    CallbackError
        A check or rewrite raised, or returned something that cannot replace the match.
    RewriteDidNotConverge
        ``max_passes`` rounds still changed the graph, or a round grew it past the bound.

    Notes
    -----
    Overlapping matches: roots are taken from the function's result backwards and each
    match claims its interior bindings, so of two overlapping matches of one rule the
    one nearer the output wins; of two rules, the earlier in the list.  The other may
    match in the next round, against the rewritten graph.  Dead bindings: bindings that a
    round's rewrites leave without live readers are removed at the end of that round;
    non-dataflow (user-visible) bindings are never removed.
    """
    rules = _as_rule_list(_rules_argument(rules, callbacks, "rewrite"))
    if target is None:
        raise TypeError("rewrite() needs a target: rewrite(rules, mod)")
    if mod is not None and not isinstance(mod, tvm.IRModule):
        raise TypeError(f"rewrite(rules, expr, mod): mod must be a tvm.IRModule (Relay's "
                        f"third argument), got {type(mod).__name__}")
    if max_passes < 1:
        raise ValueError(f"max_passes must be at least 1, got {max_passes}")
    if max_growth is not None and not max_growth >= 1:
        raise ValueError(f"max_growth must be at least 1 (or None for no bound), got "
                         f"{max_growth}")
    options = _Options(max_passes, allow_escaping_intermediates, max_growth, debug_mode(debug),
                       log)

    def transform(mod: tvm.IRModule) -> tvm.IRModule:
        with C.gc_paused(), module_in_scope(mod):  # for rules reading a PrimFunc
            out = _run_rounds(rules, mod, options)
        if log is not None:
            log.result = out
        return out

    return apply_to_target(target, transform)


def Rewrite(rules: Any = None, *,  # noqa: N802
            max_passes: int = DEFAULT_MAX_PASSES, allow_escaping_intermediates: bool = False,
            max_growth: float | None = DEFAULT_MAX_GROWTH, debug: bool | None = None,
            name: str | None = None, callbacks: Any = None) -> tvm.transform.Pass:
    """:func:`rewrite` as a ``tvm.transform.Pass`` for ``tvm.transform.Sequential``."""
    rules = _as_rule_list(_rules_argument(rules, callbacks, "Rewrite"))
    pass_name = name or "patternkit.Rewrite(" + ",".join(r.name for r in rules) + ")"

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite(rules, mod, max_passes=max_passes,
                       allow_escaping_intermediates=allow_escaping_intermediates,
                       max_growth=max_growth, debug=debug)

    return C.module_pass(transform, pass_name)


# -- rules ---------------------------------------------------------------------------------
def _rules_argument(rules: Any, callbacks: Any, where: str) -> Any:
    """The rules given positionally or as ``rules=``, or by Relay's name ``callbacks=``."""
    if callbacks is None:
        if rules is None:
            raise TypeError(f"{where}() needs rules: {where}(rules, ...)")
        return rules
    if rules is not None:
        raise TypeError(f"{where}() got rules twice (rules and callbacks=); pass one")
    return callbacks


def _as_rule_list(given: Any) -> list[RewriteRule]:
    """The rewrite rules ``given`` (a rule, a callback, a sequence or a RuleSet), each on
    the rule protocol and checked to have what it matches.
    """
    require_instance(given, PASS_NAME)
    if isinstance(given, RuleSet):
        items = list(given.rewrite_rules())
        if not items:
            raise PatternError(f"rewrite needs at least one rule; {given!r} has no "
                               f"rewrite rules (its composites are for MergeComposite)")
    elif isinstance(given, Rule) or callable(getattr(given, "as_rule", None)):
        items = [given]
    else:
        try:
            items = list(given)
        except TypeError:
            raise PatternError(f"rewrite expects a rewrite rule (a RewriteRule or a "
                               f"DFPatternCallback), a list of them or a RuleSet, found "
                               f"{type(given).__name__}: {given!r:.80}") from None
    if not items:
        raise PatternError("rewrite needs at least one rule (a RewriteRule or a "
                           "DFPatternCallback)")
    rules = []
    for i, item in enumerate(items):
        rule = as_rule(item, f"{PASS_NAME}: rule {i}")
        if not isinstance(rule, RewriteRule):
            raise PatternError(f"{PASS_NAME}: rule {i} ({rule.name}) is a "
                               f"{type(rule).__name__}, not a rewrite rule (a composite is "
                               f"for MergeComposite)")
        rule.validate()
        rules.append(rule)
    return rules


@dataclass(frozen=True)
class _Prepared:
    """What the driver reads off a rule once per call, not once per round."""

    rule: RewriteRule
    name: str
    pattern: DFPattern
    roles: dict[str, DFPattern]
    root_ops: frozenset[str] | None  # None: the root may be anything
    # operator-name sets every match calls one of (required_op_names)
    required: tuple[frozenset[str], ...]
    checker: MatchCheck | None  # None: the rule accepts every match
    escapable: tuple[DFPattern, ...]  # the patterns of the rule's escapable_roles

    @classmethod
    def of(cls, rule: RewriteRule) -> "_Prepared":
        roles = rule.roles()
        unknown = [name for name in rule.escapable_roles if name not in roles]
        if unknown:
            raise PatternError(f"{rule.name}: escapable_roles names {unknown}, which "
                               f"are not roles of the rule (its roles: {sorted(roles)})")
        pattern = rule.pattern
        assert pattern is not None  # rule.validate() refused a single-root rule without one
        return cls(rule, rule.name, pattern, roles, root_op_names(pattern),
                   required_op_names(pattern), check_of(rule),
                   tuple(roles[name] for name in rule.escapable_roles))


@dataclass(frozen=True)
class _Options:
    max_passes: int
    allow_escaping: bool
    max_growth: float | None
    debug: bool
    log: RewriteLog | None  # None: record nothing (no per-rewrite object outlives the call)


# -- rounds ------------------------------------------------------------------------------
def _run_rounds(rules: list[RewriteRule], mod: tvm.IRModule, options: _Options) -> tvm.IRModule:
    """Apply ``rules`` in rounds until a round changes nothing.

    Each rule matches by its strategy: single-root rules (a ``pattern``) in the round's
    shared walk (:func:`_run_round`), multi-root rules (a ``context``) block by block
    after them (:func:`_run_multi_round`).
    """
    active = prepared = [_Prepared.of(rule) for rule in rules if not rule.multi_root]
    multi = multi_rules = [rule for rule in rules if rule.multi_root]
    if options.debug:
        assert_well_formed(mod, PASS_NAME, "input")
    sizes = _InputSizes(mod)
    emitted_keys: dict[str, tuple[relax.Function, frozenset[str]]] = {}  # see _run_round
    recent: list[list[tuple[str, str, Any]]] = []  # what fired, in the last two rounds
    settled: dict[int, dict[int, relax.Function]] = {}  # see _run_multi_round
    tallies = {id(p): DeclineTally() for p in active}  # see engine/declines.py
    multi_tallies = {id(rule): DeclineTally() for rule in multi}
    for round_index in range(options.max_passes):
        mod, fired, indexes = _run_round(active, mod, round_index, options, sizes,
                                         emitted_keys, tallies) if active else (mod, [], {})
        if multi:
            mod, fired_multi = _run_multi_round(multi, mod, round_index, options.log, indexes,
                                                settled, multi_tallies)
            fired += fired_multi
        if options.log is not None:
            options.log.rounds = round_index + 1
        if fired and options.debug:
            assert_well_formed(mod, PASS_NAME, "output", rules=(name for name, _, _ in fired))
        active = [p for p in active if not p.rule.rewrite_once]
        multi = [rule for rule in multi if not rule.rewrite_once]
        if not fired or not (active or multi):
            warn_silent_declines([*((p.name, p.rule, tallies[id(p)]) for p in prepared),
                                  *((r.name, r, multi_tallies[id(r)]) for r in multi_rules)])
            return mod
        recent = [*recent[-1:], fired]
    names = ", ".join(sorted({name for fired in recent for name, _, _ in fired}))
    _, func_name, binding = recent[-1][-1]
    raise RewriteDidNotConverge(
        f"rewrite did not converge after {options.max_passes} passes; rules still changing "
        f"the graph: {names} (last rewrite at {describe_binding(func_name, binding)}). A "
        f"rule whose replacement matches its own pattern, or two rules undoing each other, "
        f"never settle; set rewrite_once=True or change the pattern")


class _InputSizes:
    """Bindings per function of the module ``rewrite`` was given (the growth bound's base)."""

    def __init__(self, mod: tvm.IRModule):
        self._mod = mod
        self._sizes: dict[str, int] = {}

    def __getitem__(self, name: str) -> int:
        if name not in self._sizes:
            func = self._mod[name]
            self._sizes[name] = sum(len(block.bindings) for block in func.body.blocks)
        return self._sizes[name]


class _FunctionRound:
    """One function during one round: its index and what the round's rules did to it."""

    def __init__(self, gv: tvm.ir.GlobalVar, func: relax.Function, first_round: bool):
        self.gv = gv
        self.name = gv.name_hint
        self.func = func
        self.index = FunctionIndex.of(func)
        if first_round:  # later rounds index what the driver itself emitted and checked
            check_input(self.index, PASS_NAME, self.name)
        self.replacements: dict[int, Any] = {}
        self.rule_of: dict[int, str] = {}
        self.new_reads: dict[int, list[int]] = {}
        # handle -> (rule, root Var) of the match that took it
        self.taken: dict[int, tuple[str, Any]] = {}
        # handle -> takers whose replacement reads it
        self.extra_readers: dict[int, list[tuple[str, Any]]] = {}

    def has_candidates(self, rule: _Prepared) -> bool:
        """Can ``rule`` match here: its root operator and every operator it needs occur?"""
        return self.index.may_hold(rule.root_ops, rule.required)

    def replace(self, rule: _Prepared, group: Group, value: Any, later_rules: bool) -> None:
        """Record ``value`` for ``group``'s root; with ``later_rules``, what they may not touch."""
        key = C.handle(group.root_var)
        self.replacements[key] = value
        self.rule_of[key] = rule.name
        if not later_rules:
            return
        taker = (rule.name, group.root_var)
        self.taken[key] = taker
        for internal in group.match.internal_keys:
            self.taken[internal] = taker
        self.index.make_opaque(key)
        reads = self.new_reads[key] = reads_of_value(value)
        for read in reads:
            self.extra_readers.setdefault(read, []).append(taker)


def _run_round(active: list[_Prepared], mod: tvm.IRModule, round_index: int,
               options: _Options, sizes: _InputSizes,
               emitted_keys: dict[str, tuple[relax.Function, frozenset[str]]],
               tallies: dict[int, DeclineTally],
               ) -> tuple[tvm.IRModule, list[tuple[str, str, Any]], dict[str, FunctionIndex]]:
    """One round of every active rule over every function.

    Returns the module; per rewrite that changed it, ``(rule, function, binding)``
    (formatted only if it ends up in an error message); and the indexes of the functions
    the round indexed but left unchanged, by name, for the multi-root rules to share.
    ``emitted_keys`` holds, by name, each function a round emitted with the binding keys
    it has (:attr:`Emitted.keys`): the next round knows from them whether a root can
    occur there without scanning the function (the usual last round finds none), and
    records the functions it emits in turn.  ``tallies`` counts, per rule (by ``id``),
    what its check and rewrite returned (:mod:`~patternkit.engine.declines`).
    """
    log = options.log
    first = round_index == 0
    root_ops: set[str] | None = set()
    for rule in active:
        root_ops = None if rule.root_ops is None or root_ops is None else root_ops | rule.root_ops
    functions: list[_FunctionRound] = []
    for gv, func in rewritable_functions(mod):
        if first:
            check_shape(func, PASS_NAME, gv.name_hint)
        known = emitted_keys.get(gv.name_hint)
        if known is not None and known[0].same_as(func):
            may_match = root_ops is None or not root_ops.isdisjoint(known[1])
        else:
            may_match = bool(func.body.blocks) and has_candidates(func, root_ops)
        if may_match:
            functions.append(_FunctionRound(gv, func, first))
    fired: list[tuple[str, str, Any]] = []
    for position, rule in enumerate(active):
        later_rules = position < len(active) - 1
        tally = tallies[id(rule)]
        for fn in functions:
            if not fn.has_candidates(rule):
                continue
            check: Callable[[Group], Any] | None = None
            if rule.checker is not None:
                def on_check_error(group: Group, err: Exception, fn: _FunctionRound = fn,
                                   rule: _Prepared = rule) -> Exception:
                    return _rule_error(rule, "check", fn.name, group, err)

                check = _tallied(group_check(rule.checker, rule.roles, on_check_error), tally)
            try:
                groups, skipped = find_groups(fn.index, rule.pattern, check,
                                              options.allow_escaping, taken=fn.taken,
                                              escapable=rule.escapable,
                                              extra_readers=fn.extra_readers,
                                              report_claimed=log is not None,
                                              rule=rule.name, function=fn.name)
            except AmbiguousDominator as err:  # the pattern cannot say where a diamond ends
                raise err.in_rule(rule.name, fn.name) from err
            if log is not None:
                log.skipped.extend(skipped)
            last = None
            declines = 0
            for group in groups:
                new_value, declined = _call_rule(rule, fn.name, group, fn.index)
                if declined is _RECOMPUTES_THE_MATCH:
                    continue  # the rule's own result, seen again: nothing to say of it
                tally.offered += 1
                if new_value is None:
                    declines += 1
                    if declined is _RETURNED_NONE:
                        tally.rewrite_none += 1
                    if log is not None:
                        log.skipped.append(Skip(rule.name, fn.name, C.var_name(group.root_var),
                                                declined, kind=SkipKind.DECLINED,
                                                position=group.position,
                                                covered=tuple(group.interior)))
                    continue
                fn.replace(rule, group, new_value, later_rules)
                tally.rewritten += 1
                last = group.binding
                if log is not None:
                    log.records.append(RewriteRecord(rule.name, fn.name, group.root_var,
                                                     (*group.match.internal, group.root_var),
                                                     round_index, new_value, fn.func))
            if declines:
                _LOG.info("rule %s left %d match(es) in '%s' as they were: its rewrite returned "
                          "None or the match itself (round %d)", rule.name, declines, fn.name,
                          round_index + 1)
            if last is not None:
                fired.append((rule.name, fn.name, last))
    unchanged = {fn.name: fn.index for fn in functions if not fn.replacements}
    if not fired:
        return mod, fired, unchanged
    updates: dict[tvm.ir.GlobalVar, relax.Function] = {}
    for fn in functions:
        if not fn.replacements:
            continue
        emitted = emit_rewrites(fn.func, fn.index, fn.replacements, fn.name,
                                pass_name=PASS_NAME, rule_of=fn.rule_of.__getitem__,
                                new_reads=fn.new_reads)
        if options.max_growth is not None:
            _check_growth(fn, emitted, sizes[fn.name], options.max_growth, round_index)
        updates[fn.gv] = emitted.function
        emitted_keys[fn.name] = (emitted.function, emitted.keys)
        forget_index(fn.func)  # replaced: no later pass reads it
    functions_after = dict(mod.functions.items())
    functions_after.update(updates)
    return C.copy_module(mod, functions_after), fired, unchanged


def _run_multi_round(rules: list[RewriteRule], mod: tvm.IRModule, round_index: int,
                     log: RewriteLog | None, indexes: dict[str, FunctionIndex],
                     settled: dict[int, dict[int, relax.Function]],
                     tallies: dict[int, DeclineTally],
                     ) -> tuple[tvm.IRModule, list[tuple[str, str, Any]]]:
    """One round of the multi-root rules (:mod:`~patternkit.engine.multi`), one after the other.

    They match a :class:`~patternkit.dpl.PatternContext` graph over a whole block rather
    than one root, so they take their own walk; the function index is the round's
    (``indexes``) for every function that is still the one it indexed.

    ``settled`` (``id(rule)`` -> handle -> function, held so that no other function can
    take the handle) records the functions a rule rewrote nothing in.  Without a log,
    a rule is not run again on such a function: the last round usually leaves the
    function the previous round's multi-root rules saw, and would only repeat their walk
    (with a log it runs, so the log records its refusals each round, as for the other
    rules).  ``tallies`` counts what each rule's rewrite returned, as for the other rules.
    """
    fired: list[tuple[str, str, Any]] = []
    for rule in rules:
        tally = tallies[id(rule)]
        roles = rule.roles()
        updates = {}
        seen = settled.setdefault(id(rule), {})
        for gv, func in rewritable_functions(mod):
            if log is None and C.handle(func) in seen:
                continue
            index = indexes.get(gv.name_hint)
            done = rewrite_function_bindings(
                rule, roles, gv.name_hint, func, collect=log is not None,
                index=index if index is not None and index.func.same_as(func) else None)
            tally.offered += done.offered
            tally.rewrite_none += done.returned_none
            if done.last is not None:
                tally.rewritten += 1
            if log is not None:
                log.records.extend(RewriteRecord(rule.name, gv.name_hint, root, replaced,
                                                 round_index, None, func, done.function)
                                   for root, replaced in done.rewritten)
                log.skipped.extend(Skip(rule.name, gv.name_hint, root, reason, refusal)
                                   for root, reason, refusal in done.refused)
            if done.last is not None:
                updates[gv] = done.function
                fired.append((rule.name, gv.name_hint, done.last))
            else:
                seen[C.handle(func)] = func
        if updates:
            functions = dict(mod.functions.items())
            functions.update(updates)
            mod = C.copy_module(mod, functions)
    return mod, fired


def _check_growth(fn: _FunctionRound, emitted: Emitted, input_size: int, max_growth: float,
                  round_index: int) -> None:
    """Stop a rule set that keeps growing the graph before it exhausts memory."""
    bound = int(max_growth * input_size) + GROWTH_SLACK
    if emitted.bindings <= bound:
        return
    grown: dict[str, list[int]] = {}  # rule -> [replacements, bindings they became]
    for key, size in emitted.added.items():
        entry = grown.setdefault(fn.rule_of[key], [0, 0])
        entry[0] += 1
        entry[1] += size
    rule, (count, size) = max(grown.items(), key=lambda item: item[1][1])
    raise RewriteDidNotConverge(
        f"rewrite did not converge: after {round_index + 1} passes function '{fn.name}' has "
        f"grown from {input_size} to {emitted.bindings} bindings, past the bound of {bound} "
        f"(max_growth={max_growth:g} x {input_size} + {GROWTH_SLACK}); in the last pass rule "
        f"{rule} replaced {count} binding(s) with {size}. A rule whose replacement matches "
        f"its own pattern grows the graph every round: set rewrite_once=True or change the "
        f"pattern, or pass a larger max_growth= (None: no bound) if the growth is intended")


def _call_rule(rule: _Prepared, func_name: str, group: Group,
               index: FunctionIndex) -> tuple[Any, str]:
    """``(replacement, "")``, or ``(None, why)`` to leave this binding as it is."""
    pre = group.match.root  # the binding's value, as the matcher saw it
    try:
        result = rule.rule.rewrite(RuleMatch(group.match, rule.roles, group.plan))
    except Exception as err:
        raise _rule_error(rule, "rewrite", func_name, group, err) from err
    if result is None:
        return None, _RETURNED_NONE
    if not isinstance(result, tvm.ir.Expr) or isinstance(result, (tvm.ir.Op, relax.Function)):
        raise CallbackError(
            f"rule {rule.name}: rewrite returned {type(result).__name__} ({result!r:.80}) "
            f"where a Relax expression was expected, at binding "
            f"'{describe_binding(func_name, group.binding)}'",
            rule.name, describe_binding(func_name, group.binding))
    key = C.handle(result)
    if key == C.handle(pre) or key == C.handle(group.root_var):
        return None, "the rewrite returned the matched binding itself: binding left as it is"
    if type(result) is type(pre) and C.structural_equal(result, pre):
        return None, "the rewrite returned an equal expression: binding left as it is"
    if _recomputes_the_match(result, pre, group, index):
        return None, _RECOMPUTES_THE_MATCH
    return result, ""


def _recomputes_the_match(result: Any, pre: Any, group: Group, index: FunctionIndex) -> bool:
    """Does ``result`` compute the match's own expression (its interior bindings nested),
    up to the order of the operands of ``add`` and ``multiply``?

    The matcher swaps those operands, so a rule whose replacement only reorders them (a
    canonicalisation into the order it also matches, or ``x * y`` to ``y * x``) matches
    its own result every round and would never settle; the structural test above sees
    the swap as a change.  Asked only of a result that calls the root's own ``add``,
    ``multiply`` or ``divide``; the interior is nested once.
    """
    if type(result) is not relax.Call or type(pre) is not relax.Call:
        return False
    name = C.op_name(result)
    if name not in _REORDERABLE or name != C.op_name(pre):
        return False
    position = index.position
    values = {key: index.binding_at(position[key]).value for key in group.match.internal_keys}
    same: bool = _term(result, {}, {}) == _term(pre, values, {})
    return same


def _term(expr: Any, values: dict[int, Any], memo: dict[int, Any]) -> Any:
    """``expr`` as a comparable term: operator calls nested through ``values`` (handle
    of an interior Var -> its value), the operands of ``add`` and ``multiply`` in a fixed
    order (the matcher swaps them, so a rule may return them swapped), any other node by
    its handle (a leaf of the match) or structure (a constant, an attribute).
    """
    key = C.handle(expr)
    if key in memo:
        return memo[key]
    if type(expr) in VAR_TYPES and key in values:
        term = _term(values[key], values, memo)
    elif type(expr) is relax.Call and type(expr.op) is tvm.ir.Op:
        name = expr.op.name
        args = [_term(a, values, memo) for a in C.array_items(expr.args)]
        if name in COMMUTATIVE_OPS and len(args) == 2:
            args.sort(key=repr)
        attrs = None if expr.attrs is None else C.structural_hash(expr.attrs)
        term = (name, attrs, tuple(args))
    elif C.is_constant(expr):
        term = ("const", C.structural_hash(expr))
    else:
        term = ("leaf", key)
    memo[key] = term
    return term


#: The root operators of a replacement that may recompute its match in another order.
_REORDERABLE = COMMUTATIVE_OPS | {"relax.divide"}


#: A rewrite that returned what its match computes, its operands reordered: the rule's own
#: result matched again (:func:`_recomputes_the_match`), neither a rewrite nor a decline.
_RECOMPUTES_THE_MATCH = "the rewrite returned what the match computes, reordered"

#: Why a rewrite that returned ``None`` left its match (the one decline with no reason).
_RETURNED_NONE = "the rewrite returned None: binding left as it is"


def _tallied(check: Callable[[Group], Any], tally: DeclineTally) -> Callable[[Group], Any]:
    """``check``, counting its calls and its bare ``None`` answers in ``tally``."""
    def run(group: Group) -> Any:
        tally.checked += 1
        result = check(group)
        if result is None:
            tally.check_none += 1
        return result

    return run


def _rule_error(rule: _Prepared, what: str, func_name: str, group: Group,
                    err: Exception) -> CallbackError:
    where = describe_binding(func_name, group.binding)
    return CallbackError(f"rule {rule.name}: {what} raised {type(err).__name__}: {err} "
                         f"(while rewriting binding '{where}')", rule.name, where)
