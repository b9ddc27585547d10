"""Scaled dot-product attention written out, collapsed into ``R.nn.attention``.

Recognises (:class:`AttentionCollapse`, ``attention.collapse``)::

    scores = matmul(q, permute_dims(k))          # q: (B, N, S, H), k^T: (B, N, H, T)
    p      = softmax(scores * c [+ mask], axis=-1)
    out    = permute_dims(matmul(p, v))          # v: (B, N, T, Hv), back to (B, S, N, Hv)

(the final ``permute_dims`` optional: a result left head-first gets one back)

as the frontends write it out:

* **torch** (``from_exported_program`` on an eager ``GPT2Attention``, ``BertSelfAttention``,
  ``ViTSelfAttention``, ``LlamaAttention``): every batched matmul has its operands
  ``broadcast_to`` their own shape and ``reshape``-d to ``(B*N, ., .)``, and its result
  reshaped back to ``(B, N, ., .)``; the key is split into heads with ``permute_dims(axes=
  [0, 2, 1, 3])`` and then transposed with ``[0, 1, 3, 2]``;
* **ONNX** (``from_onnx``, opset 14 and 17): 4-D matmuls, the key transposed once with
  ``[0, 2, 3, 1]``, and a no-op ``astype`` of the softmax to its own dtype (two, where the
  model wrote ``softmax(x, dtype=float32).to(float32)``: CLIP, DeiT).

Between the scale and the mask, reshapes that only regroup the scores (both ends of the
chain a view of them: Falcon reshapes them to ``(B*N, S, T)`` and straight back) are
looked through.  Bloom's form (``baddbmm``) merges batch and heads first: the key is
reshaped to ``(B*N, T, H)`` and transposed in 3-D, and its ALiBi bias, ``(B*N, 1, T)``,
is added to the scaled ``(B*N, S, T)`` scores before they are split into heads and
masked; the bias is reshaped to ``(B, N, 1, T)`` and summed with the mask.  Falcon's
ALiBi is added to the 4-D scores *before* the scale: ``(scores + a) * c`` becomes the
bias ``a * c`` (any mask-shaped ``a``), summed with the mask; with a power-of-two ``c``
and a 0 / -inf mask the sums round as the model's do.  T5 adds two terms to the scores
(its relative position bias, then the mask); they are summed too.

The scale is a one-element constant multiplying (either operand order) or dividing the
scores, the query or the transposed key; several of them multiply (a model scaling both
q and k by ``H**-0.25``).  Without one the scale is 1 (``R.nn.attention``'s default would
be ``1/sqrt(H)``, so the rule always passes it).  The additive mask is any tensor that
broadcasts as attention's bias does: rank at most 4, ending with the key length ``T``,
every other axis 1 or the scores' own (the padding-and-causal masks transformers builds,
``(B, 1, S, T)``, GPT-2's and Llama's; BERT's ``(B, 1, 1, T)``).  Causal masks arrive in
one of two spellings, both kept as a bias: transformers 5 folds the causal triangle and
the padding mask into that additive float mask (``where(allowed, 0, finfo.min)``), and
torch's ``scores.masked_fill(~causal, -inf)`` imports as ``where(cond, -inf, scores)``,
which becomes the bias ``where(cond, -inf, 0)`` (equal everywhere, fully masked rows
included; a finite fill is refused: added, it would not give such a row the uniform
weights the fill gives it).

Produces ``R.nn.attention(q, k, v[, bias], scale=c)`` on BSNH tensors: ``q``, ``k`` and
``v`` are the head-split tensors the model permuted (``permute_dims`` composed with the
ones in the match, none where they cancel), the bias is the mask (``expand_dims``-ed to
4-D), and the model's final ``permute_dims`` of the result is the attention's own BSNH
layout.  Grouped-query attention (Llama's ``repeat_kv``: ``expand_dims``,
``broadcast_to``, ``reshape`` of the key and value heads) is collapsed with the repeat
kept, so k and v reach ``R.nn.attention`` with the full head count: TVM 0.27's llvm
legalisation gives wrong numbers for fewer key/value heads than query heads.  For the
same reason, multi-query attention, whose matmuls broadcast a single key/value head to
the query's heads (the ONNX form's 4-D matmuls; the torch importer's ``broadcast_to`` of
the 4-D key and value, as in Falcon), is collapsed with that broadcast made explicit:
``broadcast_to`` of the BSNH key and value.  Only a broadcast of the 4-D tensor itself
is taken; one after a reshape may pair a query head with another batch's keys.

The guards, each refusing with its reason: q, k and v have static ranks (4) and agree on
batch, heads, sequence and head sizes (a value split into other heads than the query is
refused, not re-paired); the key is transposed (the score matmul contracts the head axis
the key was split into, its last); every ``reshape`` and ``broadcast_to`` between a 4-D
tensor and its matmul only merges the batch and head axes (or keeps the shape); the scale
is a one-element constant; the softmax is over the last axis and any cast after it is to
its own dtype; the mask broadcasts as a bias; every tensor of the match has the query's
dtype.  A match whose intermediate (the scores, the probabilities) is read elsewhere is
not rewritten.

No speed claim: on llvm ``R.nn.attention`` legalises to about the same loops as the
written-out form, and the rule is for backends (cutlass, cudnn) that take the fused op.

torch's SDPA as ``torch.export`` decomposes it (``attn_implementation="sdpa"``) is
collapsed too.  Its ``_safe_softmax`` gives a row whose scores are all ``-inf`` (a fully
padded sequence) probabilities 0, ``where(not max(scores != -inf), 0, softmax)``, where
``R.nn.attention`` gives NaN.  With q and k finite a score is ``-inf`` exactly where the
bias is, so the rewrite zeroes the result's rows whose bias row is all ``-inf``:
``where(max(bias != -inf, axis=-1), attention(...), 0)`` (nothing when there is no bias,
or a constant bias masks no row whole).  The reduction must run over the key axis.

A float16 result is cast back to float16 (a no-op in Relax): TVM 0.27's llvm legalisation
of a float16 ``R.nn.attention`` returns float32, and the next op with a float16 operand
would not build (docs/tvm-bugs.md).

Deliberately not covered:

* a softmax computed in float32 between two casts of a float16 model (Llama's
  ``softmax(..., dtype=float32).to(float16)``): the fused op would compute it in float16,
  a precision the model did not ask for (matched, and refused with that reason in the log);
* causal masks turned into ``causal_mask="TopLeft"`` (the mask would have to be proved
  triangular; it stays a correct bias), dropout between the softmax and the second
  matmul (training graphs), packed QKV layouts (BS3NH) and variable-length batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from patternkit.dpl import DFPattern, is_constant, is_op, through, wildcard
from patternkit.engine import (CompositeRule, NoSuchExample, RewriteRule, RuleMatch, Tolerance,
                               reject, variant_method)
from patternkit.ir import (call_args, const_value, dims_equal, dtype_of, from_expr, int_list,
                           is_tensor_constant, prove_equal, static_shape, type_of)

#: The head split and the attention's layout: BNSH <-> BSNH (its own inverse).
HEADS_FIRST = (0, 2, 1, 3)
#: The identity permutation of a 4-D tensor.
IDENTITY = (0, 1, 2, 3)
#: ``k^T`` (BNHS) back to the attention's BSNH key: the inverse of ``(0, 2, 3, 1)``.
KEY_FROM_TRANSPOSED = (0, 3, 1, 2)
#: The plumbing the torch importer wraps around a batched matmul's operands.
OPERAND_PLUMBING = ("broadcast_to", "reshape")

#: float32: on llvm R.nn.attention legalises to the same matmuls, scale, softmax and
#: matmul in the same order; the examples agree to the bit (15 instances measured).
#: 1e-6 leaves room for another legalisation order, nothing more.
FLOAT32 = Tolerance(1e-6, 1e-6, "the fused op legalises to the same arithmetic in the same "
                                "order: bit-identical on the examples, 1e-6 for reordering")
#: float16: the two forms round the scores, the probabilities and the products to float16
#: (eps 9.8e-4) at different points; measured up to 1.2e-3 on outputs below 0.75.
FLOAT16 = Tolerance(4e-3, 4e-3, "both forms round scores, probabilities and products to "
                                "float16 (eps 9.8e-4) at different points: 1.2e-3 measured")


def _compose(inner: Sequence[int], outer: Sequence[int]) -> tuple[int, ...]:
    """Axes of ``permute_dims(permute_dims(x, inner), outer)`` as one ``permute_dims`` of x."""
    return tuple(inner[i] for i in outer)


def _axes(call: Any, rank: int) -> tuple[int, ...]:
    """The axes of a ``permute_dims`` call (``None`` there means reversing them)."""
    axes = int_list(call.attrs.axes)
    return tuple(reversed(range(rank))) if axes is None else tuple(axes)


def _shape_text(shape: Sequence[Any] | None) -> str:
    return "unknown" if shape is None else f"({', '.join(str(d) for d in shape)})"


@dataclass(frozen=True)
class AttentionPlan:
    """What the rewrite emits: the BSNH operands (source, permutation), bias, scale, output.

    Each of ``query``, ``key`` and ``value`` is ``(expr, axes)``: the tensor the match
    read and the ``permute_dims`` that makes it BSNH (``IDENTITY``: used as it is).
    ``bias_rank`` is the mask's rank (it is ``expand_dims``-ed to 4-D); ``fill`` is
    ``(value, where_true)`` when ``bias`` is a masked_fill condition, whose bias is
    ``where(bias, value, 0)`` (``where(bias, 0, value)`` for ``where_true=False``); ``out_axes`` the
    permutation of the attention's BSNH result that the match's root computes;
    ``zero_masked_rows``: the model's softmax gives a fully masked row probabilities 0
    (torch's SDPA), so the result is 0 on the rows whose bias is all -inf.
    ``extra_biases`` are more additive terms, summed with ``bias`` into one: each
    ``(expr, rank)`` (``expand_dims``-ed to 4-D; T5 adds its position bias, then the
    mask) or ``(expr, shape)`` (reshaped to the 4-D ``shape``: Bloom's ALiBi bias, added
    to the ``(B*N, S, T)`` scores).  ``repeat_key`` / ``repeat_value``: the BSNH shape the
    key / value is ``broadcast_to`` (the model broadcasts its single head or batch: the
    fused op must see the query's head count), ``None`` when it has it.  ``scaled_bias``
    is ``(expr, rank, factor)`` for a term added to the scores before the scores' scale
    ``factor`` (Falcon's ALiBi): ``(scores + a) * c + mask`` is attention's
    ``scores * c + (mask + a * c)``.
    """

    query: tuple[Any, tuple[int, ...]]
    key: tuple[Any, tuple[int, ...]]
    value: tuple[Any, tuple[int, ...]]
    bias: Any
    bias_rank: int
    fill: tuple[float, bool] | None
    scale: float
    out_axes: tuple[int, ...]
    zero_masked_rows: bool = False
    extra_biases: tuple[tuple[Any, Any], ...] = ()
    repeat_key: tuple | None = None
    repeat_value: tuple | None = None
    scaled_bias: tuple[Any, int, float] | None = None


class _Operand:
    """The patterns of one attention operand: ``source [-> permute_dims...] [* scale]``.

    ``permutes`` are the optional ``permute_dims`` roles, innermost first; ``transpose``
    (the key only) is a required one after them.  ``view`` is the 4-D operand as the
    matmul's arguments see it before the torch importer's plumbing.
    """

    def __init__(self, rule: AttentionCollapse, name: str, transposed: bool, scaled: bool):
        self.name = name
        # 4-D only: otherwise the plumbing look-through of a 4-D matmul would take the
        # reshape and broadcast_to of Llama's repeat_kv, and find a 5-D tensor inside.
        self.source = wildcard().has_type(relax.TensorType(ndim=4, dtype="void"))
        setattr(rule, name, self.source)
        self.transpose = None
        if not transposed:  # the query and value: their head split, if the match has it
            split = is_op("permute_dims")(self.source)
            setattr(rule, f"{name}_permute", split)
            core: DFPattern = split | self.source
        else:  # the key: one permute_dims always, a head split before it maybe
            self.inner = is_op("permute_dims")(self.source)
            setattr(rule, f"{name}_split", self.inner)
            self.transpose = is_op("permute_dims")(self.inner | self.source)
            setattr(rule, f"{name}_transpose", self.transpose)
            core = self.transpose
            # Bloom merges batch and heads first and transposes the 3-D key after
            self.merged = is_op("reshape")(self.inner | self.source,
                                           varg_default_wildcard=True)
            setattr(rule, f"{name}_merged", self.merged)
            self.merged_transpose = is_op("permute_dims")(self.merged)
            setattr(rule, f"{name}_merged_transpose", self.merged_transpose)
        self.scales: list[tuple[str, DFPattern, DFPattern]] = []
        view = core
        if scaled:
            view = _scaled(rule, f"{name}_scale", core, self.scales) | core
        self.view = view
        self.plumbed = through(view, OPERAND_PLUMBING)
        if name != "q":
            # A key or value with one head (or batch) broadcast to the query's: the
            # torch importer's broadcast_to of the 4-D view is the role ``<name>_repeat``
            # (Falcon's multi-query key), which the check needs to tell apart from a
            # broadcast after a reshape, which pairs other heads
            self.repeat = is_op("broadcast_to")(view, varg_default_wildcard=True)
            setattr(rule, f"{name}_repeat", self.repeat)
            self.plumbed = (is_op("reshape")(self.repeat, varg_default_wildcard=True)
                            | self.repeat | self.plumbed)


def _scaled(rule: AttentionCollapse, name: str, operand: DFPattern,
            record: list) -> DFPattern:
    """``operand * c``, ``c * operand`` or ``operand / c`` with ``c`` the role ``name``."""
    constant = wildcard()
    setattr(rule, name, constant)
    mul_right, mul_left = operand * constant, constant * operand
    div = operand / constant
    for kind, pattern in (("multiply", mul_right), ("multiply", mul_left), ("divide", div)):
        setattr(rule, f"{name}_{kind}_{len(record)}", pattern)
        record.append((kind, pattern, constant))
    return mul_right | mul_left | div


class AttentionCollapse(RewriteRule):
    """Collapse ``softmax(q @ k^T * scale [+ mask]) @ v`` into ``R.nn.attention``.

    The forms the torch and ONNX importers write, with the scale on the scores, the query
    or the key (multiply or divide, or none), an optional additive mask (the bias) and
    grouped-query key/value repeats kept; see the module docstring.
    """

    name = "attention.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self._query = _Operand(self, "q", transposed=False, scaled=True)
        self._key = _Operand(self, "k", transposed=True, scaled=True)
        self._value = _Operand(self, "v", transposed=False, scaled=False)
        self.qk = is_op("matmul")(self._query.plumbed,
                                  self._key.plumbed | self._key.merged_transpose)
        # a float16 matmul accumulated in float32 and cast back (TVM's ToMixedPrecision,
        # patternkit's torch import) is a matmul in float16
        self.qk_cast = is_op("astype")(self.qk)
        scores = through(self.qk_cast | self.qk, ("reshape",), depth=1)
        # Falcon adds its ALiBi bias to the scores before it scales them
        self.prescale_bias = wildcard()
        self.biased = (is_op("add")(scores, self.prescale_bias)
                       | is_op("add")(self.prescale_bias, scores))
        self._scales: list[tuple[str, DFPattern, DFPattern]] = []
        self.scaled = _scaled(self, "scale", self.biased | scores, self._scales) | scores
        # Bloom adds its ALiBi bias to the (B*N, S, T) scores, before they are split
        self.merged_bias = wildcard()
        self.pre_biased = (is_op("add")(self.scaled, self.merged_bias)
                           | is_op("add")(self.merged_bias, self.scaled))
        # Falcon reshapes the scaled scores to (B*N, S, T) and straight back before the
        # mask: a chain of reshapes between two views of the scores is the identity
        scaled = self.regrouped = through(self.pre_biased | self.scaled, ("reshape",), depth=2)
        self.mask, self.second_mask = wildcard(), wildcard()
        masked = is_op("add")(scaled, self.mask) | is_op("add")(self.mask, scaled)
        # T5: scores + position bias + mask, two additive terms
        masked = (is_op("add")(masked, self.second_mask)
                  | is_op("add")(self.second_mask, masked) | masked)
        # masked_fill: where(cond, fill, scores) (torch's masked_fill(cond, fill)) or
        # where(cond, scores, fill) (keep where cond holds)
        self.condition, self.fill = wildcard(), is_constant()
        self.fill_where_true = is_op("where")(self.condition, self.fill, scaled)
        self.fill_where_false = is_op("where")(self.condition, scaled, self.fill)
        self.scores = masked | self.fill_where_true | self.fill_where_false | scaled
        # Llama's eager softmax(scores, dtype=float32) in a float16 model: matched to be
        # refused by name (see the module docstring)
        self.widened = is_op("astype")(self.scores)
        self.softmax = is_op("nn.softmax")(self.scores | self.widened)
        self.cast = is_op("astype")(self.softmax)
        # ``softmax(x, dtype=float32).to(float32)`` in an ONNX export: two no-op casts
        self.recast = is_op("astype")(self.cast)
        # torch's SDPA as torch.export writes it (``_safe_softmax``): a row whose scores
        # are all -inf gets probabilities 0, where softmax gives NaN
        live = is_op("logical_not")(is_op("equal")(self.scores, float("-inf")))
        self.row_test = is_op("max")(is_op("astype")(live))
        row_masked = is_op("logical_not")(is_op("astype")(self.row_test))
        self.safe_softmax = is_op("where")(row_masked, is_op("full_like")(self.softmax, 0.0),
                                           self.softmax)
        probabilities = self.safe_softmax | self.recast | self.cast | self.softmax
        self.pv = is_op("matmul")(through(probabilities, OPERAND_PLUMBING),
                                  self._value.plumbed)
        self.pv_cast = is_op("astype")(self.pv)
        heads_out = through(self.pv_cast | self.pv, ("reshape",), depth=1)
        self.out = is_op("permute_dims")(heads_out)
        # The permute back to (B, S, N, Hv) first: the match rooted there wins, and an
        # attention whose result stays head-first (q, k, v given BNSH) matches without it.
        self.pattern: DFPattern = self.out | heads_out

    # -- check -------------------------------------------------------------------------
    def check(self, match: RuleMatch) -> Any:
        """An :class:`AttentionPlan` when the shapes, axes, scale and mask are attention's."""
        self._check_not_widened(match)
        q_axes, q_view = self._view(match, self._query)
        k_axes, k_view = self._view(match, self._key)
        v_axes, v_view = self._view(match, self._value)
        batch, heads, seq, head_dim = q_view
        kv_len, value_dim = k_view[3], v_view[3]
        scores = (batch, heads, seq, kv_len)
        self._check_transposed(match, k_axes)
        k_full, k_operand = self._kv_broadcast(match, "k", k_view, (batch, heads), match.qk)
        v_full, v_operand = self._kv_broadcast(match, "v", v_view, (batch, heads), match.pv)
        self._check_plumbing(match.qk, q_view, k_operand)
        bias, bias_rank, fill = None, 0, None
        extra: list[tuple[Any, Any]] = []
        if "merged_bias" in match:
            extra.append(self._check_merged_bias(match, scores))
        if "mask" in match:
            bias, bias_rank = self._check_mask(match.mask, "the mask", scores)
            if "second_mask" in match:
                extra.append(self._check_mask(match.second_mask, "the second additive term",
                                              scores))
        elif "condition" in match:
            bias, bias_rank = self._check_mask(match.condition, "the masked_fill condition",
                                               scores)
            fill = self._check_fill(match)
        scaled_bias = None
        if "prescale_bias" in match:
            term, rank = self._check_mask(match.prescale_bias,
                                          "the bias added to the scores before the scale",
                                          scores)
            scaled_bias = (term, rank, self._scale(match, self._scales, ""))
        self._check_regrouped(match, scores)
        self._check_softmax(match, scores)
        self._check_plumbing(match.pv, scores, v_operand)
        self._agree(match.k, "the key (transposed)", k_full, (batch, heads, head_dim, None))
        self._agree(match.v, "the value", v_full, (batch, heads, kv_len, None))
        self._check_dtypes(match)
        out_call = match.out if "out" in match else None
        result = match.root if out_call is None else call_args(out_call)[0]
        heads_out = static_shape(type_of(result))
        if not _is_view(heads_out, (batch, heads, seq, value_dim), merged=False):
            return reject(f"the attention's result has shape {_shape_text(heads_out)}, not "
                          f"{_shape_text((batch, heads, seq, value_dim))}: the batched "
                          f"matmul's result is not split back into the query's heads",
                          at=out_call)
        scale = 1.0
        for name, scales in (("q", self._query.scales), ("k", self._key.scales),
                             ("", self._scales)):
            scale *= self._scale(match, scales, name)
        return AttentionPlan((match.q, _compose(q_axes, HEADS_FIRST)),
                             (match.k, _compose(k_axes, KEY_FROM_TRANSPOSED)),
                             (match.v, _compose(v_axes, HEADS_FIRST)),
                             bias, bias_rank, fill, scale,
                             HEADS_FIRST if out_call is None else
                             _compose(HEADS_FIRST, _axes(out_call, 4)),
                             "safe_softmax" in match, tuple(extra),
                             None if k_full is k_view else (batch, kv_len, heads, head_dim),
                             None if v_full is v_view else (batch, kv_len, heads, value_dim),
                             scaled_bias)

    @staticmethod
    def _check_not_widened(match: RuleMatch) -> None:
        """Refuse, by name, a softmax the model runs in a wider dtype than its scores."""
        if "widened" not in match:
            return
        scores = dtype_of(type_of(call_args(match.widened)[0]))
        wide = str(match.widened.attrs.dtype)
        if wide != scores:
            raise reject(f"the softmax runs in {wide} between casts of the {scores} scores "
                         f"(softmax(..., dtype={wide})): R.nn.attention would compute it in "
                         f"{scores}, a precision the model did not ask for; deliberately not "
                         f"collapsed", at=match.widened)

    @staticmethod
    def _check_dtypes(match: RuleMatch) -> None:
        """Every tensor of the match has the query's dtype: the fused op has one dtype.

        Relax's binary ops already refuse mixed operands; what gets here is a matmul's
        ``out_dtype`` (float16 scores accumulated in float32) or a cast after the softmax.
        A matmul accumulated in float32 and cast straight back (``qk_cast``, ``pv_cast``)
        passes: its result, the cast's, has the operands' dtype; a cast to any other dtype
        reaches the softmax or the result and is refused here.
        """
        dtype = dtype_of(type_of(match.q))
        scores = dtype_of(type_of(call_args(match.softmax)[0]))
        casts = [match[role] for role in ("cast", "recast") if role in match]
        found_dtypes = (("values", dtype_of(type_of(match.v)), match.v),
                        ("scores", scores, match.softmax),
                        *(("probabilities", str(cast.attrs.dtype), cast) for cast in casts),
                        ("results", dtype_of(type_of(match.root)), match.root))
        for what, found, at in found_dtypes:
            if found != dtype:
                raise reject(f"the {what} are {found}, the query {dtype}: R.nn.attention "
                             f"computes in one dtype", at=at)

    @staticmethod
    def _view(match: RuleMatch, operand: _Operand) -> tuple[tuple[int, ...], tuple]:
        """The permutation from the operand's source to its 4-D view, and the view's shape."""
        source = match[operand.name]
        shape = static_shape(type_of(source))
        what = {"q": "the query", "k": "the key", "v": "the value"}[operand.name]
        if shape is None:
            raise reject(f"{what} has no known shape: cannot tell its batch, heads, "
                         f"sequence and head sizes apart", at=source)
        axes = IDENTITY
        permutes = [f"{operand.name}_split", f"{operand.name}_transpose"] if operand.transpose \
            else [f"{operand.name}_permute"]
        for role in permutes:
            if role in match:
                axes = _compose(axes, _axes(match[role], 4))
        if operand.transpose and f"{operand.name}_merged_transpose" in match:
            axes = _compose(axes, _merged_transpose(match, operand.name,
                                                    tuple(shape[a] for a in axes)))
        return axes, tuple(shape[a] for a in axes)

    @staticmethod
    def _check_transposed(match: RuleMatch, k_axes: tuple[int, ...]) -> None:
        """The score matmul contracts the key's last axis, the head axis it was split into."""
        if k_axes[2] != 3:
            at = match.k_transpose if "k_transpose" in match else match.k_merged_transpose
            raise reject(f"k is not transposed: the score matmul contracts axis {k_axes[2]} "
                         f"of the key, not its head axis (3); permute_dims axes "
                         f"{list(k_axes)} from the key", at=at)

    @staticmethod
    def _agree(source: Any, what: str, shape: tuple, expected: tuple) -> None:
        names = ("batch", "heads", "sequence", "head size")
        for axis, (got, want) in enumerate(zip(shape, expected)):
            if want is not None and not prove_equal(got, want):
                raise reject(f"{what} has {names[axis]} {got} on axis {axis} where the query "
                             f"has {want}: {_shape_text(shape)} is not split into the "
                             f"query's heads", at=source)
        return None

    @staticmethod
    def _kv_broadcast(match: RuleMatch, name: str, view: tuple, lead: tuple,
                      matmul: Any) -> tuple[tuple, tuple]:
        """``(full, operand)``: the key's or value's 4-D view with a batch or heads axis of
        1 broadcast to the query's ``lead`` (B, N), where the model broadcasts it, and the
        view the matmul's right operand must be (:meth:`_check_plumbing`).  Both are
        ``view`` itself (the same object) where it agrees, or where an axis is neither 1
        nor the query's (:meth:`_agree` refuses it).

        Proven: the 4-D matmul takes the view as it is (its batch axes broadcast, as the
        ONNX form's do; the operand is ``view``), or the view is ``broadcast_to`` the full
        shape (the role ``<name>_repeat``: Falcon's multi-query key and value through the
        torch importer; the operand is ``full``, maybe merged).  A broadcast found
        anywhere else in the plumbing (after a reshape) may pair a query head with
        another batch's key: it is refused.
        """
        agree = [prove_equal(got, want) for got, want in zip(view[:2], lead)]
        ones = [dims_equal(got, 1) for got in view[:2]]
        if all(agree) or not all(a or one for a, one in zip(agree, ones)):
            return view, view
        full = (*(want if one else got for got, want, one in zip(view[:2], lead, ones)),
                *view[2:])
        if _is_view(static_shape(type_of(call_args(matmul)[1])), view, merged=False):
            return full, view  # a 4-D matmul broadcasting its batch axes
        repeat = f"{name}_repeat"
        if repeat in match and _is_view(static_shape(type_of(match[repeat])), full,
                                        merged=False):
            return full, full
        what = {"k": "the key", "v": "the value"}[name]
        raise reject(f"{what} {_shape_text(view)} is broadcast to the query's "
                     f"{_shape_text(lead)} after a reshape, not as the 4-D tensor: cannot "
                     f"tell that its heads pair with the query's", at=matmul)

    @staticmethod
    def _check_plumbing(matmul: Any, lhs: tuple, rhs: tuple) -> None:
        """The matmul's operands and result are the 4-D views, or with batch * heads merged.

        Any chain of ``reshape`` and ``broadcast_to`` that ends in one of these shapes
        keeps the elements in order (a broadcast cannot shrink, so it is the identity when
        the element count is kept): the batched matmul pairs the views' heads.
        """
        lhs_expr, rhs_expr = call_args(matmul)[:2]
        for what, expr, view in (("left operand", lhs_expr, lhs),
                                 ("right operand", rhs_expr, rhs)):
            shape = static_shape(type_of(expr))
            if not _is_view(shape, view):
                raise reject(f"the matmul's {what} has shape {_shape_text(shape)}, neither "
                             f"{_shape_text(view)} nor batch and heads merged", at=matmul)

    @staticmethod
    def _check_merged_bias(match: RuleMatch, scores: tuple) -> tuple[Any, Any]:
        """The bias added before the scores are split into heads, and how it becomes a
        4-D one: ``(bias, rank)`` when the scores are 4-D there already, ``(bias, shape)``
        when they are ``(B*N, S, T)`` (the bias is then reshaped to ``shape``)."""
        bias, where = match.merged_bias, match.pre_biased
        at = static_shape(type_of(where))
        if at is not None and len(at) == 4:
            return AttentionCollapse._check_mask(bias, "the bias added to the scores", scores)
        batch, heads, seq, kv_len = scores
        shape = static_shape(type_of(bias))
        what = ("the bias added to the merged scores" if at is None
                else f"the bias added to the merged scores {_shape_text(at)}")
        if shape is None:  # a 4-D bias would have made the scores 4-D
            raise reject(f"{what} has no known shape: cannot tell whether it broadcasts as "
                         f"attention's bias", at=bias)
        padded = (1,) * (3 - len(shape)) + tuple(shape)
        rows_ok = dims_equal(padded[1], 1) or prove_equal(padded[1], seq)
        merged_ok = dims_equal(padded[0], 1) or prove_equal(padded[0], batch * heads)
        if not (prove_equal(padded[2], kv_len) and rows_ok and merged_ok):
            raise reject(f"{what} has shape {_shape_text(shape)}, which does not broadcast "
                         f"as attention's bias on ({_shape_text((batch * heads, seq, kv_len))})",
                         at=bias)
        rows = 1 if dims_equal(padded[1], 1) else seq
        return bias, ((1, 1, rows, kv_len) if dims_equal(padded[0], 1)
                      else (batch, heads, rows, kv_len))

    @staticmethod
    def _check_regrouped(match: RuleMatch, scores: tuple) -> None:
        """Reshapes after the scale only regroup the scores: both ends of the chain are
        views of them (4-D, or batch and heads merged), so the elements keep their order
        and their meaning."""
        regrouped = match.regrouped
        scaled = match.pre_biased if "pre_biased" in match else match.scaled
        if regrouped.same_as(scaled):
            return
        for what, expr, merged in (("from", scaled, True), ("to", regrouped, False)):
            shape = static_shape(type_of(expr))
            if not _is_view(shape, scores, merged=merged):
                raise reject(f"the scaled scores are reshaped {what} "
                             f"{_shape_text(shape)}, not a view of the scores "
                             f"{_shape_text(scores)}: the reshape regroups their elements",
                             at=regrouped)

    @staticmethod
    def _check_softmax(match: RuleMatch, scores: tuple) -> None:
        softmax = match.softmax
        axis = int(softmax.attrs.axis)
        if axis not in (-1, 3):
            raise reject(f"the softmax normalises axis {axis}, attention the key axis (-1)",
                         at=softmax)
        shape = static_shape(type_of(call_args(softmax)[0]))
        if not _is_view(shape, scores, merged=False):
            raise reject(f"the softmax's input has shape {_shape_text(shape)}, the scores "
                         f"{_shape_text(scores)}: the batched matmul's result is not split "
                         f"back into the query's heads", at=softmax)
        if "safe_softmax" in match:
            test = match.row_test
            axes, keepdims = int_list(test.attrs.axis), bool(test.attrs.keepdims)
            if axes not in ([-1], [3]) or not keepdims:
                raise reject(f"the safe softmax zeroes the probabilities where max(axis="
                             f"{axes}, keepdims={keepdims}) finds no score "
                             f"above -inf, not on the fully masked rows (axis -1, kept): "
                             f"not what attention's rows are", at=test)

    @staticmethod
    def _scale(match: RuleMatch, scales: list, name: str) -> float:
        """The factor of the scale roles that matched (1.0 when none did)."""
        for kind, pattern, constant in scales:
            if pattern in match:
                value = match[constant]
                where = {"q": "the query's", "k": "the key's", "": "the scores'"}[name]
                if not is_tensor_constant(value) or const_value(value).size != 1:
                    shape = static_shape(type_of(value))
                    raise reject(f"{where} scale is not a scalar constant (a "
                                 f"{'constant' if is_tensor_constant(value) else 'tensor'} "
                                 f"of shape {_shape_text(shape)}): R.nn.attention takes one "
                                 f"number", at=value)
                factor = float(const_value(value).reshape(()))
                if kind == "divide":
                    return float(np.float64(1.0) / factor) if factor else float("inf")
                return factor
        return 1.0

    @staticmethod
    def _check_mask(mask: Any, what: str, scores: tuple) -> tuple[Any, int]:
        """The mask and its rank, when it broadcasts as ``R.nn.attention``'s bias."""
        shape = static_shape(type_of(mask))
        if shape is None or len(shape) > 4:
            raise reject(f"{what} has shape {_shape_text(shape)}: attention's bias has at "
                         f"most 4 axes", at=mask)
        padded = (1,) * (4 - len(shape)) + tuple(shape)
        if not prove_equal(padded[3], scores[3]):
            raise reject(f"{what} {_shape_text(shape)} does not broadcast as attention's "
                         f"bias: its last axis is {padded[3]}, the key length {scores[3]}",
                         at=mask)
        for axis in range(3):
            if not (dims_equal(padded[axis], 1) or prove_equal(padded[axis], scores[axis])):
                raise reject(f"{what} {_shape_text(shape)} does not broadcast as attention's "
                             f"bias {_shape_text(scores)} (axis {axis}: {padded[axis]})",
                             at=mask)
        return mask, len(shape)

    @staticmethod
    def _check_fill(match: RuleMatch) -> tuple[float, bool]:
        """The masked_fill's value, -inf, and whether it fills where the condition holds.

        ``scores + where(c, -inf, 0)`` equals ``where(c, -inf, scores)`` everywhere; with
        a finite fill it does not on a fully masked row (the fill gives it uniform
        weights, the added bias keeps the scores' own softmax).
        """
        fill = match.fill
        values = const_value(fill)
        value = float(values.reshape(())) if values.size == 1 else None
        if value != float("-inf"):
            raise reject(f"the masked scores are filled with "
                         f"{'a tensor' if value is None else value}, not -inf: as a bias it "
                         f"would change fully masked rows", at=fill)
        return value, "fill_where_true" in match

    # -- rewrite -----------------------------------------------------------------------
    def rewrite(self, match: RuleMatch) -> Any:
        plan: AttentionPlan = match.plan

        def bsnh(operand: tuple[Any, tuple[int, ...]]) -> Any:
            expr, axes = operand
            return expr if axes == IDENTITY else relax.op.permute_dims(expr, list(axes))

        dtype = dtype_of(type_of(plan.query[0]))
        bias = plan.bias
        if plan.fill is not None:
            value, where_true = plan.fill
            fill, zero = (relax.const(np.array(v, dtype)) for v in (value, 0.0))
            bias = relax.op.where(bias, fill, zero) if where_true else \
                relax.op.where(bias, zero, fill)
        bias = _to_4d(bias, plan.bias_rank)
        for term, layout in plan.extra_biases:
            term = (relax.op.reshape(term, layout) if isinstance(layout, tuple)
                    else _to_4d(term, layout))
            bias = term if bias is None else relax.op.add(bias, term)
        if plan.scaled_bias is not None:
            term, rank, factor = plan.scaled_bias
            term = relax.op.multiply(_to_4d(term, rank), relax.const(np.array(factor, dtype)))
            bias = term if bias is None else relax.op.add(bias, term)
        key, value = bsnh(plan.key), bsnh(plan.value)
        # kept as a repeat: TVM 0.27's llvm attention is wrong for fewer key/value heads
        if plan.repeat_key is not None:
            key = relax.op.broadcast_to(key, plan.repeat_key)
        if plan.repeat_value is not None:
            value = relax.op.broadcast_to(value, plan.repeat_value)
        out = relax.op.nn.attention(bsnh(plan.query), key, value, bias, scale=plan.scale)
        if dtype != "float32":
            # TVM 0.27's llvm legalisation of a float16 attention returns float32 (it
            # scales the scores by a float32 constant), and the next binary op with a
            # float16 operand then fails to build; the cast, a no-op in Relax, keeps the
            # model's dtype there (docs/tvm-bugs.md)
            out = relax.op.astype(out, dtype)
        if plan.zero_masked_rows and _may_mask_a_whole_row(plan):
            out = _zero_masked_rows(out, bias, dtype)
        if plan.out_axes != IDENTITY:
            out = relax.op.permute_dims(out, list(plan.out_axes))
        # The check proved the shapes equal; a model may spell them differently
        # (``batch * 2 // 2`` against ``batch``), and a rewrite keeps the binding's type.
        root_shape = static_shape(type_of(match.root))
        if not all(_spelled_alike(a, b) for a, b in zip(_result_shape(plan), root_shape)):
            out = relax.op.reshape(out, root_shape)
        return out

    def tolerance(self, dtype: str | None) -> Tolerance:
        return FLOAT16 if dtype == "float16" else FLOAT32

    # -- self-check example (used by tests and `patternkit verify`) ---------------------
    @staticmethod
    def example(dtype: str = "float32", frontend: str = "torch", shape: str = "static",
                scale: str = "product", mask: str = "padding", kv_heads: int = 2,
                softmax_axis: int = -1, key: str = "transposed", value_heads: int = 2,
                repeat: str = "repeat_kv", split: str = "heads_first",
                accumulate: str | None = None,
                safe_softmax: str | None = None, regroup: str | None = None,
                recast: bool = False, position_bias: bool = False,
                softmax_dtype: str | None = None, alibi: str | None = None,
                seed: int = 0) -> tvm.IRModule:
        """One attention block on projections ``xq: (B, S, 32)``, ``xk, xv: (B, T, .)``:
        2 query heads of 16.

        ``frontend``: ``"torch"`` (the importer's ``broadcast_to`` + ``reshape`` around
        3-D batched matmuls, the key split with ``[0, 2, 1, 3]`` then transposed with
        ``[0, 1, 3, 2]``) or ``"onnx"`` (4-D matmuls, the key transposed once with
        ``[0, 2, 3, 1]``, a no-op ``astype`` after the softmax).  ``shape``: ``"static"``
        (B, S, T = 2, 8, 8), ``"symbolic"`` (batch and sequence symbolic, T = S) or
        ``"cross"`` (S = 4 queries on T = 8 keys).  ``scale``: ``"product"``,
        ``"divide"`` (scores / sqrt(16)), ``"query"``, ``"key"``, ``"none"``, or
        ``"tensor"`` (a per-head tensor, which is not attention's scale).  ``mask``:
        ``"none"``, ``"padding"`` (B, 1, 1, T), ``"causal"`` (a constant (S, T)
        lower-triangular 0 / -1e4 mask), ``"full"`` (B, 2, S, T), ``"masked_fill"``
        (``where(not causal, -inf, scores)``, torch's ``masked_fill``), ``"masked_keep"``
        (``where(causal, scores, -inf)``), or, refused, ``"last_axis_one"`` (B, 1, S, 1)
        and ``"masked_fill_finite"`` (a -1e4 fill).  ``kv_heads=1``: the key and value have one
        head, repeated to two as Llama's ``repeat_kv`` writes it, or, with
        ``repeat="broadcast"``, broadcast to the query's heads by the batched matmuls (the
        ONNX form's 4-D matmuls broadcast it; the torch importer ``broadcast_to``-s the 4-D
        key and value, as in Falcon's multi-query attention); ``repeat="misplaced"``
        (refused) moves the key's single head onto the batch axis with a reshape first and
        broadcasts that, which pairs a query head with another batch's keys.
        ``softmax_axis=2``,
        ``key="untransposed"`` (``q @ k`` with H = T = 16) and ``value_heads=4`` (the
        value split into 4 heads of 8, reshaped back into 2 by the batched matmul) make
        modules the check must refuse, and so do ``split=
        "scores"`` / ``"output"`` (the torch form reshapes that batched matmul's result
        to (B, S, N, .) instead of (B, N, S, .)), ``mask="square"`` with
        ``shape="decode"`` (a (B, 1, T, T) mask broadcasting one query row up to T),
        ``mask="rank5"`` and ``accumulate="float32"`` (the score matmul's ``out_dtype``).
        ``accumulate="cast_back"`` accumulates both batched matmuls in float32 and casts
        each result straight back to the model's dtype, as TVM's ``ToMixedPrecision`` and
        patternkit's float16 torch import write a float16 matmul.
        ``safe_softmax="keys"`` writes the softmax as torch's SDPA exports it (a row whose
        scores are all -inf gets probabilities 0); ``mask="boolean"`` is SDPA's mask, a
        boolean ``(B, 1, 1, T)`` input turned into ``where(allowed, 0, -inf)``; and
        ``safe_softmax="queries"`` (the test reduced over the query axis) is refused.
        ``regroup="round_trip"`` reshapes the scaled scores to (B*N, S, T) and back, as
        Falcon does; ``regroup="scrambled"`` (refused) reshapes them to (B, S, N, T),
        which keeps the element count but not what each element means.  ``recast=True``
        casts the probabilities to their own dtype once more (CLIP's ONNX export).
        ``position_bias=True`` adds a constant (1, N, S, T) term before the mask, as T5
        adds its relative position bias.  ``softmax_dtype="float32"`` on a float16 model
        computes the softmax in float32 between two casts (Llama's eager attention):
        refused, by name.  ``key="merged"`` is Bloom's form: the key merged to
        (B*N, T, H) and transposed in 3-D, the scores scaled in 3-D; ``alibi="heads"``
        adds a (B*N, 1, T) bias to those scores before their split, as Bloom adds ALiBi,
        and ``alibi="per_query"`` a (B*N, S, 1) one (refused: not a bias over the keys), and
        ``alibi="unknown"`` one of unknown shape (refused).  ``alibi="before_scale"`` is
        Falcon's: a (B, N, 1, T) bias added to the 4-D scores before the scale (``product``
        or ``divide``); ``alibi="before_scale_per_query"`` adds a (B, N, S, 1) one there
        (refused).  ``key="folded"`` (refused) folds the heads into the sequence,
        (B, N*S, H) against (B, N*T, H): every query against every head's keys, which is
        not multi-head attention.
        """
        rng = np.random.default_rng(seed)
        cast_back = accumulate == "cast_back"
        batch, seq, kv_len = _example_dims(shape, key)
        heads, head_dim = 2, 16
        if mask in ("causal", *_MASKED_FILLS) and shape == "symbolic":
            raise NoSuchExample("a constant causal mask needs a static sequence length")
        if (value_heads != heads or split != "heads_first") and frontend != "torch":
            raise NoSuchExample("value_heads and split reshape the torch form's 3-D matmuls")
        if repeat != "repeat_kv" and (kv_heads == heads or value_heads != heads
                                      or key != "transposed"):
            raise NoSuchExample("repeat: the matmuls broadcast a single key/value head "
                                "(kv_heads=1), split and transposed as the query is")
        if repeat == "misplaced" and (frontend != "onnx" or shape != "static"):
            raise NoSuchExample("repeat='misplaced' swaps the static batch (2) and the "
                                "single head in the ONNX form's 4-D key")
        if key == "folded" and (mask != "none" or kv_heads != heads or shape != "static"):
            raise NoSuchExample("key='folded' folds the heads into the sequence: no mask, "
                                "one static multi-head shape")
        if key in ("merged", "folded") and (frontend != "torch" or scale in ("key", "tensor")
                                or accumulate is not None or split != "heads_first"):
            raise NoSuchExample("key='merged' is Bloom's torch form: 3-D scores in the "
                                "model's dtype, scaled as a whole or on the query")
        falcon_alibi = alibi in _PRESCALE_ALIBIS
        if falcon_alibi and (key != "transposed" or scale not in ("product", "divide")
                             or accumulate is not None):
            raise NoSuchExample("alibi='before_scale' is Falcon's: added to the 4-D scores "
                                "in the model's dtype, which are then scaled")
        if alibi is not None and not falcon_alibi and (
                key != "merged" or (alibi == "unknown" and shape == "symbolic")):
            raise NoSuchExample("alibi is added to Bloom's 3-D scores (key='merged')")
        if key == "untransposed" and (shape != "static" or kv_heads != heads
                                      or value_heads != heads):
            raise NoSuchExample("key='untransposed' needs H = T = 16: one static shape, "
                                "every operand split into the query's heads")
        if (value_heads != heads or split != "heads_first") and (
                shape != "static" or kv_heads != heads or mask not in ("none", "padding")):
            raise NoSuchExample("value_heads and split mis-split one matmul of the static "
                                "multi-head form: no other departure")
        if safe_softmax is not None and (frontend != "torch" or accumulate is not None):
            raise NoSuchExample("safe_softmax is torch's SDPA, exported in the model's dtype")
        xq = relax.Var("xq", relax.TensorType((batch, seq, heads * head_dim), dtype))
        xk = relax.Var("xk", relax.TensorType((batch, kv_len, kv_heads * head_dim), dtype))
        xv = relax.Var("xv", relax.TensorType((batch, kv_len, kv_heads * head_dim), dtype))
        params = [xq, xk, xv]
        bias = None
        if mask in ("padding", "full", "last_axis_one", "square", "rank5"):
            bias_shape = {"padding": (batch, 1, 1, kv_len), "full": (batch, heads, seq, kv_len),
                          "last_axis_one": (batch, 1, seq, 1), "square": (batch, 1, kv_len, kv_len),
                          "rank5": (1, batch, 1, 1, kv_len)}[mask]
            bias = relax.Var("mask", relax.TensorType(bias_shape, dtype))
            params.append(bias)
        elif mask == "causal":
            bias = relax.const(np.where(np.tril(np.ones((seq, kv_len), bool)), 0.0, -1e4)
                               .astype(dtype))
        elif mask in _MASKED_FILLS:
            bias = relax.const(np.tril(np.ones((seq, kv_len), bool)))  # True: keep
        elif mask == "boolean":
            allowed = relax.Var("allowed", relax.TensorType((batch, 1, 1, kv_len), "bool"))
            params.append(allowed)
        if alibi is not None:  # Bloom computes it from the mask: an input here
            alibi_bias = relax.Var("alibi", relax.TensorType(ndim=3, dtype=dtype)
                                   if alibi == "unknown" else relax.TensorType(
                {"heads": (batch, heads, 1, kv_len), "per_query": (batch, heads, seq, 1),
                 "before_scale": (batch, heads, 1, kv_len),
                 "before_scale_per_query": (batch, heads, seq, 1)}[alibi], dtype))
            params.append(alibi_bias)
        torch_form = frontend == "torch"
        with _well_typed_or_no_example():
            bb = relax.BlockBuilder()
            with bb.function("main", params):
                with bb.dataflow():
                    def emit(op, *args):
                        return bb.emit(op(*args))

                    def heads_first(x):
                        return emit(relax.op.permute_dims, x, list(HEADS_FIRST))

                    def matmul(a, b, rows, misplit=False, out_dtype=None):
                        def product(lhs, rhs):
                            out = bb.emit(relax.op.matmul(lhs, rhs, out_dtype=out_dtype))
                            return bb.emit(relax.op.astype(out, dtype)) if cast_back else out

                        if not torch_form:
                            return product(a, b)
                        inner = a.ty.shape[3]
                        b_shape = b.ty.shape  # the importer broadcasts one kv head (Falcon)
                        if repeat == "broadcast":
                            b_shape = (b_shape[0], heads, b_shape[2], b_shape[3])
                        cols = b_shape[3] * b_shape[1] // heads
                        a3 = emit(relax.op.reshape, emit(relax.op.broadcast_to, a, a.ty.shape),
                                  (batch * heads, rows, inner))
                        b3 = emit(relax.op.reshape, emit(relax.op.broadcast_to, b, b_shape),
                                  (batch * heads, inner, cols))
                        out = product(a3, b3)
                        split_as = ((batch, rows, heads, cols) if misplit
                                    else (batch, heads, rows, cols))
                        return emit(relax.op.reshape, out, split_as)

                    factor = relax.const(np.array(head_dim ** -0.5, dtype))
                    q = heads_first(emit(relax.op.reshape, xq, (batch, seq, heads, head_dim)))
                    if scale == "query":
                        q = emit(relax.op.multiply, q, factor)
                    k = emit(relax.op.reshape, xk, (batch, kv_len, kv_heads, head_dim))
                    v_heads = kv_heads if value_heads == heads else value_heads
                    v = emit(relax.op.reshape, xv, (batch, kv_len, v_heads,
                                                    kv_heads * head_dim // v_heads))
                    if repeat != "repeat_kv":  # the matmuls broadcast the one kv head
                        k, v = heads_first(k), heads_first(v)
                    elif kv_heads != heads:  # Llama: repeat_kv on the head-first tensors
                        k = _repeat_kv(bb, heads_first(k), heads // kv_heads)
                        v = _repeat_kv(bb, heads_first(v), heads // kv_heads)
                    elif torch_form:  # the importer splits the key's heads, then transposes
                        k = heads_first(k)
                    heads_first_key = kv_heads != heads or torch_form
                    if key == "untransposed":
                        k_t = k if heads_first_key else heads_first(k)
                    elif key == "merged":  # Bloom: transposed after the merge, below
                        k_t = k
                    else:
                        k_t = emit(relax.op.permute_dims, k,
                                   [0, 1, 3, 2] if heads_first_key else [0, 2, 3, 1])
                    if repeat == "misplaced":  # (B, 1, H, T) -> (1, B, H, T), broadcast
                        k_t = emit(relax.op.broadcast_to, emit(
                            relax.op.reshape, k_t, (1, batch, head_dim, kv_len)),
                            (batch, heads, head_dim, kv_len))
                    if scale == "key":
                        k_t = emit(relax.op.multiply, factor, k_t)
                    if kv_heads == heads:
                        v = heads_first(v)
                    wide_scores = accumulate == "float32"  # the scores stay float32
                    scores_dtype = "float32" if wide_scores else dtype
                    if key in ("merged", "folded"):  # Bloom's baddbmm: 3-D scores, scaled
                        # folded: (B, N*S, H), every query against every head's keys
                        lead, q_rows, k_rows = ((batch * heads, seq, kv_len) if key == "merged"
                                                else (batch, heads * seq, heads * kv_len))
                        merged_q = emit(relax.op.reshape, q, (lead, q_rows, head_dim))
                        merged_k = emit(relax.op.permute_dims, emit(
                            relax.op.reshape, k, (lead, k_rows, head_dim)), [0, 2, 1])
                        scores = bb.emit(relax.op.matmul(merged_q, merged_k))
                    else:
                        scores = matmul(q, k_t, seq, split == "scores",
                                        "float32" if accumulate else None)
                    if falcon_alibi:  # Falcon: added to the 4-D scores, then scaled
                        scores = emit(relax.op.add, scores, alibi_bias)
                    if scale == "product":
                        scores = emit(relax.op.multiply, scores,
                                      relax.const(np.array(head_dim ** -0.5, scores_dtype)))
                    elif scale == "divide":
                        scores = emit(relax.op.divide, scores,
                                      relax.const(np.array(head_dim ** 0.5, scores_dtype)))
                    elif scale == "tensor":
                        per_head = rng.uniform(0.2, 0.3, (1, heads, 1, 1)).astype(scores_dtype)
                        scores = emit(relax.op.multiply, scores, relax.const(per_head))
                    if alibi == "unknown":
                        scores = emit(relax.op.add, alibi_bias, scores)
                    elif alibi is not None and not falcon_alibi:  # merged as Bloom merges it
                        rows = 1 if alibi == "heads" else seq
                        cols = kv_len if alibi == "heads" else 1
                        merged_bias = emit(relax.op.reshape, alibi_bias,
                                           (batch * heads, rows, cols))
                        scores = emit(relax.op.add, merged_bias, scores)
                    if key == "merged":
                        scores = emit(relax.op.reshape, scores, (batch, heads, seq, kv_len))
                    if regroup == "round_trip":  # Falcon: to (B*N, S, T) and back
                        merged = emit(relax.op.reshape, scores, (batch * heads, seq, kv_len))
                        scores = emit(relax.op.reshape, merged, (batch, heads, seq, kv_len))
                    elif regroup == "scrambled":
                        scores = emit(relax.op.reshape, scores, (batch, seq, heads, kv_len))
                    if position_bias:  # T5's relative position bias, before the mask
                        relative = rng.uniform(-1, 1, (1, heads, seq, kv_len))
                        scores = emit(relax.op.add, scores,
                                      relax.const(relative.astype(scores_dtype)))
                    if mask == "boolean":  # torch's SDPA: where(allowed, 0, -inf)
                        bias = bb.emit(relax.op.where(allowed, relax.const(np.array(0.0, dtype)),
                                                      relax.const(np.array(-np.inf, dtype))))
                    if mask in _MASKED_FILLS:
                        keep = mask == "masked_keep"
                        fill = relax.const(np.array(-1e4 if mask == "masked_fill_finite"
                                                    else -np.inf, scores_dtype))
                        condition = bias if keep else bb.emit(relax.op.logical_not(bias))
                        scores = bb.emit(relax.op.where(condition, scores, fill) if keep
                                         else relax.op.where(condition, fill, scores))
                    elif bias is not None:
                        if wide_scores:
                            bias = bb.emit(relax.op.astype(bias, scores_dtype))
                        scores = emit(relax.op.add, scores, bias)
                    if softmax_dtype is not None:
                        scores = bb.emit(relax.op.astype(scores, softmax_dtype))
                    p = bb.emit(relax.op.nn.softmax(scores, axis=softmax_axis))
                    if softmax_dtype is not None:
                        p = bb.emit(relax.op.astype(p, scores_dtype))
                    if safe_softmax is not None:
                        p = _safe_softmax(bb, scores, p, -1 if safe_softmax == "keys" else 2)
                    if not torch_form and not wide_scores:
                        p = bb.emit(relax.op.astype(p, dtype))  # the ONNX importer's no-op cast
                    if wide_scores:
                        p = bb.emit(relax.op.astype(p, dtype))
                    if recast:
                        p = bb.emit(relax.op.astype(p, dtype))
                    rows = kv_len if mask == "square" else seq  # the square mask broadcasts rows
                    if key == "folded":
                        folded_v = emit(relax.op.reshape, v, (batch, heads * kv_len, head_dim))
                        out = heads_first(emit(relax.op.reshape, bb.emit(relax.op.matmul(
                            p, folded_v)), (batch, heads, seq, head_dim)))
                    else:
                        out = heads_first(matmul(p, v, rows, split == "output",
                                                 "float32" if cast_back else None))
                    result = bb.emit_output(relax.op.reshape(out, (batch, rows, heads * head_dim)))
                bb.emit_func_output(result)
            return bb.get()

    @classmethod
    def example_space(cls) -> dict[str, Sequence[Any]]:
        return {"dtype": ("float32", "float16"), "frontend": ("torch", "onnx"),
                "shape": ("static", "symbolic", "cross", "decode"),
                "scale": ("product", "divide", "query", "key", "none", "tensor"),
                "mask": ("padding", "none", "causal", "full", "last_axis_one", "square",
                         "rank5", "boolean", *_MASKED_FILLS),
                "kv_heads": (2, 1), "softmax_axis": (-1, 2),
                "key": ("transposed", "untransposed", "merged", "folded"),
                "value_heads": (2, 4),
                "repeat": ("repeat_kv", "broadcast", "misplaced"),
                "split": ("heads_first", "scores", "output"),
                "accumulate": (None, "float32", "cast_back"), "safe_softmax": (None, "keys", "queries"),
                "regroup": (None, "round_trip", "scrambled"), "recast": (False, True),
                "position_bias": (False, True), "softmax_dtype": (None, "float32"),
                "alibi": (None, "heads", "per_query", "unknown", *_PRESCALE_ALIBIS)}


def _to_4d(bias: Any, rank: int) -> Any:
    """``bias`` ``expand_dims``-ed to attention's 4-D bias (``None`` stays ``None``)."""
    if bias is None or rank >= 4:
        return bias
    return relax.op.expand_dims(bias, list(range(4 - rank)))


def _may_mask_a_whole_row(plan: AttentionPlan) -> bool:
    """Can some row of the bias be -inf throughout (the rows the safe softmax zeroes)?

    Without a bias no score is -inf (q and k finite); a constant bias is looked at.
    """
    terms = [plan.bias] * (plan.bias is not None) + [t for t, _ in plan.extra_biases]
    if plan.scaled_bias is not None:
        terms.append(plan.scaled_bias[0])
    if not terms:
        return False
    if not all(is_tensor_constant(term) for term in terms):
        return True
    values = np.zeros(())
    if plan.bias is not None:
        values = const_value(plan.bias)
        if plan.fill is not None:
            value, where_true = plan.fill
            values = np.where(values if where_true else np.logical_not(values), value, 0.0)
    for term, layout in plan.extra_biases:
        extra = const_value(term)
        values = values + (extra.reshape([int(d) for d in layout])
                           if isinstance(layout, tuple) else extra)
    if plan.scaled_bias is not None:
        term, _, factor = plan.scaled_bias
        values = values + const_value(term) * factor
    return bool(np.isneginf(values).all(axis=-1).any())


def _zero_masked_rows(out: Any, bias: Any, dtype: str) -> Any:
    """``where(row has a score above -inf, out, 0)``: torch's SDPA on attention's BSNH result.

    The scores are ``q k^T * scale + bias`` with q and k finite, so a row's scores are
    all -inf exactly where the 4-D bias's row is; its (B|1, N|1, S|1, 1) test is
    permuted to BSNH, which broadcasts against ``out``.
    """
    minus_inf, zero = (relax.const(np.array(v, dtype)) for v in (-np.inf, 0.0))
    some_score = relax.op.astype(relax.op.not_equal(bias, minus_inf), "int8")
    live = relax.op.astype(relax.op.max(some_score, axis=[-1], keepdims=True), "bool")
    return relax.op.where(relax.op.permute_dims(live, list(HEADS_FIRST)), out, zero)


def _merged_transpose(match: RuleMatch, name: str, view: tuple) -> tuple[int, ...]:
    """The 4-D permutation that the key's ``permute_dims(reshape(k), [0, 2, 1])`` is:
    ``(0, 1, 3, 2)`` when the reshape merges batch and heads of the 4-D ``view`` (Bloom);
    refused otherwise."""
    merged, transpose = match[f"{name}_merged"], match[f"{name}_merged_transpose"]
    shape = static_shape(type_of(merged))
    axes = _axes(transpose, 3) if shape is not None and len(shape) == 3 else None
    if axes != (0, 2, 1) or not _is_view(shape, view):
        raise reject(f"the key is reshaped to {_shape_text(shape)} and permuted with axes "
                     f"{None if axes is None else list(axes)}, not merged from "
                     f"{_shape_text(view)} into batch * heads and transposed ([0, 2, 1])",
                     at=merged)
    return (0, 1, 3, 2)


def _permuted_shape(operand: tuple[Any, tuple[int, ...]]) -> tuple:
    expr, axes = operand
    shape = static_shape(type_of(expr))
    return tuple(shape[a] for a in axes)


def _result_shape(plan: AttentionPlan) -> tuple:
    """The shape Relax infers for the rewrite: attention's (B, S, N, Hv), then permuted."""
    query, value = _permuted_shape(plan.query), _permuted_shape(plan.value)
    bsnh = (*query[:3], value[3])
    return tuple(bsnh[a] for a in plan.out_axes)


def _spelled_alike(a: Any, b: Any) -> bool:
    """The same dimension written the same way (``batch`` and ``batch * 2 // 2`` are not)."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return bool(tvm_ffi.structural_equal(a, b))


def _is_view(shape: Sequence[Any] | None, view: tuple, merged: bool = True) -> bool:
    """``shape`` is ``view`` or (``merged``) ``view`` with its first two axes merged."""
    if shape is None:
        return False
    if len(shape) == 4:
        return all(prove_equal(a, b) for a, b in zip(shape, view))
    return (merged and len(shape) == 3 and prove_equal(shape[0], view[0] * view[1])
            and prove_equal(shape[1], view[2]) and prove_equal(shape[2], view[3]))


#: Falcon's ALiBi, added to the 4-D scores before the scale: over the keys, and (refused)
#: a (B, N, S, 1) term, which does not broadcast as attention's bias.
_PRESCALE_ALIBIS = ("before_scale", "before_scale_per_query")

#: Masks written as torch's ``masked_fill``: ``where(not causal, -inf, scores)``,
#: ``where(causal, scores, -inf)``, and a finite fill (refused).
_MASKED_FILLS = ("masked_fill", "masked_keep", "masked_fill_finite")


@contextmanager
def _well_typed_or_no_example() -> Iterator[None]:
    """Knobs that make no well-typed module (Relax's type inference refuses a binding) are
    no example: ``example_space()`` is a product, and some refusal knobs only make sense
    alone (a rank-5 mask on the ONNX form, a mis-split matmul on a cross-attention)."""
    try:
        yield
    except (ValueError, TypeError) as error:
        raise NoSuchExample(f"these knobs make no well-typed module: {error}") from error


def _safe_softmax(bb: relax.BlockBuilder, scores: relax.Expr, p: relax.Expr,
                  axis: int) -> relax.Expr:
    """torch's ``_safe_softmax`` as ``torch.export`` writes it: 0 where ``axis`` has no
    score above -inf, ``p`` elsewhere."""
    dtype = dtype_of(type_of(scores))
    live = bb.emit(relax.op.logical_not(relax.op.equal(scores, relax.const(np.array(-np.inf,
                                                                                    dtype)))))
    some = bb.emit(relax.op.max(bb.emit(relax.op.astype(live, "int8")), axis=[axis],
                                keepdims=True))
    none = bb.emit(relax.op.logical_not(bb.emit(relax.op.astype(some, "bool"))))
    zeros = bb.emit(relax.op.full_like(p, relax.const(np.array(0.0, dtype))))
    return bb.emit(relax.op.where(none, zeros, p))


def _repeat_kv(bb: relax.BlockBuilder, x: relax.Expr, times: int) -> relax.Expr:
    """Llama's ``repeat_kv``: (B, KV, T, H) -> (B, KV * times, T, H), as torch exports it."""
    b, kv, t, h = x.ty.shape
    wide = bb.emit(relax.op.broadcast_to(bb.emit(relax.op.expand_dims(x, [2])),
                                         (b, kv, times, t, h)))
    return bb.emit(relax.op.reshape(wide, (b, kv * times, t, h)))


def _example_dims(shape: str, key: str) -> tuple[Any, Any, Any]:
    if key == "untransposed":  # q @ k type-checks only with as many keys as head sizes
        return 2, 16, 16
    if shape == "symbolic":
        seq = tvm.tirx.Var("seq", "int64")
        return tvm.tirx.Var("batch", "int64"), seq, seq
    return {"static": (2, 8, 8), "cross": (2, 4, 8), "decode": (2, 1, 8)}[shape]


# -- the expand rule ------------------------------------------------------------------------
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
        self.attention = is_op("nn.attention")(self.q, self.k, self.v)
        self.attention_bias = is_op("nn.attention_bias")(self.q, self.k, self.v, self.bias)
        self.pattern: DFPattern = self.attention_bias | self.attention

    def _call(self, match: RuleMatch) -> Any:
        return match.attention_bias if "attention_bias" in match else match.attention

    def check(self, match: RuleMatch) -> Any:
        """The scale to write out, when the call has no causal mask and no window."""
        call = self._call(match)
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
                          f"the query has shape {_shape_text(shape)}", at=call)
        return ExpandPlan(float(head) ** -0.5)

    def rewrite(self, match: RuleMatch) -> Any:
        dtype = dtype_of(type_of(match.q))
        q = relax.op.permute_dims(match.q, list(HEADS_FIRST))
        k_t = relax.op.permute_dims(match.k, [0, 2, 3, 1])
        v = relax.op.permute_dims(match.v, list(HEADS_FIRST))
        scores = relax.op.multiply(relax.op.matmul(q, k_t),
                                   relax.const(np.array(match.plan.scale, dtype)))
        if "attention_bias" in match:
            scores = relax.op.add(scores, match.bias)
        p = relax.op.nn.softmax(scores, axis=-1)
        return relax.op.permute_dims(relax.op.matmul(p, v), list(HEADS_FIRST))

    def tolerance(self, dtype: str | None) -> Tolerance:
        return FLOAT16 if dtype == "float16" else FLOAT32

    @staticmethod
    def example(dtype: str = "float32", shape: str = "static", bias: bool = True,
                scale: float | None = 0.25, causal_mask: str | None = None) -> tvm.IRModule:
        """``R.nn.attention(q, k, v[, bias], scale)`` on BSNH ``(B, S, 2, 16)`` tensors.

        ``shape``: ``"static"`` (B = 2, S = T = 8), ``"symbolic"`` (batch and sequence) or
        ``"cross"`` (S = 4, T = 8); ``bias``: a ``(B, 1, 1, T)`` mask; ``scale=None``:
        the op's default; ``causal_mask`` (``"TopLeft"``) and a symbolic head size
        (``shape="symbolic_head"``) are refused.
        """
        heads = 2
        head = tvm.tirx.Var("head", "int64") if shape == "symbolic_head" else 16
        batch, seq, kv_len = _example_dims("static" if shape == "symbolic_head" else shape,
                                           "transposed")
        q = relax.Var("q", relax.TensorType((batch, seq, heads, head), dtype))
        k = relax.Var("k", relax.TensorType((batch, kv_len, heads, head), dtype))
        v = relax.Var("v", relax.TensorType((batch, kv_len, heads, head), dtype))
        mask = relax.Var("mask", relax.TensorType((batch, 1, 1, kv_len), dtype)) if bias else None
        return from_expr(relax.op.nn.attention(q, k, v, mask, scale=scale,
                                               causal_mask=causal_mask))

    @classmethod
    def example_space(cls) -> dict[str, Sequence[Any]]:
        return {"dtype": ("float32", "float16"),
                "shape": ("static", "symbolic", "cross", "symbolic_head"),
                "bias": (True, False), "scale": (0.25, None, 0.1),
                "causal_mask": (None, "TopLeft")}


# -- the composites -------------------------------------------------------------------------
class AttentionComposite(CompositeRule):
    """``R.nn.attention`` (``bias=True``: its bias form) as a pattern-table entry.

    Named as TVM's cutlass table names them: ``<compiler>.attention`` and
    ``<compiler>.attention_bias``.  A call with a causal mask or a sliding window is
    left out (``attention_var_len`` and sliding-window kernels are other entries).
    """

    def __init__(self, compiler: str = "byoc", bias: bool = False):
        super().__init__(compiler)
        self.with_bias = bool(bias)
        self.q, self.k, self.v = wildcard(), wildcard(), wildcard()
        if self.with_bias:
            self.bias = wildcard()
            self.attention = is_op("nn.attention_bias")(self.q, self.k, self.v, self.bias)
        else:
            self.attention = is_op("nn.attention")(self.q, self.k, self.v)
        self.pattern: DFPattern = self.attention
        self.pattern_name = "attention_bias" if self.with_bias else "attention"

    def check(self, match: RuleMatch) -> Any:
        """Accept a call without a causal mask or sliding window."""
        attrs = match.attention.attrs
        if attrs.causal_mask is not None or attrs.window_size is not None:
            return reject(f"the attention has causal_mask={attrs.causal_mask}, window_size="
                          f"{attrs.window_size}: the {self.pattern_name} entry takes neither",
                          at=match.attention)
        return True

    @variant_method
    def example(self, dtype: str = "float32", shape: str = "static",
                causal_mask: str | None = None) -> tvm.IRModule:
        """``R.nn.attention`` in this variant's form (see :meth:`AttentionExpand.example`)."""
        return AttentionExpand.example(dtype=dtype, shape=shape, bias=self.with_bias,
                                       causal_mask=causal_mask)

    @variant_method
    def example_space(self) -> dict[str, Sequence[Any]]:
        return {"dtype": ("float32", "float16"), "shape": ("static", "symbolic", "cross"),
                "causal_mask": (None, "TopLeft")}


#: The rewrite rules of this file.
RULES = (AttentionCollapse,)

#: Expand rules, for :data:`patternkit.patterns.EXPANSIONS` (never with the collapse).
EXPANSIONS = (AttentionExpand,)

#: Pattern-table entries of this file: the bias form first (the two ops differ, so the
#: order only fixes how the table lists them).
COMPOSITES = (AttentionComposite("byoc", bias=True), AttentionComposite("byoc"))
