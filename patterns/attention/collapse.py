"""``attention.collapse``: written-out attention becomes ``R.nn.attention``.

The rule is short on purpose: the pattern is :mod:`.forms` (tagged alternatives, one per
way a model writes a step), the proofs are :mod:`.guards` (each refusal with its reason),
and what the check proved reaches the rewrite as an :class:`~.plan.AttentionPlan`, whose
bias terms are summed in one loop (:mod:`.masking`).  The family's docstring lists the
forms recognised and those deliberately not covered.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import tvm
from tvm import relax

from patternkit.dpl import DFPattern
from patternkit.engine import RewriteRule, RoleMatch, Tolerance, reject
from patternkit.ir import call_args, dtype_of, static_shape, type_of, var_name

from . import guards
from .examples import SPACE, attention_example
from .forms import AttentionForms, attention_forms
from .layout import (
    HEADS_FIRST,
    IDENTITY,
    KEY_FROM_TRANSPOSED,
    axes_of,
    compose,
    is_view,
    shape_text,
    spelled_alike,
)
from .masking import may_mask_a_whole_row, summed_bias, zero_masked_rows
from .plan import AttentionPlan, BiasTerm, Operand, tolerance_of

_LOG = logging.getLogger(__name__)

#: The probabilities' forms that give a fully masked row 0 where R.nn.attention gives NaN:
#: torch's safe softmax, and the NaN guard of its ONNX export.
ZEROED_ROWS = frozenset({"safe", "nan_guarded"})


class AttentionCollapse(RewriteRule):
    """Collapse ``softmax(q @ k^T * scale [+ mask]) @ v`` into ``R.nn.attention``.

    The forms the torch and ONNX importers write, with the scale on the scores, the query
    or the key (multiply or divide, or none), an optional additive mask (the bias) and
    grouped-query key/value repeats kept; see the family's docstring.
    """

    name = "attention.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.forms: AttentionForms = attention_forms()
        self.pattern: DFPattern = self.forms.root

    def roles(self) -> dict[str, DFPattern]:
        """The roles of :class:`~.forms.AttentionForms` (the pattern is built there)."""
        return self.forms.roles()

    # -- check -------------------------------------------------------------------------
    def check(self, match: RoleMatch) -> Any:
        """An :class:`AttentionPlan` when the shapes, axes, scale and mask are attention's."""
        forms = self.forms
        guards.widened_operands(match, forms)
        narrowed = guards.narrowed_scores(match, forms)
        widened = None if narrowed else guards.widened_softmax(match, forms)
        q_axes, q_view = guards.operand_view(match, forms.q)
        k_axes, k_view = guards.operand_view(match, forms.k)
        v_axes, v_view = guards.operand_view(match, forms.v)
        batch, heads, seq, head_dim = q_view
        kv_len, value_dim = k_view[3], v_view[3]
        scores = (batch, heads, seq, kv_len)
        guards.key_transposed(match, forms, k_axes)
        qk, pv = match[forms.qk], match[forms.pv]
        k_full, k_operand = guards.kv_broadcast(match, forms.k, k_view, (batch, heads), qk)
        v_full, v_operand = guards.kv_broadcast(match, forms.v, v_view, (batch, heads), pv)
        guards.plumbing(qk, q_view, k_operand)
        biases = self._biases(match, scores)
        guards.regrouped(match, forms, scores)
        guards.softmax_over_keys(match, forms, scores)
        guards.plumbing(pv, scores, v_operand)
        guards.agree(match.k, "the key (transposed)", k_full, (batch, heads, head_dim, None))
        guards.agree(match.v, "the value", v_full, (batch, heads, kv_len, None))
        guards.one_dtype(match, forms, narrowed is not None)
        out_call = match[forms.out] if match.tag("output") == "permuted" else None
        result = match.root if out_call is None else call_args(out_call)[0]
        heads_out = static_shape(type_of(result))
        if not is_view(heads_out, (batch, heads, seq, value_dim), merged=False):
            return reject(f"the attention's result has shape {shape_text(heads_out)}, not "
                          f"{shape_text((batch, heads, seq, value_dim))}: the batched "
                          f"matmul's result is not split back into the query's heads",
                          at=out_call)
        scale = 1.0
        for tag, site in (("q_scale", forms.q.scale_site), ("k_scale", forms.k.scale_site),
                          ("scores_scale", forms.scale_site)):
            assert site is not None  # the query and key are scaled (forms._operand)
            scale *= guards.scale_factor(match, tag, site)
        return AttentionPlan(
            query=Operand(match.q, compose(q_axes, HEADS_FIRST)),
            key=Operand(match.k, compose(k_axes, KEY_FROM_TRANSPOSED),
                        None if k_full is k_view else (batch, kv_len, heads, head_dim)),
            value=Operand(match.v, compose(v_axes, HEADS_FIRST),
                          None if v_full is v_view else (batch, kv_len, heads, value_dim)),
            biases=biases, scale=scale,
            out_axes=(HEADS_FIRST if out_call is None
                      else compose(HEADS_FIRST, axes_of(out_call, 4))),
            zero_masked_rows=match.tag("probabilities") in ZEROED_ROWS, softmax_dtype=widened,
            scores_dtype=narrowed)

    def _biases(self, match: RoleMatch, scores: tuple) -> tuple[BiasTerm, ...]:
        """The additive terms, in the order the rewrite sums them: the mask (or the
        masked_fill condition), Bloom's merged bias, T5's second term, Falcon's bias
        before the scale (times the scale).
        """
        forms, first, more = self.forms, [], []
        if match.tag("merged_bias") == "added":
            more.append(guards.merged_bias_term(match, forms, scores))
        # the mask is added where the scores are 4-D, or (the 3-D form) still merged
        site = static_shape(type_of(match[forms.regrouped]))

        def masked(expr: Any, what: str) -> BiasTerm:
            return guards.term_at(expr, what, scores, site,
                                  f"{what} added to the merged scores")

        mask_form = match.tag("mask_form")
        if mask_form == "added":
            first.append(masked(match.mask, "the mask"))
            if match.tag("second_term") == "added":
                more.append(masked(match.second_mask, "the second additive term"))
        elif mask_form in ("fill", "keep"):
            term = masked(match.condition, "the masked_fill condition")
            first.append(BiasTerm(term.expr, term.rank, term.shape,
                                  fill=guards.mask_fill(match, forms)))
        if match.tag("prescale_bias") == "added":
            scaled = match[forms.scaled]
            added = call_args(scaled)[1 if match.tag("scores_scale") == "product_left" else 0]
            term = guards.term_at(match.prescale_bias,
                                  "the bias added to the scores before the scale", scores,
                                  static_shape(type_of(added)),
                                  "the bias added to the merged scores before the scale")
            more.append(BiasTerm(term.expr, term.rank, term.shape, factor=guards.scale_factor(
                match, "scores_scale", forms.scale_site)))
        return (*first, *more)

    # -- rewrite -----------------------------------------------------------------------
    def rewrite(self, match: RoleMatch) -> Any:
        """``R.nn.attention`` on the plan's BSNH operands and summed bias, back in the
        match's layout and dtype.
        """
        plan: AttentionPlan = match.plan
        dtype = dtype_of(type_of(plan.query.expr))
        assert dtype is not None  # the query matched a tensor type (forms._operand)
        if plan.softmax_dtype is not None:
            tol = tolerance_of(dtype)
            _LOG.info("%s: the softmax at %s ran in %s between casts of %s scores; "
                      "R.nn.attention keeps it in %s on llvm (its float32 scale widens the "
                      "scores) but does not round the probabilities to %s: within %s of "
                      "the written-out form (%s)", self.name,
                      var_name(match.var_of(self.forms.softmax)), plan.softmax_dtype, dtype,
                      plan.softmax_dtype, dtype, tol, tol.why)
        if plan.scores_dtype is not None:
            tol = tolerance_of(dtype)
            _LOG.info("%s: the scores at %s were computed in %s from %s operands and "
                      "rounded to %s before the softmax; R.nn.attention computes in %s: "
                      "within %s of the written-out form (%s)", self.name,
                      var_name(match.var_of(self.forms.widened)), plan.scores_dtype, dtype,
                      dtype, dtype, tol, tol.why)
        bias = summed_bias(plan.biases, dtype)
        out = relax.op.nn.attention(plan.query.bsnh(), plan.key.bsnh(), plan.value.bsnh(),
                                    bias, scale=plan.scale)
        if dtype != "float32":
            # TVM 0.27's llvm legalisation of a float16 attention returns float32 (it
            # scales the scores by a float32 constant), and the next binary op with a
            # float16 operand then fails to build; the cast, a no-op in Relax, keeps the
            # model's dtype there (docs/tvm-bugs.md)
            out = relax.op.astype(out, dtype)
        if plan.zero_masked_rows and may_mask_a_whole_row(plan.biases):
            out = zero_masked_rows(out, bias, dtype)
        if plan.out_axes != IDENTITY:
            out = relax.op.permute_dims(out, list(plan.out_axes))
        # The check proved the shapes equal; a model may spell them differently
        # (``batch * 2 // 2`` against ``batch``), and a rewrite keeps the binding's type.
        root_shape = static_shape(type_of(match.root))
        # the check proved the heads-first result's shape; the root is it or its permute
        assert root_shape is not None
        if not all(spelled_alike(a, b) for a, b in zip(plan.result_shape(), root_shape)):
            out = relax.op.reshape(out, root_shape)
        return out

    def tolerance(self, dtype: str | None) -> Tolerance:
        """:data:`~.plan.FLOAT32`, :data:`~.plan.FLOAT16` or :data:`~.plan.BFLOAT16`."""
        return tolerance_of(dtype)

    # -- self-check examples (used by tests and `patternkit verify`): see .examples ------
    def example(self, form: str = "torch_eager", **knobs: Any) -> tvm.IRModule:
        """One attention block in the model form ``form`` (:data:`.examples.FORMS`)."""
        return attention_example(form, **knobs)

    def example_space(self) -> list[dict[str, Sequence[Any]]]:
        """The union of the real forms' knob products (:data:`.examples.SPACE`)."""
        return SPACE
