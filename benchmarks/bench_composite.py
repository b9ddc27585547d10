"""MergeComposite vs TVM's FuseOpsByPattern on a ResNet-style chain (16, 50, 160 blocks).

Run ``python benchmarks/bench_composite.py`` (``--blocks 16 50 160``, ``--repeat 5``).
The chain is ``conv2d -> batch_norm -> relu`` blocks with a residual ``add`` every second
block (the shape of ResNet's basic blocks), built with constant weights; batch norms are
folded into conv + bias first with :class:`patterns.conv.BatchnormFoldIntoConv` (not
timed, as Relay's ``prerequisite_optimize``).  Then, on the same module and the same
pattern table (``conv2d -> optional add -> optional relu`` and a residual ``add -> relu``):

* ``MergeComposite(table)``  (patternkit, local composite functions, Relay semantics);
* ``FuseOpsByPattern(table.to_fusion_patterns())``  (TVM, private global functions).

Reported: best-of-``repeat`` seconds for each, the ratio, and microseconds per block
(flat across sizes means linear).  Target: ratio <= 2 and linear growth.

``--layernorms 100 200 400`` times a second workload instead: the chain of written-out
layer norms of ``bench_layernorm.py`` (9 bindings a norm, ONNX below opset 17), with one
composite a TVM user would write for it in ``tvm.relax.dpl`` (mean / subtract / power /
mean / add eps / sqrt / divide / multiply gamma / add beta), handed to both passes as
the same ``FusionPattern`` (``PatternTable.from_tvm``: TVM's matching semantics on both
sides).  ``FuseOpsByPattern`` is quadratic on it (``docs/tvm-bugs.md``), so the sizes
are small and the microseconds are per binding.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from tvm import relax

import patternkit as pk
from patternkit.byoc import MergeComposite, PatternTable, composite_counts
from patternkit.dpl.pattern import is_op, wildcard
from patternkit.patterns.conv import BatchnormFoldIntoConv, conv2d_add_relu


def resnet_chain(blocks: int, channels: int = 8, size: int = 8, seed: int = 0):
    """``blocks`` x (conv3x3 -> BN -> relu), residual add + relu after every second one."""
    rng = np.random.default_rng(seed)

    def const(*shape, low=None):
        arr = rng.uniform(0.5, 1.5, shape) if low else rng.standard_normal(shape) * 0.1
        return relax.const(arr.astype("float32"))

    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            v = skip = x
            for i in range(blocks):
                c = bb.emit(relax.op.nn.conv2d(v, const(channels, channels, 3, 3), padding=1))
                bn = bb.emit(relax.op.nn.batch_norm(c, const(channels, low=True), const(channels),
                                                    const(channels), const(channels, low=True),
                                                    axis=1, training=False))
                y = bb.emit(relax.TupleGetItem(bn, 0))
                if i % 2 == 1:
                    y = bb.emit(relax.op.add(y, skip))
                v = bb.emit(relax.op.nn.relu(y))
                if i % 2 == 1:
                    skip = v
            out = bb.emit_output(v)
        bb.emit_func_output(out)
    return bb.get()


def table() -> PatternTable:
    return PatternTable([
        ("ccompiler.conv_add_relu", conv2d_add_relu()),
        ("ccompiler.add_relu", is_op("nn.relu")(is_op("add")(wildcard(), wildcard()))),
    ])


def layernorm_table() -> PatternTable:
    """The written-out layer norm as one TVM ``FusionPattern``, as a TVM user writes it."""
    from tvm.relax.dpl import is_const, is_op as tvm_op, wildcard as tvm_wildcard

    x = tvm_wildcard()
    d = tvm_op("relax.subtract")(x, tvm_op("relax.mean")(x))
    var = tvm_op("relax.mean")(tvm_op("relax.power")(d, is_const()))
    std = tvm_op("relax.sqrt")(tvm_op("relax.add")(var, is_const()))
    scaled = tvm_op("relax.multiply")(tvm_op("relax.divide")(d, std), is_const())
    norm = tvm_op("relax.add")(scaled, is_const())
    return PatternTable.from_tvm([relax.transform.FusionPattern("ccompiler.layer_norm", norm)])


def both_passes(tab: PatternTable, repeat: int):
    """A timer of both passes on one table: ``mod -> (MergeComposite s, FuseOpsByPattern s,
    composite counts)``, best of ``repeat`` each; both must form the same composites.
    """
    merge = MergeComposite(tab)
    fuse = relax.transform.FuseOpsByPattern(tab.to_fusion_patterns())

    def time_both(mod):
        t_mc, out_mc = best(lambda: merge(mod), repeat)
        t_fu, out_fu = best(lambda: fuse(mod), repeat)
        counts_mc, counts_fu = composite_counts(out_mc), composite_counts(out_fu)
        assert counts_mc == counts_fu, (counts_mc, counts_fu)
        return t_mc, t_fu, counts_mc

    return time_both


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[16, 50, 160])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layernorms", type=int, nargs="+",
                        help="time the written-out layer-norm chain at these lengths instead")
    args = parser.parse_args()
    if args.layernorms:
        compare_on_layernorm_chains(args.layernorms, args.repeat)
        return
    time_both = both_passes(table(), args.repeat)
    print(f"{'blocks':>6} {'bindings':>8} {'MergeComposite s':>16} {'FuseOpsByPattern s':>18} "
          f"{'ratio':>6} {'us/block (MC)':>13}  composites")
    for n in args.blocks:
        mod = pk.rewrite([BatchnormFoldIntoConv()], resnet_chain(n))
        bindings = sum(len(b.bindings) for b in mod["main"].body.blocks)
        t_mc, t_fu, counts = time_both(mod)
        print(f"{n:>6} {bindings:>8} {t_mc:>16.4f} {t_fu:>18.4f} {t_mc / t_fu:>6.2f} "
              f"{1e6 * t_mc / n:>13.0f}  {counts}")


def compare_on_layernorm_chains(lengths: list[int], repeat: int) -> None:
    from bench_layernorm import BINDINGS_PER_NORM, layernorm_chain

    time_both = both_passes(layernorm_table(), repeat)
    print(f"{'norms':>6} {'bindings':>8} {'MergeComposite s':>16} {'FuseOpsByPattern s':>18} "
          f"{'ratio':>6} {'us/binding (MC)':>15} {'us/binding (TVM)':>16}  composites")
    for n in lengths:
        bindings = n * BINDINGS_PER_NORM
        t_mc, t_fu, counts = time_both(layernorm_chain(n))
        assert counts == {"ccompiler.layer_norm": n}, counts
        print(f"{n:>6} {bindings:>8} {t_mc:>16.4f} {t_fu:>18.4f} {t_mc / t_fu:>6.3f} "
              f"{1e6 * t_mc / bindings:>15.1f} {1e6 * t_fu / bindings:>16.1f}  {counts}")


if __name__ == "__main__":
    main()
