"""``attention.expand``: ``R.nn.attention`` written out for training graphs.

``relax.transform.Gradient`` has no gradient for the fused op; written out as the ONNX
importer writes it (two matmuls, a scale, a softmax, the permutes), it differentiates,
and ``attention.collapse`` turns it back.  A causal mask and a sliding window become an
additive bias (:mod:`.causal`), so a causal language model differentiates too.  In
:data:`patternkit.patterns.EXPANSIONS`, never in a set with the collapse.
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

from .causal import CAUSAL_MASKS, causal_bias, window_refusal
from .layout import HEADS_FIRST, KEY_TRANSPOSED, shape_text
from .plan import tolerance_of
from .written_out import example_dims


@dataclass(frozen=True)
class ExpandPlan:
    """What the written-out form needs beyond the match.

    Attributes
    ----------
    scale : float
        The scale the scores are multiplied by.
    causal_mask : str or None
        ``"TopLeft"``, ``"BottomRight"`` or ``None``: the call's own.
    window_size : int or None
        The call's sliding window (only with a causal mask and as many queries as keys).
    seq, kv_len : int or PrimExpr
        The query and key lengths the causal bias is built for.
    """

    scale: float
    causal_mask: str | None = None
    window_size: int | None = None
    seq: Any = None
    kv_len: Any = None


class AttentionExpand(RewriteRule):
    """Write ``R.nn.attention`` out in ops that ``relax.transform.Gradient`` differentiates.

    ``attention(q, k, v[, bias], scale)`` on BSNH tensors becomes the ONNX importer's form:
    ``permute_dims(matmul(softmax(matmul(q', k') * scale [+ bias]), v'), [0, 2, 1, 3])``
    with ``q' = permute_dims(q, [0, 2, 1, 3])``, ``k' = permute_dims(k, [0, 2, 3, 1])``
    and ``v' = permute_dims(v, [0, 2, 1, 3])`` (``attention.collapse`` turns it back).
    A missing scale is the op's default ``1/sqrt(H)``.  A ``causal_mask`` (``"TopLeft"``,
    ``"BottomRight"``) and a ``window_size`` are added to the scores after the bias as
    a ``(S, T)`` bias of 0 and ``-inf`` with TVM 0.27's semantics (:mod:`.causal`).
    Refused: a window without a causal mask or with as many queries as keys not proved
    (TVM's reference and its kernel disagree there), an unknown mask kind, query or key
    lengths unknown with a mask, and a head size that is not static when the scale is
    the default.
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
        """The scale to write out, and the causal mask and window with the lengths they need."""
        call = match.call
        attrs = call.attrs
        causal = None if attrs.causal_mask is None else str(attrs.causal_mask)
        window = None if attrs.window_size is None else int(attrs.window_size)
        shape = static_shape(type_of(match.q))
        seq = kv_len = None
        if causal is not None or window is not None:
            key_shape = static_shape(type_of(match.k))
            if causal is not None and causal not in CAUSAL_MASKS:
                return reject(f"the attention has causal_mask={causal}: TVM 0.27 knows "
                              f"{' and '.join(CAUSAL_MASKS)} only", at=call)
            dtype = dtype_of(type_of(match.q))
            if shape is None or key_shape is None or dtype is None:
                return reject(f"the attention's causal mask is built from the query and key "
                              f"lengths in the query's dtype: the query is "
                              f"{shape_text(shape)} of {dtype}, the key "
                              f"{shape_text(key_shape)}", at=call)
            seq, kv_len = shape[1], key_shape[1]
            why = window_refusal(causal, window, seq, kv_len)
            if why is not None:
                return reject(why, at=call)
        if attrs.scale is not None:
            return ExpandPlan(float(attrs.scale), causal, window, seq, kv_len)
        head = None if shape is None else shape[3]
        if not isinstance(head, int):
            return reject(f"the attention's default scale 1/sqrt(H) needs a static head size, "
                          f"the query has shape {shape_text(shape)}", at=call)
        return ExpandPlan(float(head) ** -0.5, causal, window, seq, kv_len)

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
        plan = match.plan
        if plan.causal_mask is not None:  # after the bias, as TVM masks the biased scores
            scores = relax.op.add(scores, causal_bias(plan.causal_mask, plan.window_size,
                                                      plan.seq, plan.kv_len, str(dtype)))
        p = relax.op.nn.softmax(scores, axis=-1)
        return relax.op.permute_dims(relax.op.matmul(p, v), list(HEADS_FIRST))

    def tolerance(self, dtype: str | None) -> Tolerance:
        """:data:`~.plan.FLOAT32` or :data:`~.plan.FLOAT16`."""
        return tolerance_of(dtype)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """``R.nn.attention(q, k, v[, bias], scale)`` on BSNH ``(B, S, 2, 16)`` tensors.

        The knobs are :func:`fused_attention`'s (``dtype="float32"``, ``shape="static"``,
        ``bias=True``, ``scale=0.25``, ``causal_mask=None``, ``window_size=None``).

        ``shape``: ``"static"`` (B = 2, S = T = 8), ``"symbolic"`` (batch and sequence),
        ``"cross"`` (S = 4, T = 8) or ``"long_query"`` (S = 8, T = 4); ``bias``: a
        ``(B, 1, 1, T)`` mask; ``scale=None``: the op's default; ``causal_mask``:
        ``"TopLeft"`` or ``"BottomRight"``; ``window_size``: a sliding window (TVM 0.27
        builds none for llvm: such an example is for the structure only).  A symbolic head
        size (``shape="symbolic_head"``) with the default scale is refused.
        """
        return fused_attention(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Dtypes, shapes, bias or not, scales, the causal masks; a symbolic head refused.

        No window: TVM 0.27 cannot build a windowed attention for llvm to compare with.
        """
        return {"dtype": ("float32", "float16"),
                "shape": ("static", "symbolic", "cross", "long_query", "symbolic_head"),
                "bias": (True, False), "scale": (0.25, None, 0.1),
                "causal_mask": (None, "TopLeft", "BottomRight")}


def fused_attention(dtype: str | None = "float32", shape: str = "static", bias: bool = True,
                    scale: float | None = 0.25, causal_mask: str | None = None,
                    window_size: int | None = None) -> tvm.IRModule:
    """``R.nn.attention`` on BSNH ``(B, S, 2, 16)`` tensors (:meth:`AttentionExpand.example`)."""
    heads = 2
    head = tvm.tirx.Var("head", "int64") if shape == "symbolic_head" else 16
    if shape == "long_query":  # more queries than keys: BottomRight's |S - T| shows
        batch, seq, kv_len = 2, 8, 4
    else:
        batch, seq, kv_len = example_dims("static" if shape == "symbolic_head" else shape)
    q = relax.Var("q", relax.TensorType((batch, seq, heads, head), dtype))
    k = relax.Var("k", relax.TensorType((batch, kv_len, heads, head), dtype))
    v = relax.Var("v", relax.TensorType((batch, kv_len, heads, head), dtype))
    mask = relax.Var("mask", relax.TensorType((batch, 1, 1, kv_len), dtype)) if bias else None
    return from_expr(relax.op.nn.attention(q, k, v, mask, scale=scale, causal_mask=causal_mask,
                                           window_size=window_size))
