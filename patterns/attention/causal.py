"""The causal mask and sliding window of ``R.nn.attention``, written out as an additive bias.

``attention.expand`` writes the fused op out for ``relax.transform.Gradient``; a causal
language model's importer may have set ``causal_mask`` (and ``window_size``) on it, and
the op builds that mask inside.  Written out, it is a ``(S, T)`` bias of 0 (kept) and
``-inf`` (masked) added to the scores before the softmax.  Which entries TVM 0.27 keeps,
with ``i`` the query row and ``j`` the key column (``topi``'s legalisation,
``_te_attention``, and its reference ``tvm.topi.testing.attention_python``):

* ``"TopLeft"``: ``j <= i`` (``trilu(k=0)``), whatever ``S`` and ``T`` are;
* ``"BottomRight"``: ``j <= i + |S - T|`` (``trilu(k=abs(S - T))``).  With fewer queries
  than keys this is the usual bottom-right alignment (the last query sees every key); with
  *more* queries than keys TVM still shifts the diagonal right (the absolute value), which
  differs from flash-attention's convention; TVM's is the one written out, since the fused
  op computes it;
* ``window_size=w`` (with a causal mask): also ``j >= i - w + 1`` (``triu(k=1 - w)`` in the
  reference).  TVM 0.27 cannot build a windowed attention for llvm (its legalisation asserts),
  and its cutlass path aligns the window on the bottom-right diagonal where the reference
  aligns it on the main one; the two agree only when ``S == T``, so only that case is
  written out (the others are refused by :func:`window_refusal`).

TVM masks by zeroing the scores and the exponentials outside the kept triangle; the
softmax over the kept entries is the same as the one over the scores plus this bias (a
masked entry's exponential is 0 either way).  The mask is built from the shapes with
``ones``, ``tril``, ``triu`` and ``where``: it reads no parameter, so ``Gradient`` never
differentiates it, and symbolic sequence lengths work.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.ir import prove_equal

#: The ``causal_mask`` values of ``R.nn.attention`` (TVM 0.27).
CAUSAL_MASKS = ("TopLeft", "BottomRight")


def diagonal_offset(causal_mask: str, seq: Any, kv_len: Any) -> Any:
    """The last kept diagonal: 0 for ``"TopLeft"``, ``|S - T|`` for ``"BottomRight"``."""
    if causal_mask == "TopLeft":
        return 0
    if isinstance(seq, int) and isinstance(kv_len, int):
        return abs(seq - kv_len)
    return tvm.tirx.abs(tvm.tirx.const(0, "int64") + seq - kv_len)


def window_refusal(causal_mask: str | None, window_size: int | None, seq: Any,
                   kv_len: Any) -> str | None:
    """Why a sliding window cannot be written out (``None``: it can, or there is none)."""
    if window_size is None:
        return None
    if causal_mask is None:
        return (f"window_size={window_size} without a causal mask: TVM's reference ignores "
                f"it and its cutlass path refuses it, so it has no meaning to write out")
    if not prove_equal(seq, kv_len):
        return (f"window_size={window_size} with {seq} queries on {kv_len} keys: TVM's "
                f"reference aligns the window on the main diagonal and its cutlass kernel on "
                f"the bottom-right one; they agree only for as many queries as keys")
    return None


def causal_bias(causal_mask: str, window_size: int | None, seq: Any, kv_len: Any,
                dtype: str) -> relax.Expr:
    """The ``(S, T)`` bias: 0 where TVM's attention keeps a score, ``-inf`` where it masks it."""
    kept = relax.op.tril(relax.op.ones(relax.ShapeExpr([seq, kv_len]), "bool"),
                         diagonal_offset(causal_mask, seq, kv_len))
    if window_size is not None:
        kept = relax.op.triu(kept, 1 - int(window_size))
    zero, minus_inf = (relax.const(np.array(v, dtype)) for v in (0.0, -np.inf))
    return relax.op.where(kept, zero, minus_inf)
