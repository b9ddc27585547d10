"""The pattern of ``attention.cosine`` and the guards only cosine attention needs.

Cosine attention (Swin v2) scores L2-normalised queries against L2-normalised keys and
multiplies the scores by a learned scale per head::

    q_n = q / max(||q||, eps)        # over the head axis, likewise k_n
    p   = softmax(q_n @ k_n^T * scale[h] [+ position bias] [+ mask], axis=-1)
    out = p @ v

The pattern keeps the normalisation inside the match, with the tensor it normalises a
leaf read twice (by the norm and by the division): ``attention.collapse``'s pattern,
which knows no normalisation, takes the division for a query scale and stops at that
tensor, whose other reader (the norm) lies outside its match.  The plumbing around the
batched matmuls is ``attention.collapse``'s (:data:`.layout.OPERAND_PLUMBING`), and so
are the guards on shapes and biases (:mod:`.guards`); here are the ones cosine attention
adds: the operands are normalised over the axis the score matmul contracts, and the
scale is one number per head (and batch).

The norm is read in each importer's spelling: torch.export's ``clip(sum(abs(x) ** 2) **
0.5, eps)``, and ``from_onnx``'s ``sqrt(sum(x * x))`` clamped by a ``call_tir`` of TOPI's
``maximum`` (both ONNX exporters' ``ReduceL2`` or ``Pow``/``ReduceSum``/``Sqrt`` and
``Clip(min=eps)``), checked to be that maximum (:func:`clamped_by_maximum`).  A
float16 model imported by torch.export accumulates its batched matmuls in float32 and
casts them back (:func:`cast_back`); a bfloat16 one computes the norm in float32 between
casts (``astype(sqrt(sum(x32 * x32)))``, the same norm rounded once), but bfloat16 is
refused (:func:`measured_dtype`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tvm import relax

from patternkit.dpl import (
    DFPattern,
    alt,
    is_constant,
    is_gv,
    is_op,
    is_scalar,
    is_tuple,
    square,
    through,
    wildcard,
)
from patternkit.engine import RoleMatch, reject
from patternkit.ir import (
    call_args,
    dims_equal,
    dtype_of,
    int_list,
    prove_equal,
    static_shape,
    type_of,
)

from .forms import OperandForms
from .layout import OPERAND_PLUMBING, shape_text


@dataclass(frozen=True)
class NormalisedForms:
    """One operand: ``source`` L2-normalised over an axis (``total`` is the sum of
    squares, ``normalised`` the division); ``operand`` is :mod:`.forms`'s view of the
    normalised tensor (maybe head-split, for the key transposed, then plumbed), so
    :func:`.guards.operand_view` reads it as ``attention.collapse`` reads its operands.
    """

    source: DFPattern
    total: DFPattern
    clamp_tir: DFPattern
    normalised: DFPattern
    operand: OperandForms


def _normalised(name: str, key: bool = False) -> NormalisedForms:
    source = wildcard().has_type(relax.TensorType(ndim=4, dtype="void"))
    # F.normalize: x / clamp_min(||x||_2, eps), the norm as abs -> pow 2 -> sum -> pow 0.5
    # a bfloat16 norm computed in float32 between casts (patternkit's torch import of
    # linalg_vector_norm): the same norm, rounded once to the operand's dtype (the divide
    # takes one dtype)
    total = is_op("sum")(square(is_op("abs")(source) | source | is_op("astype")(source)))
    norm = is_op("power")(total, is_scalar(0.5, rtol=0.0)) | is_op("sqrt")(total)
    norm = is_op("astype")(norm) | norm
    # from_onnx's one-sided Clip (both exporters' clamp_min, after ReduceL2 or Pow /
    # ReduceSum / Sqrt, which it imports as sqrt(sum(x * x))): a call_tir of TOPI's
    # maximum, the bound NaN-guarded, where(isnan(eps), -inf, eps), or folded
    bound = is_constant() | is_op("where")(is_op("isnan")(is_constant()), is_constant(),
                                           is_constant())
    clamp_tir = is_op("call_tir")(is_gv("maximum"), is_tuple([norm, bound]))
    clamped = (is_op("clip")(norm, varg_default_wildcard=True)
               | is_op("maximum")(norm, is_constant()) | clamp_tir | norm)
    normalised = is_op("divide")(source, through(clamped, ("broadcast_to",), depth=1))
    split = is_op("permute_dims")(normalised)
    view = alt(tag=f"{name}_layout", split=split, as_is=normalised)
    transpose = None
    if key:
        transpose = is_op("permute_dims")(view)
        view = transpose
    return NormalisedForms(source, total, clamp_tir, normalised, OperandForms(
        name, normalised, split, through(view, OPERAND_PLUMBING), transpose=transpose))


@dataclass(frozen=True)
class CosineForms:
    """Every role of the pattern (:meth:`roles`), and the pattern (``root``)."""

    q: NormalisedForms
    k: NormalisedForms
    v: OperandForms
    qk: DFPattern
    qk_cast: DFPattern
    scores: DFPattern
    scale: DFPattern
    position_bias: DFPattern
    mask: DFPattern
    windowed: DFPattern
    window_mask: DFPattern
    window_added: DFPattern
    second_window_mask: DFPattern
    window_back: DFPattern
    softmax: DFPattern
    pv: DFPattern
    pv_cast: DFPattern
    heads_out: DFPattern
    out: DFPattern
    root: DFPattern

    def roles(self) -> dict[str, DFPattern]:
        """Role name -> pattern: ``q``, ``k``, ``q_normalised``, ``k_normalised``, ...."""
        found = {"v": self.v.source, "v_split": self.v.split}
        for forms in (self.q, self.k):
            name = forms.operand.name
            found[name] = forms.source
            found[f"{name}_total"] = forms.total
            found[f"{name}_clamp_tir"] = forms.clamp_tir
            found[f"{name}_normalised"] = forms.normalised
        found.update({name: value for name, value in vars(self).items()
                      if isinstance(value, DFPattern) and name != "root"})
        return found


def cosine_forms() -> CosineForms:
    """``softmax(norm(q) @ norm(k)^T * scale [+ bias [+ mask]]) @ v`` as the torch
    importer writes it.
    """
    q, k = _normalised("q"), _normalised("k", key=True)
    qk = is_op("matmul")(q.operand.plumbed, k.operand.plumbed)
    # the scale and bias broadcast over the 4-D scores: the merged (B*N, S, T) ones would
    # pair a (N, 1, 1) scale with batch * heads
    # a float16 / bfloat16 matmul accumulated in float32 and cast back (patternkit's torch
    # import of a low-precision bmm: models.low_precision) is a matmul in that dtype
    qk_cast = is_op("astype")(qk)
    scores = through(qk_cast | qk, ("reshape",), depth=1).has_type(
        relax.TensorType(ndim=4, dtype="void"))
    scale = wildcard()
    scaled = is_op("multiply")(scores, scale)  # the matcher tries both operand orders
    position_bias, mask = wildcard(), wildcard()
    biased = is_op("add")(scaled, position_bias)
    # Swin v2's shifted windows: the scores viewed as (B/W, W, N, S, T), the (1, W, 1, S, T)
    # mask added (twice, as transformers writes it), and the view undone
    windowed = is_op("reshape")(biased, varg_default_wildcard=True)
    window_mask, second_window_mask = wildcard(), wildcard()
    window_added = is_op("add")(windowed, window_mask)
    window_back = is_op("reshape")(alt(
        tag="window_terms", two=is_op("add")(window_added, second_window_mask),
        one=window_added), varg_default_wildcard=True)
    masked = alt(tag="bias", masked=is_op("add")(biased, mask), windowed=window_back,
                 added=biased, none=scaled)
    softmax = is_op("nn.softmax")(masked)
    v = wildcard().has_type(relax.TensorType(ndim=4, dtype="void"))
    v_split = is_op("permute_dims")(v)
    v_plumbed = through(alt(tag="v_layout", split=v_split, as_is=v), OPERAND_PLUMBING)
    pv = is_op("matmul")(through(softmax, OPERAND_PLUMBING), v_plumbed)
    pv_cast = is_op("astype")(pv)
    heads_out = through(pv_cast | pv, ("reshape",), depth=1).has_type(
        relax.TensorType(ndim=4, dtype="void"))
    out = is_op("permute_dims")(heads_out)
    root = alt(tag="output", permuted=out, heads_first=heads_out)
    return CosineForms(q, k, OperandForms("v", v, v_split, v_plumbed), qk, qk_cast, scores,
                       scale, position_bias, mask, windowed, window_mask, window_added,
                       second_window_mask, window_back, softmax, pv, pv_cast, heads_out, out,
                       root)


#: What ``BlockBuilder.emit_te`` names TOPI's maximum (a suffix when the name is taken):
#: ``from_onnx``'s ``Clip`` callee, read by name as ``clip.collapse_onnx`` reads it.
_TE_MAXIMUM = re.compile(r"maximum\d*")


def clamped_by_maximum(match: RoleMatch, forms: NormalisedForms, what: str) -> None:
    """``from_onnx``'s clamp of the norm calls TOPI's ``maximum`` (by its name).

    Why it matters: ``max(||x||, eps) >= ||x||`` keeps the normalised operand within the
    unit ball whatever ``eps`` is, so the eps needs no guard, but a ``call_tir`` of another
    PrimFunc could make the divisor anything.
    """
    if forms.clamp_tir not in match:
        return
    call = match[forms.clamp_tir]
    callee = call.args[0].name_hint
    if not _TE_MAXIMUM.fullmatch(callee):
        raise reject(f"{what}'s norm is clamped by a call_tir of {callee!r}, not of a "
                     f"PrimFunc emit_te names after TOPI's maximum: its body is unknown "
                     f"here, so the operand is not known to be a unit vector", at=call)


#: The dtypes a low-precision matmul may accumulate in before its cast back.
ACCUMULATE = "float32"


def cast_back(match: RoleMatch, matmul: DFPattern, cast: DFPattern, what: str) -> None:
    """A cast after a batched matmul casts a float32 accumulation back to the operands'
    float16 / bfloat16 (or is a no-op): the matmul in that dtype.
    """
    if cast not in match:
        return
    node, product = match[cast], match[matmul]
    operands = dtype_of(type_of(call_args(product)[0]))
    accumulated = dtype_of(type_of(product))
    if accumulated not in (operands, ACCUMULATE) or str(node.attrs.dtype) != operands:
        raise reject(f"{what} of {operands} operands accumulate in {accumulated} and are "
                     f"cast to {node.attrs.dtype}: only a {ACCUMULATE} accumulation cast "
                     f"back to the operands' dtype is a matmul in that dtype", at=node)


def normalised_over(match: RoleMatch, forms: NormalisedForms, axis: int, what: str) -> None:
    """The operand is divided by its norm over ``axis`` of the normalised tensor (the
    axis the score matmul contracts), kept: cosine attention's unit vectors.

    Why it matters: with unit operands every score is at most the scale in size, which
    bounds what folding the scale into the query changes (:mod:`.cosine`).
    """
    total = match[forms.total]
    axes = int_list(total.attrs.axis)
    keepdims = bool(total.attrs.keepdims)
    if axes not in ([axis], [axis - 4]) or not keepdims:
        raise reject(f"{what} is divided by its norm over axes {axes} (keepdims="
                     f"{keepdims}), not over its head axis ({axis}), the one the score "
                     f"matmul contracts: not a unit vector per head, so the scores are "
                     f"not bounded by the scale and the fold is not proven accurate",
                     at=total)


def per_head_scale(scale: relax.Expr, scores: tuple) -> tuple:
    """The scale's shape as a 4-D factor of the ``(B, N, S, T)`` scores, when it is one
    number per head (and batch): ``(B|1, N|1, 1, 1)``.
    """
    shape = static_shape(type_of(scale))
    padded = None if shape is None or len(shape) > 4 else (1,) * (4 - len(shape)) + tuple(shape)
    if padded is None or not all(dims_equal(padded[axis], 1) for axis in (2, 3)) or not all(
            dims_equal(padded[axis], 1) or prove_equal(padded[axis], scores[axis])
            for axis in (0, 1)):
        raise reject(f"the scores' scale has shape {shape_text(shape)}, not one number per "
                     f"head ({shape_text((scores[0], scores[1], 1, 1))} or fewer axes, each "
                     f"1 or the scores'): it varies along the query or key axis, and the "
                     f"rule folds only a per-head factor into the query", at=scale)
    return padded


def window_terms(match: RoleMatch, forms: CosineForms, scores: tuple) -> list[tuple]:
    """``(mask, shape)`` of each term Swin v2 adds to the windowed view of the scores:
    the view splits the batch into ``(B/W, W)`` (the rest as the scores), and each sum
    keeps the view's shape (the term broadcasts into it).  ``shape`` is the term's,
    padded to 5-D.
    """
    windowed = match[forms.windowed]
    view = static_shape(type_of(windowed))
    problem = None
    if (view is None or len(view) != 5 or not prove_equal(view[0] * view[1], scores[0])
            or not all(prove_equal(a, b) for a, b in zip(view[2:], scores[1:]))):
        problem = (f"the scores {shape_text(scores)} are viewed as {shape_text(view)}, not "
                   f"split into windows (B/W, W, {', '.join(str(d) for d in scores[1:])})")
    roles = [forms.window_mask]
    if match.tag("window_terms") == "two":
        roles.append(forms.second_window_mask)
    sums = [match[forms.window_added], call_args(match[forms.window_back])[0]]
    found = []
    for role, total in zip(roles, sums):
        mask = match[role]
        shape = static_shape(type_of(mask))
        summed = static_shape(type_of(total))
        if problem is not None:
            break
        if (shape is None or len(shape) > 5 or summed is None or view is None
                or not all(prove_equal(a, b) for a, b in zip(summed, view))):
            problem = (f"the window mask {shape_text(shape)} does not add to the windowed "
                       f"scores {shape_text(view)} as a term of their shape")
            break
        found.append((mask, (1,) * (5 - len(shape)) + tuple(shape)))
    if problem is not None:
        raise reject(problem, at=windowed)
    return found


def softmax_over_keys(softmax: relax.Expr) -> None:
    """The softmax normalises the scores' last axis, the keys."""
    axis = int(softmax.attrs.axis)
    if axis not in (-1, 3):
        raise reject(f"the softmax normalises axis {axis} of the scores, attention the key "
                     f"axis (-1)", at=softmax)


