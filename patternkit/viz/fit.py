"""Drawings that fit: long chains laid out in columns, and no side past a pixel limit.

``dot`` stacks a model's layers in one column: a ResNet-18 is 429 pt wide and 6,891 pt
tall (9,188 px at 96 dpi), usable only by scrolling, and a 12-layer ViT runs into the
32,767 px limit of Graphviz' bitmaps.  :func:`fit` lays a drawing out, measures it, and
when it is much longer along its ranks than across them cuts the walk order into
side-by-side columns (:func:`patternkit.viz.dot.column_of`), with as many columns as make
it roughly square.  What is still past ``max_px`` is scaled down to fit by rewriting the
laid-out SVG's size (its ``viewBox`` keeps the drawing), not by laying it out again, so
no drawing it returns exceeds the limit and a drawing costs at most two layouts.

Laying out is most of a drawing's time, and it grows faster than the graph: ``dot``
places nodes with a network simplex over the nodes, the edges and one virtual node for
each rank a long edge crosses.  :func:`layout_size` counts those before any layout, so
that a caller with a smaller picture to fall back on (:mod:`patternkit.app.drawings`) can
skip one that would take seconds.  Folding repeated layers, which needs the module, is
the caller's step (:mod:`patternkit.viz.repeats`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from .dot import DPI
from .graph import VizGraph
from .model import GraphModel

__all__ = ["ASPECT", "MAX_PX", "Fitted", "fit", "layout_size", "scale_svg", "svg_size"]

#: No side of a drawing past this many pixels (at 96 dpi) unless the full one is asked for.
MAX_PX = 10_000
#: A side this many times the other, and past ``LONG_PX``, is cut into columns.
ASPECT = 2.5
LONG_PX = 3_000

_SIZE = re.compile(rb'<svg[^>]*?\swidth="([\d.]+)(pt|px)?"[^>]*?\sheight="([\d.]+)(pt|px)?"')
_PX_PER = {b"pt": DPI / 72, b"px": 1.0, None: 1.0}
_SIZE_TEXT = re.compile(
    r'(<svg[^>]*?\swidth=")([\d.]+)(pt|px)?("[^>]*?\sheight=")([\d.]+)(pt|px)?"')


def svg_size(svg: bytes | str) -> tuple[int, int]:
    """``(width, height)`` in pixels at 96 dpi, from an SVG's ``width``/``height``.

    Raises
    ------
    ValueError
        When the text has no ``<svg width=... height=...>``.
    """
    data = svg.encode("utf-8") if isinstance(svg, str) else svg
    m = _SIZE.search(data)
    if m is None:
        raise ValueError("not an SVG with width and height attributes")
    width = float(m.group(1)) * _PX_PER[m.group(2)]
    height = float(m.group(3)) * _PX_PER[m.group(4)]
    return round(width), round(height)


@dataclass(frozen=True)
class Fitted:
    """A drawing that fits, its size in pixels, and how it was made to fit."""

    graph: VizGraph
    width: int
    height: int
    note: str
    #: Whether it had to be scaled down (its text is smaller than Graphviz' default).
    scaled: bool = False


def scale_svg(svg: str, limit: int) -> str:
    """``svg`` with its longest side scaled down to ``limit`` pixels (96 dpi).

    Only the ``width`` and ``height`` of the ``<svg>`` element change: its ``viewBox``
    keeps the laid-out coordinates, so the drawing (every node, edge and label) is the
    same, smaller.  A drawing already within ``limit`` is returned as it is.

    Raises
    ------
    ValueError
        When the text has no ``<svg width=... height=...>``.
    """
    width, height = svg_size(svg)
    if max(width, height) <= limit:
        return svg
    factor = limit / max(width, height)
    m = _SIZE_TEXT.search(svg)
    if m is None:
        raise ValueError("not an SVG with width and height attributes")

    def scaled(value: str) -> str:  # rounded down, so the side stays within the limit
        return f"{math.floor(float(value) * factor * 100) / 100:.2f}"

    unit_w, unit_h = m.group(3) or "", m.group(6) or ""
    head = (f"{m.group(1)}{scaled(m.group(2))}{unit_w}{m.group(4)}"
            f"{scaled(m.group(5))}{unit_h}\"")
    return svg[:m.start()] + head + svg[m.end():]


def layout_size(model: GraphModel) -> int:
    """About how many nodes ``dot``'s placement works on: nodes, edges, ranks crossed.

    Each edge is a node of ``dot``'s network simplex, and an edge between ranks ``r`` and
    ``s`` adds ``|r - s| - 1`` virtual nodes.  Ranks are by longest path, as ``dot`` ranks
    a chain, except that a node without inputs (a parameter, a constant) sits just above
    its first reader, as ``dot`` pulls it down to shorten its edges.  The placement's
    time grows faster than this count, and clusters stretch it further: it ranks
    drawings, it does not time them (see :data:`patternkit.app.drawings.LAYOUT_BUDGET`).
    """
    nodes = model.nodes
    succ: dict[str, list[str]] = {}
    indegree = dict.fromkeys(nodes, 0)
    for e in model.edges:
        if e.src in nodes and e.dst in nodes and e.src != e.dst:
            succ.setdefault(e.src, []).append(e.dst)
            indegree[e.dst] += 1
    sources = [n for n, d in indegree.items() if d == 0]
    rank = dict.fromkeys(nodes, 0)
    ready = list(sources)
    while ready:
        node = ready.pop()
        for nxt in succ.get(node, ()):
            rank[nxt] = max(rank[nxt], rank[node] + 1)
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    for node in sources:
        if node in succ:
            rank[node] = min(rank[n] for n in succ[node]) - 1
    crossed = sum(max(0, abs(rank.get(e.dst, 0) - rank.get(e.src, 0)) - 1)
                  for e in model.edges)
    return len(nodes) + len(model.edges) + crossed


def _laid_out(graph: VizGraph, **options) -> tuple[VizGraph, int, int]:
    redrawn = VizGraph(graph.model, replace(graph.options, **options)) if options else graph
    width, height = svg_size(redrawn.pipe("svg"))
    return redrawn, width, height


def _along_ranks(graph: VizGraph, width: int, height: int) -> tuple[int, int]:
    """(length along the ranks, breadth across them): columns only shorten the length."""
    if graph.options.rankdir in ("LR", "RL"):
        return width, height
    return height, width


def fit(graph: VizGraph, max_px: int | None = None) -> Fitted:
    """``graph`` laid out to fit ``max_px`` pixels on each side, and readable in shape.

    Lays the drawing out once; if it is over ``LONG_PX`` along its ranks and ``ASPECT``
    times its breadth (a long chain), lays it out again in ``round(sqrt(long / short))``
    columns and keeps that if it is smaller; if a side is still past ``max_px``, scales
    the laid-out SVG down to fit (:func:`scale_svg`; no further layout).  A drawing wide
    across its ranks (many short pieces side by side) is not cut into columns: that
    would only widen it.  Each layout runs under the drawing's ``timeout=``.  The model
    is shared, not copied, and never changed.

    Parameters
    ----------
    graph : VizGraph
        The drawing (as ``viz_expr`` or ``viz_diff`` made it).
    max_px : int, optional
        The longest side allowed, in pixels at 96 dpi (default :data:`MAX_PX`).

    Returns
    -------
    Fitted
        The drawing to render (its SVG is already laid out), its size, and a note
        (empty when it fitted as it was).  A scaled drawing's options carry
        ``max_side=max_px``, so its DOT text lays out to the same picture.

    Raises
    ------
    patternkit.viz.DotUnavailable
        ``dot`` is missing, failed or timed out.
    """
    limit = MAX_PX if max_px is None else max_px
    best, width, height = _laid_out(graph)
    notes = []
    length, breadth = _along_ranks(graph, width, height)
    long_side, short_side = max(width, height), max(1, min(width, height))
    if length > LONG_PX and length > ASPECT * max(1, breadth):
        columns = max(2, round(math.sqrt(long_side / short_side)))
        redrawn, w, h = _laid_out(graph, columns=columns)
        if max(w, h) < long_side:
            best, width, height = redrawn, w, h
            notes.append(f"laid out in {columns} columns")
    scaled = max(width, height) > limit
    if scaled:
        before = (width, height)
        svg = scale_svg(best.pipe("svg").decode("utf-8"), limit)
        best = best.laid_out(replace(best.options, max_side=limit), svg)
        width, height = svg_size(svg)
        notes.append(f"scaled down from {before[0]} x {before[1]} px to fit {limit} px")
    return Fitted(best, width, height, "; ".join(notes), scaled)
