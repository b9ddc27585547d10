"""Gated MLPs (SwiGLU, GeGLU) as composites for external compilers.

Recognises (:class:`GatedMlpComposite`, one variant per activation and weight layout)::

    g = x @ Wg [+ bg]          # each nn.Linear as the torch importer writes it:
    u = x @ Wu [+ bu]          #   permute_dims(W) of an (out, in) weight, or W read directly,
    h = act(g) * u             #   reshape of x to 2-D and of the product back, if x is 3-D

with ``act`` one of ``nn.silu`` (``<compiler>.swiglu``: Llama, Mistral, Qwen),
``nn.gelu`` (``<compiler>.geglu``) or ``nn.gelu_tanh`` (``<compiler>.geglu_tanh``:
Gemma), the multiply's operands either way round, and, for the ``..._packed`` variants,
one projection of twice the width split in two (``g, u = linear(x).chunk(2, -1)``:
Phi-3, TensorRT-LLM's ``fuse_swiglu`` layout; the halves either way round, items of the
``split`` or two ``strided_slice`` of the last axis, as the TorchScript ONNX exporter
writes ``chunk``).  The
composite takes both projections, the activation and the multiply, and leaves the down
projection to the matmul composites.  It runs after ``silu.collapse`` / ``gelu.collapse``
(the written-out ``x * sigmoid(x)`` the importer emits becomes ``nn.silu`` first) and
before the matmul family's composites, which would otherwise take the gate's
``matmul -> silu``.

Guards, each a reason in the log: a weight's ``permute_dims`` that does not swap its last
two axes; an added tensor that is not a per-feature bias; a multiply that broadcasts; a
packed projection split into other than two equal halves of its last axis, or whose one
half is both the gate and the up product; slices that are not the two halves of the last
axis, or a gate and an up product cut two different ways.

A float16 / bfloat16 MLP as torch.export writes it is taken too: each matmul accumulated in
float32 (``out_dtype``) and cast back to the input's dtype, the activation computed in
float32 between casts.  Refused: a product cast to another dtype than the input's, an
activation whose casts are no round trip through a float at least as wide.

Deliberately not covered: a multiply by ``x @ Wu`` computed from another input than the
gate's.
"""

from .composite import GatedMlpComposite as GatedMlpComposite, gated_mlp_table

__all__ = ["RULES", "COMPOSITES"]

#: The rewrite rules of this family: none (the composites take the activations' collapses).
RULES = ()

#: Pattern-table entries of this family (:func:`gated_mlp_table`).
COMPOSITES = tuple(gated_mlp_table())
