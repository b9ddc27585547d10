"""Which entries of TVM's registered tables fire on which model, and do they keep the numbers?

Run ``python benchmarks/verify_tvm_tables.py`` (``--models resnet18 gpt2 bert llama vit``,
``--tables`` default: every registered prefix).  For each model and table,
:func:`patternkit.verify_table` partitions the model with one entry at a time (TVM's
semantics, as ``FuseOpsByPattern``), builds it for ``llvm`` and compares it with the
original on seeded inputs.  One JSON line per (model, table): the entries that fired with
their composite counts and max abs error, and the failures.

Models: ``resnet18`` is :func:`patternkit.models.resnet18` with ``R.nn.batch_norm``
ops; ``gpt2`` (1 layer, width 64) and ``bert`` (1 layer, width 64) come from
``transformers`` configs with random weights through ``torch.export`` (the same
importer the benchmark uses).  Token ids stay inside the vocabulary and the attention
mask is all ones.  ``llama`` and ``vit`` are the zoo's (:func:`patternkit.models.zoo_model`)
with one layer and its defaults otherwise (width 64, 4 heads, batch 2; Llama: 2 key/value
heads, sequence 8; ViT: 32x32 images, 8x8 patches), run on the zoo's inputs.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np

import patternkit as pk
from patternkit.byoc.tables import tvm_tables
from patternkit.models import resnet18, zoo_model


def _import(model, *args, **kwargs):
    import torch
    from tvm.relax.frontend.torch import from_exported_program
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(model.eval(), args, kwargs=kwargs)
    return from_exported_program(exported, unwrap_unit_return_tuple=True)


def _tokens():
    return np.random.default_rng(0).integers(0, 100, (1, 8)).astype("int64")


def gpt2():
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=1, n_head=2,
                                     n_positions=32, use_cache=False,
                                     attn_implementation="eager")
    mod = _import(transformers.GPT2Model(config), torch.randint(0, 100, (1, 8)),
                  attention_mask=torch.ones(1, 8, dtype=torch.int64))
    return mod, [_tokens(), np.ones((1, 8), "int64")]


def bert():
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=128,
                                     max_position_embeddings=32)
    return _import(transformers.BertModel(config), torch.randint(0, 100, (1, 8))), [_tokens()]


def _zoo(name: str, **options):
    """A zoo model in its smallest configuration, with the zoo's own valid inputs."""
    model = zoo_model(name, **options)
    return model.mod, [model.inputs[n] for n in model.input_names]


MODELS = {"resnet18": lambda: (resnet18(batchnorm="op"), None), "gpt2": gpt2, "bert": bert,
          "llama": lambda: _zoo("llama", layers=1), "vit": lambda: _zoo("vit", layers=1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--tables", nargs="+", default=None)
    args = parser.parse_args()
    tables = args.tables or tvm_tables.registered_prefixes()
    for name in args.models:
        mod, inputs = MODELS[name]()
        for prefix in tables:
            start = time.perf_counter()
            report = pk.byoc.verify_table(pk.PatternTable.from_tvm(prefix), mod, inputs=inputs)
            print(json.dumps({
                "model": name, "table": prefix, "seconds": round(time.perf_counter() - start, 1),
                "fired": {e: [n, report.errors[e]] for e, n in report.fired.items()},
                "failures": [str(f) for f in report.failures]}), flush=True)


if __name__ == "__main__":
    main()
