"""A group norm written out, collapsed to ``R.nn.group_norm``.

A model that writes its group norm by hand (or normalises groups with ``F.layer_norm``)
reshapes ``x: (N, C, *spatial)`` to ``(N, G, C / G * prod(spatial))``, normalises the last
axis, reshapes back and applies a per-channel scale and shift.  The mean / variance steps
are collapsed to ``R.nn.layer_norm`` over the last axis by ``layernorm.collapse`` first
(with ``R.ones`` / ``R.zeros`` as its gamma and beta); the torch importer writes
``F.layer_norm`` without weights as a ``layer_norm`` with constant ones and zeros.

``nn.GroupNorm`` exported to ONNX (the TorchScript exporter below opset 18, and the dynamo
exporter) is ``InstanceNormalization`` over ``(N, G, K)`` with unit scale and zero bias
between the two reshapes; TVM's importer writes that normalisation out, and
``instancenorm.collapse`` makes it an ``R.nn.instance_norm`` with ``channel_axis=1,
axes=[2]`` whose ``(G,)`` gamma and beta are the exporter's constants reshaped.  So
:class:`GroupNormCollapse` (``groupnorm.collapse``) matches either inner norm::

    reshape(x, (N, G, K)) -> layer_norm(axes=[-1], ones, zeros)       -> reshape(x.shape)
                          |  instance_norm(channel_axis=1, axes=[2], ones, zeros)
        -> multiply(scale) -> add(shift)

and produces ``R.nn.group_norm(x, gamma, beta, num_groups=G, channel_axis=1,
axes=[2, ...])`` with the scale and shift as ``(C,)`` parameters.

A bfloat16 group norm's inner norm runs in float32 between casts of the groups (that is
what ``layernorm.collapse`` writes: TVM 0.27 has no bfloat16 ``layer_norm`` and refuses a
bfloat16 ``group_norm``), so the rule also matches ``astype(norm(astype(grouped)))``
and produces ``astype(group_norm(astype(x, float32), ...), bfloat16)``, the float32 group
norm rounded once, naming the precision in the log.  The casts must widen exactly: a
norm in a dtype that does not hold ``x``'s values, or a result cast to a dtype the
norm's does not hold, is refused.

Guards, each a reason in the log: the first reshape must keep the batch and split the
channels into ``G`` equal groups (``K * G == C * prod(spatial)``, ``C % G == 0``); the
second must give back ``x``'s shape; the layer norm must normalise only the last axis
(the instance norm: only the last, with the groups as its channel axis) with gamma all
ones and beta all zeros; scale and shift must vary along the channel axis
1 only.  Not covered: channels-last grouping, a group norm without the affine step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import alt, is_constant, is_op, through, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import dtype_of, prove_equal, round_trips_wider, static_shape, type_of

from ..layernorm.guards import log_float32_norm, norm_compute_dtype, widened
from .affine import (
    check_exact_narrowing,
    check_per_channel_affine,
    check_unit_params,
    shape_text,
    unit_params,
)
from .examples import written_out_group_norm

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupNormPlan:
    """What the check found, for the rewrite: groups, channels and the epsilon."""

    groups: int
    channels: int
    epsilon: float


class GroupNormCollapse(RewriteRule):
    """Collapse a group norm written as reshape, layer norm, reshape, affine to
    ``R.nn.group_norm``.
    """

    name = "groupnorm.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.grouped = is_op("reshape")(self.x, wildcard())
        # a bfloat16 group norm's inner norm runs in float32 between casts (TVM has no
        # bfloat16 layer_norm or instance_norm: layernorm.collapse computes it so)
        self.wide_grouped = is_op("astype")(self.grouped)
        grouped = alt(tag="widening", none=self.grouped, cast=self.wide_grouped)
        params = unit_params()
        self.inner_gamma, self.inner_beta = params.constant_gamma, params.constant_beta
        self.norm = is_op("nn.layer_norm")(grouped, params.gamma, params.beta)
        # the ONNX form: InstanceNormalization over the groups, its (G,) constants
        # reshaped by the importer (to (G, 1) for the affine step, back to (G,))
        self.group_gamma, self.group_beta = is_constant(), is_constant()
        self.instance = is_op("nn.instance_norm")(
            grouped, through(self.group_gamma, ("reshape", "astype"), depth=3),
            through(self.group_beta, ("reshape", "astype"), depth=3))
        inner = alt(tag="inner_norm", layer_norm=self.norm, instance_norm=self.instance)
        self.narrowed = is_op("astype")(inner)
        normed = alt(tag="precision", native=inner, narrowed=self.narrowed)
        self.ungrouped = is_op("reshape")(normed, wildcard())
        self.scale, self.shift = wildcard(), wildcard()
        self.scaled = is_op("multiply")(self.ungrouped, self.scale)
        self.pattern = is_op("add")(self.scaled, self.shift)

    def check(self, match: RoleMatch) -> Any:
        """A :class:`GroupNormPlan` when the reshapes group whole channels and the
        affine step is per channel.
        """
        x_shape = static_shape(type_of(match.x))
        grouped = static_shape(type_of(match.var_of("grouped")))
        if x_shape is None or len(x_shape) < 3 or grouped is None or len(grouped) != 3:
            return reject(f"x {shape_text(x_shape)} is not reshaped from (N, C, *spatial) "
                          f"to (N, G, K) but to {shape_text(grouped)}", at=match.grouped)
        channels, groups = x_shape[1], grouped[1]
        if not (isinstance(channels, int) and isinstance(groups, int)):
            return reject(f"channels {channels} and groups {groups} are not both static",
                          at=match.grouped)
        spatial = int(np.prod([int(d) for d in x_shape[2:]])) if all(
            isinstance(d, int) for d in x_shape[2:]) else None
        if (spatial is None or channels % groups != 0 or not prove_equal(grouped[0], x_shape[0])
                or not prove_equal(grouped[2], channels // groups * spatial)):
            return reject(f"the reshape of x {shape_text(x_shape)} to {shape_text(grouped)} "
                          f"does not split its {channels} channels into {groups} groups of "
                          f"whole channels", at=match.grouped)
        why = self._inner_norm_refusal(match)
        if why is not None:
            return why
        norm = match.norm if match.tag("inner_norm") == "layer_norm" else match.instance
        why = self._precision_refusal(match, norm)
        if why is not None:
            return why
        back = static_shape(type_of(match.var_of("ungrouped")))
        if back is None or len(back) != len(x_shape) or not all(
                prove_equal(a, b) for a, b in zip(back, x_shape)):
            return reject(f"the normalised groups are reshaped to {shape_text(back)}, not "
                          f"back to x's {shape_text(x_shape)}", at=match.ungrouped)
        check_per_channel_affine(match, x_shape)
        return GroupNormPlan(groups, channels, float(norm.attrs.epsilon))

    @staticmethod
    def _precision_refusal(match: RoleMatch, norm: Any) -> Any:
        """The refusal of casts around the inner norm that are not exact widenings of x and
        one rounding of the result back (``None`` when there are none or they are).
        """
        x_dtype, wide = dtype_of(type_of(match.x)), dtype_of(type_of(norm)) or ""
        if match.tag("widening") == "cast" and not round_trips_wider(x_dtype or "", wide,
                                                                     x_dtype or ""):
            return reject(f"the groups of the {x_dtype} x are normalised in {wide}, which "
                          f"does not hold every {x_dtype} value", at=match.wide_grouped)
        if match.tag("precision") == "narrowed":
            check_exact_narrowing(match.narrowed, wide, f"the {wide} norm's")
        return None

    @staticmethod
    def _inner_norm_refusal(match: RoleMatch) -> Any:
        """The refusal of a norm between the reshapes that is not one normalisation of
        each group (``None`` when it is).
        """
        if match.tag("inner_norm") == "layer_norm":
            norm, op, roles = match.norm, "layer_norm", ("inner_gamma", "inner_beta")
            axes = [int(a) for a in norm.attrs.axes]
            if len(axes) != 1 or axes[0] % 3 != 2:
                return reject(f"the layer_norm normalises axes {axes}, not only the group "
                              f"axis (the last)", at=norm)
        else:
            norm, op, roles = match.instance, "instance_norm", ("group_gamma", "group_beta")
            axes = [int(a) % 3 for a in norm.attrs.axes]
            channel_axis = int(norm.attrs.channel_axis) % 3
            if axes != [2] or channel_axis != 1:
                return reject(f"the instance_norm normalises axes {axes} with channel axis "
                              f"{channel_axis} of the grouped (N, G, K): a group norm "
                              f"normalises the last axis with the groups as channels",
                              at=norm)
        check_unit_params(match, roles, op, "a group norm")
        return None

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.nn.group_norm`` of ``x`` with the scale and shift as ``(C,)`` parameters."""
        plan: GroupNormPlan = match.plan
        ndim = len(static_shape(type_of(match.x)) or ())

        def per_channel(value: Any) -> Any:
            inner = value
            if isinstance(value, relax.Call) and value.op.name == "relax.reshape":
                inner = value.args[0]  # the (C,) parameter the importer reshaped
            if static_shape(type_of(inner)) == (plan.channels,):
                return inner
            return relax.op.reshape(value, (plan.channels,))

        inner = match.norm if match.tag("inner_norm") == "layer_norm" else match.instance
        # a bfloat16 norm runs in float32 (TVM refuses a bfloat16 group_norm)
        compute = norm_compute_dtype(dtype_of(type_of(inner)) or "float32")
        norm = relax.op.nn.group_norm(widened(match.x, compute),
                                      widened(per_channel(match.scale), compute),
                                      widened(per_channel(match.shift), compute),
                                      num_groups=plan.groups, channel_axis=1,
                                      axes=list(range(2, ndim)), epsilon=plan.epsilon)
        narrowed = match.tag("precision") == "narrowed"
        narrow = dtype_of(type_of(match.narrowed if narrowed else inner)) or compute
        if narrow == compute:
            return norm
        at = match.var_of("narrowed" if narrowed else
                         "norm" if match.tag("inner_norm") == "layer_norm" else "instance")
        log_float32_norm(_LOG, self.name, "group_norm", at, narrow, compute)
        return relax.op.astype(norm, narrow)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A written-out group norm: :func:`~.examples.written_out_group_norm`."""
        return written_out_group_norm(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two group counts, 1-D and 2-D spatial shapes, the inner gamma and beta as
        ``R.ones``/``R.zeros``, constants or learned values, the ONNX instance-norm form
        (unit or learned per-group values), channels-last grouping,
        an affine step along the width, a reshape to another shape, two float dtypes,
        a symbolic batch.
        """
        return {"groups": (2, 4), "channels": (8, 4), "spatial": (1, 2),
                "inner": ("ones", "constant", "learned", "instance", "instance_learned"),
                "grouping": ("groups", "channels_last"), "affine_axis": ("channel", "last"),
                "back": ("input", "other"), "dtype": ("float32", "float16", "bfloat16"),
                "batch": (2, "n"), "seed": (0, 1)}
