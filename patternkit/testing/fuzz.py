"""Verification campaigns: fuzz rules' guards, differential-test passes, fuzz round trips.

Three campaigns, one machinery.  Each draws ``budget`` instances with hypothesis (seeded,
so a campaign is a value: the same arguments give the same instances in every process),
checks each, and returns a :class:`~patternkit.verification.report.CampaignReport`.

:func:`verify_rules` (``patternkit verify``, ``pk.verify``)
    For each rule, instances are knob combinations of its ``example(**knobs)`` drawn from
    :meth:`~patternkit.Rule.example_space` -- the default first -- and each is also tried
    with its scalar constants nudged to the edge of the patterns' scalar tolerance
    (:data:`EDGES`: one rounding, inside it; sixteen, outside).  Whenever the rule fires,
    the result must be well formed and compute the input's numbers on llvm within
    ``rule.tolerance(dtype)``, on the seeded draws and on adversarial ones (wide values,
    positive values, zeros: :data:`~patternkit.verification.differential.ADVERSARIAL`);
    whenever it does not, it must say why (a ``reject`` reason, or the pattern's near
    miss).  The rewrite sites of the first :data:`SITE_INSTANCES` instances a rule fires
    on (its default example first) are also validated one by one
    (:func:`~patternkit.verification.sites.validate_sites`), on the instance's own
    inputs and the sites' adversarial draws: an error that a later op saturates (a
    sigmoid of a clipped value) or that vanishes in a small output shows there; a site
    that misses is arbitrated in float64 when the caller gives ``widen`` (``patternkit
    verify`` does), and without it float16 instances are not validated site by site
    (:data:`~patternkit.verification.differential.WIDE_SKIPPED` says why).  A
    failure is shrunk by setting knobs back to their defaults while it keeps failing the
    same way.
:func:`fuzz_pass` (``patternkit fuzz PASS_OR_RULE``)
    Random programs (:func:`~patternkit.testing.strategies.relax_programs`, network-like,
    unless a strategy is given; ``"ops"``:
    :func:`~patternkit.testing.op_programs.op_programs`, grown operator by operator from
    each operator's typing rule) through any transform -- a TVM pass, a ``Sequential``, a rule or
    ``RuleSet``, any ``IRModule -> IRModule`` callable -- checked by
    :mod:`~patternkit.verification.differential` on the seeded draws and on adversarial
    ones (wide values, positive values, zeros); a wrong result is shrunk to its
    smallest failing cone (:mod:`~patternkit.verification.shrink`).
:func:`fuzz_roundtrip` (``patternkit fuzz roundtrip``)
    ``DefuseOps(FuseOps(x)) == x`` on :func:`~patternkit.testing.graphs.relax_graphs`.

Scale: ``shard=(k, n)`` keeps the instances whose index is ``k - 1`` modulo ``n``, so
``n`` machines split a campaign without talking to each other; ``jobs`` runs a shard's
instances in that many processes (``spawn``: TVM is not fork-safe), each drawing the same
instances and checking its share.  Reports of all shards merge into the whole campaign's.
Workers rebuild their target: library rules and targets given by name
(:func:`resolve_target`) travel, as do picklable callables; a ``Pass`` object does not
pickle, nor does a target holding a TVM object other than an operator (TVM 0.27's pickling
of one crashes the process), and those are checked in the calling process.  As with any
``spawn`` pool, a script that uses ``jobs > 1`` needs the ``if __name__ == "__main__":``
guard.

Bad input never stops a campaign: a transform that raises, runs past ``timeout`` seconds
or returns a non-module is reported per instance with the module that caused it.
"""

from __future__ import annotations

import concurrent.futures
import io
import logging
import multiprocessing
import os
import pickle
import time
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tvm
from tvm import relax

from ..byoc import CompositeLog, merge_composite
from ..dpl import explain
from ..engine import (
    CompositeRule,
    NoSuchExample,
    RewriteLog,
    RewriteRule,
    Rule,
    RuleSet,
    Tolerance,
    default_tolerance,
    rewrite,
)
from ..engine.rule import is_rule
from ..ir import compat as C
from ..ir.dtypes import machine_epsilon
from ..ir.rebuild import make_block, rebuild_function
from ..ir.walk import substitute
from ..verification import numeric
from ..verification.differential import (
    WIDE_SKIPPED,
    Outcome,
    apply_transform,
    judge_result,
    narrowest_float_dtype,
)
from ..verification.report import CampaignReport, Failure, TargetReport
from ..verification.roundtrip import check_roundtrip
from ..verification.shrink import shrink_module
from ..verification.sites import validate_sites

__all__ = ["verify_rules", "fuzz_pass", "fuzz_roundtrip", "as_transform", "transform_name",
           "resolve_target", "parse_shard", "fuzz_instance", "roundtrip_instance",
           "default_budget", "EDGES", "BUDGETS", "SITE_INSTANCES", "STRATEGIES",
           "named_strategy"]

log = logging.getLogger(__name__)

#: Instances per target: (CI, ``HYPOTHESIS_PROFILE=long``).
BUDGETS = {"verify": (8, 200), "fuzz": (300, 3000), "roundtrip": (300, 10000)}

