"""The job's drawings: always a useful picture, within a layout budget.

Graphviz' ``dot`` grows faster than linearly with the graph, and a 12-layer GPT-2 has
thousands of bindings: drawn whole, the layout times out and the job writes nothing.
So each picture is tried in steps, cheapest-to-read first, until one lays out in time:

1. as it is (composites collapsed automatically past ``max_nodes``);
2. repeated layers drawn once, with a count (:mod:`patternkit.viz.repeats`), and every
   composite as a single node;
3. the same around the function's result only (``focus=`` the output, a few hops), which
   always lays out.

A step with a smaller one after it is skipped, before any layout, when ``dot`` would
have too much to place (:func:`patternkit.viz.fit.layout_size` past
:data:`LAYOUT_BUDGET`): the picture then does not depend on how busy the machine is, and
the job does not wait seconds for a layout it would not show.

Each picture is then fitted into 10,000 px a side (:func:`patternkit.viz.fit.fit`: a long
chain laid out in columns; one still too big is scaled down, except as it is, where the
next step is tried first).  ``full=True`` (``--full-drawing``) draws every node, with a
generous timeout, as ``dot`` lays it out.  What was drawn, and how, goes into the report.

``patternkit viz`` draws one picture the same way (:func:`fitted_drawing`): repeated layers
drawn once, then fitted into 10,000 px a side (:func:`patternkit.viz.fit.fit`: long chains
in columns, the rest scaled down); ``--full`` draws every node as ``dot`` lays it out.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import tvm

logger = logging.getLogger(__name__)

#: Seconds ``dot`` may take per attempt; the budget per picture is a few attempts.
LAYOUT_TIMEOUT = 8.0
#: Past this many nodes the drawing as it is is not tried: ``dot`` would spend the whole
#: timeout (a 12-layer GPT-2's 680 nodes did not lay out in 20 s), and the picture would
#: not be readable anyway.
AS_IS_NODES = 400
FULL_TIMEOUT = 120.0
#: Past this :func:`~patternkit.viz.fit.layout_size` a picture with a smaller one to fall
#: back on is not laid out: ``dot`` would take seconds, and the picture would be a poster,
#: not a figure.  Measured on the job's pictures (``dot`` CPU, unloaded): a 12-layer
#: GPT-2's rewritten module as it is, 2,158 (1.8 s, past the 8 s timeout under load, and
#: laid out again in columns), its diff with one node of context 2,944 (2.7 s), against
#: ResNet-18 as it is 1,527 (0.01 s) and a 2-layer Llama 1,042 (0.07 s).  The decision
#: needs no layout, so the picture drawn does not depend on how busy the machine is.
LAYOUT_BUDGET = 2_000


def _full_options() -> dict[str, Any]:
    return {"collapse": "none", "max_nodes": 10**6, "hard_limit": 10**6,
            "timeout": FULL_TIMEOUT}


def _attempts(full: bool):
    if full:
        return [("full drawing", _full_options(), "as is")]
    return [("as is", {}, "as is"),
            ("repeated layers drawn once, composites collapsed", {"collapse": "all"}, "fold"),
            ("the output's neighbourhood only (6 hops)",
             {"collapse": "all", "radius": 6}, "output")]


def draw_picture(path: Path, draw, full: bool = False) -> str:
    """Render ``draw(mode, **options) -> (VizGraph, note)`` to ``path`` (SVG).

    ``mode``: ``"as is"``, ``"fold"`` (repeated layers once) or ``"output"`` (around the
    result); a drawer that has no smaller form may ignore it.

    Returns how it was drawn (or why not), for the report.
    """
    from ..viz import VizError, fit as fitting
    from ..viz.display import DotUnavailable

    last = ""
    attempts = _attempts(full)
    for i, (how, options, mode) in enumerate(attempts):
        start = time.perf_counter()
        options = {"timeout": LAYOUT_TIMEOUT, **options}
        try:
            graph, note = draw(mode, **options)
            nodes = len(graph.model.nodes)
            if not graph.layout_allowed or (mode == "as is" and nodes > AS_IS_NODES):
                last = f"{nodes} nodes is past the layout limit"
                logger.info("%s: %s has %d nodes; trying smaller", path.name, how, nodes)
                continue
            size = fitting.layout_size(graph.model) if i < len(attempts) - 1 else 0
            if size > LAYOUT_BUDGET:
                last = f"{size} nodes and edges to place is past the layout budget"
                logger.info("%s: %s has %s; trying smaller", path.name, how, last)
                continue
            if not full:
                fitted = fitting.fit(graph)
                if fitted.scaled and mode == "as is":  # folded, it may fit unscaled
                    last = f"{fitted.width} x {fitted.height} px is past {fitting.MAX_PX} px"
                    logger.info("%s: %s is %s; trying smaller", path.name, how, last)
                    continue
                graph = fitted.graph
                note += f"; {fitted.note}" if fitted.note else ""
            graph.render(path, format="svg")
        except (DotUnavailable, VizError) as err:  # a picture never fails the job
            last = str(err)
            logger.info("%s: %s did not lay out (%s); trying smaller", path.name, how, err)
            continue
        return f"{how}{note} ({time.perf_counter() - start:.1f} s)"
    return f"not drawn: {last}"


def draw_job(out: Path, pictures: dict[str, tvm.IRModule], before: tvm.IRModule,
             after: tvm.IRModule, *, changes: Any = None, func: str = "main",
             full: bool = False, adjoint: tvm.IRModule | None = None) -> dict[str, str]:
    """``before.svg``, ``after.svg``, ``diff.svg`` (and ``adjoint.svg``); name -> how drawn."""
    from ..viz.diff import DiffDrawer

    diffs: list[DiffDrawer] = []  # one, made on the first step: built and aligned once

    def diff_drawer(mode: str, **options):
        context = {"as is": 2, "fold": 1, "output": 0}[mode]
        if not diffs:  # inside the step, so a bad input is a picture not drawn
            diffs.append(DiffDrawer(before, after, changes=changes))
        return diffs[0].draw(context, functions=[func],
                         **{k: v for k, v in options.items() if k != "radius"}), ""

    drawn = {}
    for name, mod in pictures.items():
        drawn[name] = draw_picture(out / name, _expr_drawer(mod, func), full)
    drawn["diff"] = draw_picture(out / "diff", diff_drawer, full)
    if adjoint is not None:
        drawn["adjoint"] = draw_adjoint(out, adjoint, func, full)
    return drawn


def draw_adjoint(out: Path, adjoint: tvm.IRModule, func: str = "main",
                 full: bool = False) -> str:
    """``adjoint.svg``: the gradient function of ``func``; how it was drawn."""
    return draw_picture(out / "adjoint", _expr_drawer(adjoint, func + "_loss_adjoint"), full)


def _expr_drawer(mod: tvm.IRModule, name: str):
    """``draw(mode, **options)`` of function ``name`` for :func:`draw_picture`."""
    from ..viz import viz_expr
    from ..viz.repeats import fold_repeats

    def draw(mode: str, **options):
        target, note = fold_repeats(mod, name) if mode != "as is" else (mod, "")
        result = _result_name(target[name]) if mode == "output" else ""
        if result:
            options["focus"] = result
        graph = viz_expr(target, functions=[name], title=f"{name}{note}", **options)
        return graph, note
    return draw


def start_drawing(out: Path, pictures: dict[str, tvm.IRModule], before: tvm.IRModule,
                  after: tvm.IRModule, **options: Any) -> Future[dict[str, str]]:
    """:func:`draw_job` in a thread of its own: what it returns, when it is done.

    The job starts its drawings as soon as the rewritten module exists, so that ``dot``
    (a process of its own, most of a drawing's time) lays them out while the job builds
    and checks: the pictures and what the report says of them are the same, and the job
    waits for them before it writes the report.  An error is raised by ``result()``.
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="patternkit-drawing")
    try:
        return pool.submit(draw_job, out, pictures, before, after, **options)
    finally:
        pool.shutdown(wait=False)  # the thread ends with its one task


