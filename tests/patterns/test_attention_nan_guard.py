"""patterns/attention: the NaN guard torch's ONNX exporter puts on the probabilities of
``scaled_dot_product_attention`` with a bool mask, ``where(isnan(p), 0, p)``.

Before it, those attentions (BART, RoBERTa, ALBERT, MobileBERT exported to ONNX by
transformers 5, which calls SDPA) were no skeleton and said nothing.  The guard zeroes the
rows the mask empties, where ``R.nn.attention`` gives NaN: the rewrite zeroes them after
the fused op, as it does for torch.export's safe softmax.  Compared exactly: the guarded
form and the rewrite compute the same float32 operations on the rows kept (tolerance
below), and 0 on the emptied rows.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import patternkit as pk
from patternkit.patterns import LIBRARY
from patternkit.patterns.near_misses import NEAR_MISSES
from patternkit.verification import numeric

#: float32: the fused op's softmax and matmuls in another order than the written-out ones.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def guarded_attention(fill: float = 0.0):
    """``where(isnan(p), fill, p) @ v`` with ``p = softmax(q k^T / sqrt(8) + bias)``,
    ``bias`` an input (the exporter's ``where(mask, 0, -inf)``)."""
    q, k, v = (relax.Var(n, relax.TensorType((2, 4, 16, 8), "float32")) for n in "qkv")
    bias = relax.Var("bias", relax.TensorType((2, 1, 16, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v, bias]):
        with bb.dataflow():
            scores = bb.emit(relax.op.multiply(
                relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])),
                relax.const(8 ** -0.5, "float32")))
            p = bb.emit(relax.op.nn.softmax(relax.op.add(scores, bias), axis=-1))
            guarded = bb.emit(relax.op.where(relax.op.isnan(p), relax.const(fill, "float32"),
                                             p))
            out = bb.emit_output(relax.op.matmul(guarded, v))
        bb.emit_func_output(out)
    return bb.get()


def _inputs():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 16, 8)).astype("float32") for _ in range(3))
    bias = np.zeros((2, 1, 16, 16), "float32")
    bias[0, 0, :, 12:] = -np.inf  # padding: the last four keys of the first sequence
    bias[1, 0, 3, :] = -np.inf  # a query whose every key is masked: a row the guard zeroes
    return [q, k, v, bias]


def _ops(mod):
    return [b.value.op.name for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call) and hasattr(b.value.op, "name")]


def test_a_nan_guarded_attention_collapses_and_zeroes_the_rows_its_mask_empties():
    before = guarded_attention()
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert [r.rule for r in log.records] == ["attention.collapse"]
    assert "relax.nn.attention_bias" in _ops(after) and "relax.isnan" not in _ops(after)
    assert log.near_misses(NEAR_MISSES) == []
    inputs = _inputs()
    (expected,) = numeric.run(before, inputs)
    (got,) = numeric.run(after, inputs)
    assert not np.isnan(got).any()
    assert (expected[1, :, 3] == 0).all() and (got[1, :, 3] == 0).all()
    assert np.abs(expected).max() > 0.1  # outputs that are evidence
    np.testing.assert_allclose(got, expected, **TOLERANCE)


@pytest.mark.parametrize("fill", [1.0, -1.0])
def test_a_guard_that_fills_another_value_is_a_near_miss_with_the_value(fill):
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, guarded_attention(fill), log=log)
    assert "relax.nn.attention_bias" not in _ops(after)
    (miss,) = log.near_misses(NEAR_MISSES)
    assert (miss.family, miss.rule) == ("attention", "attention.collapse")
    assert f"the probabilities' NaN guard fills {fill:g}, not 0" in miss.reason