#: Scalar-constant nudges, in units of the constant's dtype epsilon: none, just inside a
#: pattern's default scalar tolerance (2 eps), and outside it.
EDGES = {"none": 0.0, "inside": 1.0, "outside": 16.0}

#: Inputs whose names contain these are drawn positive (variances under a sqrt).
POSITIVE = ("var",)

#: Failure kinds that are shrunk; the others are reported per instance, as they came.
SHRUNK_KINDS = ("mismatch", "ill-formed", "build", "no-reason")

#: How a pass campaign's report counts the drawn programs it could not use (among its
#: ``rejected``): a program that does not build as drawn is the generator's fault, one
#: whose outputs are degenerate on every draw judges nothing.
SKIPPED_UNBUILDABLE = "skipped: the drawn program does not build (the generator's fault)"
SKIPPED_NO_EVIDENCE = "skipped: the drawn program's outputs are no evidence"

#: The named program generators of :func:`fuzz_pass` (``patternkit fuzz --strategy``).
STRATEGIES = ("networks", "ops")


def named_strategy(name: str) -> Any:
    """The hypothesis strategy of :data:`STRATEGIES` called ``name``."""
    if name == "networks":
        from .strategies import relax_programs
        return relax_programs()
    if name == "ops":
        from .op_programs import op_programs
        return op_programs()
    raise ValueError(f"no strategy {name!r}: give one of {', '.join(STRATEGIES)}")

DEFAULT_TIMEOUT = 60.0

#: Fired instances per rule (and per worker) whose rewrite sites are validated one by one.
#: A validation is one more build on top of the two of the whole-module check; the first
#: instances (the default example, then hypothesis' draws) cover the rule's common shape,
#: and every instance still gets the adversarial whole-module draws, which cost no build.
SITE_INSTANCES = 3


def default_budget(campaign: str) -> int:
    """The campaign's budget: small for CI, large when ``HYPOTHESIS_PROFILE=long``."""
    ci, long = BUDGETS[campaign]
    return long if os.environ.get("HYPOTHESIS_PROFILE") == "long" else ci


# -- transforms ------------------------------------------------------------------------------
def as_transform(target: Any) -> Callable[[tvm.IRModule], Any]:
    """Any supported target as an ``IRModule -> IRModule`` callable.

    A rewrite rule or ``RuleSet`` rewrites (a ``RuleSet``'s composites are not applied);
    a composite rule forms its composites (``merge_composite``).
    """
    if isinstance(target, str):
        return as_transform(resolve_target(target))
    if isinstance(target, (RuleSet, RewriteRule)) or (is_rule(target)
                                                       and not isinstance(target, Rule)):
        return lambda mod: rewrite(target, mod)  # a rewrite rule, or a DFPatternCallback
    if isinstance(target, CompositeRule):
        return lambda mod: _compose(target, mod, None)
    if isinstance(target, tvm.transform.Pass) or callable(target):
        return target
    raise TypeError(f"cannot fuzz a {type(target).__name__}: give a tvm.transform.Pass, a "
                    f"rule, a RuleSet or an IRModule -> IRModule callable")


def transform_name(target: Any) -> str:
    """How a report names a target: the rule's name, the pass's name, the function's."""
    if is_rule(target):
        return target.rule_name
    if isinstance(target, RuleSet):
        return "RuleSet(" + ",".join(r.rule_name for r in target) + ")"
    if isinstance(target, tvm.transform.Pass):
        return str(target.info.name)
    if isinstance(target, str):
        return target.rsplit(".", 1)[-1] if target.startswith(("relax.", "tvm.")) else target
    return getattr(target, "__qualname__", None) or type(target).__name__


def _compose(rule: CompositeRule, mod: tvm.IRModule, composite_log: CompositeLog | None):
    """The rule's composites formed; the module builds for llvm as it is (partitioning for
    the compiler is the byoc pipeline's business, not the rule's).
    """
    return merge_composite(mod, [rule], log=composite_log)


# -- instances -------------------------------------------------------------------------------
def draw_instances(strategy: Any, budget: int, seed: int) -> list:
    """``budget`` values of a hypothesis strategy, the same ones for the same seed.

    Fewer when the strategy has fewer distinct values (hypothesis does not repeat itself).
    """
    from hypothesis import HealthCheck, Phase, given, seed as seeded, settings

    drawn: list = []

    @seeded(seed)
    @settings(max_examples=max(1, budget), database=None, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value):
        drawn.append(value)

    collect()
    return drawn[:budget]


#: ``tick(done, total, what)``: progress of a campaign (``patternkit.app.progress``): the
#: units that ended, or a single unit's instances.
Tick = Callable[[int, int, str], None]


def _ticking(indices: list[int], tick: Tick | None, what: str) -> Iterator[int]:
    """``indices``, calling ``tick`` after each has been checked."""
    for done, index in enumerate(indices, 1):
        yield index
        if tick is not None:
            tick(done, len(indices), what)


def _share(count: int, shard: tuple[int, int] | None, jobs: int, slot: int) -> list[int]:
    """Indices of this shard's instances that worker ``slot`` of ``jobs`` checks."""
    k, n = shard or (1, 1)
    mine = [i for i in range(count) if i % n == k - 1]
    return mine[slot::jobs]


