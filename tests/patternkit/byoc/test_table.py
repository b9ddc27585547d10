"""Pattern tables: rules and rule sets as entries, and checks that survive FuseOpsByPattern."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.byoc import (
    CompositeLog,
    PatternTable,
    PatternTableError,
    composite_counts,
    merge_composite,
)
from patternkit.patterns.conv import ConvAddReluComposite


def _conv_add_relu(bias_shape) -> tvm.IRModule:
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.random((4, 3, 3, 3), "float32")),
                                           padding=1))
            a = bb.emit(relax.op.add(c, relax.const(rng.random(bias_shape, "float32"))))
            out = bb.emit_output(relax.op.nn.relu(a))
        bb.emit_func_output(out)
    return bb.get()


def _fuse(table: PatternTable, mod):
    return relax.transform.FuseOpsByPattern(table.to_fusion_patterns())(mod)


@pytest.mark.parametrize("entry", ["rule", "relay_row"])
def test_fuse_ops_by_pattern_runs_the_check_with_the_roles_it_reads(entry):
    rule = ConvAddReluComposite("ccompiler", bias="required")
    table = PatternTable([rule if entry == "rule" else rule.entry()])
    full = _conv_add_relu((1, 4, 8, 8))  # a full-tensor add: not a bias
    assert composite_counts(_fuse(table, full)) == {}
    assert composite_counts(merge_composite(full, table)) == {}
    per_channel = _conv_add_relu((1, 4, 1, 1))
    fused = _fuse(table, per_channel)
    assert composite_counts(fused) == composite_counts(merge_composite(per_channel, table)) == {
        "ccompiler.conv2d_add_strict_relu": 1}
    pk.assert_same_numerics(per_channel, fused, rtol=0, atol=0)


def test_fuse_ops_by_pattern_gives_a_relay_check_the_full_node_map():
    conv = pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard())
    bias = pk.wildcard()
    seen = []

    def check(pre, node_map):
        seen.append(tuple(int(d) for d in node_map[bias][0].ty.shape))
        return node_map.var(conv) is not None

    table = PatternTable([("c.conv_add", pk.is_op("add")(conv, bias), check)])
    assert composite_counts(_fuse(table, _conv_add_relu((1, 4, 1, 1)))) == {"c.conv_add": 1}
    assert seen == [(1, 4, 1, 1)]


def test_a_check_that_raises_under_fuse_ops_by_pattern_names_the_entry():
    def broken(pre):
        raise ValueError("boom")

    table = PatternTable([("c.conv", pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard()),
                           broken)])
    with pytest.raises(pk.errors.CallbackError, match=r"entry 'c.conv' raised ValueError: boom"):
        _fuse(table, _conv_add_relu((1, 4, 1, 1)))


def test_a_rule_set_is_a_table_of_its_composites():
    from patternkit.patterns import LIBRARY

    rules = LIBRARY.for_compiler("ccompiler")
    table = PatternTable(rules)
    assert table.names == [
        "ccompiler.hardswish", "ccompiler.hardsigmoid", "ccompiler.mish", "ccompiler.quick_gelu",
        "ccompiler.add_layer_norm", "ccompiler.layer_norm",
        "ccompiler.group_norm_silu", "ccompiler.group_norm", "ccompiler.instance_norm",
        "ccompiler.rms_norm",
        "ccompiler.attention_bias", "ccompiler.attention",
        *(f"ccompiler.{kind}{packed}" for kind in ("swiglu", "geglu", "geglu_tanh")
          for packed in ("", "_packed")),
        "ccompiler.rope_partial", "ccompiler.rope_interleaved_partial", "ccompiler.rope",
        "ccompiler.rope_interleaved", "ccompiler.qdq_conv2d", "ccompiler.qdq_matmul",
        "ccompiler.conv2d_add_silu_strict", "ccompiler.conv2d_add_clip_strict",
        "ccompiler.conv2d_add_relu", *(f"ccompiler.matmul{t}{parts}" for t in ("_transposed", "")
                                       for parts in ("_bias_relu", "_bias_gelu",
                                                     "_bias_gelu_tanh", "_bias_silu", "_bias",
                                                     "_silu", "")),
        "ccompiler.batch_norm_grad", "ccompiler.layer_norm_grad",
        "ccompiler.batch_norm_grad_unscaled", "ccompiler.layer_norm_grad_unscaled",
        "ccompiler.frozen_batch_norm_grad"]
    assert table[0].rule is rules.composites()[0]


def test_a_table_is_validated_once_however_often_it_is_applied():
    from patternkit.patterns import LIBRARY

    rules = LIBRARY.for_compiler("ccompiler")
    table = PatternTable.of(rules)
    assert table.names == PatternTable(rules).names
    assert PatternTable.of(rules) is table  # a rule set cannot change: its table is kept
    assert PatternTable.of(table) is table and PatternTable.of(table, None) is table
    assert PatternTable.of(rules, "ccompiler") is not table  # checked for the prefix
    with pytest.raises(PatternTableError, match=r"must be named 'cutlass.<pattern>'"):
        PatternTable.of(table, "cutlass")  # a prefix the table was not checked for
    # a new rule set of the same rules is a table of its own
    assert PatternTable.of(LIBRARY.for_compiler("ccompiler")) is not table


def test_merge_composite_takes_a_rule_set_and_logs_its_rules_reasons():
    rules = pk.RuleSet([ConvAddReluComposite("ccompiler", bias="required")])
    log = CompositeLog()
    out = pk.byoc.merge_composite(_conv_add_relu((1, 4, 8, 8)), rules, log=log)
    assert composite_counts(out) == {}
    (skip, *_) = log.skipped
    assert skip.kind == "check" and "is not a per-channel bias" in skip.reason
    # the refusal points into the conv family (a module, or a file of its package)
    assert skip.rejection is not None
    assert "conv" in Path(skip.rejection.site[0]).with_suffix("").parts
