"""Tests of patternkit.viz: graph model, DOT, clusters, collapse/focus/highlight, display, diff."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard
from tvm.relax.op import add, divide, nn, sqrt, subtract
from tvm.relax.transform import FuseOpsByPattern, MergeCompositeFunctions
from tvm.script import ir as I, relax as R, tirx as T
from viz_cases import CONV_BIAS_RELU, SOFTMAX, ConvBiasReluSoftmax, composite_module

from patternkit.viz import (
    DotUnavailable,
    VizError,
    VizGraph,
    display as viz_display,
    viz_diff,
    viz_expr,
)
from patternkit.viz.labels import compact_type, short_op_name
from patternkit.viz.palette import fill_color

SNAPSHOTS = Path(__file__).parent / "snapshots"
HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="the Graphviz 'dot' binary is not installed")


# ---------------------------------------------------------------- IR under test
@I.ir_module
class Symbolic:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32"), w: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.nn.relu(y)
            R.output(z)
        return z


@I.ir_module
class BatchNormRelu:
    @R.function
    def main(x: R.Tensor((1, 4, 8, 8), "float32"), g: R.Tensor((4,), "float32"),
             b: R.Tensor((4,), "float32"), mu: R.Tensor((4,), "float32"),
             var: R.Tensor((4,), "float32")):
        with R.dataflow():
            bn = R.nn.batch_norm(x, g, b, mu, var, axis=1)
            y = bn[0]
            r = R.nn.relu(y)
            out = (r, bn[1])
            R.output(out)
        return out


def codegen_module():
    fused = FuseOpsByPattern(
        [("mybackend.conv2d_bias_relu", CONV_BIAS_RELU), ("mybackend.softmax", SOFTMAX)]
    )(ConvBiasReluSoftmax)
    return MergeCompositeFunctions()(fused)


def fuseops_module():
    pipe = tvm.transform.Sequential([
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(),
    ])
    return pipe(ConvBiasReluSoftmax)


def _t(shape):
    return relax.TensorType(shape, "float32")


def partitioned_module():
    """patternkit ``partition()`` output: a local function bound in the dataflow block."""
    a, m, v = relax.Var("a", _t((1, 4))), relax.Var("m", _t((4,))), relax.Var("v", _t((4,)))
    bbf = relax.BlockBuilder()
    with bbf.function("lv_f", [a, m, v], attrs={"PartitionedFromPattern": "subtract_sqrt_divide_"},
                      private=True):
        with bbf.dataflow():
            s = bbf.emit(subtract(a, m))
            q = bbf.emit(sqrt(v))
            d = bbf.emit_output(divide(s, q))
        bbf.emit_func_output(d)
    local = bbf.get()["lv_f"]
    x, mean, var = (relax.Var("x", _t((1, 4))), relax.Var("mean", _t((4,))),
                    relax.Var("var", _t((4,))))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, mean, var]):
        with bb.dataflow():
            f = bb.emit(local, "lv_f")
            lv = bb.emit(relax.Call(f, [x, mean, var]), "lv")
            r = bb.emit_output(nn.relu(lv), "r")
        bb.emit_func_output(r)
    return bb.get()


def cluster_by_kind(graph: VizGraph, kind: str):
    return [c for c in graph.model.clusters.values() if c.kind == kind]


def nodes_in(graph: VizGraph, cluster_id: str):
    return sorted(graph.model.nodes_under(cluster_id))


def edge_pairs(graph: VizGraph):
    return {(e.src, e.dst) for e in graph.model.edges}


# ---------------------------------------------------------------- labels
def test_compact_type_writes_dtype_and_dims_tersely():
    assert compact_type(_t((1, 64, 56, 56))) == "f32[1,64,56,56]"
    assert compact_type(relax.TensorType((), "int64")) == "i64[]"
    assert compact_type(relax.TensorType(ndim=2, dtype="float16")) == "f16[?x?]"
    pair = relax.TupleType([_t((4,)), relax.TensorType((2,), "int32")])
    assert compact_type(pair) == "(f32[4], i32[2])"
    n = tvm.tirx.Var("n", "int64")
    assert compact_type(relax.TensorType((n, n * 2), "bfloat16")) == "bf16[n,n*2]"


def test_short_op_names_follow_the_selected_style():
    assert short_op_name("relax.nn.conv2d", "relay") == "nn.conv2d"
    assert short_op_name("relax.nn.conv2d", "relax") == "R.nn.conv2d"
    assert short_op_name("relax.nn.conv2d", "full") == "relax.nn.conv2d"


# ---------------------------------------------------------------- plain graphs
def test_plain_function_draws_params_ops_output_and_argument_indices():
    g = viz_expr(ConvBiasReluSoftmax)
    kinds = {n.id: n.kind for n in g.model.nodes.values()}
    assert kinds == {
        "main/x": "param", "main/w": "param", "main/c": "op", "main/b": "op",
        "main/r": "op", "main/s": "op", "main/return": "output",
    }
    conv = g.model.nodes["main/c"]
    assert conv.label == "nn.conv2d" and conv.type == "f32[1,4,8,8]"
    assert conv.key_attrs == ["padding"]  # default strides/dilation/layouts stay in the tooltip
    assert '"main/x" -> "main/c" [label="0"]' in g.source
    assert '"main/w" -> "main/c" [label="1"]' in g.source
    # the constant is folded into its consumer with its argument position
    assert g.model.nodes["main/b"].folded == ["[1] const f32[1,4,1,1]"]
    assert "const" not in kinds.values()


def test_constants_can_be_drawn_as_nodes():
    g = viz_expr(ConvBiasReluSoftmax, constants="node")
    consts = [n for n in g.model.nodes.values() if n.kind == "const"]
    assert len(consts) == 1 and consts[0].type == "f32[1,4,1,1]"
    assert (consts[0].id, "main/b") in edge_pairs(g)


def test_op_name_style_option():
    def conv_label(op_names):
        return viz_expr(ConvBiasReluSoftmax, op_names=op_names).model.nodes["main/c"].label

    assert conv_label("relax") == "R.nn.conv2d"
    assert conv_label("full") == "relax.nn.conv2d"


def test_symbolic_dims_are_shown_by_name():
    g = viz_expr(Symbolic)
    assert g.model.nodes["main/x"].type == "f32[n,4]"
    assert g.model.nodes["main/z"].type == "f32[n,4]"
    assert "f32[n,4]" in g.source


def test_tuples_and_tuple_get_item_become_edge_ports_not_nodes():
    g = viz_expr(BatchNormRelu)
    assert set(g.model.nodes) == {"main/x", "main/g", "main/b", "main/mu", "main/var", "main/bn",
                                  "main/r", "main/return"}
    ports = {(e.src, e.dst): e.port for e in g.model.edges}
    assert ports[("main/bn", "main/r")] == "[0]"
    # the returned tuple (r, bn[1]) is a bundle of two edges into the output
    assert ports[("main/r", "main/return")] == ".0"
    assert ports[("main/bn", "main/return")] == "[1].1"
    assert g.model.nodes["main/bn"].type == "(f32[1,4,8,8], f32[4], f32[4])"


def test_bare_expression_draws_free_vars_as_params():
    x, y = relax.Var("x", _t((2, 3))), relax.Var("y", _t((2, 3)))
    expr = nn.relu(add(x, y))
    g = viz_expr(expr)
    kinds = sorted(n.kind for n in g.model.nodes.values())
    assert kinds == ["op", "op", "param", "param"]
    labels = {n.label for n in g.model.nodes.values()}
    assert {"add", "nn.relu", "x", "y"} == labels


# ---------------------------------------------------------------- clusters
def test_composite_function_is_drawn_inline_as_a_cluster():
    g = viz_expr(composite_module())
    (comp,) = cluster_by_kind(g, "composite")
    assert comp.name == "mybackend.conv2d_bias_relu"
    assert comp.label.startswith("composite: mybackend.conv2d_bias_relu")
    inner = nodes_in(g, comp.id)
    assert [g.model.nodes[i].label for i in inner] == ["add", "nn.conv2d", "nn.relu"]
    conv_id = next(i for i in inner if g.model.nodes[i].label == "nn.conv2d")
    relu_id = next(i for i in inner if g.model.nodes[i].label == "nn.relu")
    # callee body is wired straight to the caller's arguments and result user
    assert ("main/x", conv_id) in edge_pairs(g) and ("main/w", conv_id) in edge_pairs(g)
    assert (relu_id, "main/s") in edge_pairs(g)
    s = g.model.summary()
    assert s["composites"] == {"mybackend.conv2d_bias_relu": 1}
    assert (s["offloaded_ops"], s["host_ops"]) == (3, 1)
    assert 'subgraph "cluster_1"' in g.source and "composite mybackend.conv2d_bias_relu" in g.source


def test_codegen_function_holds_its_composite_clusters():
    g = viz_expr(codegen_module())
    (cg,) = cluster_by_kind(g, "codegen")
    comps = cluster_by_kind(g, "composite")
    assert cg.name == "mybackend"
    assert sorted(c.name for c in comps) == ["mybackend.conv2d_bias_relu", "mybackend.softmax"]
    assert all(c.parent == cg.id for c in comps)
    assert len(nodes_in(g, cg.id)) == 4
    s = g.model.summary()
    assert (s["offloaded_ops"], s["host_ops"]) == (4, 0)
    # nesting in DOT: the composite subgraphs sit inside the codegen subgraph
    cg_at = g.source.index(f'subgraph "{cg.id}"')
    assert all(g.source.index(f'subgraph "{c.id}"') > cg_at for c in comps)


def test_fuseops_primitive_functions_with_call_tir():
    g = viz_expr(fuseops_module())
    (prim,) = cluster_by_kind(g, "primitive")
    assert prim.attrs["function"] == "fused_conv2d_add_relu"
    labels = sorted(g.model.nodes[i].label for i in nodes_in(g, prim.id))
    assert labels == ["call_tir add", "call_tir conv2d", "call_tir relu"]
    assert g.model.nodes["main/s"].label == "call_tir softmax"


def test_partition_local_function_is_a_cluster_named_by_pattern():
    g = viz_expr(partitioned_module())
    (part,) = cluster_by_kind(g, "partition")
    assert part.name == "subtract_sqrt_divide_" and part.attrs["function"] == "lv_f"
    inner = {g.model.nodes[i].label: i for i in nodes_in(g, part.id)}
    assert set(inner) == {"subtract", "sqrt", "divide"}
    assert ("main/x", inner["subtract"]) in edge_pairs(g)
    assert ("main/var", inner["sqrt"]) in edge_pairs(g)
    assert (inner["divide"], "main/r") in edge_pairs(g)


def test_calls_once_draws_each_callee_once_with_dashed_links():
    g = viz_expr(composite_module(), calls="once")
    call = g.model.nodes["main/lv"]
    assert call.kind == "call"
    (comp,) = cluster_by_kind(g, "composite")
    assert comp.parent is None
    calls = [e for e in g.model.edges if e.kind == "calls"]
    assert len(calls) == 1 and calls[0].dst == "main/lv"
    assert "style=\"dashed\"" in g.source


def test_module_with_two_root_functions_boxes_each():
    @I.ir_module
    class Two:
        @R.function
        def main(x: R.Tensor((2,), "float32")):
            return R.nn.relu(x)

        @R.function
        def other(x: R.Tensor((2,), "float32")):
            return R.exp(x)

    g = viz_expr(Two)
    assert g.model.functions == ["main", "other"]
    assert sorted(c.name for c in cluster_by_kind(g, "function")) == ["main", "other"]
    only = viz_expr(Two, functions="other")
    assert only.model.functions == ["other"]
    assert all(n.function == "other" for n in only.model.nodes.values())


# ---------------------------------------------------------------- determinism and snapshot
def test_dot_output_is_deterministic_and_colours_are_stable():
    a = viz_expr(codegen_module()).source
    b = viz_expr(codegen_module()).source
    assert a == b
    # colours come from a CRC-32 of the name: fixed across processes and runs
    assert fill_color("composite:mybackend.conv2d_bias_relu") == "#FFAABB"
    assert re.search(r'fillcolor="#FFAABB".*label="composite: mybackend.conv2d_bias_relu', a)


def test_composite_dot_matches_snapshot():
    source = viz_expr(composite_module()).source
    path = SNAPSHOTS / "viz_composite.dot"
    if os.environ.get("PATTERNKIT_UPDATE_SNAPSHOTS"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    assert path.exists(), f"missing {path}; run with PATTERNKIT_UPDATE_SNAPSHOTS=1 to create it"
    assert source == path.read_text(), \
        "DOT changed; review and rerun with PATTERNKIT_UPDATE_SNAPSHOTS=1"


def test_user_ir_is_not_modified():
    mod = codegen_module()
    text = mod.script()
    viz_expr(mod, highlight=[{"x": mod["main"].params[0]}], collapse="all")
    viz_diff(ConvBiasReluSoftmax, mod)
    assert mod.script() == text


# ---------------------------------------------------------------- collapse / focus / highlight
def test_collapse_all_replaces_clusters_with_single_nodes():
    g = viz_expr(codegen_module(), collapse="all")
    assert not cluster_by_kind(g, "composite") and not cluster_by_kind(g, "codegen")
    (node,) = [n for n in g.model.nodes.values() if n.kind == "collapsed"]
    assert node.label == "codegen: mybackend" and node.size == 4 and node.type == "f32[1,4,8,8]"
    assert ("main/x", node.id) in edge_pairs(g) and (node.id, "main/return") in edge_pairs(g)
    assert g.model.summary()["offloaded_ops"] == 4


def test_collapse_by_glob_only_hits_matching_clusters():
    g = viz_expr(codegen_module(), collapse="*softmax")
    collapsed = [n for n in g.model.nodes.values() if n.kind == "collapsed"]
    assert [n.label for n in collapsed] == ["composite: mybackend.softmax"]
    assert [c.name for c in cluster_by_kind(g, "composite")] == ["mybackend.conv2d_bias_relu"]


def test_auto_collapse_only_past_the_threshold():
    assert not [n for n in viz_expr(codegen_module()).model.nodes.values() if n.kind == "collapsed"]
    g = viz_expr(codegen_module(), max_nodes=4)
    assert len(g.model.nodes) <= 4
    assert any("auto-collapsed" in m for m in g.model.messages)


def test_focus_keeps_the_neighbourhood():
    g = viz_expr(ConvBiasReluSoftmax, focus="r", radius=1)
    assert set(g.model.nodes) == {"main/b", "main/r", "main/s"}
    by_var = viz_expr(BatchNormRelu, focus=BatchNormRelu["main"].params[0], radius=1)
    assert set(by_var.model.nodes) == {"main/x", "main/bn"}


def test_focus_naming_nothing_is_a_clear_error():
    with pytest.raises(VizError, match=r"focus='rr' names no node.*did you mean"):
        viz_expr(ConvBiasReluSoftmax, focus="rr")


def test_highlight_outlines_matches_and_labels_roles():
    f = ConvBiasReluSoftmax["main"]
    bindings = f.body.blocks[0].bindings
    match = {"conv": bindings[0].var, "bias_add": bindings[1].var, "root": bindings[2].var}
    g = viz_expr(ConvBiasReluSoftmax, highlight=[match, {"x": f.params[0]}])
    assert g.model.nodes["main/c"].roles == ["conv"]
    assert g.model.nodes["main/r"].roles == ["root"] and g.model.nodes["main/r"].match == 0
    assert g.model.nodes["main/x"].match == 1
    (box,) = cluster_by_kind(g, "match")
    assert sorted(nodes_in(g, box.id)) == ["main/b", "main/c", "main/r"]
    assert 'xlabel="root"' in g.source


def test_highlight_accepts_values_and_objects_with_match_bindings():
    f = ConvBiasReluSoftmax["main"]
    conv_call = f.body.blocks[0].bindings[0].value

    class Pattern:
        def match_bindings(self, func):
            return [{"conv": conv_call}]

    g = viz_expr(ConvBiasReluSoftmax, highlight=Pattern())
    assert g.model.nodes["main/c"].roles == ["conv"]


def test_highlight_reports_values_not_in_the_graph_and_rejects_garbage():
    stray = relax.Var("stray", _t((1,)))
    g = viz_expr(ConvBiasReluSoftmax, highlight=[{"x": stray}])
    assert any("not drawn" in m for m in g.model.messages)
    with pytest.raises(VizError, match="highlight"):
        viz_expr(ConvBiasReluSoftmax, highlight=[42])
    with pytest.raises(VizError, match="highlight"):
        viz_expr(ConvBiasReluSoftmax, highlight=3.5)


# ---------------------------------------------------------------- exports
def test_networkx_and_json_exports_hold_the_same_graph():
    g = viz_expr(codegen_module())
    nxg = g.to_networkx()
    assert nxg.number_of_nodes() == len(g.model.nodes)
    assert nxg.number_of_edges() == len(g.model.edges)
    assert nxg.nodes["main/x"]["kind"] == "param"
    assert any(c["kind"] == "codegen" for c in nxg.graph["clusters"].values())
    data = json.loads(g.to_json())
    assert [n["id"] for n in data["nodes"]] == list(g.model.nodes)
    assert data["summary"]["composites"] == {"mybackend.conv2d_bias_relu": 1,
                                             "mybackend.softmax": 1}
    assert g.to_json() == viz_expr(codegen_module()).to_json()


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [42, "main", np.zeros(3), None])
def test_objects_that_are_not_relax_ir_are_rejected(bad):
    with pytest.raises(VizError, match="expects a tvm.IRModule"):
        viz_expr(bad)


def test_primfunc_is_rejected_with_a_hint():
    prim = next(f for _, f in fuseops_module().functions.items()
                if isinstance(f, tvm.tirx.PrimFunc))
    with pytest.raises(VizError, match="PrimFunc"):
        viz_expr(prim)


def test_empty_module_gives_an_empty_graph_with_a_message():
    g = viz_expr(tvm.IRModule())
    assert not g.model.nodes
    assert "no Relax function" in g.summary
    assert "digraph" in g.source and "the module holds no Relax function" in g.source


@needs_dot
def test_empty_module_is_drawn_with_its_message():
    html = viz_expr(tvm.IRModule())._repr_html_()
    assert html.startswith('<div class="patternkit-viz"><svg')
    assert "the module holds no Relax function" in html


def test_empty_module_without_dot_shows_its_message_instead_of_a_drawing(monkeypatch):
    monkeypatch.setattr(viz_display, "dot_binary", lambda: None)
    html = viz_expr(tvm.IRModule())._repr_html_()
    assert "<svg" not in html and "No drawing" in html
    assert "the module holds no Relax function" in html


def test_bad_options_are_named():
    with pytest.raises(VizError, match="unknown visualiser option"):
        viz_expr(ConvBiasReluSoftmax, colour="red")
    with pytest.raises(VizError, match="constants="):
        viz_expr(ConvBiasReluSoftmax, constants="inline")
    with pytest.raises(VizError, match="collapse="):
        viz_expr(ConvBiasReluSoftmax, collapse=3)
    with pytest.raises(VizError, match=r"functions=.*'nope'"):
        viz_expr(ConvBiasReluSoftmax, functions=["nope"])


# ---------------------------------------------------------------- display
def test_display_without_dot_shows_summary_and_source(monkeypatch):
    monkeypatch.setattr(viz_display, "dot_binary", lambda: None)
    g = viz_expr(composite_module())
    html = g._repr_html_()
    assert "No drawing" in html and "apt-get install graphviz" in html
    assert "digraph" in html and "composites: mybackend.conv2d_bias_relu x1" in html
    assert g._repr_svg_() is None
    bundle = g._repr_mimebundle_()
    assert "image/svg+xml" not in bundle and "text/html" in bundle and "text/plain" in bundle
    with pytest.raises(DotUnavailable, match="not found"):
        g.render("/tmp/never-written")


def test_display_falls_back_when_layout_times_out(monkeypatch):
    def slow(*args, **kwargs):
        raise subprocess.TimeoutExpired(cmd="dot", timeout=kwargs.get("timeout"))

    monkeypatch.setattr(viz_display, "dot_binary", lambda: "/usr/bin/dot")
    monkeypatch.setattr(viz_display.subprocess, "run", slow)
    g = viz_expr(ConvBiasReluSoftmax, timeout=0.5)
    assert "did not finish within 0.5 s" in g._repr_html_()


def test_past_the_hard_limit_no_layout_is_attempted(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("dot must not run")

    monkeypatch.setattr(viz_display.subprocess, "run", boom)
    g = viz_expr(ConvBiasReluSoftmax, hard_limit=3)
    assert not g.layout_allowed
    assert "hard_limit=3" in g._repr_html_()


@needs_dot
def test_real_svg_holds_clusters_and_labels(tmp_path):
    g = viz_expr(codegen_module())
    path = g.render(tmp_path / "graph", format="svg")
    assert path.endswith("graph.svg")
    svg = Path(path).read_text()
    assert svg.count('class="cluster"') == 3
    for text in ("codegen: mybackend", "composite: mybackend.conv2d_bias_relu",
                 "composite: mybackend.softmax", "c = nn.conv2d", "f32[1,4,8,8]"):
        assert text in svg
    html = g._repr_html_()
    assert html.startswith('<div class="patternkit-viz"><svg') and "<title>" in html
    assert "image/svg+xml" in g._repr_mimebundle_()
    png = g.render(tmp_path / "graph", format="png")
    assert Path(png).read_bytes()[:4] == b"\x89PNG"


@needs_dot
def test_real_svg_of_a_diff_marks_removed_and_added(tmp_path):
    d = viz_diff(ConvBiasReluSoftmax, _relu_to_gelu(ConvBiasReluSoftmax))
    svg = d.pipe("svg").decode()
    assert "#d55e00" in svg.lower() and "#009e73" in svg.lower()
    assert "nn.gelu" in svg and "nn.relu" in svg


# ---------------------------------------------------------------- diff
def _relu_to_gelu(mod):
    pat = is_op("relax.nn.relu")(wildcard())
    new_main = rewrite_call(pat, lambda orig, m: relax.op.nn.gelu(orig.args[0]), mod["main"])
    out = tvm.IRModule({mod.get_global_var("main"): new_main})
    return out


def test_diff_of_identical_graphs_is_all_unchanged():
    d = viz_diff(ConvBiasReluSoftmax, ConvBiasReluSoftmax)
    assert {n.status for n in d.model.nodes.values()} == {"unchanged"}
    assert not [e for e in d.model.edges if e.status]


def test_diff_of_a_rewrite_marks_removed_and_added_nodes():
    after = _relu_to_gelu(ConvBiasReluSoftmax)
    d = viz_diff(ConvBiasReluSoftmax, after)
    status = {n.label: n.status for n in d.model.nodes.values()}
    assert status["nn.relu"] == "removed" and status["nn.gelu"] == "added"
    assert status["nn.conv2d"] == "unchanged" and status["nn.softmax"] == "unchanged"
    removed = next(n for n in d.model.nodes.values() if n.status == "removed")
    assert removed.id.startswith("before:")
    assert any(e.status == "removed" and e.dst == removed.id for e in d.model.edges)
    assert 'style="rounded,filled,dashed"' in d.source


def test_diff_of_a_partition_draws_absorbed_nodes_inside_the_new_cluster():
    d = viz_diff(ConvBiasReluSoftmax, composite_module())
    (comp,) = cluster_by_kind(d, "composite")
    assert comp.status == "added"
    inner = nodes_in(d, comp.id)
    assert {d.model.nodes[i].status for i in inner} == {"unchanged"}
    assert not [n for n in d.model.nodes.values() if n.status == "removed"]


def test_diff_uses_change_records_when_given():
    after = _relu_to_gelu(ConvBiasReluSoftmax)
    rec = SimpleNamespace(rule="act.relu_to_gelu", function="main", root="r", replaced=("r",))
    d = viz_diff(ConvBiasReluSoftmax, after, changes=[rec], color_by="rule")
    added = [n for n in d.model.nodes.values() if n.status == "added"]
    assert [n.rule for n in added] == ["act.relu_to_gelu"]
    assert 'xlabel="act.relu_to_gelu"' in d.source
    with pytest.raises(VizError, match="lacks"):
        viz_diff(ConvBiasReluSoftmax, after, changes=[SimpleNamespace(rule="x")])


def test_diff_context_limits_to_changes_and_side_by_side_layout():
    after = _relu_to_gelu(ConvBiasReluSoftmax)
    d = viz_diff(ConvBiasReluSoftmax, after, context=1)
    assert {n.label for n in d.model.nodes.values()} == {"add", "nn.relu", "nn.gelu", "nn.softmax"}
    sbs = viz_diff(ConvBiasReluSoftmax, after, layout="side_by_side")
    sides = sorted(c.name for c in cluster_by_kind(sbs, "side"))
    assert sides == ["after", "before"]
    assert sbs.model.nodes["before:main/r"].status == "removed"
    assert sbs.model.nodes["after:main/r"].status == "added"
    none = viz_diff(ConvBiasReluSoftmax, ConvBiasReluSoftmax, context=2)
    assert not none.model.nodes and "no changes" in none.summary
    with pytest.raises(VizError, match="layout="):
        viz_diff(ConvBiasReluSoftmax, after, layout="stacked")


def test_diff_rejects_non_ir():
    with pytest.raises(VizError):
        viz_diff(ConvBiasReluSoftmax, "after")
    assert tvm_ffi.structural_equal(ConvBiasReluSoftmax, ConvBiasReluSoftmax)


# ---------------------------------------------------------------- less common IR
@I.ir_module
class Unusual:
    @R.function
    def main(x: R.Tensor(("n",), "float32"), flag: R.Tensor((), "bool")):
        n = T.int64()
        y = R.match_cast(x, R.Tensor((n,), "float32"))
        s = R.shape([n])
        if flag:
            z = R.exp(y)
        else:
            z = R.negative(y)
        w = R.call_dps_packed("my_packed", (z,), out_ty=R.Tensor((n,), "float32"))
        return (w, s)

    @R.function
    def rec(x: R.Tensor((2,), "float32")) -> R.Tensor((2,), "float32"):
        cls = Unusual
        y = cls.rec(x)
        return y


def test_match_cast_if_packed_calls_and_recursion_are_drawn():
    g = viz_expr(Unusual)
    labels = {n.label for n in g.model.nodes.values()}
    expected = {"match_cast", "if", "call_dps_packed extern my_packed", "shape(n)", "call rec"}
    assert expected <= labels
    assert g.model.nodes["main/y"].type == "f32[n]"
    assert g.model.functions == ["main", "rec"]
    json.loads(g.to_json())


def test_an_if_draws_each_branch_in_a_cluster_wired_into_the_if_node():
    g = viz_expr(Unusual)
    branches = {c.label: c.id for c in cluster_by_kind(g, "branch")}
    assert sorted(branches) == ["z: else", "z: then"]
    then_node, = [n for n in g.model.nodes.values() if n.cluster == branches["z: then"]]
    else_node, = [n for n in g.model.nodes.values() if n.cluster == branches["z: else"]]
    assert (then_node.label, else_node.label) == ("exp", "negative")
    edges = edge_pairs(g)
    # the branches read y from outside; the If reads the flag and each branch's result
    assert {("main/y", then_node.id), ("main/y", else_node.id), ("main/flag", "main/z"),
            (then_node.id, "main/z"), (else_node.id, "main/z")} <= edges
    assert 'label="z: then"' in g.source


def test_key_attributes_skip_defaults_but_keep_what_matters():
    g = viz_expr(BatchNormRelu)
    assert g.model.nodes["main/bn"].key_attrs == ["axis", "epsilon", "training"]
    assert "momentum=0.1" in g.source  # still in the tooltip


@pytest.mark.parametrize("color_by, legend_entry", [
    ("compiler", "codegen mybackend"),
    ("composite", "composite mybackend.softmax"),
    ("op", "nn.conv2d"),
])
def test_colour_modes_fill_and_list_a_legend(color_by, legend_entry):
    g = viz_expr(codegen_module(), color_by=color_by)
    assert '"legend"' in g.source and legend_entry in g.source
    assert '"legend"' not in viz_expr(codegen_module(), color_by="none").source


def test_repeated_variable_names_get_distinct_ids():
    x = relax.Var("x", _t((2,)))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        a = bb.emit(nn.relu(x), "t")
        b = bb.emit(relax.op.exp(a))
        v = relax.Var("t", _t((2,)))  # a second binding that is also called "t"
        bb.emit_normalized(relax.VarBinding(v, bb.normalize(relax.op.negative(b))))
        bb.emit_func_output(v)
    g = viz_expr(bb.get())
    assert g.model.nodes["main/t"].label == "nn.relu"
    assert g.model.nodes["main/t~2"].label == "negative"
    assert (b.name and f"main/{b.name}", "main/t~2") in edge_pairs(g)


def test_diff_from_composites_to_codegen_keeps_ops_and_adds_the_codegen_box():
    d = viz_diff(composite_module(), codegen_module())
    ops = [n for n in d.model.nodes.values() if n.kind == "op"]
    assert {n.status for n in ops} == {"unchanged"}
    (cg,) = cluster_by_kind(d, "codegen")
    assert cg.status == "added"


def test_change_records_accept_global_vars_and_vars():
    after = _relu_to_gelu(ConvBiasReluSoftmax)
    r_var = ConvBiasReluSoftmax["main"].body.blocks[0].bindings[2].var
    rec = SimpleNamespace(rule="act.relu_to_gelu", function=after.get_global_var("main"),
                          root="r", replaced=(r_var,))
    d = viz_diff(ConvBiasReluSoftmax, after, changes=[rec])
    assert d.model.nodes["main/r"].rule == "act.relu_to_gelu"
    assert d.model.nodes["before:main/r"].status == "removed"


@I.ir_module
class HelperFirst:
    @R.function(private=True)
    def a_helper(x: R.Tensor((2,), "float32")) -> R.Tensor((2,), "float32"):
        return R.exp(x)

    @R.function(private=True)
    def b_caller(x: R.Tensor((2,), "float32")) -> R.Tensor((2,), "float32"):
        cls = HelperFirst
        y = cls.a_helper(x)
        return R.nn.relu(y)


def test_a_callee_met_before_its_caller_is_drawn_only_inside_the_caller():
    g = viz_expr(HelperFirst)
    assert g.model.functions == ["b_caller"]
    assert {n.function for n in g.model.nodes.values()} == {"b_caller"}
    (callee,) = [c for c in g.model.clusters.values() if c.name == "a_helper"]
    assert [g.model.nodes[i].label for i in nodes_in(g, callee.id)] == ["exp"]


def test_highlight_takes_a_rule_and_labels_its_roles():
    from patternkit.patterns.batchnorm import BatchnormCallback

    mod = BatchnormCallback().example()
    graph = viz_expr(mod, highlight=BatchnormCallback())
    source = graph.source
    assert "cluster_match_0" in source
    for role in ("x", "gamma", "beta", "mean", "var", "root"):
        assert f'xlabel="{role}"' in source, role
    assert "not drawn" not in source  # every role value is a node of the graph
