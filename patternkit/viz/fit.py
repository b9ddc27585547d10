"""Drawings that fit: long chains laid out in columns, and no side past a pixel limit.

``dot`` stacks a model's layers in one column: a ResNet-18 is 429 pt wide and 6,891 pt
tall (9,188 px at 96 dpi), usable only by scrolling, and a 12-layer ViT runs into the
32,767 px limit of Graphviz' bitmaps.  :func:`fit` lays a drawing out, measures it, and
when one side is much longer than the other cuts the walk order into side-by-side
columns (:func:`patternkit.viz.dot.column_of`), with as many columns as make it roughly
square.  What is still past ``max_px`` is scaled down to fit (Graphviz' ``size``), so no
drawing it returns exceeds the limit.  Folding repeated layers, which needs the module,
is the caller's step (:mod:`patternkit.viz.repeats`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from .dot import DPI
from .graph import VizGraph

__all__ = ["ASPECT", "MAX_PX", "Fitted", "fit", "svg_size"]

#: No side of a drawing past this many pixels (at 96 dpi) unless the full one is asked for.
MAX_PX = 10_000
#: A side this many times the other, and past ``LONG_PX``, is cut into columns.
ASPECT = 2.5
LONG_PX = 3_000

_SIZE = re.compile(rb'<svg[^>]*?\swidth="([\d.]+)(pt|px)?"[^>]*?\sheight="([\d.]+)(pt|px)?"')
_PX_PER = {b"pt": DPI / 72, b"px": 1.0, None: 1.0}


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


def _laid_out(graph: VizGraph, **options) -> tuple[VizGraph, int, int]:
    redrawn = VizGraph(graph.model, replace(graph.options, **options)) if options else graph
    width, height = svg_size(redrawn.pipe("svg"))
    return redrawn, width, height


def fit(graph: VizGraph, max_px: int | None = None) -> Fitted:
    """``graph`` laid out to fit ``max_px`` pixels on each side, and readable in shape.

    Lays the drawing out once; if one side is over ``LONG_PX`` and ``ASPECT`` times the
    other, lays it out again in ``round(sqrt(long / short))`` columns and keeps that if it
    is smaller; if a side is still past ``max_px``, scales the layout down to fit.  Each
    layout runs under the drawing's ``timeout=``.  The model is shared, not copied, and
    never changed.

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
        (empty when it fitted as it was).

    Raises
    ------
    patternkit.viz.DotUnavailable
        ``dot`` is missing, failed or timed out.
    """
    limit = MAX_PX if max_px is None else max_px
    best, width, height = _laid_out(graph)
    notes = []
    long_side, short_side = max(width, height), max(1, min(width, height))
    if long_side > LONG_PX and long_side > ASPECT * short_side:
        columns = max(2, round(math.sqrt(long_side / short_side)))
        redrawn, w, h = _laid_out(graph, columns=columns)
        if max(w, h) < long_side:
            best, width, height = redrawn, w, h
            notes.append(f"laid out in {columns} columns")
    scaled = max(width, height) > limit
    if scaled:
        before = (width, height)
        best, width, height = _laid_out(best, max_side=limit)
        notes.append(f"scaled down from {before[0]} x {before[1]} px to fit {limit} px")
    return Fitted(best, width, height, "; ".join(notes), scaled)
