"""Real models round-trip: ResNet-18 and a small BERT imported from PyTorch.

Both are built from ``transformers`` configs with random weights (nothing is downloaded)
and imported with ``torch.export`` + ``from_exported_program``.  Sizes are cut down
(64x64 images; 2 BERT layers of width 64) so the file runs in seconds; the graphs keep
every op kind of the full models.  Skipped cleanly when torch or transformers is absent.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tvm.relax.dpl import is_op, wildcard  # noqa: E402
from tvm.relax.frontend.torch import from_exported_program  # noqa: E402
from tvm.relax.transform import FuseOpsByPattern, MergeCompositeFunctions  # noqa: E402

from patternkit.fusion import function_kinds  # noqa: E402
from patternkit.testing import assert_roundtrip  # noqa: E402

# torch.export's pytree emits a LeafSpec deprecation warning from inside torch
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _import(model, *inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's LeafSpec FutureWarning
        exported = torch.export.export(model.eval(), inputs)
    return from_exported_program(exported, unwrap_unit_return_tuple=True)


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    config = transformers.ResNetConfig(num_channels=3, embedding_size=64,
                                       hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                                       layer_type="basic")  # basic blocks x [2,2,2,2] = ResNet-18
    return _import(transformers.ResNetModel(config), torch.randn(1, 3, 64, 64))


@pytest.fixture(scope="module")
def small_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=128,
                                     max_position_embeddings=32)
    return _import(transformers.BertModel(config), torch.randint(0, 100, (1, 8)))


def _count(mod, kind):
    return sum(kind in function_kinds(f) for _, f in mod.functions.items())


def test_resnet18_fuse_ops_round_trip_is_exact_and_numerically_identical(resnet18):
    result = assert_roundtrip(resnet18, numeric=True, rtol=1e-6, atol=1e-6)
    assert _count(result.fused, "primitive") > 10
    assert result.numeric.max_abs_error == 0.0


def test_bert_fuse_ops_round_trip_is_exact_and_numerically_identical(small_bert):
    # token ids must stay inside the vocabulary: random_inputs draws ints in [0, 8)
    result = assert_roundtrip(small_bert, numeric=True, rtol=1e-6, atol=1e-6)
    assert _count(result.fused, "primitive") > 10
    assert result.numeric.max_abs_error == 0.0


BYOC = [
    ("toy.conv2d", is_op("relax.nn.conv2d")(wildcard(), wildcard())),
    ("toy.matmul_add", is_op("relax.add")(is_op("relax.matmul")(wildcard(), wildcard()),
                                          wildcard())),
    ("toy.relu", is_op("relax.nn.relu")(wildcard())),
    ("toy.softmax", is_op("relax.nn.softmax")(wildcard())),
]


@pytest.mark.parametrize("model", ["resnet18", "small_bert"])
def test_byoc_partitioning_round_trips_on_real_models(model, request):
    mod = request.getfixturevalue(model)
    result = assert_roundtrip(mod, FuseOpsByPattern(BYOC))
    assert _count(result.fused, "composite") > 0
    result = assert_roundtrip(mod, lambda m: MergeCompositeFunctions()(
        FuseOpsByPattern(BYOC)(m)))
    assert _count(result.fused, "codegen") > 0
