"""Putting nodes, edges and clusters into a graph model, with stable unique ids.

:mod:`patternkit.viz.build` walks the IR and decides what to draw; this module only
draws it.  Node ids are the paths the walker proposes (``main/lv/conv``), made unique
with a ``~2``, ``~3`` ... suffix when a path repeats (a callee inlined twice at one
binding).  Values flow through the walk as *references*: ``(node id, port)`` for a
drawn value, a :class:`Bundle` for the fields of a tuple, a :class:`Folded` text for a
literal that goes into its consumer's label, or ``None`` for nothing drawable.
"""

from __future__ import annotations

from typing import Any

from ..ir.compat import handle
from .labels import compact_type, key_attributes
from .model import Cluster, Edge, GraphModel, Node
from .options import VizOptions

__all__ = ["Bundle", "Drawing", "Folded", "IdAllocator"]


class Folded(str):
    """A literal folded into its consumer's label."""


class Bundle(list):
    """The fields of a tuple: a bundle of references, never a node."""


class IdAllocator:
    """Unique node ids from proposed paths, and numbered cluster ids."""

    def __init__(self):
        self._used: set[str] = set()
        self._clusters = 0

    def uid(self, base: str) -> str:
        """``base`` itself the first time, then ``base~2``, ``base~3`` ..."""
        if base not in self._used:
            self._used.add(base)
            return base
        k = 2
        while f"{base}~{k}" in self._used:
            k += 1
        uid = f"{base}~{k}"
        self._used.add(uid)
        return uid

    def cluster_id(self) -> str:
        """A fresh cluster id (``cluster_1``, ``cluster_2``, ...)."""
        self._clusters += 1
        return f"cluster_{self._clusters}"


class Drawing:
    """The model being drawn, and the operations the walker draws with.

    ``where`` arguments are the walker's context: anything with ``function`` (the
    top-level function drawn) and ``cluster`` (the innermost cluster id, or ``None``).
    """

    def __init__(self, options: VizOptions):
        self.model = GraphModel(options.title)
        self.ids = IdAllocator()
        self._max_attrs = options.max_attrs

    def node(self, base: str, kind: str, label: str, ty: Any, name: str, where: Any,
             op: str = "", attrs: dict | None = None) -> Node:
        """Add a node for a value drawn at ``where`` and return it."""
        attrs = attrs or {}
        return self.model.add_node(Node(
            id=self.ids.uid(base), kind=kind, label=label, type=compact_type(ty), name=name,
            function=where.function, cluster=where.cluster, op=op, attrs=attrs,
            key_attrs=key_attributes(attrs, self._max_attrs) if attrs else []))

    def cluster(self, kind: str, name: str, label: str, parent: str | None, function: str,
                attrs: dict) -> str:
        """Add a cluster under ``parent`` and return its id."""
        cid = self.ids.cluster_id()
        self.model.add_cluster(Cluster(cid, kind, name, label, parent, function, attrs))
        return cid

    def index(self, obj: Any, node_id: str) -> None:
        """Remember that ``node_id`` draws the IR object ``obj`` (for highlight, focus)."""
        self.model.index.setdefault(handle(obj), []).append(node_id)

    def wire(self, node: Node, index: int, port: str, ref: Any) -> None:
        """Connect reference ``ref`` to argument ``index`` of ``node``."""
        t = type(ref)
        if t is Folded:
            node.folded.append(f"[{index}{port}] {ref}")
        elif t is Bundle:
            for j, field in enumerate(ref):
                self.wire(node, index, f"{port}.{j}", field)
        elif ref is not None:
            src, src_port = ref
            self.model.add_edge(Edge(src, node.id, index, src_port + port if src_port else port))

    def calls_edge(self, ref: Any, call_node: Node, index: int) -> None:
        """An edge from a callee drawn once to one of its call sites."""
        if isinstance(ref, tuple):
            self.model.add_edge(Edge(ref[0], call_node.id, index, ref[1], kind="calls"))

    def drop_functions(self, names: set[str]) -> None:
        """Remove everything drawn under the top-level functions ``names``."""
        m = self.model
        gone = {k for k, n in m.nodes.items()
                if n.function in names
                and (n.cluster is None or m.clusters[n.cluster].function in names)}
        m.nodes = {k: n for k, n in m.nodes.items() if k not in gone}
        m.edges = [e for e in m.edges if e.src not in gone and e.dst not in gone]
        m.index = {h: [i for i in ids if i not in gone] for h, ids in m.index.items()}
        m.drop_empty_clusters()

    def wrap_roots(self, roots: list[str]) -> None:
        """Put each top-level function's drawing in a ``function`` cluster of its own."""
        top = [c for c in self.model.clusters.values() if c.parent is None]
        wrappers = {r: self.cluster("function", r, f"function {r}", None, r, {}) for r in roots}
        for c in top:
            if c.function in wrappers:
                c.parent = wrappers[c.function]
        for n in self.model.nodes.values():
            if n.cluster is None and n.function in wrappers:
                n.cluster = wrappers[n.function]
