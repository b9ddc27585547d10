"""``viz_expr``: draw a Relax expression, function or module."""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from .build import build_model
from .graph import VizGraph
from .model import gc_paused
from .options import make_options
from .shape import shape_model

__all__ = ["viz_expr"]


def relax_functions(obj: Any) -> list:
    """The Relax functions of ``obj`` (for ``highlight=`` objects that match per function)."""
    if isinstance(obj, tvm.IRModule):
        return [f for _, f in sorted(obj.functions.items(), key=lambda kv: kv[0].name_hint)
                if isinstance(f, relax.Function)]
    if isinstance(obj, relax.Function):
        return [obj]
    return []


def viz_expr(obj: Any, **options: Any) -> VizGraph:
    """Draw Relax IR as a Graphviz graph with partitions as coloured clusters.

    One walk over the IR builds a neutral graph model (nodes per binding, edges per
    argument, clusters per called function); highlight, focus and collapse edit it; the
    result renders inline in Jupyter and writes DOT, SVG/PNG/PDF, networkx and JSON.
    The IR is never modified.

    Parameters
    ----------
    obj : tvm.IRModule, relax.Function or relax.Expr
        What to draw.  For a module, ``main`` and other functions nobody calls are the
        roots; called functions are drawn inside them.
    op_names : {"relay", "relax", "full"}
        ``nn.conv2d``, ``R.nn.conv2d`` or ``relax.nn.conv2d``.  Default ``"relay"``.
    constants : {"fold", "node"}
        Fold constants into their consumer's label (default) or draw them as nodes.
    calls : {"inline", "once"}
        Draw each callee inline at its call site, wired to the caller's arguments
        (default), or each global callee once with a dashed edge to its call sites.
    color_by : {"cluster", "compiler", "composite", "op", "rule", "none"}
        What the fill colour encodes; a legend lists the colours used.
    collapse : "auto", "all", "none", str or list of str
        Collapse clusters into single nodes: automatically when the graph has more than
        ``max_nodes`` nodes (default), all, none, or those whose pattern/function name
        matches a glob (``"mybackend.*"``).
    max_nodes : int
        Layout threshold for ``collapse="auto"`` (default 150: beyond that an inline
        drawing stops being readable).
    hard_limit : int
        Past this many nodes no layout is attempted; display shows the summary and DOT.
    focus : str or relax.Var, optional
        Keep only the nodes within ``radius`` hops of this variable (name or Var) or node id.
    radius : int
        Hops kept around ``focus`` (default 2).
    functions : str or list of str, optional
        Only draw these functions of a module.
    highlight : list of dict, optional
        Match results ``[{role: relax.Var or Expr}, ...]``, a pattern, a rule (roles named
        after its ``roles()``), or an object with ``match_bindings(func)``: each match is
        outlined, its roles labelled.
    max_attrs : int
        Attributes shown in a label (the rest are in the tooltip); default 3.
    legend, header : bool
        Draw the colour legend / the summary header.
    rankdir : {"TB", "LR", "BT", "RL"}
    timeout : float
        Seconds allowed for ``dot``.
    title : str
    columns : int
        Cut the drawing (in walk order, where the fewest edges cross) into this many
        side-by-side columns; default 1.  :func:`patternkit.viz.fit.fit` picks it.
    max_side : int
        Scale a layout larger than this many pixels (at 96 dpi) on a side down to fit;
        default 0 (never).

    Returns
    -------
    VizGraph
        ``.source`` (DOT), ``.render(path, format=...)``, ``.to_graphviz()`` (a
        ``graphviz.Source``), ``.to_networkx()``, ``.to_json()``.

    Raises
    ------
    patternkit.viz.VizError
        ``obj`` is not Relax IR, an option is unknown or invalid, ``functions=`` names a
        function the module lacks, or ``focus=`` names nothing drawn.
    """
    opts = make_options(**options)
    with gc_paused():
        model = build_model(obj, opts)
        if not model.nodes and not model.messages:
            model.messages.append("nothing to draw: the input has no bindings")
        shape_model(model, opts, relax_functions(obj))
    return VizGraph(model, opts)
