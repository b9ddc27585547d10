"""``from_onnx``'s ``Clip``, collapsed into ``R.clip``: the relu6 of ONNX models.

TVM 0.27's ONNX frontend writes ``Clip(x, min, max)`` (opset 11 and later, where the
bounds are inputs; both torch exporters write ``nn.ReLU6`` and ``clamp(x, 0, 6)`` this way,
at opset 14, 17 and 18: checked) not as ``R.clip`` but as two ``call_tir`` of TOPI
PrimFuncs, each bound first guarded against NaN::

    lo = where(isnan(c0), -inf, c0)              # folded to c0 by FoldConstant
    a = call_tir(maximum, (x, lo))
    hi = where(isnan(c6), inf, c6)
    y = call_tir(minimum, (a, hi))

so no rule reading Relax operators sees a relu6 in an ONNX model.  :class:`OnnxClipCollapse`
(``clip.collapse_onnx``) rewrites it into ``R.clip(x, c0, c6)``, whole numbers as integers,
so ``Clip(0, 6)`` becomes ``R.clip(x, 0, 6)``, exactly what ``relax.op.nn.relu6`` builds
and what ``relu6.collapse`` makes of the torch spellings.  Exact: clamps do not round
(only a NaN ``x`` could come out differently, as the clamps are applied in the other order).

The guards, each refusing with its reason: the callees are named as ``emit_te`` names
TOPI's ``maximum`` and ``minimum`` (``maximum``, ``maximum1``, ...: a rule sees the
callee's name, not its body, as ``tvm.relax.dpl``'s ``is_call_tir`` does); each bound is
one number (a rank-0 constant of ``x``'s dtype: a per-element bound is not a clip);
no bound is NaN (``Clip`` then leaves that side unbounded) and the number tested for NaN
is the bound; the lower bound is at most the upper one (``Clip`` then gives the upper
bound everywhere, ``R.clip`` the lower).

Deliberately not covered: a one-sided ``Clip`` (one ``call_tir``; it is ``R.maximum``
or ``R.minimum``, not a clip), bounds that are function parameters (``from_onnx(...,
keep_params_in_input=True)``; bind them first), and ``Clip`` before opset 11, whose bounds
are baked into the PrimFunc.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, alt, is_constant, is_gv, is_op, is_tuple, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import type_of

from .examples import onnx_clip_written_out

#: What ``BlockBuilder.emit_te`` names TOPI's functions (a suffix when the name is taken).
_TE_NAME = re.compile(r"(maximum|minimum)\d*")


@dataclass(frozen=True)
class ClipPlan:
    """The bounds of the clip, as ``R.clip`` takes them (whole numbers as ``int``)."""

    low: float | int
    high: float | int


def _bound(what: str) -> tuple[DFPattern, DFPattern, DFPattern]:
    """A bound as ``from_onnx`` writes it, ``where(isnan(c), inf, c)``, or folded to ``c``;
    the roles of ``c`` and of the constant tested for NaN.
    """
    value, tested = is_constant(), is_constant()
    guarded = is_op("where")(is_op("isnan")(tested), is_constant(), value)
    return alt(tag=f"{what}_form", folded=value, sanitised=guarded), value, tested


def _number(call_tir: Any, side: str, constant: Any, tested: Any, x_dtype: str) -> float:
    """The one number a bound holds; refuses bounds that are not one number, or are NaN."""
    callee = call_tir.args[0].name_hint
    name = "maximum" if side == "lower" else "minimum"
    if not _TE_NAME.fullmatch(callee):
        raise reject(f"the call_tir's callee is {callee!r}, not a PrimFunc that emit_te "
                     f"names after TOPI's {name}: its body is unknown here", at=call_tir)
    ty = type_of(constant)
    if ty.ndim != 0 or str(ty.dtype) != x_dtype:
        raise reject(f"the {side} bound is a {str(ty.dtype)} tensor of rank {ty.ndim}, not "
                     f"one {x_dtype} number: not a clip", at=constant)
    value = float(constant.value.numpy())
    if math.isnan(value):
        raise reject(f"the {side} bound is NaN: Clip leaves that side unbounded", at=constant)
    if tested is not None and not np.array_equal(tested.value.numpy(), constant.value.numpy()):
        raise reject(f"the NaN test reads {tested.value.numpy()}, not the bound {value}",
                     at=tested)
    return value


class OnnxClipCollapse(RewriteRule):
    """Collapse ``from_onnx``'s ``Clip`` (``call_tir`` of TOPI ``maximum``, ``minimum``) into
    ``R.clip``.
    """

    name = "clip.collapse_onnx"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        lower, self.low, self.low_tested = _bound("low")
        upper, self.high, self.high_tested = _bound("high")
        self.maximum = is_op("call_tir")(is_gv("maximum"), is_tuple([self.x, lower]))
        self.pattern: DFPattern = is_op("call_tir")(is_gv("minimum"),
                                                    is_tuple([self.maximum, upper]))

    def check(self, match: RoleMatch) -> Any:
        """A :class:`ClipPlan` when both bounds are numbers, in order."""
        dtype = str(type_of(match.x).dtype)
        low = _number(match.maximum, "lower", match.low,
                      match.low_tested if "low_tested" in match else None, dtype)
        high = _number(match.root, "upper", match.high,
                       match.high_tested if "high_tested" in match else None, dtype)
        if low > high:
            return reject(f"the lower bound {low:g} is above the upper bound {high:g}: Clip "
                          f"gives the upper bound everywhere, R.clip the lower one",
                          at=match.high)
        return ClipPlan(*(int(v) if v.is_integer() else v for v in (low, high)))

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.clip(x, low, high)``."""
        return relax.op.clip(match.x, match.plan.low, match.plan.high)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """``from_onnx``'s ``Clip``: :func:`onnx_clip_written_out` with ``knobs``."""
        return onnx_clip_written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Dtypes, shapes, bounds as imported or folded; relu6's bounds and others, reversed
        bounds (refused).
        """
        return {"dtype": ("float32", "float16"), "shape": ("batch_seq", "static", "vector"),
                "bounds": ("sanitised", "folded"), "low": (0.0, -1.5, 7.0), "high": (6.0, 1.0)}