def _check_shard(shard: tuple[int, int] | None) -> tuple[int, int] | None:
    if shard is None:
        return None
    k, n = shard
    if not (isinstance(k, int) and isinstance(n, int) and 1 <= k <= n):
        raise ValueError(f"shard is (k, n) with 1 <= k <= n, got {shard!r}")
    return (k, n)


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``, for ``--shard``."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard takes K/N (e.g. 2/4), got {text!r}") from None
    _check_shard((k, n))
    return (k, n)


# -- running units, in this process or in workers --------------------------------------------
def _run_units(units: list[tuple], jobs: int,
               ended: Callable[[TargetReport], None] = lambda report: None,
               **here: Any) -> list[TargetReport]:
    """Run ``(function, args)`` units; in ``jobs`` spawned processes when ``jobs > 1``.

    ``ended`` is called with each unit's report as it ends; ``here`` are keyword
    arguments for units run in this process only (they need not pickle).
    """
    if jobs <= 1 or len(units) <= 1:
        reports = []
        for function, args in units:
            reports.append(function(*args, **here))
            ended(reports[-1])
        return reports
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(function, *args) for function, args in units]
        for future in concurrent.futures.as_completed(futures):
            ended(future.result())
        return [future.result() for future in futures]


def _portable(target: Any) -> Any:
    """``target`` in a form a worker process can rebuild, or ``None``."""
    from patternkit.patterns import LIBRARY  # the default targets; imported lazily

    if is_rule(target) and target.rule_name in LIBRARY.names and \
            type(LIBRARY[target.rule_name]) is type(target):
        return ("library", target.rule_name)
    if isinstance(target, str):  # a name (resolve_target) is rebuilt in the worker
        return ("name", target)
    if isinstance(target, tvm.transform.Pass):  # passes do not pickle: give its name
        return None
    try:
        _ProbePickler(io.BytesIO()).dump(target)
    except Exception:
        return None
    return ("object", target)


class _ProbePickler(pickle.Pickler):
    """Pickles as the pool will, refusing any TVM object but an operator.

    TVM 0.27 pickles its objects through ``save_json``, which kills the process on a
    Relax expression (a segmentation fault, not an exception: docs/tvm-bugs.md), so a
    target holding one (a pattern with ``is_expr(relax.const(...))``, a rule keeping a
    constant) must be found before the pool pickles it.  Operators serialise (by name).
    """

    def reducer_override(self, obj: Any) -> Any:
        if C.is_tvm_object(obj) and type(obj) is not tvm.ir.Op:
            raise pickle.PicklingError(f"a TVM {type(obj).__name__} does not pickle in "
                                       f"TVM 0.27 (save_json crashes on it)")
        return NotImplemented


def _restore(spec: Any) -> Any:
    kind, value = spec
    if kind == "library":
        from patternkit.patterns import LIBRARY
        return LIBRARY[value]
    if kind == "name":
        return resolve_target(value)
    return value


def resolve_target(name: str) -> Any:
    """A target by name: a library rule (``conv.fold_batchnorm``), a ``relax.transform``
    pass built with its default arguments (``FoldBatchnormToConv2D``, also spelled
    ``relax.transform.FoldBatchnormToConv2D``), or ``package.module:callable`` (a class
    is instantiated).  Targets given by name can be sent to worker processes.

    Raises
    ------
    ValueError
        The name is none of these.
    """
    import importlib

    from patternkit.patterns import LIBRARY

    if name in LIBRARY.names:
        return LIBRARY[name]
    short = name.removeprefix("tvm.").removeprefix("relax.transform.")
    factory = getattr(relax.transform, short, None)
    if callable(factory) and short[:1].isupper():
        return factory()
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            value = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"cannot load {name}: {err}") from None
        return value() if isinstance(value, type) else value
    raise ValueError(f"{name!r} is not a library rule, a relax.transform pass or "
                     f"module:callable")


def _units(worker: Callable, targets: list, jobs: int, args: tuple) -> tuple[list, list]:
    """Units for ``jobs`` workers per target; targets that cannot travel run here."""
    specs = [_portable(t) for t in targets] if jobs > 1 else [None] * len(targets)
    if jobs > 1 and any(s is None for s in specs):
        names = [transform_name(t) for t, s in zip(targets, specs) if s is None]
        log.warning("cannot send %s to worker processes; checking it in this process",
                    ", ".join(names))
    units, here = [], []
    for target, spec in zip(targets, specs):
        if spec is None:
            here.append((worker, (("local", target), 1, 0, *args)))
        else:
            units += [(worker, (spec, jobs, slot, *args)) for slot in range(jobs)]
    return units, here


