"""The numeric oracle refuses weak evidence: tiny, zero, constant and non-finite outputs."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.verification.numeric import compare_outputs, norm_bound, random_inputs

JOB_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


def _module(body, shape=(4, 8), dtype="float32", params=("x",)) -> tvm.IRModule:
    """``main`` over float inputs named ``params``, returning ``body(*inputs)``."""
    args = [relax.Var(name, relax.TensorType(shape, dtype)) for name in params]
    bb = relax.BlockBuilder()
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(body(*args))
        bb.emit_func_output(out)
    return bb.get()


def _scaled_softmax(scale: float, wrong: float = 1.0) -> tvm.IRModule:
    """A softmax whose outputs are ``scale`` small; ``wrong`` multiplies it, as a rule
    turning ``softmax(x)`` into ``softmax(x) * 1.5`` would."""
    def body(x):
        out = relax.op.multiply(relax.op.nn.softmax(x), relax.const(scale, "float32"))
        return relax.op.multiply(out, relax.const(wrong, "float32")) if wrong != 1 else out
    return _module(body)


@pytest.mark.parametrize("scale", [2e-4, 1e-3, 3e-3])
def test_a_wrong_softmax_on_tiny_outputs_is_never_a_pass(scale):
    # every element within atol = 1e-4 of the reference, yet 50 % off as a whole
    result = pk.compare(_scaled_softmax(scale), _scaled_softmax(scale, wrong=1.5),
                        **JOB_TOLERANCE)
    assert result.max_abs_error < 1e-4 or scale > 2e-4
    assert not result.ok and result.status in ("fail", "inconclusive")
    assert result.norm_error == pytest.approx(0.5, rel=1e-3)


def test_outputs_within_atol_are_inconclusive_with_their_magnitude():
    result = pk.compare(_scaled_softmax(1e-5), _scaled_softmax(1e-5, wrong=1.5),
                        **JOB_TOLERANCE)
    assert result.status == "inconclusive" and not result.ok
    assert result.magnitude < 1e-4 and "too small" in result.reason
    assert str(result).startswith("INCONCLUSIVE: not evidence: the output is too small")


def test_a_wrong_softmax_on_outputs_of_order_one_fails():
    result = pk.compare(_scaled_softmax(1.0), _scaled_softmax(1.0, wrong=1.5), **JOB_TOLERANCE)
    assert result.status == "fail" and "element(s) outside" in result.reason


def test_a_model_whose_outputs_are_all_zero_is_inconclusive_not_a_pass():
    # relu(-x*x - 1) is 0 everywhere; so is the wrong rewrite relu(-x*x - 2)
    def zeros(offset):
        return _module(lambda x: relax.op.nn.relu(relax.op.subtract(
            relax.op.negative(relax.op.multiply(x, x)), relax.const(offset, "float32"))))
    result = pk.compare(zeros(1.0), zeros(2.0), **JOB_TOLERANCE)
    assert result.status == "inconclusive" and not result.ok
    assert result.max_abs_error == 0.0 and "all zero" in result.reason
    with pytest.raises(AssertionError, match="INCONCLUSIVE"):
        pk.assert_same_numerics(zeros(1.0), zeros(2.0), **JOB_TOLERANCE)


def test_constant_outputs_are_inconclusive():
    # a softmax over an axis of one element is 1 everywhere, whatever feeds it
    def ones(scale):
        return _module(lambda x: relax.op.nn.softmax(
            relax.op.multiply(x, relax.const(scale, "float32"))), shape=(4, 1))
    result = pk.compare(ones(1.0), ones(3.0), rtol=0, atol=0)
    assert result.status == "inconclusive" and "constant" in result.reason


def test_a_weak_output_that_differs_beside_evidence_is_inconclusive():
    ref = [np.linspace(-1, 1, 16), np.zeros(16)]
    got = [ref[0].copy(), np.full(16, 1e-5)]  # within atol, and unjudgeable
    result = compare_outputs(ref, got, **JOB_TOLERANCE)
    assert result.status == "inconclusive" and "output 1 is all zero" in result.reason


def test_a_weak_output_reproduced_bit_for_bit_beside_evidence_does_not_stop_a_pass():
    # a gradient module: the bias gradient of a summed loss is the batch size, constant
    ref = [np.linspace(-1, 1, 16), np.full(4, 10.0)]
    assert compare_outputs(ref, [r.copy() for r in ref], **JOB_TOLERANCE).ok
    alone = compare_outputs(ref[1:], [ref[1].copy()], **JOB_TOLERANCE)
    assert alone.status == "inconclusive" and "constant" in alone.reason


def test_a_nan_on_one_side_fails_and_nan_everywhere_is_inconclusive():
    ref = np.linspace(-1, 1, 16)
    got = ref.copy()
    got[3] = np.nan
    assert compare_outputs([ref], [got], **JOB_TOLERANCE).status == "fail"
    assert compare_outputs([got], [ref], **JOB_TOLERANCE).status == "fail"
    nans = np.full(16, np.nan)
    result = compare_outputs([nans], [nans.copy()], **JOB_TOLERANCE)
    assert result.status == "inconclusive" and "NaN or infinite" in result.reason


def test_a_few_equal_infinities_leave_the_finite_elements_as_evidence():
    ref = np.linspace(-1, 1, 16)
    ref[0] = -np.inf  # a masked score
    assert compare_outputs([ref], [ref.copy()], **JOB_TOLERANCE).status == "pass"


def test_the_norm_bound_is_the_rtol_but_never_below_eight_roundings_of_the_dtype():
    assert norm_bound("float32", 1e-4) == 1e-4
    assert norm_bound("float16", 1e-4) == pytest.approx(8 * 2.0 ** -10)
    assert norm_bound("int64", 0.0) == 0.0


def test_a_scalar_output_is_evidence_and_a_wrong_one_fails():
    assert compare_outputs([np.array(2.0)], [np.array(2.0)], **JOB_TOLERANCE).ok
    assert compare_outputs([np.array(2.0)], [np.array(3.0)], **JOB_TOLERANCE).status == "fail"


def test_integer_and_boolean_inputs_are_never_drawn_constant():
    ids = relax.Var("ids", relax.TensorType((2,), "int64"))
    mask = relax.Var("mask", relax.TensorType((2,), "bool"))
    func = relax.Function([ids, mask], relax.SeqExpr([], ids), ret_ty=ids.ty)
    for seed in range(40):
        drawn_ids, drawn_mask = random_inputs(func, seed=seed)
        assert len(set(drawn_ids.tolist())) == 2 and len(set(drawn_mask.tolist())) == 2
    again = random_inputs(func, seed=7)
    np.testing.assert_array_equal(again[0], random_inputs(func, seed=7)[0])
