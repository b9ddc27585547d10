"""patternkit's results put on Model Explorer's nodes: node data overlays and node details.

Model Explorer colours a graph by *node data* (a value per node id, with a colour) and
lists the values per group; clicking a node shows its attributes.  Each function here
reads one of patternkit's results and returns an :class:`Overlay` for one drawn module
(a :class:`~.graph.ModuleGraph`): the value and colour per node, and a line of detail
that is added to the node's attributes (the reason a value alone cannot carry).

* :func:`rewrite_overlay`, from a :class:`~patternkit.engine.RewriteLog`: in the module
  before, the bindings a rule replaced ("replaced by ..."); in the module after, the
  binding a rule rewrote and the new bindings its replacement reads ("made by ...").
* :func:`offload_overlay`, from the offload report's host ops: the ops inside a composite
  (which pattern, which compiler) and each op left on the host with the reason.
* :func:`site_overlay`, from :func:`patternkit.validate_sites`' report (the job's
  per-site validation): pass / fail / NOT RUN per rewritten binding, with the error.
* :func:`divergence_overlay`, from :func:`patternkit.bisect`'s :class:`BrokenStep` (the
  binding of the first step that changes the numbers, with the error) or from a mapping
  ``binding -> divergence`` (a number per binding, coloured on a gradient).

Results are matched to nodes by ``Var`` where the result holds the ``Var`` (rewrite
records), else by ``(function, binding name)``.  Results are read by their attributes,
so this layer does not import the layers that make them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from tvm import relax

from ...ir.walk import vars_read
from .graph import ModuleGraph

REWRITTEN_COLOUR = "#e1bee7"
REPLACED_COLOUR = "#f3e5f5"
OFFLOADED_COLOUR = "#c8e6c9"
HOST_COLOUR = "#ffe0b2"
PASS_COLOUR = "#c8e6c9"
FAIL_COLOUR = "#ef9a9a"
NOT_RUN_COLOUR = "#e0e0e0"
DIVERGED_COLOUR = "#ef9a9a"
#: Low to high divergence, for a numeric overlay.
GRADIENT = [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#e53935"}]


@dataclass
class Overlay:
    """One overlay on one drawn module.

    Attributes
    ----------
    name : str
        Shown in Model Explorer's node data list (``"rewrites"``).
    model : str
        The drawn module's label (``"before"``, ``"after"``); also its graph id.
    values : dict
        Node id -> ``(value, colour or None)``: a string (a category) or a number.
    details : dict
        Node id -> a line added to the node's attributes under ``name``.
    gradient : bool
        Numeric values coloured from white (least) to red (most).
    """

    name: str
    model: str
    values: dict[str, tuple[Any, str | None]] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    gradient: bool = False

    def __bool__(self) -> bool:
        return bool(self.values)

    def set(self, node: str, value: Any, colour: str | None, detail: str,
            latest: bool = False) -> None:
        """Give ``node`` its value, colour and detail line.

        The first value given wins, or with ``latest`` the last one; the details of
        every call are kept, in order.
        """
        if node not in self.values or latest:
            self.values[node] = (value, colour)
        if node in self.details:
            if detail not in self.details[node].split("; "):
                self.details[node] += "; " + detail
        else:
            self.details[node] = detail

    def node_data(self) -> dict[str, Any]:
        """The overlay as Model Explorer's ``ModelNodeData`` JSON (keyed by graph id)."""
        results = {}
        for node, (value, colour) in self.values.items():
            entry: dict[str, Any] = {"value": value}
            if colour is not None and not self.gradient:
                entry["bgColor"] = colour
            results[node] = entry
        graph: dict[str, Any] = {"name": self.name, "results": results}
        if self.gradient:
            graph["gradient"] = GRADIENT
        else:
            graph["showExpandedSummaryOnGroupNode"] = True
            graph["showLabelCountColumnsInChildrenStatsTable"] = True
        return {self.model: graph}

    def to_json(self) -> str:
        """:meth:`node_data` as the text Model Explorer loads."""
        return json.dumps(self.node_data())


def _bindings(mod: Any) -> dict[Any, Any]:
    """``Var -> value`` for every binding of the module's Relax functions."""
    out: dict[Any, Any] = {}
    for func in mod.functions.values():
        body = getattr(func, "body", None)
        if isinstance(body, relax.SeqExpr):
            for block in body.blocks:
                for binding in block.bindings:
                    out[binding.var] = binding.value
    return out


def _nodes(graph: ModuleGraph, function: str, name: str) -> list[str]:
    return graph.by_name.get((function, name), [])


