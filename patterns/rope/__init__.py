"""Rotary position embeddings (RoPE) as composites for external compilers.

Recognises (:class:`RopeComposite`, one variant per form)::

    x1, x2 = x[..., :h], x[..., h:]                   # strided_slice of the last axis
    out = x * cos + concat(-x2, x1) * sin             # <compiler>.rope: Llama, Qwen, Mistral, NeoX

    even, odd = x[..., ::2], x[..., 1::2]             # interleaved (GPT-J)
    out = x * cos + stack(-odd, even, -1).flatten(-2) * sin     # <compiler>.rope_interleaved

as the torch importer writes them (``stack`` is ``expand_dims`` + ``concat`` +
``reshape``), the adds and multiplies with their operands either way round.  ``cos`` and
``sin`` are the composite's inputs wherever they come from (parameters, constants, or
computed in the graph from the positions and ``inv_freq``, as HF's rotary embedding
module and Qwen3 do): the query and the key rotations share one table, so neither
composite may take its computation, and a backend's rotary kernel (ONNX Runtime's
``RotaryEmbedding``, TensorRT-LLM's ``rope``) takes the tables as inputs too.

Guards, each a reason in the log: the concat joins along the last axis; its two parts are
the second half negated and the first half (the odd lanes negated and the even lanes,
interleaved), of an even, static number of lanes; ``cos`` and ``sin`` have one shape and
the result has ``x``'s; a partial rotation rotates lanes ``[0, r)`` and passes
``[r, end)`` through, concatenated in that order along the last axis; constant tables
are the cosine and sine of one angle (``cos^2 + sin^2 = 1`` to a few ulp).  Tables
given as inputs or computed are not inspected: their values are not known when the
composite is formed.  Shapes are read as the function proves them (:mod:`.lengths`):
``from_onnx`` gives the tables of a dynamic sequence a length of its own
(``range_len_0``, from the dynamo exporter's ``Range``) and the rotations unknown shapes;
the count it is matched from is evaluated, and where it is the sequence the composite
forms, else the refusal names the length.

With ``partial=True`` (``<compiler>.rope_partial``, ``<compiler>.rope_interleaved_partial``:
Phi, NeoX ``rotary_pct``, GPT-J's ``rotary_dim``) only ``x[..., :r]`` is rotated and
``x[..., r:]`` concatenated back after it; ``r`` is the composite's first slice.

Deliberately not covered yet: the ``split`` spelling of
the halves, a table scaled by ``attention_scaling`` after ``cos`` / ``sin``, and
function attributes naming the form (the composite's name says it).
"""

from .composite import RopeComposite as RopeComposite

__all__ = ["RULES", "COMPOSITES"]

#: The rewrite rules of this family: none.
RULES = ()

#: Pattern-table entries of this family: the partial rotations first (a table's earlier
#: entries win, and the full rotation's entry would take a partial one's rotated lanes
#: alone); the half and the interleaved forms match disjoint graphs.
COMPOSITES = (RopeComposite(partial=True), RopeComposite(interleaved=True, partial=True),
              RopeComposite(), RopeComposite(interleaved=True))
