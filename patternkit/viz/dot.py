"""Write a :class:`~patternkit.viz.model.GraphModel` as Graphviz DOT text.

Output is deterministic: nodes and clusters in model (walk) order, attributes sorted by
name, colours from :mod:`patternkit.viz.palette`.  No Graphviz binary or Python package
is needed to produce the text.
"""

from __future__ import annotations

from collections import Counter
from html import escape as html_escape

from .model import Cluster, GraphModel, Node
from .options import VizOptions
from .palette import STATUS_COLORS, fill_color, outline_color, text_color

__all__ = ["column_of", "to_dot"]

_FONT = "Helvetica"

#: Graphviz's resolution for bitmaps, and the CSS pixels of an SVG's ``pt`` sizes.
DPI = 96

_NODE_SHAPES = {
    "param": {"shape": "ellipse", "style": "filled", "fillcolor": "#FFFFFF"},
    "op": {"shape": "box", "style": "rounded,filled", "fillcolor": "#FFFFFF"},
    "call": {"shape": "component", "style": "filled", "fillcolor": "#FFFFFF"},
    "const": {"shape": "note", "style": "filled", "fillcolor": "#F7F7F7", "fontsize": "8"},
    "value": {"shape": "note", "style": "filled", "fillcolor": "#F7F7F7", "fontsize": "8"},
    "output": {"shape": "ellipse", "style": "filled", "fillcolor": "#FFFFFF", "peripheries": "2"},
    "collapsed": {"shape": "box3d", "style": "filled", "fillcolor": "#DDDDDD"},
}

_CLUSTER_STYLE = {
    "codegen": {"style": "filled,bold", "penwidth": "2"},
    "composite": {"style": "filled,rounded"},
    "partition": {"style": "filled,rounded"},
    "primitive": {"style": "filled,rounded"},
    "function": {"style": "rounded", "color": "#999999", "fillcolor": "#FFFFFF"},
    "match": {"style": "dashed,bold", "penwidth": "2"},
    "side": {"style": "rounded", "color": "#666666", "fillcolor": "#FFFFFF"},
}


def _esc(text: str) -> str:
    if '"' in text or "\\" in text:
        text = text.replace("\\", "\\\\").replace('"', '\\"')
    return text.replace("\n", "\\n")


def _q(text: str) -> str:
    """A DOT double-quoted string; newlines become centred line breaks."""
    return '"' + _esc(text) + '"'


def _attrs(attrs: dict) -> str:
    return "[" + ", ".join([f'{k}="{_esc(str(v))}"' for k, v in sorted(attrs.items())]) + "]"


def cluster_color_key(model: GraphModel, cluster: Cluster, color_by: str) -> str | None:
    """The name whose hash colours ``cluster`` (None: no fill)."""
    if color_by in ("none", "op", "rule") or cluster.kind in ("function", "match", "side",
                                                                "branch"):
        return None
    if color_by == "compiler":
        for cid in model.cluster_chain(cluster.id):
            c = model.clusters[cid]
            if c.kind == "codegen":
                return "codegen:" + c.name
        if cluster.kind == "composite":
            return "codegen:" + cluster.name.split(".", 1)[0]
        return None
    if color_by == "composite":
        if cluster.kind in ("composite", "partition"):
            return cluster.kind + ":" + cluster.name
        return None
    # color_by == "cluster"
    if cluster.kind == "primitive":
        return "primitive:" + cluster.name.rstrip("0123456789")
    return cluster.kind + ":" + cluster.name


def node_label(node: Node) -> str:
    first = node.label
    if node.name and node.kind in ("op", "call", "value", "const") and node.name != node.label:
        first = f"{node.name} = {node.label}"
    lines = [first]
    if node.type:
        lines.append(node.type)
    for k in node.key_attrs:
        lines.append(f"{k}={node.attrs[k]}")
    lines.extend(node.folded[:3])
    if len(node.folded) > 3:
        lines.append(f"+{len(node.folded) - 3} more")
    return "\n".join(lines)


def node_tooltip(node: Node) -> str:
    lines = [node.op or node.label, f"id: {node.id}"]
    if node.name:
        lines.append(f"var: {node.name}")
    if node.type:
        lines.append(f"type: {node.type}")
    lines.extend(f"{k}={v}" for k, v in node.attrs.items())
    lines.extend(node.folded)
    if node.rule:
        lines.append(f"rule: {node.rule}")
    if node.roles:
        lines.append("roles: " + ", ".join(node.roles))
    return "\n".join(lines)


