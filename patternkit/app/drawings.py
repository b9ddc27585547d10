"""The job's drawings: always a useful picture, within a layout budget.

Graphviz' ``dot`` grows faster than linearly with the graph, and a 12-layer GPT-2 has
thousands of bindings: drawn whole, the layout times out and the job writes nothing.
So each picture is tried in steps, cheapest-to-read first, until one lays out in time:

1. as it is (composites collapsed automatically past ``max_nodes``);
2. repeated layers drawn once, with a count (:mod:`patternkit.viz.repeats`), and every
   composite as a single node;
3. the same at a lower node budget, then only the entry function's first nodes.

``full=True`` (``--full-drawing``) draws every node, with a generous timeout.  What was
drawn, and how, goes into the report.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import tvm

logger = logging.getLogger(__name__)

#: Seconds ``dot`` may take per attempt; the budget per picture is a few attempts.
LAYOUT_TIMEOUT = 8.0
FULL_TIMEOUT = 120.0


def _attempts(full: bool):
    if full:
        return [("full drawing", {"collapse": "none", "max_nodes": 10**6,
                                  "hard_limit": 10**6, "timeout": FULL_TIMEOUT}, False)]
    return [("as is", {}, False),
            ("repeated layers drawn once, composites collapsed",
             {"collapse": "all"}, True),
            ("repeated layers drawn once, composites collapsed, first nodes only",
             {"collapse": "all", "hard_limit": 400}, True)]


def draw_picture(path: Path, draw, full: bool = False) -> str:
    """Render ``draw(repeats, **options) -> (VizGraph, note)`` to ``path`` (SVG).

    Returns how it was drawn (or why not), for the report.
    """
    from ..viz.display import DotUnavailable

    last = ""
    for how, options, repeats in _attempts(full):
        start = time.perf_counter()
        options = {"timeout": LAYOUT_TIMEOUT, **options}
        try:
            graph, note = draw(repeats, **options)
            if not graph.layout_allowed:
                last = f"{len(graph.model.nodes)} nodes is past the layout limit"
                continue
            graph.render(path, format="svg")
        except DotUnavailable as err:
            last = str(err)
            logger.info("%s: %s did not lay out (%s); trying smaller", path.name, how, err)
            continue
        return f"{how}{note} ({time.perf_counter() - start:.1f} s)"
    return f"not drawn: {last}"


def draw_job(out: Path, pictures: dict[str, tvm.IRModule], before: tvm.IRModule,
             after: tvm.IRModule, *, changes: Any = None, func: str = "main",
             full: bool = False, adjoint: tvm.IRModule | None = None) -> dict[str, str]:
    """``before.svg``, ``after.svg``, ``diff.svg`` (and ``adjoint.svg``); name -> how drawn."""
    from ..viz import viz_diff, viz_expr
    from ..viz.repeats import fold_repeats

    def expr_drawer(mod: tvm.IRModule, name: str):
        def draw(repeats: bool, **options):
            target, note = (fold_repeats(mod, name) if repeats else (mod, ""))
            graph = viz_expr(target, functions=[name], title=f"{name}{note}", **options)
            return graph, note
        return draw

    def diff_drawer(repeats: bool, **options):
        return viz_diff(before, after, changes=changes, context=2, functions=[func],
                        **options), ""

    drawn = {}
    for name, mod in pictures.items():
        drawn[name] = draw_picture(out / name, expr_drawer(mod, func), full)
    drawn["diff"] = draw_picture(out / "diff", diff_drawer, full)
    if adjoint is not None:
        name = func + "_loss_adjoint"
        drawn["adjoint"] = draw_picture(out / "adjoint", expr_drawer(adjoint, name), full)
    return drawn
