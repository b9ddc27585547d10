"""The attention block as the frontends write it, from orthogonal choices.

One writer for every form of :mod:`.examples`: a form names the choices that make a real
model's attention (torch's eager GPT-2, an ONNX export, Bloom, Falcon, T5, SDPA), or one
departure from them that ``attention.collapse`` must refuse.  Not every combination of
choices makes a well-typed module: the forms pick combinations that do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.ir import dtype_of, type_of

from .layout import HEADS_FIRST

#: Falcon's ALiBi, added to the 4-D scores before the scale: over the keys, and (refused)
#: a (B, N, S, 1) term, which does not broadcast as attention's bias.
PRESCALE_ALIBIS = ("before_scale", "before_scale_per_query")
#: Masks written as torch's ``masked_fill``: ``where(not causal, -inf, scores)``,
#: ``where(causal, scores, -inf)``, and a finite fill (refused).
MASKED_FILLS = ("masked_fill", "masked_keep", "masked_fill_finite")
#: The ONNX exporters' scales of SDPA, the query and the key each times ``sqrt(scale)``
#: (:func:`_split_scale`): the dynamo exporter's constant, TorchScript's arithmetic on
#: constants, and (refused) that arithmetic per head or on a shape read at run time.
ONNX_SCALES = ("split", "computed", "computed_per_head", "computed_from_a_shape")


def attention_block(dtype: str = "float32", frontend: str = "torch", shape: str = "static",
                    scale: str = "product", mask: str = "padding", kv_heads: int = 2,
                    softmax_axis: int = -1, key: str = "transposed", value_heads: int = 2,
                    repeat: str = "repeat_kv", split: str = "heads_first",
                    accumulate: str | None = None, safe_softmax: str | None = None,
                    regroup: str | None = None, recast: bool = False,
                    position_bias: bool = False, softmax_dtype: str | None = None,
                    alibi: str | None = None, seed: int = 0) -> tvm.IRModule:
    """One attention block on projections ``xq: (B, S, 32)``, ``xk, xv: (B, T, .)``:
    2 query heads of 16, returning ``(B, S, 32)``.

    ``frontend``: ``"torch"`` (the importer's ``broadcast_to`` + ``reshape`` around 3-D
    batched matmuls, the key split then transposed) or ``"onnx"`` (4-D matmuls, the key
    transposed once, a no-op ``astype`` after the softmax).  ``shape``: see
    :func:`example_dims`.  ``scale``: ``"product"``, ``"divide"``, ``"query"``, ``"key"``,
    ``"none"``, ``"tensor"`` (per head), :data:`ONNX_SCALES`.  ``mask``: ``"none"``,
    ``"padding"`` (B, 1, 1, T),
    ``"causal"`` (a constant (S, T) 0 / -1e4 mask), ``"full"`` (B, 2, S, T), ``"boolean"``
    (SDPA's ``where(allowed, 0, -inf)``), a masked_fill (:data:`MASKED_FILLS`), or
    ``"last_axis_one"``, ``"square"``, ``"rank5"``.  ``kv_heads=1``: one key/value head,
    repeated as Llama's ``repeat_kv`` (``repeat="repeat_kv"``), broadcast by the matmuls
    (``"broadcast"``, Falcon's multi-query), or moved onto the batch axis first
    (``"misplaced"``).  ``key``: ``"transposed"``, ``"untransposed"``, ``"merged"``
    (Bloom's 3-D key and scores), ``"unmerged"`` (the dynamo ONNX exporter's 3-D
    transpose split back to 4-D) or ``"folded"`` (the heads folded into the sequence).
    ``value_heads=4`` and ``split="scores"`` / ``"output"`` mis-split a matmul.
    ``accumulate``: ``"float32"`` (the score matmul's ``out_dtype``) or ``"cast_back"``
    (both matmuls accumulated in float32 and cast back).  ``safe_softmax``: torch's SDPA
    over ``"keys"`` (or ``"queries"``), or its ONNX export's NaN guard ``"nan_guard"``
    (``"nan_guard_one"``: filling 1, an edge).  ``regroup``: the scaled scores reshaped to
    (B*N, S, T) and back (``"round_trip"``, Falcon) or to (B, S, N, T) (``"scrambled"``).
    ``recast``: a second no-op cast of the probabilities (CLIP's ONNX export).
    ``position_bias``: T5's constant (1, N, S, T) term before the mask.
    ``softmax_dtype``: the softmax computed in a wider dtype between casts (Llama's eager
    attention in float16).  ``alibi``: Bloom's ``"heads"`` bias on the merged scores (or
    ``"per_query"``, ``"unknown"``), Falcon's before the scale (:data:`PRESCALE_ALIBIS`).
    """
    rng = np.random.default_rng(seed)
    cast_back = accumulate == "cast_back"
    batch, seq, kv_len = example_dims(shape, key)
    heads, head_dim = 2, 16
    falcon_alibi = alibi in PRESCALE_ALIBIS
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
    elif mask in MASKED_FILLS:
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
            if scale in ONNX_SCALES:  # the query and the key each times sqrt(scale)
                factor = _split_scale(bb, scale, head_dim, dtype)
            q = heads_first(emit(relax.op.reshape, xq, (batch, seq, heads, head_dim)))
            if scale == "query" or scale in ONNX_SCALES:
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
            elif key == "unmerged":  # the dynamo ONNX exporter: transposed in 3-D
                k_h = k if heads_first_key else heads_first(k)
                b, n, t, h = k_h.ty.shape
                k_t = emit(relax.op.reshape, emit(relax.op.permute_dims, emit(
                    relax.op.reshape, k_h, (b * n, t, h)), [0, 2, 1]), (b, n, h, t))
            else:
                k_t = emit(relax.op.permute_dims, k,
                           [0, 1, 3, 2] if heads_first_key else [0, 2, 3, 1])
            if repeat == "misplaced":  # (B, 1, H, T) -> (1, B, H, T), broadcast
                k_t = emit(relax.op.broadcast_to, emit(
                    relax.op.reshape, k_t, (1, batch, head_dim, kv_len)),
                    (batch, heads, head_dim, kv_len))
            if scale == "key":
                k_t = emit(relax.op.multiply, factor, k_t)
            elif scale in ONNX_SCALES:  # its own binding of the factor, as exported
                k_t = emit(relax.op.multiply, k_t, _split_scale(bb, scale, head_dim, dtype))
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
            if mask in MASKED_FILLS:
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
            if safe_softmax in ("nan_guard", "nan_guard_one"):  # torch's ONNX export of SDPA
                fill = relax.const(0.0 if safe_softmax == "nan_guard" else 1.0, scores_dtype)
                p = bb.emit(relax.op.where(relax.op.isnan(p), fill, p))
            elif safe_softmax is not None:
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


def _split_scale(bb: relax.BlockBuilder, scale: str, head_dim: int, dtype: str) -> relax.Expr:
    """``sqrt(head_dim ** -0.5)``, the factor an ONNX exporter multiplies q and k by each:
    a constant (``"split"``, the dynamo exporter) or computed from constants of shape (1,)
    (``"computed"``, TorchScript's ``sqrt(cast(1 / sqrt(H)))``, the division in float32);
    ``"computed_per_head"``:
    from constants of shape (1, 2, 1, 1); ``"computed_from_a_shape"``: from the head size
    read from a shape at run time, not a constant.
    """
    if scale == "split":
        return relax.const(np.array(head_dim ** -0.25, dtype))
    shape = (1, 2, 1, 1) if scale == "computed_per_head" else (1,)
    one = relax.const(np.ones(shape, "float32"))
    dims: relax.Expr = relax.const(np.full(shape, head_dim, dtype))
    if scale == "computed_from_a_shape":
        dims = bb.emit(relax.op.astype(relax.op.shape_to_tensor(relax.ShapeExpr([head_dim])),
                                       dtype))
    root = bb.emit(relax.op.sqrt(dims))
    if dtype != "float32":  # the division runs in float32 (a float16 export casts to it)
        root = bb.emit(relax.op.astype(root, "float32"))
    inverse = bb.emit(relax.op.divide(one, root))
    return bb.emit(relax.op.sqrt(bb.emit(relax.op.astype(inverse, dtype))))


def _safe_softmax(bb: relax.BlockBuilder, scores: relax.Expr, p: relax.Expr,
                  axis: int) -> relax.Expr:
    """Torch's ``_safe_softmax`` as ``torch.export`` writes it: 0 where ``axis`` has no
    score above -inf, ``p`` elsewhere.
    """
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


def example_dims(shape: str, key: str = "transposed") -> tuple[Any, Any, Any]:
    """``(batch, seq, kv_len)`` of ``shape``: static (2, 8, 8), symbolic batch and sequence,
    cross-attention (4 queries on 8 keys), decode (1 query).
    """
    if key == "untransposed":  # q @ k type-checks only with as many keys as head sizes
        return 2, 16, 16
    if shape == "symbolic":
        seq = tvm.tirx.Var("seq", "int64")
        return tvm.tirx.Var("batch", "int64"), seq, seq
    return {"static": (2, 8, 8), "cross": (2, 4, 8), "decode": (2, 1, 8)}[shape]
