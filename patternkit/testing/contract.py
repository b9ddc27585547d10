"""The rule contract: every rule proved four ways, from one case written in its test file.

A :class:`RuleCase` states, for one rule, what the style guide asks every rule to show:

1. **structure**: a ``before`` module and the ``expected`` module the rule makes of it,
   compared with structural equality (the rule must fire, and ``before`` must differ
   from ``expected``);
2. **reasons**: :class:`Negative` modules where the rule must refuse, each with the
   reason it must give (a check's :func:`patternkit.reject` reason, or, when the pattern
   does not match at all, :func:`patternkit.explain`'s account of the near miss); the
   module is left alone, or becomes the negative's ``expected`` (a composite with
   optional parts may take a smaller match instead);
3. **round trip**: the result is well formed, prints as TVMScript and parses back to the
   same module, and defuses back: ``DefuseOps(MergeComposite(before)) == before`` for a
   composite, ``DefuseOps(FuseOps(after)) == after`` for a rewrite;
4. **numerics**: ``before`` and the result built for ``llvm`` and run on the VM with
   seeded inputs agree within the case's :class:`Tolerance`, which is :data:`EXACT` for
   structure-only transforms and otherwise says why it is what it is; and each rewrite
   site agrees on its own, on those inputs and on adversarial ones (wide values, zeros,
   :func:`~patternkit.verification.sites.validate_sites`), since a rewrite exact on
   [-1, 1] and wrong elsewhere passes the seeded draws.

:func:`check_rule` runs all four and raises ``AssertionError`` naming the rule and the
proof that failed; the library's meta-test requires a case for every library rule and a
negative for every ``reject(...)`` in a rule's source (:attr:`NegativeResult.site`).

TVMScript prints tensor constants as metadata it cannot parse back, so the re-parse
proof lifts them to function parameters first; keep weights as parameters in cases
where the rule allows it (and bind them with ``relax.transform.BindParams`` where it
needs constants).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import tvm
from tvm import relax

from ..byoc.merge import CompositeLog, merge_composite
from ..dpl import explain
from ..engine import EXACT, CompositeRule, RewriteLog, RewriteRule, Rule, Tolerance, rewrite
from ..engine.rule import as_rule
from ..ir import compat as C
from ..verification.differential import WIDE_SKIPPED, narrowest_float_dtype
from ..verification.numeric import assert_same_numerics, random_inputs
from ..verification.roundtrip import check_roundtrip
from ..verification.sites import validate_sites

__all__ = ["Tolerance", "EXACT", "Negative", "RuleCase", "NegativeResult", "RuleProof",
           "apply_rule", "check_rule", "prove_structure", "prove_reasons", "prove_round_trip",
           "prove_numerics", "prove_sites", "assert_reparses"]


@dataclass(frozen=True)
class Negative:
    """A module where the rule must refuse, and the reason it must give.

    Attributes
    ----------
    name : str
        What the case is (``"full_tensor_gamma"``); used in failure messages.
    before : tvm.IRModule
    reason : str
        Text the rule's reason must contain.  When the check refuses, the reason is the
        ``reject(...)`` text; when the pattern does not match, it is the
        :func:`patternkit.explain` report at the binding ``at``.
    at : str, optional
        The variable whose binding ``explain`` is asked about (default: the last binding
        of ``main``).
    expected : tvm.IRModule, optional
        What the rule makes of ``before`` after refusing (default: ``before`` unchanged),
        e.g. the conv alone as a composite when a conv + add composite refuses the add.
    """

    name: str
    before: tvm.IRModule
    reason: str
    at: str | None = None
    expected: tvm.IRModule | None = None


@dataclass(frozen=True)
class RuleCase:
    """The four proofs' inputs for one rule; see the module docstring.

    Attributes
    ----------
    rule : Rule
        A :class:`patternkit.RewriteRule` (or ``DFPatternCallback``) or a
        :class:`patternkit.CompositeRule`.
    before, expected : tvm.IRModule
        The positive case, written in the test (TVMScript), compared structurally.
    negatives : sequence of Negative
    tolerance : Tolerance
        :data:`EXACT`, or the tolerance of an arithmetic change with its reason.
    positive : tuple of str
        Inputs whose names contain one of these are drawn positive for the numeric proof
        (variances), as :func:`patternkit.compare` does.
    """

    rule: Rule
    before: tvm.IRModule
    expected: tvm.IRModule
    negatives: Sequence[Negative]
    tolerance: Tolerance
    positive: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The rule's name."""
        return self.rule.rule_name


@dataclass(frozen=True)
class NegativeResult:
    """What a negative case gave: the reasons found and the ``reject`` site that fired."""

    negative: Negative
    reasons: tuple[str, ...]
    site: tuple[str, int] | None  # file and line of the reject(...) that refused


