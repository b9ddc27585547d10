"""Quantisation written out by hand, collapsed into ``R.dequantize`` / ``R.quantize``.

Recognises (``q`` an int8 / uint8 tensor, ``x`` a float32 one, ``scale`` and ``zp``
constants, per tensor or per channel)

* ``dequantize.collapse``: ``(q.astype(float32) - zp) * scale``, the product in either
  order (torch's ``(q.float() - zp) * scale`` through the torch importer), and
  ``q.astype(float32) * scale`` (symmetric, zero point 0: how weights are written) ->
  ``R.dequantize(q, scale, zp)``.  Bit-identical: the op subtracts the zero point in
  int32 and multiplies once, the written form subtracts integers held exactly in
  float32 and multiplies once.
* ``quantize.collapse``: ``clip(round(x / scale) + zp, qmin, qmax).astype(int8 | uint8)``
  with ``[qmin, qmax]`` the dtype's whole range (torch's ``clamp(round(x / s) + zp, -128,
  127).to(torch.int8)``) -> ``R.quantize(x, scale, zp, out_dtype=...)``, which legalises
  to the same divide, round, add, clip and cast: bit-identical.

A scale or zero point that varies along one axis of the quantised tensor (a weight's
output channels: ``scale`` of shape ``(C,)`` or ``(1, C, 1, 1)``) is a per-channel
quantisation: the op takes it as a ``(C,)`` constant with that ``axis`` (``R.dequantize``
and ``R.quantize`` legalise to the same per-element arithmetic, bit-identical again); a
one-number scale or zero point beside it stays one number.

The guards, each refusing with its reason: the integer tensor is 8-bit; the float one is
float32 (``R.dequantize`` to float16 clips to float16's range first, a different
function); the scale and the zero point are one number each or vary along one axis of
the quantised tensor, both the same one (``R.dequantize`` takes one ``axis``); the zero
point is whole numbers in the dtype's range; the clip
is the dtype's whole range (a narrower one, ``[-127, 127]`` for symmetric int8, is not what
``R.quantize`` computes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, alt, has_dtype, is_constant, is_op, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import NotPerChannel, per_channel_axis, static_shape, type_of

from .examples import QRANGE, dequantize_written_out, quantize_written_out

#: The quantised dtypes these rules take.
EIGHT_BIT = ("int8", "uint8")
#: The integer dtypes whose cast ``dequantize.collapse`` looks at (and refuses unless 8-bit).
CAST_FROM = ("int8", "uint8", "int16", "uint16", "int32")


@dataclass(frozen=True, eq=False)
class QuantizationPlan:
    """The quantisation parameters (one number each, or ``(C,)`` along ``axis``) and the
    integer dtype; ``axis`` is ``-1`` when both are one number.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    dtype: str
    axis: int = -1


def _channel_axis(constant: Any, tensor: Any, what: str) -> int | None:
    """The axis of ``tensor`` along which ``constant`` varies (``None``: one number);
    refuses a constant that varies along several axes or does not broadcast.
    """
    value = constant.value.numpy()
    if value.size == 1:
        return None
    shape = static_shape(type_of(tensor)) or ()  # unknown: no axis to vary along
    try:
        return per_channel_axis(tuple(value.shape), shape, name=f"the {what}",
                                of="the quantised tensor")
    except NotPerChannel as why:
        raise reject(f"{why}: R.dequantize / R.quantize take one number or one per channel "
                     f"of an axis", at=constant) from None


def _plan(dtype: str, float_expr: Any, scale: Any, zero_point: Any | None,
          quantised: Any) -> QuantizationPlan:
    """The plan, or a refusal; ``zero_point=None``: none subtracted (symmetric, 0);
    ``quantised``: the tensor a per-channel scale's axis is counted in.
    """
    if dtype not in EIGHT_BIT:
        raise reject(f"the integer tensor is {dtype}, not int8 or uint8", at=float_expr)
    float_dtype = str(type_of(float_expr).dtype)
    if float_dtype != "float32":
        raise reject(f"the float tensor is {float_dtype}: R.dequantize / R.quantize compute "
                     f"in float32 (to float16 they clip to its range first)", at=float_expr)
    axes = {what: _channel_axis(constant, quantised, what) for what, constant in
            (("scale", scale), ("zero point", zero_point)) if constant is not None}
    found = {axis for axis in axes.values() if axis is not None}
    if len(found) > 1:
        raise reject(f"the scale varies along axis {axes['scale']} and the zero point along "
                     f"axis {axes['zero point']}: R.dequantize / R.quantize take one axis",
                     at=zero_point)
    point = (np.zeros((), "float64") if zero_point is None
             else zero_point.value.numpy().astype("float64").reshape(-1))
    low, high = QRANGE[dtype]
    if not (np.all(point == np.round(point)) and np.all((low <= point) & (point <= high))):
        what = "a whole number" if point.size == 1 else "whole numbers"
        raise reject(f"the zero point {_numbers(point)} is not {what} in {dtype}'s range "
                     f"[{low}, {high}]", at=zero_point)
    values = scale.value.numpy().astype("float32").reshape(-1)
    return QuantizationPlan(values if values.size > 1 else values.reshape(()),
                            (point if point.size > 1 else point.reshape(())).astype(dtype),
                            dtype, found.pop() if found else -1)


