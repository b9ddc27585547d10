"""``GraphModel.copy``: one built model shaped into several drawings (the job's diff tries
several contexts from one alignment), so a copy must carry every attribute and share no
container the shaping edits."""

from __future__ import annotations

import patternkit as pk
from patternkit.byoc.merge import merge_composite
from patternkit.models import resnet18
from patternkit.patterns import LIBRARY
from patternkit.viz.build import build_model
from patternkit.viz.options import VizOptions


def test_a_copy_holds_every_attribute_equal_and_no_container_shared():
    merged = merge_composite(pk.rewrite(LIBRARY.rewrite_rules(), resnet18(width=4, image=8)),
                             LIBRARY.composites().for_compiler("ccompiler"))
    model = build_model(merged["main"], VizOptions(title="resnet18"))
    model.messages.append("a note")  # what drawing adds later: filled so a copy must carry it
    model.collapsed_composites["ccompiler.conv2d_add_relu"] += 2
    assert all(vars(model).values()), {k for k, v in vars(model).items() if not v}
    copied = model.copy()
    # an attribute added to GraphModel and forgotten by copy() fails here
    assert vars(copied).keys() == vars(model).keys()
    for name, value in vars(model).items():
        mine = getattr(copied, name)
        assert mine == value, name
        if isinstance(value, (dict, list, set)):  # a Counter is a dict
            assert mine is not value, name
    # editing the copy's nodes, clusters and edges leaves the model as it was
    node_id = next(iter(copied.nodes))
    copied.nodes[node_id].attrs["color"] = "changed"
    copied.nodes[node_id].roles.append("changed")
    assert model.nodes[node_id].attrs.get("color") != "changed"
    assert "changed" not in model.nodes[node_id].roles
    cluster_id = next(iter(copied.clusters))
    copied.clusters[cluster_id].attrs["label"] = "changed"
    assert model.clusters[cluster_id].attrs.get("label") != "changed"
    copied.edges.clear()
    assert model.edges
