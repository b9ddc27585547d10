"""pk.explore: Relax modules as Model Explorer graphs, with patternkit's results on the nodes.

The graphs and overlays are checked against Model Explorer's own classes (its
``graph_builder`` and ``node_data_builder`` dataclasses reject a field they do not
know) and served by its own server; the browser test is ``test_explorer_browser.py``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import time
import urllib.request

import pytest
from explorer_cases import COMPILER, TanhIsRelu, conv_layers, tanh_model

import patternkit as pk
from patternkit.app.rules import resolve_rules
from patternkit.byoc import CompositeLog, merge_composite, partition_graph
from patternkit.byoc.reports.offload import explain_offload
from patternkit.byoc.tables import PatternTable
from patternkit.testing.bisection import bisect
from patternkit.viz.explorer import Explorer, explore, module_graph

model_explorer = pytest.importorskip("model_explorer", reason="the [explorer] extra is absent")
from model_explorer import (
    graph_builder as gb,  # noqa: E402
    node_data_builder as ndb,  # noqa: E402
)
from model_explorer.utils import convert_adapter_response, remove_none  # noqa: E402


@pytest.fixture(scope="module")
def pipeline():
    """The job's steps on a 3-layer model: rewrite, merge, partition, offload, sites."""
    before = conv_layers(3)
    chosen = resolve_rules(None)
    rules = chosen.rewrite_rules()
    table = PatternTable(chosen.composites().for_compiler(COMPILER), COMPILER)
    log = pk.RewriteLog()
    rewritten = pk.rewrite(rules, before, log=log)
    merge_log = CompositeLog()
    merged = merge_composite(rewritten, table, log=merge_log)
    offload = explain_offload(merged, merge_log, table)
    after = partition_graph(merged, COMPILER)
    sites = pk.validate_sites(before, rewritten, log, rules=rules)
    return dict(before=before, rewritten=rewritten, after=after, log=log, offload=offload,
                sites=sites)


def _strict(cls, data):
    """``data`` (JSON) as Model Explorer's dataclass ``cls``: unknown fields raise."""
    hints = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(hints)
    assert not unknown, f"{cls.__name__} has no field(s) {unknown}"
    return cls(**data)


def _as_graph(data: dict) -> gb.Graph:
    nodes = []
    for node in data["nodes"]:
        node = dict(node)
        node["attrs"] = [_strict(gb.KeyValue, kv) for kv in node["attrs"]]
        node["incomingEdges"] = [_strict(gb.IncomingEdge, e) for e in node["incomingEdges"]]
        for key in ("outputsMetadata", "inputsMetadata"):
            node[key] = [_strict(gb.MetadataItem, {
                "id": m["id"], "attrs": [_strict(gb.KeyValue, kv) for kv in m["attrs"]]})
                for m in node[key]]
        nodes.append(_strict(gb.GraphNode, node))
    graph = dict(data, nodes=nodes)
    graph["groupNodeConfigs"] = [_strict(gb.GroupNodeConfig, c)
                                 for c in data["groupNodeConfigs"]]
    return _strict(gb.Graph, graph)


def _group_attrs(explorer: Explorer, model: str) -> dict:
    return explorer.models[model].graph["groupNodeAttributes"]


# -- the graph ------------------------------------------------------------------------------
def test_a_graph_loads_into_model_explorers_classes_and_serialises_back_unchanged(pipeline):
    ex = explore(pipeline["before"], pipeline["after"], rewritten=pipeline["rewritten"],
                 log=pipeline["log"], offload=pipeline["offload"], sites=pipeline["sites"])
    for model in ex.models:
        data = json.loads(ex.graphs_json(model))
        graphs = {"graphs": [_as_graph(g) for g in data["graphs"]]}
        # what Model Explorer's server sends for in-memory graphs; the optional fields we
        # leave out come back as null
        again = remove_none(json.loads(json.dumps(convert_adapter_response(graphs))))
        assert again == data


