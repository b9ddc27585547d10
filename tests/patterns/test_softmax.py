"""softmax: the written-out stable softmax (torch's ``max(dim)`` too) collapses into softmax,
the written-out log-softmax into log_softmax; the unshifted softmax and the log of a softmax
only on request."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit.models.importing import from_torch
from patternkit.patterns import EXPANSIONS, LIBRARY
from patternkit.patterns.softmax import (
    LogSoftmaxCollapse,
    SoftmaxCollapse,
    max_of,
    softmax_graph,
)
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


def topk_shifted(k: int, largest: bool) -> tvm.IRModule:
    """``exp(x - t) / sum(exp(x - t))`` with ``t`` a topk of ``x: (4, 2)`` that is not the
    max (``k=2`` keeps the shapes compatible)."""
    x = relax.Var("x", relax.TensorType((4, 2), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(bb.emit(x - max_of(bb, x, [-1], "topk", k, largest))))
            out = bb.emit_output(e / bb.emit(relax.op.sum(e, [-1], keepdims=True)))
        bb.emit_func_output(out)
    return bb.get()


def sum_in(dtype: str, wide: str) -> tvm.IRModule:
    """A ``dtype`` softmax whose max runs in ``dtype`` and whose sum runs in ``wide``."""
    x = relax.Var("x", relax.TensorType((2, 5, 16), dtype))
    e = relax.op.exp(x - relax.op.max(x, [-1], keepdims=True))
    total = relax.op.sum(relax.op.astype(e, wide), [-1], keepdims=True)
    return pk.from_expr(e / relax.op.astype(total, dtype))


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
                 "no match: subtract(*, (max_form=reduce: (max_width=narrowed: astype(…) | "
                 "max_width=plain: max(…)) | max_form=topk: "),
        Negative("topk_of_two", topk_shifted(2, True),
                 "the topk takes the 2 largest values: only the single largest one is the "
                 "max that a softmax subtracts"),
        Negative("topk_of_the_smallest", topk_shifted(1, False),
                 "the topk takes the 1 smallest values"),
        Negative("float32_max_and_sum_cast_to_float32", SoftmaxCollapse().example(wide="float32"),
                 "the max runs in float32 on float32 values: only float16 and bfloat16 "
                 "widened to float32 are taken"),
        Negative("float16_sum_in_float64", sum_in("float16", "float64"),
                 "the sum runs in float64 on float16 values"),
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
    {"rank": 2}, {"rank": 4, "axis": 2, "symbolic": True}, {"max_form": "topk"},
    {"max_form": "topk", "axis": 1, "symbolic": True},
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


# -- large logits: the shift by the max is what makes the collapse exact ------------------------
@pytest.mark.parametrize("max_form", ["reduce", "topk"])
def test_the_shifted_collapse_is_exact_on_logits_where_exp_alone_overflows(max_form):
    before = SoftmaxCollapse().example(rank=2, max_form=max_form)
    after = pk.rewrite(SoftmaxCollapse(), before)
    logits = np.random.default_rng(0).uniform(1e3, 1e4, (4, 16)).astype("float32")
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(logits)).all()  # the unshifted form would give inf / inf
    (written,), (fused,) = run(before, [logits]), run(after, [logits])
    shifted = np.exp(logits.astype("float64") - logits.max(-1, keepdims=True))
    reference = shifted / shifted.sum(-1, keepdims=True)
    np.testing.assert_array_equal(fused, written)  # the very same operations
    np.testing.assert_allclose(fused, reference, rtol=1e-5, atol=1e-7)


# -- log_softmax.collapse -----------------------------------------------------------------------
@I.ir_module
class LogSoftmaxWrittenOut:
    """torch's ``x - m - log(sum(exp(x - m)))`` as both ONNX exporters write it."""

    @R.function
    def main(x: R.Tensor(("n", 16), "float32")) -> R.Tensor(("n", 16), "float32"):
        with R.dataflow():
            m = R.max(x, axis=[-1], keepdims=True)
            shifted = R.subtract(x, m)
            e = R.exp(shifted)
            total = R.sum(e, axis=[-1], keepdims=True)
            log_total = R.log(total)
            out = R.subtract(shifted, log_total)
            R.output(out)
        return out