@dataclass
class RuleProof:
    """What :func:`check_rule` proved (returned when every proof passed)."""

    rule: str
    after: tvm.IRModule
    negatives: list[NegativeResult] = field(default_factory=list)


# -- applying a rule --------------------------------------------------------------------------
@dataclass(frozen=True)
class Applied:
    """A rule applied once: the result, how often it fired and the refusals it gave."""

    module: tvm.IRModule
    fired: int
    refusals: tuple[tuple[str, Any], ...]  # (reason, Reject or None)


def apply_rule(rule: Rule, mod: tvm.IRModule) -> Applied:
    """``rewrite`` a rewrite rule, ``merge_composite`` a composite rule, and log it."""
    rule = as_rule(rule, "apply_rule")  # a DFPatternCallback: the rule it stands for
    name = rule.name
    if isinstance(rule, CompositeRule):
        log = CompositeLog()
        out = merge_composite(mod, [rule], log=log)
        return Applied(out, sum(1 for f in log.formed if f.entry == name),
                       tuple((s.reason, s.rejection) for s in log.skipped
                             if s.entry == name and s.kind == "check"))
    if isinstance(rule, RewriteRule):
        rewrite_log = RewriteLog()
        out = rewrite(rule, mod, log=rewrite_log)
        return Applied(out, rewrite_log.count(name),
                       tuple((s.reason, s.rejection) for s in rewrite_log.skipped
                             if s.rule == name))
    raise TypeError(f"a rule case needs a RewriteRule or a CompositeRule, found "
                    f"{type(rule).__name__}")


# -- the four proofs --------------------------------------------------------------------------
def check_rule(case: RuleCase) -> RuleProof:
    """Run the four proofs of ``case``; ``AssertionError`` names the one that failed."""
    __tracebackhide__ = True  # pylint: disable=unused-variable  (pytest: hide this frame)
    after = prove_structure(case)
    negatives = prove_reasons(case)
    prove_round_trip(case, after)
    prove_numerics(case, after)
    return RuleProof(case.name, after, negatives)


def prove_structure(case: RuleCase) -> tvm.IRModule:
    """Proof 1: the rule turns ``before`` into ``expected``; returns the result."""
    __tracebackhide__ = True  # pylint: disable=unused-variable
    if C.structural_equal(case.before, case.expected):
        raise AssertionError(f"{case.name}: the positive case's Expected equals Before; "
                             f"write a case the rule changes")
    applied = apply_rule(case.rule, case.before)
    if not applied.fired:
        raise AssertionError(f"{case.name} did not fire on the positive case "
                             f"(reasons: {[r for r, _ in applied.refusals] or 'none'})")
    try:
        tvm.ir.assert_structural_equal(applied.module, case.expected)
    except ValueError as err:
        raise AssertionError(f"{case.name}: the result differs from Expected: {err}\n"
                             f"--- result ---\n{applied.module.script()}") from None
    return applied.module


def prove_reasons(case: RuleCase) -> list[NegativeResult]:
    """Proof 2: each negative is refused (left alone, or as ``expected``) with its reason."""
    __tracebackhide__ = True  # pylint: disable=unused-variable
    if not case.negatives:
        raise AssertionError(f"{case.name}: a rule case needs at least one negative")
    results = []
    for negative in case.negatives:
        applied = apply_rule(case.rule, negative.before)
        where = f"{case.name}, negative '{negative.name}'"
        if negative.expected is None:
            if applied.fired or not C.structural_equal(applied.module, negative.before):
                raise AssertionError(f"{where}: the rule changed the module it must leave "
                                     f"alone:\n{applied.module.script()}")
        elif not C.structural_equal(applied.module, negative.expected):
            raise AssertionError(f"{where}: the result differs from the negative's "
                                 f"expected module:\n{applied.module.script()}")
        if applied.refusals:
            reasons = tuple(reason for reason, _ in applied.refusals)
            site = next((rejection.site for reason, rejection in applied.refusals
                         if rejection is not None and negative.reason in reason), None)
        else:
            reasons = (_near_miss(case.rule, negative),)
            site = None
        if not any(negative.reason in reason for reason in reasons):
            raise AssertionError(f"{where}: expected a reason containing "
                                 f"{negative.reason!r}, the rule gave {list(reasons)}")
        results.append(NegativeResult(negative, reasons, site))
    return results


def prove_round_trip(case: RuleCase, after: tvm.IRModule) -> None:
    """Proof 3: well formed, prints and re-parses, defuses back."""
    __tracebackhide__ = True  # pylint: disable=unused-variable
    if not relax.analysis.check_well_formed(after):
        raise AssertionError(f"{case.name}: the result is not well formed:\n{after.script()}")
    assert_reparses(after, what=f"{case.name}: the result")
    if isinstance(case.rule, CompositeRule):
        # DefuseOps(MergeComposite(before)) == before, with the first difference if not.
        check_roundtrip(case.before, lambda mod: merge_composite(mod, [case.rule]))
    else:
        check_roundtrip(after)  # DefuseOps(FuseOps(after)) == after


