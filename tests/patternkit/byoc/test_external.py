"""AnnotateTarget and PartitionGraph: the Relay BYOC flow on Relax."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.byoc import (
    AnnotateTarget,
    MergeComposite,
    PartitionGraph,
    PatternTableError,
    composite_counts,
    external_functions,
    inline_external,
    offload_report,
    partition_graph,
)
from patternkit.dpl.pattern import is_op, wildcard
from patternkit.patterns.conv import conv2d_add_relu
from patternkit.testing import assert_roundtrip

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


def test_partition_graph_into_a_compiler_no_composite_carries_warns_naming_the_ones_present(
        resnet_block, caplog):
    merged = MergeComposite(TABLE)(resnet_block)
    with caplog.at_level(logging.WARNING, logger="patternkit.byoc.partition.external"):
        out = PartitionGraph("nosuch")(merged)
    tvm.ir.assert_structural_equal(out, merged)
    [record] = caplog.records
    assert "no composite carries 'nosuch'" in record.message
    assert "the composites in the module are for 'ccompiler'" in record.message


def test_composites_whose_names_carry_no_compiler_are_named_as_such(resnet_block, caplog):
    # a Relay-style table entry named "conv_add_relu" forms composites; the warning said
    # the module had none, and to run MergeComposite
    merged = MergeComposite([("conv_add_relu", conv2d_add_relu())])(resnet_block)
    with caplog.at_level(logging.WARNING, logger="patternkit.byoc.partition.external"):
        PartitionGraph("ccompiler")(merged)
    [record] = caplog.records
    assert "the module's composites ('conv_add_relu') name no compiler" in record.message
    assert "run MergeComposite" not in record.message


def test_partition_graph_strict_raises_when_there_is_nothing_to_partition(resnet_block):
    merged = MergeComposite(TABLE)(resnet_block)
    text = merged.script()
    with pytest.raises(pk.errors.NothingToPartition, match="no composite carries 'nosuch'"):
        PartitionGraph("nosuch", strict=True)(merged)  # keeps its type through the pass
    with pytest.raises(pk.errors.NothingToPartition, match="run MergeComposite or AnnotateTarget"):
        partition_graph(resnet_block, "ccompiler", strict=True)
    assert merged.script() == text
    assert external_functions(PartitionGraph("ccompiler", strict=True)(merged))


# -- symbolic shapes ------------------------------------------------------------------------
@I.ir_module
class DynamicBatchConvNet:
    """Two conv+bias+relu blocks on a dynamic batch ``n``, as ``torch.export`` writes a
    model exported with ``dynamic_shapes={"x": {0: batch}}``; the host's reshape reads
    ``n`` itself."""

    @R.function
    def main(x: R.Tensor(("n", 3, 8, 8), "float32"), w1: R.Tensor((4, 3, 3, 3), "float32"),
             b1: R.Tensor((1, 4, 1, 1), "float32"), w2: R.Tensor((4, 4, 3, 3), "float32"),
             b2: R.Tensor((1, 4, 1, 1), "float32")):
        n = T.int64()
        with R.dataflow():
            lv = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
            lv1 = R.add(lv, b1)
            lv2 = R.nn.relu(lv1)
            lv3 = R.nn.max_pool2d(lv2, pool_size=[2, 2], strides=[2, 2])
            lv4 = R.nn.conv2d(lv3, w2, padding=[1, 1, 1, 1])
            lv5 = R.add(lv4, b2)
            lv6 = R.nn.relu(lv5)
            lv7 = R.reshape(lv6, R.shape([n, 64]))
            R.output(lv7)
        return lv7


@I.ir_module
class DoubledBatch:
    """A composite whose input is ``(n * 2, 8)``: its parameters cannot define ``n``,
    which its types still read (the ``(batch * seq, hidden)`` inputs of a transformer's
    linear layers are the same case)."""

    @R.function
    def main(x: R.Tensor(("n", 8), "float32")):
        n = T.int64()
        with R.dataflow():
            lv = R.concat((x, x), axis=0)
            lv1 = R.nn.relu(lv)
            lv2 = R.sigmoid(lv1)
            lv3 = R.reshape(lv2, R.shape([n, 16]))
            R.output(lv3)
        return lv3


#: One composite entry, matmul + add, for the "cc" compiler.
MATMUL_ADD_TABLE = [("cc.matmul_add", is_op("add")(is_op("matmul")(wildcard(), wildcard()),
                                                   wildcard()))]


@I.ir_module
class PositionsOnDynamicBatch:
    """A host ``R.arange(0, n, 1)`` that takes the symbolic batch as an argument, as every
    transformers model exported with a dynamic batch has (TVM's MergeCompositeFunctions
    crashes on it), in an entry function that is not named ``main``."""

    @R.function
    def forward(x: R.Tensor(("n", 8), "float32"), w: R.Tensor((8, 8), "float32"),
                b: R.Tensor((8,), "float32")):
        n = T.int64()
        with R.dataflow():
            pos = R.arange(0, n, 1, dtype="float32")
            lv = R.matmul(x, w)
            lv1 = R.add(lv, b)
            lv2 = R.reshape(pos, R.shape([n, 1]))
            lv3 = R.multiply(lv1, lv2)
            R.output(lv3)
        return lv3


def test_merged_partitioning_handles_host_code_reading_the_batch_in_any_function(bit_exact):
    table = MATMUL_ADD_TABLE
    mod = PositionsOnDynamicBatch
    out = PartitionGraph("cc")(MergeComposite(table)(mod))
    assert relax.analysis.check_well_formed(out)
    assert list(external_functions(out, "cc")) == ["cc_main_0"]
    assert sorted(gv.name_hint for gv in out.get_global_vars()) == ["cc_main_0", "forward"]
    host = [str(b.value.op.name) for b in out["forward"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    assert host == ["relax.arange", "relax.reshape", "relax.multiply"]  # put back as it was
    # batch 1 would multiply by arange(0, 1) == [0]: outputs all zero, no evidence
    for batch in (2, 3):
        bit_exact(mod, out, func_name="forward", shape_vars={"n": batch})
    tvm.ir.assert_structural_equal(pk.DefuseOps()(out), mod)


@I.ir_module
class PositionsOfTwoDynamicDims:
    """``R.arange(0, n)`` and ``R.arange(0, m)``: two host bindings alike but for the
    symbolic variable they read (BERT exported with dynamic batch and sequence)."""

    @R.function
    def main(x: R.Tensor(("n", "m"), "float32"), w: R.Tensor(("m", "m"), "float32"),
             b: R.Tensor(("m",), "float32")):
        n, m = T.int64(), T.int64()
        with R.dataflow():
            rows = R.arange(0, n, 1, dtype="float32")
            cols = R.arange(0, m, 1, dtype="float32")
            lv = R.add(R.matmul(x, w), b)
            lv1 = R.multiply(lv, R.reshape(rows, R.shape([n, 1])))
            lv2 = R.add(lv1, cols)
            R.output(lv2)
        return lv2


def test_held_host_bindings_alike_but_for_their_symbolic_variable_keep_their_own(bit_exact):
    # the two aranges were held in structurally equal functions, which a BlockBuilder
    # deduplicated: both came back as arange(0, m), and the module was not well formed
    table = MATMUL_ADD_TABLE
    mod = PositionsOfTwoDynamicDims
    out = PartitionGraph("cc")(MergeComposite(table)(mod))
    assert relax.analysis.check_well_formed(out)
    aranges = [b.value for b in out["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and b.value.op == tvm.ir.Op.get("relax.arange")]
    n, m = (v for v in mod["main"].params[0].ty.shape)
    assert [str(a.args[1]) for a in aranges] == [str(n), str(m)]
    bit_exact(mod, inline_external(out), shape_vars={"n": 3, "m": 5})


def _positions_through_a_match_cast(positions: str) -> tvm.IRModule:
    """A row count cast out of the batch (``match_cast`` to ``R.Shape([r])``) and host
    code over ``r``, as TVM's ONNX importer writes a ``Range`` over a dynamic batch;
    ``positions`` is the binding that reads ``r``: as a value (``arange``) or only in a
    shape (``ones``)."""
    n, r = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("r", "int64")
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 8), "float32"))
    b = relax.Var("b", relax.TensorType((8,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            dims = bb.emit(relax.op.shape_to_tensor(relax.op.shape_of(x)))
            first = bb.emit(relax.op.take(dims, relax.const(0, "int64"), axis=0))
            rows = bb.match_cast(relax.op.reshape(first, [1]), relax.TensorType((1,), "int64"))
            bb.match_cast(relax.op.tensor_to_shape(rows), relax.ShapeType([r]))
            pos = bb.emit(relax.op.arange(0, r, 1, "float32") if positions == "arange"
                          else relax.op.ones(relax.ShapeExpr([r]), "float32"))
            lv = bb.emit(relax.op.add(relax.op.matmul(x, w), b))
            total = bb.emit(relax.op.sum(relax.op.reshape(pos, relax.ShapeExpr([r, 1]))))
            out = bb.emit_output(relax.op.multiply(lv, total))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("positions", ["arange", "ones"])
def test_merged_partitioning_keeps_a_match_cast_and_the_symbolic_variable_it_defines(
        positions, bit_exact):
    # TVM's MergeCompositeFunctions raises on any match_cast ("Invalid type:
    # relax.expr.MatchCast"); held away from it, the cast was then dropped as dead (only
    # its symbolic variable is read), leaving r undefined
    mod = _positions_through_a_match_cast(positions)
    out = PartitionGraph("cc")(MergeComposite(MATMUL_ADD_TABLE)(mod))
    assert relax.analysis.check_well_formed(out)
    assert list(external_functions(out, "cc")) == ["cc_main_0"]
    casts = [b for b in out["main"].body.blocks[0].bindings if isinstance(b, relax.MatchCast)]
    assert [str(b.ty) for b in casts] == ['R.Tensor((1,), dtype="int64")', "R.Shape([r])"]
    # batch 1 would multiply by arange(0, 1) == [0]: outputs all zero, no evidence
    for batch in (2, 3):
        bit_exact(mod, out, shape_vars={"n": batch})
    tvm.ir.assert_structural_equal(pk.DefuseOps()(out), mod)


def _two_functions_with_composites(other_batch: int) -> tvm.IRModule:
    """``main`` and ``main_adjoint`` each computing matmul + add, as a gradient module's
    primal and adjoint do; with ``other_batch == 2`` their composites are one function."""
    def function(batch: int, relu: bool) -> relax.Function:
        x = relax.Var("x", relax.TensorType((batch, 4), "float32"))
        w = relax.Var("w", relax.TensorType((4, 8), "float32"))
        b = relax.Var("b", relax.TensorType((8,), "float32"))
        bb = relax.BlockBuilder()
        with bb.function("f", [x, w, b]):
            with bb.dataflow():
                y = bb.emit(relax.op.add(relax.op.matmul(x, w), b))
                y = bb.emit(relax.op.nn.relu(y)) if relu else y
                out = bb.emit_output(relax.op.sum(y))
            bb.emit_func_output(out)
        return bb.get()["f"]

    return tvm.IRModule({"main": function(2, relu=False).with_attr("global_symbol", "main"),
                         "main_adjoint": function(other_batch, relu=True)
                         .with_attr("global_symbol", "main_adjoint")})


@pytest.mark.parametrize("other_batch", [2, 3], ids=["shared_composite", "own_composite"])
def test_every_function_that_calls_composites_partitions(other_batch, bit_exact):
    """TVM's ``MergeCompositeFunctions`` groups ``main``'s bindings only and fails on any
    other function calling composites ("Variable lv could not be found in any group");
    each caller is merged on its own turn, so a gradient module (primal + adjoint)
    partitions as a whole."""
    table = MATMUL_ADD_TABLE
    mod = relax.transform.Normalize()(_two_functions_with_composites(other_batch))
    out = PartitionGraph("cc")(MergeComposite(table)(mod))
    assert relax.analysis.check_well_formed(out)
    assert composite_counts(out) == {"cc.matmul_add": 2}
    for name in ("main", "main_adjoint"):
        calls = [b.value.op.name_hint for b in out[name].body.blocks[0].bindings
                 if isinstance(b.value, relax.Call) and isinstance(b.value.op, relax.GlobalVar)]
        assert len(calls) == 1 and calls[0] in external_functions(out, "cc")
        bit_exact(mod, inline_external(out), func_name=name)


def _symbolic_dims(func) -> set:
    return set(relax.analysis.defined_symbolic_vars(func))


def _partition_round_trip(mod, table, merge: bool, batches=(1, 3), batch_dim: str = "n"):
    """Partition ``mod``; check the result is well formed, each external function defines
    its own symbolic variables, and it computes ``mod``'s numbers bit for bit; then check
    DefuseOps gives ``mod`` back, structurally and bit for bit."""
    def partition(m):
        with tvm.transform.PassContext(opt_level=3):
            return PartitionGraph("ccompiler", merge=merge)(MergeComposite(table)(m))

    out = partition(mod)
    assert relax.analysis.check_well_formed(out)
    externals = external_functions(out, "ccompiler")
    assert externals
    host_dims = _symbolic_dims(out["main"])
    for func in externals.values():
        assert _symbolic_dims(func) and not _symbolic_dims(func) & host_dims
    for batch in batches:
        pk.assert_same_numerics(mod, out, rtol=0, atol=0, shape_vars={batch_dim: batch},
                                seed=batch)
    return assert_roundtrip(mod, partition, numeric=True, rtol=0, atol=0,
                            numeric_options={"shape_vars": {batch_dim: batches[-1]}})


@pytest.mark.parametrize("merge", [False, True], ids=["one_per_composite", "merged"])
def test_partition_graph_keeps_a_dynamic_batch_well_formed_and_defuse_ops_inverts_it(merge):
    result = _partition_round_trip(DynamicBatchConvNet, TABLE, merge)
    assert composite_counts(result.fused) == {"ccompiler.conv_add_relu": 2}


@pytest.mark.parametrize("merge", [False, True], ids=["one_per_composite", "merged"])
def test_a_composite_reading_a_symbolic_dim_its_inputs_do_not_define_gets_it_as_a_shape(
        merge):
    table = [("ccompiler.relu_sigmoid", is_op("sigmoid")(is_op("nn.relu")(wildcard())))]
    merged = MergeComposite(table)(DoubledBatch)
    assert relax.analysis.check_well_formed(merged)
    [call] = [b.value for b in merged["main"].body.blocks[0].bindings
              if isinstance(b.value, relax.Call) and isinstance(b.value.op, relax.Var)]
    assert isinstance(call.args[-1], relax.ShapeExpr)  # the caller's n, as FuseOps passes it
    assert call.ty.shape is not None  # typed (n * 2, 8), not erased to ndim=2
    _partition_round_trip(DoubledBatch, table, merge)


@pytest.fixture(scope="module")
def exported_conv_net():
    """A small torch conv net exported with a dynamic batch (``torch.export.Dim``)."""
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class ConvNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)
            self.fc = torch.nn.Linear(64, 5)

        def forward(self, x):
            x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
            return self.fc(torch.relu(self.conv2(x)).flatten(1))

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's LeafSpec FutureWarning
        exported = torch.export.export(ConvNet().eval(), (torch.randn(2, 3, 8, 8),),
                                       dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    return from_exported_program(exported, unwrap_unit_return_tuple=True)


@pytest.mark.models
@pytest.mark.parametrize("merge", [False, True], ids=["one_per_composite", "merged"])
def test_partition_graph_round_trips_a_torch_model_exported_with_a_dynamic_batch(
        exported_conv_net, merge):
    [batch] = _symbolic_dims(exported_conv_net["main"])  # torch names it s77 or the like
    result = _partition_round_trip(exported_conv_net, TABLE, merge, batches=(3,),
                                   batch_dim=str(batch.name))
    assert composite_counts(result.fused) == {"ccompiler.conv_add_relu": 2}
