"""Graphviz visualiser for Relax IR: expressions, functions, partitioned modules, diffs.

``viz_expr(obj)`` draws a bare expression, a ``relax.Function`` or an ``IRModule``, with
external-compiler, composite, fused and partitioned functions as coloured clusters;
``viz_diff(before, after)`` draws what a pass changed.  Both return a :class:`VizGraph`
that displays inline in Jupyter and writes DOT, SVG/PNG/PDF, networkx and JSON.
"""

from .api import viz_expr
from .diff import viz_diff
from .display import DotUnavailable
from .graph import VizGraph
from .options import VizError

__all__ = ["DotUnavailable", "VizError", "VizGraph", "viz_diff", "viz_expr"]
