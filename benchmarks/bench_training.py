"""Benchmark: ``pk.training.gradient`` against ``relax.transform.Gradient`` alone.

Issue 15's target: on a 2-layer BERT, ``gradient`` (checks, expansion of the ops without
a gradient, then ``Gradient``) finishes within 2x of ``relax.transform.Gradient`` run by
itself on the already-expanded module.  The expansion is a linear rewrite pass; what it
adds over ``Gradient`` is that pass plus ``DecomposeOpsForTraining`` for layer norms.

The models come from the zoo (random weights, ``keep_params=true`` so that every weight is
a parameter to differentiate); both sides differentiate w.r.t. every weight, and each
figure is the minimum of ``--repeat`` runs (first runs warm caches and are dropped).

Run: ``python benchmarks/bench_training.py [--models bert resnet18]`` (needs the torch
extra; about a minute per model on two cores, most of it building the zoo model).
"""

from __future__ import annotations

import argparse
import platform
import time

import tvm
from tvm import relax

from patternkit.models import zoo_model
from patternkit.training import GradientReport, expand_for_gradient, gradient, with_loss

MODELS = {"bert": dict(layers=2), "resnet18": dict(), "gpt2": dict(layers=2)}


def best_of(fn, repeat: int) -> float:
    fn()  # warm-up: op registries, FFI caches
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench(name: str, repeat: int) -> dict:
    model = zoo_model(name, keep_params=True, **MODELS[name])
    func = model.entry + "_loss"
    mod = with_loss(model.mod, model.entry)
    wrt = list(model.params)
    report = GradientReport()
    expanded = tvm.IRModule({func: expand_for_gradient(mod[func], func, report=report)})
    params = {p.name: p for p in expanded[func].params}
    tvm_only = relax.transform.Gradient(func, [params[n] for n in wrt])
    ours = best_of(lambda: gradient(mod, func=func, wrt=wrt), repeat)
    theirs = best_of(lambda: tvm_only(expanded), repeat)
    bindings = sum(len(b.bindings) for b in mod[func].body.blocks)
    return dict(model=name, bindings=bindings, weights=len(wrt), expanded=report.expanded,
                ours=ours, theirs=theirs, ratio=ours / theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert", "resnet18"], choices=MODELS)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, tvm {tvm.__version__}")
    print("| model | bindings | weights | expanded | gradient | Gradient alone | ratio |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for name in args.models:
        r = bench(name, args.repeat)
        expanded = ", ".join(f"{op.split('.')[-1]} x{n}" for op, n in r["expanded"].items())
        print(f"| {r['model']} | {r['bindings']} | {r['weights']} | {expanded} | "
              f"{r['ours'] * 1e3:.0f} ms | {r['theirs'] * 1e3:.0f} ms | {r['ratio']:.2f} |")


if __name__ == "__main__":
    main()
