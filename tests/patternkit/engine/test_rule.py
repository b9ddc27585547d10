"""The rule model: checks that accept with a plan or refuse with a reason, roles by name."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit.engine import variant_method
from patternkit.ir import dtype_of, type_of


@I.ir_module
class DoubleRelu:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.nn.relu(a)
            R.output(b)
        return b


@I.ir_module
class SingleRelu:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            b = R.nn.relu(x)
            R.output(b)
        return b


@dataclass(frozen=True)
class Seen:
    dtype: str


class CollapseDoubleRelu(pk.RewriteRule):
    """``relu(relu(x))`` is ``relu(x)``; counts its checks to show plans are not recomputed."""

    name = "test.collapse_double_relu"

    def __init__(self, dtype: str = "float32"):
        super().__init__()
        self.dtype = dtype
        self.checks = 0
        self.x = pk.wildcard()
        self.inner = pk.is_op("nn.relu")(self.x)
        self.pattern = pk.is_op("nn.relu")(self.inner)

    def check(self, match):
        self.checks += 1
        found = dtype_of(type_of(match.x))
        if found != self.dtype:
            return pk.reject(f"x is {found}, not {self.dtype}", at=match.x)
        return Seen(found)

    def rewrite(self, match):
        assert isinstance(match.plan, Seen) and match.plan.dtype == self.dtype
        return match.inner


def test_a_rewrite_rule_checks_once_and_its_plan_reaches_the_rewrite():
    rule = CollapseDoubleRelu()
    log = pk.RewriteLog()
    out = pk.rewrite(rule, DoubleRelu, log=log)
    tvm.ir.assert_structural_equal(out, SingleRelu)
    assert log.count("test.collapse_double_relu") == 1 and rule.checks == 1
    pk.assert_same_numerics(DoubleRelu, out, rtol=0, atol=0)


def test_a_refusal_carries_its_reason_the_offending_expression_and_its_site():
    log = pk.RewriteLog()
    out = pk.rewrite(CollapseDoubleRelu("float16"), DoubleRelu, log=log)
    tvm.ir.assert_structural_equal(out, DoubleRelu)
    (skip,) = log.skipped
    assert skip.reason == "x is float32, not float16"
    assert skip.rejection.at.same_as(DoubleRelu["main"].params[0])
    lines, first = inspect.getsourcelines(CollapseDoubleRelu.check)
    reject_line = first + next(i for i, line in enumerate(lines) if "pk.reject(" in line)
    assert skip.rejection.site == (__file__, reject_line)


class RaisingHelper(CollapseDoubleRelu):
    name = "test.raising_helper"

    def check(self, match):
        self._require_2d(match.x)
        return True

    @staticmethod
    def _require_2d(x):
        if len(type_of(x).shape) != 3:
            raise pk.reject("x is not 3-D")


def test_a_helper_may_raise_the_refusal():
    log = pk.RewriteLog()
    pk.rewrite(RaisingHelper(), DoubleRelu, log=log)
    assert log.reasons() == ["x is not 3-D"]


@pytest.mark.parametrize("result, reason", [(False, "check returned False"),
                                            (None, "check returned None"),
                                            (np.False_, "check returned np.False_")])
def test_a_falsy_check_result_refuses_and_says_what_it_was(result, reason):
    class Refuses(CollapseDoubleRelu):
        name = "test.refuses"

        def check(self, match):
            return result

    log = pk.RewriteLog()
    pk.rewrite(Refuses(), DoubleRelu, log=log)
    assert log.reasons() == [reason] and log.skipped[0].rejection.site is None


@pytest.mark.parametrize("plan", [0, 1, 2.5, np.float32(0.0), np.int64(-1)])
def test_a_number_is_a_plan_not_a_yes_or_no(plan):
    """An axis of 0 or a folded scale that is a numpy scalar reaches ``rewrite``: it was
    taken as a bare yes (``match.plan`` None) or, when 0, as a refusal."""
    seen = []

    class NumberPlan(CollapseDoubleRelu):
        name = "test.number_plan"

        def check(self, match):
            return plan

        def rewrite(self, match):
            seen.append(match.plan)
            return match.inner

    log = pk.RewriteLog()
    pk.rewrite(NumberPlan(), DoubleRelu, log=log)
    assert seen == [plan] and type(seen[0]) is type(plan) and not log.skipped


def test_any_object_is_a_plan_even_one_without_a_truth_value():
    class ArrayPlan(CollapseDoubleRelu):
        name = "test.array_plan"

        def check(self, match):
            return np.zeros(3)  # bool() of it raises: a plan is never tested for truth

        def rewrite(self, match):
            assert match.plan.shape == (3,)
            return match.inner

    tvm.ir.assert_structural_equal(pk.rewrite(ArrayPlan(), DoubleRelu), SingleRelu)


def test_reject_is_a_falsy_exception():
    refusal = pk.reject("why")
    assert isinstance(refusal, pk.Reject) and isinstance(refusal, Exception) and not refusal
    assert refusal.reason == "why" and repr(refusal) == "reject('why')"


class Roles(pk.RewriteRule):
    name = "test.roles"

    def __init__(self):
        super().__init__()
        self.x, self.bias = pk.wildcard(), pk.wildcard()
        self.conv = pk.is_op("nn.conv2d")(self.x, pk.wildcard())
        self.add = pk.is_op("add")(self.conv, self.bias)
        self.pattern = pk.is_op("nn.relu")(self.add | self.conv)


def _match(rule, expr, func):
    found = pk.dpl.find_match(rule.pattern, expr, func)
    assert found is not None
    return pk.RuleMatch(found, rule.roles())


def test_a_rule_match_reads_roles_by_name_and_says_which_matched():
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((4, 3, 3, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, w))
            out = bb.emit_output(relax.op.nn.relu(c))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    relu = func.body.blocks[0].bindings[-1].value
    rule = Roles()
    m = _match(rule, relu, func)
    assert m.x.same_as(x) and m["x"].same_as(x)
    assert m.conv.op.name == "relax.nn.conv2d" and m.var_of("conv").same_as(c)
    assert "conv" in m and "bias" not in m and "add" not in m
    assert set(m.roles) == {"x", "conv"}
    assert getattr(m, "bias", None) is None
    with pytest.raises(KeyError, match="role 'bias' is not part of this match"):
        m["bias"]
    with pytest.raises(KeyError, match="no role 'gamma' in this rule"):
        m["gamma"]
    # a check may read a role by its pattern too (the attention rule's guards do)
    assert m[rule.x].same_as(x) and m[rule.conv].same_as(m.conv)
    with pytest.raises(KeyError, match="is not part of this match"):
        m[rule.add]
    assert m.node_map[rule.x][0].same_as(x) and m.node_map.var(rule.conv).same_as(c)


def test_a_rule_without_a_check_is_not_asked_and_has_no_example():
    from patternkit.engine.rule import check_of

    rule = Roles()
    assert check_of(rule) is None and rule.example() is None
    assert check_of(pk.DFPatternCallback().as_rule()) is None


def test_a_composite_rule_is_named_for_its_compiler():
    class Conv(pk.CompositeRule):
        pattern_name = "conv2d"

        def __init__(self, compiler="byoc"):
            super().__init__(compiler)
            self.pattern = pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard())

    rule = Conv()
    assert rule.name == "byoc.conv2d" and rule.for_compiler("dnnl").name == "dnnl.conv2d"
    assert rule.for_compiler("byoc") is rule and rule.name == "byoc.conv2d"
    assert rule.entry() == ("byoc.conv2d", rule.pattern, None)
    with pytest.raises(ValueError, match="compiler must be a non-empty name without dots"):
        Conv("a.b")



class Scaled(pk.RewriteRule):
    """``x * factor`` -> ``x + x`` (a rule whose example depends on its variant)."""

    name = "test.scaled"

    def __init__(self, factor: float = 2.0):
        super().__init__()
        self.factor = factor
        self.x = pk.wildcard()
        self.pattern = self.x * factor

    def rewrite(self, match):
        return match.x + match.x

    @variant_method
    def example(self, dtype: str = "float32"):
        """``x * factor`` for this variant's factor."""
        x = relax.Var("x", relax.TensorType((2, 3), dtype))
        return pk.from_expr(x * relax.const(self.factor, dtype))

    @variant_method
    def example_space(self):
        return {"dtype": ("float32", "float16"), "factor": (self.factor,)}


def _constant(mod) -> float:
    [binding] = mod["main"].body.blocks[0].bindings
    return float(binding.value.args[1].value.numpy())


def test_a_variant_method_is_the_instances_on_an_instance_and_the_defaults_on_the_class():
    assert _constant(Scaled(3.0).example()) == 3.0
    assert _constant(Scaled.example()) == 2.0  # on the class: the default variant's
    assert Scaled.example_space()["factor"] == (2.0,)
    assert Scaled(3.0).example_space()["factor"] == (3.0,)
    assert Scaled.example.__doc__ == "``x * factor`` for this variant's factor."
