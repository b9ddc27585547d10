"""offload_report: what an external compiler gets, and why every other op stays on the host."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.byoc import (
    CompositeLog,
    PartitionGraph,
    explain_offload,
    external_functions,
    inline_external,
    merge_composite,
    offload_report,
)
from patternkit.dpl.pattern import is_op, wildcard
from patternkit.patterns.conv import ConvAddReluComposite

CONV_ADD = ("ccompiler.conv_add", is_op("add")(is_op("nn.conv2d")(wildcard(), wildcard()),
                                               wildcard()))
ADD_RELU = ("ccompiler.add_relu", is_op("nn.relu")(is_op("add")(wildcard(), wildcard())))


def _conv_relu_feeding_a_tuple() -> tvm.IRModule:
    """conv2d -> relu, with the conv result also returned: an escaping intermediate."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.random((4, 3, 3, 3), "float32"))))
            r = bb.emit(relax.op.nn.relu(c))
            out = bb.emit_output(relax.Tuple([r, c]))
        bb.emit_func_output(out)
    return bb.get()


def test_offload_report_counts_composites_and_explains_every_host_op(resnet_block):
    table = [CONV_ADD, ADD_RELU,
             ("ccompiler.residual", is_op("add")(wildcard(), wildcard()),
              lambda pre: pk.reject("no residual adds"))]
    report = offload_report(resnet_block, table, compiler="ccompiler")
    assert report.composites == {"ccompiler.conv_add": 3}
    by_kind = {h.op: h for h in report.host_ops}
    assert by_kind["relax.nn.max_pool2d"].kind == "uncovered"
    relu = [h for h in report.host_ops if h.op == "relax.nn.relu"]
    assert len(relu) == 2 and all(h.kind == "overlap" and h.entry == "ccompiler.add_relu"
                                  for h in relu)
    assert "'ccompiler.conv_add' (higher priority) already took" in relu[0].reason
    assert by_kind["relax.add"].kind == "vetoed"
    assert by_kind["relax.add"].reason == "no residual adds"
    text = str(report)
    assert "offloaded 6 of 10 op call(s) in 3 composite(s)" in text
    assert "ccompiler.conv_add: 3" in text


def test_explaining_a_merge_already_run_reports_what_offload_report_does(resnet_block):
    table = [CONV_ADD, ADD_RELU,
             ("ccompiler.residual", is_op("add")(wildcard(), wildcard()),
              lambda pre: pk.reject("no residual adds"))]
    log = CompositeLog()
    merged = merge_composite(resnet_block, table, log=log)
    explained = explain_offload(merged, log, table)
    assert explained.module.same_as(merged)
    reported = offload_report(resnet_block, table)
    assert explained.composites == reported.composites == {"ccompiler.conv_add": 3}
    assert explained.host_ops == reported.host_ops
    assert explained.offloaded_ops == reported.offloaded_ops == 6


def test_an_op_no_entry_can_match_is_uncovered(resnet_block):
    report = offload_report(resnet_block, [CONV_ADD])
    uncovered = report.host_ops_of_kind("uncovered")
    assert [(h.var, h.op) for h in uncovered] == [
        ("lv2", "relax.nn.relu"), ("lv3", "relax.nn.max_pool2d"), ("lv6", "relax.nn.relu"),
        ("gv", "relax.add")]
    pool = uncovered[1]
    assert pool.reason == "no pattern table entry covers relax.nn.max_pool2d"
    assert pool.entry is None and pool.others == ()
    assert report.host_ops == uncovered


def test_a_vetoed_match_reports_the_checks_own_reason_and_entry(resnet_block):
    table = [("ccompiler.pool", is_op("nn.max_pool2d")(wildcard()),
              lambda pre: pk.reject("pool windows above 2 are not supported"))]
    report = offload_report(resnet_block, table)
    [pool] = report.host_ops_of_kind("vetoed")
    assert (pool.var, pool.entry) == ("lv3", "ccompiler.pool")
    assert pool.reason == "pool windows above 2 are not supported"
    assert "main:lv3 = relax.nn.max_pool2d: vetoed [ccompiler.pool]: pool windows above 2" \
        in str(report)


def test_a_check_returning_false_is_vetoed_with_a_generic_reason(resnet_block):
    table = [("ccompiler.pool", is_op("nn.max_pool2d")(wildcard()), lambda pre: False)]
    [pool] = offload_report(resnet_block, table).host_ops_of_kind("vetoed")
    assert pool.reason == "check returned False"


