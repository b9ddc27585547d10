"""Pattern tables and MergeComposite: Relay's composite semantics on Relax."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit import ir as C
from patternkit.byoc import (
    CompositeLog,
    MergeComposite,
    PartitionGraph,
    PatternTable,
    PatternTableError,
    composite_counts,
    composite_functions,
    merge_composite,
)
from patternkit.dpl.pattern import is_op, wildcard
from patternkit.errors import CallbackError
from patternkit.fusion import defuse
from patternkit.patterns.conv import ConvAddReluComposite, conv2d_add_relu


def _pfp(mod):
    return [str(f.attrs["PartitionedFromPattern"]) for _, f in composite_functions(mod)]


def test_merge_composite_tags_each_match_with_its_name_and_relay_op_string(resnet_block,
                                                                           bit_exact):
    out = merge_composite(resnet_block, [("ccompiler.conv_add_relu", conv2d_add_relu())])
    assert composite_counts(out) == {"ccompiler.conv_add_relu": 3}
    assert _pfp(out) == ["nn.conv2d_add_nn.relu_", "nn.conv2d_add_nn.relu_", "nn.conv2d_add_"]
    assert relax.analysis.check_well_formed(out)
    bit_exact(resnet_block, out)


def test_single_entry_table_gives_exactly_what_partition_gives(resnet_block):
    pattern = conv2d_add_relu()
    expected = pk.partition(pattern, resnet_block, {"Composite": "ccompiler.conv_add_relu"})
    got = merge_composite(resnet_block, [("ccompiler.conv_add_relu", pattern)])
    tvm.ir.assert_structural_equal(got, expected)


def test_merge_composite_defuses_back_to_the_original(resnet_block):
    out = merge_composite(resnet_block, [("ccompiler.conv_add_relu", conv2d_add_relu())])
    tvm.ir.assert_structural_equal(defuse(out, "partition"), resnet_block)


def test_overlapping_entries_give_the_same_composites_with_and_without_a_log(resnet_block):
    # Without a log a root an earlier entry took is not even matched; with one it is,
    # to say why it was refused.  The composites must not depend on who is listening.
    table = [("c.conv_add", is_op("add")(is_op("nn.conv2d")(wildcard(), wildcard()), wildcard())),
             ("c.add_relu", is_op("nn.relu")(is_op("add")(wildcard(), wildcard())))]
    for entries in (table, table[::-1]):
        logged = merge_composite(resnet_block, entries, log=CompositeLog())
        tvm.ir.assert_structural_equal(merge_composite(resnet_block, entries), logged)


def test_earlier_entries_win_and_the_loser_is_logged_with_the_winner(resnet_block, bit_exact):
    table = [("c.conv_add", is_op("add")(is_op("nn.conv2d")(wildcard(), wildcard()), wildcard())),
             ("c.add_relu", is_op("nn.relu")(is_op("add")(wildcard(), wildcard())))]
    log = CompositeLog()
    out = merge_composite(resnet_block, table, log=log)
    assert composite_counts(out) == {"c.conv_add": 3}
    losers = [s for s in log.skipped if s.entry == "c.add_relu"]
    assert len(losers) == 2 and all(s.kind == "overlap" and s.by == "c.conv_add" for s in losers)
    assert "higher priority" in losers[0].reason
    # Reversed priority: add+relu first, leaving conv alone where relu follows.
    out2 = merge_composite(resnet_block, table[::-1])
    assert composite_counts(out2) == {"c.add_relu": 2, "c.conv_add": 1}
    bit_exact(resnet_block, out2)


def test_a_check_vetoes_a_match_and_its_reason_is_logged(resnet_block):
    rule = ConvAddReluComposite("ccompiler", relu="required")
    log = CompositeLog()
    out = merge_composite(resnet_block, [rule.entry(),
                                  ("ccompiler.conv", is_op("nn.conv2d")(wildcard(), wildcard()),
                                   lambda pre: pk.reject("only fused convs"))], log=log)
    assert composite_counts(out) == {rule.name: 2}
    vetoed = [s for s in log.skipped if s.kind == "check"]
    assert [s.reason for s in vetoed] == ["only fused convs"]
    assert vetoed[0].entry == "ccompiler.conv"


def test_table_rejects_duplicate_names_and_names_the_entry():
    p = conv2d_add_relu()
    with pytest.raises(PatternTableError, match=r"entry 1 \('c.x'\) repeats the name of entry 0"):
        PatternTable([("c.x", p), ("c.x", p)])


def test_table_requires_the_compiler_prefix_when_one_is_given():
    with pytest.raises(PatternTableError, match=r"entry 0 \('conv_add_relu'\) must be named "
                                                r"'ccompiler.<pattern>'"):
        MergeComposite([("conv_add_relu", conv2d_add_relu())], compiler="ccompiler")


@pytest.mark.parametrize("entry, message", [
    (("c.x",), "must be \\(name, pattern\\)"),
    (("", conv2d_add_relu()), "non-empty string name"),
    (("c.x", "nn.conv2d"), "expected a patternkit pattern"),
    (("c.x", conv2d_add_relu(), 3), "check must be callable"),
])
def test_table_rejects_malformed_entries_with_a_clear_message(entry, message):
    with pytest.raises(PatternTableError, match=message):
        PatternTable([entry])


def test_a_check_that_raises_names_the_entry_and_leaves_the_module_unchanged(resnet_block):
    before = resnet_block.script()

    def broken(pre):
        raise ValueError("boom")

    with pytest.raises(CallbackError, match=r"entry 'ccompiler.conv_add_relu' raised "
                                            r"ValueError: boom") as info:
        MergeComposite([("ccompiler.conv_add_relu", conv2d_add_relu(), broken)])(resnet_block)
    assert "main: lv" in str(info.value)
    assert resnet_block.script() == before


def test_merge_composite_composes_with_tvm_passes_contexts_and_instruments(resnet_block):
    seen = []

    @tvm.instrument.pass_instrument
    class Record:
        def run_before_pass(self, mod, info):
            seen.append(info.name)

    merge = MergeComposite([("ccompiler.conv_add_relu", conv2d_add_relu())])
    seq = tvm.transform.Sequential([relax.transform.FoldConstant(), merge])
    with tvm.transform.PassContext(opt_level=3, instruments=[Record()]):
        out = seq(resnet_block)
    assert "patternkit.MergeComposite" in seen
    assert composite_counts(out) == {"ccompiler.conv_add_relu": 3}


def test_table_converts_to_fuse_ops_by_pattern_with_the_same_groups(resnet_block, bit_exact):
    table = PatternTable([("ccompiler.conv_add_relu", conv2d_add_relu())])
    fused = relax.transform.FuseOpsByPattern(table.to_fusion_patterns())(resnet_block)
    assert composite_counts(fused) == composite_counts(merge_composite(resnet_block, table))
    bit_exact(resnet_block, fused)


def test_composites_inside_composites_are_never_entered_again(resnet_block):
    table = [("ccompiler.conv_add_relu", conv2d_add_relu())]
    once = merge_composite(resnet_block, table)
    twice = merge_composite(once, table)
    tvm.ir.assert_structural_equal(once, twice)
    assert [C.var_name(p) for p in once["main"].params] == ["x"]


def test_a_composite_over_an_inline_tuple_reads_only_its_parameters(flow, bit_exact):
    """A wildcard matching ``R.concat((x, y))``'s inline tuple: ``x`` and ``y`` become
    parameters of the composite, so that an external compiler receives them."""
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    y = relax.Var("y", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.concat([x, y], axis=0)))
        bb.emit_func_output(out)
    mod = bb.get()
    table = [("cc.concat", is_op("concat")(wildcard()))]
    merged = merge_composite(mod, table)
    [(_, composite)] = composite_functions(merged)
    assert not relax.analysis.free_vars(composite)
    assert [str(p.ty) for p in composite.params] == [str(x.ty), str(y.ty)]
    bit_exact(mod, merged)
    partitioned = flow(mod, MergeComposite(table), PartitionGraph("cc"))
    assert relax.analysis.check_well_formed(partitioned)
    bit_exact(mod, partitioned)
    tvm.ir.assert_structural_equal(defuse(partitioned), mod)


def test_dead_code_reading_an_interior_result_does_not_stop_a_composite():
    # what the ONNX importer leaves behind: a reader of the conv's result nothing uses
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((4, 3, 3, 3), "float32"))
    bias = relax.Var("bias", relax.TensorType((1, 4, 1, 1), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, bias]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            bb.emit(relax.op.exp(conv), "dead")
            added = bb.emit(relax.op.add(conv, bias))
            out = bb.emit_output(relax.op.nn.relu(added))
        bb.emit_func_output(out)
    mod = bb.get()
    log = CompositeLog()
    merged = merge_composite(mod, [("ccompiler.conv_add_relu", conv2d_add_relu())], log=log)
    assert composite_counts(merged) == {"ccompiler.conv_add_relu": 1}
    # only the smaller matches inside the taken one are left over, none as escaping
    assert [(s.root, s.kind) for s in log.skipped] == [("lv1", "overlap"), ("lv", "overlap")]
    # the dead reader went with the value it read: the composite function and its call
    assert [b.var.name for b in merged["main"].body.blocks[0].bindings] == ["lv", "gv"]
    assert relax.analysis.check_well_formed(merged)


def test_merge_composite_refuses_a_rule_class_naming_it():
    with pytest.raises(TypeError, match=r"ConvAddReluComposite is a rule class, not a rule; "
                                        r"pass an instance: ConvAddReluComposite\(\)"):
        MergeComposite([ConvAddReluComposite])


def test_merge_composite_refuses_a_function_that_is_not_normalised():
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((4, 3, 3, 3), "float32"))
    call = relax.op.nn.relu(relax.op.nn.conv2d(x, w))
    mod = tvm.IRModule({"main": relax.Function([x, w], call, relax.TensorType((1, 4, 6, 6),
                                                                             "float32"))})
    with pytest.raises(pk.errors.MalformedIRError, match=r"MergeComposite: function 'main' is not "
                                                  r"normalised: it returns a call"):
        merge_composite(mod, [("ccompiler.conv_add_relu", conv2d_add_relu())])
