"""The pattern of ``attention.collapse``, built once from tagged alternatives.

Each place where the models differ is an :func:`~patternkit.dpl.alt` with a tag, and the
check reads the form that matched by name (``match.tag("key_form") == "merged"``):

=================  ==========================================================================
tag                alternatives (tried in this order)
=================  ==========================================================================
``q_layout``       ``split`` (``permute_dims`` to BNSH), ``as_is``; also ``k_layout``,
                   ``v_layout`` (the key's split before its transpose or merge)
``q_scale``        ``product``, ``product_left``, ``quotient`` (by the constant ``q_scale``),
                   ``none``; also ``k_scale`` and ``scores_scale`` (the constant ``scale``)
``k_repeat``       ``merged`` / ``as_is`` (the 4-D view ``broadcast_to`` the query's heads,
                   then merged or not), ``none``; also ``v_repeat``
``key_form``       ``transposed`` (4-D), ``merged`` (Bloom: merged to 3-D, then transposed)
``k_transpose``    ``transposed`` (4-D), ``unmerged`` (the dynamo ONNX exporter: merged to
                   3-D, transposed, split back to 4-D)
``prescale_bias``  ``added`` (Falcon's ALiBi, before the scale), ``none``
``merged_bias``    ``added`` (Bloom's ALiBi, on the merged scores), ``none``
``mask_form``      ``added`` (``+ mask``), ``fill`` / ``keep`` (masked_fill), ``none``
``second_term``    ``added`` (T5: a second additive term), ``none``
``softmax_input``  ``scores``, ``widened`` (a cast to a wider dtype: float16/bfloat16 -> float32;
                   or back to the query's, of scores computed in float32)
``q_cast``         ``widened`` (the score matmul's operand cast to float32), ``as_is``; also
                   ``k_cast``
``probabilities``  ``safe`` (torch's SDPA), ``nan_guarded`` (its ONNX export with a bool
                   mask), ``recast``, ``cast`` (ONNX's no-op casts), ``plain``
``output``         ``permuted`` (back to BSNH), ``heads_first``
=================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import relax

from patternkit.dpl import DFPattern, alt, is_constant, is_op, through, wildcard

from .layout import OPERAND_PLUMBING
from .scale import ScaleSite, scale_pattern


def _scaled(tag: str, operand: DFPattern, unscaled: DFPattern,
            constant: DFPattern) -> DFPattern:
    """``operand * c``, ``c * operand``, ``operand / c`` or ``unscaled``, tagged ``tag``."""
    return alt(tag=tag, product=operand * constant, product_left=constant * operand,
               quotient=operand / constant, none=unscaled)


@dataclass(frozen=True)
class OperandForms:
    """The patterns of one operand: ``source [-> permute_dims...] [* scale]``, plumbed.

    ``source`` is the 4-D tensor (4-D only: otherwise the plumbing look-through of a 4-D
    matmul would take the reshape and broadcast_to of Llama's repeat_kv, and find a 5-D
    tensor inside); ``split`` its optional head split (``permute_dims``); for the key,
    ``transpose`` the required ``permute_dims`` after it, or (Bloom) ``merged``, a
    reshape to 3-D, and ``merged_transpose``; ``scale`` the constant of its scale; and
    ``repeat`` the torch importer's ``broadcast_to`` of a single head to the query's.
    ``plumbed`` is what the batched matmul takes.  ``name`` prefixes the tags.
    """

    name: str
    source: DFPattern
    split: DFPattern
    plumbed: DFPattern
    scale: DFPattern | None = None
    transpose: DFPattern | None = None
    merged: DFPattern | None = None
    merged_transpose: DFPattern | None = None
    repeat: DFPattern | None = None
    #: the key's 3-D transpose reshaped back to 4-D (the dynamo ONNX exporter)
    unmerged: DFPattern | None = None
    #: the parts of ``scale`` (a constant or arithmetic on constants, :mod:`.scale`)
    scale_site: ScaleSite | None = None


def _operand(name: str, key: bool = False, scaled: bool = True) -> OperandForms:
    source = wildcard().has_type(relax.TensorType(ndim=4, dtype="void"))
    split = is_op("permute_dims")(source)
    transpose = merged = merged_transpose = unmerged = None
    core: DFPattern
    if key:  # one permute_dims always, a head split before it maybe
        transpose = is_op("permute_dims")(alt(tag="k_layout", split=split, as_is=source))
        # Bloom merges batch and heads first and transposes the 3-D key after
        merged = is_op("reshape")(alt(tag="k_layout", split=split, as_is=source),
                                  varg_default_wildcard=True)
        merged_transpose = is_op("permute_dims")(merged)
        # the dynamo ONNX exporter splits that 3-D transpose back into 4-D (and scales it)
        unmerged = is_op("reshape")(merged_transpose, varg_default_wildcard=True)
        core = alt(tag="k_transpose", transposed=transpose, unmerged=unmerged)
    else:  # the query and value: their head split, if the match has it
        core = alt(tag=f"{name}_layout", split=split, as_is=source)
    site = scale_pattern() if scaled else None
    scale = None if site is None else site.root
    view = core if scale is None else _scaled(f"{name}_scale", core, core, scale)
    plumbed = through(view, OPERAND_PLUMBING)
    repeat = None
    if name != "q":
        # A key or value with one head (or batch) broadcast to the query's: the torch
        # importer's broadcast_to of the 4-D view (Falcon's multi-query key), which the
        # check tells apart from a broadcast after a reshape, which pairs other heads
        repeat = is_op("broadcast_to")(view, varg_default_wildcard=True)
        plumbed = alt(tag=f"{name}_repeat",
                      merged=is_op("reshape")(repeat, varg_default_wildcard=True),
                      as_is=repeat, none=plumbed)
    return OperandForms(name, source, split, plumbed, scale, transpose, merged,
                        merged_transpose, repeat, unmerged, site)


@dataclass(frozen=True)
class AttentionForms:
    """Every role of the pattern (:meth:`roles`), and the pattern (``root``)."""

    q: OperandForms
    k: OperandForms
    v: OperandForms
    qk: DFPattern
    prescale_bias: DFPattern
    scale: DFPattern
    scaled: DFPattern
    merged_bias: DFPattern
    pre_biased: DFPattern
    regrouped: DFPattern
    mask: DFPattern
    second_mask: DFPattern
    condition: DFPattern
    fill: DFPattern
    scores: DFPattern
    widened: DFPattern
    softmax: DFPattern
    cast: DFPattern
    recast: DFPattern
    row_test: DFPattern
    pv: DFPattern
    out: DFPattern
    root: DFPattern
    #: the parts of ``scale`` (:mod:`.scale`)
    scale_site: ScaleSite
    #: the casts of the score matmul's operands: the query's, the key's (4-D, merged)
    q_cast: DFPattern
    k_cast: DFPattern
    merged_cast: DFPattern
    #: the constant torch's ONNX exporter writes where the probabilities are NaN
    nan_fill: DFPattern

    def roles(self) -> dict[str, DFPattern]:
        """Role name -> pattern: the operands' sources by their names, and the rest."""
        found = {o.name: o.source for o in (self.q, self.k, self.v)}
        found.update({name: value for name, value in vars(self).items()
                      if isinstance(value, DFPattern) and name != "root"})
        return found


