"""batchnorm.collapse: every accepted spelling collapses, the numbers stay, others are refused."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings, strategies as st
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit.patterns.batchnorm import (
    SPELLINGS,
    BatchnormCallback,
    BatchnormCollapse,
    BatchnormExpand,
    batch_norm_call,
    written_out,
)
from patternkit.testing import Negative, RuleCase, Tolerance, check_rule

RULE = "batchnorm.collapse"
#: How the parameters are shaped and where the channels are: the builder's knobs, and
#: the axis the collapsed batch norm takes.
PARAM_LAYOUTS = {
    "C": (dict(param_shape="C", layout="NHWC"), 3),
    "C11": (dict(param_shape="C11", layout="NCHW"), 1),
    "1C11": (dict(param_shape="1C11", layout="NCHW"), 1),
}


def build(spelling: str, layout: str) -> tvm.IRModule:
    """A written-out batch norm on ``x: (2, 3, 4, 4)`` (``(2, 4, 4, 3)`` for ``"C"``)."""
    return written_out(spelling=spelling, **PARAM_LAYOUTS[layout][0])


def batch_norm_calls(mod: tvm.IRModule) -> list:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.batch_norm"]


def collapse(mod, **kwargs):
    log = pk.RewriteLog()
    return pk.rewrite(BatchnormCollapse(), mod, log=log, **kwargs), log


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((2, 3, 4, 4), "float32"), gamma: R.Tensor((3, 1, 1), "float32"),
             beta: R.Tensor((3, 1, 1), "float32"), mean: R.Tensor((3, 1, 1), "float32"),
             var: R.Tensor((3, 1, 1), "float32")) -> R.Tensor((2, 3, 4, 4), "float32"):
        with R.dataflow():
            a = R.subtract(x, mean)
            b = R.multiply(gamma, a)
            c = R.add(var, R.const(1e-5, "float32"))
            d = R.sqrt(c)
            e = R.divide(b, d)
            out = R.add(e, beta)
            R.output(out)
        return out


@I.ir_module
class Expected:
    @R.function
    def main(x: R.Tensor((2, 3, 4, 4), "float32"), gamma: R.Tensor((3, 1, 1), "float32"),
             beta: R.Tensor((3, 1, 1), "float32"), mean: R.Tensor((3, 1, 1), "float32"),
             var: R.Tensor((3, 1, 1), "float32")) -> R.Tensor((2, 3, 4, 4), "float32"):
        with R.dataflow():
            g = R.reshape(gamma, R.shape([3]))
            b = R.reshape(beta, R.shape([3]))
            m = R.reshape(mean, R.shape([3]))
            v = R.reshape(var, R.shape([3]))
            bn = R.nn.batch_norm(x, g, b, m, v, axis=1, epsilon=float(np.float32(1e-5)),
                                 training=False)
            out = bn[0]
            R.output(out)
        return out


def elementwise(x_shape=(2, 3, 4, 4), shapes=None, eps=None, x_dtype="float32",
                param_dtypes=None, minus_beta=False) -> tvm.IRModule:
    """``gamma * (x - mean) / sqrt(var + eps) + beta`` with (3, 1, 1) parameters by default.

    ``x_shape=None`` gives ``x`` a rank but no shape; a parameter dtype of ``""`` is unknown.
    """
    ty = (relax.TensorType(ndim=4, dtype=x_dtype) if x_shape is None
          else relax.TensorType(x_shape, x_dtype))
    x = relax.Var("x", ty)
    shapes = {"gamma": (3, 1, 1), "beta": (3, 1, 1), "mean": (3, 1, 1), "var": (3, 1, 1),
              **(shapes or {})}
    dtypes = param_dtypes or {}
    g, b, m, v = (relax.Var(n, relax.TensorType(s, dtypes.get(n, "float32")))
                  for n, s in shapes.items())
    eps = relax.const(1e-5, "float32") if eps is None else eps
    normalised = g * (x - m) / relax.op.sqrt(v + eps)
    return pk.from_expr(normalised - b if minus_beta else normalised + b)


N = tvm.tirx.Var("n", "int64")

#: Modules that are not per-channel batch norms, and the reason the rule gives for each.
REFUSED = {
    "full_gamma": (lambda: elementwise(shapes={"gamma": (2, 3, 4, 4)}),
                   "gamma has shape (2, 3, 4, 4): a per-channel parameter varies along "
                   "exactly one axis"),
    "vector_eps": (lambda: elementwise(eps=relax.const(np.full((3, 1, 1), 1e-5, "float32"))),
                   "epsilon must be a scalar constant"),
    "axes_disagree": (lambda: elementwise((2, 3, 4, 3), shapes={"beta": (3,)}),
                      "parameters broadcast along different axes"),
    "scalar_gamma": (lambda: elementwise(shapes={"gamma": (1, 1, 1)}),
                     "gamma has shape (1, 1, 1): a per-channel parameter varies along exactly"),
    "x_without_shape": (lambda: elementwise(None), "x has no known shape"),
    "gamma_of_unknown_dtype": (lambda: elementwise(param_dtypes={"gamma": ""}),
                               "gamma has dtype None, x has float32"),
    "gamma_with_more_dims": (lambda: elementwise(shapes={"gamma": (1, 1, 3, 1, 1)}),
                             "gamma has more dimensions (5) than x (4)"),
    "x_with_one_channel": (lambda: elementwise((2, 1, 4, 4)),
                           "gamma has 3 channels on axis 1, x has 1"),
    "symbolic_channels": (lambda: elementwise((2, N, 4, 4)),
                          "gamma varies along axis 1, where x has the symbolic size n"),
}

#: Modules the pattern does not match at all, and what ``explain`` says about them.
NOT_MATCHED = {
    "minus_beta": (lambda: elementwise(minus_beta=True), "(depth 1) vs R.subtract(lv4, beta)"),
    "variable_eps": (lambda: elementwise(eps=relax.Var("eps", relax.TensorType((), "float32"))),
                     "no match: const (depth 5) vs eps"),
}

CASE = RuleCase(
    BatchnormCollapse(), Before, Expected,
    negatives=[Negative(name, make(), reason)
               for name, (make, reason) in {**REFUSED, **NOT_MATCHED}.items()],
    # The legalised batch_norm computes (x - mean) * (gamma / sqrt(var + eps)) + beta:
    # the same float32 operations in another order, a few ulp apart.
    tolerance=Tolerance(1e-5, 1e-5, "batch_norm legalises to a reordering of the same "
                                    "float32 arithmetic"),
    positive=("var",))


def test_batchnorm_collapse_meets_the_rule_contract():
    proof = check_rule(CASE)
    assert {r.negative.name for r in proof.negatives} == set(REFUSED) | set(NOT_MATCHED)


def test_batchnorm_callback_is_the_former_name_of_batchnorm_collapse():
    assert BatchnormCallback is BatchnormCollapse
    assert BatchnormCollapse.name == RULE


def test_batchnorm_collapse_gives_the_expected_module():
    after, log = collapse(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert log.count(RULE) == 1
    pk.assert_same_numerics(Before, after, positive=("var",), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", sorted(PARAM_LAYOUTS))
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_batchnorm_collapse_handles_every_spelling_and_layout(spelling, layout):
    before = build(spelling, layout)
    after, log = collapse(before)
    (bn,) = batch_norm_calls(after)
    assert int(bn.attrs.axis) == PARAM_LAYOUTS[layout][1]
    assert not bool(bn.attrs.training)
    assert abs(float(bn.attrs.epsilon) - 1e-5) < 1e-10
    assert log.count(RULE) == 1
    assert relax.analysis.check_well_formed(after)
    pk.assert_same_numerics(before, after, positive=("var",), rtol=1e-5, atol=1e-5)


def test_batchnorm_collapse_undoes_decompose_ops_for_inference():
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((2, 3, 4, 4), "float32"))
    params = [relax.const(rng.uniform(0.5, 1.5, 3).astype("float32")) for _ in range(4)]
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            bn = bb.emit(relax.op.nn.batch_norm(x, *params, axis=1, training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    original = bb.get()
    decomposed = relax.transform.DecomposeOpsForInference()(original)
    assert not batch_norm_calls(decomposed)
    after, _ = collapse(decomposed)
    (bn,) = batch_norm_calls(after)
    # expand_dims of the (C,) parameters is looked through: the constants are used as is.
    assert all(arg.same_as(p) for arg, p in zip(bn.args[1:], params))
    ops = {b.value.op.name for b in after["main"].body.blocks[0].bindings
           if isinstance(b.value, relax.Call)}
    assert ops == {"relax.nn.batch_norm"}
    pk.assert_same_numerics(original, after, rtol=1e-5, atol=1e-5)


def test_seed_single_and_double_batchnorm(bn_vars, make_bn):
    x, gamma, beta, mean, var = bn_vars
    single = make_bn(x, gamma, beta, mean, var)
    double = make_bn(single, gamma, beta, mean, var)
    for expr, count in ((single, 1), (double, 2)):
        mod = pk.from_expr(expr)
        after, log = collapse(mod)
        assert len(batch_norm_calls(after)) == count and log.count(RULE) == count
        pk.assert_same_numerics(mod, after, positive=("var",), rtol=1e-5, atol=1e-5)
    # The Relay way: a bare expression in, a bare expression out.
    out = pk.rewrite(BatchnormCallback(), single)
    assert isinstance(out, relax.TupleGetItem) and out.tuple_value.op.name == "relax.nn.batch_norm"


def test_constant_parameters_are_folded_to_per_channel_constants():
    rng = np.random.default_rng(1)
    x = relax.Var("x", relax.TensorType((2, 3, 4, 4), "float32"))
    g, b, m = (relax.const(rng.standard_normal((3, 1, 1)).astype("float32")) for _ in range(3))
    v = relax.const(rng.uniform(0.5, 1.5, (3, 1, 1)).astype("float32"))
    mod = pk.from_expr(g * (x - m) / relax.op.sqrt(v + relax.const(1e-3, "float32")) + b)
    after, _ = collapse(mod)
    (bn,) = batch_norm_calls(after)
    assert all(isinstance(a, tvm.ir.GenericConst) and a.value.shape == (3,) for a in bn.args[1:])
    pk.assert_same_numerics(mod, after, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_batchnorm_collapse_refuses_non_batchnorms_and_says_why(case):
    make, reason = REFUSED[case]
    mod = make()
    after, log = collapse(mod)
    assert not batch_norm_calls(after)
    tvm.ir.assert_structural_equal(after, mod)
    assert any(reason in r for r in log.reasons(RULE)), log.reasons(RULE)


@pytest.mark.parametrize("case", sorted(NOT_MATCHED))
def test_batchnorm_collapse_does_not_match_minus_beta_or_variable_epsilon(case):
    make, reason = NOT_MATCHED[case]
    mod = make()
    after, log = collapse(mod)
    tvm.ir.assert_structural_equal(after, mod)
    assert log.count() == 0 and log.reasons() == []  # not even a match to refuse
    root = mod["main"].body.blocks[0].bindings[-1]
    assert reason in pk.explain(BatchnormCollapse().pattern, root.value, mod["main"])


def test_collapsed_module_prints_and_reparses():
    after, _ = collapse(build("relay", "C11"))
    reparsed = tvm.script.from_source(after.script())
    tvm.ir.assert_structural_equal(reparsed, after)


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(channels=st.integers(2, 6), spelling=st.sampled_from(sorted(SPELLINGS)),
       layout=st.sampled_from(["C11", "1C11"]), eps=st.sampled_from([1e-5, 1e-3, 0.1]),
       batch=st.integers(1, 3))
def test_every_generated_batchnorm_collapses_with_the_same_numbers(channels, spelling, layout,
                                                                   eps, batch):
    shape = (channels, 1, 1) if layout == "C11" else (1, channels, 1, 1)
    x = relax.Var("x", relax.TensorType((batch, channels, 3, 2), "float32"))
    g, b, m, v = (relax.Var(n, relax.TensorType(shape, "float32"))
                  for n in ("gamma", "beta", "mean", "var"))
    sqrt = relax.op.sqrt(v + relax.const(eps, "float32"))
    mod = pk.from_expr(SPELLINGS[spelling](x, g, b, m, sqrt))
    after, log = collapse(mod)
    assert log.count(RULE) == 1 and len(batch_norm_calls(after)) == 1
    pk.assert_same_numerics(mod, after, positive=("var",), rtol=1e-5, atol=1e-5)


def test_batchnorm_collapse_with_a_symbolic_batch_dimension():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 3, 4, 4), "float32"))
    g, b, m, v = (relax.Var(k, relax.TensorType((3, 1, 1), "float32"))
                  for k in ("gamma", "beta", "mean", "var"))
    mod = pk.from_expr(g * (x - m) / relax.op.sqrt(v + relax.const(1e-5, "float32")) + b)
    after, log = collapse(mod)
    (bn,) = batch_norm_calls(after)
    assert int(bn.attrs.axis) == 1 and log.count(RULE) == 1
    assert relax.analysis.check_well_formed(after)
    pk.assert_same_numerics(mod, after, positive=("var",), shape_vars={"n": 2},
                            rtol=1e-5, atol=1e-5)


# -- batchnorm.expand ---------------------------------------------------------------------
@I.ir_module
class ExpandBefore:
    @R.function
    def main(x: R.Tensor((2, 3, 4, 4), "float32"), gamma: R.Tensor((3,), "float32"),
             beta: R.Tensor((3,), "float32"), mean: R.Tensor((3,), "float32"),
             var: R.Tensor((3,), "float32")) -> R.Tensor((2, 3, 4, 4), "float32"):
        with R.dataflow():
            bn = R.nn.batch_norm(x, gamma, beta, mean, var, axis=1, epsilon=1e-5, training=False)
            out = bn[0]
            R.output(out)
        return out


@I.ir_module
class ExpandExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 4, 4), "float32"), gamma: R.Tensor((3,), "float32"),
             beta: R.Tensor((3,), "float32"), mean: R.Tensor((3,), "float32"),
             var: R.Tensor((3,), "float32")) -> R.Tensor((2, 3, 4, 4), "float32"):
        with R.dataflow():
            m = R.reshape(mean, R.shape([1, 3, 1, 1]))
            centred = R.subtract(x, m)
            v = R.reshape(var, R.shape([1, 3, 1, 1]))
            shifted = R.add(v, R.const(1e-5, "float32"))
            std = R.sqrt(shifted)
            normalised = R.divide(centred, std)
            g = R.reshape(gamma, R.shape([1, 3, 1, 1]))
            scaled = R.multiply(normalised, g)
            b = R.reshape(beta, R.shape([1, 3, 1, 1]))
            shifted_out = R.add(scaled, b)
            bn = (shifted_out, mean, var)
            out = bn[0]
            R.output(out)
        return out


@I.ir_module
class ExpandNoShape:
    @R.function
    def main(x: R.Tensor(ndim=4, dtype="float32"), gamma: R.Tensor((3,), "float32"),
             beta: R.Tensor((3,), "float32"), mean: R.Tensor((3,), "float32"),
             var: R.Tensor((3,), "float32")):
        with R.dataflow():
            bn = R.nn.batch_norm(x, gamma, beta, mean, var, axis=1, epsilon=1e-5, training=False)
            out = bn[0]
            R.output(out)
        return out


EXPAND_CASE = RuleCase(
    BatchnormExpand(), ExpandBefore, ExpandExpected,
    negatives=[Negative("x_without_shape", ExpandNoShape, "x has no known shape")],
    # The legalised op computes (x - mean) / sqrt(var + eps) * gamma + beta, the same
    # operations in the same order; LLVM may still contract a multiply-add differently.
    tolerance=Tolerance(1e-6, 1e-6, "the same float32 operations in the same order as the "
                                    "legalised batch_norm"),
    positive=("var",))


def test_batchnorm_expand_meets_the_rule_contract():
    proof = check_rule(EXPAND_CASE)
    assert {r.negative.name for r in proof.negatives} == {"x_without_shape"}


@pytest.mark.parametrize("knobs", [dict(training=t, axis=a) for t in (False, True) for a in (1, 3)])
def test_batchnorm_expand_keeps_every_output_of_each_training_flag(knobs):
    """All three outputs (normalised, new moving mean, new moving variance) are kept."""
    mod = batch_norm_call(**knobs)
    expanded = pk.rewrite(BatchnormExpand(), mod)
    assert relax.analysis.check_well_formed(expanded)
    assert not batch_norm_calls(expanded)
    assert pk.compare(mod, expanded, rtol=1e-5, atol=1e-5, positive=("var",)).ok


def test_batchnorm_expand_handles_a_symbolic_batch():
    x = relax.Var("x", relax.TensorType((N, 3, 4, 4), "float32"))
    params = [relax.Var(n, relax.TensorType((3,), "float32")) for n in ("g", "b", "m", "var")]
    mod = pk.from_expr(relax.TupleGetItem(relax.op.nn.batch_norm(x, *params, axis=1), 0))
    expanded = pk.rewrite(BatchnormExpand(), mod)
    assert relax.analysis.check_well_formed(expanded)
    assert not batch_norm_calls(expanded)
    assert pk.compare(mod, expanded, rtol=1e-5, atol=1e-5, positive=("var",),
                      shape_vars={"n": 3}).ok


def test_batchnorm_expand_in_float16_stays_within_half_precision():
    mod = batch_norm_call(dtype="float16")
    expanded = pk.rewrite(BatchnormExpand(), mod)
    assert pk.compare(mod, expanded, rtol=1e-2, atol=1e-2, positive=("var",)).ok