@I.ir_module
class LogSoftmaxCollapsed:
    @R.function
    def main(x: R.Tensor(("n", 16), "float32")) -> R.Tensor(("n", 16), "float32"):
        with R.dataflow():
            out = R.nn.log_softmax(x, axis=-1)
            R.output(out)
        return out


def _log_softmax_of(x_ty=None, shifted=True) -> tvm.IRModule:
    """``(x - m) - log(sum(exp(x - m)))`` along the last axis (without ``m`` if not
    ``shifted``), ``x`` of the given type (default ``(4, 16)``)."""
    x = relax.Var("x", x_ty or relax.TensorType((4, 16), "float32"))
    shifted_x = x - relax.op.max(x, [-1], keepdims=True) if shifted else x
    return pk.from_expr(shifted_x - relax.op.log(relax.op.sum(
        relax.op.exp(shifted_x), [-1], keepdims=True)))


LOG_SOFTMAX_CASE = RuleCase(
    LogSoftmaxCollapse(), LogSoftmaxWrittenOut, LogSoftmaxCollapsed,
    negatives=[
        Negative("x_of_unknown_rank", _log_softmax_of(relax.TensorType(ndim=-1, dtype="float32")),
                 "x has an unknown rank"),
        Negative("max_over_another_axis", LogSoftmaxCollapse().example(max_axis=0),
                 "the max reduces axis 0 but the sum axis 2: the shift does not cancel, so "
                 "this is not a log-softmax"),
        Negative("without_the_max", _log_softmax_of(shifted=False),
                 "no match: add(log((sum_width=narrowed: astype(…) | sum_width=plain: "
                 "sum(…))), (max_form=reduce: (max_width=narrowed: astype(…) | "
                 "max_width=plain: max(…))"),
    ],
    tolerance=Tolerance(0.0, 0.0, "log_softmax legalises to the very max / subtract / exp / "
                                  "sum / log / subtract the model writes out: bit-identical"))


def test_log_softmax_collapse_meets_the_rule_contract():
    check_rule(LOG_SOFTMAX_CASE)


#: ``x - (lse + m)`` rounds the sum ``lse + m`` before subtracting, where the op computes
#: ``(x - m) - lse``: an ulp or two of ``|x| + lse`` (inputs in [-1, 1), lse < 4): 1e-6 in
#: float32, 4e-3 in float16 (eps 9.8e-4); measured 2.4e-7 and 2e-3.
REASSOCIATED = {"float32": (1e-6, 1e-6), "float16": (4e-3, 4e-3)}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("knobs", [
    {}, {"symbolic": True}, {"axis": 0}, {"spelling": "logsumexp"}, {"spelling": "max_first"},
    {"max_form": "topk"}, {"spelling": "logsumexp", "max_form": "topk", "axis": 1},
    {"rank": 4, "axis": 2, "symbolic": True, "spelling": "logsumexp"},
], ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "shifted")
def test_every_log_softmax_spelling_collapses(knobs, dtype):
    rule = LogSoftmaxCollapse()
    before = rule.example(dtype=dtype, **knobs)
    applied = apply_rule(rule, before)
    assert applied.fired == 1
    ops = [pk.ir.op_name(b.value) for block in applied.module["main"].body.blocks
           for b in block.bindings if pk.ir.op_name(b.value)]
    assert ops == ["relax.nn.log_softmax"]
    exact = knobs.get("spelling", "shifted") == "shifted"
    rtol, atol = (0.0, 0.0) if exact else REASSOCIATED[dtype]
    pk.assert_same_numerics(before, applied.module, rtol=rtol, atol=atol, shape_vars=SHAPE_VARS)