def rewrite_overlay(log: Any, graph: ModuleGraph, model: str, *, after: Any = None,
                    before: Any = None) -> Overlay:
    """Which rule replaced (module before) or made (module after) each node.

    Parameters
    ----------
    log : RewriteLog
        What :func:`patternkit.rewrite` recorded (``records``: ``rule``, ``function``,
        ``root_var``, ``replaced_vars``, ``replacement``).
    graph : ModuleGraph
        The drawn module.
    model : str
        Its label.
    after : tvm.IRModule, optional
        The module ``graph`` draws when it is the rewrite's output: then the rewritten
        roots and the new bindings their replacements read are marked "made by".
        Without it, ``graph`` is the input and the replaced bindings are marked.
    before : tvm.IRModule, optional
        The rewrite's input, with ``after``: a binding it already has, bound to the same
        value, was not made by the rewrite.
    """
    overlay = Overlay("rewrites", model)
    if after is None:
        for record in log.records:
            for var in record.replaced_vars:
                node = graph.by_var.get(var)
                if node is not None:
                    overlay.set(node, f"replaced by {record.rule}", REPLACED_COLOUR,
                                f"replaced by {record.rule} (rewrite of {record.root} in "
                                f"{record.function}, round {record.round})")
        return overlay
    values = _bindings(after)
    old = _bindings(before) if before is not None else {}
    for record in log.records:
        detail = (f"made by {record.rule} (rewrite of {record.root} in {record.function}, "
                  f"round {record.round})")
        root = graph.by_var.get(record.root_var)
        roots = [root] if root is not None else _nodes(graph, record.function, record.root)
        for node in roots:  # a later rule rewrote what an earlier one made: it made it
            overlay.set(node, f"made by {record.rule}", REWRITTEN_COLOUR, detail, latest=True)
        # the replacement as normalised in the output: the root's value, and the new
        # bindings it reads (a nested call of the replacement became a binding)
        root_value = values.get(record.root_var)
        stack = vars_read(root_value) if root_value is not None else []
        seen: set = set()
        while stack:
            var = stack.pop()
            if var in seen or var not in graph.by_var or var not in values or \
                    (var in old and old[var].same_as(values[var])):
                continue
            seen.add(var)
            overlay.set(graph.by_var[var], f"made by {record.rule}", REWRITTEN_COLOUR, detail,
                        latest=True)
            value = values.get(var)
            if value is not None:
                stack.extend(vars_read(value))
    return overlay


def offload_overlay(host_ops: Any, graph: ModuleGraph, model: str) -> Overlay:
    """Which composite and compiler took each op, or why it stayed on the host.

    ``host_ops`` are the offload report's :class:`~patternkit.byoc.reports.offload.HostOp`
    (``function``, ``var``, ``op``, ``kind``, ``reason``, ``entry``); the composites are
    read off the drawing (the groups of the composite functions).
    """
    overlay = Overlay("offload", model)
    for node, (composite, compiler) in graph.regions.items():
        if node not in graph.ops:
            continue
        where = composite or "region"
        value = f"{where} on {compiler}" if compiler else where
        overlay.set(node, value, OFFLOADED_COLOUR, f"offloaded: {value}")
    for host in host_ops or ():
        entry = f" [{host.entry}]" if getattr(host, "entry", None) else ""
        for node in _nodes(graph, host.function, host.var):
            overlay.set(node, f"host: {host.kind}", HOST_COLOUR,
                        f"stays on the host: {host.kind}{entry}: {host.reason}")
    return overlay


_SITE_VALUES = {"pass": ("pass", PASS_COLOUR), "fail": ("FAIL", FAIL_COLOUR),
                "not_run": ("NOT RUN", NOT_RUN_COLOUR)}


def site_overlay(report: Any, graph: ModuleGraph, model: str, log: Any = None) -> Overlay:
    """The per-site validation verdict on each rewritten binding, with the error.

    ``report`` is a :class:`~patternkit.verification.sites.SiteReport` (or anything with
    ``sites``, each with ``rule``, ``function``, ``binding``, ``status``, ``duplicates``).
    With the rewrite's ``log``, a site is found by its root ``Var`` (a rewrite may give
    a new binding the name of another); else by name.
    """
    roots: dict[tuple[str, str, str], list[str]] = {}
    for record in getattr(log, "records", None) or ():
        node = graph.by_var.get(record.root_var)
        if node is not None:
            roots.setdefault((record.rule, record.function, record.root), []).append(node)
    overlay = Overlay("site validation", model)
    for site in getattr(report, "sites", None) or ():
        value, colour = _SITE_VALUES.get(site.status, (site.status, None))
        for binding in [site.binding, *site.duplicates]:
            nodes = roots.get((site.rule, site.function, binding)) or \
                _nodes(graph, site.function, binding)
            for node in nodes:
                overlay.set(node, value, colour, str(site))
    return overlay


def divergence_overlay(result: Any, graph: ModuleGraph, model: str,
                       function: str = "main") -> Overlay:
    """The numeric divergence per binding.

    Parameters
    ----------
    result : BrokenStep or mapping
        :func:`patternkit.bisect`'s result: its step's rewritten bindings (the records'
        roots, else ``function`` and the binding's name) are marked with the error.  Or
        a mapping ``binding name -> divergence`` (``(function, name) -> divergence``
        also works), shown as numbers on a gradient.
    graph, model
        The drawn module and its label.
    function : str
        The function of plain binding names in a mapping.
    """
    if isinstance(result, Mapping):
        overlay = Overlay("divergence", model, gradient=True)
        for key, amount in result.items():
            fname, name = key if isinstance(key, tuple) else (function, key)
            number = float(amount)
            if not math.isfinite(number):
                continue
            for node in _nodes(graph, fname, name):
                overlay.set(node, number, None, f"divergence {number:.3g}")
        return overlay
    overlay = Overlay("bisect", model)
    step = f"step {result.index} ({result.step})"
    records = list(getattr(result, "records", ()) or ())
    for record in records:
        for var in [record.root_var, *record.replaced_vars]:
            found = graph.by_var.get(var)
            if found is not None:
                overlay.set(found, f"diverges at {step}", DIVERGED_COLOUR,
                            f"{step} changes the numbers: {result.error}")
    if not records and result.function is not None and result.binding:
        name = result.binding.split("=", 1)[0].strip()
        for node in _nodes(graph, result.function, name):
            overlay.set(node, f"diverges at {step}", DIVERGED_COLOUR,
                        f"{step} changes the numbers: {result.error}")
    return overlay


def attach_details(graph: ModuleGraph, overlays: list[Overlay]) -> None:
    """Add each overlay's detail lines to its nodes' attributes (shown on click)."""
    nodes = graph.graph["nodes"]
    for overlay in overlays:
        for node, detail in overlay.details.items():
            nodes[int(node)]["attrs"].append({"key": overlay.name, "value": detail})