def _campaign(what: str, worker: Callable, targets: list, *, budget: int, seed: int,
              shard: tuple | None, jobs: int, args: tuple, tick: Tick | None = None
              ) -> CampaignReport:
    start = time.perf_counter()
    shard = _check_shard(shard)
    units, here = _units(worker, targets, jobs, (budget, seed, shard, *args))
    count = len(units) + len(here)
    ended: list[TargetReport] = []

    def unit_ended(report: TargetReport) -> None:
        ended.append(report)
        if tick is not None and count > 1:
            tick(len(ended), count, report.target)

    # one unit: its instances are the progress; more: the units that ended
    per_instance = {"tick": tick} if tick is not None and count == 1 else {}
    reports = _run_units(here, 1, unit_ended, **per_instance) + _run_units(
        units, jobs, unit_ended, **per_instance)
    merged: dict[str, TargetReport] = {}
    for report in reports:
        if report.target in merged:
            merged[report.target].merge(report)
        else:
            merged[report.target] = report
    order = [transform_name(t) for t in targets]
    targets_out = sorted(merged.values(), key=lambda r: order.index(r.target)
                         if r.target in order else len(order))
    return CampaignReport(what, targets_out, budget, seed, shard,
                          time.perf_counter() - start)


def _target(spec: Any) -> Any:
    return spec[1] if spec[0] == "local" else _restore(spec)


# -- rules: guard fuzzing --------------------------------------------------------------------
def verify_rules(rules: Rule | RuleSet | Sequence[Rule] | None = None, *,
                 budget: int | None = None, seed: int = 0, jobs: int = 1,
                 shard: tuple[int, int] | None = None,
                 timeout: float | None = DEFAULT_TIMEOUT, shrink: bool = True,
                 progress: Callable[[str], None] | None = None,
                 widen: Callable[[relax.Function], relax.Function] | None = None,
                 tick: Tick | None = None) -> CampaignReport:
    """Fuzz the guard of every rule (default: the library's) from its example space.

    Parameters
    ----------
    rules : Rule, RuleSet or sequence of rules, optional
        Default :data:`patternkit.patterns.LIBRARY`.
    budget : int, optional
        Instances per rule (:func:`default_budget`: 8, or 200 with
        ``HYPOTHESIS_PROFILE=long``); the rule's default example is always the first.
    seed : int
        Seed of the instance draw and of the random inputs.
    jobs : int
        Worker processes.
    shard : (k, n), optional
        Check only shard ``k`` of ``n`` (1-based) of every rule's instances.
    timeout : float or None
        Seconds one application of a rule may take.
    shrink : bool
        Shrink the first failure of each kind to the fewest non-default knobs.
    progress : callable, optional
        Called with a line saying what the campaign checks.
    widen : callable, optional
        A site function -> the same function in float64, to arbitrate a rewrite site
        that misses (:func:`~patternkit.verification.sites.validate_sites`); it must
        pickle when ``jobs > 1`` (a module-level function, or a ``functools.partial``
        of one).
    tick : callable, optional
        ``tick(done, total, rule_name)`` as each rule is checked (each instance, for one
        rule): the command line's progress bar.

    Returns
    -------
    CampaignReport
        Per rule: instances tried, fired, rejected by reason, the largest error, failures.
    """
    if rules is None:
        from patternkit.patterns import LIBRARY
        rules = LIBRARY
    # a rule, or a DFPatternCallback (an adapter onto one)
    targets: list[Any] = [rules] if is_rule(rules) else list(rules)  # type: ignore[arg-type]
    for rule in targets:
        if not is_rule(rule):
            raise TypeError(f"verify takes rules, found a {type(rule).__name__}")
    say = progress or (lambda message: None)
    budget = default_budget("verify") if budget is None else budget
    say(f"verifying {len(targets)} rule(s), {budget} instance(s) each ...")
    return _campaign("verify", _verify_unit, targets, budget=budget, seed=seed, shard=shard,
                     jobs=jobs, args=(timeout, shrink, widen), tick=tick)


#: Draws per instance of the budget: a rule whose knobs combine into few modules (most
#: combinations raise NoSuchExample) still gets its budget of real instances.
DRAWS_PER_INSTANCE = 8


def knob_instances(rule: Rule, budget: int, seed: int) -> list[dict]:
    """The knob combinations of a rule's campaign: its defaults first, then hypothesis'.

    Combinations that describe no module (:class:`NoSuchExample`) are passed over, up to
    :data:`DRAWS_PER_INSTANCE` draws per instance, so that ``budget`` counts modules.
    """
    from hypothesis import strategies as st

    spaces = example_spaces(rule)
    defaults = {name: values[0] for name, values in spaces[0].items()}
    strategy = st.one_of([st.fixed_dictionaries({name: st.sampled_from(values)
                                                 for name, values in space.items()})
                          for space in spaces])
    drawn = [defaults] + [d for d in draw_instances(strategy, budget * DRAWS_PER_INSTANCE, seed)
                          if d != defaults]
    kept: list[dict[str, Any]] = []
    for knobs in drawn:
        if len(kept) == budget:
            break
        if _describes_a_module(rule, knobs):  # hypothesis draws no value twice
            kept.append(knobs)
    return kept


def example_spaces(rule: Rule) -> list[dict[str, tuple]]:
    """The products of knob values ``rule.example_space()`` unites, each with the edge knob.

    A rule's example space is one product (a dict: knob -> values) or, when its real
    forms differ in which knobs they have or which values make sense together, a list of
    products, one per real form (a union: no product of every knob carved back by
    :class:`NoSuchExample`).  The first product's first values are the default example.
    """
    declared = rule.example_space()
    products = [declared] if isinstance(declared, Mapping) else list(declared)
    if not products:
        products = [{}]
    return [{**{name: tuple(values) for name, values in product.items()},
             "edge": tuple(EDGES)} for product in products]


