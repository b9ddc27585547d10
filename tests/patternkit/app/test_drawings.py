"""The job's drawings: a picture within the layout budget, whatever the model's size."""

from __future__ import annotations

import numpy as np
from tvm import relax

from patternkit.app import drawings
from patternkit.viz import viz_expr
from patternkit.viz.display import DotUnavailable


def _deep(layers: int):
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(x))
            for _ in range(layers):
                y = bb.emit(relax.op.matmul(h, relax.const(np.eye(4, dtype="float32"))))
                y = bb.emit(relax.op.tanh(y))
                y = bb.emit(relax.op.multiply(y, relax.const(np.ones(4, "float32"))))
                h = bb.emit(relax.op.add(h, y))
            out = bb.emit_output(relax.op.sum(h))
        bb.emit_func_output(out)
    return bb.get()


def test_a_model_too_big_to_lay_out_is_drawn_with_its_layers_folded(tmp_path, monkeypatch):
    monkeypatch.setattr(drawings, "AS_IS_NODES", 50)
    mod = _deep(40)  # 162 bindings
    drawn = drawings.draw_job(tmp_path, {"before": mod}, mod, mod)
    assert drawn["before"].startswith("repeated layers drawn once")
    assert "repeated x40" in drawn["before"]
    assert "x40" in (tmp_path / "before.svg").read_text()  # the count is in the picture


def test_when_no_layout_finishes_the_output_neighbourhood_is_drawn(tmp_path, monkeypatch):
    from patternkit.viz.graph import VizGraph

    real = VizGraph.render
    calls = []

    def only_the_third_lays_out(self, path, format="svg"):
        calls.append(len(self.model.nodes))
        if len(calls) < 3:
            raise DotUnavailable("Graphviz layout did not finish within 8 s")
        return real(self, path, format)

    monkeypatch.setattr(VizGraph, "render", only_the_third_lays_out)
    mod = _deep(40)

    def draw(mode, **options):
        if mode == "output":
            options["focus"] = "lv160"  # the last binding
        return viz_expr(mod, **options), ""

    how = drawings.draw_picture(tmp_path / "p", draw)
    assert how.startswith("the output's neighbourhood only") and len(calls) == 3
    assert calls[2] < calls[0]  # a smaller picture than the whole
    assert (tmp_path / "p.svg").is_file()


def test_the_full_drawing_is_available_on_request(tmp_path):
    mod = _deep(3)
    drawn = drawings.draw_job(tmp_path, {"before": mod}, mod, mod, full=True)
    assert drawn["before"].startswith("full drawing")


def test_a_picture_past_the_layout_budget_is_not_laid_out(tmp_path, monkeypatch):
    from patternkit.viz import graph as graph_module
    from patternkit.viz.fit import layout_size

    mod = _deep(40)
    whole = layout_size(viz_expr(mod).model)
    monkeypatch.setattr(drawings, "LAYOUT_BUDGET", whole - 1)  # as it is: just past
    laid_out: list[int] = []
    real = graph_module.run_dot

    def counted(source: str, fmt: str, timeout: float) -> bytes:
        laid_out.append(source.count(" -> "))
        return real(source, fmt, timeout)

    monkeypatch.setattr(graph_module, "run_dot", counted)
    drawn = drawings.draw_job(tmp_path, {"before": mod}, mod, mod)
    assert drawn["before"].startswith("repeated layers drawn once")
    assert "x40" in (tmp_path / "before.svg").read_text()
    folded = laid_out[0]
    assert folded < len(viz_expr(mod).model.edges) / 4  # the whole was never laid out
    # the last resort is drawn whatever its size: a picture is always written
    monkeypatch.setattr(drawings, "LAYOUT_BUDGET", 0)
    how = drawings.draw_picture(tmp_path / "p", drawings._expr_drawer(mod, "main"))
    assert how.startswith("the output's neighbourhood only")
    assert (tmp_path / "p.svg").is_file()


def _rewritten_deep(layers: int):
    """A chain of matmul and SiLU before and after the library's rewrite, and its log."""
    import patternkit as pk
    from patternkit.patterns import LIBRARY

    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(layers):  # x * sigmoid(x): silu.collapse's form
                y = bb.emit(relax.op.matmul(h, relax.const(np.eye(4, dtype="float32"))))
                h = bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))))
            out = bb.emit_output(relax.op.sum(h))
        bb.emit_func_output(out)
    before = bb.get()
    log = pk.RewriteLog()
    return before, pk.rewrite(LIBRARY.rewrite_rules(), before, log=log), log


def test_the_diff_is_built_once_for_every_context_tried(tmp_path, monkeypatch):
    from patternkit.viz import diff as diff_module, viz_diff

    before, after, log = _rewritten_deep(6)
    built: list[object] = []
    real = diff_module.build_model

    def counted(obj, options):
        built.append(obj)
        return real(obj, options)

    monkeypatch.setattr(diff_module, "build_model", counted)
    monkeypatch.setattr(drawings, "LAYOUT_BUDGET", 0)  # context 2 and 1 tried, then skipped
    drawn = drawings.draw_job(tmp_path, {}, before, after, changes=log)
    assert drawn["diff"].startswith("the output's neighbourhood only")
    assert len(built) == 2  # before and after, once: not once per context (6)
    drawn_svg = (tmp_path / "diff.svg").read_text()
    alone = viz_diff(before, after, changes=log, context=0, functions=["main"],
                     collapse="all")
    assert drawn_svg == alone.pipe("svg").decode("utf-8")  # the same picture as one-shot
