"""Convolutions for external compilers: ``conv2d -> [bias add] -> [relu | silu | clip]``
composites, and the batch-norm folding that has to run first.

Recognises

* :func:`conv2d_add_relu` / :class:`ConvAddReluComposite`: ``nn.conv2d`` followed by an
  optional ``add`` and an optional ``nn.relu``, Relay's ``make_conv_add_relu_pattern``.
  The composite's ``PartitionedFromPattern`` is ``"nn.conv2d_add_nn.relu_"``,
  ``"nn.conv2d_add_"``, ``"nn.conv2d_nn.relu_"`` or ``"nn.conv2d_"``.  The bias may be a
  constant or a variable shaped as real frontends produce it: ``(1, C, 1, 1)`` (torch's
  ``reshape`` of the conv bias, folded or not, and ``FoldBatchnormToConv2D``),
  ``(C, 1, 1)`` (Relay's ``prerequisite_optimize``), or ``(C,)`` for ``NHWC`` outputs.
  :class:`ConvAddReluComposite` checks that the added tensor really is a per-channel
  bias (one non-unit dimension, on the output's channel axis); the Relay-faithful
  :func:`conv2d_add_relu` pattern, like Relay's, accepts any added tensor.
  With ``activation="silu"`` or ``"clip"`` the activation is ``nn.silu`` (the torch
  importer's ``x * sigmoid(x)`` once ``silu.collapse`` has run; cutlass's
  ``conv2d_bias_silu``) or ``clip`` with constant bounds (``nn.ReLU6`` imports as
  ``clip(x, 0, 6)``; the CLML table's ``clip`` convolutions) instead of relu, named
  ``conv2d_add_silu``, ``conv2d_add_clip_strict`` and so on.  The library holds them with
  the activation required, ahead of the relu composite: an entry whose activation is
  optional would also take a conv + add that no activation follows, under a name that
  says there is one.
* :class:`BatchnormFoldIntoConv`: ``conv2d(x, W) [+ b] -> batch_norm(...)[0]`` with ``W``,
  ``b`` and the four batch-norm parameters constant and ``training=False``, rewritten to
  ``conv2d(x, W * s) + ((b - mean) * s + beta)`` with ``s = gamma / sqrt(var + eps)``:
  what Relay's ``prerequisite_optimize`` (SimplifyInference + FoldScaleAxis) did before
  ``MergeComposite``.  Unlike TVM's ``FoldBatchnormToConv2D`` it accepts the conv bias
  that the torch importer places between the conv and the batch norm (a constant, or a
  ``reshape`` of one), checks ``training`` and that the bias broadcasts along the
  output's channel axis (a ``(C,)`` bias on an ``NCHW`` output whose width happens to be
  ``C`` varies along ``W``, and is refused), and folds the constants itself (no
  ``FoldConstant`` needed).

Deliberately not covered: ``conv2d_transpose``, 1-D and 3-D convolutions, layouts other
than ``OIHW`` kernels for the fold, non-constant weights or batch-norm parameters (bind
them with ``relax.transform.BindParams`` first), activations other than relu, silu and
clip, and batch norms in training mode (they normalise with batch statistics, so
folding would change the numbers).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, is_constant, is_op, is_tuple_get_item, wildcard
from patternkit.engine import (CompositeRule, DFPatternCallback, NodeMap, NoSuchExample, RuleMatch,
                               reject, variant_method)
from patternkit.ir import (NotPerChannel, call_args, const_value, dtype_of, machine_epsilon,
                           per_channel_axis, prove_equal, static_shape, type_of)


class Presence(str, Enum):
    """Whether a part of a composite may, must or must not follow the conv."""

    OPTIONAL = "optional"
    REQUIRED = "required"
    ABSENT = "absent"

    def suffix(self, part: str) -> str:
        """How the part shows in a derived composite name (distinct for each presence)."""
        return {Presence.OPTIONAL: f"_{part}", Presence.REQUIRED: f"_{part}_strict",
                Presence.ABSENT: ""}[self]


def conv2d_add_relu() -> DFPattern:
    """Relay's ``conv2d -> optional add -> optional relu`` pattern, in patternkit syntax.

    >>> table = [("ccompiler.conv_add_relu", conv2d_add_relu())]
    """
    r = is_op("nn.conv2d")(wildcard(), wildcard())
    r = is_op("add")(r, wildcard()) | r
    return r.optional(lambda x: is_op("nn.relu")(x))


def _single_value(shape: tuple) -> bool:
    """A tensor of this shape broadcasts one value everywhere (every dim provably 1)."""
    return all(prove_equal(d, 1) for d in shape)


#: Activations a conv composite may end with: name (as in the composite name) -> the
#: pattern of the call on the conv's (biased) output.
CONV_ACTIVATIONS = {
    "relu": lambda body: is_op("nn.relu")(body),
    "silu": lambda body: is_op("nn.silu")(body),
    "clip": lambda body: is_op("clip")(body, is_constant(), is_constant()),
}


def _presence(part: str, mode: Presence | str) -> Presence:
    try:
        return Presence(mode)
    except ValueError:
        raise ValueError(f"ConvAddReluComposite: {part} must be one of "
                         f"{tuple(m.value for m in Presence)}, found {mode!r}") from None


class ConvAddReluComposite(CompositeRule):
    """``conv2d -> [add per-channel bias] -> [relu | silu | clip]`` as a pattern table entry.

    Parameters
    ----------
    compiler : str
        Prefix of the composite name (the codegen that will take it).
    bias, relu : Presence or {"optional", "required", "absent"}
        Whether the bias add / the activation may, must or must not follow (``relu`` is
        the activation's presence whichever ``activation`` is; it kept its name from
        when relu was the only one).
    activation : {"relu", "silu", "clip"}
        The activation: ``nn.relu``, ``nn.silu``, or ``clip`` with constant bounds (relu6).

    The name is derived, one distinct piece per part and presence, so two variants never
    share a name: ``"<compiler>.conv2d"``, then for the add and the activation ``"_add"``
    / ``"_<activation>"`` when it may follow, ``"_add_strict"`` / ``"_<activation>_strict"``
    when it must, nothing when it must not (``conv2d_add_relu``, ``conv2d_add_relu_strict``,
    ``conv2d_add_strict_relu``, ``conv2d_add_silu_strict``, ...).  An absent activation
    has no kind, so only ``activation="relu"`` (the default) may go with ``relu="absent"``.
    """

    def __init__(self, compiler: str = "byoc", bias: Presence | str = Presence.OPTIONAL,
                 relu: Presence | str = Presence.OPTIONAL, activation: str = "relu"):
        super().__init__(compiler)
        bias, relu = (_presence(part, mode) for part, mode in (("bias", bias), ("relu", relu)))
        if activation not in CONV_ACTIVATIONS:
            raise ValueError(f"ConvAddReluComposite: activation must be one of "
                             f"{tuple(CONV_ACTIVATIONS)}, found {activation!r}")
        if relu is Presence.ABSENT and activation != "relu":
            raise ValueError(f"ConvAddReluComposite: activation={activation!r} names an "
                             f"activation that relu='absent' excludes")
        self.bias_mode, self.relu_mode, self.activation = bias, relu, activation
        self.x, self.weight, self.bias = wildcard(), wildcard(), wildcard()
        self.conv = is_op("nn.conv2d")(self.x, self.weight)
        self.add = is_op("add")(self.conv, self.bias)
        body = {Presence.OPTIONAL: self.add | self.conv, Presence.REQUIRED: self.add,
                Presence.ABSENT: self.conv}[bias]
        self.relu = CONV_ACTIVATIONS[activation](body)
        self.pattern: DFPattern = {Presence.OPTIONAL: self.relu | body,
                                   Presence.REQUIRED: self.relu, Presence.ABSENT: body}[relu]
        self.pattern_name = "conv2d" + bias.suffix("add") + relu.suffix(activation)

    def check(self, match: RuleMatch) -> Any:
        """Accept unless the added tensor is not a per-channel (or single-value) bias."""
        if "add" not in match:
            return True
        out_ty, bias_ty = type_of(match.var_of("conv")), type_of(match.bias)
        out_shape, bias_shape = static_shape(out_ty), static_shape(bias_ty)
        if out_shape is None or bias_shape is None:
            return reject("the conv output or the bias has no static shape")
        if dtype_of(bias_ty) != dtype_of(out_ty):
            return reject(f"bias dtype {dtype_of(bias_ty)} differs from the conv output "
                          f"dtype {dtype_of(out_ty)}")
        if _single_value(bias_shape):
            return True
        not_a_bias = (f"the added tensor of shape {tuple(bias_shape)} is not a per-channel "
                      f"bias of the conv output {tuple(out_shape)}")
        try:
            axis = per_channel_axis(bias_shape, out_shape, name="it", of="the conv output")
        except NotPerChannel as why:
            return reject(f"{not_a_bias}: {why}")
        channel_axis = str(match.conv.attrs.out_layout).index("C")
        if axis != channel_axis:
            return reject(f"{not_a_bias}: it varies along axis {axis}, the channel axis is "
                          f"{channel_axis}")
        return True

    # -- self-check example (used by tests, benchmarks and `patternkit verify`) --------------
    @variant_method
    def example(self, channels: int = 8, size: int = 16, seed: int = 0, layout: str = "NCHW",
                kernel_layout: str = "OIHW", bias: str = "1C11", bias_source: str = "constant",
                activation: str | None = None, dtype: str = "float32",
                batch: int | str = 1) -> tvm.IRModule:
        """ResNet's first block after batch-norm folding, constants seeded.

        ``conv7x7/2 + bias + act -> max_pool -> conv3x3 + bias + act -> conv3x3 + bias``,
        then the residual ``add`` with the pooled value.

        Parameters
        ----------
        channels, size : int
            Channels of every conv, and ``x``'s spatial size (the last two convs see
            ``size / 4``: 4 channels with the default size make it the channel count).
        seed : int
            Seed of the constants.
        layout, kernel_layout : str
            Data layout of ``x`` and every op, kernel layout of every conv (the same
            weights, laid out accordingly).
        bias : {"1C11", "C11", "C", "1", "full", "none"}
            The shape of each bias as written: on the channel axis of the layout
            (``"1C11"``), right-aligned shapes that broadcast along another axis or none
            (``"C11"``, ``"C"``, ``"1"``), the conv output's whole shape, or no bias.
        bias_source : {"constant", "input"}
            Biases as constants or as inputs of ``main``.
        activation : {"relu", "silu", "clip", "none"}, optional
            The activation after the first two biased convs (``"clip"`` is relu6 as the
            torch importer writes it); by default this variant's; ``"none"``: none.
        dtype : str
            Of ``x`` and every weight and bias.
        batch : int or str
            ``N``; a string is a symbolic dimension.
        """
        chosen = activation or self.activation
        act = None if chosen == "none" else _EXAMPLE_ACTIVATIONS[chosen]
        rng = np.random.default_rng(seed)
        n = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
        if bias == "full" and not isinstance(n, int):
            raise NoSuchExample("a full-tensor bias needs a static batch")

        def bias_shape(spatial):
            out_shape = {"N": n, "C": channels, "H": spatial, "W": spatial}
            return {"1C11": tuple(channels if a == "C" else 1 for a in layout),
                    "C11": (channels, 1, 1), "C": (channels,), "1": (1,),
                    "full": tuple(out_shape[a] for a in layout)}[bias]

        if bias == "none" and bias_source == "input":
            raise NoSuchExample("bias='none' has no bias to take as an input")
        spatial = (size // 2, size // 4, size // 4)  # of the three conv outputs
        inputs = [relax.Var(f"b{i}", relax.TensorType(bias_shape(s), dtype))
                  for i, s in enumerate(spatial)] if bias_source == "input" else []

        def weight(out_channels, in_channels, k):
            oihw = rng.standard_normal((out_channels, in_channels, k, k)) * 0.2
            return relax.const(oihw.transpose(["OIHW".index(a) for a in kernel_layout])
                               .astype("float32"), dtype)

        def biased(bb, value, index, activation):
            if bias != "none":
                shape = bias_shape(spatial[index])
                if inputs:
                    term = inputs[index]
                else:
                    values = rng.standard_normal((1, channels, 1, 1)) * 0.2
                    if bias == "full":
                        values = rng.standard_normal(shape) * 0.2
                    term = relax.const(values.reshape(-1)[:int(np.prod(shape))]
                                       .reshape(shape).astype("float32"), dtype)
                try:
                    value = bb.emit(relax.op.add(value, term))
                except ValueError as err:  # Relax's type inference: no broadcast
                    raise NoSuchExample(f"a bias shaped {shape} does not broadcast against "
                                        f"{tuple(value.ty.shape)}") from err
            return bb.emit(activation(value)) if activation else value

        dims = {"N": n, "C": 3, "H": size, "W": size}
        x = relax.Var("x", relax.TensorType(tuple(dims[a] for a in layout), dtype))
        conv = functools.partial(relax.op.nn.conv2d, data_layout=layout,
                                 kernel_layout=kernel_layout)
        bb = relax.BlockBuilder()
        with bb.function("main", [x, *inputs]):
            with bb.dataflow():
                c = bb.emit(conv(x, weight(channels, 3, 7), strides=2, padding=3))
                r = biased(bb, c, 0, act)
                p = bb.emit(relax.op.nn.max_pool2d(r, pool_size=3, strides=2, padding=1,
                                                   layout=layout))
                c = bb.emit(conv(p, weight(channels, channels, 3), padding=1))
                r = biased(bb, c, 1, act)
                c = bb.emit(conv(r, weight(channels, channels, 3), padding=1))
                a = biased(bb, c, 2, False)
                out = bb.emit_output(relax.op.add(a, p))
            bb.emit_func_output(out)
        return bb.get()

    @variant_method
    def example_space(self) -> dict[str, tuple]:
        """Both layouts, three kernel layouts, biases on the channel axis, on another axis
        (4 channels make the later convs' width the channel count), on none, the whole
        output, none; biases as inputs; this variant's activation, the others and none;
        the float dtypes; a symbolic batch."""
        others = tuple(a for a in _EXAMPLE_ACTIVATIONS if a != self.activation)
        return {"channels": (8, 4), "size": (16,), "seed": (0, 1),
                "layout": ("NCHW", "NHWC"), "kernel_layout": ("OIHW", "HWIO", "OHWI"),
                "bias": ("1C11", "C11", "C", "1", "full", "none"),
                "bias_source": ("constant", "input"),
                "activation": (self.activation, *others, "none"),
                "dtype": ("float32", "float16", "bfloat16"), "batch": (1, "n")}


#: How the examples spell each activation (relu6 as the torch importer writes it).
_EXAMPLE_ACTIVATIONS = {
    "relu": relax.op.nn.relu,
    "silu": relax.op.nn.silu,
    "clip": lambda x: relax.op.clip(x, 0.0, 6.0),
}


@dataclass(frozen=True)
class FoldPlan:
    """What the check found, for the callback: output channels and the channel axis."""

    channels: int
    channel_axis: int


class BatchnormFoldIntoConv(DFPatternCallback):
    """Fold an inference ``batch_norm`` into the constant weights and bias of a conv2d."""

    name = "conv.fold_batchnorm"

    def __init__(self, require_type: bool = False, rewrite_once: bool = False):
        super().__init__(require_type=require_type, rewrite_once=rewrite_once)
        self.x = wildcard()
        self.weight = is_constant()
        self.conv = is_op("nn.conv2d")(self.x, self.weight)
        # a float16 conv accumulated in float32 and cast back (ToMixedPrecision, patternkit's
        # float16 torch import): the fold scales the weight under the cast
        self.cast_back = is_op("astype")(self.conv)
        conv = self.cast_back | self.conv
        self.conv_bias = is_constant()
        self.reshaped_bias = is_op("reshape")(self.conv_bias, wildcard())
        self.biased = is_op("add")(conv, self.reshaped_bias | self.conv_bias)
        self.gamma, self.beta, self.mean, self.var = (is_constant() for _ in range(4))
        self.bn = is_op("nn.batch_norm")(self.biased | conv, self.gamma, self.beta,
                                         self.mean, self.var)
        self.pattern = is_tuple_get_item(self.bn, 0)

    def check(self, pre: Any, node_map: NodeMap) -> Any:
        """A :class:`FoldPlan` when the batch norm and the conv bias are per-channel."""
        bn = node_map[self.bn][0]
        conv = node_map[self.conv][0]
        if bool(bn.attrs.training):
            return reject("batch_norm is in training mode (batch statistics); only an "
                          "inference batch norm can be folded")
        if str(conv.attrs.kernel_layout) != "OIHW":
            return reject(f"kernel layout {conv.attrs.kernel_layout} is not OIHW")
        out_layout = str(conv.attrs.out_layout)
        channel_axis = out_layout.index("C")
        if int(bn.attrs.axis) != channel_axis:
            return reject(f"batch_norm axis {int(bn.attrs.axis)} is not the channel axis of "
                          f"the conv output layout {out_layout}")
        weight_ty = type_of(node_map[self.weight][0])
        if machine_epsilon(dtype_of(weight_ty)) is None:
            return reject(f"weight dtype {dtype_of(weight_ty)} is not floating point")
        if self.cast_back in node_map:
            cast = node_map[self.cast_back][0]
            if str(cast.attrs.dtype) != str(dtype_of(weight_ty)):
                return reject(f"the conv's result is cast to {cast.attrs.dtype}, not back to "
                              f"its weight's {dtype_of(weight_ty)}: the batch norm does not "
                              f"run in the conv's dtype")
        channels = static_shape(weight_ty)[0]
        if self.biased in node_map:
            # The bias as it is added: a (C,) constant broadcasts along the last axis, so
            # its element count alone does not make it per-channel.
            added = (node_map.var(self.reshaped_bias) if self.reshaped_bias in node_map
                     else node_map[self.conv_bias][0])
            bias_shape = static_shape(type_of(added))
            out_shape = static_shape(type_of(node_map.var(self.conv)))
            if not _single_value(bias_shape):
                try:
                    axis = per_channel_axis(bias_shape, out_shape, name="the conv bias",
                                            of="the conv output")
                except NotPerChannel as why:
                    return reject(str(why))
                if axis != channel_axis:
                    return reject(f"the conv bias varies along axis {axis} of the conv output "
                                  f"{tuple(out_shape)}, not along its channel axis "
                                  f"{channel_axis}: folding it as a per-channel bias would "
                                  f"change the numbers")
        return FoldPlan(channels, channel_axis)

    def callback(self, pre: Any, post: Any, node_map: NodeMap) -> Any:
        plan: FoldPlan = node_map.plan
        bn = node_map[self.bn][0]
        conv = node_map[self.conv][0]
        weight = const_value(node_map[self.weight][0])
        channels, dtype = plan.channels, weight.dtype

        def per_channel(pattern):
            return const_value(node_map[pattern][0]).astype("float64").reshape(channels)

        gamma = per_channel(self.gamma) if bool(bn.attrs.scale) else np.ones(channels)
        beta = per_channel(self.beta) if bool(bn.attrs.center) else np.zeros(channels)
        mean, var = per_channel(self.mean), per_channel(self.var)
        scale = gamma / np.sqrt(var + float(bn.attrs.epsilon))
        bias = np.zeros(channels)
        if self.biased in node_map:  # per-channel, or one value for every channel
            values = const_value(node_map[self.conv_bias][0]).astype("float64").reshape(-1)
            bias = np.broadcast_to(values, (channels,))
        new_weight = (weight.astype("float64") * scale.reshape(-1, 1, 1, 1)).astype(dtype)
        # the bias joins the batch norm's input: the conv's output, whose dtype may be
        # wider than the weight's (a float16 conv with out_dtype="float32"), or its cast
        out_dtype = dtype_of(type_of(call_args(bn)[0]))
        new_bias = ((bias - mean) * scale + beta).astype(out_dtype)
        ndim = len(str(conv.attrs.out_layout))
        bias_shape = [channels if axis == plan.channel_axis else 1 for axis in range(ndim)]
        new_conv = relax.Call(conv.op, [node_map[self.x][0], relax.const(new_weight)],
                              conv.attrs)
        if self.cast_back in node_map:
            new_conv = relax.op.astype(new_conv, out_dtype)
        return relax.op.add(new_conv, relax.const(new_bias.reshape(bias_shape)))

    # -- self-check example (used by tests and `patternkit verify`) ---------------------------
    @staticmethod
    def example(conv_bias: bool = False, training: bool = False, channels: int = 4,
                seed: int = 0, layout: str = "NCHW", kernel_layout: str = "OIHW",
                bias: str = "reshape", bn_axis: str = "channel", dtype: str = "float32",
                out_dtype: str = "same", batch: int | str = 1) -> tvm.IRModule:
        """``conv2d [+ bias] -> batch_norm[0] -> relu`` on ``x: (1, 3, 8, 8)``, constants seeded.

        Parameters
        ----------
        conv_bias : bool
            Add a bias between the conv and the batch norm.
        training : bool
            The batch norm's ``training`` flag.
        channels : int
            Output channels (8 equals the spatial size).
        seed : int
            Seed of the constants.
        layout, kernel_layout : str
            The conv's data (and output) layout and its kernel layout.
        bias : {"reshape", "1C11", "C11", "C", "1"}
            How the bias is spelled: ``"reshape"`` as the torch importer does (``reshape``
            of a ``(C,)`` constant to the output's channel axis), ``"1C11"`` a constant
            of that broadcast shape, ``"C11"``, ``"C"`` and ``"1"`` constants shaped so
            (right-aligned by broadcasting: on another axis, or on none).
        bn_axis : {"channel", "height"}
            The batch norm's axis, with parameters sized to match it.
        dtype : {"float32", "float16", "bfloat16", "int8"}
            Of ``x`` and the weight (``int8`` convolves into ``float32``).
        out_dtype : {"same", "float32", "cast_back"}
            The conv's ``out_dtype``; the bias and the batch norm take the output's.
            ``"cast_back"``: float32, the result cast straight back to ``dtype`` (a float16
            conv as ``ToMixedPrecision`` writes it).
        batch : int or str
            ``N``; a string is a symbolic dimension.
        """
        rng = np.random.default_rng(seed)
        n = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
        accumulate = "float32" if dtype == "int8" or out_dtype != "same" else dtype
        cast_back = out_dtype == "cast_back"
        if cast_back and dtype in ("float32", "int8"):
            raise NoSuchExample("out_dtype='cast_back' accumulates a low-precision float conv")
        out = dtype if cast_back else accumulate
        dims = {"N": n, "C": 3, "H": 8, "W": 8}
        x = relax.Var("x", relax.TensorType(tuple(dims[a] for a in layout), dtype))
        kernel = {"O": channels, "I": 3, "H": 3, "W": 3}
        if dtype == "int8":
            weight = rng.integers(-4, 4, tuple(kernel[a] for a in kernel_layout))
        else:
            weight = rng.standard_normal(tuple(kernel[a] for a in kernel_layout))
        bias_shape = {"1C11": tuple(channels if a == "C" else 1 for a in layout),
                      "C11": (channels, 1, 1), "C": (channels,), "1": (1,)}
        out_shape = tuple({"N": n, "C": channels, "H": 8, "W": 8}[a] for a in layout)
        axis = layout.index("C" if bn_axis == "channel" else "H")

        def const(values, as_dtype=out):
            return relax.const(np.asarray(values, dtype="float32"), as_dtype)

        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                y = bb.emit(relax.op.nn.conv2d(
                    x, relax.const(weight.astype("float32"), dtype), padding=1,
                    data_layout=layout, kernel_layout=kernel_layout,
                    out_dtype=None if accumulate == dtype else accumulate))
                if cast_back:
                    y = bb.emit(relax.op.astype(y, dtype))
                if conv_bias and bias == "reshape":
                    b = bb.emit(relax.op.reshape(const(rng.standard_normal(channels)),
                                                 bias_shape["1C11"]))
                    y = bb.emit(relax.op.add(y, b))
                elif conv_bias:
                    try:
                        y = bb.emit(relax.op.add(y, const(rng.standard_normal(bias_shape[bias]))))
                    except ValueError as err:  # Relax's type inference: no broadcast
                        raise NoSuchExample(f"a bias shaped {bias_shape[bias]} does not "
                                            f"broadcast against {out_shape}") from err
                size = out_shape[axis]
                bn = bb.emit(relax.op.nn.batch_norm(
                    y, const(rng.uniform(0.5, 1.5, size)), const(rng.standard_normal(size)),
                    const(rng.standard_normal(size)), const(rng.uniform(0.5, 2.0, size)),
                    axis=axis, training=training))
                result = bb.emit_output(relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0))))
            bb.emit_func_output(result)
        return bb.get()

    @classmethod
    def example_space(cls) -> dict[str, tuple]:
        """Both data layouts and three kernel layouts, every bias spelling (some broadcast
        along another axis, which 8 output channels make the width), a batch norm along
        the height, training mode, the float dtypes, an int8 conv into float32, a wider
        ``out_dtype``, a symbolic batch."""
        return {"conv_bias": (False, True), "training": (False, True), "channels": (4, 8),
                "seed": (0, 1), "layout": ("NCHW", "NHWC"),
                "kernel_layout": ("OIHW", "HWIO", "OHWI"),
                "bias": ("reshape", "1C11", "C11", "C", "1"), "bn_axis": ("channel", "height"),
                "dtype": ("float32", "float16", "bfloat16", "int8"),
                "out_dtype": ("same", "float32", "cast_back"), "batch": (1, "n")}


#: The rewrite rules of this file (composite rules are table entries, not rewrites).
RULES = (BatchnormFoldIntoConv,)

#: Pattern table entries of this file, for ``PatternTable`` / ``MergeComposite``, in
#: priority order: the silu and clip variants (activation required) before the relu
#: composite, whose optional relu would otherwise take their conv + add.
COMPOSITES = (ConvAddReluComposite(activation="silu", relu=Presence.REQUIRED),
              ConvAddReluComposite(activation="clip", relu=Presence.REQUIRED),
              ConvAddReluComposite)
