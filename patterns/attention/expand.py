"""``attention.expand``: ``R.nn.attention`` written out for training graphs.

``relax.transform.Gradient`` has no gradient for the fused op; written out as the ONNX
importer writes it (two matmuls, a scale, a softmax, the permutes), it differentiates,
and ``attention.collapse`` turns it back.  In :data:`patternkit.patterns.EXPANSIONS`,
never in a set with the collapse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, alt, is_op, wildcard
from patternkit.engine import RewriteRule, RoleMatch, Tolerance, reject
from patternkit.ir import dtype_of, from_expr, static_shape, type_of

from .layout import HEADS_FIRST, KEY_TRANSPOSED, shape_text
from .plan import tolerance_of
from .written_out import example_dims


@dataclass(frozen=True)
class ExpandPlan:
    """The scale the written-out scores are multiplied by (a number is no plan: it accepts)."""

    scale: float


class AttentionExpand(RewriteRule):
    """Write ``R.nn.attention`` out in ops that ``relax.transform.Gradient`` differentiates.

    ``attention(q, k, v[, bias], scale)`` on BSNH tensors becomes the ONNX importer's form:
    ``permute_dims(matmul(softmax(matmul(q', k') * scale [+ bias]), v'), [0, 2, 1, 3])``
    with ``q' = permute_dims(q, [0, 2, 1, 3])``, ``k' = permute_dims(k, [0, 2, 3, 1])``
    and ``v' = permute_dims(v, [0, 2, 1, 3])`` (``attention.collapse`` turns it back).
    A missing scale is the op's default ``1/sqrt(H)``.  Refused: a causal mask or a
    sliding window (the op builds them inside; written out they would need the key and
    query lengths), and a head size that is not static when the scale is the default.
    """

    name = "attention.expand"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.q, self.k, self.v, self.bias = wildcard(), wildcard(), wildcard(), wildcard()
        self.call = alt(tag="op", attention_bias=is_op("nn.attention_bias")(
            self.q, self.k, self.v, self.bias), attention=is_op("nn.attention")(
            self.q, self.k, self.v))
        self.pattern: DFPattern = self.call

    def check(self, match: RoleMatch) -> Any:
        """The scale to write out, when the call has no causal mask and no window."""
        call = match.call
        attrs = call.attrs
        if attrs.causal_mask is not None or attrs.window_size is not None:
            return reject(f"the attention has causal_mask={attrs.causal_mask}, window_size="
                          f"{attrs.window_size}: attention.expand writes out the plain and "
                          f"the bias form only", at=call)
        if attrs.scale is not None:
            return ExpandPlan(float(attrs.scale))
        shape = static_shape(type_of(match.q))
        head = None if shape is None else shape[3]
        if not isinstance(head, int):
            return reject(f"the attention's default scale 1/sqrt(H) needs a static head size, "
                          f"the query has shape {shape_text(shape)}", at=call)
        return ExpandPlan(float(head) ** -0.5)

    def rewrite(self, match: RoleMatch) -> Any:
        """The ONNX importer's form of the call, with the plan's scale."""
        dtype = dtype_of(type_of(match.q))
        q = relax.op.permute_dims(match.q, list(HEADS_FIRST))
        k_t = relax.op.permute_dims(match.k, list(KEY_TRANSPOSED))
        v = relax.op.permute_dims(match.v, list(HEADS_FIRST))
        scores = relax.op.multiply(relax.op.matmul(q, k_t),
                                   relax.const(np.array(match.plan.scale, dtype)))
        if match.tag("op") == "attention_bias":
            scores = relax.op.add(scores, match.bias)
        p = relax.op.nn.softmax(scores, axis=-1)
        return relax.op.permute_dims(relax.op.matmul(p, v), list(HEADS_FIRST))

    def tolerance(self, dtype: str | None) -> Tolerance:
        """:data:`~.plan.FLOAT32` or :data:`~.plan.FLOAT16`."""
        return tolerance_of(dtype)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """``R.nn.attention(q, k, v[, bias], scale)`` on BSNH ``(B, S, 2, 16)`` tensors.

        The knobs are :func:`fused_attention`'s (``dtype="float32"``, ``shape="static"``,
        ``bias=True``, ``scale=0.25``, ``causal_mask=None``).

        ``shape``: ``"static"`` (B = 2, S = T = 8), ``"symbolic"`` (batch and sequence) or
        ``"cross"`` (S = 4, T = 8); ``bias``: a ``(B, 1, 1, T)`` mask; ``scale=None``:
        the op's default; ``causal_mask`` (``"TopLeft"``) and a symbolic head size
        (``shape="symbolic_head"``) are refused.
        """
        return fused_attention(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Dtypes, shapes, bias or not, scales; a causal mask and a symbolic head refused."""
        return {"dtype": ("float32", "float16"),
                "shape": ("static", "symbolic", "cross", "symbolic_head"),
                "bias": (True, False), "scale": (0.25, None, 0.1),
                "causal_mask": (None, "TopLeft")}


def fused_attention(dtype: str = "float32", shape: str = "static", bias: bool = True,
                    scale: float | None = 0.25, causal_mask: str | None = None) -> tvm.IRModule:
    """``R.nn.attention`` on BSNH ``(B, S, 2, 16)`` tensors (:meth:`AttentionExpand.example`)."""
    heads = 2
    head = tvm.tirx.Var("head", "int64") if shape == "symbolic_head" else 16
    batch, seq, kv_len = example_dims("static" if shape == "symbolic_head" else shape)
    q = relax.Var("q", relax.TensorType((batch, seq, heads, head), dtype))
    k = relax.Var("k", relax.TensorType((batch, kv_len, heads, head), dtype))
    v = relax.Var("v", relax.TensorType((batch, kv_len, heads, head), dtype))
    mask = relax.Var("mask", relax.TensorType((batch, 1, 1, kv_len), dtype)) if bias else None
    return from_expr(relax.op.nn.attention(q, k, v, mask, scale=scale, causal_mask=causal_mask))