def test_an_overlap_names_the_higher_priority_entry_that_took_the_op(resnet_block):
    report = offload_report(resnet_block, [CONV_ADD, ADD_RELU])
    overlaps = report.host_ops_of_kind("overlap")
    assert [(h.var, h.op, h.entry) for h in overlaps] == [
        ("lv2", "relax.nn.relu", "ccompiler.add_relu"),
        ("lv6", "relax.nn.relu", "ccompiler.add_relu")]
    # each relu's add was taken by conv_add, which comes first in the table
    assert [h.reason for h in overlaps] == [
        "'ccompiler.conv_add' (higher priority) already took 'lv1'",
        "'ccompiler.conv_add' (higher priority) already took 'lv5'"]


def test_the_highest_priority_reason_wins_and_the_others_are_kept(resnet_block):
    lone_relu = ("ccompiler.relu", is_op("nn.relu")(wildcard()),
                 lambda pre: pk.reject("no lone relu"))
    report = offload_report(resnet_block, [CONV_ADD, ADD_RELU, lone_relu])
    relu = [h for h in report.host_ops if h.op == "relax.nn.relu"]
    assert [(h.kind, h.entry) for h in relu] == [("overlap", "ccompiler.add_relu")] * 2
    assert all(h.others == (("vetoed", "no lone relu", "ccompiler.relu"),) for h in relu)
    # in the other priority order, the veto is the first reason
    report = offload_report(resnet_block, [CONV_ADD, lone_relu, ADD_RELU])
    relu = [h for h in report.host_ops if h.op == "relax.nn.relu"]
    assert [(h.kind, h.reason) for h in relu] == [("vetoed", "no lone relu")] * 2
    assert all(h.others[0][0] == "overlap" and h.others[0][2] == "ccompiler.add_relu"
               for h in relu)


def test_offload_report_names_escaping_intermediates():
    mod = _conv_relu_feeding_a_tuple()
    strict = ConvAddReluComposite("ccompiler", bias="absent", relu="required")
    report = offload_report(mod, [strict.entry()])
    kinds = {h.op: h.kind for h in report.host_ops}
    assert kinds == {"relax.nn.conv2d": "escape", "relax.nn.relu": "escape"}
    name = strict.entry()[0]
    for host in report.host_ops:
        assert host.entry == name
        assert host.reason == "intermediate 'lv' is also used by 'gv' outside the match"
    assert report.offloaded_ops == 0 and report.composites == {}


def test_an_op_blocked_by_an_earlier_match_of_the_same_entry_is_an_overlap():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    mod = pk.from_expr(relax.op.exp(relax.op.exp(relax.op.exp(x))))
    report = offload_report(mod, [("c.exp_exp", is_op("exp")(is_op("exp")(wildcard())))])
    assert report.composites == {"c.exp_exp": 1}
    [first] = report.host_ops
    assert (first.var, first.kind, first.entry) == ("lv", "overlap", "c.exp_exp")


def test_a_skip_is_pinned_on_the_binding_it_concerns_not_on_another_with_its_name():
    # Relax names need not be unique (a rewrite's new bindings may reuse 'lv8'): the
    # relu named 't' like the blocked exp is no candidate of any entry, hence uncovered
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.exp(x), "t")
            u = bb.emit(relax.op.exp(t), "u")
            v = bb.emit(relax.op.exp(u), "v")
            out = relax.Var("t", relax.TensorType((2, 3), "float32"))  # BlockBuilder renames
            bb.emit_normalized(relax.VarBinding(out, bb.normalize(relax.op.nn.relu(v))))
            bb.emit_output(out)
        bb.emit_func_output(out)
    report = offload_report(bb.get(), [("c.exp_exp", is_op("exp")(is_op("exp")(wildcard())))])
    assert [(h.var, h.op, h.kind) for h in report.host_ops] == [
        ("t", "relax.exp", "overlap"), ("t", "relax.nn.relu", "uncovered")]


def test_the_reported_module_is_ready_for_partition_graph_and_the_input_is_kept(resnet_block,
                                                                               bit_exact):
    text = resnet_block.script()
    report = offload_report(resnet_block, [CONV_ADD, ADD_RELU])
    assert resnet_block.script() == text
    out = PartitionGraph("ccompiler")(report.module)
    assert sorted(external_functions(out, "ccompiler")) == ["ccompiler_main_0",
                                                            "ccompiler_main_1"]
    bit_exact(resnet_block, inline_external(out))


def test_single_op_annotations_need_the_compiler_name(resnet_block):
    with pytest.raises(ValueError, match=r"ops=\.\.\. needs compiler=\.\.\."):
        offload_report(resnet_block, [CONV_ADD], ops={"nn.max_pool2d": True})
