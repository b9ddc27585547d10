"""The zoo entries of issue 36's families: each builds, and the library takes its families.

One tiny model per test (one layer or block, width 16-32).  Each test counts the family
instances in the torch module (:mod:`patternkit.models.long_tail_families`), rewrites the
imported module with the library, merges the library's composites, and checks that every
instance became the fused op or the composite; the rewritten module, built for llvm, must
match the torch module (float32, ``rtol=atol=1e-4`` on outputs of order one; the errors
seen are below 2e-5).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from tvm import relax

import patternkit as pk
from patternkit.byoc import composite_counts, merge_composite
from patternkit.ir import op_name
from patternkit.ir.compat import to_tensor
from patternkit.verification.numeric import build as build_for_checks

pytestmark = pytest.mark.models
pytest.importorskip("torch")
pytest.importorskip("transformers")

FLOAT32 = dict(rtol=1e-4, atol=1e-4)

TINY = {
    "mobilenet": dict(width=8),
    "unet_block": dict(channels=16, groups=4, heads=2, time_dim=16, image=4),
    "levit": dict(image=32),
    "swinv2": dict(),
    "gptj": dict(layers=1, hidden=32, heads=2, rotary_dim=8),
    "phi": dict(layers=1, hidden=32, heads=2, intermediate=64),
    "qwen2": dict(layers=1, hidden=32, heads=4, kv_heads=2, intermediate=64),
}


class Rewritten:
    """A tiny zoo model, its family census, and what the library made of it."""

    def __init__(self, zoo, name: str):
        from patternkit.models.long_tail_families import count_long_tail_families
        from patternkit.patterns import LIBRARY

        self.model = zoo(name, **TINY[name])
        self.census = count_long_tail_families(self.model.source)
        self.log = pk.RewriteLog()
        self.mod = pk.rewrite(LIBRARY.rewrite_rules(), self.model.mod, log=self.log)
        self.composites = composite_counts(merge_composite(self.mod, LIBRARY.for_compiler("byoc")))
        self.ops: Counter = Counter()
        relax.analysis.post_order_visit(self.mod[self.model.entry].body,
                                        lambda e: self.ops.update([op_name(e)]))

    def composites_of(self, prefix: str) -> int:
        """Composites whose name starts with ``byoc.<prefix>``."""
        return sum(n for name, n in self.composites.items() if name.startswith(f"byoc.{prefix}"))

    def assert_matches_torch(self) -> None:
        """The rewritten module, built for llvm, computes what the torch module does."""
        vm = build_for_checks(self.mod)
        got = vm[self.model.entry](*(to_tensor(a) for a in self.model.arguments()))
        reference = self.model.reference()[0]
        np.testing.assert_allclose(got.numpy(), reference, **FLOAT32)
        assert np.abs(reference).max() > 0.1  # not a comparison of near-zeros


@pytest.fixture(scope="module")
def rewritten(zoo):
    cache: dict[str, Rewritten] = {}

    def get(name: str) -> Rewritten:
        if name not in cache:
            cache[name] = Rewritten(zoo, name)
        return cache[name]

    return get


def test_mobilenet_hard_activations_become_the_composites_and_relu6_one_clip(rewritten):
    r = rewritten("mobilenet")
    assert r.census["hardswish"] == r.composites["byoc.hardswish"] > 0
    assert r.census["hardsigmoid"] == r.composites["byoc.hardsigmoid"] > 0
    # the two ReLU6 blocks end in conv + folded batch norm + clip(0, 6)
    assert r.census["relu6"] == r.composites["byoc.conv2d_add_clip_strict"] > 0
    assert r.model.families["batchnorm"] == r.log.counts()["conv.fold_batchnorm"]
    assert r.ops["relax.nn.batch_norm"] == 0
    r.assert_matches_torch()


def test_unet_block_group_norms_and_packed_geglu_become_composites(rewritten):
    r = rewritten("unet_block")
    assert r.census["groupnorm"] == r.ops["relax.nn.group_norm"] == 5
    # four GroupNorm + SiLU (the ResNet blocks), one alone (before the transformer)
    assert r.composites["byoc.group_norm_silu"] == 4 and r.composites["byoc.group_norm"] == 1
    assert r.census["geglu"] == r.composites["byoc.geglu_packed"] == 1
    assert r.ops["relax.nn.attention"] + r.ops["relax.nn.attention_bias"] == 1
    r.assert_matches_torch()


def test_levit_linear_batch_norms_fold_into_their_matmuls(rewritten):
    r = rewritten("levit")
    folded = r.log.counts()["matmul.fold_batchnorm"]
    left = r.ops["relax.nn.batch_norm"]
    # the census counts every BatchNorm1d after a Linear, the ones the importer writes as a
    # batched matmul of broadcast_to operands among them: all folded
    assert r.census["batchnorm_linear"] == folded and left == 0
    assert r.census["hardswish"] == r.composites["byoc.hardswish"] > 0
    r.assert_matches_torch()


def test_swinv2_cosine_attention_is_collapsed(rewritten):
    r = rewritten("swinv2")
    attentions = r.model.families["attention"]
    collapsed = r.ops["relax.nn.attention"] + r.ops["relax.nn.attention_bias"]
    assert attentions == 2
    assert collapsed == r.log.counts()["attention.cosine"] == attentions
    r.assert_matches_torch()


@pytest.mark.parametrize("name, composite", [("gptj", "byoc.rope_interleaved_partial"),
                                             ("phi", "byoc.rope_partial"),
                                             ("qwen2", "byoc.rope")])
def test_decoder_rotations_become_the_rope_composite_of_their_form(rewritten, name, composite):
    r = rewritten(name)
    assert r.census["rope"] == r.composites_of("rope") == r.composites.get(composite) == 2
    r.assert_matches_torch()


def test_qwen2_swiglu_mlp_becomes_the_swiglu_composite(rewritten):
    r = rewritten("qwen2")
    assert r.census["swiglu"] == r.composites["byoc.swiglu"] == 1
    assert r.ops["relax.nn.rms_norm"] == 3


@pytest.mark.parametrize("name, options, message", [
    ("gptj", dict(rotary_dim=7), "gptj: rotary_dim=7 must be even"),
    ("phi", dict(partial_rotary=0.05), "phi: partial_rotary=0.05 of a head of 16"),
    ("qwen2", dict(heads=4, kv_heads=3), "qwen2: heads=4 is not a multiple of kv_heads=3"),
    ("unet_block", dict(groups=5), "unet_block: channels=16 is not a multiple of groups=5"),
])
def test_inconsistent_options_are_a_zoo_error_naming_them(zoo, name, options, message):
    from patternkit.models import ZooError

    with pytest.raises(ZooError, match=message):
        zoo(name, **{**TINY[name], **options})


def _output_step(model) -> float:
    """The quantisation step of an ONNX QDQ model's output (its last DequantizeLinear)."""
    from onnx import numpy_helper

    output = model.graph.output[0].name
    node = next(n for n in model.graph.node
                if n.op_type == "DequantizeLinear" and output in n.output)
    scale = next(i for i in model.graph.initializer if i.name == node.input[1])
    return float(numpy_helper.to_array(scale).max())


