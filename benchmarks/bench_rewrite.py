"""patternkit.rewrite / partition against TVM's rewrite_call / FuseOpsByPattern.

Runs both engines side by side on the batch-norm chain (:mod:`bn_chain`), every size in
fresh processes, checks that the results are identical (structurally equal after
``CanonicalizeBindings``) and prints the figures recorded in ``benchmarks/README.md``.
Every time is reported on two clocks: wall (``time.perf_counter``) and the CPU time of
the process (``time.process_time``, user + system), with the N=4000 / N=1000 ratio of
each.

    python benchmarks/bench_rewrite.py                 # N = 1000, 4000 and 16000
    python benchmarks/bench_rewrite.py --sizes 1000 4000 --processes 5 --skip-tvm-above 0
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import (
    is_const as tvm_is_const,
    is_op as tvm_is_op,
    rewrite_call,
    wildcard as tvm_wildcard,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bn_chain import batch_norm_replacement, bn_chain  # noqa: E402

import patternkit as pk  # noqa: E402


class ChainBatchnorm(pk.DFPatternCallback):
    name = "bench.batchnorm"

    def __init__(self):
        super().__init__()
        self.x, self.gamma, self.beta, self.mean, self.var = (pk.wildcard() for _ in range(5))
        self.eps = pk.is_constant()
        self.pattern = (self.gamma * (self.x - self.mean) / pk.is_op("sqrt")(self.var + self.eps)
                        + self.beta)

    def callback(self, pre, post, node_map):
        get = lambda p: node_map[p][0]  # noqa: E731
        return batch_norm_replacement(get(self.x), get(self.gamma), get(self.beta),
                                      get(self.mean), get(self.var), get(self.eps))


def tvm_rewrite(mod: tvm.IRModule) -> relax.Function:
    x, gamma, beta, mean, var = (tvm_wildcard() for _ in range(5))
    eps = tvm_is_const()
    sub = tvm_is_op("relax.subtract")(x, mean)
    mul = tvm_is_op("relax.multiply")(gamma, sub)
    sqrt = tvm_is_op("relax.sqrt")(tvm_is_op("relax.add")(var, eps))
    pattern = tvm_is_op("relax.add")(tvm_is_op("relax.divide")(mul, sqrt), beta)

    def rewriter(_expr, m):
        return batch_norm_replacement(m[x], m[gamma], m[beta], m[mean], m[var], m[eps])

    return rewrite_call(pattern, rewriter, mod["main"])


def timed(fn, *args):
    """``(wall seconds, CPU seconds of this process, result)`` of one call.

    Both clocks, because each misleads alone on a shared machine: wall time counts the
    moments another tenant holds the core, CPU time hides stalls the process does not
    pay for itself (it does count page faults, as system time).
    """
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def canonical(func: relax.Function) -> relax.Function:
    mod = tvm.IRModule({"main": func})
    return relax.transform.CanonicalizeBindings()(mod)["main"]


def bn_pattern():
    x, gamma, beta, mean, var = (pk.wildcard() for _ in range(5))
    return gamma * (x - mean) / pk.is_op("sqrt")(var + pk.is_constant()) + beta


CLOCKS = ("wall", "cpu")
TIMED = ("patternkit_rewrite", "patternkit_partition", "tvm_fuse_ops_by_pattern",
         "tvm_rewrite_call")


def measure(n: int, run_tvm: bool, repeat: int = 3) -> dict:
    """All timings for one N, in this process (best of ``repeat`` for the fast ones).

    The best wall and the best CPU time are taken separately over the runs.
    """
    mod = bn_chain(n)
    row: dict = {"N": n}

    def best(name, fn, *args):
        out = None
        for _ in range(repeat):
            wall, cpu, out = timed(fn, *args)
            row[f"{name}_wall_s"] = min(wall, row.get(f"{name}_wall_s", wall))
            row[f"{name}_cpu_s"] = min(cpu, row.get(f"{name}_cpu_s", cpu))
        return out

    ours = best("patternkit_rewrite", lambda m: pk.rewrite(ChainBatchnorm(), m), mod)
    pattern = bn_pattern()
    best("patternkit_partition", pk.partition, pattern, mod)
    fuse = relax.transform.FuseOpsByPattern([("bench.bn", pattern.to_dpl())], bind_constants=True)
    best("tvm_fuse_ops_by_pattern", fuse, mod)
    if run_tvm:  # once: it takes minutes at N = 4000
        wall, cpu, theirs = timed(tvm_rewrite, mod)
        row["tvm_rewrite_call_wall_s"], row["tvm_rewrite_call_cpu_s"] = wall, cpu
        row["identical"] = bool(tvm_ffi.structural_equal(canonical(ours["main"]),
                                                         canonical(theirs)))
    return row


def summarize(n: int, rows: list[dict]) -> dict:
    """One size over all its processes: the best run and the median of the processes' bests.

    The best is what the machine can do; the median shows how far a typical run of a
    shared machine is from it.  Ratios (``speedup``, ``partition_ratio``) use the bests.
    """
    out: dict = {"N": n, "processes": len(rows)}
    for name in TIMED:
        for clock in CLOCKS:
            values = [r[f"{name}_{clock}_s"] for r in rows if f"{name}_{clock}_s" in r]
            if values:
                out[f"{name}_{clock}_s"] = min(values)
                out[f"{name}_{clock}_median_s"] = statistics.median(values)
    for clock in CLOCKS:
        out[f"partition_ratio_{clock}"] = (out[f"patternkit_partition_{clock}_s"]
                                           / out[f"tvm_fuse_ops_by_pattern_{clock}_s"])
        if f"tvm_rewrite_call_{clock}_s" in out:
            out[f"rewrite_speedup_{clock}"] = (out[f"tvm_rewrite_call_{clock}_s"]
                                               / out[f"patternkit_rewrite_{clock}_s"])
    if any("identical" in r for r in rows):
        out["identical"] = all(r["identical"] for r in rows if "identical" in r)
    return out


def scaling(by_n: dict[int, dict], small: int = 1000, large: int = 4000) -> dict:
    """t(large) / t(small) of ``pk.rewrite`` on both clocks, from bests and from medians."""
    out: dict = {}
    for clock in CLOCKS:
        for kind in ("", "median_"):
            key = f"patternkit_rewrite_{clock}_{kind}s"
            out[f"rewrite_{large}_over_{small}_{clock}{'_median' if kind else ''}"] = (
                by_n[large][key] / by_n[small][key])
    return out


def _rounded(row: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}


def run(sizes: list[int], skip_tvm_above: int, repeat: int = 3, processes: int = 3) -> dict:
    """Measure every size in ``processes`` fresh processes, interleaving the sizes.

    A process that has already built a 16000-unit module, or run rewrite_call for
    minutes, makes everything after it slower (allocator and cache state), hence one
    process per measurement.  Interleaving (1000, 4000, ..., 1000, 4000, ...) spreads
    the load other tenants put on the machine over all sizes alike; ``rewrite_call``
    runs in the first process of each size only.
    """
    rows: dict[int, list[dict]] = {n: [] for n in sizes}
    for p in range(processes):
        for n in sizes:
            cmd = [sys.executable, __file__, "--single", str(n), "--repeat", str(repeat)]
            if n <= skip_tvm_above and p == 0:
                cmd.append("--with-tvm")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows[n].append(json.loads(out.strip().splitlines()[-1]))
    by_n = {n: summarize(n, rows[n]) for n in sizes}
    for n in sizes:
        print(json.dumps(_rounded(by_n[n])), flush=True)
    if 1000 in by_n and 4000 in by_n:
        print(json.dumps(_rounded(scaling(by_n))))
    return by_n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--skip-tvm-above", type=int, default=4000,
                        help="do not run rewrite_call above this N (it is quadratic)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per process for patternkit and FuseOpsByPattern (best kept)")
    parser.add_argument("--processes", type=int, default=3,
                        help="fresh processes per size (best and median reported)")
    parser.add_argument("--single", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--with-tvm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single is not None:
        print(json.dumps(measure(args.single, args.with_tvm, args.repeat)))
    else:
        run(args.sizes, args.skip_tvm_above, args.repeat, args.processes)


if __name__ == "__main__":
    main()