def known_shape(expr: relax.Expr, what: str) -> tuple:
    """The static shape of ``expr``, which the check compares with the query's views."""
    shape = static_shape(type_of(expr))
    if shape is None:
        raise reject(f"{what}: no known shape, so its batch, heads, sequence "
                     f"and key axes cannot be told apart", at=expr)
    return tuple(shape)


def one_dtype(named: dict[str, relax.Expr]) -> str:
    """The dtype every named tensor has (the fused op computes in one)."""
    dtypes = {what: dtype_of(type_of(expr)) for what, expr in named.items()}
    first = next(iter(dtypes.values()))
    for what, dtype in dtypes.items():
        if dtype != first:
            raise reject(f"the dtype of {what} is {dtype}, the query's {first}: "
                         f"R.nn.attention computes in one dtype", at=named[what])
    return str(first)


#: The dtypes whose error :mod:`.cosine`'s tolerances state (measured).
MEASURED_DTYPES = ("float32", "float16")


def measured_dtype(dtype: str, root: relax.Expr) -> None:
    """The attention computes in a dtype whose error the rule bounds usefully.

    Folding the scale into the query rounds scores up to the scale (<= 100) at other
    points; :mod:`.cosine`'s tolerances state what that costs in float32 and float16.  In
    bfloat16 (steps of 0.5 above 64) it moves outputs up to 3 by up to 0.42 at the clamp
    (0.23 at Swin's initial scale, 10; 4 seeds, the torch import's form): each form is as
    far from float32, but a tolerance that wide is no evidence (``patternkit verify``
    calls it inconclusive), so the rule leaves bfloat16 cosine attention as it is.
    """
    if dtype not in MEASURED_DTYPES:
        raise reject(f"cosine attention in {dtype}: scores up to the scale (<= 100) are "
                     f"rounded at other points once the scale is folded into the query, "
                     f"which moves outputs up to 3 by up to 0.42 in bfloat16 (measured): no "
                     f"tolerance that wide is evidence, so only "
                     f"{' and '.join(MEASURED_DTYPES)} are collapsed", at=root)


__all__ = ["CosineForms", "measured_dtype", "NormalisedForms", "cosine_forms", "normalised_over",
           "clamped_by_maximum", "cast_back",
           "per_head_scale", "window_terms", "softmax_over_keys", "known_shape", "one_dtype"]
