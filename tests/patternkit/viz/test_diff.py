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