def attention_forms() -> AttentionForms:
    """The pattern, with its roles: ``softmax(q @ k^T * scale [+ mask]) @ v`` as written."""
    q, k, v = _operand("q"), _operand("k", key=True), _operand("v", scaled=False)
    # torch.export's float16 baddbmm casts its operands to float32 (guards.widened_operands)
    q_cast, k_cast, merged_cast = (is_op("astype")(p) for p in (q.plumbed, k.plumbed,
                                                                k.merged_transpose))
    qk = is_op("matmul")(
        alt(tag="q_cast", widened=q_cast, as_is=q.plumbed),
        alt(tag="key_form",
            transposed=alt(tag="k_cast", widened=k_cast, as_is=k.plumbed),
            merged=alt(tag="k_cast", widened=merged_cast, as_is=k.merged_transpose)))
    # a float16 matmul accumulated in float32 and cast back (TVM's ToMixedPrecision,
    # patternkit's torch import) is a matmul in float16
    scores = through(is_op("astype")(qk) | qk, ("reshape",), depth=1)
    # Falcon adds its ALiBi bias to the scores before it scales them
    prescale_bias = wildcard()
    biased = alt(tag="prescale_bias",
                 added=is_op("add")(scores, prescale_bias) | is_op("add")(prescale_bias, scores),
                 none=scores)
    scale_site = scale_pattern()
    scale = scale_site.root
    scaled = _scaled("scores_scale", biased, scores, scale)
    # Bloom adds its ALiBi bias to the (B*N, S, T) scores, before they are split
    merged_bias = wildcard()
    pre_biased = is_op("add")(scaled, merged_bias) | is_op("add")(merged_bias, scaled)
    # Falcon reshapes the scaled scores to (B*N, S, T) and straight back before the
    # mask: a chain of reshapes between two views of the scores is the identity
    regrouped = through(alt(tag="merged_bias", added=pre_biased, none=scaled), ("reshape",),
                        depth=2)
    mask, second_mask = wildcard(), wildcard()
    masked: DFPattern = is_op("add")(regrouped, mask) | is_op("add")(mask, regrouped)
    # T5: scores + position bias + mask, two additive terms
    masked = alt(tag="second_term",
                 added=is_op("add")(masked, second_mask) | is_op("add")(second_mask, masked),
                 none=masked)
    # masked_fill: where(cond, fill, scores) (torch's masked_fill(cond, fill)) or
    # where(cond, scores, fill) (keep where cond holds)
    condition, fill = wildcard(), is_constant()
    scores_masked = alt(tag="mask_form", added=masked,
                        fill=is_op("where")(condition, fill, regrouped),
                        keep=is_op("where")(condition, regrouped, fill), none=regrouped)
    # Llama's eager softmax(scores, dtype=float32) in a float16 model: collapsed when the
    # widening is one the fused op keeps (guards.widened_softmax)
    widened = is_op("astype")(scores_masked)
    softmax = is_op("nn.softmax")(alt(tag="softmax_input", scores=scores_masked,
                                      widened=widened))
    cast = is_op("astype")(softmax)
    # ``softmax(x, dtype=float32).to(float32)`` in an ONNX export: two no-op casts
    recast = is_op("astype")(cast)
    # torch's SDPA as torch.export writes it (``_safe_softmax``): a row whose scores
    # are all -inf gets probabilities 0, where softmax gives NaN
    live = is_op("logical_not")(is_op("equal")(scores_masked, float("-inf")))
    row_test = is_op("max")(is_op("astype")(live))
    row_masked = is_op("logical_not")(is_op("astype")(row_test))
    safe = is_op("where")(row_masked, is_op("full_like")(softmax, 0.0), softmax)
    # the same rows zeroed as torch's ONNX exporter writes SDPA with a bool mask: with q
    # and k finite a probability is NaN exactly on a row whose scores are all -inf
    nan_fill = is_constant()
    nan_guarded = is_op("where")(is_op("isnan")(softmax), nan_fill, softmax)
    probabilities = alt(tag="probabilities", safe=safe, nan_guarded=nan_guarded, recast=recast,
                        cast=cast, plain=softmax)
    pv = is_op("matmul")(through(probabilities, OPERAND_PLUMBING), v.plumbed)
    heads_out = through(is_op("astype")(pv) | pv, ("reshape",), depth=1)
    out = is_op("permute_dims")(heads_out)
    # The permute back to (B, S, N, Hv) first: the match rooted there wins, and an
    # attention whose result stays head-first (q, k, v given BNSH) matches without it.
    root = alt(tag="output", permuted=out, heads_first=heads_out)
    return AttentionForms(q, k, v, qk, prescale_bias, scale, scaled, merged_bias, pre_biased,
                          regrouped, mask, second_mask, condition, fill, scores_masked,
                          widened, softmax, cast, recast, row_test, pv, out, root, scale_site,
                          q_cast, k_cast, merged_cast, nan_fill)
