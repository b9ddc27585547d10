"""attention.collapse on float16 and bfloat16 attention whose softmax runs in float32
between casts (Hugging Face's ``softmax(scores, dtype=torch.float32).to(query.dtype)``,
Qwen3 and Llama in half precision): collapsed, the precision named in the log.

Small torch modules exported with torch.export and imported with patternkit's importer,
as users bring them.  bfloat16 inputs are drawn here as floats and rounded with
ml_dtypes: the comparison is against the written-out form and against a float32 run.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

import patternkit as pk
from patternkit.patterns import LIBRARY
from patternkit.patterns.attention.plan import BFLOAT16, FLOAT16
from patternkit.verification import numeric

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

RULE = "attention.collapse"
LOGGER = "patternkit.patterns.attention.collapse"
TOLERANCE = {"float16": FLOAT16, "bfloat16": BFLOAT16}
NUMPY_DTYPE = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


class EagerAttention(torch.nn.Module):
    """Hugging Face's eager_attention_forward on BNSH q, k, v: the softmax in ``softmax_dtype``."""

    def __init__(self, softmax_dtype=torch.float32, causal: bool = False):
        super().__init__()
        self.softmax_dtype, self.causal = softmax_dtype, causal

    def forward(self, q, k, v):
        scores = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
        if self.causal:
            s, t = scores.shape[-2:]
            scores = scores + torch.full((s, t), float("-inf"), dtype=q.dtype).triu(1)
        p = torch.nn.functional.softmax(scores, dim=-1, dtype=self.softmax_dtype).to(q.dtype)
        return torch.matmul(p, v)


def _imported(module, dtype: str):
    from patternkit.models.importing import from_torch

    args = tuple(torch.zeros(2, 2, 8, 16, dtype=getattr(torch, dtype)) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.export.export(module.eval(), args)
    mod, _, _ = from_torch(program, False, "main", type(module).__name__, {})
    return mod


def _run(mod, arrays, dtype: str) -> np.ndarray:
    out = numeric.run(mod, [a.astype(NUMPY_DTYPE[dtype]) for a in arrays], "main")[0]
    return np.asarray(out).astype(np.float64)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_attention_with_a_float32_softmax_collapses_and_names_it(
        dtype, caplog):
    before = _imported(EagerAttention(), dtype)
    log = pk.RewriteLog()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count(RULE) == 1
    assert after.script().count("R.nn.attention") == 1
    named = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(named) == 1 and f"ran in float32 between casts of {dtype} scores" in named[0]
    tol = TOLERANCE[dtype]
    assert str(tol) in named[0]
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-1, 1, (2, 2, 8, 16)) for _ in range(3)]
    written, fused = _run(before, arrays, dtype), _run(after, arrays, dtype)
    np.testing.assert_allclose(fused, written, rtol=tol.rtol, atol=tol.atol)
    # against the float32 computation the fused op errs as the model itself does (its
    # result rounds to the same dtype; twice the model's error leaves room for a rounding
    # that falls the other way, measured 1.14x in float16 and 0.97x in bfloat16)
    reference = _run(_imported(EagerAttention(), "float32"), arrays, "float32")
    assert np.abs(fused - reference).max() <= 2 * np.abs(written - reference).max()


def test_a_float32_model_softmax_in_float64_is_refused_with_the_precision_named():
    before = _imported(EagerAttention(softmax_dtype=torch.float64), "float32")
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count(RULE) == 0
    assert "R.nn.attention" not in after.script()
    assert any("the softmax runs in float64 between casts of the float32 scores" in reason
               for reason in log.reasons(RULE)), log.reasons(RULE)


def _dynamo_written_out_attention(dtype: str):
    """``p = exp(s - max(s)) / sum(...)`` over ``s = q @ k^T * scale``, then ``p @ v``, with
    the max and the sum in float32 between casts: how the dynamo ONNX exporter writes a
    half-precision hand-written softmax (checked on the spelling matrix's source)."""
    from tvm import relax

    q, k, v = (relax.Var(n, relax.TensorType((2, 2, 8, 16), dtype)) for n in "qkv")
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            s = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, kt)),
                                          relax.const(0.25, dtype)))
            wide = bb.emit(relax.op.max(bb.emit(relax.op.astype(s, "float32")), [-1],
                                        keepdims=True))
            e = bb.emit(relax.op.exp(bb.emit(s - bb.emit(relax.op.astype(wide, dtype)))))
            total = bb.emit(relax.op.sum(bb.emit(relax.op.astype(e, "float32")), [-1],
                                         keepdims=True))
            p = bb.emit(e / bb.emit(relax.op.astype(total, dtype)))
            out = bb.emit_output(relax.op.matmul(p, v))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_softmax_written_out_with_float32_max_and_sum_becomes_attention(dtype):
    before = _dynamo_written_out_attention(dtype)
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count("softmax.collapse") == 1 and log.count(RULE) == 1
    assert after.script().count("R.nn.attention") == 1 and "R.exp" not in after.script()
    tol = TOLERANCE[dtype]
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-1, 1, (2, 2, 8, 16)) for _ in range(3)]
    np.testing.assert_allclose(_run(after, arrays, dtype), _run(before, arrays, dtype),
                               rtol=tol.rtol, atol=tol.atol)
