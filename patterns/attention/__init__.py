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
masked; the bias is reshaped to ``(B, N, 1, T)`` and summed with the mask.  The 3-D form
(``torch.bmm`` / ``torch.baddbmm`` over ``(B*N, S, H)``, as older Hugging Face models
write attention) keeps the scores merged through the softmax and the second ``bmm``: the
softmax of the ``(B*N, S, T)`` scores over their last axis is the 4-D scores' softmax
row for row, a mask added there (baddbmm's ``(B*N, S, T)`` input, an ``(S, T)``
triangle) is reshaped to ``(B, N, S|1, T)``, and the form is taken only when the result
is reshaped back into ``(B, N, S, Hv)`` (refused otherwise, with that reason).  Falcon's
ALiBi is added to the 4-D scores *before* the scale: ``(scores + a) * c`` becomes the
bias ``a * c`` (any mask-shaped ``a``), summed with the mask; with a power-of-two ``c``
and a 0 / -inf mask the sums round as the model's do.  T5 adds two terms to the scores
(its relative position bias, then the mask); they are summed too.

The scale is a one-element constant multiplying (either operand order) or dividing the
scores, the query or the transposed key; several of them multiply (a model scaling both
q and k by ``H**-0.25``, as both ONNX exporters write torch's SDPA).  A scale computed
from one-element constants at run time (the TorchScript exporter's ``sqrt(cast(1 /
sqrt(H)))``, kept as bindings by ``from_onnx``) is evaluated (:mod:`.scale`).  The
dynamo exporter transposes SDPA's key in 3-D (batch and heads merged) and reshapes it
back to 4-D before scaling it; that split back is taken when it restores the heads.
Without a scale the scale is 1 (``R.nn.attention``'s default would be ``1/sqrt(H)``, so
the rule always passes it).  The additive mask is any tensor that
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
torch's ONNX export of SDPA with a bool mask writes the same zeroing as a NaN guard on the
probabilities, ``where(isnan(p), 0, p)`` (with q and k finite a probability is NaN exactly
on such a row): collapsed the same way; a guard that fills another value than 0 is
refused with the value.

A softmax computed in float32 between two casts of float16 or bfloat16 scores (Hugging
Face's ``softmax(scores, dtype=torch.float32).to(query.dtype)``: Llama, Qwen3, ViT in half
precision) is collapsed too: the fused op keeps the softmax in float32 (TVM 0.27's llvm
legalisation multiplies the scores by its float32 scale first; flash-attention kernels
accumulate it in float32) and does not round the probabilities back; the result stays
within the dtype's tolerance (:mod:`.plan`), and the rule logs, at INFO on this module's
logger, the softmax's binding, its precision and that tolerance.  Any other widening (a
float32 model's softmax in float64) is refused with the dtypes named.  The converse, the
scores computed in float32 and rounded to float16 or bfloat16 before the softmax
(``torch.export``'s float16 ``baddbmm``: its operands and bias cast to float32), is
collapsed in the model's dtype, within the same tolerance and logged alike; a cast of an
operand that is not such a widening is refused.

The decomposed einsum spelling (``torch.einsum("bhqd,bhkd->bhqk", q, k)`` through
``torch.export``: ``expand_dims``, permutes and reshapes around 3-D matmuls) is rewritten
to the 4-D matmuls it computes first (:mod:`.einsum`, ``attention.einsum_matmul``), which
this rule then takes.

A float16 result is cast back to float16 (a no-op in Relax): TVM 0.27's llvm legalisation
of a float16 ``R.nn.attention`` returns float32, and the next op with a float16 operand
would not build (docs/tvm-bugs.md).

Deliberately not covered:

* causal masks turned into ``causal_mask="TopLeft"`` in the library: the opt-in
  ``attention.causal_mask`` (:mod:`.causal_mask`) proves the triangle and does it, but
  TVM 0.27's llvm causal attention gives NaN on a row whose kept scores all lie below
  about -88, where the bias gives the softmax; dropout between the softmax and the second
  matmul (training graphs), packed QKV layouts (BS3NH) and variable-length batches.

Layout of the family (each module says why it exists): :mod:`.forms` (the pattern, from
tagged alternatives), :mod:`.guards` (the refusals), :mod:`.plan` (what the check hands
the rewrite), :mod:`.layout` and :mod:`.masking` (the permutation and bias algebra),
:mod:`.causal` (``causal_mask`` and ``window_size`` as a bias, for the expansion),
:mod:`.scale` (the scale's constant arithmetic), :mod:`.collapse`, :mod:`.einsum`,
:mod:`.expand` and :mod:`.composite` (the rules),
:mod:`.examples` (one builder per model form and per refusal, written by
:mod:`.written_out`).
"""

from __future__ import annotations

from .causal_mask import AttentionCausalMask
from .collapse import AttentionCollapse
from .composite import AttentionComposite
from .cosine import AttentionCosine
from .einsum import EinsumMatmul
from .expand import AttentionExpand

#: The rewrite rules of this family: torch's decomposed einsums become the 4-D matmuls
#: that the collapse reads.  ``AttentionCausalMask`` (``attention.causal_mask``) is
#: opt-in, not here: see :mod:`.causal_mask` for the llvm rows where it changes results.
RULES = (EinsumMatmul, AttentionCosine, AttentionCollapse)

#: Expand rules, for :data:`patternkit.patterns.EXPANSIONS` (never with the collapse).
EXPANSIONS = (AttentionExpand,)

#: Pattern-table entries of this family: the bias form first (the two ops differ, so the
#: order only fixes how the table lists them).
COMPOSITES = (AttentionComposite("byoc", bias=True), AttentionComposite("byoc"))

__all__ = ["RULES", "EXPANSIONS", "COMPOSITES", "AttentionCausalMask"]