def test_every_node_carries_its_op_binding_shape_and_dtype(pipeline):
    graph = module_graph(pipeline["before"], "before")
    convs = [n for n in graph.graph["nodes"] if n["label"] == "nn.conv2d"]
    assert len(convs) == 3
    attrs = {kv["key"]: kv["value"] for kv in convs[0]["attrs"]}
    assert attrs["op"] == "relax.nn.conv2d" and attrs["function"] == "main"
    assert attrs["binding"] == "lv" and attrs["padding"] == "[1, 1, 1, 1]"
    (output,) = convs[0]["outputsMetadata"]
    meta = {kv["key"]: kv["value"] for kv in output["attrs"]}
    assert meta == {"tensor_shape": "float32[1,4,8,8]", "tensor_name": "lv"}
    # the batch norm's tuple is projected by an edge from its output 0, not a node
    relu = next(n for n in graph.graph["nodes"] if n["label"] == "nn.relu")
    bn = next(n for n in graph.graph["nodes"] if n["label"] == "nn.batch_norm")
    assert relu["incomingEdges"] == [{"sourceNodeId": bn["id"], "sourceNodeOutputId": "0",
                                      "targetNodeInputId": "0"}]
    assert len(bn["outputsMetadata"]) == 3  # the normalised value and the two means


def test_repeated_layers_are_one_group_each_so_the_model_opens_folded_by_layer():
    # a model's first layer reads the stem's output, as the others read their predecessor's
    graph = module_graph(conv_layers(12, stem=True), "before")
    layers = sorted(ns for ns in graph.namespaces() if ns.startswith("main/layer"))
    assert layers == [f"main/layer{k:02d}" for k in range(1, 13)]
    per_layer = [sum(1 for n in graph.graph["nodes"] if n["namespace"] == ns and
                     n["label"] == "nn.conv2d") for ns in layers]
    assert per_layer == [1] * 12
    assert graph.graph["groupNodeAttributes"]["main/layer07"]["repeated layer"] == "7 of 12"
    flat = module_graph(conv_layers(12, stem=True), "before", fold=False)
    assert not any("layer" in ns for ns in flat.namespaces())


def test_codegen_regions_and_composites_are_groups_with_their_pattern_and_compiler(pipeline):
    graph = module_graph(pipeline["after"], "after")
    attrs = graph.graph["groupNodeAttributes"]
    codegen = [ns for ns, a in attrs.items() if a.get("kind") == "codegen"]
    composites = [ns for ns, a in attrs.items() if a.get("kind") == "composite"]
    # PartitionGraph put the three adjacent composites in one external function
    assert len(codegen) == 1 and attrs[codegen[0]]["compiler"] == COMPILER
    assert len(composites) == 3
    for ns in composites:
        assert ns.rsplit("/", 1)[0] == codegen[0]  # each composite inside the region
        assert attrs[ns]["composite"] == "ccompiler.conv2d_add_relu"
    # composite and codegen groups are coloured; the function's group is Model Explorer's
    coloured = {c["namespaceRegex"] for c in graph.graph["groupNodeConfigs"]}
    assert coloured == {"^" + re.escape(ns) + "$" for ns in [*codegen, *composites]}
    inside = [n["label"] for n in graph.graph["nodes"] if n["namespace"] == composites[0]]
    assert inside == ["nn.conv2d", "add", "nn.relu"]
    mean = next(n for n in graph.graph["nodes"] if n["label"] == "mean")
    assert mean["namespace"] == "main"


def test_explore_leaves_the_modules_alone_and_refuses_what_is_not_a_module(pipeline):
    texts = {k: pipeline[k].script() for k in ("before", "rewritten", "after")}
    explore(pipeline["before"], pipeline["after"], rewritten=pipeline["rewritten"],
            log=pipeline["log"], offload=pipeline["offload"], sites=pipeline["sites"])
    assert {k: pipeline[k].script() for k in texts} == texts
    with pytest.raises(TypeError, match=r"^explore: after must be a tvm.IRModule or a "
                                        r"relax.Function, not str$"):
        explore(pipeline["before"], "after.py")


# -- the overlays ---------------------------------------------------------------------------
def _values(explorer: Explorer, name: str, model: str) -> list[tuple[str, str, object]]:
    """``(op label, binding, value)`` per node the overlay ``name`` on ``model`` marks."""
    (overlay,) = [o for o in explorer.overlays if o.name == name and o.model == model]
    nodes = explorer.models[model].graph["nodes"]
    return sorted((nodes[int(i)]["label"], _attr(nodes[int(i)], "binding"), v)
                  for i, (v, _) in overlay.values.items())


def _attr(node: dict, key: str) -> str | None:
    return next((kv["value"] for kv in node["attrs"] if kv["key"] == key), None)


