"""One oracle everywhere: the differential checks and bisect refuse weak evidence too."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

from patternkit.testing.bisection import bisect
from patternkit.verification.differential import apply_transform, judge_result


def _times(scale: float, relu_first: bool = False) -> tvm.IRModule:
    """``x * scale`` (after ``relu(-x*x - 1)``, which is zero everywhere, if asked)."""
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            value = x
            if relu_first:
                value = bb.emit(relax.op.nn.relu(relax.op.subtract(
                    relax.op.negative(relax.op.multiply(x, x)), relax.const(1.0, "float32"))))
            out = bb.emit_output(relax.op.multiply(value, relax.const(scale, "float32")))
        bb.emit_func_output(out)
    return bb.get()


def test_a_result_judged_on_all_zero_outputs_is_inconclusive_not_a_pass():
    before, wrong = _times(1.0, relu_first=True), _times(1.5, relu_first=True)
    judged = judge_result(before, apply_transform(lambda mod: wrong, before),
                          rtol=1e-5, atol=1e-5)
    assert judged.kind == "inconclusive" and not judged.ok and "all zero" in judged.error


def test_a_wrong_result_on_tiny_outputs_is_a_mismatch():
    before, wrong = _times(2e-5), _times(3e-5)  # every element within atol = 1e-4
    judged = judge_result(before, apply_transform(lambda mod: wrong, before),
                          rtol=1e-4, atol=1e-5)
    assert judged.kind == "mismatch" and "relative error as a whole" in judged.error


def test_bisect_refuses_a_pipeline_whose_input_gives_no_evidence():
    before, wrong = _times(1.0, relu_first=True), _times(1.5, relu_first=True)
    with pytest.raises(ValueError, match="cannot bisect.*all zero"):
        bisect(before, [lambda mod: wrong])
