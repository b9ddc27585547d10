"""Drawing into the graph model: unique ids, and references wired into nodes."""

from __future__ import annotations

from types import SimpleNamespace

from patternkit.viz.drawing import Bundle, Drawing, Folded, IdAllocator
from patternkit.viz.options import make_options

WHERE = SimpleNamespace(function="main", cluster=None)


def test_ids_are_the_proposed_paths_made_unique_with_a_counter():
    ids = IdAllocator()
    assert [ids.uid("main/lv"), ids.uid("main/lv"), ids.uid("main/lv")] == \
        ["main/lv", "main/lv~2", "main/lv~3"]
    assert ids.uid("main/other") == "main/other"
    assert [ids.cluster_id(), ids.cluster_id()] == ["cluster_1", "cluster_2"]


def test_wire_draws_edges_for_references_bundles_per_field_and_folds_literals():
    drawing = Drawing(make_options())
    src = drawing.node("main/a", "param", "a", None, "a", WHERE)
    dst = drawing.node("main/b", "op", "add", None, "b", WHERE)
    drawing.wire(dst, 0, "", (src.id, "[1]"))
    drawing.wire(dst, 1, "", Bundle([(src.id, ""), Folded("const 1.0")]))
    drawing.wire(dst, 2, "", None)
    edges = [(e.src, e.dst, e.index, e.port) for e in drawing.model.edges]
    assert edges == [("main/a", "main/b", 0, "[1]"), ("main/a", "main/b", 1, ".0")]
    assert dst.folded == ["[1.1] const 1.0"]


def test_dropping_a_function_removes_its_nodes_edges_and_empty_clusters():
    drawing = Drawing(make_options())
    cid = drawing.cluster("composite", "dnnl.add", "composite: dnnl.add", None, "helper", {})
    inside = drawing.node("helper/x", "op", "add", None, "x",
                          SimpleNamespace(function="helper", cluster=cid))
    kept = drawing.node("main/y", "op", "relu", None, "y", WHERE)
    drawing.wire(kept, 0, "", (inside.id, ""))
    drawing.drop_functions({"helper"})
    assert list(drawing.model.nodes) == ["main/y"]
    assert drawing.model.edges == [] and drawing.model.clusters == {}
