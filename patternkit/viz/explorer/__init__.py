"""Relax modules in Google's Model Explorer, with patternkit's verdicts on the nodes.

Graphviz drawings stop helping at the scale of a model; Model Explorer (the
``[explorer]`` extra, ``ai-edge-model-explorer``) lays out graphs of 10^4 nodes, folds
them by namespace, shows two graphs side by side and colours nodes by *node data*.
:func:`explore` draws the modules of a pipeline (before, and after the rewrite and the
partitioning) as Model Explorer graphs (:mod:`.graph`: a group per function, repeated
layer, codegen region and composite) and puts patternkit's results on them as overlays
(:mod:`.overlays`): the rule that replaced or made each node, the composite and compiler
that took it or why it stayed on the host, the per-site validation verdict, and the
numeric divergence :func:`patternkit.bisect` found.  The :class:`Explorer` it returns
writes the graphs as files, serves them on localhost with Model Explorer's own server
(:mod:`.server`), and shows in a notebook as a frame on that server.
"""

from __future__ import annotations

import time
from typing import Any

import tvm
from tvm import relax

from .graph import ModuleGraph, module_graph
from .overlays import (
    Overlay,
    attach_details,
    divergence_overlay,
    offload_overlay,
    rewrite_overlay,
    site_overlay,
)
from .server import ExplorerError, ExplorerServer
from .session import Explorer, ExplorerUnavailable

__all__ = ["Explorer", "ExplorerError", "ExplorerServer", "ExplorerUnavailable", "ModuleGraph",
           "Overlay", "explore", "module_graph"]


def _module(obj: Any, role: str) -> tvm.IRModule:
    if isinstance(obj, tvm.IRModule):
        return obj
    if isinstance(obj, relax.Function):
        return tvm.IRModule({"main": obj})
    raise TypeError(f"explore: {role} must be a tvm.IRModule or a relax.Function, "
                    f"not {type(obj).__name__}")


def explore(before: Any, after: Any = None, *, rewritten: Any = None, log: Any = None,
            offload: Any = None, sites: Any = None, divergence: Any = None,
            fold: bool = True) -> Explorer:
    """Draw a pipeline's modules for Model Explorer, with patternkit's results on them.

    Nothing is served until asked: ``explore(...).serve()`` starts Model Explorer on
    localhost (``.url``, ``.stop()``), ``.write(folder)`` writes the graphs and
    overlays, and in a notebook the result displays as Model Explorer in a frame.

    Parameters
    ----------
    before : tvm.IRModule or relax.Function
        The pipeline's input; never modified.
    after : tvm.IRModule or relax.Function, optional
        Its output (the partitioned module, when the pipeline partitions): opens
        beside ``before``.
    rewritten : tvm.IRModule, optional
        The module after the rewrite and before partitioning, when ``after`` is the
        partitioned one: a third graph, between the two, where the rewrites and the
        site verdicts are shown.
    log : RewriteLog, optional
        The rewrite's log: "replaced by <rule>" on ``before``, "made by <rule>" on the
        rewrite's output (``rewritten``, else ``after``).
    offload : OffloadReport or list of HostOp, optional
        The offload report of the partitioning: on ``after``, the composite and
        compiler of each offloaded op, and each op left on the host with the reason.
    sites : SiteReport, optional
        :func:`patternkit.validate_sites`' report (or the job's ``report.sites``): the
        verdict and error per rewritten binding, on the rewrite's output.
    divergence : BrokenStep or mapping, optional
        :func:`patternkit.bisect`'s result (the bindings of the step that changes the
        numbers, with the error), or ``binding name -> divergence`` numbers; shown on
        every drawn module that has those bindings.
    fold : bool
        Group repeated layers (default), so a 12-layer model opens as twelve groups.

    Returns
    -------
    Explorer
        ``.models`` (label -> :class:`ModuleGraph`), ``.overlays``, ``.write``,
        ``.config``, ``.serve``, ``.show``.
    """
    start = time.perf_counter()
    stages = {"before": _module(before, "before")}
    if rewritten is not None:
        stages["rewritten"] = _module(rewritten, "rewritten")
    if after is not None:
        stages["after"] = _module(after, "after")
    models = {name: module_graph(mod, name, fold=fold) for name, mod in stages.items()}
    made = "rewritten" if "rewritten" in stages else "after" if "after" in stages else None
    overlays: list[Overlay] = []
    if log is not None:
        overlays.append(rewrite_overlay(log, models["before"], "before"))
        if made is not None:
            overlays.append(rewrite_overlay(log, models[made], made, after=stages[made],
                                            before=stages["before"]))
    if offload is not None and "after" in models:
        host_ops = getattr(offload, "host_ops", offload)
        overlays.append(offload_overlay(host_ops, models["after"], "after"))
    if sites is not None:
        report = getattr(sites, "report", sites)
        if report is not None:
            overlays.append(site_overlay(report, models[made or "before"], made or "before",
                                         log))
    if divergence is not None:
        overlays.extend(divergence_overlay(divergence, graph, name)
                        for name, graph in models.items())
    overlays = [o for o in overlays if o]
    for name, graph in models.items():
        attach_details(graph, [o for o in overlays if o.model == name])
    return Explorer(models, overlays, seconds=time.perf_counter() - start)
