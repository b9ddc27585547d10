"""A float16 model's job check: both runs against the model recomputed in float64."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from patternkit.app.job import run
from patternkit.app.precision import float64_check, low_precision_dtype
from patternkit.patterns import LIBRARY
from patternkit.verification.numeric import compare, random_inputs

_RNG = np.random.default_rng(0)
WEIGHT = _RNG.uniform(-1, 1, (64, 64)).astype("float16")


def _silu_model(dtype: str, factor: float = 1.0, written_out: bool = True) -> tvm.IRModule:
    """``x @ W`` then SiLU, written out as ``y * sigmoid(y)`` (or fused); ``factor``
    scales the weight, a wrong rewrite when it is not 1."""
    x = relax.Var("x", relax.TensorType((4, 64), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const((WEIGHT * factor).astype(dtype))))
            act = relax.op.multiply(y, relax.op.sigmoid(y)) if written_out else relax.op.nn.silu(y)
            out = bb.emit_output(act)
        bb.emit_func_output(out)
    return bb.get()


def test_the_low_precision_dtype_is_read_from_the_inputs_or_the_results():
    assert low_precision_dtype(_silu_model("float16")["main"]) == "float16"
    assert low_precision_dtype(_silu_model("float32")["main"]) is None
    ids = relax.Var("ids", relax.TensorType((4,), "int64"))  # weights kept as constants
    bb = relax.BlockBuilder()
    with bb.function("main", [ids]):
        table = relax.const(WEIGHT)
        out = bb.emit(relax.Tuple([relax.op.take(table, ids, axis=0), ids]))
        bb.emit_func_output(out)
    assert low_precision_dtype(bb.get()["main"]) == "float16"


def _check_against(before: tvm.IRModule, after: tvm.IRModule) -> dict:
    """:func:`float64_check` on the runs of the comparison the job makes."""
    comparison = compare(before, after, inputs=random_inputs(before["main"], seed=0),
                         keep_runs=True)
    inputs, imported, rewritten = comparison.runs
    assert len(imported) == len(rewritten) == comparison.outputs
    return float64_check(before, "main", inputs, imported, rewritten, atol=1e-4)


def test_a_rewrite_that_rounds_differently_passes_and_a_wrong_one_fails():
    before = _silu_model("float16")
    fused = _check_against(before, _silu_model("float16", written_out=False))
    assert fused["ok"] and fused["rewritten"] <= 2 * fused["imported"] + 1e-4
    wrong = _check_against(before, _silu_model("float16", factor=1.01))
    assert not wrong["ok"] and wrong["rewritten"] > 5 * wrong["imported"]


def test_the_job_judges_a_float16_model_against_float64_and_says_so():
    # layernorm.collapse changes where float16 rounds: off by more than 1e-4 from the
    # imported run, yet no further from the float64 recomputation
    before = LIBRARY["layernorm.collapse"].example(dtype="float16")
    report = run(before, patterns=["layernorm.collapse"], out_dir=None, draw=False)
    assert report.rewrites == {"layernorm.collapse": 1}
    numeric = report.numeric
    assert numeric["max_abs_error"] > numeric["atol"]
    assert numeric["dtype"] == "float16" and numeric["ok"] and report.ok
    assert numeric["float64"]["rewritten"] <= 2 * numeric["float64"]["imported"] + 1e-4
