"""Graphviz visualiser for Relax IR: expressions, functions, partitioned modules, diffs.

``viz_expr(obj)`` draws a bare expression, a ``relax.Function`` or an ``IRModule``, with
external-compiler, composite, fused and partitioned functions as coloured clusters;
``viz_diff(before, after)`` draws what a pass changed.  Both return a :class:`VizGraph`
that displays inline in Jupyter and writes DOT, SVG/PNG/PDF, networkx and JSON;
``.to_graphviz()`` gives it as a ``graphviz.Source`` that keeps the layout timeout.
:mod:`patternkit.viz.fit` fits a drawing into 10,000 px a side (long chains in columns)
and :mod:`patternkit.viz.repeats` draws repeated layers once.
"""

from .api import viz_expr
from .diff import viz_diff
from .display import DotUnavailable
from .graph import VizGraph
from .options import VizError

__all__ = ["DotUnavailable", "VizError", "VizGraph", "viz_diff", "viz_expr"]
