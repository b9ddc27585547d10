"""AnnotateTarget / PartitionGraph / offload report: the Relay BYOC flow on Relax."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit import ir as pk_ir
from patternkit.byoc import (AnnotateTarget, PartitionGraph, external_functions,
                             inline_external)
from patternkit.byoc import MergeComposite, PatternTableError, composite_counts
from patternkit.byoc import offload_report
from patternkit.dpl.pattern import is_op, wildcard
from patternkit.patterns.conv import ConvAddReluComposite, conv2d_add_relu

TOL = {"rtol": 1e-5, "atol": 1e-5}
TABLE = [("ccompiler.conv_add_relu", conv2d_add_relu())]


@pytest.fixture
def block():
    return ConvAddReluComposite.example()


def _flow(*passes):
    with tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(list(passes))


def test_partition_graph_lifts_composites_into_external_functions_with_relay_attrs(block):
    out = _flow(MergeComposite(TABLE), PartitionGraph("ccompiler"))(block)
    externals = external_functions(out, "ccompiler")
    # max_pool2d separates the first conv from the other two, which merge.
    assert sorted(externals) == ["ccompiler_main_0", "ccompiler_main_1"]
    for name, func in externals.items():
        attrs = dict(func.attrs)
        assert str(attrs["Codegen"]) == "ccompiler" and str(attrs["Compiler"]) == "ccompiler"
        assert str(attrs["global_symbol"]) == name and bool(attrs["Primitive"])
    assert composite_counts(out) == {"ccompiler.conv_add_relu": 3}
    assert relax.analysis.check_well_formed(out)
    main_ops = [pk_ir.op_name(b.value) for b in out["main"].body.blocks[0].bindings]
    assert main_ops.count("relax.nn.max_pool2d") == 1 and main_ops.count("relax.add") == 1
    pk.assert_same_numerics(block, inline_external(out), **TOL)


def test_partition_graph_without_merging_gives_one_function_per_composite(block):
    out = _flow(MergeComposite(TABLE), PartitionGraph("ccompiler", merge=False))(block)
    assert sorted(external_functions(out)) == [f"ccompiler_main_{i}" for i in range(3)]
    assert relax.analysis.check_well_formed(out)
    pk.assert_same_numerics(block, inline_external(out), **TOL)


def _cycle_module():
    """A -> sigmoid (host) -> conv+add B, and A feeds B's add directly."""
    rng = np.random.default_rng(3)
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))

    def w():
        return relax.const(rng.standard_normal((4, 4, 3, 3)).astype("float32") * 0.3)

    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w(), padding=1))))
            h = bb.emit(relax.op.sigmoid(a))
            c = bb.emit(relax.op.nn.conv2d(h, w(), padding=1))
            out = bb.emit_output(relax.op.add(c, a))
        bb.emit_func_output(out)
    return bb.get()


def test_partition_graph_never_merges_across_host_code_into_a_cycle():
    mod = _cycle_module()
    out = _flow(MergeComposite(TABLE), PartitionGraph("ccompiler"))(mod)
    assert len(external_functions(out)) == 2
    assert relax.analysis.check_well_formed(out)
    pk.assert_same_numerics(mod, inline_external(out), **TOL)


def test_annotate_target_offloads_single_supported_ops(block):
    out = _flow(MergeComposite(TABLE), AnnotateTarget("ccompiler", {"nn.max_pool2d": True,
                                                                   "add": False}),
                PartitionGraph("ccompiler"))(block)
    assert composite_counts(out) == {"ccompiler.conv_add_relu": 3, "ccompiler.nn.max_pool2d": 1}
    pk.assert_same_numerics(block, inline_external(out), **TOL)


def test_annotate_target_predicate_can_veto_with_a_reason(block):
    ops = {"nn.max_pool2d": lambda pre: pk.reject("pooling unsupported")}
    report = offload_report(block, TABLE, compiler="ccompiler", ops=ops)
    [pool] = [h for h in report.host_ops if h.op == "relax.nn.max_pool2d"]
    assert pool.kind == "vetoed" and pool.reason == "pooling unsupported"
    assert pool.entry == "ccompiler.nn.max_pool2d"


def test_partition_graph_only_takes_its_own_compiler(block):
    table = [("ccompiler.conv_add_relu", conv2d_add_relu()),
             ("other.pool", is_op("nn.max_pool2d")(wildcard()))]
    out = _flow(MergeComposite(table), PartitionGraph("ccompiler"))(block)
    assert set(external_functions(out)) == {"ccompiler_main_0", "ccompiler_main_1"}
    assert composite_counts(out) == {"ccompiler.conv_add_relu": 3, "other.pool": 1}
    pk.assert_same_numerics(block, inline_external(out), **TOL)


@pytest.mark.parametrize("compiler", ["", "a.b", 3])
def test_bad_compiler_names_are_refused(compiler):
    with pytest.raises(PatternTableError, match="compiler must be a non-empty name"):
        PartitionGraph(compiler)


def test_annotate_target_refuses_unknown_ops_naming_them():
    with pytest.raises(PatternTableError, match="op entry 'nn.relux'"):
        AnnotateTarget("ccompiler", {"nn.relux": True})


def test_partition_graph_leaves_a_module_without_composites_alone(block):
    assert PartitionGraph("ccompiler")(block).same_as(block) or \
        tvm.ir.structural_equal(PartitionGraph("ccompiler")(block), block)


def test_offload_report_counts_composites_and_explains_every_host_op(block):
    table = [("ccompiler.conv_add", is_op("add")(is_op("nn.conv2d")(wildcard(), wildcard()),
                                                 wildcard())),
             ("ccompiler.add_relu", is_op("nn.relu")(is_op("add")(wildcard(), wildcard()))),
             ("ccompiler.residual", is_op("add")(wildcard(), wildcard()),
              lambda pre: pk.reject("no residual adds"))]
    report = offload_report(block, table, compiler="ccompiler")
    assert report.composites == {"ccompiler.conv_add": 3}
    by_kind = {h.op: h for h in report.host_ops}
    assert by_kind["relax.nn.max_pool2d"].kind == "uncovered"
    relu = [h for h in report.host_ops if h.op == "relax.nn.relu"]
    assert len(relu) == 2 and all(h.kind == "overlap" and h.entry == "ccompiler.add_relu"
                                  for h in relu)
    assert "'ccompiler.conv_add' (higher priority) already took" in relu[0].reason
    assert by_kind["relax.add"].kind == "vetoed" and by_kind["relax.add"].reason == "no residual adds"
    text = str(report)
    assert "offloaded 6 of 10 op call(s) in 3 composite(s)" in text
    assert "ccompiler.conv_add: 3" in text


def test_offload_report_names_escaping_intermediates():
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.random((4, 3, 3, 3), "float32"))))
            r = bb.emit(relax.op.nn.relu(c))
            out = bb.emit_output(relax.Tuple([r, c]))
        bb.emit_func_output(out)
    mod = bb.get()
    strict = ConvAddReluComposite("ccompiler", bias="absent", relu="required")
    report = offload_report(mod, [strict.entry()])
    kinds = {h.op: h.kind for h in report.host_ops}
    assert kinds == {"relax.nn.conv2d": "escape", "relax.nn.relu": "escape"}
