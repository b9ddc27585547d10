"""Swin v2's cosine attention as the torch importer writes it, and its departures.

``attention.cosine``'s examples and negative cases come from one writer,
:func:`cosine_block`, which builds the window attention of transformers'
``Swinv2SelfAttention`` in the form ``from_exported_program`` gives it (read off
``zoo:swinv2``): ``F.normalize`` as ``x / broadcast_to(clip(sum(abs(x) ** 2, -1) ** 0.5,
1e-12))``, the batched matmuls behind ``broadcast_to`` and ``reshape`` to ``(B*N, ., .)``,
the scores multiplied by ``exp(clip(logit_scale, max=log(100)))`` of shape ``(N, 1, 1)``,
the position bias ``16 * sigmoid(table)`` expanded to ``(1, N, S, S)``.  Two knobs write
the other imports' forms: ``norm_form="onnx"`` the norm as ``from_onnx`` imports both
exporters' ``F.normalize``, ``accumulate="float32"`` the batched matmuls of a float16
model as patternkit's torch import writes them (and ``norm_form="float32"`` the norm of
a bfloat16 one).  Any other knob departs from the form in
the one way a refusal is about.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tvm
from tvm import relax

HEADS, HEAD_DIM = 2, 8
#: The windows' tokens (a 4 x 4 window).
TOKENS = 16
#: Windows per image in the shifted form (the batch is images * windows).
WINDOWS = 2
#: ``log(100)``: Swin v2's clamp of the learned logit scale.
MAX_LOGIT = math.log(100.0)


def _normalise(bb: relax.BlockBuilder, x: relax.Expr, axis: int, form: str = "torch",
               clamp_name: str = "maximum") -> relax.Expr:
    """``F.normalize(x, dim=axis)`` as the torch importer writes it (``form="torch"``) or
    as ``from_onnx`` writes both exporters' ``ReduceL2`` (or ``Pow`` / ``ReduceSum`` /
    ``Sqrt``), ``Clip(min=eps)``, ``Expand``, ``Div`` (``"onnx"``): ``sqrt(sum(x * x))``,
    a ``call_tir`` of TOPI's maximum (the PrimFunc called ``clamp_name``) with the bound
    ``where(isnan(eps), -inf, eps)``.
    """
    shape = x.ty.shape
    if form == "float32":  # the torch import of a bfloat16 model: the norm between casts
        wide = bb.emit(relax.op.astype(x, "float32"))
        total = bb.emit(relax.op.sum(bb.emit(relax.op.multiply(wide, wide)), axis=[axis],
                                     keepdims=True))
        norm = bb.emit(relax.op.astype(bb.emit(relax.op.sqrt(total)), x.ty.dtype))
        clamped = bb.emit(relax.op.clip(norm, relax.prim_value(tvm.tirx.FloatImm(
            "float64", 1e-12)), relax.prim_value(tvm.tirx.FloatImm("float64", math.inf))))
        return bb.emit(relax.op.divide(x, relax.op.broadcast_to(clamped, shape)))
    if form == "onnx":
        from tvm import topi

        total = bb.emit(relax.op.sum(bb.emit(relax.op.multiply(x, x)), axis=[axis],
                                     keepdims=True))
        eps = relax.const(1e-12, x.ty.dtype)
        bound = bb.emit(relax.op.where(bb.emit(relax.op.isnan(eps)),
                                       relax.const(-math.inf, x.ty.dtype), eps))
        clamped = bb.emit_te(topi.maximum, bb.emit(relax.op.sqrt(total)), bound,
                             primfunc_name_hint=clamp_name)
        return bb.emit(relax.op.divide(x, relax.op.broadcast_to(clamped, shape)))
    squared = bb.emit(relax.op.power(relax.op.abs(x), relax.const(2.0, x.ty.dtype)))
    total = bb.emit(relax.op.sum(squared, axis=[axis], keepdims=True))
    norm = bb.emit(relax.op.power(total, relax.const(0.5, x.ty.dtype)))
    clamped = bb.emit(relax.op.clip(norm, relax.prim_value(tvm.tirx.FloatImm("float64", 1e-12)),
                                    relax.prim_value(tvm.tirx.FloatImm("float64", math.inf))))
    return bb.emit(relax.op.divide(x, relax.op.broadcast_to(clamped, shape)))


def _batched(bb: relax.BlockBuilder, lhs: relax.Expr, rhs: relax.Expr, out: Any,
             out_dtype: str = "", accumulate: str = "") -> relax.Expr:
    """``lhs @ rhs`` on 4-D views as the torch importer writes it: each operand
    ``broadcast_to`` its own shape and merged to 3-D, the result split back to ``out``;
    ``accumulate``: the product computed in that dtype and cast back (patternkit's import
    of a float16 / bfloat16 ``bmm``).
    """
    merged = []
    for operand in (lhs, rhs):
        # probabilities of unknown shape (score_shape="unknown") are broadcast to the known
        value = list(rhs.ty.shape)  # (B, N, T, H): the probabilities are (B, N, S=T, T)
        shape = (list(operand.ty.shape) if operand.ty.shape is not None
                 else [*value[:3], value[2]])
        full = bb.emit(relax.op.broadcast_to(operand, shape))
        merged.append(bb.emit(relax.op.reshape(full, [shape[0] * shape[1], *shape[2:]])))
    dtype = out_dtype or str(lhs.ty.dtype)
    product = bb.emit(relax.op.matmul(merged[0], merged[1], out_dtype=accumulate or dtype))
    if accumulate:
        product = bb.emit(relax.op.astype(product, dtype))
    return bb.emit(relax.op.reshape(product, out))


def _shifted(bb: relax.BlockBuilder, scores: relax.Expr, window_mask: relax.Expr,
             window_view: str, mask_rank: int) -> relax.Expr:
    """Swin v2's shifted-window mask on the scores, as the torch importer writes it."""
    batch, heads, seq, keys = list(scores.ty.shape)
    view = ([batch // WINDOWS, WINDOWS, heads, seq, keys] if window_view == "windows"
            else [batch, WINDOWS, 1, seq, keys])
    windowed = bb.emit(relax.op.reshape(scores, view))
    for _ in range(2):  # transformers adds the mask twice
        term = bb.emit(relax.op.expand_dims(window_mask, [1]))
        term = bb.emit(relax.op.expand_dims(term, [0] if mask_rank == 5 else [0, 1]))
        windowed = bb.emit(relax.op.add(windowed, term))
    return bb.emit(relax.op.reshape(windowed, [batch, heads, seq, keys]))


def cosine_block(dtype: str = "float32", shape: str = "static", bias: str = "position",
                 scale: str = "per_head", normalised: str = "both", norm_axis: int = -1,
                 softmax_axis: int = -1, score_dtype: str = "", score_shape: str = "known",
                 window_view: str = "windows", window_mask_rank: int = 5,
                 logit: float = math.log(10.0), norm_form: str = "torch",
                 clamp_name: str = "maximum", accumulate: str = "",
                 seed: int = 0) -> tvm.IRModule:
    """One window attention on ``xq, xk, xv: (B, 16, 16)`` (2 heads of 8), returning the
    heads back in place, ``(B, 16, 16)``.

    ``shape``: ``"static"`` (B = 4 windows) or ``"symbolic"`` (B a variable).  ``bias``:
    ``"position"`` (Swin's ``16 * sigmoid`` table), ``"position_and_mask"`` (and a
    ``(B, 1, S, S)`` additive mask), ``"shifted"`` (and the shifted windows' mask as
    transformers adds it: the scores viewed as ``(B/W, W, N, S, S)``, the ``(W, S, S)``
    mask expanded to ``(1, W, 1, S, S)`` added twice, the view undone), ``"none"``.
    ``window_view="across"``: the view ``(B, W, 1, S, S)`` (refused); ``window_mask_rank=6``:
    a ``(1, 1, W, 1, S, S)`` mask (refused).  ``scale``: ``"per_head"`` (the
    learned ``(N, 1, 1)`` logit scale), ``"scalar"`` (one number), ``"per_query"``
    (``(N, S, 1)``: refused).  ``normalised``: ``"both"``, ``"key"`` (the query left as
    it is: not cosine attention).  ``norm_axis``: the axis q and k are normalised over
    (``2``, the sequence: refused).  ``softmax_axis``: refused unless the keys'.
    ``score_dtype``: the score matmul's ``out_dtype`` (``"float32"`` on a float16 model,
    not cast back: refused).  ``score_shape="unknown"``: the scores reshaped to a shape
    given as a parameter (refused: their axes cannot be told apart).  ``logit``: the
    learned logit scale's centre (Swin v2 initialises it at ``log(10)``; the clamp stops
    it at ``log(100)``).  ``norm_form="onnx"``: ``F.normalize`` as ``from_onnx`` imports
    the exporters' spelling (:func:`_normalise`; ``clamp_name``: its ``maximum`` PrimFunc's
    name, another one refused).  ``accumulate``: both batched matmuls computed in that
    dtype and cast back (``"float32"`` on a float16 / bfloat16 model, as patternkit's
    torch import writes them; ``"bfloat16"`` on a float16 one: refused).
    ``norm_form="float32"``: the norm computed in float32 between casts (the torch import
    of a bfloat16 model).
    """
    rng = np.random.default_rng(seed)
    batch: Any = tvm.tirx.Var("batch", "int64") if shape == "symbolic" else 4
    hidden = HEADS * HEAD_DIM
    inputs = {name: relax.Var(name, relax.TensorType((batch, TOKENS, hidden), dtype))
              for name in ("xq", "xk", "xv")}
    params = list(inputs.values())
    mask = None
    if bias == "position_and_mask":
        mask = relax.Var("mask", relax.TensorType((batch, 1, TOKENS, TOKENS), dtype))
        params.append(mask)
    window_mask = None
    if bias == "shifted":
        window_mask = relax.Var("window_mask", relax.TensorType((WINDOWS, TOKENS, TOKENS), dtype))
        params.append(window_mask)
    shape_param = relax.Var("score_shape", relax.ShapeType(ndim=4))
    if score_shape == "unknown":
        params.append(shape_param)
    table = relax.const(rng.uniform(-2, 2, (HEADS, TOKENS, TOKENS)).astype(dtype), dtype)
    scale_shape = {"per_head": (HEADS, 1, 1), "scalar": (1,),
                   "per_query": (HEADS, TOKENS, 1)}[scale]
    logits = relax.const((logit + rng.uniform(-0.5, 0.5, scale_shape)).astype(dtype), dtype)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            heads_first = []
            for name in ("xq", "xk", "xv"):
                split = bb.emit(relax.op.reshape(inputs[name], [batch, TOKENS, HEADS, HEAD_DIM]))
                heads_first.append(bb.emit(relax.op.permute_dims(split, [0, 2, 1, 3])))
            q, k, v = heads_first
            if normalised == "both":
                q = _normalise(bb, q, norm_axis, norm_form, clamp_name)
            k = _normalise(bb, k, norm_axis, norm_form, clamp_name)
            k_t = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            scores_dtype = score_dtype or dtype
            scores = _batched(bb, q, k_t, shape_param if score_shape == "unknown"
                              else [batch, HEADS, TOKENS, TOKENS], score_dtype, accumulate)
            clamped = bb.emit(relax.op.clip(logits, relax.prim_value(
                tvm.tirx.FloatImm("float64", -math.inf)), relax.prim_value(
                tvm.tirx.FloatImm("float64", MAX_LOGIT))))
            factor = bb.emit(relax.op.exp(relax.op.astype(clamped, scores_dtype)
                                          if scores_dtype != dtype else clamped))
            scores = bb.emit(relax.op.multiply(scores, factor))
            if bias != "none":
                position = bb.emit(relax.op.multiply(relax.op.sigmoid(table),
                                                     relax.const(16.0, dtype)))
                position = bb.emit(relax.op.expand_dims(position, [0]))
                if scores_dtype != dtype:
                    position = bb.emit(relax.op.astype(position, scores_dtype))
                scores = bb.emit(relax.op.add(scores, position))
            if mask is not None:
                scores = bb.emit(relax.op.add(scores, mask))
            if window_mask is not None:
                scores = _shifted(bb, scores, window_mask, window_view, window_mask_rank)
            probabilities = bb.emit(relax.op.nn.softmax(scores, axis=softmax_axis))
            if scores_dtype != dtype:
                v = bb.emit(relax.op.astype(v, scores_dtype))
            out = _batched(bb, probabilities, v, [batch, HEADS, TOKENS, HEAD_DIM],
                           accumulate=accumulate)
            out = bb.emit(relax.op.permute_dims(out, [0, 2, 1, 3]))
            result = bb.emit_output(relax.op.reshape(out, [batch, TOKENS, hidden]))
        bb.emit_func_output(result)
    return bb.get()


#: One module per refusal of the rule, by the name its negative case has.
REFUSALS: dict[str, dict[str, Any]] = {
    "scale_varying_along_the_queries": {"scale": "per_query"},
    "query_not_normalised": {"normalised": "key"},
    "normalised_over_the_sequence": {"norm_axis": 2},
    "softmax_over_the_queries": {"softmax_axis": 2},
    "float16_scores_accumulated_in_float32": {"dtype": "float16", "score_dtype": "float32"},
    "scores_of_unknown_shape": {"score_shape": "unknown"},
    "scores_viewed_across_windows": {"bias": "shifted", "window_view": "across"},
    "window_mask_of_rank_6": {"bias": "shifted", "window_mask_rank": 6},
    "norm_clamped_by_another_primfunc": {"norm_form": "onnx", "clamp_name": "fused_maximum_add"},
    "float16_scores_accumulated_in_bfloat16": {"dtype": "float16", "accumulate": "bfloat16"},
    "bfloat16_attention": {"dtype": "bfloat16", "accumulate": "float32",
                           "norm_form": "float32"},
}

#: The rule's example space (the first point is the default example).
SPACE: list[dict[str, Any]] = [
    {"dtype": ("float32", "float16"), "shape": ("static", "symbolic"),
     "bias": ("position", "position_and_mask", "none"), "scale": ("per_head", "scalar")},
    {"dtype": ("float32", "float16"), "bias": ("shifted",), "scale": ("per_head", "scalar")},
    {"dtype": ("float32", "float16"), "shape": ("static", "symbolic"), "norm_form": ("onnx",),
     "bias": ("position", "none")},
    {"dtype": ("float16",), "accumulate": ("float32",), "norm_form": ("torch", "onnx"),
     "bias": ("position", "none")},
]
