"""The bias as one tensor, and the fully masked rows torch's SDPA zeroes.

``R.nn.attention`` takes one additive bias; a model may add several terms (a mask, T5's
position bias, ALiBi).  torch's SDPA (``_safe_softmax``) gives a row whose scores are all
-inf probabilities 0 where softmax gives NaN; the fused op does the latter, so the rewrite
zeroes those rows after it, unless no row can be fully masked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax

from patternkit.ir import is_tensor_constant

from .layout import HEADS_FIRST
from .plan import BiasTerm


def summed_bias(terms: tuple[BiasTerm, ...], dtype: str) -> Any:
    """The 4-D terms added left to right (``None``: no bias)."""
    bias = None
    for term in terms:
        value = term.as_4d(dtype)
        bias = value if bias is None else relax.op.add(bias, value)
    return bias


def may_mask_a_whole_row(terms: tuple[BiasTerm, ...]) -> bool:
    """Can some row of the bias be -inf throughout (the rows the safe softmax zeroes)?

    Without a bias no score is -inf (q and k finite); a constant bias is looked at.
    """
    if not terms:
        return False
    if not all(is_tensor_constant(term.expr) for term in terms):
        return True
    values = np.zeros(())
    for term in terms:
        values = values + term.values()
    return bool(np.isneginf(values).all(axis=-1).any())


def zero_masked_rows(out: Any, bias: Any, dtype: str) -> Any:
    """``where(row has a score above -inf, out, 0)``: torch's SDPA on attention's BSNH result.

    The scores are ``q k^T * scale + bias`` with q and k finite, so a row's scores are
    all -inf exactly where the 4-D bias's row is; its (B|1, N|1, S|1, 1) test is
    permuted to BSNH, which broadcasts against ``out``.
    """
    minus_inf, zero = (relax.const(np.array(v, dtype)) for v in (-np.inf, 0.0))
    some_score = relax.op.astype(relax.op.not_equal(bias, minus_inf), "int8")
    live = relax.op.astype(relax.op.max(some_score, axis=[-1], keepdims=True), "bool")
    return relax.op.where(relax.op.permute_dims(live, list(HEADS_FIRST)), out, zero)
