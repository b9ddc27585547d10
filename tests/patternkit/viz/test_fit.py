"""Drawings that fit: long chains in columns, no side past the pixel limit, ``patternkit viz``."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import tvm
from tvm import relax

from patternkit.app import drawings
from patternkit.app.cli import main
from patternkit.viz import VizError, fit as fitting, viz_expr
from patternkit.viz.dot import column_of
from patternkit.viz.fit import MAX_PX, fit, svg_size
from patternkit.viz.repeats import find_repeat

needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="the Graphviz 'dot' binary is not installed")

CHAIN_PY = '''
import numpy as np
from tvm import relax

UNARY = (relax.op.nn.relu, relax.op.tanh, relax.op.sigmoid, relax.op.negative, relax.op.exp,
         relax.op.abs, relax.op.sin, relax.op.cos)
rng = np.random.default_rng(7)
x = relax.Var("x", relax.TensorType((2, 4), "float32"))
bb = relax.BlockBuilder()
with bb.function("main", [x]):
    with bb.dataflow():
        h = x
        for _ in range({length}):
            h = bb.emit(UNARY[rng.integers(len(UNARY))](h))
        out = bb.emit_output(h)
    bb.emit_func_output(out)
mod = bb.get()
'''


BLOCKS_PY = '''
import numpy as np
from tvm import relax

x = relax.Var("x", relax.TensorType((2, 4), "float32"))
bb = relax.BlockBuilder()
with bb.function("main", [x]):
    with bb.dataflow():
        h = bb.emit(relax.op.nn.relu(x))
        for i in range({count}):
            w = relax.const(np.full((4, 4), i, "float32"))
            y = bb.emit(relax.op.matmul(h, w))
            y = bb.emit(relax.op.tanh(bb.emit(relax.op.add(y, relax.const(np.ones(4, "float32"))))))
            h = bb.emit(relax.op.add(h, y))
        out = bb.emit_output(relax.op.sum(h))
    bb.emit_func_output(out)
mod = bb.get()
'''


def _module(text: str) -> tvm.IRModule:
    namespace: dict = {}
    exec(text, namespace)  # the very module the command-line tests load from a file
    return namespace["mod"]


def _blocks(count: int) -> tvm.IRModule:
    """A relu, ``count`` layers ``h + tanh(h @ w + 1)``, a sum: a layer to fold."""
    return _module(BLOCKS_PY.format(count=count))


def _chain(length: int) -> tvm.IRModule:
    """One long chain of unary ops in a random order: nothing repeats, nothing to fold."""
    return _module(CHAIN_PY.format(length=length))


def _diamonds(count: int) -> tvm.IRModule:
    """``count`` blocks ``relu(tanh(h) + sigmoid(h))``: one edge enters each block's relu."""
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(count):
                a = bb.emit(relax.op.tanh(h))
                b = bb.emit(relax.op.sigmoid(h))
                h = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(a, b))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def test_svg_size_reads_points_as_96_dpi_pixels():
    assert svg_size('<svg width="429pt" height="6891pt"\n viewBox="0 0 429 6891">') == (572, 9188)
    assert svg_size(b'<svg width="100px" height="50px">') == (100, 50)
    with pytest.raises(ValueError, match="width and height"):
        svg_size("<html></html>")


def test_columns_are_cut_where_the_fewest_edges_cross():
    graph = viz_expr(_diamonds(8))
    column = column_of(graph.model, 4)
    order = list(graph.model.nodes)
    assert sorted(set(column.values())) == [0, 1, 2, 3]
    assert [column[n] for n in order] == sorted(column[n] for n in order)  # runs, in order
    crossing = [e for e in graph.model.edges if column[e.src] != column[e.dst]]
    # elsewhere two edges cross (both branches, or the block's input read twice)
    assert len(crossing) == 3
    assert all(graph.model.nodes[e.dst].op == "relax.nn.relu" for e in crossing)


def test_only_edges_between_columns_leave_the_ranks_free():
    graph = viz_expr(_chain(40))
    assert "constraint=" not in graph.source and " size=" not in graph.source
    dot = viz_expr(_chain(40), columns=3).source
    edges = [line for line in dot.splitlines() if " -> " in line]
    assert len([e for e in edges if 'constraint="false"' in e]) == 2
    assert 'size="20.83,20.83"' in viz_expr(_chain(40), max_side=2000).source


@needs_dot
def test_a_long_chain_is_laid_out_in_columns_that_fit():
    mod = _chain(120)
    assert find_repeat(mod["main"]) is None
    graph = viz_expr(mod)
    width, height = svg_size(graph.pipe("svg"))
    assert height > MAX_PX and height > 10 * width  # before: one column past the limit
    source = graph.source
    fitted = fit(graph)
    assert fitted.note.startswith("laid out in ") and "columns" in fitted.note
    assert max(fitted.width, fitted.height) <= MAX_PX
    assert fitted.height < height / 2 and fitted.height < 3 * fitted.width
    assert (fitted.width, fitted.height) == svg_size(fitted.graph.pipe("svg"))
    assert graph.source == source and graph.options.columns == 1  # the input is unchanged