def prove_numerics(case: RuleCase, after: tvm.IRModule) -> None:
    """Proof 4: ``before`` and ``after`` agree on llvm within the case's tolerance.

    Judged by :func:`patternkit.compare`: every element and each output as a whole, on
    outputs that are evidence.  A ``before`` whose outputs are all zero, constant or
    within the tolerance proves nothing, so the proof fails (``INCONCLUSIVE``) rather
    than pass: give the case a ``before`` whose outputs vary.
    """
    __tracebackhide__ = True  # pylint: disable=unused-variable
    if isinstance(case.rule, CompositeRule) and not case.tolerance.exact:
        raise AssertionError(f"{case.name}: a composite only wraps bindings in functions; "
                             f"its numeric proof is EXACT, not {case.tolerance}")
    assert_same_numerics(case.before, after, rtol=case.tolerance.rtol,
                         atol=case.tolerance.atol, positive=case.positive)
    if isinstance(case.rule, RewriteRule):
        prove_sites(case, after)


def prove_sites(case: RuleCase, after: tvm.IRModule) -> None:
    """Proof 4, site by site: each rewrite of the positive case, cut out with the values it
    reads, agrees with the region it replaced on the case's inputs and on adversarial
    draws, within the case's tolerance.

    A float16 case is not validated site by site: its wide draw can overflow in the
    region itself, and this layer has no float64 copy to arbitrate
    (:data:`~patternkit.verification.differential.WIDE_SKIPPED`).
    """
    __tracebackhide__ = True  # pylint: disable=unused-variable
    if narrowest_float_dtype(case.before) == WIDE_SKIPPED:
        return
    rewrite_log = RewriteLog()
    rewrite(case.rule, case.before, log=rewrite_log)
    inputs = random_inputs(case.before["main"], positive=case.positive)
    report = validate_sites(case.before, after, rewrite_log, inputs=inputs,
                            rules=[case.rule], tolerance=lambda rule, dtype: case.tolerance)
    if report.failures:
        raise AssertionError(f"{case.name}: a rewrite site computes other numbers than the "
                             f"region it replaced: {report.failures[0]}")


def assert_reparses(mod: tvm.IRModule, what: str = "the module") -> None:
    """``mod`` prints as TVMScript and parses back to a structurally equal module.

    Tensor constants are lifted to parameters of their function first: TVMScript prints
    them as metadata, which it cannot parse back.
    """
    __tracebackhide__ = True  # pylint: disable=unused-variable
    lifted = _constants_as_params(mod)
    text = lifted.script()
    try:
        reparsed = tvm.script.from_source(text)
    except Exception as err:  # the parser's errors have no common base class
        raise AssertionError(f"{what} does not re-parse: {type(err).__name__}: {err}\n"
                             f"{text}") from err
    try:
        tvm.ir.assert_structural_equal(reparsed, lifted)
    except ValueError as err:
        raise AssertionError(f"{what} re-parses to a different module: {err}\n{text}") from None


# -- helpers -----------------------------------------------------------------------------------
def _near_miss(rule: Rule, negative: Negative) -> str:
    func = negative.before["main"]
    bindings = [b for block in func.body.blocks for b in block.bindings]
    if not bindings:
        return "no match: main has no bindings"
    if negative.at is None:
        binding = bindings[-1]
    else:
        binding = next((b for b in bindings if C.var_name(b.var) == negative.at), None)
        if binding is None:
            raise AssertionError(f"{rule.rule_name}, negative '{negative.name}': main has no "
                                 f"binding of '{negative.at}'")
    texts = [explain(root, binding.value, func) for root in as_rule(rule).root_patterns()]
    return next((text for text in texts if text != "matched"), "matched")


@relax.expr_functor.mutator
class _ConstantLifter(relax.PyExprMutator):
    """Replaces every tensor constant by a fresh Var, recording the pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.lifted: list[relax.Var] = []

    def visit_generic_const_(self, const):  # noqa: N802 (TVM's visitor name)
        var = relax.Var(f"const{len(self.lifted)}", const.ty)
        self.lifted.append(var)
        return var


def _constants_as_params(mod: tvm.IRModule) -> tvm.IRModule:
    functions = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            lifter = _ConstantLifter()
            body = lifter.visit_expr(func.body)
            if lifter.lifted:
                func = relax.Function([*func.params, *lifter.lifted], body, func.ret_ty,
                                      func.is_pure, func.attrs)
        functions[gv] = func
    return C.copy_module(mod, functions)
