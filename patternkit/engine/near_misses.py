"""Near misses: a family's shape is in the rewritten model, and why its rules left it.

A model whose attention is spelled in a way no rule knows keeps its written-out
``matmul -> softmax -> matmul``, and the rewrite log alone says nothing about it: no rule
matched, so none refused.  So each family declares a *near-miss detector*
(:class:`NearMissDetector`): a loose pattern of its skeleton ops, and the family's rules.
After a rewrite, :func:`find_near_misses` looks for each skeleton in the *rewritten*
module (what the family's rules collapsed is gone from it) and says, for each site left,
which rule looked at it and why it declined:

1. the refusal the rewrite recorded: a :class:`~patternkit.engine.skip.Skip` of one of
   the family's rules whose match covered a binding of the site (the last one, a check's
   or a rewrite's refusal before an overlap or an escape);
2. else what the family's rules say there now: a composite that takes the site is no
   miss (the external compiler gets it), a rule whose match covers the site and is
   refused gives that reason;
3. else the deepest point at which one of the family's patterns failed at the site or at
   the bindings just below it (:func:`~patternkit.dpl.near_miss.deepest_miss`).

It costs nothing during the rewrite: :meth:`~patternkit.engine.driver.RewriteLog.near_misses`
runs it when asked, on the module the rewrite left.  A family that fired everywhere
leaves no skeleton, so its detector costs one look-up of its operators per function.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

import tvm

from ..dpl.dominator import uses_of_function
from ..dpl.matcher import Matcher, function_lookup
from ..dpl.near_miss import deepest_miss
from ..dpl.pattern import DFPattern, required_op_names, root_op_names
from ..errors import PatternError
from ..ir import compat as C
from ..ir.targets import rewritable_functions
from .index import FunctionIndex, binding_key
from .proposal import Group, find_groups, group_check
from .rule import CompositeRule, Reject, Rule, check_of
from .skip import Skip, SkipKind

__all__ = ["NearMiss", "NearMissDetector", "find_near_misses"]

#: How many levels of readers below a site the family's patterns are tried at: a rule's
#: root is often a step or two past the skeleton (the permute after attention's matmul).
READERS_DEPTH = 2

#: How many levels of operands above a site a detector's known spellings are looked for
#: at: a softcap or a mask is a step or two above the softmax that makes the skeleton.
KNOWN_DEPTH = 3

#: What a near miss says when none of the family's patterns got past its root.
NO_RULE_MATCHED = "none of the family's rules matched here"


@dataclass(frozen=True)
class NearMissDetector:
    """A family's skeleton, and the rules that should take what it finds.

    Attributes
    ----------
    family : str
        The family's name (``"attention"``), as reports show it.
    shape : str
        What the skeleton is, in words (``"matmul -> softmax -> matmul"``).
    pattern : DFPattern
        The loose pattern: the family's skeleton ops, everything else a wildcard.
    rules : tuple of Rule
        The family's rules (rewrite rules and composites) whose refusals explain a site.
    known : tuple of (DFPattern, str, str)
        Spellings of the family its rules deliberately leave, each ``(pattern, rule,
        reason)``: found at a site or a few bindings above it (:data:`KNOWN_DEPTH`), the
        reason is reported instead of the deepest point where the rule's pattern failed,
        which quotes the pattern and tells a reader little (Gemma 2's logit softcap).
    """

    family: str
    shape: str
    pattern: DFPattern
    rules: tuple[Rule, ...]
    known: tuple[tuple[DFPattern, str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, DFPattern):
            raise PatternError(f"near-miss detector {self.family}: pattern must be a "
                               f"DFPattern, found {type(self.pattern).__name__}")
        if not self.rules:
            raise PatternError(f"near-miss detector {self.family}: name the family's rules "
                               f"(the ones whose refusals explain a site)")

    def only(self, names: Iterable[str]) -> NearMissDetector | None:
        """The detector with only the rules called ``names``; ``None`` if none is."""
        wanted = set(names)
        kept = tuple(rule for rule in self.rules if rule.name in wanted)
        if not kept:
            return None
        return NearMissDetector(self.family, self.shape, self.pattern, kept, self.known)


@dataclass(frozen=True)
class NearMiss:
    """A site of a family's skeleton that none of its rules rewrote, and why.

    Attributes
    ----------
    family, shape : str
        The detector's (:class:`NearMissDetector`).
    function, binding : str
        Where: the function, and the Var of the site's last binding.
    rule : str
        The rule whose refusal is reported (``""`` when no rule of the family has a
        pattern that could be tried).
    reason : str
        Why that rule left the site, in one line.
    kind : str
        ``"check"``, ``"declined"``, ``"overlap"``, ``"escape"``, ``"cycle"`` (a
        :class:`~patternkit.engine.skip.SkipKind`), ``"no match"`` (the rule's pattern
        did not match; ``reason`` names the deepest point where it failed), or
        ``"not applied"`` (the rule would take the site, but the rewrite was not given it),
        or ``"unsupported"`` (a spelling the family's rules deliberately leave, one of the
        detector's ``known``).
    """

    family: str
    shape: str
    function: str
    binding: str
    rule: str
    reason: str
    kind: str

    def __str__(self) -> str:
        return (f"{self.family} ({self.shape}) in '{self.function}' at '{self.binding}': "
                f"{self.rule or 'no rule'}: {self.reason}")

    def to_dict(self) -> dict[str, str]:
        """The near miss as ``report.json`` writes it."""
        return asdict(self)


#: Skip kinds in the order a report prefers them: what the rule itself said first.
_PREFERENCE = {SkipKind.CHECK: 0, SkipKind.DECLINED: 0, SkipKind.ESCAPE: 1, SkipKind.CYCLE: 1,
               SkipKind.OVERLAP: 2}


def find_near_misses(mod: tvm.IRModule, detectors: Sequence[NearMissDetector],
                     skipped: Iterable[Skip] = ()) -> list[NearMiss]:
    """Every site of a detector's skeleton in ``mod`` that its family left, and why.

    Parameters
    ----------
    mod : tvm.IRModule
        The module a rewrite left; it is only read.
    detectors : sequence of NearMissDetector
        In order: a site that overlaps an earlier detector's site is reported once, by
        the earlier one (a written-out layer norm is also a batch-norm-like shape).
    skipped : iterable of Skip
        The rewrite log's skipped matches (:attr:`RewriteLog.skipped`), the refusals the
        rewrite recorded.

    Returns
    -------
    list of NearMiss
        Function by function, detector by detector, in program order.
    """
    for i, detector in enumerate(detectors):
        if not isinstance(detector, NearMissDetector):
            raise PatternError(f"near misses: detector {i} is a {type(detector).__name__}, "
                               f"not a NearMissDetector")
    refusals: dict[str, list[Skip]] = {}
    for skip in skipped:
        refusals.setdefault(skip.function, []).append(skip)
    found: list[NearMiss] = []
    for gv, func in rewritable_functions(mod):
        if func.body.blocks:
            found += _FunctionSites(gv.name_hint, func, refusals.get(gv.name_hint, [])
                                    ).near_misses(detectors)
    return found


class _FunctionSites:
    """One function's near misses: its index, and each rule's verdicts, built on demand."""

    def __init__(self, name: str, func: Any, refusals: list[Skip]):
        self.name = name
        self.func = func
        self.index = FunctionIndex.of(func)  # usually the rewrite's last round's, reused
        self.refusals = refusals
        self._verdicts: dict[int, tuple[list[Group], list[Skip]]] = {}
        self._lookup: Callable[[Any], Any] | None = None

    def near_misses(self, detectors: Sequence[NearMissDetector]) -> list[NearMiss]:
        found: list[NearMiss] = []
        reported: set[int] = set()
        for detector in detectors:
            pattern = detector.pattern
            if not self.index.may_hold(root_op_names(pattern), required_op_names(pattern)):
                continue
            sites, _ = find_groups(self.index, pattern, allow_escaping_intermediates=True)
            for site in sites:
                keys = {*site.match.internal_keys, C.handle(site.root_var)}
                if keys & reported:
                    continue
                miss = self._explain(detector, site, keys)
                if miss is not None:
                    reported |= keys
                    found.append(miss)
        return found

    def _explain(self, detector: NearMissDetector, site: Group, keys: set[int]
                 ) -> NearMiss | None:
        """Why ``detector``'s family left ``site``; ``None`` if a composite takes it."""
        def miss(rule: str, reason: str, kind: str) -> NearMiss:
            return NearMiss(detector.family, detector.shape, self.name,
                            C.var_name(site.root_var), rule, reason, kind)

        names = {rule.name for rule in detector.rules}
        site_names = {C.var_name(v) for v in (*site.match.internal, site.root_var)}
        logged = [s for s in self.refusals if s.rule in names and _covers(s, keys, site_names)]
        if logged:
            best = min(reversed(logged), key=lambda s: _PREFERENCE.get(s.kind, 1))
            return miss(best.rule, best.reason, SkipKind(best.kind).value)
        refused: list[Skip] = []
        for rule in detector.rules:
            groups, skips = self._verdict(rule)
            for group in groups:
                if keys & {*group.match.internal_keys, C.handle(group.root_var)}:
                    if isinstance(rule, CompositeRule):
                        return None  # the external compiler gets it
                    return miss(rule.name, "its pattern matches and its check accepts here, "
                                "but it was not applied (it is not among the rules the "
                                "rewrite was given)", "not applied")
            refused += [s for s in skips if _covers(s, keys, ())]
        if refused:
            best = min(refused, key=lambda s: _PREFERENCE.get(s.kind, 1))
            return miss(best.rule, best.reason, SkipKind(best.kind).value)
        known = self._known_spelling(detector, site)
        if known is not None:
            return miss(*known, "unsupported")
        return self._closest_pattern(detector, site, miss)

    def _known_spelling(self, detector: NearMissDetector, site: Group
                        ) -> tuple[str, str] | None:
        """``(rule, reason)`` of the first of the detector's known spellings found at
        the site or up to :data:`KNOWN_DEPTH` levels of operands above it.
        """
        if not detector.known:
            return None
        if self._lookup is None:
            self._lookup = function_lookup(self.func)
        index = self.index
        keys = [*site.match.internal_keys, C.handle(site.root_var)]
        seen = set(keys)
        frontier = list(keys)
        for _ in range(KNOWN_DEPTH):
            above = [read for key in frontier for read in index.reads.get(key, ())
                     if read not in seen and read in index.position]
            seen.update(above)
            keys += above
            frontier = above
        matcher = Matcher(self._lookup, uses=lambda: uses_of_function(self.func))
        for pattern, rule, reason in detector.known:
            for key in keys:
                binding = index.binding_at(index.position[key])
                if matcher.match(pattern, binding.value) is not None:
                    return rule, f"{reason} (at '{C.var_name(binding.var)}')"
        return None

    def _verdict(self, rule: Rule) -> tuple[list[Group], list[Skip]]:
        """``rule``'s accepted matches and refusals in this function, once per rule."""
        key = id(rule)
        if key not in self._verdicts:
            pattern = rule.pattern
            if pattern is None or not self.index.may_hold(root_op_names(pattern),
                                                          required_op_names(pattern)):
                self._verdicts[key] = ([], [])
            else:
                self._verdicts[key] = _run_rule(rule, pattern, self.index, self.name)
        return self._verdicts[key]

    def _closest_pattern(self, detector: NearMissDetector, site: Group,
                         miss: Callable[[str, str, str], NearMiss]) -> NearMiss:
        """The deepest failure of the family's patterns at the site and just below it."""
        if self._lookup is None:
            self._lookup = function_lookup(self.func)
        places = self._places(site)
        best: tuple[int, str, str] | None = None
        for rule in detector.rules:
            pattern = rule.pattern
            if pattern is None:
                continue
            roots = root_op_names(pattern)
            for var, value in places:
                if roots is not None and binding_key(value) not in roots:
                    continue
                found = deepest_miss(pattern, value, self._lookup)
                if found is not None and (best is None or found[0] > best[0]):
                    best = (found[0], rule.name, f"at '{C.var_name(var)}': {found[1]}")
        if best is None:
            tried = ", ".join(rule.name for rule in detector.rules)
            return miss("", f"{NO_RULE_MATCHED} ({tried}: none has a pattern rooted at these "
                        f"bindings)", "no match")
        return miss(best[1], best[2], "no match")

    def _places(self, site: Group) -> list[tuple[Any, Any]]:
        """(Var, value) of the site's bindings and of their readers, a few levels down."""
        index = self.index
        keys = [*site.match.internal_keys, C.handle(site.root_var)]
        seen = set(keys)
        frontier = [C.handle(site.root_var)]
        for _ in range(READERS_DEPTH):
            below = [user for key in frontier for user in index.users_of(key) if user not in seen]
            seen.update(below)
            keys += below
            frontier = below
        places = []
        for key in keys:
            if key in index.position:
                binding = index.binding_at(index.position[key])
                places.append((binding.var, binding.value))
        return places


def _covers(skip: Skip, keys: set[int], names: Iterable[str]) -> bool:
    """Did ``skip``'s match cover a binding of the site (by Var, else by the root's name)?"""
    if skip.covered:
        return any(C.handle(v) in keys for v in skip.covered)
    return skip.root in names


def _run_rule(rule: Rule, pattern: DFPattern, index: FunctionIndex, function: str
              ) -> tuple[list[Group], list[Skip]]:
    """``rule``'s matches in ``index`` as the engines group them, its check applied.

    A check that raises refuses the match with what it raised: a near-miss report
    explains, it does not fail the job.
    """
    roles = rule.roles()
    checker = check_of(rule)
    check = None
    if checker is not None:
        def guarded(match: Any, checker: Any = checker) -> Any:
            try:
                return checker(match)
            except Reject:
                raise
            except Exception as err:  # noqa: BLE001 - the report says what the check raised
                return Reject(f"its check raised {type(err).__name__}: {err}")

        check = group_check(guarded, roles, lambda group, err: err)
    try:
        return find_groups(index, pattern, check, rule=rule.name, function=function)
    except PatternError as err:  # a pattern the matcher cannot use here (an ambiguous diamond)
        return [], [Skip(rule.name, function, "", f"its pattern could not be matched: {err}")]