def _space_holding(spaces: list[dict[str, tuple]], knobs: dict) -> dict[str, tuple]:
    """The product of ``spaces`` that ``knobs`` was drawn from (shrinking stays inside it)."""
    for space in spaces:
        if space.keys() == knobs.keys() and all(knobs[k] in v for k, v in space.items()):
            return space
    return spaces[0]


def _describes_a_module(rule: Rule, knobs: dict) -> bool:
    """False only for a combination the example refuses (a broken example is kept, so
    that the campaign reports it).
    """
    try:
        return build_instance(rule, knobs) is not None
    except Exception:  # noqa: BLE001 - reported by the campaign itself
        return True


def _verify_unit(spec: Any, jobs: int, slot: int, budget: int, seed: int, shard: Any,
                 timeout: float | None, shrink: bool, widen: Callable | None = None,
                 tick: Tick | None = None) -> TargetReport:
    rule = _target(spec)
    report = TargetReport(rule.rule_name)
    start = time.perf_counter()
    instances = knob_instances(rule, budget, seed)
    shrunk_kinds: set = set()
    validated = 0
    for index in _ticking(_share(len(instances), shard, jobs, slot), tick, report.target):
        knobs = instances[index]
        fired = report.fired
        failure = _verify_instance(rule, knobs, report, timeout, seed,
                                   sites=validated < SITE_INSTANCES, widen=widen)
        validated += report.fired > fired
        if failure is None:
            continue
        if failure.kind in SHRUNK_KINDS:
            if failure.kind in shrunk_kinds:
                next(f for f in report.failures if f.kind == failure.kind).occurrences += 1
                continue
            if shrink:
                failure = _shrink_knobs(rule, knobs, failure, timeout, seed, widen)
            shrunk_kinds.add(failure.kind)
        report.failures.append(failure)
    report.seconds = time.perf_counter() - start
    return report


def build_instance(rule: Rule, knobs: dict) -> tvm.IRModule | None:
    """``rule.example(**knobs)`` with its scalar constants nudged by ``knobs["edge"]``;
    ``None`` for a combination that describes no module (:class:`NoSuchExample`).
    """
    example_knobs = {k: v for k, v in knobs.items() if k != "edge"}
    try:
        mod = rule.example(**example_knobs)
    except NoSuchExample:
        return None
    return nudge_scalars(mod, EDGES[knobs.get("edge", "none")])


def _verify_instance(rule: Rule, knobs: dict, report: TargetReport, timeout: float | None,
                     seed: int, count: bool = True, sites: bool = True,
                     widen: Callable | None = None) -> Failure | None:
    """Check one instance, count it in ``report`` (unless not ``count``); its failure.

    With ``sites``, the rewrite sites of an instance that passed the whole-module check
    are validated too (a float16 one only with ``widen``: see :func:`verify_rules`), and
    a failed site is a ``"mismatch"`` naming it.
    """
    def failed(kind, error, module, result=None):
        return Failure(rule.rule_name, kind, error, module, dict(knobs), result)

    try:
        mod = build_instance(rule, knobs)
    except Exception as err:  # the rule's own example is broken
        return failed("example", f"example({_knobs_text(knobs)}) raised "
                                 f"{type(err).__name__}: {err}", None)
    if mod is None:
        return None
    if count:
        report.tried += 1
    dtype = narrowest_float_dtype(mod)
    tolerance = rule.tolerance(dtype)
    if count:
        report.tolerances[dtype or "none"] = str(tolerance)
    if isinstance(rule, CompositeRule):
        composite_log = CompositeLog()
        outcome = apply_transform(lambda m: _compose(rule, m, composite_log), mod, timeout)
        fired = bool(composite_log.formed)
        reasons = [s.reason for s in composite_log.skipped if getattr(s, "reason", "")]
    else:
        rewrite_log = RewriteLog()
        outcome = apply_transform(lambda m: rewrite(rule, m, log=rewrite_log), mod, timeout)
        fired = rewrite_log.count() > 0
        reasons = rewrite_log.reasons(rule.rule_name)
    if not outcome.ok:
        return failed(outcome.kind, outcome.error, mod)
    if not fired:
        reason = reasons[0] if reasons else _near_miss(rule, mod)
        if reason is None:
            return failed("no-reason", "the rule neither fired nor gave a reason", mod)
        if count:
            report.reject(reason)
        return None
    if count:
        report.fired += 1
    try:
        judged = judge_result(mod, outcome, rtol=tolerance.rtol, atol=tolerance.atol, seed=seed,
                              input_options={"positive": POSITIVE})
    except ValueError as err:  # the input does not build: the example is at fault
        return failed("example", str(err), mod)
    if judged.max_abs_error is not None and count:
        report.max_abs_error = max(report.max_abs_error, judged.max_abs_error)
    if not judged.ok:
        return failed(judged.kind, f"{judged.error} [tolerance for {dtype}: {tolerance}]", mod,
                      judged.result)
    # a composite's proof is its round trip
    if sites and not isinstance(rule, CompositeRule) and \
            (widen is not None or dtype != WIDE_SKIPPED):
        site = _failed_site(rule, mod, outcome.result, rewrite_log, seed, widen)
        if site is not None:
            return failed("mismatch", site, mod, outcome.result)
    return None


