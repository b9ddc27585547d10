"""``from_onnx``'s ``Max`` and ``Min``, collapsed into ``R.maximum`` / ``R.minimum``.

TVM 0.27's ONNX frontend writes the variadic ``Max(a, b)`` (and ``Min``) as a reduction
over a stack, not as the elementwise op::

    s = stack((broadcast_to(a, shape), broadcast_to(b, shape)), axis=0)
    y = max(s, axis=[0], keepdims=False)

so torch's ``minimum(maximum(x, 0), 6)`` through the TorchScript exporter (opsets 14 and
17: checked) reaches no rule as a relu6.  :class:`OnnxMinMaxCollapse`
(:class:`OnnxMaxCollapse`, ``maximum.collapse_onnx``, and :class:`OnnxMinCollapse`,
``minimum.collapse_onnx``) rewrites the pair back into
``R.maximum(a, b)`` / ``R.minimum(a, b)`` (the operands before their ``broadcast_to``;
``broadcast_to`` of the result to ``shape`` when neither operand has that shape already),
after which ``relu6.collapse`` takes ``minimum(maximum(x, 0), 6)``.  Exact: the reduction
over two stacked values is the elementwise maximum (minimum), same comparison, no rounding.

The guard, refusing with its reason: the reduction runs along the stacked axis, without
``keepdims`` (another axis, or a kept axis, is not the elementwise op).

Deliberately not covered: ``Max`` / ``Min`` of three or more inputs (a longer stack) and
of one input (``from_onnx`` returns the input).
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm
import tvm_ffi
from tvm import relax

from patternkit.dpl import DFPattern, is_op, is_tuple, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import type_of

from .examples import onnx_minmax_written_out

#: The reduction ``from_onnx`` writes, and the elementwise op it is, per variant.
_OPS = {"max": ("maximum", relax.op.maximum), "min": ("minimum", relax.op.minimum)}


class OnnxMinMaxCollapse(RewriteRule):
    """Collapse ``from_onnx``'s ``Max`` / ``Min`` (a reduction over a ``stack`` of the two
    operands broadcast to one shape) into ``R.maximum`` / ``R.minimum``; the variants are
    :class:`OnnxMaxCollapse` and :class:`OnnxMinCollapse` (:attr:`reduce` says which).
    """

    #: The reduction ``from_onnx`` writes: ``"max"`` or ``"min"``.
    reduce = "max"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.a, self.b = wildcard(), wildcard()
        self.stack = is_op("stack")(is_tuple([is_op("broadcast_to")(self.a, wildcard()),
                                              is_op("broadcast_to")(self.b, wildcard())]))
        self.pattern: DFPattern = is_op(self.reduce)(self.stack)

    def check(self, match: RoleMatch) -> Any:
        """Accept when the reduction runs along the stacked axis and drops it."""
        refusal = reduction_refusal(match, self.reduce)
        return True if refusal is None else refusal

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.maximum(a, b)`` (``R.minimum``), broadcast to the stack's shape if need be."""
        shape = type_of(match.root).shape
        result = _OPS[self.reduce][1](match.a, match.b)
        if any(_same(getattr(type_of(v), "shape", None), shape) for v in (match.a, match.b)):
            return result
        return relax.op.broadcast_to(result, shape)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """``from_onnx``'s ``Max`` / ``Min``: :func:`onnx_minmax_written_out` with ``knobs``."""
        return onnx_minmax_written_out(**{"reduce": self.reduce, **knobs})

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Dtypes, shapes, a number / a tensor / a row as the other operand (or two operands
        neither of the output's shape), the stacked axis; the reduction along another axis
        or keeping it (refused).
        """
        return {"dtype": ("float32", "float16"), "shape": ("batch_seq", "static", "vector"),
                "other": ("scalar", "tensor", "row", "outer"), "axis": (0, 1),
                "reduce_axis": (None, 1), "keepdims": (False, True)}


def reduction_refusal(match: RoleMatch, reduce: str) -> Any:
    """``None`` when the ``reduce`` reduction of the match runs along the stacked axis and
    drops it, else the refusal (reason and the reduction).
    """
    rank = int(type_of(match.var_of("stack")).ndim)
    stacked = int(match.stack.attrs.axis) % rank
    attrs = match.root.attrs
    axes = None if attrs.axis is None else [int(a) % rank for a in attrs.axis]
    if axes == [stacked] and not bool(attrs.keepdims):
        return None
    return reject(f"the {reduce} reduces axes {axes} (keepdims={bool(attrs.keepdims)}) of the "
                  f"operands stacked along axis {stacked}: only the stacked axis, dropped, is "
                  f"the elementwise {_OPS[reduce][0]}", at=match.root)


class OnnxMaxCollapse(OnnxMinMaxCollapse):
    """Collapse ``from_onnx``'s ``Max(a, b)`` into ``R.maximum(a, b)``."""

    name = "maximum.collapse_onnx"
    reduce = "max"


class OnnxMinCollapse(OnnxMinMaxCollapse):
    """Collapse ``from_onnx``'s ``Min(a, b)`` into ``R.minimum(a, b)``."""

    name = "minimum.collapse_onnx"
    reduce = "min"


def _same(shape: Any, other: Any) -> bool:
    """Two shapes (``ShapeExpr`` or ``None``) are known and structurally equal."""
    return (shape is not None and other is not None
            and tvm_ffi.structural_equal(shape, other, map_free_vars=False))
