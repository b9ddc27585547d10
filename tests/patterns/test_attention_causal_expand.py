"""attention.expand on a causal attention: TVM 0.27's masks written out, and differentiated."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.patterns import EXPANSIONS
from patternkit.patterns.attention.expand import AttentionExpand
from patternkit.training import (
    GradientReport,
    check_gradients,
    gradient,
    ops_without_gradient,
    with_loss,
)
from patternkit.verification.numeric import build, random_inputs, run

FLOAT32 = {"rtol": 1e-5, "atol": 1e-6}


def reference_attention(q, k, v, bias, scale, causal_mask, window_size=None):
    """BSNH attention in numpy with TVM 0.27's masks: kept ``j <= i + offset`` (0 for
    TopLeft, ``|S - T|`` for BottomRight) and, with a window ``w``, ``j >= i - w + 1``."""
    q, k, v = (a.transpose(0, 2, 1, 3).astype(np.float64) for a in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) * scale + bias
    seq, kv_len = scores.shape[-2:]
    offset = 0 if causal_mask == "TopLeft" else abs(seq - kv_len)
    kept = np.tril(np.ones((seq, kv_len), bool), offset)
    if window_size is not None:
        kept = np.triu(kept, 1 - window_size)
    scores = np.where(kept, scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return ((p / p.sum(axis=-1, keepdims=True)) @ v).transpose(0, 2, 1, 3)


def _attentions(mod: tvm.IRModule) -> list:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
            and b.value.op.name.startswith("relax.nn.attention")]


@pytest.mark.parametrize("causal_mask", ["TopLeft", "BottomRight"])
@pytest.mark.parametrize("shape", ["static", "cross", "long_query", "symbolic"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_a_causal_attention_expands_to_the_numbers_llvm_computes_for_the_fused_op(
        causal_mask, shape, bias):
    fused = AttentionExpand().example(causal_mask=causal_mask, shape=shape, bias=bias)
    before = fused.script()
    expanded = pk.rewrite(EXPANSIONS, fused)
    assert not _attentions(expanded)
    assert fused.script() == before
    pk.assert_same_numerics(fused, expanded, shape_vars={"batch": 2, "seq": 5}, **FLOAT32)


def _expanded_output(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    return run(pk.rewrite(EXPANSIONS, mod), inputs)[0]


@pytest.mark.parametrize("causal_mask", ["TopLeft", "BottomRight"])
@pytest.mark.parametrize("shape", ["cross", "long_query"])
def test_the_reference_agrees_with_the_fused_op_built_on_llvm(causal_mask, shape):
    """The numpy reference of the window test is TVM's semantics: checked where llvm builds."""
    fused = AttentionExpand().example(causal_mask=causal_mask, shape=shape)
    q, k, v, mask = random_inputs(fused["main"], seed=3)
    np.testing.assert_allclose(run(fused, [q, k, v, mask])[0],
                               reference_attention(q, k, v, mask, 0.25, causal_mask), **FLOAT32)


@pytest.mark.parametrize("shape", ["cross", "long_query"])
def test_the_two_causal_masks_differ_where_queries_and_keys_differ_in_number(shape):
    """What the test above could get wrong and still pass: both masks the same."""
    inputs = random_inputs(AttentionExpand().example(shape=shape, bias=False)["main"], seed=1)
    top_left, bottom_right = (
        _expanded_output(AttentionExpand().example(shape=shape, bias=False, causal_mask=m),
                         inputs) for m in ("TopLeft", "BottomRight"))
    plain = _expanded_output(AttentionExpand().example(shape=shape, bias=False), inputs)
    assert not np.allclose(top_left, bottom_right, atol=1e-3)
    assert not np.allclose(top_left, plain, atol=1e-3)


