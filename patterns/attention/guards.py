"""The guards of ``attention.collapse``: each reads the match and returns what it proved,
or raises the refusal (``reject(reason, at=expr)``).

They prove that the matched tensors are attention's: each operand a 4-D view split into
the query's batch and heads (:func:`operand_view`, :func:`kv_broadcast`), the scale one
number (:func:`scale_factor`), each additive term a bias that broadcasts over the scores
(:func:`bias_term`, :func:`merged_bias_term`), the softmax over the keys, one dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from patternkit.engine import RoleMatch, reject
from patternkit.ir import (
    HALF_WIDENINGS,
    call_args,
    const_value,
    dims_equal,
    dtype_of,
    int_list,
    prove_equal,
    static_shape,
    type_of,
)

from .forms import AttentionForms, OperandForms
from .layout import IDENTITY, axes_of, compose, is_view, permuted, shape_text
from .plan import BiasTerm, MaskFill
from .scale import ScaleSite, scale_value, what_matched

#: What each operand is called in a refusal, by its name in the pattern.
WHAT = {"q": "the query", "k": "the key", "v": "the value"}
#: Whose scale a scale refusal is about, by the tag of its site.
SCALE_OWNER = {"q_scale": "the query's", "k_scale": "the key's",
               "scores_scale": "the scores'"}
AXIS_NAMES = ("batch", "heads", "sequence", "head size")


# The dtypes whose scores a model may widen for its softmax, and the dtype the collapse
# accepts it in, are patternkit.ir.HALF_WIDENINGS: R.nn.attention's kernels keep the
# softmax in float32 for float16 and bfloat16 scores (TVM 0.27's llvm legalisation
# multiplies the scores by its float32 scale first, and flash-attention kernels accumulate
# the softmax in float32), the precision the model asked for.


def widened_softmax(match: RoleMatch, forms: AttentionForms) -> str | None:
    """The dtype the model's softmax runs in between casts of narrower scores (``None``:
    the softmax runs in the scores' dtype); refused, by name, outside
    :data:`patternkit.ir.HALF_WIDENINGS`.
    """
    if match.tag("softmax_input") != "widened":
        return None
    widened = match[forms.widened]
    scores = dtype_of(type_of(call_args(widened)[0]))
    wide = str(widened.attrs.dtype)
    if wide == scores:
        return None
    if HALF_WIDENINGS.get(scores or "") != wide:
        raise reject(f"the softmax runs in {wide} between casts of the {scores} scores "
                     f"(softmax(..., dtype={wide})): R.nn.attention keeps the softmax in "
                     f"float32 only for float16 and bfloat16 scores, so {wide} is a "
                     f"precision it would not compute", at=widened)
    return wide


def widened_operands(match: RoleMatch, forms: AttentionForms) -> None:
    """Each cast of the score matmul's operands keeps their values: a no-op, or float16 /
    bfloat16 widened to float32 (torch.export's float16 ``baddbmm``).
    """
    for tag, cast, what in (("q_cast", forms.q_cast, "query"),
                            ("k_cast", forms.k_cast, "key"),
                            ("k_cast", forms.merged_cast, "key")):
        if match.tag(tag) != "widened" or cast not in match:
            continue
        call = match[cast]
        source, target = dtype_of(type_of(call_args(call)[0])), str(call.attrs.dtype)
        if source != target and HALF_WIDENINGS.get(source or "") != target:
            raise reject(f"the {what} is cast from {source} to {target} before the score "
                         f"matmul: only float16 or bfloat16 widened to float32 keeps its "
                         f"values", at=call)


def narrowed_scores(match: RoleMatch, forms: AttentionForms) -> str | None:
    """The dtype the scores were computed in (float32) when they are cast to the query's
    float16 or bfloat16 before the softmax (torch.export's float16 ``baddbmm``: the
    operands widened, scaled and biased in float32, rounded once); ``None`` otherwise.
    """
    if match.tag("softmax_input") != "widened":
        return None
    cast = match[forms.widened]
    scores = dtype_of(type_of(call_args(cast)[0]))
    query = dtype_of(type_of(match[forms.q.source]))
    if str(cast.attrs.dtype) == query and HALF_WIDENINGS.get(query or "") == scores:
        return scores
    return None


def one_dtype(match: RoleMatch, forms: AttentionForms, narrowed: bool = False) -> None:
    """Every tensor of the match has the query's dtype: the fused op has one dtype.

    Relax's binary ops already refuse mixed operands; what gets here is a matmul's
    ``out_dtype`` (float16 scores accumulated in float32) or a cast after the softmax.
    A matmul accumulated in float32 and cast straight back passes: its result, the
    cast's, has the operands' dtype; a cast to any other dtype reaches the softmax or
    the result and is refused here.  The scores are read before a widened softmax's
    cast (:func:`widened_softmax`); the probabilities must be cast back.
    """
    q, v, softmax = match[forms.q.source], match[forms.v.source], match[forms.softmax]
    dtype = dtype_of(type_of(q))
    # a widened softmax (accepted by widened_softmax) reads the scores through its cast
    scores_at = match[forms.widened] if match.tag("softmax_input") == "widened" else softmax
    # scores computed in float32 and narrowed (narrowed_scores): the cast's own dtype
    scores = dtype_of(type_of(scores_at if narrowed else call_args(scores_at)[0]))
    _same_dtype("values", dtype_of(type_of(v)), v, dtype)
    _same_dtype("scores", scores, softmax, dtype)
    probabilities = match.tag("probabilities")
    if probabilities in ("recast", "cast"):
        for c in (forms.cast, forms.recast) if probabilities == "recast" else (forms.cast,):
            cast = match[c]
            _same_dtype("probabilities", str(cast.attrs.dtype), cast, dtype)
    root = match.root
    _same_dtype("results", dtype_of(type_of(root)), root, dtype)


def _same_dtype(what: str, found: str | None, at: Any, dtype: str | None) -> None:
    """:func:`one_dtype`'s refusal of ``what``, found in ``found`` where the query is ``dtype``."""
    if found != dtype:
        raise reject(f"the {what} are {found}, the query {dtype}: R.nn.attention "
                     f"computes in one dtype", at=at)


def operand_view(match: RoleMatch, operand: OperandForms) -> tuple[tuple[int, ...], tuple]:
    """The permutation from the operand's source to its 4-D view, and the view's shape."""
    source = match[operand.source]
    shape = static_shape(type_of(source))
    if shape is None:
        raise reject(f"{WHAT[operand.name]} has no known shape: cannot tell its batch, "
                     f"heads, sequence and head sizes apart", at=source)
    axes: tuple[int, ...] = IDENTITY
    if match.tag(f"{operand.name}_layout") == "split":
        axes = compose(axes, axes_of(match[operand.split], 4))
    if operand.transpose is None:
        return axes, permuted(shape, axes)
    transpose = match.tag("k_transpose")
    if transpose == "unmerged" or match.tag("key_form") == "merged":
        axes = compose(axes, merged_transpose(match, operand, permuted(shape, axes)))
        if transpose == "unmerged":
            unmerged(match, operand, permuted(shape, axes))
    else:
        axes = compose(axes, axes_of(match[operand.transpose], 4))
    return axes, permuted(shape, axes)


def merged_transpose(match: RoleMatch, key: OperandForms, view: tuple) -> tuple[int, ...]:
    """The 4-D permutation that the key's ``permute_dims(reshape(k), [0, 2, 1])`` is:
    ``(0, 1, 3, 2)`` when the reshape merges batch and heads of the 4-D ``view`` (Bloom);
    refused otherwise.
    """
    # the key's forms have the merged spelling (forms._operand builds it for the key)
    assert key.merged is not None and key.merged_transpose is not None
    merged, transpose = match[key.merged], match[key.merged_transpose]
    shape = static_shape(type_of(merged))
    axes = axes_of(transpose, 3) if shape is not None and len(shape) == 3 else None
    if axes != (0, 2, 1) or not is_view(shape, view):
        raise reject(f"the key is reshaped to {shape_text(shape)} and permuted with axes "
                     f"{None if axes is None else list(axes)}, not merged from "
                     f"{shape_text(view)} into batch * heads and transposed ([0, 2, 1])",
                     at=merged)
    return (0, 1, 3, 2)


def unmerged(match: RoleMatch, key: OperandForms, transposed: tuple) -> None:
    """The key's 3-D transpose is split back into the 4-D ``transposed`` key (the
    dynamo ONNX exporter's ``reshape(permute_dims(reshape(k), [0, 2, 1]))``).
    """
    assert key.unmerged is not None  # the key's forms have it (forms._operand)
    split = match[key.unmerged]
    shape = static_shape(type_of(split))
    if not is_view(shape, transposed, merged=False):
        raise reject(f"the key's 3-D transpose is reshaped to {shape_text(shape)}, not "
                     f"split back into batch and heads {shape_text(transposed)}", at=split)


def key_transposed(match: RoleMatch, forms: AttentionForms, k_axes: tuple[int, ...]) -> None:
    """The score matmul contracts the key's last axis, the head axis it was split into."""
    if k_axes[2] != 3:
        key = forms.k
        # the key's forms have both transposes (forms._operand builds them for the key)
        assert key.merged_transpose is not None and key.transpose is not None
        merged = match.tag("key_form") == "merged" or match.tag("k_transpose") == "unmerged"
        at = match[key.merged_transpose if merged else key.transpose]
        raise reject(f"k is not transposed: the score matmul contracts axis {k_axes[2]} "
                     f"of the key, not its head axis (3); permute_dims axes "
                     f"{list(k_axes)} from the key", at=at)


def agree(source: Any, what: str, shape: tuple, expected: tuple) -> None:
    """``shape`` has the query's batch, heads, sequence and head size where ``expected``
    names one (``None``: any).
    """
    for axis, (got, want) in enumerate(zip(shape, expected)):
        if want is not None and not prove_equal(got, want):
            raise reject(f"{what} has {AXIS_NAMES[axis]} {got} on axis {axis} where the "
                         f"query has {want}: {shape_text(shape)} is not split into the "
                         f"query's heads", at=source)


def kv_broadcast(match: RoleMatch, operand: OperandForms, view: tuple, lead: tuple,
                 matmul: Any) -> tuple[tuple, tuple]:
    """``(full, operand)``: the key's or value's 4-D view with a batch or heads axis of
    1 broadcast to the query's ``lead`` (B, N), where the model broadcasts it, and the
    view the matmul's right operand must be (:func:`plumbing`).  Both are ``view``
    itself (the same object) where it agrees, or where an axis is neither 1 nor the
    query's (:func:`agree` refuses it).

    Proven: the 4-D matmul takes the view as it is (its batch axes broadcast, as the
    ONNX form's do; the operand is ``view``), or the view is ``broadcast_to`` the full
    shape (the tag ``<name>_repeat``: Falcon's multi-query key and value through the
    torch importer; the operand is ``full``, maybe merged).  A broadcast found anywhere
    else in the plumbing (after a reshape) may pair a query head with another batch's
    key: it is refused.
    """
    agrees = [prove_equal(got, want) for got, want in zip(view[:2], lead)]
    ones = [dims_equal(got, 1) for got in view[:2]]
    if all(agrees) or not all(a or one for a, one in zip(agrees, ones)):
        return view, view
    full = (*(want if one else got for got, want, one in zip(view[:2], lead, ones)),
            *view[2:])
    if is_view(static_shape(type_of(call_args(matmul)[1])), view, merged=False):
        return full, view  # a 4-D matmul broadcasting its batch axes
    # the key's and value's forms have a repeat (forms._operand builds it for all but q)
    assert operand.repeat is not None
    if match.tag(f"{operand.name}_repeat") in ("merged", "as_is") and is_view(
            static_shape(type_of(match[operand.repeat])), full, merged=False):
        return full, full
    raise reject(f"{WHAT[operand.name]} {shape_text(view)} is broadcast to the query's "
                 f"{shape_text(lead)} after a reshape, not as the 4-D tensor: cannot "
                 f"tell that its heads pair with the query's", at=matmul)


def plumbing(matmul: Any, lhs: tuple, rhs: tuple) -> None:
    """The matmul's operands and result are the 4-D views, or with batch * heads merged.

    Any chain of ``reshape`` and ``broadcast_to`` that ends in one of these shapes
    keeps the elements in order (a broadcast cannot shrink, so it is the identity when
    the element count is kept): the batched matmul pairs the views' heads.
    """
    lhs_expr, rhs_expr = call_args(matmul)[:2]
    for what, expr, view in (("left operand", lhs_expr, lhs), ("right operand", rhs_expr, rhs)):
        shape = static_shape(type_of(expr))
        if not is_view(shape, view):
            raise reject(f"the matmul's {what} has shape {shape_text(shape)}, neither "
                         f"{shape_text(view)} nor batch and heads merged", at=matmul)


def bias_term(mask: Any, what: str, scores: tuple, **term: Any) -> BiasTerm:
    """``mask`` as a term of the bias, when it broadcasts as ``R.nn.attention``'s bias."""
    shape = static_shape(type_of(mask))
    if shape is None or len(shape) > 4:
        raise reject(f"{what} has shape {shape_text(shape)}: attention's bias has at "
                     f"most 4 axes", at=mask)
    padded = (1,) * (4 - len(shape)) + tuple(shape)
    if not prove_equal(padded[3], scores[3]):
        raise reject(f"{what} {shape_text(shape)} does not broadcast as attention's "
                     f"bias: its last axis is {padded[3]}, the key length {scores[3]}",
                     at=mask)
    for axis in range(3):
        if not (dims_equal(padded[axis], 1) or prove_equal(padded[axis], scores[axis])):
            raise reject(f"{what} {shape_text(shape)} does not broadcast as attention's "
                         f"bias {shape_text(scores)} (axis {axis}: {padded[axis]})", at=mask)
    return BiasTerm(mask, rank=len(shape), **term)


def merged_bias_term(match: RoleMatch, forms: AttentionForms, scores: tuple) -> BiasTerm:
    """The bias added before the scores are split into heads (Bloom), as a 4-D term."""
    return term_at(match[forms.merged_bias], "the bias added to the scores", scores,
                   static_shape(type_of(match[forms.pre_biased])),
                   "the bias added to the merged scores")


def term_at(bias: Any, what: str, scores: tuple, site: tuple | None,
            merged_what: str) -> BiasTerm:
    """``bias``, added to a tensor of shape ``site``, as a 4-D term of attention's bias:
    as it is when the scores are 4-D there (``what`` names it), reshaped when they are
    ``(B*N, S, T)`` (``merged_what``: batch and heads merged, so a 3-D term's first axis
    is batch * heads, not heads).
    """
    if site is not None and len(site) == 4:
        return bias_term(bias, what, scores)
    batch, heads, seq, kv_len = scores
    shape = static_shape(type_of(bias))
    what = merged_what if site is None else f"{merged_what} {shape_text(site)}"
    if shape is None:
        raise reject(f"{what} has no known shape: cannot tell whether it broadcasts as "
                     f"attention's bias", at=bias)
    if len(shape) > 3:  # the sum is 4-D: the scores' merged axis meets the bias's heads
        raise reject(f"{what} has shape {shape_text(shape)}: its heads would meet the "
                     f"scores' batch * heads axis", at=bias)
    padded = (1,) * (3 - len(shape)) + tuple(shape)
    rows_ok = dims_equal(padded[1], 1) or prove_equal(padded[1], seq)
    merged_ok = dims_equal(padded[0], 1) or prove_equal(padded[0], batch * heads)
    if not (prove_equal(padded[2], kv_len) and rows_ok and merged_ok):
        raise reject(f"{what} has shape {shape_text(shape)}, which does not broadcast "
                     f"as attention's bias on ({shape_text((batch * heads, seq, kv_len))})",
                     at=bias)
    rows = 1 if dims_equal(padded[1], 1) else seq
    return BiasTerm(bias, shape=((1, 1, rows, kv_len) if dims_equal(padded[0], 1)
                                 else (batch, heads, rows, kv_len)))


def regrouped(match: RoleMatch, forms: AttentionForms, scores: tuple) -> None:
    """Reshapes after the scale only regroup the scores: both ends of the chain are
    views of them (4-D, or batch and heads merged), so the elements keep their order
    and their meaning.
    """
    chain_end = match[forms.regrouped]
    scaled = match[forms.pre_biased if match.tag("merged_bias") == "added" else forms.scaled]
    if chain_end.same_as(scaled):
        return
    for what, expr in (("from", scaled), ("to", chain_end)):
        shape = static_shape(type_of(expr))
        if not is_view(shape, scores):
            raise reject(f"the scaled scores are reshaped {what} {shape_text(shape)}, not a "
                         f"view of the scores {shape_text(scores)}: the reshape regroups "
                         f"their elements", at=chain_end)


def softmax_over_keys(match: RoleMatch, forms: AttentionForms, scores: tuple) -> None:
    """The softmax normalises the key axis of the scores (and so does the safe softmax's
    test of fully masked rows): the 4-D scores, or the ``(B*N, S, T)`` scores of the
    3-D form (``bmm``/``baddbmm`` as older models write it), whose rows are the same
    rows; that the result is split back into heads is the check's last guard.
    """
    softmax = match[forms.softmax]
    axis = int(softmax.attrs.axis)
    shape = static_shape(type_of(call_args(softmax)[0]))
    if shape is None or not is_view(shape, scores):
        raise reject(f"the softmax's input has shape {shape_text(shape)}, the scores "
                     f"{shape_text(scores)}: neither the scores nor their batch and "
                     f"heads merged", at=softmax)
    last = len(shape) - 1
    if axis not in (-1, last):
        raise reject(f"the softmax normalises axis {axis}, attention the key axis (-1)",
                     at=softmax)
    if match.tag("probabilities") == "nan_guarded":
        fill = const_value(match[forms.nan_fill])
        if fill is None or fill.size == 0 or not (fill == 0).all():
            raise reject(f"the probabilities' NaN guard fills {_values_text(fill)}, not 0: "
                         f"attention's fully masked rows are zeroed, not filled",
                         at=match[forms.nan_fill])
    if match.tag("probabilities") == "safe":
        test = match[forms.row_test]
        axes, keepdims = int_list(test.attrs.axis), bool(test.attrs.keepdims)
        if axes not in ([-1], [last]) or not keepdims:
            raise reject(f"the safe softmax zeroes the probabilities where max(axis="
                         f"{axes}, keepdims={keepdims}) finds no score "
                         f"above -inf, not on the fully masked rows (axis -1, kept): "
                         f"not what attention's rows are", at=test)


def scale_factor(match: RoleMatch, tag: str, site: ScaleSite) -> float:
    """The factor of the scale site ``tag`` (1.0 when the match has none there): a
    one-element constant of any shape, or arithmetic on such constants (:mod:`.scale`).
    """
    if match.tag(tag) in (None, "none"):
        return 1.0
    value = scale_value(match, site)
    if value is None or value.size != 1:
        at = what_matched(match, site)
        if value is None:  # the site's wildcard: neither a constant nor computed from them
            kind, shape = "tensor", static_shape(type_of(at))
        else:
            kind = "constant" if site.leaf in match else "constant computed from constants"
            shape = value.shape
        raise reject(f"{SCALE_OWNER[tag]} scale is not a scalar constant (a {kind} of "
                     f"shape {shape_text(shape)}): R.nn.attention takes one number", at=at)
    factor = float(value.reshape(()))
    if match.tag(tag) == "quotient":
        return float(np.float64(1.0) / factor) if factor else float("inf")
    return factor


def mask_fill(match: RoleMatch, forms: AttentionForms) -> MaskFill:
    """The masked_fill's value, -inf, and whether it fills where the condition holds.

    ``scores + where(c, -inf, 0)`` equals ``where(c, -inf, scores)`` everywhere; with
    a finite fill it does not on a fully masked row (the fill gives it uniform
    weights, the added bias keeps the scores' own softmax).
    """
    fill = match[forms.fill]
    values = const_value(fill)
    value = float(values.reshape(())) if values.size == 1 else None
    if value != float("-inf"):
        raise reject(f"the masked scores are filled with "
                     f"{'a tensor' if value is None else value}, not -inf: as a bias it "
                     f"would change fully masked rows", at=fill)
    return MaskFill(value, match.tag("mask_form") == "fill")


def _values_text(values: Any) -> str:
    """A constant's values for a reason: the first few."""
    if values is None:
        return "a value that cannot be read"
    flat = values.reshape(-1)
    shown = ", ".join(f"{float(v):g}" for v in flat[:4])
    return shown + (", ..." if flat.size > 4 else "")
