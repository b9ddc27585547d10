"""A TVM ``@R.rewriter`` rule run by TVM's rewriter and by ``pk.from_rewriter``, side by side.

The rule is the one a TVM user writes for SiLU (``x * sigmoid(x)`` -> ``R.nn.silu(x)``);
the input a chain of N such units, so each rewriter makes N replacements.  Every size
runs both in the same fresh process, checks that the results are structurally equal,
and prints the times on two clocks (wall and the process's CPU time) and TVM / patternkit
on each; the last line gives t(4000) / t(1000) for both (4 for linear, 16 for quadratic).

    python benchmarks/bench_from_rewriter.py                   # N = 1000 and 4000
    python benchmarks/bench_from_rewriter.py --sizes 1000 2000 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import PatternMatchingRewriter

from patternkit.engine import rewrite
from patternkit.engine.from_rewriter import from_rewriter

WIDTH = 16


#: The rule as a TVM user writes it (``@R.rewriter`` on this class is the same as
#: ``PatternMatchingRewriter.from_module`` of this module; parsed from text so that the
#: script also loads as a module without its source file registered).
SILU_REWRITER = """
@I.ir_module
class SiluCollapse:
    @R.function
    def pattern(A: R.Tensor((1, 16), "float32")):
        B = R.multiply(A, R.sigmoid(A))
        return B

    @R.function
    def replacement(A: R.Tensor((1, 16), "float32")):
        return R.nn.silu(A)
"""
SiluCollapse = PatternMatchingRewriter.from_module(tvm.script.from_source(SILU_REWRITER))


def silu_chain(n: int) -> tvm.IRModule:
    """``main`` with N units ``h = h * sigmoid(h)``, in one dataflow block."""
    x = relax.Var("x", relax.TensorType((1, WIDTH), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(n):
                h = bb.emit(relax.op.multiply(h, bb.emit(relax.op.sigmoid(h))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def timed(fn, *args):
    """``(wall seconds, CPU seconds of this process, result)`` of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def canonical(mod: tvm.IRModule) -> tvm.IRModule:
    """Both results with aliases folded and dataflow blocks joined.

    TVM's rewriter splits the block its replacement lands in; patternkit leaves an alias
    for the output.
    """
    return relax.transform.ConvertToDataflow()(relax.transform.CanonicalizeBindings()(mod))


def measure(n: int, repeat: int) -> dict:
    """Both rewriters on the chain of ``n`` units, in this process (best of ``repeat``)."""
    mod = silu_chain(n)
    rule = from_rewriter(SiluCollapse, name="bench.silu_collapse")
    row: dict = {"N": n}
    results = {}
    for name, fn in (("patternkit", lambda m: rewrite(rule, m)), ("tvm", SiluCollapse)):
        for _ in range(repeat):
            wall, cpu, results[name] = timed(fn, mod)
            row[f"{name}_wall_s"] = min(wall, row.get(f"{name}_wall_s", wall))
            row[f"{name}_cpu_s"] = min(cpu, row.get(f"{name}_cpu_s", cpu))
    for clock in ("wall", "cpu"):
        row[f"speedup_{clock}"] = row[f"tvm_{clock}_s"] / row[f"patternkit_{clock}_s"]
    ours, theirs = canonical(results["patternkit"]), canonical(results["tvm"])
    row["identical"] = bool(tvm_ffi.structural_equal(ours, theirs))
    row["rewritten"] = sum(1 for b in ours["main"].body.blocks[0].bindings
                           if isinstance(b.value, relax.Call)
                           and b.value.op.name == "relax.nn.silu")
    return row


def main() -> None:
    """Measure every size in a fresh process and print one JSON line per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each rewriter per size (best kept)")
    parser.add_argument("--single", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single:
        print(json.dumps(measure(args.single, args.repeat)), flush=True)
        return
    rows = {}
    for n in args.sizes:
        cmd = [sys.executable, __file__, "--single", str(n), "--repeat", str(args.repeat)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows[n] = json.loads(out.strip().splitlines()[-1])
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                          for k, v in rows[n].items()}), flush=True)
    if 1000 in rows and 4000 in rows:
        print(json.dumps({f"{who}_4000_over_1000_{clock}":
                          round(rows[4000][f"{who}_{clock}_s"] / rows[1000][f"{who}_{clock}_s"], 2)
                          for who in ("patternkit", "tvm") for clock in ("wall", "cpu")}))


if __name__ == "__main__":
    main()
