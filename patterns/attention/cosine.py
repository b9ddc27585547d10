"""``attention.cosine``: Swin v2's cosine attention becomes ``R.nn.attention`` with a bias.

Swin v2 scores normalised queries against normalised keys and multiplies the scores by
a learned scale per head, ``exp(clamp(logit_scale, max=log(100)))`` of shape
``(N, 1, 1)``, before its position bias (``16 * sigmoid(cpb_mlp(table))``) and the
shifted windows' mask.  ``R.nn.attention`` takes one scale for all heads, so the rule
folds the per-head scale into the query::

    softmax(q_n @ k_n^T * s[h] + b) @ v  ==  attention(q_n * s[h], k_n, v, b, scale=1)

``q_n`` and ``k_n`` are the model's normalised tensors, computed as before (the rewrite
reads them); the bias terms are summed into the op's bias as ``attention.collapse`` sums
them (:mod:`.masking`).  The identity is exact in real numbers; in floating point the
product ``q_n * s`` is rounded where the model rounds ``(q_n . k_n) * s``.  With unit
operands every score is at most ``s <= 100`` in size, so the difference stays within
a few ulps of the scores: :data:`FLOAT32` and :data:`FLOAT16` are what that costs on
the outputs.  This is why the rule insists on the normalisation (over the axis the score
matmul contracts): an un-normalised operand is not this form, and the collapse of plain
attention (``attention.collapse``) takes a scalar scale only.

Why ``attention.collapse`` did not take it: its pattern reads ``q_n = q / ||q||`` as a
query divided by a scale, and stops at ``q``, which the norm also reads, outside that
match ("intermediate ... is also used ... outside the match" in ``zoo:swinv2``'s log).
This rule's pattern (:mod:`.cosine_forms`) keeps the norm inside its match.

Refused, each with its reason: an operand normalised over another axis than the one
the score matmul contracts, a scale that varies along the query or key axis (not one
number per head), a softmax over another axis than the keys, tensors of more than one
dtype, bfloat16 (what the fold moves is as large as the outputs), a norm clamped by a
``call_tir`` of another PrimFunc than TOPI's maximum, a matmul accumulated in another
dtype than float32 before its cast back, scores of unknown shape, a windowed view that
does not split the batch into windows or a window mask that does not keep the view's
shape; the shapes, plumbing and biases are :mod:`.guards`' checks.  An operand without
the normalisation does not match (``patternkit explain`` reports the near miss).

Shifted windows: transformers adds their mask through a view of the scores, ``(B/W, W,
N, S, T) + mask[None, :, None]`` (twice), and undoes the view; each term becomes part of
the bias, broadcast to the view's ``(B/W, W, ., ., T)`` and merged back to ``(B, ., .,
T)``, which adds to score ``b = i * W + j`` what the view added to ``[i, j]``.

The ONNX doors: both exporters write ``F.normalize`` as ``ReduceL2`` (or ``Pow`` /
``ReduceSum`` / ``Sqrt``), ``Clip(min=eps)``, ``Expand``, ``Div``, which ``from_onnx``
imports as ``sqrt(sum(x * x))``, a ``call_tir`` of TOPI's ``maximum`` with the bound
``where(isnan(eps), -inf, eps)``, ``broadcast_to`` and ``divide``; the per-head scale and
the bias come as tensors (the dynamo exporter folds them to constants).  A float16 or
bfloat16 model imported by torch.export accumulates its batched matmuls in float32 and
casts them back (:mod:`patternkit.models.low_precision`): the matmul in that dtype; a
bfloat16 one computes ``F.normalize``'s norm in float32 between casts
(:mod:`patternkit.models.torch_converters`), the same norm.

Not covered: a scale varying along the queries (foldable into q row by row, but not
this form); bfloat16 (refused, :func:`.cosine_forms.measured_dtype`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from patternkit.dpl import DFPattern
from patternkit.engine import RewriteRule, RoleMatch, Tolerance
from patternkit.ir import static_shape, type_of

from . import guards
from .cosine_examples import REFUSALS, SPACE, cosine_block
from .cosine_forms import (
    CosineForms,
    cast_back,
    clamped_by_maximum,
    cosine_forms,
    known_shape,
    measured_dtype,
    normalised_over,
    one_dtype,
    per_head_scale,
    softmax_over_keys,
    window_terms,
)
from .layout import HEADS_FIRST, IDENTITY, KEY_FROM_TRANSPOSED, axes_of, compose, spelled_alike
from .masking import summed_bias
from .plan import AttentionPlan, BiasTerm, Operand

#: float32: the fold rounds ``q_n * s`` where the model rounds ``(q_n . k_n) * s``; with
#: unit operands and ``s <= 100`` the scores differ by a few ulps of 100: measured up to
#: 1.3e-5 on outputs up to 3 at the clamp (4.4e-6 at Swin's initial scale, 10).
FLOAT32 = Tolerance(2e-5, 2e-5, "the per-head scale is folded into q: scores up to the "
                                "scale (<= 100) rounded at another point, 1.3e-5 measured")
#: float16: scores up to the scale are rounded to float16 (ulp 0.0625 above 64) in both
#: forms at different points.  Measured on outputs up to 3 (3 seeds, inputs in [-3, 3]):
#: 0.027 apart at scale 10 and 0.11 at the clamp, 100 (|diff| / (1 + |out|) <= 0.077),
#: where each form is as far from a float32 reference (0.10 written out, 0.14 fused).
FLOAT16 = Tolerance(1e-1, 1e-1, "float16 scores up to the scale (<= 100, ulp 0.0625 above "
                                "64) rounded at other points: 0.11 measured at the clamp, "
                                "each form as far from float32")


@dataclass(frozen=True)
class CosinePlan:
    """``attention`` (scale 1) with its query multiplied by ``head_scale``, the model's
    scale tensor, whose shape made 4-D is ``(B|1, N|1, 1, 1)`` (``scale_rank`` axes
    before).
    """

    attention: AttentionPlan
    head_scale: Any
    scale_rank: int


class AttentionCosine(RewriteRule):
    """Collapse Swin v2's cosine attention into ``R.nn.attention``, its per-head scale
    folded into the normalised query, its position bias (and mask) the op's bias.
    """

    name = "attention.cosine"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.forms: CosineForms = cosine_forms()
        self.pattern: DFPattern = self.forms.root

    def roles(self) -> dict[str, DFPattern]:
        """The roles of :class:`~.cosine_forms.CosineForms`."""
        return self.forms.roles()

    # -- check -------------------------------------------------------------------------
    def check(self, match: RoleMatch) -> Any:
        """A :class:`CosinePlan` when the operands are normalised over the contracted axis,
        the scale is per head and the shapes, biases and softmax are attention's.
        """
        forms = self.forms
        q_axes, q_view = guards.operand_view(match, forms.q.operand)
        k_axes, k_view = guards.operand_view(match, forms.k.operand)
        v_axes, v_view = guards.operand_view(match, forms.v)
        batch, heads, seq, head_dim = q_view
        scores = (batch, heads, seq, k_view[3])
        guards.agree(match.k_normalised, "the key (transposed)", k_view,
                     (batch, heads, head_dim, None))
        guards.agree(match.v, "the value", v_view, (batch, heads, scores[3], None))
        guards.plumbing(match[forms.qk], q_view, k_view)
        guards.plumbing(match[forms.pv], scores, v_view)
        score_tensor = match[forms.scores]
        guards.agree(score_tensor, "the scores", known_shape(score_tensor, "the scores"),
                     scores)
        heads_out = match[forms.heads_out]
        guards.agree(heads_out, "the attention's result",
                     known_shape(heads_out, "the attention's result"),
                     (batch, heads, seq, v_view[3]))
        normalised_over(match, forms.q, q_axes[3], "the query")
        normalised_over(match, forms.k, k_axes[2], "the key")
        clamped_by_maximum(match, forms.q, "the query")
        clamped_by_maximum(match, forms.k, "the key")
        cast_back(match, forms.qk, forms.qk_cast, "the scores")
        cast_back(match, forms.pv, forms.pv_cast, "the weighted values")
        softmax_over_keys(match[forms.softmax])
        measured_dtype(one_dtype({"the query": match.q_normalised,
                                  "the key": match.k_normalised, "the value": match.v,
                                  "the scores": score_tensor, "the result": match.root}),
                       match.root)
        padded = per_head_scale(match.scale, scores)
        biases: list[BiasTerm] = []
        if match.tag("bias") in ("added", "masked", "windowed"):
            biases.append(guards.bias_term(match.position_bias, "the position bias", scores))
        if match.tag("bias") == "masked":
            biases.append(guards.bias_term(match.mask, "the mask", scores))
        if match.tag("bias") == "windowed":
            guards.agree(match.window_back, "the windowed scores viewed back",
                         known_shape(match.window_back, "the windowed scores viewed back"),
                         scores)
            view = static_shape(type_of(match.windowed))
            for mask, shape in window_terms(match, forms, scores):
                # (B/W, W, ., ., T): the term as the view adds it, then merged like the view
                assert view is not None  # window_terms refused an unknown view
                full = relax.op.broadcast_to(mask, (*view[:2], *shape[2:]))
                biases.append(BiasTerm(full, shape=(scores[0], *shape[2:])))
        out_call = match[forms.out] if match.tag("output") == "permuted" else None
        plan = AttentionPlan(
            query=Operand(match.var_of(forms.q.normalised), compose(q_axes, HEADS_FIRST)),
            key=Operand(match.var_of(forms.k.normalised), compose(k_axes, KEY_FROM_TRANSPOSED)),
            value=Operand(match.v, compose(v_axes, HEADS_FIRST)),
            biases=tuple(biases), scale=1.0,
            out_axes=(HEADS_FIRST if out_call is None
                      else compose(HEADS_FIRST, axes_of(out_call, 4))))
        scale_shape = static_shape(type_of(match.scale))
        assert scale_shape is not None and padded  # per_head_scale refused an unknown shape
        return CosinePlan(plan, match.scale, len(scale_shape))

    # -- rewrite -----------------------------------------------------------------------
    def rewrite(self, match: RoleMatch) -> Any:
        """``R.nn.attention(q_n * s, k_n, v, bias, scale=1)``, in the match's layout."""
        cosine: CosinePlan = match.plan
        plan = cosine.attention
        dtype = one_dtype({"the query": plan.query.expr})
        factor = cosine.head_scale
        if cosine.scale_rank < 4:
            factor = relax.op.expand_dims(factor, list(range(4 - cosine.scale_rank)))
        query = relax.op.multiply(plan.query.bsnh(),
                                  relax.op.permute_dims(factor, list(HEADS_FIRST)))
        out = relax.op.nn.attention(query, plan.key.bsnh(), plan.value.bsnh(),
                                    summed_bias(plan.biases, dtype), scale=plan.scale)
        if dtype != "float32":
            # TVM 0.27's llvm attention returns float32 for float16 operands (see
            # attention.collapse and docs/tvm-bugs.md): a no-op cast keeps the dtype
            out = relax.op.astype(out, dtype)
        if plan.out_axes != IDENTITY:
            out = relax.op.permute_dims(out, list(plan.out_axes))
        root_shape = static_shape(type_of(match.root))
        assert root_shape is not None  # the check proved the result's shape
        if not all(spelled_alike(a, b) for a, b in zip(plan.result_shape(), root_shape)):
            out = relax.op.reshape(out, root_shape)
        return out

    def tolerance(self, dtype: str | None) -> Tolerance:
        """:data:`FLOAT16` for float16 results, else :data:`FLOAT32`."""
        return FLOAT16 if dtype == "float16" else FLOAT32

    # -- self-check examples (tests and `patternkit verify`): see .cosine_examples --------
    def example(self, form: str = "swinv2", **knobs: Any) -> tvm.IRModule:
        """Swin v2's window attention (``form="swinv2"``) or a refusal of
        :data:`.cosine_examples.REFUSALS`, with the knobs of :func:`.cosine_block`.
        """
        if form != "swinv2" and form not in REFUSALS:
            raise ValueError(f"attention.cosine has no example form {form!r}: swinv2 or "
                             f"one of {', '.join(REFUSALS)}")
        return cosine_block(**{**REFUSALS.get(form, {}), **knobs})

    def example_space(self) -> list[dict[str, Sequence[Any]]]:
        """:data:`.cosine_examples.SPACE`."""
        return SPACE


__all__ = ["AttentionCosine", "CosinePlan", "FLOAT32", "FLOAT16"]