def test_the_log_of_a_softmax_collapses_only_on_request_because_the_op_does_not_underflow():
    rule = LogSoftmaxCollapse(form="log_of_softmax")
    assert "log_softmax.collapse_log_of_softmax" not in LIBRARY.names
    before = rule.example(rank=2)
    after = pk.rewrite(rule, before)
    assert "R.nn.log_softmax(x, axis=-1)" in after.script()
    pk.assert_same_numerics(before, after, rtol=1e-6, atol=1e-6)  # inputs in [-1, 1)
    logits = np.zeros((4, 16), "float32")
    logits[:, 0] = 200.0  # every other entry's softmax underflows to 0
    (written,), (fused,) = run(before, [logits]), run(after, [logits])
    assert np.isneginf(written[:, 1:]).all()
    np.testing.assert_allclose(fused[:, 1:], -200.0, rtol=1e-6)
    assert pk.rewrite(LIBRARY, before).script() == before.script()  # the library leaves it


def test_log_softmax_collapse_has_no_expand_rule_since_gradient_differentiates_it():
    x = relax.Var("x", relax.TensorType((2, 16), "float32"))
    relax.transform.Gradient("main")(pk.from_expr(relax.op.sum(relax.op.nn.log_softmax(x))))
    assert not EXPANSIONS.by_prefix("log_softmax.").names


# -- what the torch importer and the ONNX exporters write ---------------------------------------
class MaxShiftedSoftmax(torch.nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.max(-1, keepdim=True).values)
        return e / e.sum(-1, keepdim=True)


class AmaxShiftedSoftmax(torch.nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)


class MaxShiftedLogSoftmax(torch.nn.Module):
    def forward(self, x):
        m = x.max(-1, keepdim=True).values
        return x - m - torch.log(torch.exp(x - m).sum(-1, keepdim=True))


class AmaxShiftedLogSoftmax(torch.nn.Module):
    def forward(self, x):
        m = x.amax(-1, keepdim=True)
        return x - m - torch.log(torch.exp(x - m).sum(-1, keepdim=True))


class MinusLogsumexp(torch.nn.Module):
    def forward(self, x):
        return x - torch.logsumexp(x, -1, keepdim=True)


FUSED = {MaxShiftedSoftmax: "relax.nn.softmax", AmaxShiftedSoftmax: "relax.nn.softmax",
         MaxShiftedLogSoftmax: "relax.nn.log_softmax",
         AmaxShiftedLogSoftmax: "relax.nn.log_softmax", MinusLogsumexp: "relax.nn.log_softmax"}


def _only_op_after_the_library(mod: tvm.IRModule, module_cls) -> None:
    after = pk.rewrite(LIBRARY, mod)
    ops = [pk.ir.op_name(b.value) for block in after["main"].body.blocks
           for b in block.bindings if pk.ir.op_name(b.value)]
    assert ops == [FUSED[module_cls]]
    x = np.random.default_rng(1).uniform(-50, 50, (3, 16)).astype("float32")
    (got,) = run(after, [x])
    expected = module_cls()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("module_cls", [MaxShiftedSoftmax, MaxShiftedLogSoftmax])
def test_torch_max_dim_spellings_collapse_through_the_torch_importer(module_cls):
    program = torch.export.export(module_cls().eval(), (torch.randn(3, 16),))
    mod = from_torch(program, False, "main", module_cls.__name__, {})[0]
    assert "R.topk(x, k=1" in mod.script()  # x.max(dim) as the importer writes it
    _only_op_after_the_library(mod, module_cls)


@pytest.mark.parametrize("exporter", ["torchscript-14", "torchscript-17", "dynamo-18"])
@pytest.mark.parametrize("module_cls", [AmaxShiftedSoftmax, AmaxShiftedLogSoftmax,
                                        MinusLogsumexp])
def test_onnx_exports_of_the_written_out_forms_collapse(module_cls, exporter):
    onnx = pytest.importorskip("onnx")
    from tvm.relax.frontend.onnx import from_onnx

    kind, opset = exporter.split("-")
    x = torch.randn(3, 16)
    if kind == "dynamo":
        pytest.importorskip("onnxscript")
        model = torch.onnx.export(module_cls().eval(), (x,), dynamo=True, verbose=False,
                                  opset_version=int(opset)).model_proto
    else:
        buffer = io.BytesIO()
        torch.onnx.export(module_cls().eval(), (x,), buffer, dynamo=False,
                          opset_version=int(opset))
        model = onnx.load_from_string(buffer.getvalue())
    _only_op_after_the_library(from_onnx(model), module_cls)


