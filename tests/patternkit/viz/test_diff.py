"""``viz_diff`` as the job uses it: the rewrite log, context, fusion boundaries, no cycles."""

from __future__ import annotations

import networkx as nx
import pytest

import patternkit as pk
from patternkit.byoc.merge import merge_composite
from patternkit.byoc.partition.external import inline_external, partition_graph
from patternkit.models import resnet18
from patternkit.patterns import LIBRARY
from patternkit.viz import viz_diff


@pytest.fixture(scope="module")
def rewritten():
    before = resnet18()
    log = pk.RewriteLog()
    return before, pk.rewrite(LIBRARY.rewrite_rules(), before, log=log), log


def test_the_rewrite_log_itself_is_accepted_as_changes(rewritten):
    before, after, log = rewritten
    by_log = viz_diff(before, after, changes=log)
    by_records = viz_diff(before, after, changes=log.records)
    assert by_log.source == by_records.source
    assert "conv.fold_batchnorm" in {n.rule for n in by_log.model.nodes.values()}


def test_context_keeps_only_the_changes_and_their_neighbourhood(rewritten):
    before, after, log = rewritten
    whole = viz_diff(before, after, changes=log)
    near = viz_diff(before, after, changes=log, context=1)
    assert 0 < len(near.model.nodes) < len(whole.model.nodes)
    assert {"added", "removed"} <= {n.status for n in near.model.nodes.values()}


def test_a_fusion_boundary_is_a_change_even_when_every_node_aligns(rewritten):
    _, after, _ = rewritten
    fused = partition_graph(merge_composite(after, LIBRARY.composites().for_compiler(
        "ccompiler")), "ccompiler")
    restored = inline_external(fused)
    diff = viz_diff(restored, fused, context=1)
    assert not any("no changes" in m for m in diff.model.messages)
    assert {"codegen", "composite"} <= {c.kind for c in diff.model.clusters.values()
                                        if c.status == "added"}


@pytest.mark.parametrize("layout_changes", [True, False])
def test_a_diff_never_draws_a_cycle(rewritten, layout_changes):
    before, after, log = rewritten
    diff = viz_diff(before, after, changes=log if layout_changes else None)
    graph = nx.DiGraph([(e.src, e.dst) for e in diff.model.edges])
    assert nx.is_directed_acyclic_graph(graph)


def test_a_record_of_an_inlined_call_labels_the_cluster_it_made_in_one_pass(monkeypatch):
    from types import SimpleNamespace

    from viz_cases import ConvBiasReluSoftmax, composite_module

    from patternkit.viz.model import GraphModel

    walked: list[str] = []
    real = GraphModel.nodes_under

    def counted(self, cluster_id):
        walked.append(cluster_id)
        return real(self, cluster_id)

    monkeypatch.setattr(GraphModel, "nodes_under", counted)
    records = [SimpleNamespace(rule="fuse.cbr", function="main", root="lv",
                               replaced=("c", "b", "r")),
               # "main/l" is a prefix of the composite's node ids, but not a call of them
               SimpleNamespace(rule="not.this", function="main", root="l", replaced=())]
    diff = viz_diff(ConvBiasReluSoftmax, composite_module(), changes=records)
    (composite,) = [c for c in diff.model.clusters.values() if c.kind == "composite"]
    assert composite.status == "added" and composite.label.endswith("\nrule: fuse.cbr")
    assert "not.this" not in diff.source
    assert walked == []  # the clusters' nodes are indexed once, not walked per record


def test_one_diff_drawer_draws_each_context_as_viz_diff_does(rewritten):
    from patternkit.viz.diff import DiffDrawer

    before, after, log = rewritten
    drawer = DiffDrawer(before, after, changes=log)
    for context, options in ((0, {"collapse": "all"}), (2, {}), (None, {}), (1, {})):
        drawn = drawer.draw(context, **options)
        alone = viz_diff(before, after, changes=log, context=context, **options)
        assert drawn.model.to_dict() == alone.model.to_dict(), context
        assert drawn.source == alone.source
    assert drawer.builds == 1  # the walk's options did not change: built and aligned once
    drawer.draw(1, op_names="full")
    assert drawer.builds == 2  # they did: built again
