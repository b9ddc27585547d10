"""``layernorm.collapse`` on a chain of N written-out layer norms, up to 144,000 bindings.

Run ``python benchmarks/bench_layernorm.py`` (``--norms 1000 4000 16000``, ``--repeat 3``,
``--before DIR`` to time an older checkout of patternkit beside this one, ``--no-anchor``).

The workload is what an ONNX export below opset 17 gives for every LayerNorm, 9
bindings a norm, each norm feeding the next::

    m = mean(x, -1); d = x - m; v = mean(d ** 2, -1); s = sqrt(v + eps)
    y = d / s * gamma + beta            # gamma, beta: per-norm constants

so 16,000 norms are 144,000 bindings, the size of the anchor: onnxscript's layer-norm
fusion, quoted at about 92 us per node there (13 s for 144k nodes); the goal is at least
3x faster per binding.  The chain is built with a ``BlockBuilder`` (untimed).  Each N
runs in a fresh process, timing ``pk.rewrite`` with the one rule ``--repeat`` times and
keeping the best CPU time (``time.process_time``); the function index a run leaves for
the next pass is dropped before every run (so each run indexes its input, as the first
run on a module does); the process checks that the rule collapsed every norm (N
``nn.layer_norm`` calls, no ``sqrt`` left).

The anchor is measured in the same run when onnxscript is installed (``pip install -e
'.[bench]'``; ``--no-anchor`` skips it): a fresh process per N builds the same chain as
an ONNX graph (opset 18, ``ReduceMean`` / ``Sub`` / ``Pow`` / ``ReduceMean`` / ``Add`` /
``Sqrt`` / ``Div`` / ``Mul`` / ``Add``, gamma and beta initializers, shapes inferred so
that its rule's dtype check can pass), and times onnxscript's
``fuse_layer_normalization`` on it once (it rewrites the model in place), checking that
it made N ``LayerNormalization`` nodes.  A quoted figure from another machine says
nothing about this one: the speed-up is the ratio of the two times measured here.  The
parent prints one JSON line per N and a summary: microseconds per binding at each N,
relative to the smallest (linear growth keeps it flat), and the speed-up over the anchor
at each N (measured, and against the quoted 92 us).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkout import child_env, import_checkout_library  # noqa: E402

BINDINGS_PER_NORM = 9
HIDDEN = 16
X_SHAPE = (2, 4, HIDDEN)
ANCHOR_US_PER_NODE = 92.0  # onnxscript's layer-norm fusion at 144k nodes


def layernorm_chain(n: int):
    """A module whose ``main`` applies ``n`` written-out layer norms one after another."""
    from tvm import relax

    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType(X_SHAPE, "float32"))
    eps = relax.const(1e-5, "float32")
    two = relax.const(2.0, "float32")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            cur = x
            for i in range(n):
                gamma = relax.const(rng.uniform(0.5, 1.5, HIDDEN).astype("float32"))
                beta = relax.const(rng.uniform(-0.5, 0.5, HIDDEN).astype("float32"))
                mean = bb.emit(relax.op.mean(cur, axis=[-1], keepdims=True))
                d = bb.emit(relax.op.subtract(cur, mean))
                var = bb.emit(relax.op.mean(bb.emit(relax.op.power(d, two)), axis=[-1],
                                            keepdims=True))
                std = bb.emit(relax.op.sqrt(bb.emit(relax.op.add(var, eps))))
                scaled = bb.emit(relax.op.multiply(bb.emit(relax.op.divide(d, std)), gamma))
                out = relax.op.add(scaled, beta)
                cur = bb.emit(out) if i < n - 1 else bb.emit_output(out)
        bb.emit_func_output(cur)
    return bb.get()


def measure(n: int, repeat: int) -> dict:
    import patternkit as pk
    from patternkit.engine.index import forget_indexes
    from patternkit.ir import op_name
    from patternkit.patterns import LIBRARY

    start = time.process_time()
    mod = layernorm_chain(n)
    build_s = time.process_time() - start
    bindings = sum(len(block.bindings) for block in mod["main"].body.blocks)
    rule = LIBRARY.find("layernorm.collapse")
    best, out = float("inf"), None
    for _ in range(repeat):
        out = None
        forget_indexes()  # each run indexes its input, as the first run on a module does
        gc.collect()
        start = time.process_time()
        out = pk.rewrite([rule], mod)
        best = min(best, time.process_time() - start)
    ops = [op_name(b.value) for block in out["main"].body.blocks for b in block.bindings]
    collapsed = ops.count("relax.nn.layer_norm")
    if collapsed != n or "relax.sqrt" in ops:
        raise SystemExit(f"layernorm.collapse collapsed {collapsed} of {n} norms")
    return {"norms": n, "bindings": bindings, "build_s": round(build_s, 2),
            "rewrite_s": round(best, 3), "us_per_binding": round(best / bindings * 1e6, 2),
            "collapsed": collapsed, "peak_rss_mb": _peak_rss_mb()}


def _peak_rss_mb() -> float:
    """The peak resident set size of the process so far, in MB (Linux reports KB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def onnx_layernorm_chain(n: int):
    """The chain of :func:`layernorm_chain` as an ONNX ``ModelProto``, shapes inferred."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes"),
                    numpy_helper.from_array(np.array(1e-5, dtype=np.float32), "eps"),
                    numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")]
    nodes, cur = [], "x"
    for i in range(n):
        gamma, beta, p = f"gamma{i}", f"beta{i}", f"n{i}_"
        initializers += [
            numpy_helper.from_array(rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32), gamma),
            numpy_helper.from_array(rng.uniform(-0.5, 0.5, HIDDEN).astype(np.float32), beta)]
        nodes += [helper.make_node("ReduceMean", [cur, "axes"], [p + "mean"], keepdims=1),
                  helper.make_node("Sub", [cur, p + "mean"], [p + "d"]),
                  helper.make_node("Pow", [p + "d", "two"], [p + "d2"]),
                  helper.make_node("ReduceMean", [p + "d2", "axes"], [p + "var"], keepdims=1),
                  helper.make_node("Add", [p + "var", "eps"], [p + "var_eps"]),
                  helper.make_node("Sqrt", [p + "var_eps"], [p + "std"]),
                  helper.make_node("Div", [p + "d", p + "std"], [p + "normed"]),
                  helper.make_node("Mul", [p + "normed", gamma], [p + "scaled"]),
                  helper.make_node("Add", [p + "scaled", beta], [p + "out"])]
        cur = p + "out"
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "layernorm_chain", [value("x", TensorProto.FLOAT, X_SHAPE)],
                              [value(cur, TensorProto.FLOAT, X_SHAPE)], initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(proto)


def measure_anchor(n: int) -> dict:
    """Onnxscript's layer-norm fusion on the ONNX form of the chain (one run: in place)."""
    import onnx_ir
    from onnxscript.rewriter.rules.fusion._layer_norm import fuse_layer_normalization

    model = onnx_ir.serde.deserialize_model(onnx_layernorm_chain(n))
    nodes = sum(1 for _ in model.graph)
    gc.collect()
    start = time.process_time()
    fuse_layer_normalization(model)
    seconds = time.process_time() - start
    fused = sum(1 for node in model.graph if node.op_type == "LayerNormalization")
    if fused != n:
        raise SystemExit(f"onnxscript fused {fused} of {n} norms")
    return {"norms": n, "nodes": nodes, "anchor_s": round(seconds, 3),
            "anchor_us_per_node": round(seconds / nodes * 1e6, 2)}


def _child(args: list[str], code: str | None = None) -> dict:
    """Run this script's ``args`` in a fresh process; ``code``: a checkout of patternkit
    to import instead of the installed one (``--before``).
    """
    cmd = [sys.executable, __file__, *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=child_env(code)).stdout
    return json.loads(out.strip().splitlines()[-1])


def _have_onnxscript() -> bool:
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--norms", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-anchor", action="store_true",
                        help="do not time onnxscript's fusion beside ours")
    parser.add_argument("--before", metavar="DIR",
                        help="also time the rewrite with the patternkit checked out in DIR "
                             "(git archive of an older commit), side by side")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--anchor-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import_checkout_library()
        print(json.dumps(measure(args.child, args.repeat)))
        return
    if args.anchor_child:
        print(json.dumps(measure_anchor(args.anchor_child)))
        return
    anchor = not args.no_anchor and _have_onnxscript()
    if not args.no_anchor and not anchor:
        print("onnxscript is not installed (pip install -e '.[bench]'): the anchor is not "
              "measured, only quoted", file=sys.stderr)
    rows = []
    for n in args.norms:
        row = _child(["--child", str(n), "--repeat", str(args.repeat)])
        if args.before:
            before = _child(["--child", str(n), "--repeat", str(args.repeat)], args.before)
            row["before_us_per_binding"] = before["us_per_binding"]
            row["before_peak_rss_mb"] = before["peak_rss_mb"]
            row["after_over_before"] = round(row["us_per_binding"] / before["us_per_binding"], 2)
        if anchor:
            row.update(_child(["--anchor-child", str(n)]))
            speedup = row["anchor_us_per_node"] / row["us_per_binding"]
            row["speedup_over_anchor"] = round(speedup, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["us_per_binding"]
    largest = rows[-1]["us_per_binding"]
    growth = {r["bindings"]: round(r["us_per_binding"] / base, 2) for r in rows}
    summary = {"summary": True, "us_per_binding_vs_smallest": growth,
               "speedup_over_quoted_anchor_at_largest": round(ANCHOR_US_PER_NODE / largest, 1)}
    if anchor:
        summary["speedup_over_measured_anchor"] = {r["bindings"]: r["speedup_over_anchor"]
                                                   for r in rows}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
