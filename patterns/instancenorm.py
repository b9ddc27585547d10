"""An instance norm written out, collapsed to ``R.nn.instance_norm``; its composite.

A hand-written instance norm (``x.mean((2, 3))``, ``x.var((2, 3))``, normalise, then a
per-channel scale and shift) has its mean / variance steps collapsed to
``R.nn.layer_norm`` over the spatial axes by ``layernorm.collapse`` first, with
``R.ones`` / ``R.zeros`` as its gamma and beta.  :class:`InstanceNormCollapse`
(``instancenorm.collapse``) matches::

    layer_norm(x, ones, zeros, axes=[2, ..., ndim - 1]) -> multiply(scale) -> add(shift)

on ``x: (N, C, *spatial)`` and produces ``R.nn.instance_norm(x, gamma, beta,
channel_axis=1, axes=[2, ...])`` with the scale and shift as ``(C,)`` parameters.

A bfloat16 norm reaches this rule as ``layernorm.collapse`` writes it, the layer norm in
float32 between casts (TVM 0.27 has no bfloat16 ``layer_norm`` or ``instance_norm``
kernel): ``astype(layer_norm(astype(x, float32), ...), bfloat16)``.  The instance norm
then runs in float32 too, the scale and shift widened (exact) and the result cast back
once; the log names the precision.  A cast back to a dtype the norm's does not hold
(a float16 norm of a float32 model) is refused: the affine step would change precision.

Guards, each a reason in the log: the layer norm must normalise every spatial axis and
only those (of a rank >= 3 input), with gamma all ones and beta all zeros; scale and
shift must vary along the channel axis 1 only.  Not covered: channels-last instance
norms, an instance norm without the affine step (it is a layer norm already), and
``nn.InstanceNorm2d`` itself (the torch importer emits ``R.nn.instance_norm``).

Composite (:data:`COMPOSITES`, for external compilers): ``instance_norm``, the op alone
(:class:`InstanceNormComposite`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import alt, is_op, wildcard
from patternkit.engine import CompositeRule, NoSuchExample, RewriteRule, RoleMatch, reject
from patternkit.ir import dtype_of, static_shape, type_of

from .groupnorm.affine import (
    check_exact_narrowing,
    check_per_channel_affine,
    check_unit_params,
    shape_text,
    unit_params,
)
from .layernorm.guards import NORM_IN_FLOAT32, log_float32_norm, norm_compute_dtype, widened

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstanceNormPlan:
    """What the check found, for the rewrite: channels, rank and the epsilon."""

    channels: Any
    ndim: int
    epsilon: float


class InstanceNormCollapse(RewriteRule):
    """Collapse an instance norm written as a spatial layer norm and a per-channel affine
    step to ``R.nn.instance_norm``.
    """

    name = "instancenorm.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        params = unit_params()
        self.inner_gamma, self.inner_beta = params.constant_gamma, params.constant_beta
        self.norm = is_op("nn.layer_norm")(self.x, params.gamma, params.beta)
        # a bfloat16 norm, which layernorm.collapse computes in float32 between casts
        self.narrowed = is_op("astype")(self.norm)
        normed = alt(tag="precision", native=self.norm, float32=self.narrowed)
        self.scale, self.shift = wildcard(), wildcard()
        self.scaled = is_op("multiply")(normed, self.scale)
        self.pattern = is_op("add")(self.scaled, self.shift)

    def check(self, match: RoleMatch) -> Any:
        """An :class:`InstanceNormPlan` when the norm covers exactly the spatial axes and
        the affine step is per channel.
        """
        x_shape = static_shape(type_of(match.x))
        norm = match.norm
        ndim = len(x_shape) if x_shape is not None else 0
        axes = sorted(int(a) % max(ndim, 1) for a in norm.attrs.axes)
        if ndim < 3 or axes != list(range(2, ndim)):
            return reject(f"the layer_norm normalises axes {[int(a) for a in norm.attrs.axes]} "
                          f"of x {shape_text(x_shape)}: an instance norm normalises every "
                          f"spatial axis of (N, C, *spatial) and only those", at=norm)
        check_unit_params(match, ("inner_gamma", "inner_beta"), "layer_norm", "an instance norm")
        assert x_shape is not None  # ndim >= 3 above
        if match.tag("precision") == "float32":
            wide = dtype_of(type_of(norm))
            check_exact_narrowing(match.narrowed, wide, f"the layer_norm's {wide}")
        check_per_channel_affine(match, x_shape)
        return InstanceNormPlan(x_shape[1], ndim, float(norm.attrs.epsilon))

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.nn.instance_norm`` of ``x`` with the scale and shift as ``(C,)``."""
        plan: InstanceNormPlan = match.plan
        # a bfloat16 norm runs in float32 (TVM has no bfloat16 instance_norm kernel)
        compute = norm_compute_dtype(dtype_of(type_of(match.x)) or "float32")
        norm = relax.op.nn.instance_norm(
            widened(match.x, compute),
            widened(relax.op.reshape(match.scale, (plan.channels,)), compute),
            widened(relax.op.reshape(match.shift, (plan.channels,)), compute), channel_axis=1,
            axes=list(range(2, plan.ndim)), epsilon=plan.epsilon)
        narrowed = match.tag("precision") == "float32"
        narrow = dtype_of(type_of(match.narrowed if narrowed else match.norm)) or compute
        if narrow == compute:
            return norm
        log_float32_norm(_LOG, self.name, "instance_norm",
                         match.var_of("narrowed" if narrowed else "norm"), narrow, compute)
        return relax.op.astype(norm, narrow)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A written-out instance norm: :func:`written_out_instance_norm`."""
        return written_out_instance_norm(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """1-D and 2-D spatial shapes, the inner gamma and beta as ``R.ones``/``R.zeros``,
        constants or learned values, a norm over the channels too, an affine step along
        the width, two float dtypes, a symbolic batch.
        """
        return {"spatial": (1, 2), "inner": ("ones", "constant", "learned"),
                "axes": ("spatial", "channels_too"), "affine_axis": ("channel", "last"),
                "dtype": ("float32", "float16", "bfloat16"), "batch": (2, "n"),
                "seed": (0, 1)}


def written_out_instance_norm(spatial: int = 2, inner: str = "ones", axes: str = "spatial",
                              affine_axis: str = "channel", dtype: str = "float32",
                              batch: int | str = 2, seed: int = 0,
                              norm_dtype: str | None = None) -> tvm.IRModule:
    """``layer_norm(x, ones, zeros, axes=spatial) * w.reshape(1, C, 1, 1) +
    b.reshape(1, C, 1, 1)`` on ``x: (N, 4, 4[, 4])``, then a SiLU; constants seeded.

    ``inner``: the layer norm's gamma and beta as ``R.ones`` / ``R.zeros``, constants of
    ones and zeros, or (an edge) learned values.  ``axes="channels_too"`` (an edge): the
    norm covers the channel axis as well.  ``affine_axis="last"`` (an edge): the scale
    and shift vary along the width.  ``batch``: a string is a symbolic dimension.  A
    bfloat16 norm is what ``layernorm.collapse`` makes of it: the layer norm in float32
    between casts; ``norm_dtype`` (an edge: ``"float64"`` of a float32 model) sets the
    layer norm's dtype between casts otherwise.
    """
    if axes == "channels_too" and inner == "learned":
        raise NoSuchExample("one edge at a time: axes='channels_too' with inner='ones'")
    rng = np.random.default_rng(seed)
    n = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
    shape = (n, 4, *(4,) * spatial)
    x = relax.Var("x", relax.TensorType(shape, dtype))
    normalised = list(range(1 if axes == "channels_too" else 2, len(shape)))
    norm_shape = [4] * len(normalised)

    inner_dtype = norm_dtype or ("float32" if dtype in NORM_IN_FLOAT32 else dtype)

    def const(values, of=dtype):
        return relax.const(np.asarray(values, dtype="float32"), of)

    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if inner == "ones":
                gamma = bb.emit(relax.op.ones(norm_shape, inner_dtype))
                beta = bb.emit(relax.op.zeros(norm_shape, inner_dtype))
            elif inner == "constant":
                gamma = const(np.ones(norm_shape), inner_dtype)
                beta = const(np.zeros(norm_shape), inner_dtype)
            else:
                gamma = const(rng.uniform(0.5, 1.5, norm_shape), inner_dtype)
                beta = const(rng.standard_normal(norm_shape), inner_dtype)
            data = x if inner_dtype == dtype else bb.emit(relax.op.astype(x, inner_dtype))
            y = bb.emit(relax.op.nn.layer_norm(data, gamma, beta, axes=normalised,
                                               epsilon=1e-5))
            if inner_dtype != dtype:
                y = bb.emit(relax.op.astype(y, dtype))
            axis = 1 if affine_axis == "channel" else len(shape) - 1
            param = [4 if a == axis else 1 for a in range(len(shape))]
            scale = bb.emit(relax.op.reshape(const(rng.uniform(0.5, 1.5, 4)), param))
            shift = bb.emit(relax.op.reshape(const(rng.standard_normal(4)), param))
            y = bb.emit(relax.op.add(bb.emit(relax.op.multiply(y, scale)), shift))
            out = bb.emit_output(relax.op.nn.silu(y))
        bb.emit_func_output(out)
    return bb.get()


class InstanceNormComposite(CompositeRule):
    """``<compiler>.instance_norm``: one ``R.nn.instance_norm`` as a pattern-table entry.

    What ``nn.InstanceNorm*`` imports as, what :class:`InstanceNormCollapse` makes of a
    written-out one, and what a group norm with one channel per group is (Wav2Vec2's
    feature encoder): without an entry it stayed on the host beside offloaded group and
    layer norms.  Its attributes (axes, epsilon) travel inside the composite.
    """

    def __init__(self, compiler: str = "byoc"):
        super().__init__(compiler)
        self.x, self.gamma, self.beta = wildcard(), wildcard(), wildcard()
        self.pattern = is_op("nn.instance_norm")(self.x, self.gamma, self.beta)
        self.pattern_name = "instance_norm"

    def check(self, match: RoleMatch) -> Any:
        """Accept every ``instance_norm``."""
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """:func:`instance_norm_call` with ``knobs``."""
        return instance_norm_call(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes, a static or a symbolic batch, one or two spatial axes."""
        return {"dtype": ("float32", "float16"), "batch": (2, "n"), "spatial": (1, 2)}


def instance_norm_call(dtype: str = "float32", batch: int | str = 2, spatial: int = 2,
                       seed: int = 0) -> tvm.IRModule:
    """``R.nn.instance_norm`` of ``x: (N, 8, 4[, 4])`` with seeded gamma and beta, its
    result read twice.
    """
    rng = np.random.default_rng(seed)
    n = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
    x = relax.Var("x", relax.TensorType((n, 8, *(4,) * spatial), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.instance_norm(
                x, relax.const(rng.uniform(0.5, 1.5, 8).astype(dtype)),
                relax.const(rng.standard_normal(8).astype(dtype)), channel_axis=1,
                axes=list(range(2, 2 + spatial))))
            out = bb.emit_output(relax.op.add(y, y))
        bb.emit_func_output(out)
    return bb.get()


#: The rewrite rules of this family.
RULES = (InstanceNormCollapse,)
#: Its pattern-table entry.
COMPOSITES = (InstanceNormComposite,)
