"""patterns/conv/: conv2d+add+relu composites and batch-norm folding into convs."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit import ir as C
from patternkit.byoc import CompositeLog, PatternTable, composite_functions, merge_composite
from patternkit.patterns import all_rules
from patternkit.patterns.conv import (
    COMPOSITES,
    RULES,
    BatchnormFoldIntoConv,
    ConvAddReluComposite,
    Presence,
    conv2d_add_relu,
)
from patternkit.patterns.conv.examples import conv_batch_norm
from patternkit.testing import EXACT, Negative, RuleCase, Tolerance, check_rule
from patternkit.verification.numeric import build as build_for_checks

#: The fold computes W * s and (b - mean) * s + beta in float64 and rounds once to
#: float32, where the batch norm it replaces rounds after every step; conv sums of 27
#: such products then differ by ~1e-6.  Composites only move bindings: EXACT.
FOLD_TOL = {"rtol": 1e-4, "atol": 1e-4}


def _ops(mod):
    return [C.op_name(b.value) for block in mod["main"].body.blocks for b in block.bindings
            if C.op_name(b.value)]


def _bind(mod: tvm.IRModule, **arrays) -> tvm.IRModule:
    """``mod`` with the named parameters of ``main`` bound to constants."""
    return relax.transform.BindParams("main", {k: tvm.runtime.tensor(v)
                                               for k, v in arrays.items()})(mod)


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
            weight = relax.const(rng.standard_normal(w_shape).astype("float32"))
            y = bb.emit(relax.op.nn.conv2d(x, weight, padding=1, data_layout=layout,
                                           kernel_layout=kernel))
            if bias_shape is not None:
                bias = relax.const(rng.standard_normal(bias_shape).astype("float32"))
                y = bb.emit(relax.op.add(y, bias))
            if relu:
                y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


# -- conv2d -> [add] -> [relu] composites ---------------------------------------------------
@I.ir_module
class ConvBiasRelu:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
             b: R.Tensor((1, 4, 1, 1), "float32")) -> R.Tensor((1, 4, 8, 8), "float32"):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=1)
            a = R.add(c, b)
            r = R.nn.relu(a)
            R.output(r)
        return r


@I.ir_module
class ConvBiasReluComposite:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
             b: R.Tensor((1, 4, 1, 1), "float32")) -> R.Tensor((1, 4, 8, 8), "float32"):
        with R.dataflow():
            @R.function
            def composite(x1: R.Tensor((1, 3, 8, 8), "float32"),
                          w1: R.Tensor((4, 3, 3, 3), "float32"),
                          b1: R.Tensor((1, 4, 1, 1), "float32"),
                          ) -> R.Tensor((1, 4, 8, 8), "float32"):
                R.func_attr({"Composite": "byoc.conv2d_add_relu",
                             "PartitionedFromPattern": "nn.conv2d_add_nn.relu_"})
                with R.dataflow():
                    c = R.nn.conv2d(x1, w1, padding=1)
                    a = R.add(c, b1)
                    r = R.nn.relu(a)
                    R.output(r)
                return r

            r = composite(x, w, b)
            R.output(r)
        return r


def _conv_add_relu(bias_ty, x_shape=(1, 3, 8, 8)) -> tvm.IRModule:
    """``relu(conv2d(x, w) + b)`` with parameters, ``b`` of type ``bias_ty``."""
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    w = relax.Var("w", relax.TensorType((4, 3, 3, 3), "float32"))
    b = relax.Var("b", bias_ty)
    return pk.from_expr(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1) + b))


def _conv_alone(mod: tvm.IRModule, name: str = "byoc.conv2d_add_relu") -> tvm.IRModule:
    """What the composite makes of ``mod`` when it refuses the add: the conv alone."""
    return pk.partition(pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard()), mod,
                        {"Composite": name})


def _refused_add(name: str, bias_ty, reason: str, x_shape=(1, 3, 8, 8)) -> Negative:
    mod = _conv_add_relu(bias_ty, x_shape)
    return Negative(name, mod, reason, expected=_conv_alone(mod))


COMPOSITE_CASE = RuleCase(
    ConvAddReluComposite(), ConvBiasRelu, ConvBiasReluComposite,
    negatives=[
        _refused_add("full_tensor_add", relax.TensorType((1, 4, 8, 8), "float32"),
                     "the added tensor of shape (1, 4, 8, 8) is not a per-channel bias of "
                     "the conv output (1, 4, 8, 8): it has shape (1, 4, 8, 8)"),
        _refused_add("bias_broadcast_along_width", relax.TensorType((4,), "float32"),
                     "the added tensor of shape (4,) is not a per-channel bias of the conv "
                     "output (1, 4, 4, 4): it varies along axis 3, the channel axis is 1",
                     x_shape=(1, 3, 4, 4)),
        _refused_add("bias_without_shape", relax.TensorType(ndim=4, dtype="float32"),
                     "the conv output or the bias has no static shape"),
        _refused_add("bias_of_unknown_dtype", relax.TensorType((1, 4, 1, 1), ""),
                     "bias dtype None differs from the conv output dtype float32"),
        Negative("no_conv", pk.from_expr(relax.op.nn.relu(
            relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32")))),
            "no match: add(nn.conv2d(*, *), *) (depth 4) vs x"),
    ],
    tolerance=EXACT)


def test_conv_add_relu_composite_meets_the_rule_contract():
    check_rule(COMPOSITE_CASE)


# -- conv2d -> [add] -> silu | clip (relu6) ---------------------------------------------------
def _conv_bias_act_script(act: str, composite: bool) -> str:
    """TVMScript of ``act(conv2d(x, w) + b)``, the three ops as they are or as a composite."""
    call = {"silu": "R.nn.silu(a)", "clip": "R.clip(a, T.float64(0.0), T.float64(6.0))"}[act]
    partitioned = {"silu": "nn.conv2d_add_nn.silu_", "clip": "nn.conv2d_add_clip_"}[act]
    sig = ('(x{p}: R.Tensor((1, 3, 8, 8), "float32"), w{p}: R.Tensor((4, 3, 3, 3), "float32"), '
           'b{p}: R.Tensor((1, 4, 1, 1), "float32")) -> R.Tensor((1, 4, 8, 8), "float32")')
    ops = (f"c = R.nn.conv2d(x{{p}}, w{{p}}, padding=1)\n{{i}}a = R.add(c, b{{p}})\n"
           f"{{i}}out = {call}\n{{i}}R.output(out)")
    head = "@I.ir_module\nclass Module:\n    @R.function\n"
    if not composite:
        return (head + f"    def main{sig.format(p='')}:\n        with R.dataflow():\n"
                f"            {ops.format(p='', i=' ' * 12)}\n        return out\n")
    return (head + f"    def main{sig.format(p='')}:\n        with R.dataflow():\n"
            f"            @R.function\n            def composite{sig.format(p='1')}:\n"
            f'                R.func_attr({{"Composite": "byoc.conv2d_add_{act}_strict", '
            f'"PartitionedFromPattern": "{partitioned}"}})\n'
            f"                with R.dataflow():\n"
            f"                    {ops.format(p='1', i=' ' * 20)}\n                return out\n\n"
            f"            out = composite(x, w, b)\n            R.output(out)\n"
            f"        return out\n")


def _conv_act_case(act: str) -> RuleCase:
    rule = ConvAddReluComposite(activation=act, relu="required")
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((4, 3, 3, 3), "float32"))
    conv = relax.op.nn.conv2d(x, w, padding=1)

    def with_bias(shape):
        return conv + relax.Var("b", relax.TensorType(shape, "float32"))

    activate = {"silu": relax.op.nn.silu, "clip": lambda y: relax.op.clip(y, 0.0, 6.0)}[act]
    negatives = [
        Negative("full_tensor_add", pk.from_expr(activate(with_bias((1, 4, 8, 8)))),
                 "the added tensor of shape (1, 4, 8, 8) is not a per-channel bias of the "
                 "conv output (1, 4, 8, 8)"),
        Negative("relu_is_not_the_activation", pk.from_expr(relax.op.nn.relu(
            with_bias((1, 4, 1, 1)))), "no match"),
        Negative("no_activation", pk.from_expr(with_bias((1, 4, 1, 1))), "no match"),
    ]
    if act == "clip":  # relu6 written with maximum / minimum is not a clip call
        negatives.append(Negative("relu6_as_minimum_of_maximum", pk.from_expr(relax.op.minimum(
            relax.op.maximum(with_bias((1, 4, 1, 1)), relax.const(0.0)), relax.const(6.0))),
            "no match"))
    else:  # swish still written out: silu.collapse has to run first
        y = with_bias((1, 4, 1, 1))
        negatives.append(Negative("swish_written_out", pk.from_expr(y * relax.op.sigmoid(y)),
                                  "no match"))
    return RuleCase(rule, tvm.script.from_source(_conv_bias_act_script(act, False)),
                    tvm.script.from_source(_conv_bias_act_script(act, True)),
                    negatives=negatives, tolerance=EXACT)


CONV_SILU_CASE = _conv_act_case("silu")
CONV_CLIP_CASE = _conv_act_case("clip")


def test_conv_add_silu_composite_meets_the_rule_contract():
    check_rule(CONV_SILU_CASE)


def test_conv_add_clip_composite_meets_the_rule_contract():
    check_rule(CONV_CLIP_CASE)


@pytest.mark.parametrize("activation", ["silu", "clip"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_conv_activation_composites_take_their_blocks_of_a_resnet_stem(activation, dtype):
    """The library's entry for ``activation`` takes both conv + bias + activation blocks of
    the example; the relu entry after it takes the last conv + bias, unchanged numbers."""
    rule = ConvAddReluComposite(activation=activation, relu="required")
    mod = rule.example(dtype=dtype)
    log = CompositeLog()
    out = merge_composite(mod, [rule, ConvAddReluComposite()], log=log)
    names = sorted(str(f.attrs["Composite"]) for _, f in composite_functions(out))
    assert names == sorted([f"byoc.conv2d_add_{activation}_strict"] * 2
                           + ["byoc.conv2d_add_relu"]), names
    pk.assert_same_numerics(mod, out, rtol=0, atol=0)


def test_conv_activation_variants_are_named_apart_and_checked():
    assert ConvAddReluComposite(activation="silu").name == "byoc.conv2d_add_silu"
    assert ConvAddReluComposite("c", relu="required", activation="clip").name == (
        "c.conv2d_add_clip_strict")
    names = {ConvAddReluComposite("c", bias, relu, act).name
             for bias in Presence for relu in (Presence.OPTIONAL, Presence.REQUIRED)
             for act in ("relu", "silu", "clip")}
    assert len(names) == 3 * 2 * 3
    with pytest.raises(ValueError, match="activation must be one of"):
        ConvAddReluComposite(activation="gelu")
    with pytest.raises(ValueError, match="names an activation that relu='absent' excludes"):
        ConvAddReluComposite(relu="absent", activation="silu")


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
    pk.assert_same_numerics(mod, out, rtol=0, atol=0)  # only bindings moved: bit-exact


@pytest.mark.parametrize("bias_shape, layout", [((1, 4, 1, 1), "NCHW"), ((4, 1, 1), "NCHW"),
                                                ((4,), "NHWC"), ((1, 1, 1, 4), "NHWC"),
                                                ((1,), "NCHW")])
def test_conv_add_relu_composite_accepts_frontend_bias_shapes(bias_shape, layout):
    mod = _conv_module(bias_shape, layout=layout)
    out = merge_composite(mod, [ConvAddReluComposite("ccompiler")])
    [(_, func)] = composite_functions(out)
    assert str(func.attrs["Composite"]) == "ccompiler.conv2d_add_relu"
    assert str(func.attrs["PartitionedFromPattern"]) == "nn.conv2d_add_nn.relu_"
    pk.assert_same_numerics(mod, out, rtol=0, atol=0)


def test_conv_add_relu_composite_entry_is_a_relay_table_row_with_the_same_check():
    rule = ConvAddReluComposite("ccompiler", bias="required")
    name, pattern, check = rule.entry()
    assert (name, pattern) == (rule.name, rule.pattern)
    full = _conv_module((1, 4, 8, 8))
    for table in ([rule.entry()], [rule]):
        log = CompositeLog()
        assert composite_functions(merge_composite(full, table, log=log)) == []
        assert all("is not a per-channel bias" in s.reason for s in log.skipped)


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
    assert ConvAddReluComposite("c", bias=Presence.REQUIRED).name == "c.conv2d_add_strict_relu"
    with pytest.raises(ValueError, match="bias must be one of"):
        ConvAddReluComposite(bias="maybe")


def test_every_composite_variant_has_its_own_name():
    variants = [ConvAddReluComposite("c", bias, relu)
                for bias, relu in itertools.product(Presence, repeat=2)]
    names = [v.name for v in variants]
    assert len(set(names)) == len(variants) == 9, names
    assert PatternTable(variants).names == names  # one table takes them all


def test_a_composite_renamed_for_a_compiler_keeps_its_variant():
    strict = ConvAddReluComposite(bias="required", relu="absent")
    renamed = strict.for_compiler("ccompiler")
    assert renamed.name == "ccompiler.conv2d_add_strict" and strict.name == "byoc.conv2d_add_strict"
    assert renamed.pattern is strict.pattern and renamed.bias_mode is Presence.REQUIRED


# -- batch norm folded into the conv --------------------------------------------------------
@I.ir_module
class ConvBiasBatchnorm:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
             b: R.Tensor((4,), "float32"), gamma: R.Tensor((4,), "float32"),
             beta: R.Tensor((4,), "float32"), mean: R.Tensor((4,), "float32"),
             var: R.Tensor((4,), "float32")) -> R.Tensor((1, 4, 8, 8), "float32"):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=1)
            rb = R.reshape(b, R.shape([1, 4, 1, 1]))
            y = R.add(c, rb)
            bn = R.nn.batch_norm(y, gamma, beta, mean, var, axis=1, epsilon=1e-5,
                                 training=False)
            out = bn[0]
            R.output(out)
        return out


@I.ir_module
class ConvPlusFoldedBias:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
             b: R.Tensor((1, 4, 1, 1), "float32")) -> R.Tensor((1, 4, 8, 8), "float32"):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=1)
            out = R.add(c, b)
            R.output(out)
        return out


def _fold_parameters(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((4, 3, 3, 3)).astype("float32"),
            "b": rng.standard_normal(4).astype("float32"),
            "gamma": rng.uniform(0.5, 1.5, 4).astype("float32"),
            "beta": rng.standard_normal(4).astype("float32"),
            "mean": rng.standard_normal(4).astype("float32"),
            "var": rng.uniform(0.5, 2.0, 4).astype("float32")}


def _folded(p: dict[str, np.ndarray], eps: float = 1e-5) -> dict[str, np.ndarray]:
    """The definition of the fold, in float64 rounded once: W * s, (b - mean) * s + beta."""
    scale = p["gamma"].astype("float64") / np.sqrt(p["var"].astype("float64") + eps)
    weight = (p["w"].astype("float64") * scale.reshape(-1, 1, 1, 1)).astype("float32")
    bias = ((p["b"].astype("float64") - p["mean"]) * scale + p["beta"]).astype("float32")
    return {"w": weight, "b": bias.reshape(1, 4, 1, 1)}


def _conv_bn(x_shape=(1, 3, 8, 8), bias=None, training=False, axis=1, kernel_layout="OIHW",
             dtype="float32", weight=None, seed=0) -> tvm.IRModule:
    """``conv2d [+ bias] -> batch_norm[0]`` with seeded constants.

    ``bias`` is ``(shape,)`` for a constant of that shape, or ``(shape, reshaped_to)``.
    """
    rng = np.random.default_rng(seed)
    channels = 4

    def const(array, as_dtype="float32"):
        return relax.const(np.asarray(array).astype(as_dtype))

    x = relax.Var("x", relax.TensorType(x_shape, dtype))
    if weight is None:
        w_shape = (channels, 3, 3, 3) if kernel_layout == "OIHW" else (3, 3, 3, channels)
        weight = const(rng.standard_normal(w_shape), dtype)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, weight, padding=1, kernel_layout=kernel_layout,
                                           out_dtype="float32"))
            if bias is not None:
                b = const(rng.standard_normal(bias[0]))
                if len(bias) == 2:
                    b = bb.emit(relax.op.reshape(b, bias[1]))
                y = bb.emit(relax.op.add(y, b))
            size = int(y.ty.shape[axis])
            bn = bb.emit(relax.op.nn.batch_norm(
                y, const(rng.uniform(0.5, 1.5, size)), const(rng.standard_normal(size)),
                const(rng.standard_normal(size)), const(rng.uniform(0.5, 2.0, size)),
                axis=axis, training=training))
            out = bb.emit_output(bb.emit(relax.TupleGetItem(bn, 0)))
        bb.emit_func_output(out)
    return bb.get()


def _conv_cast_to_bfloat16() -> tvm.IRModule:
    """A float16 conv accumulated in float32 and cast to bfloat16, not back to float16."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.standard_normal((4, 3, 3, 3)),
                                                          "float16"), out_dtype="float32"))
            y = bb.emit(relax.op.astype(y, "bfloat16"))
            stats = [relax.const(rng.uniform(0.5, 1.5, 4), "bfloat16") for _ in range(4)]
            bn = bb.emit(relax.op.nn.batch_norm(y, *stats, axis=1, training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    return bb.get()


def _grouped_conv2d_transpose_bn() -> tvm.IRModule:
    """A conv2d_transpose of 2 groups: output channel 2 * g + j reads the weight's block
    ``[2 * g:2 * g + 2, j]``, so no one weight axis holds the output channels."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d_transpose(
                x, relax.const(rng.standard_normal((4, 2, 3, 3)), "float32"), padding=1,
                groups=2))
            stats = [relax.const(rng.uniform(0.5, 1.5, 4), "float32") for _ in range(4)]
            bn = bb.emit(relax.op.nn.batch_norm(y, *stats, axis=1, training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    return bb.get()


_PARAMS = _fold_parameters()
FOLD_CASE = RuleCase(
    BatchnormFoldIntoConv(), _bind(ConvBiasBatchnorm, **_PARAMS),
    _bind(ConvPlusFoldedBias, **_folded(_PARAMS)),
    negatives=[
        Negative("training_mode", _conv_bn(training=True),
                 "batch_norm is in training mode (batch statistics)"),
        Negative("hwio_kernel", _conv_bn(kernel_layout="HWIO"), "kernel layout HWIO is not OIHW"),
        Negative("wio_conv1d_kernel", conv_batch_norm(op="conv1d", kernel_layout="HWIO"),
                 "kernel layout WIO is not OIW"),
        Negative("grouped_conv2d_transpose", _grouped_conv2d_transpose_bn(),
                 "the conv2d_transpose has 2 groups"),
        Negative("batch_norm_along_height", _conv_bn(axis=2),
                 "batch_norm axis 2 is not the channel axis of the conv output layout NCHW"),
        Negative("int8_weight", _conv_bn(dtype="int8"), "weight dtype int8 is not floating point"),
        Negative("cast_to_another_dtype", _conv_cast_to_bfloat16(),
                 "the conv's result is cast to bfloat16, not back to its weight's float16"),
        Negative("full_tensor_bias", _conv_bn(bias=((1, 4, 8, 8),)),
                 "the conv bias has shape (1, 4, 8, 8): a per-channel parameter varies along "
                 "exactly one axis"),
        Negative("bias_broadcast_along_width", _conv_bn((1, 3, 4, 4), bias=((4,),)),
                 "the conv bias varies along axis 3 of the conv output (1, 4, 4, 4), not along "
                 "its channel axis 1"),
        Negative("bias_reshaped_along_width", _conv_bn((1, 3, 4, 4), bias=((4,), (1, 1, 1, 4))),
                 "the conv bias varies along axis 3 of the conv output (1, 4, 4, 4)"),
        Negative("weight_not_constant", pk.from_expr(relax.TupleGetItem(relax.op.nn.batch_norm(
            relax.op.nn.conv2d(relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32")),
                               relax.Var("w", relax.TensorType((4, 3, 3, 3), "float32"))),
            *(relax.const(np.ones(4, "float32")) for _ in range(4)), axis=1, training=False), 0)),
            "no match: const (depth 6 in bias=unbiased in cast=direct) vs w"),
    ],
    tolerance=Tolerance(1e-5, 1e-5, "the fold rounds W * s and (b - mean) * s + beta once, "
                                    "from float64; batch_norm rounds after every step"))


def test_batchnorm_fold_meets_the_rule_contract():
    check_rule(FOLD_CASE)


@pytest.mark.parametrize("bias", [((4,),), ((4,), (1, 1, 1, 4))])
def test_batchnorm_fold_refuses_a_bias_that_broadcasts_along_the_width(bias):
    """Width == channels: the bias has one value per channel, but along W.  Folding it as a
    per-channel bias would give different numbers; it must stay as it is."""
    mod = _conv_bn((1, 3, 4, 4), bias=bias)
    log = pk.RewriteLog()
    out = pk.rewrite(BatchnormFoldIntoConv(), mod, log=log)
    tvm.ir.assert_structural_equal(out, mod)
    assert any("varies along axis 3" in r for r in log.reasons("conv.fold_batchnorm"))


def test_batchnorm_fold_takes_a_single_value_bias_as_the_same_bias_on_every_channel():
    mod = _conv_bn(bias=((1, 1, 1, 1),))
    out = pk.rewrite(BatchnormFoldIntoConv(), mod)
    assert _ops(out) == ["relax.nn.conv2d", "relax.add"]
    pk.assert_same_numerics(mod, out, **FOLD_TOL)


@pytest.mark.parametrize("conv_bias", [False, True])
def test_batchnorm_fold_gives_conv_plus_bias_with_the_same_numbers(conv_bias):
    mod = conv_batch_norm(conv_bias=conv_bias)
    out = pk.rewrite([BatchnormFoldIntoConv()], mod)
    assert _ops(out) == ["relax.nn.conv2d", "relax.add", "relax.nn.relu"]
    add = [b.value for b in out["main"].body.blocks[0].bindings
           if C.op_name(b.value) == "relax.add"][0]
    assert C.static_shape(add.args[1].ty) == (1, 4, 1, 1)
    assert relax.analysis.check_well_formed(out)
    pk.assert_same_numerics(mod, out, **FOLD_TOL)
    pk.assert_same_numerics(relax.transform.DecomposeOpsForInference()(mod), out, **FOLD_TOL)


def test_batchnorm_fold_matches_tvm_fold_batchnorm_to_conv2d():
    mod = conv_batch_norm()
    tvm_fold = relax.transform.FoldConstant()(relax.transform.FoldBatchnormToConv2D()(mod))
    ours = pk.rewrite([BatchnormFoldIntoConv()], mod)
    assert _ops(ours) == _ops(tvm_fold)
    pk.assert_same_numerics(tvm_fold, ours, **FOLD_TOL)


def test_batchnorm_fold_refuses_training_mode_and_says_why():
    mod = conv_batch_norm(training=True)
    log = pk.RewriteLog()
    out = pk.rewrite([BatchnormFoldIntoConv()], mod, log=log)
    tvm.ir.assert_structural_equal(out, mod)
    assert any("training mode" in r for r in log.reasons())


def _three_conv_bn_relu_block(seed: int = 0) -> tvm.IRModule:
    """``(conv2d -> batch_norm[0] -> relu) x 3`` with seeded constants."""
    rng = np.random.default_rng(seed)

    def const(*shape, low=None):
        data = rng.uniform(low, 1.5, shape) if low is not None else rng.standard_normal(shape)
        return relax.const(data.astype("float32"))

    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y, channels = x, 3
            for _ in range(3):
                y = bb.emit(relax.op.nn.conv2d(y, const(4, channels, 3, 3), padding=1))
                bn = bb.emit(relax.op.nn.batch_norm(y, const(4, low=0.5), const(4), const(4),
                                                    const(4, low=0.5), axis=1, training=False))
                y = bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0))))
                channels = 4
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def test_folded_block_partitions_into_three_composites():
    mod = _three_conv_bn_relu_block()
    folded = pk.rewrite([BatchnormFoldIntoConv()], mod)
    out = merge_composite(folded, [ConvAddReluComposite("ccompiler")])
    composites = composite_functions(out)
    assert len(composites) == 3
    assert {str(f.attrs["PartitionedFromPattern"]) for _, f in composites} == {
        "nn.conv2d_add_nn.relu_"}
    assert _ops(out) == []  # every op of main is inside a composite
    pk.assert_same_numerics(mod, out, **FOLD_TOL)
    pk.assert_same_numerics(folded, out, rtol=0, atol=0)  # the merge itself is exact


def test_conv_rules_are_listed_and_documented():
    assert BatchnormFoldIntoConv in all_rules()
    assert RULES == (BatchnormFoldIntoConv,)
    # The silu and clip variants (activation required) ahead of the default relu entry.
    assert [(type(e), e.name) if isinstance(e, ConvAddReluComposite) else e
            for e in COMPOSITES] == [
        (ConvAddReluComposite, "byoc.conv2d_add_silu_strict"),
        (ConvAddReluComposite, "byoc.conv2d_add_clip_strict"), ConvAddReluComposite]
    for cls in (*RULES, ConvAddReluComposite):
        assert cls.__doc__ and cls().name.count(".") == 1


def test_a_float16_conv_accumulating_in_float32_folds_with_a_float32_bias():
    # the folded bias joins the conv's float32 output, not the float16 weight's dtype
    rule = BatchnormFoldIntoConv()
    before = rule.example(dtype="float16", out_dtype="float32")
    log = pk.RewriteLog()
    after = pk.rewrite(rule, before, log=log)
    assert log.counts() == {"conv.fold_batchnorm": 1}
    assert relax.analysis.check_well_formed(after)
    # the float16 weights scaled by gamma / std round once more than the model's: within
    # the rule's float16 tolerance
    tol = rule.tolerance("float16")
    pk.assert_same_numerics(before, after, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("conv_bias", [False, True])
def test_a_low_precision_conv_accumulated_in_float32_and_cast_back_folds_under_the_cast(
        dtype, conv_bias):
    # TVM's ToMixedPrecision and patternkit's float16 torch import write a float16 conv as
    # astype(conv2d(x, w, out_dtype="float32"), "float16"): the folded weight goes under
    # the cast, the folded bias after it, in the model's dtype
    rule = BatchnormFoldIntoConv()
    before = rule.example(dtype=dtype, out_dtype="cast_back", conv_bias=conv_bias)
    log = pk.RewriteLog()
    after = pk.rewrite(rule, before, log=log)
    assert log.counts() == {"conv.fold_batchnorm": 1}
    assert relax.analysis.check_well_formed(after)
    ops = [pk.ir.op_name(b.value) for b in after["main"].body.blocks[0].bindings]
    assert ops == ["relax.nn.conv2d", "relax.astype", "relax.add", "relax.nn.relu"]
    assert after["main"].ret_ty.dtype == dtype
    if dtype == "float16":  # numpy has no bfloat16 inputs to run it on
        tol = rule.tolerance(dtype)
        pk.assert_same_numerics(before, after, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("op", ["conv1d", "conv2d_transpose"])
@pytest.mark.parametrize("dtype,out_dtype,tolerance", [
    ("float32", "same", 1e-5), ("float16", "same", 1e-2), ("float16", "cast_back", 1e-2)])
@pytest.mark.parametrize("batch", [1, "n"])
def test_batchnorm_fold_takes_conv1d_and_conv2d_transpose_with_the_same_numbers(
        op, dtype, out_dtype, tolerance, batch):
    # float16: the folded weight is rounded to float16 once, the unfolded graph rounds the
    # conv, the bias add and every batch-norm step: a few float16 ulp of outputs below 8
    before = conv_batch_norm(op=op, conv_bias=True, dtype=dtype, out_dtype=out_dtype,
                             batch=batch)
    log = pk.RewriteLog()
    after = pk.rewrite(BatchnormFoldIntoConv(), before, log=log)
    assert log.counts() == {"conv.fold_batchnorm": 1}
    assert "batch_norm" not in after.script() and f"R.nn.{op}(" in after.script()
    pk.assert_same_numerics(before, after, rtol=tolerance, atol=tolerance)


def test_a_torch_conv1d_and_conv_transpose_with_batch_norms_lose_their_batch_norms():
    torch = pytest.importorskip("torch")
    from patternkit.models.importing import from_torch

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1d = torch.nn.Conv1d(3, 8, 3, padding=1)
            self.bn1d = torch.nn.BatchNorm1d(8)
            self.up = torch.nn.ConvTranspose2d(2, 4, 3, padding=1)
            self.bn2d = torch.nn.BatchNorm2d(4)

        def forward(self, x, y):
            return torch.relu(self.bn1d(self.conv1d(x))), torch.relu(self.bn2d(self.up(y)))

    torch.manual_seed(0)
    model = Decoder().eval()
    with torch.no_grad():
        for bn in (model.bn1d, model.bn2d):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    x, y = torch.randn(2, 3, 10), torch.randn(2, 2, 6, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (x, y))
    mod, _, _ = from_torch(program, keep_params=False, entry="main", text="decoder",
                           seconds={})
    log = pk.RewriteLog()
    after = pk.rewrite(BatchnormFoldIntoConv(), mod, log=log)
    assert mod.script().count("R.nn.batch_norm(") == 2
    assert log.counts() == {"conv.fold_batchnorm": 2}
    assert after.script().count("R.nn.batch_norm(") == 0
    vm = build_for_checks(after)
    got = vm["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(y.numpy()))
    for ours, theirs in zip(got, model(x, y)):
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-5,
                                   atol=1e-5)
