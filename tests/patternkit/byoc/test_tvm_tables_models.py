"""TVM's tables on transformers models: MergeComposite forms what FuseOpsByPattern forms.

GPT-2 (eager attention, no cache, all-ones attention mask) and BERT, 2 layers of width
64, built from configs with random weights and imported with ``torch.export``.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tvm_ffi  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.torch import from_exported_program  # noqa: E402

import patternkit as pk  # noqa: E402
from patternkit.byoc.tables import tvm_tables  # noqa: E402

pytestmark = [pytest.mark.models, pytest.mark.filterwarnings("ignore::FutureWarning")]


def _import(model, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(model.eval(), args, kwargs=kwargs)
    return from_exported_program(exported, unwrap_unit_return_tuple=True)


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=2,
                                     n_positions=32, use_cache=False,
                                     attn_implementation="eager")
    return _import(transformers.GPT2Model(config), torch.randint(0, 100, (1, 8)),
                   attention_mask=torch.ones(1, 8, dtype=torch.int64))


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=128,
                                     max_position_embeddings=32)
    return _import(transformers.BertModel(config), torch.randint(0, 100, (1, 8)))


@pytest.mark.parametrize("model", ["gpt2", "bert"])
@pytest.mark.parametrize("prefix", ["cutlass", "tensorrt", "cublas", "openclml"])
def test_transformer_composites_are_exactly_fuse_ops_by_patterns(request, model, prefix):
    mod = request.getfixturevalue(model)
    theirs = relax.transform.FuseOpsByPattern(tvm_tables.registered_patterns(prefix + "."))(mod)
    ours = pk.MergeComposite(pk.PatternTable.from_tvm(prefix))(mod)
    canon = relax.transform.CanonicalizeBindings()
    assert tvm_ffi.structural_equal(canon(ours), canon(theirs), map_free_vars=True)
    assert pk.byoc.composite_counts(ours), "the table should fire on a transformer"