def test_the_rules_that_replaced_and_made_each_node_are_overlaid(pipeline):
    ex = explore(pipeline["before"], pipeline["after"], rewritten=pipeline["rewritten"],
                 log=pipeline["log"])
    replaced = _values(ex, "rewrites", "before")
    # per layer, conv.fold_batchnorm replaced the conv2d, the batch norm and its [0]
    assert [(op, value) for op, _, value in replaced] == \
        [("nn.batch_norm", "replaced by conv.fold_batchnorm")] * 3 + \
        [("nn.conv2d", "replaced by conv.fold_batchnorm")] * 3
    made = _values(ex, "rewrites", "rewritten")
    # and made a conv2d with folded weights and the bias add, which the rule's rewrite
    # returned (the relu and the mean are the model's own)
    assert [(op, value) for op, _, value in made] == \
        [("add", "made by conv.fold_batchnorm")] * 3 + \
        [("nn.conv2d", "made by conv.fold_batchnorm")] * 3
    node = next(n for n in ex.models["rewritten"].graph["nodes"] if n["label"] == "add")
    assert _attr(node, "rewrites").startswith("made by conv.fold_batchnorm (rewrite of ")


def test_offloaded_ops_show_their_composite_and_host_ops_their_reason(pipeline):
    ex = explore(pipeline["before"], pipeline["after"], offload=pipeline["offload"])
    where = _values(ex, "offload", "after")
    assert [(op, value) for op, _, value in where] == \
        [("add", "ccompiler.conv2d_add_relu on ccompiler")] * 3 + \
        [("mean", "host: uncovered")] + \
        [("nn.conv2d", "ccompiler.conv2d_add_relu on ccompiler")] * 3 + \
        [("nn.relu", "ccompiler.conv2d_add_relu on ccompiler")] * 3
    mean = next(n for n in ex.models["after"].graph["nodes"] if n["label"] == "mean")
    assert _attr(mean, "offload") == ("stays on the host: uncovered: no pattern table entry "
                                      "covers relax.mean")


def test_site_verdicts_are_overlaid_pass_and_fail_with_the_error(pipeline):
    ex = explore(pipeline["before"], pipeline["rewritten"], log=pipeline["log"],
                 sites=pipeline["sites"])
    verdicts = _values(ex, "site validation", "after")
    assert [(op, value) for op, _, value in verdicts] == [("add", "pass")] * 3
    mod = tanh_model()
    log = pk.RewriteLog()
    wrong = pk.rewrite(TanhIsRelu(), mod, log=log)
    report = pk.validate_sites(mod, wrong, log)
    ex = explore(mod, wrong, log=log, sites=report)
    assert [(op, value) for op, _, value in _values(ex, "site validation", "after")] == \
        [("nn.relu", "FAIL")]
    node = next(n for n in ex.models["after"].graph["nodes"] if _attr(n, "site validation"))
    assert _attr(node, "site validation").startswith("FAIL test.tanh_is_relu at main:")


def test_bisects_first_diverging_step_is_overlaid_where_its_binding_is():
    mod = tanh_model()
    found = bisect(mod, [TanhIsRelu()])
    ex = explore(found.before, found.after, divergence=found)
    step = "diverges at step 1 (test.tanh_is_relu)"
    assert [(op, value) for op, _, value in _values(ex, "bisect", "after")] == \
        [("nn.relu", step)]
    assert [(op, value) for op, _, value in _values(ex, "bisect", "before")] == \
        [("tanh", step)]
    node = next(n for n in ex.models["after"].graph["nodes"] if _attr(n, "bisect"))
    assert "max abs error" in _attr(node, "bisect")


def test_a_divergence_per_binding_is_a_numeric_overlay_on_a_gradient():
    mod = tanh_model()
    names = [b.var.name for b in mod["main"].body.blocks[0].bindings]
    ex = explore(mod, divergence={names[0]: 0.0, names[1]: 0.5})
    (overlay,) = ex.overlays
    data = overlay.node_data()["before"]
    assert data["gradient"][0]["stop"] == 0 and data["gradient"][-1]["stop"] == 1
    assert sorted(r["value"] for r in data["results"].values()) == [0.0, 0.5]


