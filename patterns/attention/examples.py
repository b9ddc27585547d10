"""The examples of ``attention.collapse``: one builder per real model form, one per refusal.

Each form is a function whose knobs only vary what that model varies, and
:data:`SPACE` (the rule's ``example_space``) is the union of the forms' knob products:
every point of it builds a real form, so no combination is carved back out.  The tests
and ``patternkit verify`` build from the same functions.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.ir import from_expr

from .written_out import attention_block, example_dims

DTYPES = ("float32", "float16")
SCALES = ("product", "divide", "query", "key", "none")


def torch_eager(dtype: str = "float32", shape: str = "static", scale: str = "product",
                mask: str = "padding", kv_heads: int = 2,
                accumulate: str | None = None) -> tvm.IRModule:
    """GPT-2, BERT, ViT or Llama eager attention through torch's importer; ``kv_heads=1``
    is Llama's grouped-query ``repeat_kv``, ``accumulate="cast_back"`` a float16 import.
    """
    return attention_block(dtype, "torch", shape, scale, mask, kv_heads, accumulate=accumulate)


def onnx(dtype: str = "float32", shape: str = "static", scale: str = "product",
         mask: str = "padding", kv_heads: int = 2, accumulate: str | None = None,
         recast: bool = False) -> tvm.IRModule:
    """An ONNX export (opset 14, 17): 4-D matmuls; ``recast``: CLIP's and DeiT's second cast."""
    return attention_block(dtype, "onnx", shape, scale, mask, kv_heads, accumulate=accumulate,
                           recast=recast)


def sdpa(dtype: str = "float32", shape: str = "static", mask: str = "boolean",
         kv_heads: int = 2) -> tvm.IRModule:
    """Torch's ``scaled_dot_product_attention`` as ``torch.export`` writes it: the safe
    softmax (fully masked rows get 0), a boolean mask made ``where(allowed, 0, -inf)``.
    """
    return attention_block(dtype, "torch", shape, mask=mask, kv_heads=kv_heads,
                           safe_softmax="keys")


def widened_softmax(dtype: str = "float16", shape: str = "static", mask: str = "padding",
                    kv_heads: int = 2) -> tvm.IRModule:
    """Hugging Face's eager attention in float16 or bfloat16 (Llama, Qwen3, ViT, Falcon):
    ``softmax(scores, dtype=float32).to(query.dtype)``, the float16 import's matmuls
    accumulated in float32 and cast back.
    """
    return attention_block(dtype, "torch", shape, mask=mask, kv_heads=kv_heads,
                           softmax_dtype="float32", accumulate="cast_back")


def onnx_sdpa(dtype: str = "float32", shape: str = "static", exporter: str = "torchscript",
              mask: str = "none", kv_heads: int = 2) -> tvm.IRModule:
    """Torch's SDPA through an ONNX exporter: the query and the key each multiplied by
    ``sqrt(scale)``, computed from constants (``"torchscript"``, opsets 14 and 17) or a
    constant with the key transposed in 3-D and split back (``"dynamo"``).
    """
    dynamo = exporter == "dynamo"
    return attention_block(dtype, "onnx", shape, "split" if dynamo else "computed", mask,
                           kv_heads, key="unmerged" if dynamo else "transposed")


def key_split_back_across_the_batch() -> tvm.IRModule:
    """The dynamo form with the key's 3-D transpose (4, 16, 8) reshaped to (1, 2, 16, 16):
    the batched matmul broadcasts it, but it is not the key split back into heads.
    """
    q = relax.Var("q", relax.TensorType((2, 2, 8, 16), "float32"))
    k = relax.Var("k", relax.TensorType((2, 2, 8, 16), "float32"))
    v = relax.Var("v", relax.TensorType((2, 2, 16, 16), "float32"))
    k_t = relax.op.permute_dims(relax.op.reshape(k, (4, 8, 16)), [0, 2, 1])
    scores = relax.op.matmul(q, relax.op.reshape(k_t, (1, 2, 16, 16)) * relax.const(0.25))
    out = relax.op.matmul(relax.op.nn.softmax(scores), v)
    return from_expr(relax.op.permute_dims(out, [0, 2, 1, 3]))


def multi_query(dtype: str = "float32", frontend: str = "torch", shape: str = "static",
                scale: str = "product", mask: str = "padding",
                accumulate: str | None = None) -> tvm.IRModule:
    """Multi-query attention (Falcon, ONNX exports): the batched matmuls broadcast the
    single key/value head to the query's (torch's importer ``broadcast_to``-s it in 4-D).
    """
    return attention_block(dtype, frontend, shape, scale, mask, kv_heads=1, repeat="broadcast",
                           accumulate=accumulate)


def bloom(dtype: str = "float32", shape: str = "static", scale: str = "product",
          mask: str = "padding", alibi: bool = True, kv_heads: int = 2) -> tvm.IRModule:
    """Bloom's ``baddbmm``: the key merged to (B*N, T, H) and transposed in 3-D, the 3-D
    scores scaled, and its ALiBi bias (B*N, 1, T) added before they are split.
    """
    return attention_block(dtype, "torch", shape, scale, mask, kv_heads, key="merged",
                           alibi="heads" if alibi else None)


def falcon(dtype: str = "float32", shape: str = "static", scale: str = "product",
           mask: str = "padding", alibi: bool = True, regroup: bool = True,
           multi_query: bool = False, sdpa: bool = False,
           frontend: str = "torch") -> tvm.IRModule:
    """Falcon: ALiBi added to the 4-D scores before the scale, the scaled scores reshaped
    to (B*N, S, T) and back (``regroup``), one key/value head (``multi_query``), and its
    SDPA path (``sdpa``: the safe softmax on a boolean mask).
    """
    return attention_block(dtype, frontend, shape, scale, "boolean" if sdpa else mask,
                           kv_heads=1 if multi_query else 2,
                           repeat="broadcast" if multi_query else "repeat_kv",
                           safe_softmax="keys" if sdpa else None,
                           regroup="round_trip" if regroup else None,
                           alibi="before_scale" if alibi else None)


def t5(dtype: str = "float32", frontend: str = "torch", shape: str = "static",
       mask: str = "padding") -> tvm.IRModule:
    """T5: the relative position bias (1, N, S, T) and the mask, two additive terms."""
    return attention_block(dtype, frontend, shape, mask=mask, position_bias=True)


def onnx_on_heads(query_type: Any = None) -> tvm.IRModule:
    """The ONNX importer's attention on BNSH q and v and a BSNH k, expression-wise."""
    q = relax.Var("q", query_type or relax.TensorType((2, 2, 8, 16), "float32"))
    k = relax.Var("k", relax.TensorType((2, 8, 2, 16), "float32"))
    v = relax.Var("v", relax.TensorType((2, 2, 8, 16), "float32"))
    scores = relax.op.matmul(q, relax.op.permute_dims(k, [0, 2, 3, 1]))
    p = relax.op.nn.softmax(scores * relax.const(0.25))
    return from_expr(relax.op.permute_dims(relax.op.matmul(p, v), [0, 2, 1, 3]))


