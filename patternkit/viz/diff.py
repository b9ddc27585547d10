"""``viz_diff``: one drawing of what a pass changed.

Both sides are built into graph models, their nodes aligned, and one merged model is
written where unchanged nodes are plain, removed nodes red and dashed, added nodes green
and nodes whose inputs or attributes changed orange.  Because calls are drawn inline,
operators that a partition absorbed into a composite align with their old selves and
show up unchanged *inside* the new (green-bordered) cluster.

Alignment
---------
1. Parameters by name, outputs by function.
2. Forward structural pass, in walk (topological) order: a node matches a node of the
   other side with the same function, kind, operator, type, attributes, folded literals
   and already-matched inputs.
3. Name pass: an operator bound to the same variable name with the same operator.
4. Propagation: consumers of matched pairs through the same argument with the same
   operator, when that pairing is unique.

With ``changes=`` (patternkit's rewrite records: ``.rule``, ``.function``, ``.root``,
``.replaced``) the bindings each rule replaced are removed and its root added, labelled
with the rule, before the structural passes align the rest.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import replace
from typing import Any

from .build import build_model
from .graph import VizGraph
from .model import Cluster, Edge, GraphModel, Node, gc_paused
from .options import VizError, VizOptions, make_options
from .shape import neighbourhood, restrict, shape_model

__all__ = ["DiffDrawer", "viz_diff"]

LAYOUTS = ("merged", "side_by_side")


def viz_diff(before: Any, after: Any, changes: Any = None, context: int | None = None,
             layout: str = "merged", **options: Any) -> VizGraph:
    """Draw the difference between two versions of Relax IR.

    Parameters
    ----------
    before, after : tvm.IRModule, relax.Function or relax.Expr
        The IR before and after a pass (neither is modified).
    changes : RewriteLog or iterable, optional
        The rewrite log itself (its ``records``), or records with ``.rule`` (str),
        ``.function`` (str), ``.root`` (str, the var name of the rewritten binding in
        ``after``) and ``.replaced`` (tuple of var names of ``before`` bindings the rule
        replaced).  Without it the graphs are aligned structurally.
    context : int, optional
        Show only changed nodes plus this many hops around them.
    layout : {"merged", "side_by_side"}
        One merged graph (default) or the two versions next to each other.
    **options
        Any option of :func:`patternkit.viz.viz_expr` (``collapse``, ``color_by`` ...).

    Returns
    -------
    VizGraph

    Raises
    ------
    patternkit.viz.VizError
        Either side is not Relax IR, ``layout``/``context`` are invalid, or a change
        record lacks ``rule``/``function``/``root``/``replaced``.
    """
    _check_layout(layout)
    _check_context(context)
    return DiffDrawer(before, after, changes, layout).draw(context, **options)


class DiffDrawer:
    """Drawings of one diff at several contexts, the two sides built and aligned once.

    :func:`viz_diff` builds both sides' graph models, aligns and merges them, then keeps
    the changes and ``context`` hops around them.  A caller that tries several contexts
    (the job's drawings: 2, then 1, then 0 hops, until one fits its layout budget) would
    pay for the build and the alignment each time; :meth:`draw` does them on its first
    call and shapes a copy of the merged model for each context, so every drawing is the
    one :func:`viz_diff` returns for the same arguments.

    Parameters
    ----------
    before, after, changes, layout
        As for :func:`viz_diff`.

    Raises
    ------
    patternkit.viz.VizError
        ``layout`` is invalid, or a change record lacks ``rule``/``function``/``root``/
        ``replaced``.
    """

    def __init__(self, before: Any, after: Any, changes: Any = None,
                 layout: str = "merged"):
        _check_layout(layout)
        self.before, self.after, self.layout = before, after, layout
        self.records = _records(changes)
        #: How many times both sides were built and aligned (one per distinct walk).
        self.builds = 0
        self._merged: tuple[VizOptions, GraphModel] | None = None

    def draw(self, context: int | None = None, **options: Any) -> VizGraph:
        """The diff with ``context`` hops around the changes, drawn with ``options``.

        ``options`` are :func:`patternkit.viz.viz_expr`'s; the sides are built again only
        when the options that shape the walk (all but ``collapse``, ``focus`` and
        ``highlight``) differ from the previous call's.
        """
        _check_context(context)
        options.setdefault("title", "diff")
        opts = make_options(**options)
        walk_opts = replace(opts, collapse="none", focus=None, highlight=None)
        with gc_paused():
            if self._merged is None or self._merged[0] != walk_opts:
                self._merged = (walk_opts, self._merge(walk_opts))
                self.builds += 1
            model = self._merged[1].copy()
            model.title = opts.title
            if context is not None:
                _restrict_to_changes(model, context)
            shape_model(model, opts, _functions_of(self.after))
        return VizGraph(model, opts)

    def _merge(self, walk_opts: VizOptions) -> GraphModel:
        mb = build_model(self.before, walk_opts)
        ma = build_model(self.after, walk_opts)
        pairs, forced_added, forced_clusters = _align(mb, ma, self.records)
        if self.layout == "merged":
            return _merge(mb, ma, pairs, forced_added, forced_clusters)
        return _side_by_side(mb, ma, pairs, forced_added)


def _check_layout(layout: Any) -> None:
    if layout not in LAYOUTS:
        raise VizError(f"layout= expects one of {list(LAYOUTS)}, found {layout!r}")


def _check_context(context: Any) -> None:
    if context is not None and (not isinstance(context, int) or isinstance(context, bool)
                                or context < 0):
        raise VizError(f"context= expects a non-negative int (hops), found {context!r}")


def _functions_of(obj: Any) -> list:
    from .api import relax_functions  # deferred: api imports the same building blocks

    return relax_functions(obj)


# ---------------------------------------------------------------------- records
def _records(changes: Any) -> list:
    if changes is None:
        return []
    records_of = getattr(changes, "records", None)
    if records_of is not None and not callable(records_of):  # a RewriteLog: its records
        changes = records_of
    try:
        records = list(changes)
    except TypeError:
        raise VizError(f"changes= expects an iterable of change records, found "
                       f"{type(changes).__name__}") from None
    for i, r in enumerate(records):
        missing = [a for a in ("rule", "function", "root", "replaced") if not hasattr(r, a)]
        if missing:
            raise VizError(
                f"change record #{i} ({type(r).__name__}) lacks {missing}; expected .rule, "
                ".function, .root and .replaced (tuple of var names)"
            )
    return records


# ---------------------------------------------------------------------- alignment
def _in_edges(model: GraphModel) -> dict[str, list[Edge]]:
    ins: dict[str, list[Edge]] = {}
    for e in model.edges:
        if e.kind == "data":
            ins.setdefault(e.dst, []).append(e)
    for lst in ins.values():
        lst.sort(key=lambda e: (e.index, e.port, e.src))
    return ins


def _out_edges(model: GraphModel) -> dict[str, list[Edge]]:
    outs: dict[str, list[Edge]] = {}
    for e in model.edges:
        if e.kind == "data":
            outs.setdefault(e.src, []).append(e)
    return outs


def _local(n: Node) -> tuple:
    return (n.function, n.kind, n.op, n.type, tuple(sorted(n.attrs.items())), tuple(n.folded))


def _align(mb: GraphModel, ma: GraphModel, records: list):
    """``(pairs after->before, {after id: rule}, {after cluster id: rule})``.

    The change records first, then the four phases of the module docstring, each
    pairing only nodes that the earlier ones left unpaired.
    """
    alignment = _Alignment()
    forced_added, forced_clusters = _apply_records(mb, ma, records, alignment)
    _pair_params_and_outputs(mb, ma, alignment)
    _pair_structurally(mb, ma, alignment, forced_added)
    _pair_by_name(mb, ma, alignment, forced_added)
    _propagate(mb, ma, alignment, forced_added)
    return alignment.pairs, forced_added, forced_clusters


class _Alignment:
    """The pairs found so far (after id -> before id), and before ids that may not pair."""

    def __init__(self):
        self.pairs: dict[str, str] = {}
        self.used_b: set[str] = set()
        self.blocked_b: set[str] = set()  # replaced by a rule: they are removed

    def pair(self, a: str, b: str) -> None:
        self.pairs[a] = b
        self.used_b.add(b)

    def free_b(self, b: str) -> bool:
        return b not in self.used_b and b not in self.blocked_b


def _apply_records(mb: GraphModel, ma: GraphModel, records: list, alignment: _Alignment):
    """What the change records force: ``({after node: rule}, {after cluster: rule})``.

    Each side is indexed once (the before bindings by function and name, each after
    cluster's nodes by the common prefix of their ids), so a record costs a look-up and a
    pass over the clusters, not a walk over every node and every cluster's nodes.
    """
    forced_added: dict[str, str] = {}
    forced_clusters: dict[str, str] = {}
    if not records:
        return forced_added, forced_clusters
    top_level: dict[tuple[str, str], list[str]] = {}
    for n in mb.nodes.values():
        if n.id == f"{n.function}/{n.name}":
            top_level.setdefault((n.function, n.name), []).append(n.id)
    prefixes: list[tuple[str, str, str]] | None = None  # (cluster, function, common prefix)
    for r in records:
        fn, root = _name(r.function), _name(r.root)
        exact = f"{fn}/{root}"
        if exact in ma.nodes:
            # A plain rewrite: the replaced bindings are gone, the root is new.
            forced_added[exact] = str(r.rule)
            for v in r.replaced:
                alignment.blocked_b.update(top_level.get((fn, _name(v)), ()))
            continue
        # The root is a call drawn inline (a partition or composite): its outermost cluster
        # is what the rule created, and the replaced bindings are absorbed into it.
        if prefixes is None:
            prefixes = _cluster_prefixes(ma)
        inlined = exact + "/"
        for cid, function, prefix in prefixes:
            if function == fn and prefix.startswith(inlined):
                forced_clusters[cid] = str(r.rule)
                break
    return forced_added, forced_clusters


def _cluster_prefixes(model: GraphModel) -> list[tuple[str, str, str]]:
    """``(cluster id, function, common prefix of its nodes' ids)`` of each non-empty cluster.

    In the model's cluster order.  Every node id under a cluster starts with a string
    exactly when the common prefix of the smallest and the largest of those ids does, so
    one prefix per cluster answers "are all its nodes inside this call?".
    """
    lowest: dict[str, str] = {}
    highest: dict[str, str] = {}
    for n in model.nodes.values():
        cluster = n.cluster
        while cluster is not None and cluster in model.clusters:
            if cluster not in lowest or n.id < lowest[cluster]:
                lowest[cluster] = n.id
            if cluster not in highest or n.id > highest[cluster]:
                highest[cluster] = n.id
            cluster = model.clusters[cluster].parent
    out = []
    for c in model.clusters.values():
        if c.id in lowest:
            out.append((c.id, c.function, os.path.commonprefix([lowest[c.id], highest[c.id]])))
    return out


def _pair_params_and_outputs(mb: GraphModel, ma: GraphModel, alignment: _Alignment) -> None:
    """Phase 1: parameters by name, outputs by function."""
    b_params = {(n.function, n.name, n.kind): n.id for n in mb.nodes.values()
                if n.kind in ("param", "output")}
    for n in ma.nodes.values():
        if n.kind in ("param", "output"):
            b = b_params.get((n.function, n.name, n.kind))
            if b is not None and b not in alignment.used_b:
                alignment.pair(n.id, b)


def _pair_structurally(mb: GraphModel, ma: GraphModel, alignment: _Alignment,
                       forced_added: dict) -> None:
    """Phase 2: in walk (topological) order, same local signature and paired inputs."""
    b_ins, a_ins = _in_edges(mb), _in_edges(ma)
    pairs = alignment.pairs

    def sig(n: Node, ins: dict, rename: dict | None) -> tuple | None:
        inputs = []
        for e in ins.get(n.id, ()):
            src = e.src if rename is None else rename.get(e.src)
            if src is None:
                return None
            inputs.append((src, e.port, e.index))
        return _local(n) + (tuple(inputs),)

    table: dict[tuple, deque] = {}
    for n in mb.nodes.values():
        if n.kind in ("param", "output") or n.id in alignment.blocked_b:
            continue
        key = sig(n, b_ins, None)  # never None without a rename
        if key is not None:
            table.setdefault(key, deque()).append(n.id)
    for n in ma.nodes.values():
        if n.id in pairs or n.id in forced_added or n.kind in ("param", "output"):
            continue
        s = sig(n, a_ins, pairs)
        if s is None:
            continue
        q = table.get(s)
        while q:
            b = q.popleft()
            if b not in alignment.used_b:
                alignment.pair(n.id, b)
                break


def _pair_by_name(mb: GraphModel, ma: GraphModel, alignment: _Alignment,
                  forced_added: dict) -> None:
    """Phase 3: an operator bound to the same variable name with the same operator."""
    by_name: dict[tuple, list[str]] = {}
    for n in mb.nodes.values():
        if alignment.free_b(n.id) and n.name and n.kind in ("op", "call", "value"):
            by_name.setdefault((n.function, n.name, n.op), []).append(n.id)
    for n in ma.nodes.values():
        if n.id in alignment.pairs or n.id in forced_added or not n.name:
            continue
        cands = [b for b in by_name.get((n.function, n.name, n.op), ())
                 if b not in alignment.used_b]
        if len(cands) == 1:
            alignment.pair(n.id, cands[0])


def _propagate(mb: GraphModel, ma: GraphModel, alignment: _Alignment,
               forced_added: dict) -> None:
    """Phase 4: consumers of paired nodes through the same argument, when unique."""
    pairs = alignment.pairs
    b_outs, a_outs = _out_edges(mb), _out_edges(ma)
    queue = deque(sorted(pairs.items()))
    while queue:
        a, b = queue.popleft()
        a_cons: dict[tuple, list[str]] = {}
        for e in a_outs.get(a, ()):
            dst = ma.nodes[e.dst]
            if e.dst not in pairs and e.dst not in forced_added:
                a_cons.setdefault((e.index, dst.op), []).append(e.dst)
        if not a_cons:
            continue
        b_cons: dict[tuple, list[str]] = {}
        for e in b_outs.get(b, ()):
            if alignment.free_b(e.dst):
                b_cons.setdefault((e.index, mb.nodes[e.dst].op), []).append(e.dst)
        for key, a_list in sorted(a_cons.items()):
            b_list = b_cons.get(key, [])
            if len(set(a_list)) == 1 and len(set(b_list)) == 1:
                alignment.pair(a_list[0], b_list[0])
                queue.append((a_list[0], b_list[0]))


def _name(obj: Any) -> str:
    """A function or variable name from a str, ``GlobalVar`` or ``relax.Var``."""
    for attr in ("name_hint", "name"):
        value = getattr(obj, attr, None)
        if isinstance(value, str):
            return value
    return str(obj)


def _status(a: Node, b: Node, a_ins: dict, b_ins: dict) -> str:
    if _local(a) != _local(b):
        return "changed"
    ports_a = [(e.index, e.port) for e in a_ins.get(a.id, ())]
    ports_b = [(e.index, e.port) for e in b_ins.get(b.id, ())]
    return "unchanged" if ports_a == ports_b else "changed"


# ---------------------------------------------------------------------- merged drawing
def _copy_node(n: Node, **changes: Any) -> Node:
    return replace(n, attrs=dict(n.attrs), key_attrs=list(n.key_attrs), folded=list(n.folded),
                   roles=list(n.roles), **changes)


def _merge(mb: GraphModel, ma: GraphModel, pairs: dict, forced_added: dict,
           forced_clusters: dict) -> GraphModel:
    a_ins, b_ins = _in_edges(ma), _in_edges(mb)
    model = GraphModel()
    model.functions = list(dict.fromkeys(ma.functions + mb.functions))
    model.index = ma.index
    model.keepalive = ma.keepalive + mb.keepalive
    b_to_a = {b: a for a, b in pairs.items()}
    # Clusters: every after cluster; before clusters matched by (kind, name, function).
    a_keys: dict[tuple[str, ...], str] = {}
    for c in ma.clusters.values():
        c2 = replace(c, attrs=dict(c.attrs))
        model.add_cluster(c2)
        a_keys.setdefault((c.kind, c.name, c.function, c.attrs.get("function", "")), c.id)
    b_cluster_map: dict[str, str] = {}
    for c in mb.clusters.values():
        key = (c.kind, c.name, c.function, c.attrs.get("function", ""))
        if key in a_keys:
            b_cluster_map[c.id] = a_keys.pop(key)
    matched_after_clusters = set(b_cluster_map.values())
    for cid, c in model.clusters.items():
        if cid in forced_clusters:
            c.status = "added"
            c.label += f"\nrule: {forced_clusters[cid]}"
        elif cid not in matched_after_clusters and c.kind not in ("function",):
            c.status = "added"

    def before_cluster(cid: str | None) -> str | None:
        if cid is None:
            return None
        if cid in b_cluster_map:
            return b_cluster_map[cid]
        new_id = "before:" + cid
        if new_id not in model.clusters:
            c = mb.clusters[cid]
            model.add_cluster(replace(c, id=new_id, parent=before_cluster(c.parent),
                                      attrs=dict(c.attrs), status="removed"))
        return new_id

    # Nodes in after order; removed before nodes right after their last kept predecessor.
    removed_after: dict[str | None, list[str]] = {}
    last_kept: str | None = None
    for n in mb.nodes.values():
        if n.id in b_to_a:
            last_kept = b_to_a[n.id]
        else:
            removed_after.setdefault(last_kept, []).append(n.id)

    def add_removed(anchor: str | None) -> None:
        for bid in removed_after.get(anchor, ()):
            n = mb.nodes[bid]
            model.add_node(_copy_node(n, id="before:" + bid, status="removed",
                                      cluster=before_cluster(n.cluster)))

    add_removed(None)
    for n in ma.nodes.values():
        if n.id in pairs:
            status = _status(n, mb.nodes[pairs[n.id]], a_ins, b_ins)
            model.add_node(_copy_node(n, status=status))
        else:
            model.add_node(_copy_node(n, status="added", rule=forced_added.get(n.id, "")))
        add_removed(n.id)

    def b_id(x: str) -> str:
        return b_to_a.get(x, "before:" + x)

    b_edge_keys = {(b_id(e.src), b_id(e.dst), e.index, e.port, e.kind) for e in mb.edges}
    a_edge_keys = set()
    for e in ma.edges:
        k = e.key()
        a_edge_keys.add(k)
        edge_status = "" if k in b_edge_keys else "added"
        model.add_edge(Edge(e.src, e.dst, e.index, e.port, e.kind, edge_status))
    removed_edges = []
    for e in mb.edges:
        k = (b_id(e.src), b_id(e.dst), e.index, e.port, e.kind)
        if k not in a_edge_keys:
            removed_edges.append(Edge(k[0], k[1], e.index, e.port, e.kind, "removed"))
    for e in _acyclic(model, removed_edges):
        model.add_edge(e)
    model.drop_empty_clusters()
    return model


def _acyclic(model: GraphModel, removed: list[Edge]) -> list[Edge]:
    """The removed edges that do not close a cycle with the edges already drawn.

    A removed edge joins a *before* node to its aligned *after* counterpart; when the
    rewrite reordered values (the old consumer is now upstream of the old producer) it
    would draw a cycle, which reads as a data dependence that exists in neither version
    (and makes ``dot`` reverse edges).  Such edges are left out; the removed node keeps
    its other edges, so it is still drawn where it was.
    """
    succ: dict[str, list[str]] = {}
    for e in model.edges:
        succ.setdefault(e.src, []).append(e.dst)

    def reaches(start: str, goal: str) -> bool:
        stack, seen = [start], {start}
        while stack:
            node = stack.pop()
            if node == goal:
                return True
            for nxt in succ.get(node, ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False

    kept = []
    for e in removed:
        if e.src == e.dst or reaches(e.dst, e.src):
            continue
        succ.setdefault(e.src, []).append(e.dst)
        kept.append(e)
    return kept


def _side_by_side(mb: GraphModel, ma: GraphModel, pairs: dict, forced_added: dict) -> GraphModel:
    a_ins, b_ins = _in_edges(ma), _in_edges(mb)
    model = GraphModel()
    model.functions = list(dict.fromkeys(mb.functions + ma.functions))
    used_b = set(pairs.values())
    for side, src, prefix in (("before", mb, "before:"), ("after", ma, "after:")):
        sid = f"cluster_{side}"
        model.add_cluster(Cluster(sid, "side", side, side, None, "", {}))
        for c in src.clusters.values():
            parent = prefix + c.parent if c.parent else sid
            model.add_cluster(replace(c, id=prefix + c.id, parent=parent, attrs=dict(c.attrs)))
        for n in src.nodes.values():
            if side == "before":
                status = "unchanged" if n.id in used_b else "removed"
                rule = ""
            elif n.id in pairs:
                status = _status(n, mb.nodes[pairs[n.id]], a_ins, b_ins)
                rule = ""
            else:
                status, rule = "added", forced_added.get(n.id, "")
            cluster = prefix + n.cluster if n.cluster else sid
            model.add_node(_copy_node(n, id=prefix + n.id, cluster=cluster, status=status,
                                      rule=rule))
        for e in src.edges:
            model.add_edge(Edge(prefix + e.src, prefix + e.dst, e.index, e.port, e.kind))
    model.index = {k: ["after:" + i for i in v] for k, v in ma.index.items()}
    model.keepalive = ma.keepalive + mb.keepalive
    return model


def _in_changed_cluster(model: GraphModel, cluster: str | None) -> bool:
    """Is ``cluster`` (or a cluster around it) added or removed: a fusion boundary moved?"""
    while cluster:
        c = model.clusters.get(cluster)
        if c is None:
            return False
        if c.status in ("added", "removed"):
            return True
        cluster = c.parent
    return False


def _restrict_to_changes(model: GraphModel, hops: int) -> None:
    changed = [n.id for n in model.nodes.values() if n.status in ("added", "removed", "changed")
               or _in_changed_cluster(model, n.cluster)]
    # A rewiring between two unchanged nodes is a change too.
    flagged = set(changed)
    for e in model.edges:
        if e.status in ("added", "removed") and e.src not in flagged and e.dst not in flagged:
            changed += [e.src, e.dst]
    if not changed:
        model.messages.append("no changes: before and after align node for node")
        restrict(model, set())
        return
    keep = neighbourhood(model, changed, hops)
    restrict(model, keep)
    model.messages.append(f"showing changes with {hops} hop(s) of context")
