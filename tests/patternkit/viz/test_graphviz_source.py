"""``VizGraph.to_graphviz()``: a real ``graphviz.Source`` that keeps the drawing's timeout."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from pathlib import Path

import graphviz
import pytest
from IPython.core.formatters import DisplayFormatter
from viz_cases import ConvBiasReluSoftmax, composite_module

from patternkit.viz import DotUnavailable, display as viz_display, viz_expr

needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="the Graphviz 'dot' binary is not installed")


def test_to_graphviz_is_a_graphviz_source_of_the_drawing_dot_text():
    graph = viz_expr(composite_module())
    source = graph.to_graphviz()
    assert isinstance(source, graphviz.Source)
    assert source.source == graph.source
    assert source.timeout == graph.options.timeout


@needs_dot
def test_graphviz_source_pipes_renders_and_displays_the_drawing(tmp_path):
    source = viz_expr(composite_module()).to_graphviz()
    svg = source.pipe(format="svg")
    assert isinstance(svg, bytes) and b"<svg" in svg
    assert b"composite: mybackend.conv2d_bias_relu" in svg
    text = source.pipe(format="svg", encoding="utf-8")
    assert isinstance(text, str) and "c = nn.conv2d" in text
    png = source.render(outfile=tmp_path / "drawing.png")
    assert Path(png).read_bytes()[:4] == b"\x89PNG"
    default = source.render(filename="g.gv", directory=tmp_path, format="svg")
    assert default.replace(os.sep, "/").endswith("g.gv.svg") and "<svg" in Path(default).read_text()
    # what Jupyter does with the object a cell returns
    data, _ = DisplayFormatter().format(source)
    assert data["image/svg+xml"].lstrip().startswith(("<?xml", "<svg"))
    assert "<svg" in source._repr_svg_()


def test_graphviz_source_keeps_graphviz_argument_checks():
    source = viz_expr(ConvBiasReluSoftmax).to_graphviz()
    with pytest.raises(ValueError, match="format"):
        source.pipe(format="not-a-format")


def _slow_dot(tmp_path: Path) -> str:
    """A stand-in for ``dot`` that never finishes in time."""
    exe = tmp_path / "dot"
    exe.write_text("#!/bin/sh\nsleep 30\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_graphviz_source_stops_dot_after_the_drawing_timeout(monkeypatch, tmp_path):
    monkeypatch.setattr(viz_display, "dot_binary", lambda: _slow_dot(tmp_path))
    source = viz_expr(ConvBiasReluSoftmax, timeout=0.3).to_graphviz()
    start = time.perf_counter()
    with pytest.raises(DotUnavailable, match="did not finish within 0.3 s"):
        source.pipe(format="svg")
    with pytest.raises(DotUnavailable, match="did not finish within 0.3 s"):
        source.render(outfile=tmp_path / "never.svg")
    assert time.perf_counter() - start < 10
    assert not (tmp_path / "never.svg").exists()
    bundle = source._repr_mimebundle_()  # display never raises: summary and DOT instead
    assert "image/svg+xml" not in bundle
    assert "did not finish within 0.3 s" in bundle["text/html"]
    assert "digraph" in bundle["text/html"] and "nodes" in bundle["text/plain"]
    assert source._repr_svg_() is None


def test_graphviz_source_without_dot_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(viz_display, "dot_binary", lambda: None)
    source = viz_expr(ConvBiasReluSoftmax).to_graphviz()
    with pytest.raises(DotUnavailable, match="apt-get install graphviz"):
        source.pipe(format="svg")
    data, _ = DisplayFormatter().format(source)
    assert "No drawing" in data["text/html"] and "digraph" in data["text/html"]


def test_to_graphviz_without_the_package_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "patternkit.viz.graphviz_source", raising=False)
    with pytest.raises(ImportError, match="pip install graphviz"):
        viz_expr(ConvBiasReluSoftmax).to_graphviz()
