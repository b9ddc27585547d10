"""AnnotateTarget and PartitionGraph: the Relay BYOC flow on Relax."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.byoc import (AnnotateTarget, MergeComposite, PartitionGraph, PatternTableError,
                             composite_counts, external_functions, inline_external,
                             offload_report)
from patternkit.dpl.pattern import is_op, wildcard
from patternkit.patterns.conv import conv2d_add_relu

TABLE = [("ccompiler.conv_add_relu", conv2d_add_relu())]


def test_partition_graph_lifts_composites_into_external_functions_with_relay_attrs(
        resnet_block, flow, main_ops, bit_exact):
    out = flow(resnet_block, MergeComposite(TABLE), PartitionGraph("ccompiler"))
    externals = external_functions(out, "ccompiler")
    # max_pool2d separates the first conv from the other two, which merge.
    assert sorted(externals) == ["ccompiler_main_0", "ccompiler_main_1"]
    for name, func in externals.items():
        attrs = dict(func.attrs)
        assert str(attrs["Codegen"]) == "ccompiler" and str(attrs["Compiler"]) == "ccompiler"
        assert str(attrs["global_symbol"]) == name and bool(attrs["Primitive"])
    assert composite_counts(out) == {"ccompiler.conv_add_relu": 3}
    assert relax.analysis.check_well_formed(out)
    host = main_ops(out)
    assert host.count("relax.nn.max_pool2d") == 1 and host.count("relax.add") == 1
    bit_exact(resnet_block, inline_external(out))


def test_partition_graph_without_merging_gives_one_function_per_composite(
        resnet_block, flow, bit_exact):
    out = flow(resnet_block, MergeComposite(TABLE), PartitionGraph("ccompiler", merge=False))
    assert sorted(external_functions(out)) == [f"ccompiler_main_{i}" for i in range(3)]
    assert relax.analysis.check_well_formed(out)
    bit_exact(resnet_block, inline_external(out))


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


def test_partition_graph_never_merges_across_host_code_into_a_cycle(flow, bit_exact):
    mod = _cycle_module()
    out = flow(mod, MergeComposite(TABLE), PartitionGraph("ccompiler"))
    assert len(external_functions(out)) == 2
    assert relax.analysis.check_well_formed(out)
    bit_exact(mod, inline_external(out))


def test_annotate_target_offloads_single_supported_ops(resnet_block, flow, bit_exact):
    annotate = AnnotateTarget("ccompiler", {"nn.max_pool2d": True, "add": False})
    out = flow(resnet_block, MergeComposite(TABLE), annotate, PartitionGraph("ccompiler"))
    assert composite_counts(out) == {"ccompiler.conv_add_relu": 3, "ccompiler.nn.max_pool2d": 1}
    bit_exact(resnet_block, inline_external(out))


def test_annotate_target_predicate_can_veto_with_a_reason(resnet_block):
    ops = {"nn.max_pool2d": lambda pre: pk.reject("pooling unsupported")}
    report = offload_report(resnet_block, TABLE, compiler="ccompiler", ops=ops)
    [pool] = [h for h in report.host_ops if h.op == "relax.nn.max_pool2d"]
    assert pool.kind == "vetoed" and pool.reason == "pooling unsupported"
    assert pool.entry == "ccompiler.nn.max_pool2d"


def test_partition_graph_only_takes_its_own_compiler(resnet_block, flow, bit_exact):
    table = [("ccompiler.conv_add_relu", conv2d_add_relu()),
             ("other.pool", is_op("nn.max_pool2d")(wildcard()))]
    out = flow(resnet_block, MergeComposite(table), PartitionGraph("ccompiler"))
    assert set(external_functions(out)) == {"ccompiler_main_0", "ccompiler_main_1"}
    assert composite_counts(out) == {"ccompiler.conv_add_relu": 3, "other.pool": 1}
    bit_exact(resnet_block, inline_external(out))


@pytest.mark.parametrize("compiler", ["", "a.b", 3])
def test_bad_compiler_names_are_refused(compiler):
    with pytest.raises(PatternTableError, match="compiler must be a non-empty name"):
        PartitionGraph(compiler)


def test_annotate_target_refuses_unknown_ops_naming_them():
    with pytest.raises(PatternTableError, match="op entry 'nn.relux'"):
        AnnotateTarget("ccompiler", {"nn.relux": True})


def test_partition_graph_leaves_a_module_without_composites_alone(resnet_block):
    text = resnet_block.script()
    out = PartitionGraph("ccompiler")(resnet_block)
    tvm.ir.assert_structural_equal(out, resnet_block)
    assert external_functions(out) == {}
    assert resnet_block.script() == text