def test_onnx_qdq_quantised_conv_and_matmul_become_the_qdq_composites(zoo):
    pytest.importorskip("onnxruntime")
    from patternkit.patterns import LIBRARY

    model = zoo("onnx:qdq")
    assert model.families["qdq"] == 2  # the Conv and the MatMul, both operands dequantized
    after = pk.rewrite(LIBRARY.rewrite_rules(), model.mod)
    merged = composite_counts(merge_composite(after, LIBRARY.for_compiler("byoc")))
    assert merged.get("byoc.qdq_conv2d") == merged.get("byoc.qdq_matmul") == 1

    def run(mod):
        vm = build_for_checks(mod)
        return vm[model.entry](*(to_tensor(a) for a in model.arguments())).numpy()

    got = run(after)
    # the rewrite changes nothing TVM computes: the same bits as the imported QDQ graph
    np.testing.assert_array_equal(got, run(model.mod))
    reference = model.reference()[0]  # onnxruntime
    # TVM's dequantize -> float op -> quantize rounds apart from onnxruntime's integer
    # kernels: one output step with onnxruntime 1.31, three on some outputs with 1.32
    # (the imported graph, before any rewrite, alike)
    step = _output_step(model.source)
    np.testing.assert_allclose(got, reference, rtol=0, atol=3.01 * step)
    assert np.abs(reference).max() > 10 * step


def test_onnx_qdq_refuses_another_batch_than_its_fixed_one(zoo):
    pytest.importorskip("onnxruntime")
    from patternkit.models import ZooError

    with pytest.raises(ZooError, match=r"zoo:onnx:qdq\?batch_size=2: the QDQ model's input is "
                                       r"fixed at \(1, 3, 8, 8\)"):
        zoo("onnx:qdq", batch_size=2)


@pytest.mark.parametrize("alibi, rotations", [(False, 2), (True, 0)])
def test_rope_is_counted_only_where_the_model_rotates(alibi, rotations):
    # Falcon builds its rotary module with ALiBi too, and never calls it then
    from patternkit.models import parse_spec
    from patternkit.models.long_tail_families import count_long_tail_families
    from patternkit.models.torch_models import falcon_source

    options = parse_spec("falcon", layers=1, hidden=32, heads=2, alibi=alibi).as_dict()
    assert count_long_tail_families(falcon_source(options).module)["rope"] == rotations