def test_overlays_load_into_model_explorers_node_data_classes(pipeline):
    ex = explore(pipeline["before"], pipeline["after"], rewritten=pipeline["rewritten"],
                 log=pipeline["log"], offload=pipeline["offload"], sites=pipeline["sites"])
    assert {(o.name, o.model) for o in ex.overlays} == {
        ("rewrites", "before"), ("rewrites", "rewritten"), ("offload", "after"),
        ("site validation", "rewritten")}
    for overlay in ex.overlays:
        data = json.loads(overlay.to_json())
        graphs = {}
        for graph_id, graph in data.items():
            results = {k: _strict(ndb.NodeDataResult, v) for k, v in graph["results"].items()}
            graphs[graph_id] = _strict(ndb.GraphNodeData, dict(graph, results=results))
            assert graph_id in ex.models
            assert set(results) <= {n["id"] for n in ex.models[graph_id].graph["nodes"]}
        again = json.loads(ndb.ModelNodeData(graphsData=graphs).to_json_string())
        for graph_id, graph in data.items():  # Model Explorer adds its defaults
            assert {key: again[graph_id][key] for key in graph} == graph


# -- files and the server -------------------------------------------------------------------
def test_written_files_make_model_explorers_config_with_both_graphs(pipeline, tmp_path):
    ex = explore(pipeline["before"], pipeline["after"], log=pipeline["log"],
                 offload=pipeline["offload"])
    written = ex.write(tmp_path)
    assert {p.name for p in written} == {"before.json", "after.json",
                                         "before.rewrites.nodedata.json",
                                         "after.rewrites.nodedata.json",
                                         "after.offload.nodedata.json", "explorer.json"}
    config = ex.config()
    assert isinstance(config, model_explorer.config().__class__)
    assert [s["url"] for s in config.model_sources] == ["graphs://before/0",
                                                        "graphs://after/1"]
    assert config.node_data_target_models == ["before", "after", "after"]
    assert json.loads(config.get_model_explorer_graphs(1)) == json.loads(ex.graphs_json("after"))


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", port)) != 0


def test_the_server_serves_the_graphs_and_stops_leaving_the_port_free(pipeline):
    ex = explore(pipeline["before"], pipeline["after"], offload=pipeline["offload"])
    with ex.serve() as server:
        assert server.running
        with urllib.request.urlopen(f"{server.base}/api/v1/load_graphs_json?graph_index=1",
                                    timeout=10) as reply:
            assert json.loads(reply.read()) == json.loads(ex.graphs_json("after"))
        with urllib.request.urlopen(f"{server.base}/api/v1/load_node_data?node_data_index=0",
                                    timeout=10) as reply:
            assert json.loads(json.loads(reply.read())["content"]) == \
                ex.overlays[0].node_data()
        # the two graphs open side by side, each with its main function's group open
        data = json.loads(urllib.parse.unquote(server.url.split("data=", 1)[1]))
        panes = data["uiState"]["paneStates"]
        assert [p["selectedGraphId"] for p in panes] == ["before", "after"]
        assert [p["deepestExpandedGroupNodeIds"] for p in panes] == [["main___group___"]] * 2
        port = int(server.base.rsplit(":", 1)[1])
    assert not server.running and server.process.returncode is not None
    deadline = time.monotonic() + 10
    while not _port_free(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _port_free(port)


def test_in_a_notebook_the_explorer_is_a_frame_on_its_own_server(pipeline):
    ex = explore(pipeline["before"])
    try:
        html = ex._repr_html_()
        assert html.startswith("<iframe src=\"http://localhost:")
        assert "show_open_in_new_tab=1" in html
        assert ex._server.running
    finally:
        ex.stop()
    assert ex._server is None


def test_without_the_extra_serving_says_how_to_install_it_and_writing_still_works(
        monkeypatch, tmp_path):
    ex = explore(conv_layers(1)["main"])  # a bare function is drawn as a module's main
    monkeypatch.setitem(__import__("sys").modules, "model_explorer", None)
    for call in (ex.config, ex.serve):
        with pytest.raises(ImportError, match=r"^patternkit.explore needs Google's Model "
                                              r"Explorer: pip install 'patternkit\[explorer\]'"):
            call()
    assert (tmp_path / "before.json") in ex.write(tmp_path)


def test_show_displays_model_explorer_in_a_frame_and_reuses_its_server(monkeypatch):
    display = pytest.importorskip("IPython.display", reason="IPython is not installed")
    shown = []
    monkeypatch.setattr(display, "display", shown.append)
    ex = explore(tanh_model())
    try:
        first = ex.show()
        assert ex.show() is first and first.running  # one server per Explorer
        assert [type(f).__name__ for f in shown] == ["IFrame", "IFrame"]
        assert shown[0].src == first.frame_url() and shown[0].height == 850
    finally:
        ex.stop()
    assert not first.running
