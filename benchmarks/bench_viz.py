"""Visualiser benchmarks: model + DOT on a 24,000-binding function, auto-collapse on ResNet-50.

Run ``python benchmarks/bench_viz.py`` (``--bindings``/``--repeat`` to change the size and
the number of timed runs).  Two measurements, and a third on request:

1. ``viz_expr`` graph model + DOT text (no layout) for one Relax function of 24,000
   bindings (add / multiply / relu with scalar constants).  Target: under 1 s.
2. A ResNet-50-shaped module (stem, 3-4-6-3 bottlenecks, 53 convolutions with bias and
   ReLU, residual adds, pooling, dense head; channels divided by ``--width-div`` to keep
   the weights small, the graph is the same size) partitioned with
   ``FuseOpsByPattern``: node count before and after ``collapse="auto"``, and ``dot``
   layout time for both when Graphviz is installed.
3. With ``--job DIR`` (a ``patternkit run --out DIR`` folder): the job's drawings of its
   ``before.py`` and ``after.py`` redrawn (:func:`patternkit.app.drawings.draw_job`:
   before, after, their diff with the job's rewrite log, made again from the rules its
   ``report.json`` names) into a temporary folder, best of ``--repeat``: wall, the
   process's CPU, ``dot``'s CPU, the number of ``dot`` layouts, and how each was drawn.

    patternkit run "zoo:gpt2?layers=12" --out out && python benchmarks/bench_viz.py --job out
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.relax.op import add, multiply, nn
from tvm.relax.transform import FuseOpsByPattern

from patternkit.viz import viz_expr
from patternkit.viz.build import build_model
from patternkit.viz.display import DotUnavailable, dot_binary, run_dot
from patternkit.viz.dot import to_dot
from patternkit.viz.model import gc_paused
from patternkit.viz.options import make_options


def long_chain(bindings: int):
    x = relax.Var("x", relax.TensorType((1, 64, 56, 56), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            v = x
            for i in range(bindings // 3):
                a = bb.emit(add(v, relax.const(float(i % 7), "float32")))
                m = bb.emit(multiply(a, v))
                v = bb.emit(nn.relu(m))
            out = bb.emit_output(v)
        bb.emit_func_output(out)
    return bb.get()


def resnet50_like(width_div: int = 4):
    rng = np.random.default_rng(0)

    def const(shape):
        return relax.const(rng.standard_normal(shape).astype("float32") * 0.01)

    x = relax.Var("data", relax.TensorType((1, 3, 224, 224), "float32"))
    bb = relax.BlockBuilder()

    def conv(v, cin, cout, k, stride=1, relu=True):
        pad = k // 2
        c = bb.emit(nn.conv2d(v, const((cout, cin, k, k)), strides=stride, padding=pad))
        c = bb.emit(add(c, const((1, cout, 1, 1))))
        return bb.emit(nn.relu(c)) if relu else c

    with bb.function("main", [x]):
        with bb.dataflow():
            w = 64 // width_div
            v = conv(x, 3, w, 7, stride=2)
            v = bb.emit(nn.max_pool2d(v, pool_size=3, strides=2, padding=1))
            cin = w
            for stage, blocks in enumerate((3, 4, 6, 3)):
                mid = (64 << stage) // width_div
                cout = mid * 4
                for b in range(blocks):
                    stride = 2 if b == 0 and stage > 0 else 1
                    h = conv(v, cin, mid, 1)
                    h = conv(h, mid, mid, 3, stride=stride)
                    h = conv(h, mid, cout, 1, relu=False)
                    short = conv(v, cin, cout, 1, stride=stride, relu=False) if b == 0 else v
                    v = bb.emit(nn.relu(bb.emit(add(h, short))))
                    cin = cout
            v = bb.emit(nn.adaptive_avg_pool2d(v, output_size=1))
            v = bb.emit(relax.op.reshape(v, (1, cin)))
            v = bb.emit(relax.op.matmul(v, const((cin, 1000))))
            out = bb.emit_output(add(v, const((1000,))))
        bb.emit_func_output(out)
    mod = bb.get()
    conv_p = is_op("relax.nn.conv2d")(wildcard(), is_const())
    bias = is_op("relax.add")(conv_p, is_const())
    patterns = [
        ("dnnl.conv2d_bias_relu", is_op("relax.nn.relu")(bias)),
        ("dnnl.conv2d_bias", bias),
        ("dnnl.add_relu", is_op("relax.nn.relu")(is_op("relax.add")(wildcard(), wildcard()))),
    ]
    return FuseOpsByPattern(patterns, bind_constants=True)(mod)


def best_of(repeat: int, fn):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def timed_layout(source: str, timeout: float) -> str:
    if dot_binary() is None:
        return "n/a (no dot)"
    t = time.perf_counter()
    try:
        run_dot(source, "svg", timeout)
    except DotUnavailable as e:
        return f"failed: {e}"
    return f"{time.perf_counter() - t:.2f} s"


def _rewrite_log(folder: Path, before):
    """The job's rewrite log, made again: its rules (``report.json``) on ``before``.

    The job draws its diff with the log (each rule's root labelled, the bindings it
    replaced removed); the rewrite is deterministic, so the log is the job's.
    """
    import json

    from patternkit.app.rules import resolve_rules
    from patternkit.engine.driver import RewriteLog, rewrite

    names = json.loads((folder / "report.json").read_text())["patterns"]
    log = RewriteLog()
    rewrite(resolve_rules(names).rewrite_rules(), before, log=log)
    return log


def job_drawings(folder: Path, repeat: int) -> None:
    """Redraw a job's before/after/diff ``repeat`` times; print the best run's costs."""
    from patternkit.app import drawings
    from patternkit.app.loading import load_model
    from patternkit.viz import graph as graph_module

    before, _ = load_model(str(folder / "before.py"))
    after, _ = load_model(str(folder / "after.py"))
    changes = _rewrite_log(folder, before)
    layouts: list[int] = []
    real = graph_module.run_dot

    def counted(source: str, fmt: str, timeout: float) -> bytes:
        layouts.append(len(source))
        return real(source, fmt, timeout)

    graph_module.run_dot = counted  # type: ignore[assignment]
    best = None
    for _ in range(repeat):
        layouts.clear()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu, wall = time.process_time(), time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            drawn = drawings.draw_job(Path(out), {"before": before, "after": after},
                                      before, after, changes=changes)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        done = resource.getrusage(resource.RUSAGE_CHILDREN)
        dot_cpu = done.ru_utime + done.ru_stime - children.ru_utime - children.ru_stime
        if best is None or wall < best[0]:
            best = (wall, cpu, dot_cpu, len(layouts), drawn)
    graph_module.run_dot = real
    assert best is not None
    wall, cpu, dot_cpu, count, drawn = best
    print(f"[job drawings] {folder}: wall {wall:.2f} s, CPU {cpu:.2f} s + dot {dot_cpu:.2f} s, "
          f"{count} dot layouts (best of {repeat})")
    for name, how in drawn.items():
        print(f"[job drawings]   {name}.svg: {how}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=int, default=24000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--width-div", type=int, default=4)
    parser.add_argument("--layout-timeout", type=float, default=120.0)
    parser.add_argument("--job", type=Path, default=None,
                        help="a `patternkit run --out` folder: time its drawings only")
    args = parser.parse_args()
    if args.job is not None:
        job_drawings(args.job, args.repeat)
        return

    mod = long_chain(args.bindings)
    opts = make_options(collapse="none")
    # viz_expr pauses the cyclic GC during the walk and the DOT writer; measure the same.
    with gc_paused():
        t_model, model = best_of(args.repeat, lambda: build_model(mod, opts))
        t_dot, source = best_of(args.repeat, lambda: to_dot(model, opts))
    t_total, _ = best_of(args.repeat, lambda: viz_expr(mod).source)
    print(f"[long chain] {args.bindings} bindings -> {len(model.nodes)} nodes, "
          f"{len(source) / 1e6:.1f} MB DOT")
    print(f"[long chain] model {t_model:.3f} s + DOT {t_dot:.3f} s = {t_model + t_dot:.3f} s "
          f"(viz_expr(...).source end to end {t_total:.3f} s; target < 1 s)")

    resnet = resnet50_like(args.width_div)
    full = viz_expr(resnet, collapse="none")
    t_auto, auto = best_of(args.repeat, lambda: viz_expr(resnet))
    s = full.model.summary()
    print(f"[resnet50] composites {sum(s['composites'].values())} {s['composites']}")
    print(f"[resnet50] expanded: {len(full.model.nodes)} nodes, "
          f"{len(full.model.clusters)} clusters; "
          f"auto-collapse: {len(auto.model.nodes)} nodes (max_nodes={auto.options.max_nodes}) "
          f"in {t_auto:.3f} s")
    print(f"[resnet50] dot layout: expanded {timed_layout(full.source, args.layout_timeout)}, "
          f"auto-collapsed {timed_layout(auto.source, args.layout_timeout)}")


if __name__ == "__main__":
    main()