def _failed_site(rule: Rule, mod: tvm.IRModule, after: tvm.IRModule, rewrite_log: RewriteLog,
                 seed: int, widen: Callable | None) -> str | None:
    """Why the first failed rewrite site of one instance failed (``None``: none did)."""
    try:
        inputs = numeric.random_inputs(mod["main"], seed=seed, positive=POSITIVE)
        sites = validate_sites(mod, after, rewrite_log, inputs=inputs, seed=seed, rules=[rule],
                               widen=widen)
    except Exception as err:  # noqa: BLE001 - a validation that cannot run finds nothing
        log.warning("%s: the rewrite sites could not be validated: %s: %s", rule.rule_name,
                    type(err).__name__, err)
        return None
    if not sites.failures:
        return None
    site = sites.failures[0]
    return (f"rewrite site {site.function}:{site.binding} of {site.rule}: {site.reason} "
            f"(max abs error {site.max_abs_error:.3g}, max rel error "
            f"{site.max_rel_error:.3g}) [tolerance: {site.tolerance}]")


def _near_miss(rule: Rule, mod: tvm.IRModule) -> str | None:
    """Why the rule's pattern matches no binding of ``main`` (its deepest near miss)."""
    func = mod["main"]
    bindings = [b for block in func.body.blocks for b in block.bindings]
    best = None
    for root in rule.root_patterns():  # one, or the ends of a multi-root rule's context
        texts = [explain(root, binding.value, func) for binding in bindings]
        if "matched" not in texts:
            return texts[-1] if texts else best
    return best  # every root matched: the match was dropped without a reason


def _shrink_knobs(rule: Rule, knobs: dict, failure: Failure, timeout: float | None,
                  seed: int, widen: Callable | None = None) -> Failure:
    """Set knobs back to earlier values (defaults first) while the failure stays the same
    kind; the failure of the fewest, simplest knobs.
    """
    space = _space_holding(example_spaces(rule), knobs)
    best, best_failure = dict(knobs), failure
    changed = True
    while changed:
        changed = False
        for name, values in space.items():
            position = values.index(best[name]) if best[name] in values else 0
            for simpler in values[:position]:
                trial = {**best, name: simpler}
                again = _verify_instance(rule, trial, TargetReport(rule.rule_name), timeout,
                                         seed, count=False, widen=widen)
                if again is not None and again.kind == failure.kind:
                    best, best_failure, changed = trial, again, True
                    break
    best_failure.shrunk = True
    best_failure.occurrences = failure.occurrences
    return best_failure


#: One instance's check and its shrinking, for campaigns run unit by unit (``campaign``).
verify_instance, shrink_knobs = _verify_instance, _shrink_knobs


def _knobs_text(knobs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in knobs.items())


def nudge_scalars(mod: tvm.IRModule, epsilons: float) -> tvm.IRModule:
    """``mod`` with every one-element floating constant of ``main`` scaled by
    ``1 + epsilons * eps(dtype)`` (``0``: ``mod`` itself).
    """
    if not epsilons:
        return mod
    func = mod["main"]
    mapping: dict = {}

    def visit(expr):
        if isinstance(expr, tvm.ir.GenericConst) and C.handle(expr) not in mapping:
            dtype = C.dtype_of(expr.ty)
            eps = machine_epsilon(dtype)
            value = C.const_to_numpy(expr)
            if eps is not None and value.size == 1:
                nudged = np.asarray(value, "float64") * (1 + epsilons * eps)
                mapping[C.handle(expr)] = relax.const(nudged.astype("float32"), dtype)

    relax.analysis.post_order_visit(func.body, visit)
    if not mapping:
        return mod
    blocks = [make_block([relax.VarBinding(b.var, substitute(b.value, mapping, by_handle=True))
                          for b in block.bindings], isinstance(block, relax.DataflowBlock))
              for block in func.body.blocks]
    functions = dict(mod.functions.items())
    functions[mod.get_global_var("main")] = rebuild_function(func, blocks)
    return C.copy_module(mod, functions)