def column_of(model: GraphModel, columns: int) -> dict[str, int]:
    """Node id -> column, cutting the walk order into ``columns`` runs of similar length.

    Each cut is moved, within a quarter of a column's length, to where the fewest edges
    cross it (between two layers rather than across a residual branch), so that few
    edges run from one column to the next.
    """
    order = {node_id: i for i, node_id in enumerate(model.nodes)}
    n = len(order)
    columns = max(1, min(columns, n))
    crossing = [0] * (n + 2)  # crossing[c]: edges from before position c to c or later
    for e in model.edges:
        s, d = order.get(e.src), order.get(e.dst)
        if s is not None and d is not None and s != d:
            crossing[min(s, d) + 1] += 1
            crossing[max(s, d) + 1] -= 1
    for c in range(1, n + 2):
        crossing[c] += crossing[c - 1]
    slack = max(1, n // (4 * columns))
    cuts = [0]
    for j in range(1, columns):
        ideal = round(j * n / columns)
        lo, hi = max(cuts[-1] + 1, ideal - slack), min(n - 1, ideal + slack)
        if lo > hi:
            break
        cuts.append(min(range(lo, hi + 1), key=lambda c: (crossing[c], abs(c - ideal))))
    cuts.append(n)
    ids = list(model.nodes)
    return {node_id: j for j in range(len(cuts) - 1) for node_id in ids[cuts[j]:cuts[j + 1]]}


def to_dot(model: GraphModel, options: VizOptions) -> str:
    """The DOT text of ``model``.

    Parameters
    ----------
    model : GraphModel
        The graph to write (already collapsed/focused/highlighted).
    options : VizOptions
        ``color_by``, ``legend``, ``header``, ``rankdir``, ``title``, ``columns`` and
        ``max_side`` are used here.  With ``columns > 1`` the walk order is cut into that
        many runs and the edges between runs do not constrain the ranks, so each run
        starts again at the top: a long chain is laid out side by side instead of in one
        column.  ``max_side`` (pixels at 96 dpi) scales a larger layout down to fit.
    """
    legend: dict[str, str] = {}
    graph_attrs = {
        "rankdir": options.rankdir,
        "fontname": _FONT,
        "fontsize": "11",
        "newrank": "true",
        "compound": "true",
    }
    if options.max_side:
        inches = f"{options.max_side / DPI:.2f}"
        graph_attrs["size"] = f"{inches},{inches}"
    column = column_of(model, options.columns) if options.columns > 1 else {}
    if options.header:
        header = "\n".join(model.summary_lines() + model.messages)
        title = model.title or ", ".join(model.functions)
        graph_attrs.update(
            {"label": f"{title}\n{header}" if title else header, "labelloc": "t", "labeljust": "l"}
        )
    out = [f"digraph {_q(model.title or 'relax')} {{"]
    out.append(f"  graph {_attrs(graph_attrs)};")
    out.append(f"  node {_attrs({'fontname': _FONT, 'fontsize': '10'})};")
    out.append(f"  edge {_attrs({'fontname': _FONT, 'fontsize': '8', 'arrowsize': '0.6'})};")

    by_cluster: dict[str | None, list[Node]] = {}
    for node in model.nodes.values():
        by_cluster.setdefault(node.cluster, []).append(node)
    children: dict[str | None, list[Cluster]] = {}
    for c in model.clusters.values():
        children.setdefault(c.parent, []).append(c)

    def emit_node(node: Node, indent: str) -> None:
        attrs = dict(_NODE_SHAPES.get(node.kind, _NODE_SHAPES["op"]))
        attrs["label"] = node_label(node)
        attrs["tooltip"] = node_tooltip(node)
        if options.color_by == "op" and node.kind == "op":
            attrs["fillcolor"] = fill_color("op:" + node.op)
            legend[node.label] = attrs["fillcolor"]
        elif options.color_by == "rule" and node.rule:
            attrs["fillcolor"] = fill_color("rule:" + node.rule)
            legend[node.rule] = attrs["fillcolor"]
        if node.kind == "collapsed" and options.color_by not in ("none", "op", "rule"):
            key = node.attrs.get("color_key")
            if key:
                attrs["fillcolor"] = fill_color(key)
        if node.status in STATUS_COLORS:
            attrs["color"] = STATUS_COLORS[node.status]
            attrs["fontcolor"] = text_color(STATUS_COLORS[node.status])
            attrs["penwidth"] = "2.5"
            if node.status == "removed":
                attrs["style"] = attrs["style"] + ",dashed"
            if node.rule and node.status == "added":
                attrs["xlabel"] = node.rule
        if node.roles:
            attrs["penwidth"] = "3"
            attrs["color"] = outline_color(node.match or 0)
            attrs["xlabel"] = ", ".join(node.roles)
            attrs["fontcolor"] = attrs.get("fontcolor", "#000000")
        out.append(f"{indent}{_q(node.id)} {_attrs(attrs)};")

    def emit_cluster(cluster: Cluster, indent: str) -> None:
        attrs = dict(_CLUSTER_STYLE.get(cluster.kind, {}))
        attrs["label"] = cluster.label
        attrs["fontname"] = _FONT
        attrs["labeljust"] = "l"
        tip = [f"{k}={v}" for k, v in sorted(cluster.attrs.items())]
        attrs["tooltip"] = "\n".join([cluster.label] + tip)
        key = cluster_color_key(model, cluster, options.color_by)
        if key is not None:
            attrs["fillcolor"] = fill_color(key)
            attrs.setdefault("color", "#555555")
            legend[key.split(":", 1)[0] + " " + key.split(":", 1)[1]] = attrs["fillcolor"]
        elif "fillcolor" not in attrs:
            attrs["fillcolor"] = "#FFFFFF"
        if cluster.kind == "match":
            idx = int(cluster.attrs.get("match", 0))
            attrs["color"] = outline_color(idx)
            attrs["fontcolor"] = text_color(outline_color(idx))
        if cluster.kind == "codegen" and key is not None:
            attrs["fillcolor"] += "66"  # translucent, so the composites inside stand out
        if cluster.status in STATUS_COLORS:
            attrs["color"] = STATUS_COLORS[cluster.status]
            attrs["penwidth"] = "3"
            if cluster.status == "removed":
                attrs["style"] = attrs.get("style", "") + ",dashed"
        out.append(f"{indent}subgraph {_q(cluster.id)} {{")
        out.append(f"{indent}  graph {_attrs(attrs)};")
        for child in children.get(cluster.id, []):
            emit_cluster(child, indent + "  ")
        for node in by_cluster.get(cluster.id, []):
            emit_node(node, indent + "  ")
        out.append(f"{indent}}}")

    for cluster in children.get(None, []):
        emit_cluster(cluster, "  ")
    for node in by_cluster.get(None, []):
        emit_node(node, "  ")

    fan_in = Counter(e.dst for e in model.edges if e.kind == "data")
    for node in model.nodes.values():
        if node.folded:
            fan_in[node.id] += len(node.folded)
    for e in model.edges:
        attrs: dict[str, str] = {}
        label = e.port
        if e.kind == "data" and fan_in[e.dst] > 1:
            label = f"{e.port}:{e.index}" if e.port else str(e.index)
        if label:
            attrs["label"] = label
        if e.kind == "calls":
            attrs["style"] = "dashed"
            attrs["color"] = "#777777"
        if e.status in STATUS_COLORS:
            attrs["color"] = STATUS_COLORS[e.status]
            if e.status == "removed":
                attrs["style"] = "dashed"
            else:
                attrs["penwidth"] = "2"
        if column and column.get(e.src) != column.get(e.dst):
            attrs["constraint"] = "false"
        suffix = f" {_attrs(attrs)}" if attrs else ""
        out.append(f"  {_q(e.src)} -> {_q(e.dst)}{suffix};")

    present = {n.status for n in model.nodes.values()} | {c.status for c in model.clusters.values()}
    for status, color in STATUS_COLORS.items():
        if status in present:
            legend[status] = color
    if options.legend and legend:
        rows = "".join(
            f'<TR><TD BGCOLOR="{color}">  </TD><TD ALIGN="LEFT">{html_escape(name)}</TD></TR>'
            for name, color in sorted(legend.items())
        )
        out.append(
            '  "legend" [shape=plaintext, label=<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0">'
            f'<TR><TD COLSPAN="2"><B>legend</B></TD></TR>{rows}</TABLE>>];'
        )
    out.append("}")
    return "\n".join(out) + "\n"
