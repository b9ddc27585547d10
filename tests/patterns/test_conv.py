"""patterns/conv.py: conv2d+add+relu composites and batch-norm folding into convs."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit import ir as C
from patternkit.byoc import CompositeLog, composite_functions, merge_composite
from patternkit.patterns import all_rules
from patternkit.patterns.conv import (COMPOSITES, RULES, BatchnormFoldIntoConv,
                                      ConvAddReluComposite, conv2d_add_relu)

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _ops(mod):
    return [C.op_name(b.value) for block in mod["main"].body.blocks for b in block.bindings
            if C.op_name(b.value)]


def _conv_module(bias_shape=None, relu=True, layout="NCHW"):
    """conv2d [+ bias of ``bias_shape``] [+ relu] with seeded constant weights."""
    rng = np.random.default_rng(1)
    shape = (1, 3, 8, 8) if layout == "NCHW" else (1, 8, 8, 3)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    kernel = "OIHW" if layout == "NCHW" else "HWIO"
    w_shape = (4, 3, 3, 3) if layout == "NCHW" else (3, 3, 3, 4)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.standard_normal(w_shape).astype("float32")),
                                           padding=1, data_layout=layout, kernel_layout=kernel))
            if bias_shape is not None:
                y = bb.emit(relax.op.add(y, relax.const(rng.standard_normal(bias_shape).astype("float32"))))
            if relu:
                y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("bias, relu, expected", [
    ((1, 4, 1, 1), True, "nn.conv2d_add_nn.relu_"),
    ((1, 4, 1, 1), False, "nn.conv2d_add_"),
    (None, True, "nn.conv2d_nn.relu_"),
    (None, False, "nn.conv2d_"),
])
def test_conv2d_add_relu_covers_every_optional_part(bias, relu, expected):
    mod = _conv_module(bias, relu)
    out = merge_composite(mod, [("ccompiler.conv_add_relu", conv2d_add_relu())])
    [(_, func)] = composite_functions(out)
    assert str(func.attrs["PartitionedFromPattern"]) == expected
    pk.assert_same_numerics(mod, out, **TOL)


@pytest.mark.parametrize("bias_shape, layout", [((1, 4, 1, 1), "NCHW"), ((4, 1, 1), "NCHW"),
                                                ((4,), "NHWC"), ((1, 1, 1, 4), "NHWC")])
def test_conv_add_relu_composite_accepts_frontend_bias_shapes(bias_shape, layout):
    mod = _conv_module(bias_shape, layout=layout)
    rule = ConvAddReluComposite("ccompiler")
    out = merge_composite(mod, [rule.entry()])
    [(_, func)] = composite_functions(out)
    assert str(func.attrs["Composite"]) == "ccompiler.conv2d_add_relu"
    assert str(func.attrs["PartitionedFromPattern"]) == "nn.conv2d_add_nn.relu_"
    pk.assert_same_numerics(mod, out, **TOL)


def test_conv_add_relu_composite_refuses_a_full_tensor_add_and_says_why():
    mod = _conv_module((1, 4, 8, 8))
    log = CompositeLog()
    out = merge_composite(mod, [ConvAddReluComposite("ccompiler", bias="required").entry()],
                          log=log)
    assert composite_functions(out) == []
    # Tried at the relu, then at the add (the relu is optional): both vetoed.
    assert [s.root for s in log.skipped] == ["lv2", "lv1"]
    assert all(s.kind == "check" and "is not a per-channel bias" in s.reason
               for s in log.skipped)


def test_rule_variants_derive_their_names():
    assert ConvAddReluComposite().name == "byoc.conv2d_add_relu"
    assert ConvAddReluComposite("c", bias="absent").name == "c.conv2d_relu"
    assert ConvAddReluComposite("c", relu="absent").name == "c.conv2d_add"
    assert ConvAddReluComposite("c", relu="required").name == "c.conv2d_add_relu_strict"
    with pytest.raises(ValueError, match="bias must be one of"):
        ConvAddReluComposite(bias="maybe")


@pytest.mark.parametrize("conv_bias", [False, True])
def test_batchnorm_fold_gives_conv_plus_bias_with_the_same_numbers(conv_bias):
    mod = BatchnormFoldIntoConv.example(conv_bias=conv_bias)
    out = pk.rewrite([BatchnormFoldIntoConv()], mod)
    assert _ops(out) == ["relax.nn.conv2d", "relax.add", "relax.nn.relu"]
    add = [b.value for b in out["main"].body.blocks[0].bindings if C.op_name(b.value) == "relax.add"][0]
    assert C.static_shape(add.args[1].ty) == (1, 4, 1, 1)
    assert relax.analysis.check_well_formed(out)
    pk.assert_same_numerics(mod, out, **TOL)
    pk.assert_same_numerics(relax.transform.DecomposeOpsForInference()(mod), out, **TOL)


def test_batchnorm_fold_matches_tvm_fold_batchnorm_to_conv2d():
    mod = BatchnormFoldIntoConv.example()
    tvm_fold = relax.transform.FoldConstant()(relax.transform.FoldBatchnormToConv2D()(mod))
    ours = pk.rewrite([BatchnormFoldIntoConv()], mod)
    assert _ops(ours) == _ops(tvm_fold)
    pk.assert_same_numerics(tvm_fold, ours, **TOL)


def test_batchnorm_fold_refuses_training_mode_and_says_why():
    mod = BatchnormFoldIntoConv.example(training=True)
    log = pk.RewriteLog() if hasattr(pk, "RewriteLog") else None
    out = pk.rewrite([BatchnormFoldIntoConv()], mod, log=log)
    tvm.ir.assert_structural_equal(out, mod)
    assert any("training mode" in r for r in log.reasons())


def test_folded_block_partitions_into_three_composites():
    mod = BatchnormFoldIntoConv.example()
    folded = pk.rewrite([BatchnormFoldIntoConv()], mod)
    out = merge_composite(folded, [ConvAddReluComposite("ccompiler").entry()])
    assert len(composite_functions(out)) == 1
    pk.assert_same_numerics(mod, out, **TOL)


def test_conv_rules_are_listed_and_documented():
    assert BatchnormFoldIntoConv in all_rules()
    assert RULES == (BatchnormFoldIntoConv,) and COMPOSITES == (ConvAddReluComposite,)
    for cls in RULES + COMPOSITES:
        assert cls.__doc__ and cls().name.count(".") == 1
