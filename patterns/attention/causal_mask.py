"""``attention.causal_mask``: a bias that is provably a causal triangle becomes ``causal_mask``.

``attention.collapse`` keeps every mask as ``R.nn.attention``'s bias; a causal language
model's mask is then an ``(S, T)`` tensor of 0 and ``-inf`` that the fused op could build
itself, as ``causal_mask="TopLeft"`` (key ``j`` kept for query ``i`` when ``j <= i``) or
``"BottomRight"`` (``j <= i + T - S``, for fewer queries than keys), and that kernels
(flash attention) skip instead of reading.  This rule, after the collapse, takes the bias
term (alone, or one of the two terms of a sum: the rest stays the bias) when it is
provably that triangle, and a band of it of width ``w`` as ``window_size=w``.

The term is the collapse's 4-D view (``expand_dims`` of an ``(S, T)`` tensor, or a
``(1, 1, S, T)`` one) of one of the spellings the torch importer writes:

* a constant: its every element is read;
* ``where(c, fill, 0)``, a masked_fill's condition (collapsed) or torch's
  ``full((s, t), -inf).triu(1)`` (imported as ``where(col - row >= 1, full(-inf), 0)``),
  with ``c`` a constant, ``buffer == 0`` (a registered ``tril(ones)``, nanoGPT), an
  ``arange`` comparison (``arange(s)[:, None] >= arange(t)[None, :]``, its negation) or
  the comparison of the two ``arange``-s' difference with a constant.

The condition is computed here, in numpy, from the constants and the ``arange`` bounds:
every element of the mask is checked, so a triangle off by one or a band of another
width is refused with what it is.  Masked entries must be ``-inf`` or the dtype's most
negative finite value (Hugging Face's ``finfo.min``): added to a finite score, either
leaves an exponential of exactly 0, as the fused op's own masking does; a finite fill
such as ``-1e4`` does not for scores 1e4 apart, and is refused.

Refused with reasons: a mask of symbolic shape (its elements cannot be read; the bias
stays), one that differs over batch or heads, kept entries that are not 0, masked entries
that are not ``-inf``, a kept pattern that is no causal triangle or band (named by the
first row that differs), and a band with more queries than keys (TVM's reference and
its kernels align it differently: :mod:`.causal`).

TVM 0.27 cannot build a windowed attention for llvm (docs/tvm-bugs.md): a band's
collapse is checked numerically through ``attention.expand``, which writes it out.

**Opt-in, not in** :data:`patternkit.patterns.LIBRARY`.  TVM 0.27's llvm legalisation of
``causal_mask`` (``_te_attention``) sets the masked scores to 0, not ``-inf``, before it
takes the row's max: a row whose kept scores all lie below about -88 (float32: the
exponentials of the kept scores minus a max of 0 underflow) gives ``0 / 0 = NaN``, where
the model's bias gives the softmax.  Real rows rarely sit there (the first query keeps one
key), but the contract's wide-value draw finds them, so the rule changes results on llvm
and a user asks for it: ``pk.rewrite(LIBRARY | RuleSet([AttentionCausalMask()]), mod)``
for a backend whose kernel masks with ``-inf`` (flash attention, cutlass).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, alt, is_constant, is_op, wildcard
from patternkit.engine import RewriteRule, RoleMatch, Tolerance, reject
from patternkit.ir import const_value, dtype_of, int_list, static_shape, type_of

from .plan import tolerance_of

#: The comparisons the condition may use, by their Relax names.
COMPARISONS = {"greater_equal": np.greater_equal, "greater": np.greater,
               "less_equal": np.less_equal, "less": np.less, "equal": np.equal,
               "not_equal": np.not_equal}


class Refused(Exception):
    """Why the bias term is not a causal triangle (the rule's refusal reason)."""

    def __init__(self, reason: str, at: Any):
        super().__init__(reason)
        self.reason, self.at = reason, at


@dataclass(frozen=True)
class CausalPlan:
    """The attention's causal mask and window, and the bias that stays (``None``: none)."""

    causal_mask: str
    window_size: int | None
    rest: Any


def _any_op(names: Sequence[str], *args: DFPattern) -> DFPattern:
    """A call of any of the operators ``names`` on ``args``."""
    pattern: DFPattern = is_op(names[0])(*args)
    for name in names[1:]:
        pattern = pattern | is_op(name)(*args)
    return pattern


class AttentionCausalMask(RewriteRule):
    """Turn a bias that is provably a causal triangle (or band) into ``causal_mask``.

    See the module docstring for the spellings read and the proofs.
    """

    name = "attention.causal_mask"
    #: The mask is computed once and read by every layer: its bindings stay for them.
    escapable_roles = ("term", "term_4d", "condition", "compared", "row", "col", "row_range",
                       "col_range", "difference", "negated", "fill_full", "buffer_test")

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.q, self.k, self.v, self.rest = wildcard(), wildcard(), wildcard(), wildcard()
        # the condition's spellings
        self.row_range = is_op("arange")(varg_default_wildcard=True)
        self.col_range = is_op("arange")(varg_default_wildcard=True)
        self.row = is_op("expand_dims")(self.row_range)
        self.col = is_op("expand_dims")(self.col_range)
        self.offset = is_constant()
        self.difference = is_op("subtract")(self.col, self.row)
        self.compared = alt(tag="compare",
                            difference=_any_op(list(COMPARISONS), self.difference, self.offset),
                            ranges=_any_op(list(COMPARISONS), self.row, self.col))
        self.buffer, self.buffer_value = is_constant(), is_constant()
        self.buffer_test = is_op("equal")(self.buffer, self.buffer_value)
        self.cond_constant = is_constant()
        inner = alt(tag="condition_form", constant=self.cond_constant, buffer=self.buffer_test,
                    compared=self.compared)
        self.negated = _any_op(["logical_not", "bitwise_not"], inner)
        self.condition = alt(tag="negation", negated=self.negated, plain=inner)
        self.fill_value, self.zero = is_constant(), is_constant()
        self.fill_full = is_op("full")(wildcard(), self.fill_value)
        fill = alt(tag="fill", constant=self.fill_value, full=self.fill_full)
        self.additive = is_constant()
        self.term = alt(tag="term", additive=self.additive,
                        where=is_op("where")(self.condition, fill, self.zero),
                        keep=is_op("where")(self.condition, self.zero, fill))
        self.term_4d = is_op("expand_dims")(self.term)
        view = alt(tag="view", expanded=self.term_4d, as_is=self.term)
        self.bias = alt(tag="bias", alone=view, first=is_op("add")(view, self.rest),
                        second=is_op("add")(self.rest, view))
        self.call = is_op("nn.attention_bias")(self.q, self.k, self.v, self.bias)
        self.pattern: DFPattern = self.call

    # -- check -------------------------------------------------------------------------
    def check(self, match: RoleMatch) -> Any:
        """A :class:`CausalPlan` when the bias term is a causal triangle or band."""
        try:
            return self._plan(match)
        except Refused as refused:
            return reject(refused.reason, at=refused.at)

    def _plan(self, match: RoleMatch) -> CausalPlan:
        call = match.call
        if call.attrs.causal_mask is not None or call.attrs.window_size is not None:
            raise Refused(f"the attention already has causal_mask={call.attrs.causal_mask}, "
                          f"window_size={call.attrs.window_size}", call)
        q, k = static_shape(type_of(match.q)), static_shape(type_of(match.k))
        term = match.term_4d if match.tag("view") == "expanded" else match["term"]
        shape = static_shape(type_of(term))
        if shape is None or q is None or k is None or not all(
                isinstance(d, int) for d in (*shape, q[1], k[1])):
            raise Refused(f"the mask has the shape {shape}: not static, so its elements "
                          f"cannot be read to prove a causal triangle; it stays a bias", term)
        seq, kv_len = int(q[1]), int(k[1])
        dtype = dtype_of(type_of(term)) or "float32"
        values = np.broadcast_to(self._values(match, dtype), [int(d) for d in shape])
        if values.ndim != 4 or values.shape[-2:] != (seq, kv_len):
            raise Refused(f"the mask of shape {values.shape} is not ({seq}, {kv_len}) per "
                          f"head: not the scores' rows and columns", term)
        first = values.reshape(-1, seq, kv_len)[0]
        if not (values == first).all():
            raise Refused("the mask differs between batches or heads: no causal_mask, which "
                          "is one triangle for all", term)
        kept = first == 0
        masked = ~kept
        floor = np.finfo(np.float16 if dtype == "float16" else np.float32).min
        wrong = first[masked & ~(np.isneginf(first) | (first <= floor))]
        if wrong.size:
            raise Refused(f"the mask's masked entries include {float(wrong[0])}, not -inf "
                          f"(or {floor}): added to scores that far apart it would not zero "
                          f"their weights as causal_mask does", term)
        causal, window = _classify(kept, term)
        rest = match.rest if match.tag("bias") != "alone" else None
        return CausalPlan(causal, window, rest)

    def _values(self, match: RoleMatch, dtype: str) -> np.ndarray:
        """The term's elements (4-D once expanded), computed from its constants."""
        if match.tag("term") == "additive":
            values = const_value(match.additive).astype(np.float64)
        else:
            condition = self._condition(match)
            fill_at = match.fill_value
            fill, zero = (float(const_value(c).reshape(-1)[0]) if const_value(c).size == 1
                          else None for c in (fill_at, match.zero))
            if zero != 0.0 or fill is None:
                raise Refused(f"the mask is where(condition, {fill}, {zero}): not 0 where "
                              f"kept and one fill where masked", match.zero)
            values = (np.where(condition, 0.0, fill) if match.tag("term") == "keep"
                      else np.where(condition, fill, 0.0))
        if match.tag("view") == "expanded":
            for axis in sorted(int_list(match.term_4d.attrs.axis) or []):
                values = np.expand_dims(values, axis)
        return values

    def _condition(self, match: RoleMatch) -> np.ndarray:
        form = match.tag("condition_form")
        if form == "constant":
            cond = const_value(match.cond_constant).astype(bool)
        elif form == "buffer":
            cond = np.equal(const_value(match.buffer), const_value(match.buffer_value))
        else:
            compared = match.compared
            row, col = (np.expand_dims(_arange(match[r]), int_list(match[e].attrs.axis) or [])
                        for r, e in (("row_range", "row"), ("col_range", "col")))
            op = COMPARISONS[compared.op.name.split(".")[-1]]
            if match.tag("compare") == "difference":
                cond = op(col - row, const_value(match.offset))
            else:
                cond = op(row, col)
        return np.logical_not(cond) if match.tag("negation") == "negated" else cond

    # -- rewrite -----------------------------------------------------------------------
    def rewrite(self, match: RoleMatch) -> Any:
        """The attention with the causal mask (and window) and the bias that stays."""
        plan: CausalPlan = match.plan
        call = match.call
        q, k, v = match.q, match.k, match.v
        return relax.op.nn.attention(q, k, v, plan.rest, scale=call.attrs.scale,
                                     causal_mask=plan.causal_mask,
                                     window_size=plan.window_size)

    def tolerance(self, dtype: str | None) -> Tolerance:
        """:data:`~.plan.FLOAT32` or :data:`~.plan.FLOAT16`: the masked weights are 0 in
        both forms, the rest is the same arithmetic.
        """
        return tolerance_of(dtype)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """:func:`masked_attention` with ``knobs``."""
        return masked_attention(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Both dtypes, the mask spellings, self- and cross-attention, a padding mask too."""
        return {"dtype": ("float32", "float16"),
                "spelling": ("constant", "triu_fill", "arange", "buffer"),
                "shape": ("static", "cross"), "padding": (False, True)}


def _arange(call: Any) -> np.ndarray:
    """An ``arange`` call's values; refused when its bounds are symbolic."""
    bounds = []
    for arg in call.args[:3]:
        value = getattr(arg, "value", None)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise Refused(f"an arange of the mask runs to {arg}, not a number: its elements "
                          f"cannot be read to prove a causal triangle; it stays a bias", call)
        bounds.append(value)
    return np.arange(*bounds)


def _classify(kept: np.ndarray, at: Any) -> tuple[str, int | None]:
    """``(causal_mask, window_size)`` of the kept ``(S, T)`` entries; refused otherwise."""
    seq, kv_len = kept.shape
    ones = np.ones_like(kept, bool)
    candidates = [("TopLeft", 0)] + ([("BottomRight", kv_len - seq)] if kv_len > seq else [])
    for causal, diagonal in candidates:
        triangle = np.tril(ones, diagonal)
        if (kept == triangle).all():
            return causal, None
        if seq == kv_len and causal == "TopLeft":
            for window in range(1, kv_len):
                if (kept == (triangle & np.triu(ones, 1 - window))).all():
                    return causal, window
    row = int(np.argmax((kept != np.tril(ones, 0)).any(axis=1)))
    raise Refused(f"the mask keeps {np.flatnonzero(kept[row]).tolist()} of row {row}: not a "
                  f"causal triangle (TopLeft keeps {np.flatnonzero(np.tril(ones)[row]).tolist()}"
                  f") nor a band of one", at)


# -- examples (the rule's example(), the tests and `patternkit verify`) --------------------
def masked_attention(dtype: str = "float32", spelling: str = "constant", shape: str = "static",
                     padding: bool = False, diagonal: int = 0, window: int | None = None,
                     fill: float | None = None) -> tvm.IRModule:
    """``R.nn.attention(q, k, v, bias, scale=0.25)`` on BSNH ``(2, S, 2, 16)`` tensors, its
    bias a causal mask as the collapse leaves it (``expand_dims`` of the term).

    ``spelling``: ``"constant"`` (an additive (S, T) constant), ``"triu_fill"``
    (``where(col - row >= 1 - diagonal, full(fill), 0)``), ``"arange"``
    (``where(not(arange(d, S + d)[:, None] >= arange(T)[None, :]), fill, 0)``),
    ``"buffer"`` (``where(tril == 0, fill, 0)``, a (1, 1, S, T) buffer).  ``shape``:
    ``"static"`` (S = T = 8) or ``"cross"`` (S = 4, T = 8, the triangle bottom-right
    aligned).  ``diagonal`` shifts
    the triangle (a negative: off by one), ``window`` keeps a band, ``fill`` is the
    masked value (default -inf; for ``"triu_fill"`` the dtype's most negative value, as
    Hugging Face fills: TVM 0.27 cannot legalise ``R.full`` of -inf for llvm, so the
    model would not build to compare with); ``padding`` adds a (2, 1, 1, T) padding mask.
    """
    if fill is None:
        fill = (float(np.finfo(np.dtype(dtype)).min) if spelling == "triu_fill"
                else float("-inf"))
    seq, kv_len = (4, 8) if shape == "cross" else (8, 8)
    shift = diagonal + kv_len - seq
    q = relax.Var("q", relax.TensorType((2, seq, 2, 16), dtype))
    k = relax.Var("k", relax.TensorType((2, kv_len, 2, 16), dtype))
    v = relax.Var("v", relax.TensorType((2, kv_len, 2, 16), dtype))
    params = [q, k, v]
    pad = None
    if padding:
        pad = relax.Var("mask", relax.TensorType((2, 1, 1, kv_len), dtype))
        params.append(pad)
    kept = np.tril(np.ones((seq, kv_len), bool), shift)
    if window is not None:
        kept &= np.triu(np.ones((seq, kv_len), bool), shift + 1 - window)

    def const(value: Any, of: str = dtype) -> Any:
        return relax.const(np.array(value, of))

    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            def ranges(start: int = 0) -> tuple[Any, Any]:
                rows = bb.emit(relax.op.expand_dims(bb.emit(relax.op.arange(
                    start, start + seq, 1, "int64")), [1]))
                cols = bb.emit(relax.op.expand_dims(bb.emit(relax.op.arange(0, kv_len, 1,
                                                                            "int64")), [0]))
                return rows, cols

            if spelling == "constant":
                term = const(np.where(kept, 0.0, fill))
            elif spelling == "triu_fill":
                rows, cols = ranges()
                above = bb.emit(relax.op.greater_equal(
                    bb.emit(relax.op.subtract(cols, rows)), const(1 + shift, "int64")))
                full = bb.emit(relax.op.full((seq, kv_len), const(fill), dtype))
                term = bb.emit(relax.op.where(above, full, const(0.0)))
            elif spelling == "arange":
                rows, cols = ranges(shift)  # arange(s) shifted by the diagonal
                allowed = bb.emit(relax.op.greater_equal(rows, cols))
                term = bb.emit(relax.op.where(bb.emit(relax.op.logical_not(allowed)),
                                              const(fill), const(0.0)))
            else:  # a registered tril(ones) buffer, tested against 0
                buffer = const(kept.astype(dtype).reshape(1, 1, seq, kv_len))
                test = bb.emit(relax.op.equal(buffer, const(0.0)))
                term = bb.emit(relax.op.where(test, const(fill), const(0.0)))
            bias = term if spelling == "buffer" else bb.emit(relax.op.expand_dims(term, [0, 1]))
            if pad is not None:
                bias = bb.emit(relax.op.add(bias, pad))
            out = bb.emit_output(relax.op.nn.attention(q, k, v, bias, scale=0.25))
        bb.emit_func_output(out)
    return bb.get()
