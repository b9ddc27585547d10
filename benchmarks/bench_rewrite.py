"""patternkit.rewrite / partition against TVM's rewrite_call / FuseOpsByPattern.

Runs both engines side by side on the batch-norm chain (:mod:`bn_chain`), one fresh
process per size, checks that the results are identical (structurally equal after
``CanonicalizeBindings``) and prints the ratios recorded in ``benchmarks/README.md``.

    python benchmarks/bench_rewrite.py                 # N = 1000, 4000 and 16000
    python benchmarks/bench_rewrite.py --sizes 250 1000 --skip-tvm-above 1000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_const as tvm_is_const
from tvm.relax.dpl import is_op as tvm_is_op
from tvm.relax.dpl import rewrite_call
from tvm.relax.dpl import wildcard as tvm_wildcard

sys.path.insert(0, str(Path(__file__).resolve().parent))
import patternkit as pk  # noqa: E402
from bn_chain import batch_norm_replacement, bn_chain  # noqa: E402


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
    """CPU seconds of this process: every engine timed here is single-threaded, and CPU
    time is not inflated when another tenant of the VM takes the core (wall time swung
    by up to 50 % between identical runs)."""
    start = time.process_time()
    out = fn(*args)
    return time.process_time() - start, out


def canonical(func: relax.Function) -> relax.Function:
    mod = tvm.IRModule({"main": func})
    return relax.transform.CanonicalizeBindings()(mod)["main"]


def bn_pattern():
    x, gamma, beta, mean, var = (pk.wildcard() for _ in range(5))
    return gamma * (x - mean) / pk.is_op("sqrt")(var + pk.is_constant()) + beta


def measure(n: int, run_tvm: bool, repeat: int = 3) -> dict:
    """All timings for one N, in this process (best of ``repeat`` for the fast ones)."""
    mod = bn_chain(n)
    row: dict = {"N": n}

    def best(fn, *args):
        times, out = [], None
        for _ in range(repeat):
            seconds, out = timed(fn, *args)
            times.append(seconds)
        return min(times), out

    row["patternkit_rewrite_s"], ours = best(lambda m: pk.rewrite(ChainBatchnorm(), m), mod)
    pattern = bn_pattern()
    row["patternkit_partition_s"], _ = best(pk.partition, pattern, mod)
    fuse = relax.transform.FuseOpsByPattern([("bench.bn", pattern.to_dpl())], bind_constants=True)
    row["tvm_fuse_ops_by_pattern_s"], _ = best(fuse, mod)
    row["partition_ratio"] = row["patternkit_partition_s"] / row["tvm_fuse_ops_by_pattern_s"]
    if run_tvm:  # once: it takes minutes at N = 4000
        row["tvm_rewrite_call_s"], theirs = timed(tvm_rewrite, mod)
        row["rewrite_speedup"] = row["tvm_rewrite_call_s"] / row["patternkit_rewrite_s"]
        row["identical"] = bool(tvm_ffi.structural_equal(canonical(ours["main"]),
                                                         canonical(theirs)))
    return row


def run(sizes: list[int], skip_tvm_above: int, repeat: int = 3) -> list[dict]:
    """Measure every size in a fresh process, one after the other.

    A process that has already built a 16000-unit module, or run rewrite_call for
    minutes, makes everything after it slower (allocator and cache state); a fresh
    process per size keeps the sizes comparable.
    """
    rows = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--single", str(n), "--repeat", str(repeat)]
        if n <= skip_tvm_above:
            cmd.append("--with-tvm")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}),
              flush=True)
    by_n = {r["N"]: r for r in rows}
    if 1000 in by_n and 4000 in by_n:
        scale = by_n[4000]["patternkit_rewrite_s"] / by_n[1000]["patternkit_rewrite_s"]
        print(json.dumps({"rewrite_time_4000_over_1000": round(scale, 2)}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--skip-tvm-above", type=int, default=4000,
                        help="do not run rewrite_call above this N (it is quadratic)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="best of this many runs for patternkit and FuseOpsByPattern")
    parser.add_argument("--single", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--with-tvm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single is not None:
        print(json.dumps(measure(args.single, args.with_tvm, args.repeat)))
    else:
        run(args.sizes, args.skip_tvm_above, args.repeat)


if __name__ == "__main__":
    main()
