"""The spelling matrix's torch sources: each spelling computes its family, counted by module.

A row of ``docs/spellings.md`` is only worth reading if its block really is the family
spelled that way: the written-out blocks are checked against torch's own op on the same
weights (float32, ``rtol=1e-5, atol=1e-5``; errors seen: about 1e-6).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from patternkit.models import spelling_sources as S  # noqa: E402

CLOSE = {"rtol": 1e-5, "atol": 1e-5}


def _input(spelling, seed=0):
    shape = [{"batch": 3, "seq": 5}.get(d, d) for d in spelling.shape]
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("spelling", S.SPELLINGS, ids=lambda s: s.key)
def test_every_spelling_keeps_its_input_shape_and_counts_one_instance_per_block(spelling):
    model = S.spelling_model(spelling)
    x = _input(spelling)
    with torch.no_grad():
        y = model(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    assert S.count_instances(model, spelling) == S.COPIES


#: The elementwise activations: an exporter may simplify their chains algebraically.
ACTIVATIONS = {"gelu", "gelu_tanh", "quick_gelu", "silu", "relu6", "hardswish", "hardsigmoid",
               "softplus", "mish"}


@pytest.mark.parametrize("spelling", [s for s in S.SPELLINGS if s.family in ACTIVATIONS],
                         ids=lambda s: s.key)
def test_no_activation_block_is_idempotent_so_no_exporter_merges_the_copies(spelling):
    # a block b with b(b(x)) == b(x) (a bare relu6: clip of a clip) lets an exporter
    # merge the model's copies into one, and its cells count the exporter's work
    block = S.spelling_model(spelling).blocks[0]
    x = 4 * _input(spelling)
    with torch.no_grad():
        once = block(x)
        twice = block(once)
    assert not torch.allclose(twice, once, **CLOSE)


def test_instances_are_counted_from_the_modules_not_assumed():
    spelling = S.find_spelling("hardswish/nn.Hardswish")
    model = S.Chain([spelling.block() for _ in range(3)] + [torch.nn.Identity()])
    assert S.count_instances(model, spelling) == 3
    # another spelling's blocks are not this one's instances
    assert S.count_instances(model, S.find_spelling("hardswish/F.hardswish")) == 0


def test_rows_are_unique_and_a_missing_row_names_the_rows():
    keys = [s.key for s in S.SPELLINGS]
    assert len(keys) == len(set(keys))
    with pytest.raises(KeyError, match="layernorm/written out"):
        S.find_spelling("layernorm/typo")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_model_in_a_low_precision_dtype_has_its_weights_in_it(dtype):
    model = S.spelling_model(S.find_spelling("layernorm/nn.LayerNorm"), dtype)
    assert {p.dtype for p in model.parameters()} == {dtype}


def _block(key):
    torch.manual_seed(0)
    block = S.find_spelling(key).block().eval()
    for p in block.parameters():
        p.data.add_(0.1 * torch.randn(p.shape))
    return block


def test_the_written_out_norms_compute_torchs_norms():
    x = torch.randn(3, 5, S.WIDTH)
    ln = _block("layernorm/written out")
    torch.testing.assert_close(ln(x), F.layer_norm(x, (S.WIDTH,), ln.weight, ln.bias), **CLOSE)
    llama = _block("rmsnorm/written out (Llama)")
    torch.testing.assert_close(llama(x), F.rms_norm(x, (S.WIDTH,), llama.weight, 1e-6), **CLOSE)
    gemma = _block("rmsnorm/written out (Gemma, 1 + w)")
    torch.testing.assert_close(gemma(x), F.rms_norm(x, (S.WIDTH,), 1 + gemma.weight, 1e-6),
                               **CLOSE)
    images = torch.randn(3, S.CHANNELS, 8, 8)
    gn = _block("groupnorm/written out")
    torch.testing.assert_close(gn(images), F.group_norm(images, 2, gn.weight, gn.bias), **CLOSE)
    inorm = _block("instancenorm/written out")
    torch.testing.assert_close(inorm(images), F.instance_norm(
        images, weight=inorm.weight, bias=inorm.bias), **CLOSE)


def test_the_written_out_activations_and_softmaxes_compute_torchs():
    x = 4 * torch.randn(3, 5, S.WIDTH)
    expected = {"gelu/written out (erf)": F.gelu(x),
                "gelu_tanh/written out (tanh)": F.gelu(x, approximate="tanh"),
                "silu/x * sigmoid(x)": F.silu(x),
                "relu6/min(max(x, 0), 6)": F.relu6(S.RELU6_INPUT_SCALE * x),
                "hardswish/x * relu6(x + 3) / 6": F.hardswish(x),
                "hardsigmoid/relu6(x + 3) / 6": F.hardsigmoid(x),
                "mish/x * tanh(softplus(x))": F.mish(x),
                "softmax/exp(x - amax) / sum": F.softmax(x, -1),
                "log_softmax/x - amax - log(sum(exp))": F.log_softmax(x, -1)}
    for key, value in expected.items():
        torch.testing.assert_close(_block(key)(x), value, **CLOSE, msg=key)


def test_every_attention_spelling_computes_the_same_attention_on_the_same_weights():
    x = torch.randn(3, 5, S.WIDTH)
    keys = [s.key for s in S.SPELLINGS if s.family == "attention" and "cosine" not in s.key
            and "mask" not in s.key]  # the masked one attends to fewer keys
    eager = _block(keys[0])
    for key in keys[1:]:
        other = _block(key)
        other.load_state_dict(eager.state_dict())
        torch.testing.assert_close(other(x), eager(x), **CLOSE, msg=key)


def test_the_masked_sdpa_spelling_is_causal():
    """Its first token sees only itself: changing the others leaves its output alone."""
    block = _block("attention/SDPA, bool mask")
    x = torch.randn(3, 5, S.WIDTH)
    y = x.clone()
    y[:, 1:] = torch.randn(3, 4, S.WIDTH)
    torch.testing.assert_close(block(x)[:, 0], block(y)[:, 0], **CLOSE)
    assert not torch.allclose(block(x)[:, 4], block(y)[:, 4])


def test_the_cosine_attention_scores_unit_vectors_by_the_clamped_per_head_scale():
    """Swin v2's block: scaling a query or key projection by a positive factor changes
    nothing (the operands are normalised); the logit scale is clamped at log(100)."""
    x = torch.randn(3, S.WINDOW_TOKENS, S.WIDTH)
    block = _block("attention/cosine (Swin v2)")
    before = block(x)
    with torch.no_grad():
        for projection in block.qkv[:2]:
            projection.weight.mul_(7.0)
            projection.bias.mul_(7.0)
    torch.testing.assert_close(block(x), before, **CLOSE)
    with torch.no_grad():
        block.logit_scale.fill_(9.0)
        clamped = block(x)
        block.logit_scale.fill_(math.log(100.0))
    torch.testing.assert_close(clamped, block(x), **CLOSE)


def test_the_gated_mlps_packed_and_separate_agree_on_the_same_weights():
    x = torch.randn(3, 5, S.WIDTH)
    for separate, packed in (("swiglu/separate gate / up", "swiglu/packed gate_up + chunk"),
                             ("geglu/separate gate / up", "geglu/packed gate_up + chunk")):
        a, b = _block(separate), _block(packed)
        b.gate_up.weight.data = torch.cat((a.gate.weight, a.up.weight))
        b.down.weight.data = a.down.weight.data
        torch.testing.assert_close(b(x), a(x), **CLOSE)


def test_the_rotary_forms_rotate_pairs_of_lanes_by_the_position_angle():
    x = torch.randn(1, 1, 4, 8)
    half, pairs, partial = (_block(f"rope/{k}") for k in (
        "half rotation (Llama)", "interleaved (GPT-J)", "partial (Phi)"))
    # position 0 is the identity; norms of rotated pairs are kept
    for block in (half, pairs, partial):
        torch.testing.assert_close(block(x)[..., 0, :], x[..., 0, :], **CLOSE)
    y = pairs(x)
    torch.testing.assert_close(y[..., 0::2] ** 2 + y[..., 1::2] ** 2,
                               x[..., 0::2] ** 2 + x[..., 1::2] ** 2, **CLOSE)
    y = half(x)
    torch.testing.assert_close(y[..., :4] ** 2 + y[..., 4:] ** 2,
                               x[..., :4] ** 2 + x[..., 4:] ** 2, **CLOSE)
    # the partial form passes the lanes after rotary_dim through
    torch.testing.assert_close(partial(x)[..., partial.rotary_dim:],
                               x[..., partial.rotary_dim:], rtol=0, atol=0)


def test_batch_norms_get_the_statistics_of_a_trained_net():
    model = S.spelling_model(S.find_spelling("batchnorm/Conv2d + BatchNorm2d"))
    norm = model.blocks[0].norm
    assert not torch.allclose(norm.running_var, torch.ones_like(norm.running_var))
    assert not torch.allclose(norm.running_mean, torch.zeros_like(norm.running_mean))
