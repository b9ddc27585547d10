"""Quantisation written out by hand, collapsed into ``R.dequantize`` / ``R.quantize``.

Recognises (``q`` an int8 / uint8 tensor, ``x`` a float32 one, ``scale`` and ``zp``
per-tensor constants)

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

The guards, each refusing with its reason: the integer tensor is 8-bit; the float one is
float32 (``R.dequantize`` to float16 clips to float16's range first, a different
function); the scale and the zero point are one number each (a per-channel form needs
the axis, not covered); the zero point is a whole number in the dtype's range; the clip
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
from patternkit.ir import type_of

from .examples import QRANGE, dequantize_written_out, quantize_written_out

#: The quantised dtypes these rules take.
EIGHT_BIT = ("int8", "uint8")
#: The integer dtypes whose cast ``dequantize.collapse`` looks at (and refuses unless 8-bit).
CAST_FROM = ("int8", "uint8", "int16", "uint16", "int32")


@dataclass(frozen=True)
class QuantizationPlan:
    """The per-tensor quantisation parameters and the integer dtype."""

    scale: float
    zero_point: int
    dtype: str


def _scalar(constant: Any, what: str) -> float:
    """The one number ``constant`` holds; refuses a tensor of several."""
    value = constant.value.numpy()
    if value.size != 1:
        raise reject(f"the {what} has shape {value.shape}, not one number: a per-channel "
                     f"quantisation needs its axis (not covered)", at=constant)
    return float(value.reshape(()))


def _plan(dtype: str, float_expr: Any, scale: Any, zero_point: Any | None
          ) -> QuantizationPlan:
    """The plan, or a refusal; ``zero_point=None``: none subtracted (symmetric, 0)."""
    if dtype not in EIGHT_BIT:
        raise reject(f"the integer tensor is {dtype}, not int8 or uint8", at=float_expr)
    float_dtype = str(type_of(float_expr).dtype)
    if float_dtype != "float32":
        raise reject(f"the float tensor is {float_dtype}: R.dequantize / R.quantize compute "
                     f"in float32 (to float16 they clip to its range first)", at=float_expr)
    point = 0.0 if zero_point is None else _scalar(zero_point, "zero point")
    low, high = QRANGE[dtype]
    if not point.is_integer() or not low <= point <= high:
        raise reject(f"the zero point {point:g} is not a whole number in {dtype}'s range "
                     f"[{low}, {high}]", at=zero_point)
    return QuantizationPlan(_scalar(scale, "scale"), int(point), dtype)


def _constants(plan: QuantizationPlan) -> tuple[relax.Expr, relax.Expr]:
    return (relax.const(np.float32(plan.scale)),
            relax.const(np.asarray(plan.zero_point, plan.dtype)))


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
        return _plan(str(type_of(match.q).dtype), match.cast, match.scale, zero_point)

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.dequantize(q, scale, zp)`` with the plan's constants."""
        return relax.op.dequantize(match.q, *_constants(match.plan), axis=-1)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """:func:`.examples.dequantize_written_out` with ``knobs``."""
        return dequantize_written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Both 8-bit dtypes and int32 (refused), zero points in range and not, the product
        in both orders, float16 (refused), per-channel scales (refused).
        """
        return {"dtype": ("int8", "uint8", "int32"), "zero_point": (3.0, 0.0, None, 300.0, 2.5),
                "order": ("centred_first", "scale_first"), "float_dtype": ("float32", "float16"),
                "per_channel": (False, True)}


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
        plan = _plan(dtype, match.x, match.scale, match.zero_point)
        bounds = tuple(float(bound.value) for bound in match.clip.args[1:])
        if bounds != tuple(float(b) for b in QRANGE[dtype]):
            return reject(f"the clip to [{bounds[0]:g}, {bounds[1]:g}] is not {dtype}'s whole "
                          f"range {list(QRANGE[dtype])}, which R.quantize clips to",
                          at=match.clip)
        return plan

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.quantize(x, scale, zp, out_dtype=...)`` with the plan's constants."""
        return relax.op.quantize(match.x, *_constants(match.plan), axis=-1,
                                 out_dtype=match.plan.dtype)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """:func:`.examples.quantize_written_out` with ``knobs``."""
        return quantize_written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Both 8-bit dtypes and int16 (refused), zero points, the symmetric clip (refused),
        float16 inputs (refused), per-channel scales (refused).
        """
        return {"dtype": ("int8", "uint8", "int16"), "zero_point": (3.0, 0.0),
                "clip": ("full", "symmetric"), "float_dtype": ("float32", "float16"),
                "per_channel": (False, True)}
