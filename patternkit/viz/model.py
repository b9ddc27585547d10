"""The neutral graph model every output (DOT, networkx, JSON) is written from.

A :class:`GraphModel` holds nodes, edges and a tree of clusters.  It knows nothing about
TVM: :mod:`patternkit.viz.build` fills it in one walk over the IR, the transformations in
:mod:`patternkit.viz.shape` (collapse, focus, highlight) and :mod:`patternkit.viz.diff`
edit it, and :mod:`patternkit.viz.dot` / :mod:`patternkit.viz.graph` write it out.

Node ids are paths built from the function and the binding (``main/lv/conv``: binding
``conv`` inside the callee inlined at binding ``lv`` of ``main``), so they are stable
across runs and readable in tests.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from ..ir.compat import (
    gc_paused,  # re-exported: the viz modules pause GC while walking
    handle_or_none,
)

__all__ = ["Cluster", "Edge", "GraphModel", "Node", "OFFLOAD_KINDS", "gc_paused"]


# Cluster kinds whose operators run outside the host (external compiler or composite).
OFFLOAD_KINDS = frozenset({"codegen", "composite"})


@dataclass(slots=True)
class Node:
    """One drawn value: a parameter, an operator call, a call, a constant or an output.

    Attributes
    ----------
    id : str
        Stable path id (``main/conv``).
    kind : str
        ``param``, ``op``, ``call``, ``const``, ``value``, ``output``, ``collapsed``.
    label : str
        First label line: the operator name (as configured) or the parameter name.
    type : str
        Compact result type (``f32[1,4,8,8]``).
    name : str
        The bound variable's name, ``""`` for anonymous nested expressions.
    function : str
        The top-level function the node is drawn under.
    cluster : str or None
        Id of the innermost cluster holding the node.
    op : str
        Full operator name (``relax.nn.conv2d``) or callee name.
    attrs : dict
        All attributes, compact text.
    key_attrs : list
        Attribute names shown in the label (the rest go to the tooltip).
    folded : list
        Constants and literals folded into this node, one text each.
    status : str
        Diff status: ``""``, ``unchanged``, ``changed``, ``added``, ``removed``.
    roles : list
        Highlight role names, ``match`` the highlight index (or None).
    """

    id: str
    kind: str
    label: str
    type: str = ""
    name: str = ""
    function: str = ""
    cluster: str | None = None
    op: str = ""
    attrs: dict = field(default_factory=dict)
    key_attrs: list = field(default_factory=list)
    folded: list = field(default_factory=list)
    status: str = ""
    rule: str = ""
    roles: list = field(default_factory=list)
    match: int | None = None
    size: int = 1

    def to_dict(self) -> dict:
        """The node as plain Python data."""
        return {
            "id": self.id,
            "kind": self.kind,
            "label": self.label,
            "type": self.type,
            "name": self.name,
            "function": self.function,
            "cluster": self.cluster,
            "op": self.op,
            "attrs": dict(sorted(self.attrs.items())),
            "key_attrs": list(self.key_attrs),
            "folded": list(self.folded),
            "status": self.status,
            "rule": self.rule,
            "roles": list(self.roles),
            "match": self.match,
            "size": self.size,
        }


@dataclass(slots=True)
class Edge:
    """Data flowing from ``src`` into argument ``index`` of ``dst``.

    ``port`` names the part of ``src`` used (``[0]`` for a tuple-get-item, ``.1`` for a
    field of a tuple argument); ``kind`` is ``data``, ``calls`` (drawn-once callee to call
    site) or, in diffs, carries the status via ``status``.
    """

    src: str
    dst: str
    index: int = 0
    port: str = ""
    kind: str = "data"
    status: str = ""

    def key(self) -> tuple:
        """What identifies the edge: its ends, argument index, port and kind."""
        return (self.src, self.dst, self.index, self.port, self.kind)

    def to_dict(self) -> dict:
        """The edge as plain Python data."""
        return {
            "src": self.src,
            "dst": self.dst,
            "index": self.index,
            "port": self.port,
            "kind": self.kind,
            "status": self.status,
        }


@dataclass(slots=True)
class Cluster:
    """A function drawn as a box: ``codegen``, ``composite``, ``primitive``, ``partition``,
    ``function`` (a plain callee or one of several top-level functions), ``match``
    (a highlighted match) or ``side`` (the before/after halves of a side-by-side diff).
    """

    id: str
    kind: str
    name: str
    label: str
    parent: str | None = None
    function: str = ""
    attrs: dict = field(default_factory=dict)
    status: str = ""

    def to_dict(self) -> dict:
        """The cluster as plain Python data."""
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "label": self.label,
            "parent": self.parent,
            "function": self.function,
            "attrs": dict(sorted(self.attrs.items())),
            "status": self.status,
        }


class GraphModel:
    """Nodes (in walk order, which is topological), edges and clusters of one drawing."""

    def __init__(self, title: str = ""):
        self.title = title
        self.nodes: dict[str, Node] = {}
        self.edges: list[Edge] = []
        self.clusters: dict[str, Cluster] = {}
        self.functions: list[str] = []
        self.messages: list[str] = []
        # Composite clusters folded into collapsed nodes, still counted in the header.
        self.collapsed_composites: Counter = Counter()
        # Handle of an IR object (bound Var or value) -> node ids; used by highlight and
        # focus, never serialised.  ``keepalive`` holds the IR so handles stay valid.
        self.index: dict[int, list[str]] = {}
        self.keepalive: list[Any] = []

    # ----------------------------------------------------------------- construction
    def add_node(self, node: Node) -> Node:
        """Add ``node`` and return it."""
        self.nodes[node.id] = node
        return node

    def add_edge(self, edge: Edge) -> None:
        """Add ``edge``."""
        self.edges.append(edge)

    def add_cluster(self, cluster: Cluster) -> Cluster:
        """Add ``cluster`` and return it."""
        self.clusters[cluster.id] = cluster
        return cluster

    def copy(self) -> GraphModel:
        """A copy to edit: its nodes, edges and clusters are new objects, the IR is shared.

        Restricting, collapsing or highlighting the copy leaves this model as it was, so
        one built model can be shaped into several drawings.
        """
        other = GraphModel(self.title)
        other.nodes = {k: replace(n, attrs=dict(n.attrs), key_attrs=list(n.key_attrs),
                                  folded=list(n.folded), roles=list(n.roles))
                       for k, n in self.nodes.items()}
        other.edges = [replace(e) for e in self.edges]
        other.clusters = {k: replace(c, attrs=dict(c.attrs)) for k, c in self.clusters.items()}
        other.functions = list(self.functions)
        other.messages = list(self.messages)
        other.collapsed_composites = Counter(self.collapsed_composites)
        other.index = {k: list(v) for k, v in self.index.items()}
        other.keepalive = list(self.keepalive)
        return other

    # ----------------------------------------------------------------- queries
    def lookup(self, obj: Any) -> list[str]:
        """Node ids drawn for an IR object (a bound ``relax.Var`` or a value); [] if none."""
        key = handle_or_none(obj)
        if key is None:
            return []
        return list(self.index.get(key, ()))

    def cluster_chain(self, cluster_id: str | None) -> list[str]:
        """``cluster_id`` and its ancestors, innermost first."""
        chain = []
        while cluster_id is not None:
            chain.append(cluster_id)
            cluster_id = self.clusters[cluster_id].parent
        return chain

    def nodes_under(self, cluster_id: str) -> list[str]:
        """Ids of the nodes inside ``cluster_id`` or any cluster nested in it."""
        inside = {cluster_id} | self.descendant_clusters(cluster_id)
        return [n.id for n in self.nodes.values() if n.cluster in inside]

    def descendant_clusters(self, cluster_id: str) -> set[str]:
        """The ids of every cluster nested (at any depth) inside ``cluster_id``."""
        children: dict[str | None, list[str]] = {}
        for c in self.clusters.values():
            children.setdefault(c.parent, []).append(c.id)
        out: set[str] = set()
        stack = list(children.get(cluster_id, []))
        while stack:
            cid = stack.pop()
            out.add(cid)
            stack.extend(children.get(cid, []))
        return out

    def drop_empty_clusters(self) -> None:
        """Remove clusters holding no node at any depth (after focus or collapse)."""
        used: set[str] = set()
        for n in self.nodes.values():
            used.update(self.cluster_chain(n.cluster))
        self.clusters = {k: c for k, c in self.clusters.items() if k in used}

    def summary(self) -> dict:
        """Counts shown in the header: nodes, ops, clusters, composites, offload split."""
        kinds = Counter(n.kind for n in self.nodes.values())
        cluster_kinds = Counter(c.kind for c in self.clusters.values()
                                if c.kind not in ("match", "side"))
        composites = Counter(c.name for c in self.clusters.values() if c.kind == "composite")
        composites.update(self.collapsed_composites)
        offload_of: dict[str | None, bool] = {None: False}
        offloaded = host = 0
        for n in self.nodes.values():
            if n.kind not in ("op", "collapsed"):
                continue
            if n.cluster not in offload_of:
                offload_of[n.cluster] = any(
                    self.clusters[c].kind in OFFLOAD_KINDS for c in self.cluster_chain(n.cluster)
                )
            weight = n.size if n.kind == "collapsed" else 1
            if offload_of[n.cluster] or (n.kind == "collapsed" and self._collapsed_offload(n)):
                offloaded += weight
            else:
                host += weight
        status = Counter(n.status for n in self.nodes.values() if n.status)
        return {
            "nodes": len(self.nodes),
            "edges": len(self.edges),
            "ops": kinds.get("op", 0) + sum(n.size for n in self.nodes.values()
                                            if n.kind == "collapsed"),
            "params": kinds.get("param", 0),
            "clusters": dict(sorted(cluster_kinds.items())),
            "composites": dict(sorted(composites.items())),
            "offloaded_ops": offloaded,
            "host_ops": host,
            "status": dict(sorted(status.items())),
            "functions": list(self.functions),
        }

    @staticmethod
    def _collapsed_offload(node: Node) -> bool:
        return node.kind == "collapsed" and node.attrs.get("cluster_kind") in OFFLOAD_KINDS

    def summary_text(self) -> str:
        """The header as one line (for ``repr`` and the text fallback)."""
        return "; ".join(self.summary_lines())

    def summary_lines(self) -> list[str]:
        """The header: counts, clusters, composites per pattern, offload split, diff."""
        s = self.summary()
        parts = [f"{s['nodes']} nodes, {s['ops']} ops, {s['edges']} edges"]
        if s["clusters"]:
            parts.append("clusters: " + ", ".join(f"{k} {v}" for k, v in s["clusters"].items()))
        if s["composites"]:
            parts.append(
                "composites: " + ", ".join(f"{k} x{v}" for k, v in s["composites"].items())
            )
        if s["offloaded_ops"]:
            parts.append(f"ops offloaded {s['offloaded_ops']} / on host {s['host_ops']}")
        if s["status"]:
            parts.append("diff: " + ", ".join(f"{k} {v}" for k, v in s["status"].items()))
        return parts

    def to_dict(self) -> dict:
        """The model as plain Python data: title, functions, summary, graph."""
        return {
            "title": self.title,
            "functions": list(self.functions),
            "summary": self.summary(),
            "messages": list(self.messages),
            "clusters": [c.to_dict() for c in self.clusters.values()],
            "nodes": [n.to_dict() for n in self.nodes.values()],
            "edges": [e.to_dict() for e in self.edges],
        }