def key_grouped_by_batch_and_heads() -> tvm.IRModule:
    """The torch form with a key given as (B*N, 1, T, H): merged, the batched matmul takes
    it, but its 4-D view is not split into the query's batch and heads.
    """
    q = relax.Var("q", relax.TensorType((2, 2, 8, 16), "float32"))
    k = relax.Var("k", relax.TensorType((4, 1, 8, 16), "float32"))
    v = relax.Var("v", relax.TensorType((2, 2, 8, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            def merged(x, shape):
                return bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(x, x.ty.shape)),
                                                shape))

            k_t = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            scores = bb.emit(relax.op.matmul(merged(q, (4, 8, 16)), merged(k_t, (4, 16, 8))))
            scaled = bb.emit(relax.op.reshape(scores, (2, 2, 8, 8)) * relax.const(0.25))
            p = bb.emit(relax.op.nn.softmax(scaled))
            out = bb.emit(relax.op.matmul(merged(p, (4, 8, 8)), merged(v, (4, 8, 16))))
            heads = bb.emit(relax.op.reshape(out, (2, 2, 8, 16)))
            result = bb.emit_output(relax.op.permute_dims(heads, [0, 2, 1, 3]))
        bb.emit_func_output(result)
    return bb.get()


def merged_heads(dtype: str = "float32", shape: str = "static", mask: str = "none",
                 split_back: bool = True, scores_in: str | None = None) -> tvm.IRModule:
    """``torch.bmm`` / ``torch.baddbmm`` attention as older models write it and the torch
    importer emits it: q, k and v reshaped to (B*N, S, H), the scores, their softmax and
    the result kept 3-D, the result reshaped back into the heads (``split_back``; else
    into (B, S, N, H)).  ``mask``: ``"merged"``, a (B*N, S, T) bias input (baddbmm's);
    ``"causal"``, a constant (S, T) triangle of -1e4; ``"heads_4d"``, a (1, B*N, S, T)
    bias, which makes the sum and the rest 4-D; ``"zeros"``, baddbmm's zero input of
    the spellings' model; ``"none"``.  ``scores_in="float32"``: torch.export's float16
    ``baddbmm``, its operands and bias cast to float32, the scores rounded back before
    the softmax, the second matmul accumulated in float32 and cast back.
    """
    batch, seq, kv_len = example_dims(shape)
    heads, head_dim = 2, 16
    q = relax.Var("q", relax.TensorType((batch, heads, seq, head_dim), dtype))
    k, v = (relax.Var(name, relax.TensorType((batch, heads, kv_len, head_dim), dtype))
            for name in "kv")
    params = [q, k, v]
    bias: Any = None
    if mask in ("merged", "heads_4d"):
        bias = relax.Var("mask", relax.TensorType(
            (batch * heads, seq, kv_len) if mask == "merged"
            else (1, batch * heads, seq, kv_len), dtype))
        params.append(bias)
    elif mask == "causal":
        bias = relax.const(np.where(np.tril(np.ones((seq, kv_len), bool)), 0.0, -1e4)
                           .astype(dtype))
    wide = scores_in or dtype
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            def cast(x: relax.Expr) -> relax.Expr:
                return x if scores_in is None else bb.emit(relax.op.astype(x, scores_in))

            q3, k3, v3 = (bb.emit(relax.op.reshape(x, (batch * heads, rows, head_dim)))
                          for x, rows in ((q, seq), (k, kv_len), (v, kv_len)))
            if mask == "zeros":
                bias = bb.emit(relax.op.full((batch * heads, seq, kv_len),
                                             relax.const(0.0, dtype), dtype))
            k_t = bb.emit(relax.op.permute_dims(k3, [0, 2, 1]))
            scores = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(cast(q3), cast(k_t))),
                                               relax.const(np.array(0.25, wide))))
            if bias is not None:
                scores = bb.emit(relax.op.add(cast(bias), scores))
            if scores_in is not None:
                scores = bb.emit(relax.op.astype(scores, dtype))
            p = bb.emit(relax.op.nn.softmax(scores, axis=-1))
            if scores_in is None:
                out = bb.emit(relax.op.matmul(p, v3))
            else:
                out = bb.emit(relax.op.astype(bb.emit(relax.op.matmul(
                    p, v3, out_dtype=scores_in)), dtype))
            split = (batch, heads, seq, head_dim) if split_back else (batch, seq, heads,
                                                                        head_dim)
            result = bb.emit_output(relax.op.reshape(out, split))
        bb.emit_func_output(result)
    return bb.get()


