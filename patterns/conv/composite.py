"""``conv2d -> [bias add] -> [relu | silu | clip]`` as pattern-table entries.

:class:`ConvAddReluComposite` is one class for every variant: whether the bias add and the
activation may, must or must not follow (:class:`Presence`), and which activation.  Its
check refuses an added tensor that is not a per-channel bias of the conv output;
:func:`conv2d_add_relu` is Relay's pattern as it was, which accepts any added tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

import tvm

from patternkit.dpl import DFPattern, is_constant, is_op, wildcard
from patternkit.engine import CompositeRule, RoleMatch, reject
from patternkit.ir import (
    NotPerChannel,
    dtype_of,
    per_channel_axis,
    prove_equal,
    static_shape,
    type_of,
)

from .examples import EXAMPLE_ACTIVATIONS, resnet_block


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
    r: DFPattern = is_op("nn.conv2d")(wildcard(), wildcard())
    r = is_op("add")(r, wildcard()) | r
    return r.optional(lambda x: is_op("nn.relu")(x))


def single_value(shape: tuple) -> bool:
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

    def check(self, match: RoleMatch) -> Any:
        """Accept unless the added tensor is not a per-channel (or single-value) bias."""
        if "add" not in match:
            return True
        out_ty, bias_ty = type_of(match.var_of("conv")), type_of(match.bias)
        out_shape, bias_shape = static_shape(out_ty), static_shape(bias_ty)
        if out_shape is None or bias_shape is None:
            return reject("the conv output or the bias has no static shape",
                          at=match.bias if bias_shape is None else match.conv)
        if dtype_of(bias_ty) != dtype_of(out_ty):
            return reject(f"bias dtype {dtype_of(bias_ty)} differs from the conv output "
                          f"dtype {dtype_of(out_ty)}", at=match.bias)
        if single_value(bias_shape):
            return True
        not_a_bias = (f"the added tensor of shape {tuple(bias_shape)} is not a per-channel "
                      f"bias of the conv output {tuple(out_shape)}")
        try:
            axis = per_channel_axis(bias_shape, out_shape, name="it", of="the conv output")
        except NotPerChannel as why:
            return reject(f"{not_a_bias}: {why}", at=match.bias)
        channel_axis = str(match.conv.attrs.out_layout).index("C")
        if axis != channel_axis:
            return reject(f"{not_a_bias}: it varies along axis {axis}, the channel axis is "
                          f"{channel_axis}", at=match.bias)
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """ResNet's first block in this variant's form: :func:`~.examples.resnet_block` with
        ``knobs``, its activation this variant's unless ``knobs`` names one.
        """
        if knobs.get("activation") is None:
            knobs["activation"] = self.activation
        return resnet_block(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Both layouts, three kernel layouts, biases on the channel axis, on another axis
        (4 channels make the later convs' width the channel count), on none, the whole
        output, none; biases as inputs; this variant's activation, the others and none;
        the float dtypes; a symbolic batch.
        """
        others = tuple(a for a in EXAMPLE_ACTIVATIONS if a != self.activation)
        return {"channels": (8, 4), "size": (16,), "seed": (0, 1),
                "layout": ("NCHW", "NHWC"), "kernel_layout": ("OIHW", "HWIO", "OHWI"),
                "bias": ("1C11", "C11", "C", "1", "full", "none"),
                "bias_source": ("constant", "input"),
                "activation": (self.activation, *others, "none"),
                "dtype": ("float32", "float16", "bfloat16"), "batch": (1, "n")}
