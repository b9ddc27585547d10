"""What ``attention.collapse``'s check hands its rewrite: a typed, frozen plan.

The check reads the match once and says, in these terms, what to emit: each of the query,
key and value is an :class:`Operand` (the tensor the match read and the permutation that
makes it BSNH), the bias is a sum of :class:`BiasTerm` (a mask, a masked_fill condition,
T5's position bias, Bloom's and Falcon's ALiBi), and the scale is one number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm import relax

from patternkit.engine import Tolerance
from patternkit.ir import const_value, dtype_of, static_shape, type_of

from .layout import IDENTITY, permuted

#: float32: on llvm R.nn.attention legalises to the same matmuls, scale, softmax and
#: matmul in the same order; the examples agree to the bit (15 instances measured).
#: 1e-6 leaves room for another legalisation order, nothing more.
FLOAT32 = Tolerance(1e-6, 1e-6, "the fused op legalises to the same arithmetic in the same "
                                "order: bit-identical on the examples, 1e-6 for reordering")
#: float16: the two forms round the scores, the probabilities and the products to float16
#: (eps 9.8e-4) at different points; measured up to 1.2e-3 on outputs below 0.75.
FLOAT16 = Tolerance(4e-3, 4e-3, "both forms round scores, probabilities and products to "
                                "float16 (eps 9.8e-4) at different points: 1.2e-3 measured")


#: bfloat16 (eps 7.8e-3): both forms round the scores and the products to bfloat16; the
#: written-out form also rounds the scaled scores and the probabilities, the fused op on
#: llvm does not (its float32 scale widens them): measured up to 4.4e-3 on outputs below
#: 1 (4 forms, 3 seeds), the fused op the nearer to a float32 reference (2.8e-3 against
#: 5.2e-3).
BFLOAT16 = Tolerance(1.6e-2, 1.6e-2, "both forms round scores and products to bfloat16 "
                                     "(eps 7.8e-3) at different points: 4.4e-3 measured")


def tolerance_of(dtype: str | None) -> Tolerance:
    """How close the fused op stays to the written-out form, for ``dtype`` results (a
    softmax the model ran in float32 between casts included).
    """
    return {"float16": FLOAT16, "bfloat16": BFLOAT16}.get(dtype or "", FLOAT32)


@dataclass(frozen=True)
class Operand:
    """A query, key or value: the tensor ``expr`` the match read, ``permute_dims(expr,
    axes)`` BSNH (``IDENTITY``: used as it is), and, for a key or value whose single head
    (or batch) the model broadcasts, ``repeat``: the BSNH shape it is ``broadcast_to``
    (kept as a repeat: TVM 0.27's llvm attention is wrong for fewer key/value heads).
    """

    expr: Any
    axes: tuple[int, ...]
    repeat: tuple | None = None

    def bsnh(self) -> Any:
        """The operand as ``R.nn.attention`` takes it."""
        out = self.expr if self.axes == IDENTITY else relax.op.permute_dims(self.expr,
                                                                            list(self.axes))
        return out if self.repeat is None else relax.op.broadcast_to(out, self.repeat)

    def shape(self) -> tuple:
        """The BSNH shape before the repeat (the tensor's static shape, permuted)."""
        shape = static_shape(type_of(self.expr))
        assert shape is not None  # the check refused an operand of unknown shape
        return permuted(shape, self.axes)


@dataclass(frozen=True)
class MaskFill:
    """A masked_fill's condition as a bias: ``where(c, value, 0)`` (``where_true``) or
    ``where(c, 0, value)``.
    """

    value: float
    where_true: bool


@dataclass(frozen=True)
class BiasTerm:
    """One additive term of attention's bias, ``expr`` made 4-D and times ``factor``.

    ``rank``: ``expr`` is ``expand_dims``-ed from this rank to 4-D; ``shape``: it is
    reshaped to this 4-D shape instead (Bloom's bias, added to the ``(B*N, S, T)``
    scores); ``factor`` (``None``: none): the scale of the scores it was added before
    (Falcon's ALiBi: ``(scores + a) * c`` is ``scores * c + a * c``); ``fill``: ``expr``
    is a masked_fill condition.
    """

    expr: Any
    rank: int = 4
    shape: tuple | None = None
    factor: float | None = None
    fill: MaskFill | None = None

    def as_4d(self, dtype: str) -> Any:
        """The term as Relax computes it: ``(B|1, N|1, S|1, T)`` in ``dtype``."""
        term = self.expr
        if self.fill is not None:
            fill, zero = (relax.const(np.array(v, dtype)) for v in (self.fill.value, 0.0))
            term = relax.op.where(term, fill, zero) if self.fill.where_true else \
                relax.op.where(term, zero, fill)
        if self.shape is not None:
            term = relax.op.reshape(term, self.shape)
        elif self.rank < 4:
            term = relax.op.expand_dims(term, list(range(4 - self.rank)))
        if self.factor is not None:
            term = relax.op.multiply(term, relax.const(np.array(self.factor, dtype)))
        if dtype_of(type_of(self.expr)) not in (dtype, "bool"):
            # a float32 term of scores computed in float32 (the check's narrowed scores),
            # rounded as the model rounds their sum
            term = relax.op.astype(term, dtype)
        return term

    def values(self) -> np.ndarray:
        """A constant term's values, broadcasting as the 4-D term does."""
        values = const_value(self.expr)
        if self.fill is not None:
            held = values if self.fill.where_true else np.logical_not(values)
            values = np.where(held, self.fill.value, 0.0)
        if self.shape is not None:
            values = values.reshape([int(d) for d in self.shape])
        return values if self.factor is None else values * self.factor


@dataclass(frozen=True)
class AttentionPlan:
    """``attention(query, key, value, sum(biases), scale)``, then ``permute_dims(out_axes)``.

    ``out_axes`` is the permutation of attention's BSNH result the match's root computes;
    ``zero_masked_rows``: the model's softmax gives a fully masked row probabilities 0
    (torch's SDPA), so the result is 0 on the rows whose bias is all -inf.
    """

    query: Operand
    key: Operand
    value: Operand
    biases: tuple[BiasTerm, ...]
    scale: float
    out_axes: tuple[int, ...]
    zero_masked_rows: bool = False
    #: The dtype the model's softmax ran in between casts of narrower scores (``None``:
    #: the scores' own), named in the log when the collapse happens.
    softmax_dtype: str | None = None
    #: The dtype the scores were computed in before the model rounded them to the
    #: query's for the softmax (``None``: the query's own), named in the log.
    scores_dtype: str | None = None

    def result_shape(self) -> tuple:
        """The shape Relax infers for the rewrite: attention's (B, S, N, Hv), permuted."""
        query, value = self.query.shape(), self.value.shape()
        return permuted((*query[:3], value[3]), self.out_axes)
