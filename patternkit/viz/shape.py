"""Edit a built model before it is written: highlight matches, focus, collapse clusters.

Each function takes a :class:`~patternkit.viz.model.GraphModel` and changes it in place;
they never look at TVM IR (apart from :func:`highlight`, which maps the IR objects in the
match results to nodes through ``model.index``).
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

from ..dpl.pattern import DFPattern
from ..engine.proposal import match_bindings
from .model import Cluster, Edge, GraphModel, Node
from .options import VizError, VizOptions

__all__ = ["apply_collapse", "apply_focus", "apply_highlight", "shape_model"]

logger = logging.getLogger(__name__)

# Clusters that are never collapsed: they only group what is already drawn.
_STRUCTURAL = frozenset({"function", "match", "side", "branch"})


def shape_model(model: GraphModel, options: VizOptions, functions: Any = None) -> GraphModel:
    """Highlight, then focus, then collapse, as configured in ``options``."""
    if options.highlight is not None:
        apply_highlight(model, options.highlight, functions)
    if options.focus is not None:
        apply_focus(model, options.focus, options.radius)
    apply_collapse(model, options.collapse, options.max_nodes)
    return model


# ---------------------------------------------------------------------- highlight
def _match_list(highlight: Any, functions: Any) -> list:
    if isinstance(highlight, Mapping):
        return [highlight]
    if hasattr(highlight, "match_bindings"):  # a user's own matcher
        find = highlight.match_bindings
    elif isinstance(highlight, DFPattern) or isinstance(getattr(highlight, "pattern", None),
                                                       DFPattern):
        def find(func):
            return match_bindings(highlight, func)
    else:
        find = None
    if find is not None:
        if not functions:
            raise VizError("highlight= with a pattern needs a Relax function or module to match in")
        return [m for func in functions for m in find(func)]
    try:
        matches = list(highlight)
    except TypeError:
        raise VizError(
            "highlight= expects match results (a list of {role: relax.Var or Expr} dicts), a "
            f"pattern, a rule, or an object with .match_bindings(func); found "
            f"{type(highlight).__name__}"
        ) from None
    return matches


def apply_highlight(model: GraphModel, highlight: Any, functions: Any = None) -> None:
    """Outline each match and label its nodes with their role names.

    ``highlight`` is a list of ``{role: relax.Var or Expr}`` dicts (the pattern engine's
    match results), one dict, a pattern, a rule (its matches, labelled with its roles), or
    an object with ``match_bindings(func)`` returning such dicts.  A match whose nodes
    share one cluster gets a dashed box of its own.
    """
    matches = _match_list(highlight, functions)
    missing = 0
    for i, match in enumerate(matches):
        if not isinstance(match, Mapping):
            raise VizError(
                f"highlight match #{i} should map role names to relax.Var/Expr, found "
                f"{type(match).__name__}"
            )
        ids: list[str] = []
        for role, value in sorted(match.items(), key=lambda kv: str(kv[0])):
            values = value if isinstance(value, (list, tuple)) else [value]
            node_ids = [nid for v in values for nid in model.lookup(v)]
            if not node_ids:
                missing += 1
                continue
            for nid in node_ids:
                node = model.nodes.get(nid)
                if node is None:
                    continue
                if str(role) not in node.roles:
                    node.roles.append(str(role))
                if node.match is None:
                    node.match = i
                ids.append(nid)
        ids = list(dict.fromkeys(ids))
        parents = {model.nodes[n].cluster for n in ids}
        own = [n for n in ids if model.nodes[n].match == i]
        if len(ids) > 1 and len(parents) == 1 and len(own) == len(ids):
            parent = parents.pop()
            cid = f"cluster_match_{i}"
            model.add_cluster(Cluster(cid, "match", f"match {i}", f"match {i}", parent, "",
                                      {"match": str(i)}))
            for n in ids:
                model.nodes[n].cluster = cid
    if missing:
        msg = f"highlight: {missing} role value(s) are not drawn in this graph"
        logger.info(msg)
        model.messages.append(msg)


# ---------------------------------------------------------------------- focus
def _find_focus(model: GraphModel, focus: Any) -> list[str]:
    if isinstance(focus, str):
        if focus in model.nodes:
            return [focus]
        hits = [n.id for n in model.nodes.values() if n.name == focus]
        if hits:
            return hits
        names = sorted({n.name for n in model.nodes.values() if n.name} | set(model.nodes))
        close = difflib.get_close_matches(focus, names, n=5)
        hint = f"; did you mean {close}?" if close else ""
        raise VizError(f"focus={focus!r} names no node or variable in the graph{hint}")
    hits = model.lookup(focus)
    if not hits:
        raise VizError(
            f"focus= expects a variable name, a node id or a relax.Var drawn in the graph; "
            f"found {type(focus).__name__} that is not drawn"
        )
    return list(hits)


def apply_focus(model: GraphModel, focus: Any, radius: int) -> None:
    """Keep the nodes within ``radius`` hops (either direction) of the focus node(s)."""
    seeds = _find_focus(model, focus)
    restrict(model, neighbourhood(model, seeds, radius))
    model.messages.append(f"focus on {', '.join(seeds)} (radius {radius})")


def neighbourhood(model: GraphModel, seeds, hops: int) -> set[str]:
    """Node ids within ``hops`` edges (either direction) of ``seeds``."""
    adj: dict[str, set[str]] = {}
    for e in model.edges:
        adj.setdefault(e.src, set()).add(e.dst)
        adj.setdefault(e.dst, set()).add(e.src)
    keep = set(seeds)
    frontier = deque((s, 0) for s in sorted(set(seeds)))
    while frontier:
        nid, d = frontier.popleft()
        if d >= hops:
            continue
        for other in sorted(adj.get(nid, ())):
            if other not in keep:
                keep.add(other)
                frontier.append((other, d + 1))
    return keep


def restrict(model: GraphModel, keep: set[str]) -> None:
    """Drop every node not in ``keep``, the edges touching them and emptied clusters."""
    model.nodes = {k: n for k, n in model.nodes.items() if k in keep}
    model.edges = [e for e in model.edges if e.src in keep and e.dst in keep]
    model.drop_empty_clusters()


# ---------------------------------------------------------------------- collapse
def _collapsible(model: GraphModel) -> list[Cluster]:
    return [c for c in model.clusters.values() if c.kind not in _STRUCTURAL]


def _outermost(model: GraphModel, clusters: list[Cluster]) -> list[Cluster]:
    chosen = {c.id for c in clusters}
    out = []
    for c in clusters:
        ancestors = model.cluster_chain(c.parent)
        if not any(a in chosen for a in ancestors):
            out.append(c)
    return out


def apply_collapse(model: GraphModel, collapse: Any, max_nodes: int) -> None:
    """Collapse clusters into single nodes.

    ``collapse`` is ``"none"``, ``"all"`` (every outermost partition cluster), ``"auto"``
    (outermost clusters grouped by pattern or compiler, the groups saving most nodes
    first, until at most ``max_nodes`` nodes remain), a glob
    on cluster names or function names, or a tuple of globs.
    """
    if collapse == "none":
        return
    candidates = _collapsible(model)
    if not candidates:
        return
    if collapse == "auto":
        if len(model.nodes) <= max_nodes:
            return
        before = len(model.nodes)
        members = _members(model)
        # Collapse whole groups (every cluster of one pattern / compiler) so the drawing
        # stays consistent, the groups saving most nodes first.
        groups: dict[tuple, list[str]] = {}
        for c in _outermost(model, candidates):
            if len(members.get(c.id, ())) > 1:
                groups.setdefault((c.kind, c.name or c.attrs.get("function", "")), []).append(c.id)
        saving = {k: sum(len(members[c]) - 1 for c in v) for k, v in groups.items()}
        projected = before
        chosen = []
        for key in sorted(groups, key=lambda k: (-saving[k], k)):
            if projected <= max_nodes:
                break
            chosen.extend(groups[key])
            projected -= saving[key]
        collapse_clusters(model, chosen, members)
        model.messages.append(
            f"auto-collapsed {len(chosen)} clusters: {before} -> {len(model.nodes)} nodes "
            f"(max_nodes={max_nodes})"
        )
        return
    if collapse == "all":
        chosen_c = _outermost(model, candidates)
    else:
        globs = (collapse,) if isinstance(collapse, str) else tuple(collapse)
        hits = [
            c for c in candidates
            if any(
                fnmatch.fnmatchcase(c.name, g)
                or fnmatch.fnmatchcase(c.attrs.get("function", ""), g)
                for g in globs
            )
        ]
        if not hits:
            model.messages.append(f"collapse={collapse!r} matched no cluster")
        chosen_c = _outermost(model, hits)
    collapse_clusters(model, [c.id for c in chosen_c])


def _members(model: GraphModel) -> dict[str, list[str]]:
    """Cluster id -> ids of the nodes inside it at any depth, in one pass."""
    members: dict[str, list[str]] = {}
    chains: dict[str | None, list[str]] = {}
    for n in model.nodes.values():
        chain = chains.get(n.cluster)
        if chain is None:
            chain = chains[n.cluster] = model.cluster_chain(n.cluster)
        for cid in chain:
            members.setdefault(cid, []).append(n.id)
    return members


def collapse_clusters(model: GraphModel, cluster_ids: list[str],
                      members: dict | None = None) -> None:
    """Replace each cluster (none nested in another) and its contents with one node."""
    if not cluster_ids:
        return
    from .dot import cluster_color_key  # deferred: dot depends on the model only

    members = members if members is not None else _members(model)
    target: dict[str, str] = {}
    new_node: dict[str, Node] = {}
    for cid in cluster_ids:
        cluster = model.clusters[cid]
        inside = members.get(cid, [])
        if not inside:
            continue
        nid = "collapsed:" + cid
        for n in inside:
            target[n] = nid
        ops = [model.nodes[n] for n in inside if model.nodes[n].kind in ("op", "call", "collapsed")]
        size = sum(n.size for n in ops) or len(inside)
        fn = cluster.attrs.get("function", cluster.name)
        if cluster.kind == "primitive":
            label = f"fused: {fn}"
        elif cluster.kind == "function":
            label = f"call {fn}"
        else:
            label = f"{cluster.kind}: {cluster.name}"
        attrs = {"cluster_kind": cluster.kind, "ops": str(size), "function": fn}
        key = cluster_color_key(model, cluster, "cluster")
        if key:
            attrs["color_key"] = key
        node = Node(
            id=nid, kind="collapsed", label=label, function=cluster.function,
            cluster=cluster.parent, op=fn, attrs=attrs, key_attrs=["ops"], size=size,
        )
        statuses = {model.nodes[n].status for n in inside} - {""}
        if len(statuses) == 1:
            node.status = statuses.pop()
        elif statuses:
            node.status = "changed"
        roles = [r for n in inside for r in model.nodes[n].roles]
        if roles:
            node.roles = list(dict.fromkeys(roles))
            node.match = next(model.nodes[n].match for n in inside if model.nodes[n].roles)
        new_node[nid] = node
    # Result type: the last inside producer feeding something outside.
    for e in model.edges:
        t = target.get(e.src)
        if t is not None and target.get(e.dst) != t:
            new_node[t].type = model.nodes[e.src].type
    nodes: dict[str, Node] = {}
    for k, n in model.nodes.items():
        t = target.get(k)
        if t is None:
            nodes[k] = n
        elif t not in nodes:  # placed where the cluster's first node was: order stays topological
            nodes[t] = new_node[t]
    model.nodes = nodes
    for obj, ids in model.index.items():
        model.index[obj] = [target.get(i, i) for i in ids]
    seen: set[tuple] = set()
    edges: list[Edge] = []
    for e in model.edges:
        src = target.get(e.src, e.src)
        dst = target.get(e.dst, e.dst)
        if src == dst and src != e.src:
            continue
        e2 = Edge(src, dst, e.index, e.port if src == e.src else "", e.kind, e.status)
        if e2.key() in seen:
            continue
        seen.add(e2.key())
        edges.append(e2)
    model.edges = edges
    removed: set[str] = set()
    for cid in cluster_ids:
        removed |= {cid} | model.descendant_clusters(cid)
    model.collapsed_composites.update(
        model.clusters[c].name for c in sorted(removed) if model.clusters[c].kind == "composite"
    )
    model.clusters = {k: c for k, c in model.clusters.items() if k not in removed}