@needs_dot
def test_what_columns_cannot_fit_is_scaled_down_to_the_limit():
    fitted = fit(viz_expr(_chain(30)), max_px=400)
    assert "scaled down" in fitted.note
    assert max(fitted.width, fitted.height) <= 400 + 1


@needs_dot
def test_a_small_drawing_is_left_as_it_is():
    graph = viz_expr(_chain(3))
    fitted = fit(graph)
    assert fitted.graph is graph and fitted.note == ""


def _size(path: Path) -> tuple[int, int]:
    return svg_size(path.read_bytes())


@needs_dot
def test_viz_command_fits_a_long_chain_and_draws_it_whole_with_full(tmp_path, capsys):
    model = tmp_path / "chain.py"
    model.write_text(CHAIN_PY.format(length=120))
    fitted, whole = tmp_path / "fitted.svg", tmp_path / "whole.svg"
    assert main(["viz", str(model), "-o", str(fitted)]) == 0
    assert "laid out in" in capsys.readouterr().out
    assert main(["viz", str(model), "-o", str(whole), "--full", "--quiet"]) == 0
    assert max(_size(fitted)) <= MAX_PX < _size(whole)[1]
    assert fitted.read_text().count("<g id=\"node") == whole.read_text().count("<g id=\"node")


@needs_dot
def test_viz_command_draws_repeated_layers_once_unless_full(tmp_path):
    model = tmp_path / "blocks.py"
    model.write_text(BLOCKS_PY.format(count=12))
    folded, whole = tmp_path / "folded.svg", tmp_path / "whole.svg"
    assert main(["viz", str(model), "-o", str(folded), "--quiet"]) == 0
    assert main(["viz", str(model), "-o", str(whole), "--quiet", "--full"]) == 0
    text = folded.read_text()
    assert "repeated x12 is drawn once" in text
    nodes = [len(re.findall(r'<g id="node', p.read_text())) for p in (folded, whole)]
    assert nodes[0] < nodes[1] / 4
    assert "repeated" not in whole.read_text()
    dot = tmp_path / "folded.dot"
    assert main(["viz", str(model), "-o", str(dot), "--quiet"]) == 0  # no layout, still folded
    assert "repeated x12 is drawn once" in dot.read_text()


