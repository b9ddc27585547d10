"""MergeComposite vs FuseOpsByPattern with TVM's own cutlass and tensorrt tables.

Run ``python benchmarks/bench_tvm_tables.py`` (``--layers 1 4 12 48``, ``--repeat 3``).
Models come from ``transformers`` configs with random weights (nothing is downloaded),
imported with ``torch.export`` + ``from_exported_program``:

* GPT-2 (eager attention, ``use_cache=False``, width 64, 2 heads) with 1, 4, 12 and 48
  layers, for the growth with model size;
* ResNet-50 (bottleneck blocks ``[3, 4, 6, 3]``, 64x64 input).

On each model and table, side by side in one process: ``FuseOpsByPattern`` over TVM's
registered ``FusionPattern`` list, and ``pk.MergeComposite(pk.PatternTable.from_tvm(...))``.
Each prints one JSON line: best-of-``repeat`` seconds of both (wall clock, and CPU time
of the process), the ratio (patternkit / TVM), microseconds per binding of the model, and
whether the two results are structurally equal after ``CanonicalizeBindings``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import tvm_ffi
from tvm import relax

import patternkit as pk
from patternkit.byoc.tables import tvm_tables


def _import(model, *args, **kwargs):
    import torch
    from tvm.relax.frontend.torch import from_exported_program
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(model.eval(), args, kwargs=kwargs)
    return from_exported_program(exported, unwrap_unit_return_tuple=True)


def gpt2(layers: int):
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=layers, n_head=2,
                                     n_positions=32, use_cache=False,
                                     attn_implementation="eager")
    return _import(transformers.GPT2Model(config), torch.randint(0, 100, (1, 8)),
                   attention_mask=torch.ones(1, 8, dtype=torch.int64))


def resnet50():
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.ResNetConfig(num_channels=3, layer_type="bottleneck",
                                       depths=[3, 4, 6, 3])
    return _import(transformers.ResNetModel(config), torch.randn(1, 3, 64, 64))


def _bindings(mod) -> int:
    return sum(len(b.bindings) for b in mod["main"].body.blocks)


def _best(fn, repeat: int) -> tuple[float, float, object]:
    """Best wall-clock and best CPU seconds of ``repeat`` runs, and the result.

    The CPU time (``time.process_time``) is what to read for growth on a shared machine:
    other processes stretch the wall clock of whichever run they overlap.
    """
    best, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - start_cpu)
    return best, best_cpu, out


def measure(model: str, mod, prefix: str, repeat: int) -> dict:
    patterns = tvm_tables.registered_patterns(prefix + ".")
    table = pk.PatternTable.from_tvm(prefix)
    tvm_time, tvm_cpu, theirs = _best(lambda: relax.transform.FuseOpsByPattern(patterns)(mod),
                                      repeat)
    pk_time, pk_cpu, ours = _best(lambda: pk.MergeComposite(table)(mod), repeat)
    canon = relax.transform.CanonicalizeBindings()
    bindings = _bindings(mod)
    return {"model": model, "table": prefix, "entries": len(table), "bindings": bindings,
            "tvm_s": round(tvm_time, 4), "patternkit_s": round(pk_time, 4),
            "ratio": round(pk_time / tvm_time, 3),
            "tvm_cpu_s": round(tvm_cpu, 4), "patternkit_cpu_s": round(pk_cpu, 4),
            "patternkit_us_per_binding": round(1e6 * pk_time / bindings, 1),
            "tvm_us_per_binding": round(1e6 * tvm_time / bindings, 1),
            "composites": sum(pk.byoc.composite_counts(ours).values()),
            "identical": bool(tvm_ffi.structural_equal(canon(theirs), canon(ours),
                                                       map_free_vars=True))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 4, 12, 48])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tables", nargs="+", default=["cutlass", "tensorrt"])
    parser.add_argument("--no-resnet", action="store_true")
    args = parser.parse_args()
    models = [(f"gpt2-{n}", lambda n=n: gpt2(n)) for n in args.layers]
    if not args.no_resnet:
        models.append(("resnet50", resnet50))
    for name, build in models:
        mod = build()
        for prefix in args.tables:
            print(json.dumps(measure(name, mod, prefix, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