# -- passes: differential testing ------------------------------------------------------------
def fuzz_pass(transform: Any, strategy: Any = None, *, budget: int | None = None, seed: int = 0,
              tolerance: Tolerance | Callable[[str | None], Tolerance] | None = None,
              timeout: float | None = DEFAULT_TIMEOUT, jobs: int = 1,
              shard: tuple[int, int] | None = None, shrink: bool = True,
              name: str | None = None, tick: Tick | None = None) -> CampaignReport:
    """Differential-test a transform on random programs; see the module docstring.

    Parameters
    ----------
    transform : tvm.transform.Pass, Rule, RuleSet, callable or str
        Anything :func:`as_transform` takes, or a name (:func:`resolve_target`): only
        targets given by name, library rules and picklable callables run in ``jobs``
        worker processes (a ``Pass`` object does not pickle; it runs in this process).
    strategy : hypothesis strategy of IRModules, or a name of :data:`STRATEGIES`, optional
        ``"networks"`` (the default): :func:`~patternkit.testing.strategies.relax_programs`,
        network-like programs; ``"ops"``: :func:`~patternkit.testing.op_programs.op_programs`,
        programs grown operator by operator from the whole catalogue
        (``patternkit fuzz`` uses it by default).  A named strategy travels to ``jobs``
        worker processes; a strategy object is drawn in this process.
    budget : int, optional
        Instances (:func:`default_budget`: 300, or 3000 with ``HYPOTHESIS_PROFILE=long``).
    tolerance : Tolerance or callable, optional
        The tolerance, or ``dtype -> Tolerance``; default
        :func:`patternkit.engine.tolerance.default_tolerance` of each program's coarsest
        floating dtype (a rule's own :meth:`~patternkit.Rule.tolerance` for a rule).
    seed, jobs, shard, timeout, shrink :
        As for :func:`verify_rules`.
    name : str, optional
        The target's name in the report (default :func:`transform_name`).
    tick : callable, optional
        ``tick(done, total, name)`` as instances are checked (as workers end, with
        ``jobs > 1``): the command line's progress bar.

    With a ``strategy`` of its own the campaign runs in this process (strategies need
    not pickle).

    Each result is judged as :func:`patternkit.compare` judges
    (:func:`~patternkit.verification.differential.judge_result`): a drawn program whose
    outputs are no evidence on any of its draws (all zero, constant, non-finite or within
    ``atol``) is skipped with a warning, like one that does not build: it is neither
    counted as tried nor as a pass.  Besides the seeded draws, each result runs on the
    adversarial draws of :data:`~patternkit.verification.differential.ADVERSARIAL`
    (no build of their own); a miss on one is a ``"mismatch"`` naming the draw.  There,
    reference elements that are not finite (an ``exp`` of 1e4) are no evidence, not a
    failure, unless the result is not finite where the reference is.  In
    :func:`verify_rules` the same verdict on a rule's own example is a failure of kind
    ``"inconclusive"``: the example proves nothing.

    Returns
    -------
    CampaignReport
        One target: instances tried, how many the transform changed, the largest error,
        and the failures, each with ``.module`` (shrunk for wrong results) and ``.error``.
    """
    as_transform(transform)  # a TypeError now, not in a worker
    if isinstance(strategy, str) and strategy not in STRATEGIES:
        raise ValueError(f"no strategy {strategy!r}: give one of {', '.join(STRATEGIES)} "
                         f"or a hypothesis strategy")
    budget = default_budget("fuzz") if budget is None else budget
    label = name or transform_name(transform)
    local = strategy is not None and not isinstance(strategy, str)
    return _campaign(f"fuzz {label}", _fuzz_unit, [transform], budget=budget, seed=seed,
                     shard=shard, jobs=1 if local else jobs,
                     args=(strategy, tolerance, timeout, shrink, label), tick=tick)


def _fuzz_checker(target: Any, transform: Callable, tolerance: Any, timeout: float | None,
                  seed: int, skipped: list[str]) -> Callable[[tvm.IRModule],
                                                         tuple[Outcome | None, str]]:
    """``check(mod) -> (outcome, "dtype: tolerance")`` of ``transform`` on one program.

    A program that does not build, or whose outputs are no evidence, is ``(None, "")``
    with the reason appended to ``skipped``.
    """

    def tolerance_of(mod):
        dtype = narrowest_float_dtype(mod)
        if isinstance(tolerance, Tolerance):
            return dtype, tolerance
        if callable(tolerance):
            return dtype, tolerance(dtype)
        if is_rule(target):
            return dtype, target.tolerance(dtype)
        return dtype, default_tolerance(dtype)

    def check(mod) -> tuple[Outcome | None, str]:
        dtype, tol = tolerance_of(mod)
        outcome = apply_transform(transform, mod, timeout)
        try:
            outcome = judge_result(mod, outcome, rtol=tol.rtol, atol=tol.atol, seed=seed,
                                   input_options={"positive": POSITIVE})
        except ValueError as err:
            log.warning("skipped a drawn program that does not build: %s", err)
            skipped.append(SKIPPED_UNBUILDABLE)
            return None, ""
        if outcome.kind == "inconclusive":
            # the drawn program's outputs are degenerate on every draw (``x - x``): it
            # can judge no pass, so it is neither a pass nor the pass's failure
            log.warning("skipped a drawn program whose outputs are no evidence: %s",
                        outcome.error)
            skipped.append(SKIPPED_NO_EVIDENCE)
            return None, ""
        return outcome, f"{dtype or 'none'}: {tol}"

    return check


