"""Benchmark: DefuseOps against InlinePrivateFunctions and FuseOps on a batch-norm chain.

The workload is ``patternkit.testing.batchnorm_chain(N)``: N inference batch-norm
expressions in one dataflow block (6 bindings and 4 distinct parameters per unit).

* ``FuseOpsByPattern`` output (N calls to one composite): DefuseOps vs TVM's
  ``relax.transform.InlinePrivateFunctions`` on the same input, and DefuseOps at N=1000
  vs N=4000 (linearity: a ratio of 4 is linear);
* ``FuseOps`` output (after LegalizeOps + AnnotateTIROpPattern): DefuseOps vs the FuseOps
  call that produced it.

DefuseOps numbers are the minimum over ``--repeat`` rounds that visit every size in turn;
InlinePrivateFunctions and FuseOps are run fewer times because they are slow.  Each
restored module is checked (structural equality with the chain, or well-formedness and
function count after FuseOps), so the benchmark cannot report a fast wrong answer.

Run: ``python benchmarks/bench_defuse.py`` (about a minute on two cores).
"""

from __future__ import annotations

import argparse
import platform
import time

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.transform import FuseOpsByPattern

from patternkit.fusion import DefuseOps
from patternkit.testing import batchnorm_chain, batchnorm_pattern


def best_of(fn, repeat):
    best = float("inf")
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def _fused_calls(mod):
    return sum(1 for block in mod["main"].body.blocks for b in block.bindings
               if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.GlobalVar)
               and isinstance(mod[b.value.op], relax.Function))


def build_inputs(n, fuse_repeat):
    """Both fused inputs for one N, and the time of the FuseOps call that made one."""
    chain = batchnorm_chain(n)
    composite = FuseOpsByPattern([("bn.unit", batchnorm_pattern())])(chain)
    prepared = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                         relax.transform.AnnotateTIROpPattern()])(chain)
    t_fuse, fused = best_of(lambda: relax.transform.FuseOps()(prepared), fuse_repeat)
    return chain, composite, prepared, fused, t_fuse


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    largest = max(args.sizes)

    inputs = {n: build_inputs(n, 1 if n == largest else 2) for n in args.sizes}
    # DefuseOps timings are interleaved across sizes, so that every size sees the same
    # heap and cache state; timing the sizes one after another (with the slow baselines
    # in between) moved the 4000/1000 ratio by +-0.5 from run to run.
    defuse = DefuseOps()
    t_comp = {n: float("inf") for n in args.sizes}
    t_fo = {n: float("inf") for n in args.sizes}
    for _ in range(args.repeat):
        for n, (chain, composite, prepared, fused, _) in inputs.items():
            t_comp[n] = min(t_comp[n], best_of(lambda: defuse(composite), 1)[0])
            t_fo[n] = min(t_fo[n], best_of(lambda: defuse(fused), 1)[0])
    for n, (chain, composite, prepared, fused, _) in inputs.items():
        assert tvm_ffi.structural_equal(defuse(composite), chain), "composite not restored"
        restored = defuse(fused)
        assert relax.analysis.check_well_formed(restored)
        assert len(restored.functions) == len(prepared.functions)

    print(f"apache-tvm {tvm.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}; DefuseOps: min of {args.repeat} interleaved runs; "
          f"InlinePrivateFunctions and FuseOps: min of 2 (1 at N={largest})\n")
    print("| N | DefuseOps on FuseOpsByPattern | InlinePrivateFunctions | speed-up "
          "| FuseOps | DefuseOps on FuseOps (call sites) | FuseOps / DefuseOps |")
    print("|---|---|---|---|---|---|---|")
    for n, (chain, composite, prepared, fused, t_fuse) in inputs.items():
        t_inline, inlined = best_of(
            lambda: relax.transform.InlinePrivateFunctions()(composite),
            1 if n == largest else 2)
        assert len(inlined.functions) == 1
        print(f"| {n} | {t_comp[n]:.3f} s | {t_inline:.3f} s | {t_inline / t_comp[n]:.1f}x "
              f"| {t_fuse:.3f} s | {t_fo[n]:.3f} s ({_fused_calls(fused)}) "
              f"| {t_fuse / t_fo[n]:.1f}x |")
    if 1000 in t_comp and 4000 in t_comp:
        print(f"\nlinearity: DefuseOps time(4000) / time(1000) = "
              f"{t_comp[4000] / t_comp[1000]:.2f} on FuseOpsByPattern output, "
              f"{t_fo[4000] / t_fo[1000]:.2f} on FuseOps output (4.0 is linear; "
              f"target <= 4.5)")


if __name__ == "__main__":
    main()
