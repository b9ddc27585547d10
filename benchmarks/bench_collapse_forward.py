"""Benchmark: what ``gradient(..., collapse_forward=True)`` costs and what it keeps.

Issue 34: with ``collapse_forward=True`` the adjoint's primal half should keep the model's
fused ops (``layer_norm``, ``gelu``) where the backward half reads their written-out
interior.  The option computes each fused op's value with the fused call and keeps of its
expansion only what the backward reads.  This script measures, with and without the
option, on a small GELU MLP and on a 2-layer GPT-2 from the zoo (``keep_params=true``, every
weight differentiated):

* the fused ops in the adjoint's primal half, against the model's own;
* the adjoint's bindings (the op count);
* ``gradient`` itself, ``relax.build`` of the adjoint for llvm, and one run of it (forward
  and backward), each the minimum of ``--repeat`` runs (builds: a third as many, runs: ten
  times as many) after a warm-up, the two sides run in turn so that load falls on both;
* the bytes of every tensor the adjoint binds, before memory planning: an upper bound of
  what it allocates (a proxy; the VM's planner reuses storage);
* the largest difference between the two adjoints' results (loss and gradients).

Run: ``python benchmarks/bench_collapse_forward.py [--models mlp gpt2] [--repeat 3]``
(GPT-2 needs the torch extra; a few minutes on two cores).
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any, Callable

import numpy as np
import tvm
from tvm import relax

from patternkit.models import zoo_model
from patternkit.training import GradientReport, gradient, with_loss
from patternkit.verification.numeric import build, random_inputs, run


def mlp() -> tuple[tvm.IRModule, str, list[str]]:
    """``sum(gelu(layer_norm(x @ w1)) @ w2)``, 64 wide, a batch of 32."""
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    w1 = relax.Var("w1", relax.TensorType((64, 256), "float32"))
    g = relax.Var("g", relax.TensorType((256,), "float32"))
    b = relax.Var("b", relax.TensorType((256,), "float32"))
    w2 = relax.Var("w2", relax.TensorType((256, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w1, g, b, w2]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.layer_norm(relax.op.matmul(x, w1), g, b, axes=[-1]))
            a = bb.emit(relax.op.nn.gelu(h))
            loss = bb.emit_output(relax.op.sum(relax.op.matmul(a, w2)))
        bb.emit_func_output(loss)
    return bb.get(), "main", ["w1", "g", "b", "w2"]


def gpt2() -> tuple[tvm.IRModule, str, list[str]]:
    """The zoo's 2-layer GPT-2 with a summed output, w.r.t. every weight."""
    model = zoo_model("gpt2", layers=2, keep_params=True)
    return with_loss(model.mod, model.entry), model.entry + "_loss", list(model.params)


MODELS: dict[str, Callable[[], tuple[tvm.IRModule, str, list[str]]]] = {"mlp": mlp,
                                                                          "gpt2": gpt2}


def fused_ops(func: relax.Function, ops: set[str]) -> tuple[int, set[str]]:
    """Calls of ``ops`` (the fused ops ``gradient`` expands) in ``func``, and the ops."""
    names = [b.value.op.name for block in func.body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    return sum(1 for n in names if n in ops), ops


def bound_bytes(func: relax.Function) -> int:
    total = 0
    for block in func.body.blocks:
        for binding in block.bindings:
            ty = binding.var.ty
            if isinstance(ty, relax.TensorType) and ty.shape is not None:
                count = int(np.prod([int(d) for d in ty.shape]))
                total += count * tvm.runtime.DataType(str(ty.dtype)).bits // 8
    return total


def interleaved_best(fns: list[Callable[[], Any]], repeat: int) -> list[float]:
    """The minimum time of each of ``fns``, run in turn ``repeat`` times after a warm-up:
    the other tenants' load falls on both sides alike.
    """
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def bench(name: str, repeat: int) -> list[dict]:
    mod, func, wrt = MODELS[name]()
    adjoint = func + "_adjoint"
    inputs = random_inputs(mod[func], seed=0)
    args = [tvm.runtime.tensor(a) for a in inputs]
    sides = (False, True)
    reports = {c: GradientReport() for c in sides}
    grads = {c: gradient(mod, func, wrt, collapse_forward=c, report=reports[c]) for c in sides}
    _, ops = fused_ops(mod[func], set(reports[False].expanded))
    singles = {c: tvm.IRModule({adjoint: grads[c][adjoint]}) for c in sides}
    gradient_s = interleaved_best(
        [lambda c=c: gradient(mod, func, wrt, collapse_forward=c) for c in sides], repeat)
    build_s = interleaved_best([lambda c=c: build(singles[c]) for c in sides],
                               max(1, repeat // 3))
    vms = {c: build(singles[c]) for c in sides}
    run_s = interleaved_best([lambda c=c: vms[c][adjoint](*args) for c in sides], 10 * repeat)
    results = {c: run(singles[c], inputs, adjoint) for c in sides}
    rows = []
    for i, c in enumerate(sides):
        rows.append(dict(model=name, collapse_forward=c, model_fused=fused_ops(mod[func], ops)[0],
                         kept_fused=fused_ops(grads[c][adjoint], ops)[0],
                         bindings=sum(len(b.bindings) for b in grads[c][adjoint].body.blocks),
                         gradient_s=gradient_s[i], build_s=build_s[i], run_s=run_s[i],
                         bound_mb=bound_bytes(grads[c][adjoint]) / 2 ** 20))
    worst = max(float(np.abs(a - b).max() / (np.abs(a).max() or 1.0))
                for a, b in zip(results[False], results[True]))
    rows[1]["max_relative_difference"] = worst
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, tvm {tvm.__version__}")
    print("| model | collapse_forward | fused ops kept / model's | adjoint bindings | "
          "gradient | build | run (fwd+bwd) | tensors bound | max rel. diff |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        for r in bench(name, args.repeat):
            diff = r.get("max_relative_difference")
            print(f"| {r['model']} | {r['collapse_forward']} | {r['kept_fused']} / "
                  f"{r['model_fused']} | {r['bindings']} | {r['gradient_s'] * 1e3:.0f} ms | "
                  f"{r['build_s']:.2f} s | {r['run_s'] * 1e3:.2f} ms | "
                  f"{r['bound_mb']:.2f} MiB | {'-' if diff is None else f'{diff:.1e}'} |")


if __name__ == "__main__":
    main()