def _departure(what: str, **choices: Any) -> Callable[[], tvm.IRModule]:
    def build() -> tvm.IRModule:
        return attention_block(**choices)

    build.__doc__ = what
    return build


#: The model forms the rule collapses, by name.
FORMS: dict[str, Callable[..., tvm.IRModule]] = {
    f.__name__: f for f in (torch_eager, onnx, sdpa, onnx_sdpa, widened_softmax, multi_query,
                            bloom, falcon, t5, merged_heads)}

#: One module per refusal of the rule, by the name its negative test case has.
REFUSALS: dict[str, Callable[[], tvm.IRModule]] = {
    "scale_not_a_scalar": _departure("a per-head tensor scale", scale="tensor"),
    "softmax_over_the_query_axis": _departure("softmax(axis=2)", softmax_axis=2),
    "mask_of_one_key": _departure("a (B, 1, S, 1) mask", mask="last_axis_one"),
    "mask_broadcasting_the_query_rows": _departure(
        "a (B, 1, T, T) mask broadcasting one query row", frontend="onnx", shape="decode",
        mask="square"),
    "mask_of_rank_5": _departure("a rank-5 mask", mask="rank5"),
    "k_not_transposed": _departure("q @ k with H = T", key="untransposed"),
    "v_from_a_different_head_split": _departure("the value split into 4 heads of 8",
                                                value_heads=4),
    "key_grouped_by_batch_and_heads": key_grouped_by_batch_and_heads,
    "single_key_head_broadcast_after_a_reshape": _departure(
        "the single key head moved onto the batch axis, then broadcast", frontend="onnx",
        kv_heads=1, repeat="misplaced"),
    "scores_split_into_sequence_first": _departure("scores split (B, S, N, T)",
                                                   split="scores"),
    "result_split_into_sequence_first": _departure("result split (B, S, N, H)",
                                                   split="output"),
    "float16_scores_accumulated_in_float32": _departure(
        "float16 scores accumulated in float32", dtype="float16", accumulate="float32"),
    "masked_fill_with_a_finite_value": _departure("masked_fill(-1e4)",
                                                  mask="masked_fill_finite"),
    "safe_softmax_over_the_query_axis": _departure("the safe softmax's test over the queries",
                                                   safe_softmax="queries"),
    "nan_guard_filling_one": _departure("the ONNX export's NaN guard filling 1",
                                        safe_softmax="nan_guard_one"),
    "scores_regrouped_into_sequence_first": _departure("scaled scores reshaped (B, S, N, T)",
                                                       regroup="scrambled"),
    "second_term_of_one_key": _departure("T5's second term of shape (B, 1, S, 1)",
                                         position_bias=True, mask="last_axis_one"),
    "softmax_run_in_float64": _departure("a float32 model's softmax(dtype=float64)",
                                         softmax_dtype="float64"),
    "merged_bias_over_the_queries": _departure("Bloom's bias of shape (B*N, S, 1)",
                                               key="merged", alibi="per_query"),
    "bias_before_the_scale_over_the_queries": _departure(
        "Falcon's bias of shape (B, N, S, 1)", alibi="before_scale_per_query"),
    "merged_bias_of_unknown_shape": _departure("Bloom's bias of unknown shape", key="merged",
                                               alibi="unknown"),
    "heads_folded_into_the_sequence": _departure("(B, N*S, H) against (B, N*T, H)",
                                                 key="folded", mask="none"),
    "query_of_unknown_shape": lambda: onnx_on_heads(relax.TensorType(ndim=4, dtype="float32")),
    "mask_of_rank_4_on_merged_scores": lambda: merged_heads(mask="heads_4d"),
    "merged_result_split_into_sequence_first": lambda: merged_heads(split_back=False),
    "scale_computed_per_head": _departure("sqrt(1 / sqrt(H)) on constants of shape "
                                          "(1, 2, 1, 1)", frontend="onnx",
                                          scale="computed_per_head"),
    "scale_computed_from_a_shape": _departure("sqrt(1 / sqrt(H)) with H read from a shape",
                                              frontend="onnx", scale="computed_from_a_shape"),
    "key_split_back_across_the_batch": key_split_back_across_the_batch,
    "float16_operands_cast_to_bfloat16": lambda: merged_heads(
        "float16", mask="zeros", scores_in="bfloat16"),
}


