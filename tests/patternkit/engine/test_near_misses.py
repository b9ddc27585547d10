"""A family's skeleton left in the rewritten module is reported with the rule that looked
at it and why it declined: the check's refusal, the rewrite's decline, or the deepest
point where the rule's pattern failed; a site a composite takes is no miss."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.engine import NearMiss, NearMissDetector, find_near_misses
from patternkit.errors import PatternError


def gate(shape: tuple[int, ...], same_operand: bool = True) -> tvm.IRModule:
    """``x * sigmoid(x)`` (or ``x * sigmoid(y)``) of ``shape``, then an ``exp``."""
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    y = relax.Var("y", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            s = bb.emit(relax.op.sigmoid(x if same_operand else y), "s")
            g = bb.emit(relax.op.multiply(x, s), "g")
            out = bb.emit_output(relax.op.exp(g))
        bb.emit_func_output(out)
    return bb.get()


class SiluCollapse(pk.RewriteRule):
    """x * sigmoid(x) -> silu(x), for matrices only."""

    name = "test.silu"

    def __init__(self):
        super().__init__()
        self.x = pk.wildcard()
        self.pattern = pk.is_op("relax.multiply")(self.x, pk.is_op("relax.sigmoid")(self.x))

    def check(self, match):
        if match.x.ty.ndim != 2:
            return pk.reject(f"x has rank {match.x.ty.ndim}, not 2", match.x)
        return True

    def rewrite(self, match):
        return relax.op.nn.silu(match.x)


class DecliningSilu(SiluCollapse):
    """Declines in its rewrite, with a reason of its own (returns the match unchanged)."""

    name = "test.silu_declining"

    def rewrite(self, match):
        return match.root


class GateComposite(pk.CompositeRule):
    """Any a * sigmoid(b), for an external compiler."""

    name = "test.gate"

    def __init__(self):
        super().__init__()
        self.pattern = pk.is_op("relax.multiply")(pk.wildcard(),
                                                  pk.is_op("relax.sigmoid")(pk.wildcard()))


def detector(*rules) -> NearMissDetector:
    skeleton = pk.is_op("relax.multiply")(pk.wildcard(), pk.is_op("relax.sigmoid")(pk.wildcard()))
    return NearMissDetector("silu", "x * sigmoid(x)", skeleton, rules or (SiluCollapse(),))


def rewrite_logged(rules, mod) -> pk.RewriteLog:
    log = pk.RewriteLog()
    pk.rewrite(rules, mod, log=log)
    return log


def test_a_rewritten_site_is_no_near_miss():
    log = rewrite_logged([SiluCollapse()], gate((4, 8)))
    assert log.count("test.silu") == 1
    assert log.near_misses([detector()]) == []


def test_a_refused_site_names_the_rule_and_its_reason():
    log = rewrite_logged([SiluCollapse()], gate((2, 4, 8)))
    (miss,) = log.near_misses([detector()])
    assert isinstance(miss, NearMiss)
    assert (miss.family, miss.function, miss.binding, miss.rule, miss.kind) == (
        "silu", "main", "g", "test.silu", "check")
    assert miss.reason == "x has rank 3, not 2"
    assert "test.silu: x has rank 3, not 2" in str(miss) and "'g'" in str(miss)
    assert miss.to_dict()["reason"] == miss.reason


def test_a_rewrite_that_declines_is_reported_as_declined():
    log = rewrite_logged([DecliningSilu()], gate((4, 8)))
    (miss,) = log.near_misses([detector(DecliningSilu())])
    assert (miss.rule, miss.kind) == ("test.silu_declining", "declined")
    assert "binding left as it is" in miss.reason


def test_where_no_rule_matched_the_deepest_pattern_failure_is_given():
    log = rewrite_logged([SiluCollapse()], gate((4, 8), same_operand=False))
    assert log.skipped == []  # the rewrite itself recorded nothing here
    (miss,) = log.near_misses([detector()])
    assert (miss.rule, miss.kind) == ("test.silu", "no match")
    # the sigmoid's operand is where x (already bound to 'x') and the graph part
    assert miss.reason.startswith("at 'g': no match:") and miss.reason.endswith("(depth 3) vs y")


def test_a_site_a_composite_takes_is_no_near_miss():
    mod = gate((4, 8), same_operand=False)
    log = rewrite_logged([SiluCollapse()], mod)
    assert log.near_misses([detector(SiluCollapse(), GateComposite())]) == []


def test_a_site_the_rule_would_take_had_the_rewrite_been_given_it_says_so():
    class TanhToSigmoid(pk.RewriteRule):
        name = "test.unrelated"

        def __init__(self):
            super().__init__()
            self.pattern = pk.is_op("relax.tanh")(pk.wildcard())

        def rewrite(self, match):
            return relax.op.sigmoid(match.root.args[0])

    log = rewrite_logged([TanhToSigmoid()], gate((4, 8)))
    (miss,) = log.near_misses([detector()])
    assert (miss.rule, miss.kind) == ("test.silu", "not applied")
    assert "not among the rules the rewrite was given" in miss.reason


def test_a_site_seen_by_two_detectors_is_reported_once_by_the_first():
    log = rewrite_logged([SiluCollapse()], gate((2, 4, 8)))
    sigmoid_only = NearMissDetector("sigmoid", "sigmoid(x)",
                                    pk.is_op("relax.sigmoid")(pk.wildcard()), (SiluCollapse(),))
    misses = log.near_misses([detector(), sigmoid_only])
    assert [m.family for m in misses] == ["silu"]


def test_a_module_without_the_skeleton_has_no_near_miss():
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    mod = pk.from_expr(relax.op.exp(x))
    assert rewrite_logged([SiluCollapse()], mod).near_misses([detector()]) == []


def test_the_users_module_is_left_as_it_was():
    mod = gate((2, 4, 8))
    copy = tvm.script.from_source(mod.script())
    log = rewrite_logged([SiluCollapse()], mod)
    find_near_misses(mod, [detector()], log.skipped)
    log.near_misses([detector()])
    tvm.ir.assert_structural_equal(mod, copy)


def test_a_check_that_raises_is_reported_not_raised():
    class Raising(SiluCollapse):
        name = "test.silu_raising"

        def check(self, match):
            raise RuntimeError("boom")

    mod = gate((2, 4, 8))
    (miss,) = find_near_misses(mod, [detector(Raising())])
    assert miss.rule == "test.silu_raising"
    assert miss.reason == "its check raised RuntimeError: boom"


def test_near_misses_before_any_rewrite_says_so():
    with pytest.raises(ValueError, match="no rewrite yet"):
        pk.RewriteLog().near_misses([detector()])


def test_a_detector_needs_a_pattern_and_rules():
    with pytest.raises(PatternError, match="silu: pattern must be a DFPattern"):
        NearMissDetector("silu", "x", "multiply", (SiluCollapse(),))
    with pytest.raises(PatternError, match="silu: name the family's rules"):
        NearMissDetector("silu", "x", pk.wildcard(), ())
    with pytest.raises(PatternError, match="detector 0 is a str"):
        find_near_misses(gate((4, 8)), ["silu"])


def test_a_detector_keeps_only_the_rules_asked_for():
    both = detector(SiluCollapse(), GateComposite())
    assert [r.name for r in both.only(["test.gate"]).rules] == ["test.gate"]
    assert both.only(["other.rule"]) is None
