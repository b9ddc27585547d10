"""softmax: the written-out stable softmax collapses into softmax; the unshifted form only
on request."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit.patterns import EXPANSIONS, LIBRARY
from patternkit.patterns.softmax import SoftmaxCollapse, softmax_graph
from patternkit.testing import Negative, RuleCase, Tolerance, apply_rule, check_rule
from patternkit.verification.numeric import run

RULE = "softmax.collapse"
SHAPE_VARS = {"n": 2, "s": 5, "h": 3}

#: R.nn.softmax legalises to max, subtract, exp, sum and divide over the same axis in the
#: same order, in the input dtype: the results are bit-identical (measured, float32 and
#: float16), so the tolerance is zero.
SAME_OPS = Tolerance(0.0, 0.0, "softmax legalises to the very max / subtract / exp / sum / "
                               "divide the model writes out: bit-identical")


@I.ir_module
class WrittenOut:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32")) -> R.Tensor(("n", "s", 16), "float32"):
        with R.dataflow():
            m = R.max(x, axis=[-1], keepdims=True)
            shifted = R.subtract(x, m)
            e = R.exp(shifted)
            total = R.sum(e, axis=[-1], keepdims=True)
            out = R.divide(e, total)
            R.output(out)
        return out


@I.ir_module
class Collapsed:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32")) -> R.Tensor(("n", "s", 16), "float32"):
        with R.dataflow():
            out = R.nn.softmax(x, axis=-1)
            R.output(out)
        return out


def written_out(x_ty=None, max_axes=(-1,), sum_axes=(-1,), keepdims=True) -> tvm.IRModule:
    """``exp(x - max(x)) / sum(exp(x - max(x)))`` with the reductions replaceable."""
    x = relax.Var("x", x_ty or relax.TensorType((2, 5, 16), "float32"))
    return softmax_graph(x, max_axes, sum_axes, keepdims=keepdims)


COLLAPSE_CASE = RuleCase(
    SoftmaxCollapse(), WrittenOut, Collapsed,
    negatives=[
        Negative("x_of_unknown_rank", written_out(relax.TensorType(ndim=-1, dtype="float32")),
                 "x has an unknown rank"),
        Negative("sum_over_two_axes", written_out(sum_axes=(-2, -1)),
                 "the sum reduces the axes [-2, -1]: a softmax normalises along one axis"),
        Negative("sum_without_keepdims", written_out(relax.TensorType((16, 16), "float32"),
                                                     keepdims=False),
                 "the sum over axis -1 drops it (keepdims=False)"),
        Negative("max_over_another_axis", SoftmaxCollapse().example(max_axis=0),
                 "the max reduces axis 0 but the sum axis 2: the shift does not cancel, so "
                 "this is not a softmax"),
        Negative("max_over_two_axes", written_out(max_axes=(-2, -1)),
                 "the max reduces the axes [-2, -1]: a softmax normalises along one axis"),
        Negative("without_the_max", SoftmaxCollapse(shifted=False).example(),
                 "no match: subtract(*, max(*)) (depth 3) vs x"),
    ],
    tolerance=SAME_OPS)


def softmaxes(mod: tvm.IRModule) -> list:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if pk.ir.op_name(b.value) == "relax.nn.softmax"]


def test_softmax_collapse_meets_the_rule_contract():
    check_rule(COLLAPSE_CASE)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("knobs", [
    {}, {"symbolic": True}, {"axis": 1}, {"axis": 0}, {"exps": "recomputed"},
    {"rank": 2}, {"rank": 4, "axis": 2, "symbolic": True},
], ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "last_axis")
def test_every_spelling_collapses_with_identical_numbers(knobs, dtype):
    rule = SoftmaxCollapse()
    before = rule.example(dtype=dtype, **knobs)
    applied = apply_rule(rule, before)
    assert applied.fired == 1
    (softmax,) = softmaxes(applied.module)
    assert int(softmax.attrs.axis) == knobs.get("axis", -1)
    pk.assert_same_numerics(before, applied.module, rtol=0, atol=0, shape_vars=SHAPE_VARS)


def test_softmax_has_no_expand_rule_since_gradient_differentiates_it():
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float32"))
    relax.transform.Gradient("main")(pk.from_expr(relax.op.sum(relax.op.nn.softmax(x))))
    assert not EXPANSIONS.by_prefix("softmax.").names


# -- the unshifted form, on request only --------------------------------------------------------
@I.ir_module
class Unshifted:
    @R.function
    def main(x: R.Tensor(("n", 16), "float32")) -> R.Tensor(("n", 16), "float32"):
        with R.dataflow():
            e = R.exp(x)
            total = R.sum(e, axis=[-1], keepdims=True)
            out = R.divide(e, total)
            R.output(out)
        return out


@I.ir_module
class UnshiftedCollapsed:
    @R.function
    def main(x: R.Tensor(("n", 16), "float32")) -> R.Tensor(("n", 16), "float32"):
        with R.dataflow():
            out = R.nn.softmax(x, axis=-1)
            R.output(out)
        return out


def _unshifted_over(axes) -> tvm.IRModule:
    e = relax.op.exp(relax.Var("x", relax.TensorType((5, 16), "float32")))
    return pk.from_expr(e / relax.op.sum(e, list(axes), keepdims=True))


UNSHIFTED_CASE = RuleCase(
    SoftmaxCollapse(shifted=False), Unshifted, UnshiftedCollapsed,
    negatives=[Negative("sum_over_two_axes", _unshifted_over((-2, -1)),
                        "the sum reduces the axes [-2, -1]")],
    # The fused op subtracts the max first: exp of other arguments, a few float32 ulp.
    tolerance=Tolerance(1e-6, 1e-6, "the fused op exponentiates x - max(x) instead of x: "
                                    "a few float32 ulp on inputs in [-1, 1)"))


def test_unshifted_softmax_collapse_meets_the_rule_contract():
    check_rule(UNSHIFTED_CASE)


def test_the_unshifted_collapse_is_opt_in_because_it_changes_overflowing_results():
    assert "softmax.collapse_unshifted" not in LIBRARY.names
    before = SoftmaxCollapse(shifted=False).example(rank=2)
    after = pk.rewrite(SoftmaxCollapse(shifted=False), before)
    logits = np.linspace(80.0, 100.0, 64, dtype="float32").reshape(4, 16)  # exp overflows
    (written,), (fused,) = run(before, [logits]), run(after, [logits])
    assert np.isnan(written).any()  # inf / inf
    assert np.isfinite(fused).all() and np.allclose(fused.sum(-1), 1.0, atol=1e-6)
    assert pk.rewrite(LIBRARY, before).script() == before.script()  # the library leaves it