def fitted_drawing(mod: tvm.IRModule, *, func: str | None, options: dict[str, Any],
                   full: bool = False, other: tvm.IRModule | None = None,
                   context: int | None = None, layout: bool = True):
    """``patternkit viz``'s drawing of ``mod``, or of what changed to ``other``.

    Unless ``full``: ``func``'s repeated layers are drawn once (not with ``focus=``, whose
    variable may be in a later copy, nor for a diff), and when ``layout`` (a picture, not
    DOT or JSON) the drawing is fitted into :data:`~patternkit.viz.fit.MAX_PX` a side.
    With ``full``, every node, no fold, as ``dot`` lays it out, with a generous timeout;
    ``options`` (the user's) win over both.

    Returns
    -------
    tuple[VizGraph, str]
        The drawing, and how it was made to fit (empty when nothing was done).
    """
    from ..viz import viz_diff, viz_expr
    from ..viz.fit import fit
    from ..viz.repeats import fold_repeats

    if full:
        options = {**_full_options(), **options}
    note = ""
    if other is not None:
        graph = viz_diff(mod, other, context=context, **options)
    else:
        if not full and func is not None and "focus" not in options:
            mod, note = fold_repeats(mod, func)
            if note:
                options = {"title": func + note, **options}
        graph = viz_expr(mod, **options)
    notes = [note.removeprefix("; ")] if note else []
    if layout and not full:
        fitted = fit(graph)
        graph = fitted.graph
        notes.append(fitted.note)
    return graph, "; ".join(n for n in notes if n)


def _result_name(func) -> str:
    """The last op binding's variable: what the last-resort drawing is drawn around.

    Not the returned variable itself, which is often a plain copy out of the dataflow
    block (``gv = lv99``) that the visualiser draws as the output, not as a node.
    """
    from tvm import relax

    from ..ir import compat as C

    body = func.body
    if isinstance(body, relax.SeqExpr):
        for block in reversed(list(body.blocks)):
            for binding in reversed(list(block.bindings)):
                if C.op_name(binding.value) is not None or isinstance(binding.value,
                                                                      relax.Call):
                    return C.var_name(binding.var)
    return ""