# -- the dynamo exporter's float16 / bfloat16 form: max and sum in float32 between casts ---------
#: The written-out form rounds exp, the sum and the quotient to the narrow dtype, the collapse
#: rounds once from float32: a few ulp apart, within 8 eps (the rules' default tolerance).
NARROW_TOLERANCE = {"float16": 8 * 2.0**-10, "bfloat16": 8 * 2.0**-7}


def _ops(mod: tvm.IRModule) -> list[str]:
    return [str(pk.ir.op_name(b.value)) for block in mod["main"].body.blocks
            for b in block.bindings if pk.ir.op_name(b.value)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rule,op", [(SoftmaxCollapse(), "relax.nn.softmax"),
                                     (LogSoftmaxCollapse(), "relax.nn.log_softmax")],
                         ids=["softmax", "log_softmax"])
def test_a_half_precision_softmax_widened_for_its_max_and_sum_collapses_in_float32(
        rule, op, dtype, caplog):
    before = rule.example(dtype=dtype, wide="float32", symbolic=True)
    with caplog.at_level("INFO", logger="patternkit.patterns.softmax"):
        applied = apply_rule(rule, before)
    assert applied.fired == 1
    assert _ops(applied.module) == ["relax.astype", op, "relax.astype"]
    (cast_back,) = [b.value for b in applied.module["main"].body.blocks[0].bindings[-1:]]
    assert str(cast_back.attrs.dtype) == dtype
    assert f"ran in float32 on {dtype} values" in caplog.text
    tol = NARROW_TOLERANCE[dtype]
    pk.assert_same_numerics(before, applied.module, rtol=tol, atol=tol, shape_vars=SHAPE_VARS)


def test_a_max_widened_alone_is_the_same_max_and_collapses_in_the_narrow_dtype():
    x = relax.Var("x", relax.TensorType((2, 5, 16), "float16"))
    wide_max = relax.op.astype(relax.op.max(relax.op.astype(x, "float32"), [-1], keepdims=True),
                               "float16")
    e = relax.op.exp(x - wide_max)
    before = pk.from_expr(e / relax.op.sum(e, [-1], keepdims=True))
    applied = apply_rule(SoftmaxCollapse(), before)
    assert applied.fired == 1 and _ops(applied.module) == ["relax.nn.softmax"]
    pk.assert_same_numerics(before, applied.module, rtol=0, atol=0)


def test_the_dynamo_export_of_a_float16_written_out_softmax_collapses():
    """The export the synthetic examples above copy (bfloat16 is written the same way)."""
    pytest.importorskip("onnxscript")
    from tvm.relax.frontend.onnx import from_onnx

    x = torch.randn(3, 16).to(torch.float16)
    model = torch.onnx.export(AmaxShiftedSoftmax().eval(), (x,), dynamo=True, verbose=False
                              ).model_proto
    mod = from_onnx(model)
    assert 'R.astype(x, dtype="float32")' in mod.script()  # its max and sum run in float32
    after = pk.rewrite(LIBRARY, mod)
    assert _ops(after) == ["relax.astype", "relax.nn.softmax", "relax.astype"]
    tol = NARROW_TOLERANCE["float16"]
    pk.assert_same_numerics(mod, after, rtol=tol, atol=tol)


def test_the_softmax_and_attention_rules_read_one_table_of_exact_half_widenings():
    from patternkit import ir
    from patternkit.patterns import softmax
    from patternkit.patterns.attention import guards

    # one home in the ir layer: the two rules cannot come to disagree on which widenings
    # of a half-precision softmax keep the precision R.nn.softmax / R.nn.attention compute
    assert dict(ir.HALF_WIDENINGS) == {"float16": "float32", "bfloat16": "float32"}
    assert softmax.HALF_WIDENINGS is guards.HALF_WIDENINGS is ir.HALF_WIDENINGS
    with pytest.raises(TypeError):
        ir.HALF_WIDENINGS["float32"] = "float64"  # type: ignore[index]