def fuzz_instance(target: Any, mod: tvm.IRModule, *, label: str, seed: int = 0,
                  tolerance: Any = None, timeout: float | None = DEFAULT_TIMEOUT,
                  shrink: bool = True) -> TargetReport:
    """One program through ``target``, judged as :func:`fuzz_pass` judges each instance.

    The hook of recorded campaigns (:mod:`patternkit.testing.campaign_checks`) and of
    replayed counterexamples: a report of one instance, with its failure shrunk when
    ``shrink`` and the failure's kind is one of :data:`SHRUNK_KINDS`.
    """
    transform = as_transform(target)
    report = TargetReport(label)
    start = time.perf_counter()
    skipped: list[str] = []
    check = _fuzz_checker(target, transform, tolerance, timeout, seed, skipped)
    outcome, tol_text = check(mod)
    for reason in skipped:
        report.reject(reason)
    if outcome is not None:
        report.tried += 1
        report.fired += outcome.changed
        report.tolerances[tol_text.split(":")[0]] = tol_text.split(": ", 1)[1]
        if outcome.max_abs_error is not None:
            report.max_abs_error = max(report.max_abs_error, outcome.max_abs_error)
        if outcome.kind is not None:
            failure = Failure(label, outcome.kind, outcome.error, mod, None, outcome.result)
            if shrink and outcome.kind in SHRUNK_KINDS:
                def still_fails(candidate, kind=outcome.kind):
                    again, _ = check(candidate)
                    return again is not None and again.kind == kind

                small = shrink_module(mod, still_fails)
                again, _ = check(small)
                if again is not None and again.kind is not None:
                    failure = Failure(label, again.kind, again.error, small, None,
                                      again.result, shrunk=True)
            report.failures.append(failure)
    report.seconds = time.perf_counter() - start
    return report


def _fuzz_unit(spec: Any, jobs: int, slot: int, budget: int, seed: int, shard: Any,
               strategy: Any, tolerance: Any, timeout: float | None, shrink: bool,
               label: str, tick: Tick | None = None) -> TargetReport:
    target = _target(spec)
    if isinstance(target, str):
        target = resolve_target(target)
    transform = as_transform(target)
    if strategy is None or isinstance(strategy, str):
        strategy = named_strategy(strategy or "networks")
    report = TargetReport(label)
    start = time.perf_counter()
    instances = draw_instances(strategy, budget, seed)
    shrunk_kinds: set = set()
    skipped: list[str] = []
    check = _fuzz_checker(target, transform, tolerance, timeout, seed, skipped)
    for index in _ticking(_share(len(instances), shard, jobs, slot), tick, label):
        mod = instances[index]
        outcome, tol_text = check(mod)
        for reason in skipped:  # the instance's own skips (not its shrinking's)
            report.reject(reason)
        skipped.clear()
        if outcome is None:
            continue
        report.tried += 1
        report.fired += outcome.changed
        report.tolerances[tol_text.split(":")[0]] = tol_text.split(": ", 1)[1]
        if outcome.max_abs_error is not None:
            report.max_abs_error = max(report.max_abs_error, outcome.max_abs_error)
        if outcome.kind is None:  # ok
            continue
        failure = Failure(label, outcome.kind, outcome.error, mod, None, outcome.result)
        if outcome.kind in SHRUNK_KINDS:
            if outcome.kind in shrunk_kinds:
                next(f for f in report.failures if f.kind == outcome.kind).occurrences += 1
                continue
            shrunk_kinds.add(outcome.kind)
            if shrink:
                def still_fails(candidate, kind=outcome.kind):
                    again, _ = check(candidate)
                    return again is not None and again.kind == kind

                small = shrink_module(mod, still_fails)
                again, _ = check(small)
                skipped.clear()
                if again is not None and again.kind is not None:  # it still fails, as kept
                    failure = Failure(label, again.kind, again.error, small, None,
                                      again.result, shrunk=True)
        report.failures.append(failure)
    report.seconds = time.perf_counter() - start
    return report


# -- round trips ------------------------------------------------------------------------------
def fuzz_roundtrip(*, budget: int | None = None, seed: int = 0, jobs: int = 1,
                   shard: tuple[int, int] | None = None, max_ops: int = 12,
                   tick: Tick | None = None) -> CampaignReport:
    """``DefuseOps(FuseOps(x)) == x`` on random graphs
    (:func:`~patternkit.testing.graphs.relax_graphs`), structurally; ``tick`` as for
    :func:`fuzz_pass`.
    """
    budget = default_budget("roundtrip") if budget is None else budget
    return _campaign("fuzz roundtrip", _roundtrip_unit, ["roundtrip"], budget=budget,
                     seed=seed, shard=shard, jobs=jobs, args=(max_ops,), tick=tick)


def _roundtrip_unit(spec: Any, jobs: int, slot: int, budget: int, seed: int, shard: Any,
                    max_ops: int, tick: Tick | None = None) -> TargetReport:
    from .graphs import relax_graphs

    report = TargetReport("roundtrip")
    start = time.perf_counter()
    instances = draw_instances(relax_graphs(max_ops=max_ops), budget, seed)
    for index in _ticking(_share(len(instances), shard, jobs, slot), tick, "roundtrip"):
        report.merge(roundtrip_instance(instances[index]))
    report.seconds = time.perf_counter() - start
    return report


def roundtrip_instance(mod: tvm.IRModule) -> TargetReport:
    """``DefuseOps(FuseOps(mod)) == mod`` on one graph: a report of one instance.

    The hook of recorded ``fuzz roundtrip`` campaigns and of replayed counterexamples.
    """
    report = TargetReport("roundtrip", tried=1)
    try:
        result = check_roundtrip(mod, raise_on_failure=False)
    except Exception as err:  # FuseOps or DefuseOps raised
        report.failures.append(Failure("roundtrip", "raised",
                                       f"{type(err).__name__}: {err}", mod))
        return report
    report.fired += 1
    if not result.ok:
        report.failures.append(Failure("roundtrip", "mismatch", str(result), mod))
    return report
