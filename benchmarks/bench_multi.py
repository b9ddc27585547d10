"""patternkit.rewrite_bindings against tvm.relax.dpl.rewrite_bindings, side by side.

The graph: a chain of N blocks, each three parallel matmuls of the block's input (a
q/k/v projection) whose results are added into the next block's input, all in one
dataflow block.  Both engines get the same ``PatternContext`` (patternkit's, converted
for TVM by ``PatternContext.to_dpl``) and the same rewriter (one matmul on the
concatenated weights, and a split); the script checks that the results are structurally
equal after ``CanonicalizeBindings`` (TVM's result folds the block's var-to-var copies,
``gv = lv9``; patternkit's keeps them), and prints one JSON line per size with wall and
CPU seconds of each engine.

Every size runs in a fresh process (TVM's time at one size must not slow the next); a
size listed twice (``--sizes 1000 4000 1000 4000``) runs twice, interleaved, and the
t(largest) / t(smallest) ratio is taken from the best of each.
patternkit runs ``--repeat`` times and the best is kept; TVM runs once, and only up to
``--skip-tvm-above``.

    python benchmarks/bench_multi.py                   # N = 1000 and 4000, TVM at 1000
    python benchmarks/bench_multi.py --sizes 250 1000 --skip-tvm-above 1000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

import patternkit as pk
from patternkit.engine.multi import dpl_rewriter

WIDTH = 16


def qkv_chain(n: int) -> tvm.IRModule:
    """N blocks of ``x <- matmul(x, Wq) + matmul(x, Wk) + matmul(x, Wv)``, seeded weights."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((4, WIDTH), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(n):
                q, k, v = (bb.emit(relax.op.matmul(h, relax.const(
                    (rng.standard_normal((WIDTH, WIDTH)) * 0.1).astype("float32"))))
                    for _ in range(3))
                h = bb.emit(relax.op.add(bb.emit(relax.op.add(q, k)), v))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def qkv_context():
    """``x`` used by three matmuls as their left operand; the weights are constants, not
    Vars, so they are sub-patterns of the matmuls (``add_constraint=False``), not nodes.
    """
    with pk.PatternContext() as ctx:
        inp = pk.wildcard()
        matmuls = [pk.is_op("relax.matmul")(pk.wildcard(), pk.is_constant(),
                                            add_constraint=False) for _ in range(3)]
        for matmul in matmuls:
            inp.used_by(matmul, 0)
    return ctx, inp, matmuls


def make_rewriter(inp, matmuls):
    def rewriter(matchings, bindings):
        weights = [bindings[matchings[m]].args[1] for m in matmuls]
        merged = relax.op.matmul(matchings[inp], relax.op.concat(weights, axis=1))
        parts = relax.op.split(merged, [WIDTH, 2 * WIDTH], axis=1)
        return {matchings[m]: relax.TupleGetItem(parts, i) for i, m in enumerate(matmuls)}
    return rewriter


def canonical(func: relax.Function) -> relax.Function:
    return relax.transform.CanonicalizeBindings()(tvm.IRModule({"main": func}))["main"]


def timed(fn, *args):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def one_size(n: int, repeat: int, run_tvm: bool) -> dict:
    mod = qkv_chain(n)
    ctx, inp, matmuls = qkv_context()
    rewriter = make_rewriter(inp, matmuls)
    runs = [timed(pk.engine.rewrite_bindings, ctx, rewriter, mod["main"]) for _ in range(repeat)]
    ours = min(runs, key=lambda r: r[0])
    result = {"n": n, "bindings": 5 * n + 1, "pk_wall": round(ours[0], 4),
              "pk_cpu": round(min(r[1] for r in runs), 4),
              "split": sum(1 for b in ours[2].body.blocks[0].bindings
                           if isinstance(b.value, relax.Call)
                           and getattr(b.value.op, "name", "") == "relax.split")}
    if run_tvm:
        tvm_ctx, nodes = ctx.to_dpl()
        wall, cpu, theirs = timed(relax.dpl.rewrite_bindings, tvm_ctx,
                                  dpl_rewriter(nodes, rewriter), mod["main"])
        result.update(tvm_wall=round(wall, 3), tvm_cpu=round(cpu, 3),
                      speedup_wall=round(wall / ours[0], 1),
                      identical=bool(tvm_ffi.structural_equal(canonical(ours[2]),
                                                              canonical(theirs))))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-tvm-above", type=int, default=1000)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(one_size(args.child, args.repeat,
                                  args.child <= args.skip_tvm_above)))
        return
    results = []
    for n in args.sizes:
        out = subprocess.run([sys.executable, __file__, "--child", str(n), "--repeat",
                              str(args.repeat), "--skip-tvm-above", str(args.skip_tvm_above)],
                             check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    sizes = sorted({r["n"] for r in results})
    if len(sizes) >= 2:  # best of the processes of each size (a size may be listed twice)
        best = {n: {clock: min(r[f"pk_{clock}"] for r in results if r["n"] == n)
                    for clock in ("wall", "cpu")} for n in (sizes[0], sizes[-1])}
        small, large = best[sizes[0]], best[sizes[-1]]
        print(json.dumps({"ratio": f"t({sizes[-1]})/t({sizes[0]})",
                          "wall": round(large["wall"] / small["wall"], 2),
                          "cpu": round(large["cpu"] / small["cpu"], 2)}))


if __name__ == "__main__":
    main()