def _numbers(values: np.ndarray) -> str:
    """One number as ``3``, several as ``[3, 2.5, ...]``."""
    flat = [f"{v:g}" for v in values.reshape(-1)]
    return flat[0] if len(flat) == 1 else "[" + ", ".join(flat) + "]"


def _constants(plan: QuantizationPlan) -> tuple[relax.Expr, relax.Expr]:
    return relax.const(plan.scale), relax.const(plan.zero_point)


class DequantizeCollapse(RewriteRule):
    """Collapse ``(q.astype(float32) - zp) * scale`` into ``R.dequantize(q, scale, zp)``."""

    name = "dequantize.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.scale, self.zero_point = is_constant(), is_constant()
        # Integer tensors only: a cast of a bool or int64 mask or index is no quantised value.
        self.q = alt(*(has_dtype(dtype) for dtype in CAST_FROM), tag="integer")
        self.cast = is_op("astype")(self.q)
        centred = alt(tag="zero_point", subtracted=self.cast - self.zero_point,
                      symmetric=self.cast)
        self.pattern: DFPattern = alt(centred * self.scale, self.scale * centred,
                                      tag="product_order")

    def check(self, match: RoleMatch) -> Any:
        """A :class:`QuantizationPlan` for an 8-bit ``q`` cast to float32."""
        zero_point = match.zero_point if "zero_point" in match else None
        return _plan(str(type_of(match.q).dtype), match.cast, match.scale, zero_point,
                     match.q)

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.dequantize(q, scale, zp)`` with the plan's constants."""
        return relax.op.dequantize(match.q, *_constants(match.plan), axis=match.plan.axis)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """:func:`.examples.dequantize_written_out` with ``knobs``."""
        return dequantize_written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Both 8-bit dtypes and int32 (refused), zero points in range and not, the product
        in both orders, float16 (refused), per-channel scales.
        """
        return {"dtype": ("int8", "uint8", "int32"), "zero_point": (3.0, 0.0, None, 300.0, 2.5),
                "order": ("centred_first", "scale_first"), "float_dtype": ("float32", "float16"),
                "per_channel": (False, True, "zero_point")}


class QuantizeCollapse(RewriteRule):
    """Collapse ``clip(round(x / scale) + zp, qmin, qmax).astype(int8)`` into
    ``R.quantize``.
    """

    name = "quantize.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x, self.scale, self.zero_point = wildcard(), is_constant(), is_constant()
        shifted = is_op("add")(is_op("round")(self.x / self.scale), self.zero_point)
        self.clip = is_op("clip")(shifted, is_constant(), is_constant())
        self.pattern: DFPattern = is_op("astype")(self.clip)

    def check(self, match: RoleMatch) -> Any:
        """A :class:`QuantizationPlan` when the clip is the integer dtype's whole range."""
        dtype = str(match.root.attrs.dtype)
        plan = _plan(dtype, match.x, match.scale, match.zero_point, match.x)
        bounds = tuple(float(bound.value) for bound in match.clip.args[1:])
        if bounds != tuple(float(b) for b in QRANGE[dtype]):
            return reject(f"the clip to [{bounds[0]:g}, {bounds[1]:g}] is not {dtype}'s whole "
                          f"range {list(QRANGE[dtype])}, which R.quantize clips to",
                          at=match.clip)
        return plan

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.quantize(x, scale, zp, out_dtype=...)`` with the plan's constants."""
        return relax.op.quantize(match.x, *_constants(match.plan), axis=match.plan.axis,
                                 out_dtype=match.plan.dtype)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """:func:`.examples.quantize_written_out` with ``knobs``."""
        return quantize_written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Both 8-bit dtypes and int16 (refused), zero points, the symmetric clip (refused),
        float16 inputs (refused), per-channel scales.
        """
        return {"dtype": ("int8", "uint8", "int16"), "zero_point": (3.0, 0.0),
                "clip": ("full", "symmetric"), "float_dtype": ("float32", "float16"),
                "per_channel": (False, True, "zero_point")}