def test_viz_help_says_collapse_takes_a_value_and_what_full_does(capsys):
    with pytest.raises(SystemExit):
        main(["viz", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--collapse auto|all|none|GLOB[,GLOB...]" in text
    assert "until at most 150 nodes remain" in text
    assert "--full" in text and "10,000 px" in text


@needs_dot
def test_the_job_lays_a_long_chain_out_in_columns(tmp_path):
    mod = _chain(120)
    drawn = drawings.draw_job(tmp_path, {"before": mod}, mod, mod)
    assert drawn["before"].startswith("as is; laid out in ")
    assert max(_size(tmp_path / "before.svg")) <= MAX_PX


@needs_dot
def test_the_job_folds_repeated_layers_before_it_scales_a_picture_down(tmp_path, monkeypatch):
    monkeypatch.setattr(fitting, "MAX_PX", 1200)
    mod = _blocks(12)
    drawn = drawings.draw_job(tmp_path, {"before": mod}, mod, mod)
    assert drawn["before"].startswith("repeated layers drawn once")
    assert "repeated x12 is drawn once" in drawn["before"]
    assert max(_size(tmp_path / "before.svg")) <= 1200 + 1


@needs_dot
def test_a_vit_drawn_by_patternkit_viz_shows_one_layer_and_fits():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from patternkit.app.loading import load_model

    mod, _ = load_model("zoo:vit?layers=3")
    graph, how = drawings.fitted_drawing(mod, func="main", options={})
    assert "bindings repeated x3 is drawn once" in how  # one copy per layer
    assert max(svg_size(graph.pipe("svg"))) <= MAX_PX
    whole, how_whole = drawings.fitted_drawing(mod, func="main", options={}, full=True,
                                               layout=False)
    assert how_whole == "" and len(whole.model.nodes) > len(graph.model.nodes) + 40


def test_bad_columns_or_max_side_are_named():
    with pytest.raises(VizError, match="columns= expects a non-negative int"):
        viz_expr(_chain(3), columns=-2)
    with pytest.raises(VizError, match="max_side= expects a non-negative int"):
        viz_expr(_chain(3), max_side="big")


def _fan(width: int) -> tvm.IRModule:
    """``width`` unary ops side by side on one input, concatenated: wide, not long."""
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = [bb.emit(relax.op.nn.relu(x)) for _ in range(width)]
            out = bb.emit_output(relax.op.concat(parts, axis=0))
        bb.emit_func_output(out)
    return bb.get()


def _counting_layouts(monkeypatch) -> list[str]:
    from patternkit.viz import graph as graph_module

    calls: list[str] = []
    real = graph_module.run_dot

    def counted(source: str, fmt: str, timeout: float) -> bytes:
        calls.append(source)
        return real(source, fmt, timeout)

    monkeypatch.setattr(graph_module, "run_dot", counted)
    return calls


@needs_dot
def test_a_drawing_too_big_is_scaled_without_a_second_layout(monkeypatch):
    graph = viz_expr(_chain(20))  # too short for columns, too tall for 400 px
    whole = graph.pipe("svg").decode("utf-8")
    calls = _counting_layouts(monkeypatch)
    fitted = fit(graph, max_px=400)
    assert len(calls) == 0  # the drawing's own layout is reused, not laid out again
    fitted = fit(viz_expr(_chain(20)), max_px=400)
    assert len(calls) == 1 and fitted.scaled and "scaled down" in fitted.note
    svg = fitted.graph.pipe("svg").decode("utf-8")
    assert max(svg_size(svg)) <= 400 and (fitted.width, fitted.height) == svg_size(svg)
    assert max(svg_size(whole)) > 400
    # the same drawing, smaller: every node and the laid-out coordinates kept
    view = re.compile(r'viewBox="[^"]*"')
    assert view.search(svg).group(0) == view.search(whole).group(0)
    assert svg.count('<g id="node') == whole.count('<g id="node') == len(graph.model.nodes)
    assert svg[svg.index("<g id=\"graph0"):] == whole[whole.index("<g id=\"graph0"):]
    # its DOT text asks Graphviz for the same size, so the source and the picture agree
    assert 'size="4.17,4.17"' in fitted.graph.source and len(calls) == 1


@needs_dot
def test_a_long_chain_costs_two_layouts_even_when_scaled(monkeypatch):
    calls = _counting_layouts(monkeypatch)
    fitted = fit(viz_expr(_chain(120)), max_px=1500)
    assert fitted.scaled and "columns" in fitted.note and len(calls) == 2
    assert max(fitted.width, fitted.height) <= 1500


@needs_dot
def test_a_wide_drawing_is_not_cut_into_columns(monkeypatch):
    graph = viz_expr(_fan(60))
    width, height = svg_size(graph.pipe("svg"))
    assert width > fitting.LONG_PX and width > fitting.ASPECT * height  # long, across ranks
    calls = _counting_layouts(monkeypatch)
    fitted = fit(graph)
    assert calls == [] and fitted.note == "" and fitted.graph is graph


def test_scale_svg_keeps_everything_but_the_outer_size():
    svg = ('<svg width="3000pt" height="600pt"\n viewBox="0.00 0.00 3000.00 600.00">'
           '<g id="graph0"><g id="node1"/></g></svg>')
    small = fitting.scale_svg(svg, 1000)
    assert svg_size(small) == (1000, 200)
    assert small.endswith(svg[svg.index("\n"):])
    assert fitting.scale_svg(svg, 10_000) == svg
    with pytest.raises(ValueError, match="width and height"):
        fitting.scale_svg('<svg width="10">', 5)


def test_layout_size_counts_the_ranks_long_edges_cross():
    chain = viz_expr(_chain(20)).model
    assert fitting.layout_size(chain) == len(chain.nodes) + len(chain.edges)
    for length in (3, 9):
        skip = viz_expr(_skip(length)).model  # one edge past ``length`` ranks
        assert fitting.layout_size(skip) == len(skip.nodes) + len(skip.edges) + length
    late = viz_expr(_late_input(9)).model  # an input read only at the end: placed there
    assert fitting.layout_size(late) == len(late.nodes) + len(late.edges)


def _late_input(length: int) -> tvm.IRModule:
    """``length`` tanh on ``x``, then ``+ y``: ``y`` has no input and one late reader."""
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    y = relax.Var("y", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            h = x
            for _ in range(length):
                h = bb.emit(relax.op.tanh(h))
            out = bb.emit_output(relax.op.add(h, y))
        bb.emit_func_output(out)
    return bb.get()


def _skip(length: int) -> tvm.IRModule:
    """``a = relu(x)``, ``length`` tanh after it, and ``a`` added to the last one."""
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = h = bb.emit(relax.op.nn.relu(x))
            for _ in range(length):
                h = bb.emit(relax.op.tanh(h))
            out = bb.emit_output(relax.op.add(h, a))
        bb.emit_func_output(out)
    return bb.get()