@pytest.mark.parametrize("causal_mask", ["TopLeft", "BottomRight"])
@pytest.mark.parametrize("window", [1, 3])
def test_a_sliding_window_matches_tvms_reference_where_llvm_builds_none(causal_mask, window):
    fused = AttentionExpand().example(causal_mask=causal_mask, window_size=window)
    with pytest.raises(Exception, match="sliding-window"):  # TVM 0.27: NOT RUN on llvm
        build(fused)
    expanded = pk.rewrite(EXPANSIONS, fused)
    assert not _attentions(expanded)
    q, k, v, mask = random_inputs(fused["main"], seed=2)
    want = reference_attention(q, k, v, mask, 0.25, causal_mask, window_size=window)
    np.testing.assert_allclose(run(expanded, [q, k, v, mask])[0], want, **FLOAT32)
    unwindowed = reference_attention(q, k, v, mask, 0.25, causal_mask)
    assert not np.allclose(want, unwindowed, atol=1e-3)


@pytest.mark.parametrize("knobs, reason", [
    ({"window_size": 3}, "window_size=3 without a causal mask"),
    ({"window_size": 3, "causal_mask": "BottomRight", "shape": "cross"},
     "window_size=3 with 4 queries on 8 keys"),
], ids=["window_without_mask", "window_on_fewer_queries"])
def test_a_window_tvm_gives_no_single_meaning_is_refused_with_its_reason(knobs, reason):
    fused = AttentionExpand().example(**knobs)
    log = pk.RewriteLog()
    out = pk.rewrite(EXPANSIONS, fused, log=log)
    assert len(_attentions(out)) == 1
    (why,) = log.reasons("attention.expand")
    assert reason in why


def _causal_language_model() -> tuple[tvm.IRModule, np.ndarray]:
    """One causal self-attention layer: q, k and v projected from x, ``sum(attention * w)``."""
    rng = np.random.default_rng(5)
    x = relax.Var("x", relax.TensorType((2, 6, 8), "float32"))
    weights = [relax.Var(n, relax.TensorType((8, 8), "float32")) for n in ("wq", "wk", "wv")]
    readout = relax.const(rng.uniform(-1, 1, (2, 6, 2, 4)).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, *weights]):
        with bb.dataflow():
            q, k, v = (bb.emit(relax.op.reshape(relax.op.matmul(x, w), (2, 6, 2, 4)))
                       for w in weights)
            out = bb.emit(relax.op.nn.attention(q, k, v, causal_mask="TopLeft"))
            loss = bb.emit_output(relax.op.sum(relax.op.multiply(out, readout)))
        bb.emit_func_output(loss)
    return bb.get(), readout.value.numpy()


def test_a_causal_language_model_differentiates_and_matches_torch_and_finite_differences():
    mod, readout = _causal_language_model()
    assert "relax.nn.attention" in ops_without_gradient(mod["main"])
    grads = gradient(mod)
    by_finite_differences = check_gradients(mod, grads, seed=4)
    assert by_finite_differences.ok, by_finite_differences

    import torch

    def torch_loss(x, wq, wk, wv):
        q, k, v = ((x @ w).reshape(2, 6, 2, 4).transpose(1, 2) for w in (wq, wk, wv))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (out.transpose(1, 2) * torch.tensor(readout)).sum()

    by_torch = check_gradients(mod, grads, reference="torch", torch_fn=torch_loss, seed=4)
    assert by_torch.ok, by_torch


def test_gradient_of_a_causal_attention_with_a_bias_through_with_loss():
    fused = with_loss(AttentionExpand().example(causal_mask="BottomRight", shape="cross"))
    grads = gradient(fused, "main_loss")
    result = check_gradients(fused, grads, "main_loss", seed=6)
    assert result.ok, result


def test_collapse_forward_computes_the_causal_attention_fused_in_the_primal_half():
    mod, _ = _causal_language_model()
    report = GradientReport()
    grads = gradient(mod, collapse_forward=True, report=report)
    assert report.restored is not None and report.restored.restored == {"relax.nn.attention": 1}
    (fused,) = [b.value for b in grads["main_adjoint"].body.blocks[0].bindings
                if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.attention"]
    assert fused.attrs.causal_mask == "TopLeft"
    result = check_gradients(mod, grads, seed=4)
    assert result.ok, result