def _form(name: str, *products: dict[str, Sequence[Any]]) -> list[dict[str, Sequence[Any]]]:
    return [{"form": (name,), **product} for product in products]


_STATIC_MASKS = ("causal", "masked_fill", "masked_keep")  # constants: static shapes only

#: The rule's example space: the union of the forms' products (the first point of the
#: first is the default example: torch's eager attention with a padding mask).
SPACE: list[dict[str, Sequence[Any]]] = [
    *_form("torch_eager",
           {"dtype": DTYPES, "shape": ("static", "symbolic", "cross", "decode"),
            "scale": SCALES, "mask": ("padding", "none", "full"), "kv_heads": (2, 1),
            "accumulate": (None, "cast_back")},
           {"dtype": DTYPES, "shape": ("static", "cross", "decode"), "scale": SCALES,
            "mask": _STATIC_MASKS, "kv_heads": (2, 1), "accumulate": (None, "cast_back")}),
    *_form("onnx",
           {"dtype": DTYPES, "shape": ("static", "symbolic", "cross", "decode"),
            "scale": SCALES, "mask": ("padding", "none", "full"), "kv_heads": (2, 1),
            "accumulate": (None, "cast_back"), "recast": (False, True)},
           {"dtype": DTYPES, "shape": ("static", "cross"), "scale": SCALES,
            "mask": _STATIC_MASKS, "kv_heads": (2, 1), "recast": (False, True)}),
    *_form("sdpa",
           {"dtype": DTYPES, "shape": ("static", "symbolic", "cross"),
            "mask": ("boolean", "padding", "none"), "kv_heads": (2, 1)},
           {"dtype": DTYPES, "shape": ("static", "cross"), "mask": ("masked_fill",),
            "kv_heads": (2, 1)}),
    *_form("onnx_sdpa",
           {"dtype": DTYPES, "shape": ("static", "symbolic", "cross"),
            "exporter": ("torchscript", "dynamo"), "mask": ("none", "padding"),
            "kv_heads": (2, 1)}),
    *_form("widened_softmax",
           {"dtype": ("float16", "bfloat16"), "shape": ("static", "symbolic", "cross"),
            "mask": ("padding", "none"), "kv_heads": (2, 1)},
           {"dtype": ("float16", "bfloat16"), "shape": ("static", "cross"),
            "mask": ("causal",), "kv_heads": (2, 1)}),
    *_form("multi_query",
           {"dtype": DTYPES, "frontend": ("torch", "onnx"), "shape": ("static", "symbolic"),
            "scale": SCALES, "mask": ("padding", "none"), "accumulate": (None, "cast_back")},
           {"dtype": DTYPES, "frontend": ("torch", "onnx"), "mask": ("causal",),
            "scale": ("product", "key")}),
    *_form("bloom",
           {"dtype": DTYPES, "shape": ("static", "symbolic", "cross"),
            "scale": ("product", "divide", "query", "none"),
            "mask": ("padding", "none", "full"), "alibi": (True, False), "kv_heads": (2, 1)}),
    *_form("falcon",
           {"dtype": DTYPES, "shape": ("static", "symbolic"), "scale": ("product", "divide"),
            "mask": ("padding", "none"), "alibi": (True, False), "regroup": (True, False),
            "multi_query": (False, True), "sdpa": (False, True)},
           {"dtype": DTYPES, "frontend": ("onnx",), "scale": ("product", "divide"),
            "mask": ("causal", "padding"), "regroup": (False,)}),
    *_form("t5", {"dtype": DTYPES, "frontend": ("torch", "onnx"), "shape": ("static", "cross"),
                  "mask": ("padding", "none", "causal")}),
    *_form("merged_heads", {"dtype": DTYPES, "shape": ("static", "symbolic", "cross"),
                            "mask": ("none", "merged")},
           {"dtype": ("float16", "bfloat16"), "shape": ("static", "symbolic"),
            "mask": ("zeros", "merged", "none"), "scores_in": ("float32",)},
           {"dtype": DTYPES, "shape": ("static", "cross"), "mask": ("causal",)}),
    {"form": tuple(REFUSALS)},
]


def attention_example(form: str = "torch_eager", **knobs: Any) -> tvm.IRModule:
    """The module of the form or refusal ``form`` (a key of :data:`FORMS` or
    :data:`REFUSALS`) with ``knobs``.
    """
    build = FORMS.get(form) or REFUSALS.get(form)
    if build is None:
        raise ValueError(f"attention.collapse has no example form {form!r}: one of "
                         f"{', '.join([*FORMS, *REFUSALS])}")
    return build(**knobs)
