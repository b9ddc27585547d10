"""rope: rotary position embeddings (half rotation, interleaved) form composites."""

from __future__ import annotations

import pytest
import tvm
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.byoc import composite_functions, merge_composite
from patternkit.patterns import LIBRARY
from patternkit.patterns.rope import RopeComposite
from patternkit.patterns.rope.examples import rotary
from patternkit.patterns.rope.lengths import bind_proven_lengths, proven_lengths
from patternkit.testing import EXACT, Negative, RuleCase, apply_rule, check_rule


@I.ir_module
class HalfRotation:
    """Llama's ``q * cos + rotate_half(q) * sin`` as the torch importer writes it."""

    @R.function
    def main(q: R.Tensor(("n", 4, "s", 8), "float32"), cos: R.Tensor((1, 1, "s", 8), "float32"),
             sin: R.Tensor((1, 1, "s", 8), "float32")) -> R.Tensor(("n", 4, "s", 8), "float32"):
        with R.dataflow():
            qc = R.multiply(q, cos)
            q1 = R.strided_slice(q, (3,), (0,), (4,), (1,), assume_inbound=False)
            q2 = R.strided_slice(q, (3,), (4,), (9223372036854775807,), (1,),
                                 assume_inbound=False)
            nq2 = R.negative(q2)
            rot = R.concat((nq2, q1), axis=-1)
            rs = R.multiply(rot, sin)
            out = R.add(qc, rs)
            R.output(out)
        return out


#: A ``main({x}, cos, sin)`` that is one call of the composite ``byoc.{name}``
#: (``PartitionedFromPattern`` ``{ops}``) on the rotated tensor ``{x}`` of ``{lanes}`` lanes
#: and rotary tables of 8 lanes; ``{body}`` is the composite's bindings on ``{x}1_``,
#: ``cos1`` and ``sin1``, ending in ``R.output(out1)``.
ROPE_COMPOSITE = """
@I.ir_module
class Module:
    @R.function
    def main({x}: R.Tensor(("n", 4, "s", {lanes}), "float32"),
             cos: R.Tensor((1, 1, "s", 8), "float32"), sin: R.Tensor((1, 1, "s", 8), "float32"),
             ) -> R.Tensor(("n", 4, "s", {lanes}), "float32"):
        n = T.int64()
        s = T.int64()
        with R.dataflow():
            @R.function
            def composite({x}1_: R.Tensor((n, 4, s, {lanes}), "float32"),
                          sin1: R.Tensor((1, 1, s, 8), "float32"),
                          cos1: R.Tensor((1, 1, s, 8), "float32"),
                          ) -> R.Tensor((n, 4, s, {lanes}), "float32"):
                R.func_attr({{"Composite": "byoc.{name}", "PartitionedFromPattern": "{ops}"}})
                with R.dataflow():
{body}
                return out1

            out = composite({x}, sin, cos)
            R.output(out)
        return out
"""


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.strip().splitlines())


def rope_composite(name: str, ops: str, body: str, x: str = "q",
                   lanes: int = 8) -> tvm.IRModule:
    """:data:`ROPE_COMPOSITE` with its fields filled in (``body`` unindented)."""
    return tvm.script.from_source(ROPE_COMPOSITE.format(
        name=name, ops=ops, body=_indent(body, 20), x=x, lanes=lanes))


HalfRotationComposite = rope_composite(
    "rope", "multiply_Tuple_Tuple_Tuple_Tuple_strided_slice_negative_Tuple_Tuple_Tuple_Tuple_"
    "strided_slice_Tuple_concatenate_multiply_add_", """
qc = R.multiply(q1_, cos1)
q1 = R.strided_slice(q1_, (3,), (0,), (4,), (1,), assume_inbound=False)
q2 = R.strided_slice(q1_, (3,), (4,), (9223372036854775807,), (1,), assume_inbound=False)
nq2 = R.negative(q2)
rot = R.concat((nq2, q1), axis=-1)
rs = R.multiply(rot, sin1)
out1 = R.add(qc, rs)
R.output(out1)
""")


@I.ir_module
class Interleaved:
    """GPT-J's rotation of lane pairs: ``stack(-q[..., 1::2], q[..., ::2], -1).flatten(-2)``."""

    @R.function
    def main(q: R.Tensor(("n", 4, "s", 8), "float32"), cos: R.Tensor((1, 1, "s", 8), "float32"),
             sin: R.Tensor((1, 1, "s", 8), "float32")) -> R.Tensor(("n", 4, "s", 8), "float32"):
        n = T.int64()
        s = T.int64()
        with R.dataflow():
            even = R.strided_slice(q, (3,), (0,), (9223372036854775807,), (2,),
                                   assume_inbound=False)
            odd = R.strided_slice(q, (3,), (1,), (9223372036854775807,), (2,),
                                  assume_inbound=False)
            nodd = R.negative(odd)
            a = R.expand_dims(nodd, axis=[4])
            b = R.expand_dims(even, axis=[4])
            pairs = R.concat((a, b), axis=-1)
            rot = R.reshape(pairs, R.shape([n, 4, s, 8]))
            qc = R.multiply(q, cos)
            rs = R.multiply(rot, sin)
            out = R.add(qc, rs)
            R.output(out)
        return out


InterleavedComposite = rope_composite(
    "rope_interleaved", "multiply_Tuple_Tuple_Tuple_Tuple_strided_slice_negative_expand_dims_"
    "Tuple_Tuple_Tuple_Tuple_strided_slice_expand_dims_Tuple_concatenate_reshape_multiply_add_",
    """
even = R.strided_slice(q1_, (3,), (0,), (9223372036854775807,), (2,), assume_inbound=False)
odd = R.strided_slice(q1_, (3,), (1,), (9223372036854775807,), (2,), assume_inbound=False)
nodd = R.negative(odd)
a = R.expand_dims(nodd, axis=[4])
b = R.expand_dims(even, axis=[4])
pairs = R.concat((a, b), axis=-1)
rot = R.reshape(pairs, R.shape([n, 4, s, 8]))
qc = R.multiply(q1_, cos1)
rs = R.multiply(rot, sin1)
out1 = R.add(qc, rs)
R.output(out1)
""")


@I.ir_module
class LanesUnknown:
    """A rotation of a tensor whose lane count is symbolic: its halves cannot be checked."""

    @R.function
    def main(q: R.Tensor(("n", 4, "s", "d"), "float32"), cos: R.Tensor((1, 1, "s", "d"), "float32"),
             sin: R.Tensor((1, 1, "s", "d"), "float32")):
        with R.dataflow():
            qc = R.multiply(q, cos)
            q1 = R.strided_slice(q, (3,), (0,), (4,), (1,), assume_inbound=False)
            q2 = R.strided_slice(q, (3,), (4,), (9223372036854775807,), (1,),
                                 assume_inbound=False)
            nq2 = R.negative(q2)
            rot = R.concat((nq2, q1), axis=-1)
            rs = R.multiply(rot, sin)
            out = R.add(qc, rs)
            R.output(out)
        return out


@I.ir_module
class RankOnly:
    """A rotation of a tensor whose rank is known and its shape not (``from_onnx`` writes
    such a tensor where broadcasting against an unrelated length lost the shape).
    """

    @R.function
    def main(q: R.Tensor(ndim=4, dtype="float32"), cos: R.Tensor(ndim=4, dtype="float32"),
             sin: R.Tensor(ndim=4, dtype="float32")):
        with R.dataflow():
            qc = R.multiply(q, cos)
            q1 = R.strided_slice(q, (3,), (0,), (4,), (1,), assume_inbound=False)
            q2 = R.strided_slice(q, (3,), (4,), (9223372036854775807,), (1,),
                                 assume_inbound=False)
            rot = R.concat((R.negative(q2), q1), axis=-1)
            out = R.add(qc, R.multiply(rot, sin))
            R.output(out)
        return out


@I.ir_module
class RankUnknown:
    """The same rotation of a tensor whose rank is unknown too."""

    @R.function
    def main(q: R.Tensor(dtype="float32"), cos: R.Tensor(dtype="float32"),
             sin: R.Tensor(dtype="float32")):
        with R.dataflow():
            qc = R.multiply(q, cos)
            q1 = R.strided_slice(q, (3,), (0,), (4,), (1,), assume_inbound=False)
            q2 = R.strided_slice(q, (3,), (4,), (9223372036854775807,), (1,),
                                 assume_inbound=False)
            rot = R.concat((R.negative(q2), q1), axis=-1)
            out = R.add(qc, R.multiply(rot, sin))
            R.output(out)
        return out


NOT_COS = ("the constant tables are not the cosine and sine of one angle: cos^2 + sin^2 "
           "differs from 1 by up to")
TABLES_DISAGREE = ("cos of shape (1, 1, seq, 8) and sin of shape (1, 2, seq, 8) do not both "
                   "broadcast to the rotated tensor's shape (batch, 2, seq, 8): a rotary table "
                   "has one angle per lane")

HALF_CASE = RuleCase(
    RopeComposite(), HalfRotation, HalfRotationComposite,
    negatives=[
        Negative("first_half_negated", rotary(halves="swapped"),
                 "the concat puts back axis 3 [0:4:1] negated and axis 3 "
                 "[4:9223372036854775807:1] of the rotated tensor's 8 lanes: rotate_half is "
                 "lanes [4, 8) negated and lanes [0, 4) kept"),
        Negative("halves_of_three_and_five_lanes", rotary(halves="uneven"),
                 "the concat puts back axis 3 [3:9223372036854775807:1] negated and axis 3 "
                 "[0:3:1] of the rotated tensor's 8 lanes"),
        Negative("concat_along_the_sequence", rotary(concat_axis=-2, symbolic=False),
                 "the concat joins along axis -2 of a rank-4 tensor: rotate_half concatenates "
                 "along the last axis"),
        Negative("tables_of_two_shapes", rotary(table_shape="per_head_mismatch"),
                 TABLES_DISAGREE),
        Negative("lane_count_unknown", LanesUnknown,
                 "the rotated tensor's last dimension is not static: the rotation's halves "
                 "cannot be checked"),
        Negative("multiplied_by_tanh_not_cos", rotary(tables="not_cos", symbolic=False),
                 NOT_COS),
        Negative("shape_unknown_but_rank_known", RankOnly,
                 "the rotated tensor's last dimension is not static: the rotation's halves "
                 "cannot be checked"),
        Negative("rank_unknown", RankUnknown,
                 "the concat joins along axis -1 of a tensor of unknown rank: rotate_half "
                 "concatenates along the last axis"),
        Negative("positions_ranged_over_the_batch", rotary(tables="ranged_over_batch"),
                 "cos of shape (batch, 8) and sin of shape (batch, 8) do not both broadcast "
                 "to the rotated tensor's shape (batch, 2, seq, 8)"),
        Negative("range_counted_in_float16", rotary(tables="ranged_through_float16"),
                 "cos of shape (range_len_0, 8) and sin of shape (range_len_0, 8) do not both "
                 "broadcast to the rotated tensor's shape (batch, 2, seq, 8): a rotary table "
                 "has one angle per lane (range_len_0: a length the function computes and "
                 "does not prove equal to a dimension of the rotated tensor)"),
    ],
    tolerance=EXACT)

INTERLEAVED_CASE = RuleCase(
    RopeComposite(interleaved=True), Interleaved, InterleavedComposite,
    negatives=[
        Negative("even_lanes_negated", rotary(interleaved=True, halves="swapped"),
                 "the concat puts back axis 3 [0:9223372036854775807:2] negated and axis 3 "
                 "[1:9223372036854775807:2] of the rotated tensor's 8 lanes: rotate_half is "
                 "the odd lanes negated and the even lanes kept, stride 2"),
        Negative("tables_of_two_shapes", rotary(interleaved=True,
                                                table_shape="per_head_mismatch"),
                 TABLES_DISAGREE),
        Negative("half_rotation_is_not_interleaved", HalfRotation,
                 "no match: reshape(concat((expand_dims(…, ...), expand_dims(…, ...))), ...)"),
    ],
    tolerance=EXACT)


#: Phi's partial rotation (rotary_dim 8 of 16 lanes), its body shared by before and
#: expected; ``{rotation}`` rotates ``kr`` into ``rot`` (half or interleaved form).
PARTIAL_BODY = """
kr = R.strided_slice({k}, (3,), (0,), (8,), (1,), assume_inbound=False)
kp = R.strided_slice({k}, (3,), (8,), (9223372036854775807,), (1,), assume_inbound=False)
{rotation}
kc = R.multiply(kr, {cos})
rs = R.multiply(rot, {sin})
emb = R.add(kc, rs)
{out} = R.concat((emb, kp), axis=-1)
R.output({out})
"""

HALF_LINES = """
k1 = R.strided_slice(kr, (3,), (0,), (4,), (1,), assume_inbound=False)
k2 = R.strided_slice(kr, (3,), (4,), (9223372036854775807,), (1,), assume_inbound=False)
rot = R.concat((R.negative(k2), k1), axis=-1)
"""

PAIR_LINES = """
even = R.strided_slice(kr, (3,), (0,), (9223372036854775807,), (2,), assume_inbound=False)
odd = R.strided_slice(kr, (3,), (1,), (9223372036854775807,), (2,), assume_inbound=False)
pairs = R.concat((R.expand_dims(R.negative(odd), axis=[4]), R.expand_dims(even, axis=[4])),
                 axis=-1)
rot = R.reshape(pairs, R.shape([n, 4, s, 8]))
"""

PARTIAL = """
@I.ir_module
class Module:
    @R.function
    def main(k: R.Tensor(("n", 4, "s", 16), "float32"), cos: R.Tensor((1, 1, "s", 8), "float32"),
             sin: R.Tensor((1, 1, "s", 8), "float32")) -> R.Tensor(("n", 4, "s", 16), "float32"):
        n = T.int64()
        s = T.int64()
        with R.dataflow():
{body}
        return out
"""

#: PartitionedFromPattern of the two partial composites (the ops in pattern order).
_SLICE = "Tuple_Tuple_Tuple_Tuple_strided_slice_"
PARTIAL_OPS = {
    False: (f"{_SLICE}multiply_{_SLICE}negative_{_SLICE}Tuple_concatenate_multiply_add_"
            f"{_SLICE}Tuple_concatenate_"),
    True: (f"{_SLICE}multiply_{_SLICE}negative_expand_dims_{_SLICE}expand_dims_Tuple_"
           f"concatenate_reshape_multiply_add_{_SLICE}Tuple_concatenate_"),
}


def _partial(interleaved: bool, composite: bool):
    rotation = (PAIR_LINES if interleaved else HALF_LINES).strip()
    names = (dict(k="k1_", cos="cos1", sin="sin1", out="out1") if composite
             else dict(k="k", cos="cos", sin="sin", out="out"))
    body = PARTIAL_BODY.strip().format(rotation=rotation, **names)
    if not composite:
        return tvm.script.from_source(PARTIAL.format(body=_indent(body, 12)))
    name = "rope_interleaved_partial" if interleaved else "rope_partial"
    return rope_composite(name, PARTIAL_OPS[interleaved], body, x="k", lanes=16)


def _partial_negatives(interleaved: bool) -> list[Negative]:
    lanes_unknown = PARTIAL.format(body=_indent(PARTIAL_BODY.strip().format(
        rotation=(PAIR_LINES if interleaved else HALF_LINES).strip(), k="k", cos="cos",
        sin="sin", out="out"), 12)).replace('k: R.Tensor(("n", 4, "s", 16), "float32")',
                                            'k: R.Tensor(("n", 4, "s", "d"), "float32")')
    return [
        Negative("lanes_of_the_whole_tensor_unknown", tvm.script.from_source(lanes_unknown),
                 "the partially rotated tensor's last dimension is not static: the rotated "
                 "and the passed lanes cannot be checked"),
        Negative("passed_lanes_overlap_the_rotated_ones",
                 rotary(interleaved=interleaved, rotary_dim=4, passed="overlapping"),
                 "the partial rotation rotates axis 3 [0:4:1] and passes axis 3 "
                 "[3:9223372036854775807:1] through, joined along axis -1: a partial rotary "
                 "embedding rotates lanes [0, r) of the last axis and concatenates lanes "
                 "[r, end) after them"),
        Negative("first_lanes_swapped", rotary(interleaved=interleaved, rotary_dim=4,
                                               halves="swapped"),
                 "negated and axis 3 [")]


PARTIAL_CASE = RuleCase(RopeComposite(partial=True), _partial(False, False), _partial(False, True),
                        negatives=_partial_negatives(False), tolerance=EXACT)
INTERLEAVED_PARTIAL_CASE = RuleCase(
    RopeComposite(interleaved=True, partial=True), _partial(True, False), _partial(True, True),
    negatives=_partial_negatives(True), tolerance=EXACT)


def test_partial_rope_composite_meets_the_rule_contract():
    check_rule(PARTIAL_CASE)


def test_interleaved_partial_rope_composite_meets_the_rule_contract():
    check_rule(INTERLEAVED_PARTIAL_CASE)


def test_the_library_takes_a_partial_rotation_whole():
    for interleaved in (False, True):
        merged = merge_composite(rotary(interleaved=interleaved, rotary_dim=4),
                                 LIBRARY.composites())
        names = [str(f.attrs["Composite"]) for _, f in composite_functions(merged)]
        assert names == [RopeComposite(interleaved=interleaved, partial=True).rule_name]


def test_rope_composite_meets_the_rule_contract():
    check_rule(HALF_CASE)


def test_interleaved_rope_composite_meets_the_rule_contract():
    check_rule(INTERLEAVED_CASE)


FORMS = [dict(), dict(order="rotated_first"), dict(tables="computed"),
         dict(tables="constants", symbolic=False)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("knobs", FORMS, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_every_form_forms_one_composite_computing_what_its_region_computed(knobs, interleaved,
                                                                          dtype):
    before = rotary(interleaved=interleaved, dtype=dtype, **knobs)
    rule = RopeComposite(interleaved=interleaved)
    applied = apply_rule(rule, before)
    assert applied.fired == 1
    names = [str(f.attrs["Composite"]) for _, f in composite_functions(applied.module)]
    assert names == [rule.rule_name]
    pk.assert_same_numerics(before, applied.module, shape_vars={"batch": 2, "seq": 3},
                            rtol=0, atol=0)


def test_computed_tables_stay_outside_so_q_and_k_sharing_them_both_form_composites():
    before = rotary(tables="computed")
    merged = merge_composite(before, [RopeComposite()])
    [(_, func)] = composite_functions(merged)
    ops = {pk.ir.op_name(b.value) for block in func.body.blocks for b in block.bindings}
    assert not {"relax.cos", "relax.sin"} & ops  # the tables are the composite's inputs
    assert len(func.params) == 3


def test_the_library_holds_both_forms_each_taking_only_its_own():
    assert {"byoc.rope", "byoc.rope_interleaved"} <= set(LIBRARY.names)
    for interleaved in (False, True):
        merged = merge_composite(rotary(interleaved=interleaved), LIBRARY.composites())
        names = [str(f.attrs["Composite"]) for _, f in composite_functions(merged)]
        assert names == ["byoc.rope_interleaved" if interleaved else "byoc.rope"]


# -- as the torch importer writes transformers' rotary embeddings -----------------------------
@pytest.mark.models
@pytest.mark.parametrize("family", ["llama", "gptj"])
def test_the_query_and_key_rotations_of_a_torch_exported_attention_form_two_composites(family):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.gptj import modeling_gptj
    from transformers.models.llama import modeling_llama

    from patternkit.models.importing import from_torch

    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=4, intermediate_size=64)

    class Rotated(torch.nn.Module):
        """q and k projections rotated by the family's own rotary code; tables shared."""

        def __init__(self):
            super().__init__()
            self.rotary = modeling_llama.LlamaRotaryEmbedding(config)
            self.q = torch.nn.Linear(32, 32, bias=False)
            self.k = torch.nn.Linear(32, 32, bias=False)
            # GPT-J keeps its table as a buffer (computing it in the graph takes an integer
            # power that TVM 0.27 cannot build)
            self.register_buffer("table", modeling_gptj.create_sinusoidal_positions(16, 8))

        def forward(self, x, positions):
            b, t, _ = x.shape
            q, k = (proj(x).view(b, t, 4, 8) for proj in (self.q, self.k))
            if family == "llama":
                cos, sin = self.rotary(x, positions)
                q, k = modeling_llama.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2),
                                                           cos, sin)
                return q + k
            sin, cos = torch.split(self.table[positions], 4, dim=-1)
            return (modeling_gptj.apply_rotary_pos_emb(q, sin, cos)
                    + modeling_gptj.apply_rotary_pos_emb(k, sin, cos))

    torch.manual_seed(0)
    positions = torch.arange(5)[None].repeat(2, 1)
    exported = torch.export.export(Rotated().eval(), (torch.randn(2, 5, 32), positions))
    mod, _, _ = from_torch(exported, False, "main", family, {})
    collapsed = pk.rewrite(LIBRARY, mod)
    merged = merge_composite(collapsed, LIBRARY.composites())
    names = [str(f.attrs["Composite"]) for _, f in composite_functions(merged)]
    expected = "byoc.rope" if family == "llama" else "byoc.rope_interleaved"
    assert names.count(expected) == 2
    pk.assert_same_numerics(collapsed, merged, rtol=0, atol=0)


@pytest.mark.models
def test_a_torch_exported_phi_style_partial_rotation_forms_one_composite_per_tensor():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import rotate_half

    from patternkit.models.importing import from_torch

    class PartialRotary(torch.nn.Module):
        """Phi's attention: the first 4 of 8 lanes of q and k rotated, the rest passed."""

        def forward(self, q, k, cos, sin):
            out = []
            for t in (q, k):
                rot, passed = t[..., :4], t[..., 4:]
                out.append(torch.cat([rot * cos + rotate_half(rot) * sin, passed], dim=-1))
            return out[0] + out[1]

    torch.manual_seed(0)
    args = (torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8), torch.randn(1, 1, 5, 4),
            torch.randn(1, 1, 5, 4))
    mod, _, _ = from_torch(torch.export.export(PartialRotary(), args), False, "main", "phi", {})
    merged = merge_composite(pk.rewrite(LIBRARY, mod), LIBRARY.composites())
    names = [str(f.attrs["Composite"]) for _, f in composite_functions(merged)]
    assert names == ["byoc.rope_partial", "byoc.rope_partial"]
    pk.assert_same_numerics(mod, merged, rtol=0, atol=0)


# -- as from_onnx writes the dynamo exporter's rotary tables of a dynamic sequence -----------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tables_of_an_onnx_range_over_the_sequence_form_composites_computing_the_same(dtype):
    """``from_onnx`` gives ``arange(seq)`` a length of its own (``range_len_0``) matched
    from a count computed at run time, so the tables' shape is not ``x``'s and the
    rotation's result (the next rotation's ``x``) has an unknown shape; the function
    proves the length is ``seq`` and every rotation forms its composite.

    Such a module does not build for llvm as imported (TVM legalizes no op of unknown
    shape): the numbers are compared on it with the proven length bound, where the same
    composites form.
    """
    cases = [(rotary(tables="ranged", rotations=2, dtype=dtype), ["byoc.rope"] * 2),
             (rotary(tables="ranged", rotations=2, interleaved=True, dtype=dtype),
              ["byoc.rope_interleaved"] * 2),
             (rotary(tables="ranged", rotary_dim=4, dtype=dtype), ["byoc.rope_partial"])]
    for before, expected in cases:
        assert _composites(merge_composite(before, LIBRARY.composites())) == expected
    # one build per side: the chained half rotations (float32), the partial one (float16)
    before = cases[0 if dtype == "float32" else 2][0]
    bound = bind_proven_lengths(before)
    merged = merge_composite(bound, LIBRARY.composites())
    assert _composites(merged) == _composites(merge_composite(before, LIBRARY.composites()))
    pk.assert_same_numerics(bound, merged, shape_vars={"batch": 2, "seq": 5}, rtol=0, atol=0)


def _composites(mod) -> list[str]:
    return [str(f.attrs["Composite"]) for _, f in composite_functions(mod)]


def test_a_range_length_is_proven_only_through_exact_arithmetic():
    [(length, value)] = proven_lengths(rotary(tables="ranged")["main"]).items()
    assert (length.name, str(value)) == ("range_len_0", "seq")
    [(_, value)] = proven_lengths(rotary(tables="ranged_over_batch")["main"]).items()
    assert str(value) == "batch"
    assert proven_lengths(rotary(tables="ranged_through_float16")["main"]) == {}
    before = rotary(tables="ranged")
    text = before.script()
    merge_composite(before, LIBRARY.composites())
    assert before.script() == text  # the proof reads a copy: the user's module is intact


@pytest.mark.models
def test_the_dynamo_exported_rotations_of_a_dynamic_sequence_form_their_composites():
    """Llama's and Phi's rotations (two chained blocks each) through
    ``torch.onnx.export(dynamo=True)`` with dynamic batch and sequence, then ``from_onnx``:
    every rotation is a composite, and the partition computes what the import computes.
    """
    torch = pytest.importorskip("torch")
    import onnx

    from patternkit.models.importing import from_onnx_model
    from patternkit.models.onnx_fixups import prepare_for_tvm
    from patternkit.models.onnx_models import export_to_onnx
    from patternkit.models.spelling_sources import find_spelling, spelling_model

    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.llama = spelling_model(find_spelling("rope/half rotation (Llama)"))
            self.phi = spelling_model(find_spelling("rope/partial (Phi)"))

        def forward(self, x, y):  # two inputs: the exporter shares no slice between them
            return self.llama(x), self.phi(y)

    generator = torch.Generator().manual_seed(0)
    examples = tuple(torch.randn(2, 2, 6, 8, generator=generator) for _ in range(2))
    axes = {0: "batch", 2: "seq"}
    proto = onnx.load_from_string(export_to_onnx(
        Both().eval(), examples, ["x", "y"], opset=None, exporter="dynamo",
        dynamic_axes={"x": axes, "y": axes}, text="rope"))
    prepare_for_tvm(proto)
    mod, _ = from_onnx_model(proto, False, "main", "rope", {})
    expected = ["byoc.rope"] * 2 + ["byoc.rope_partial"] * 2
    assert sorted(_composites(merge_composite(mod, LIBRARY.composites()))) == expected
    bound = bind_proven_lengths(mod)
    merged = merge_composite(bound, LIBRARY.composites())
    assert sorted(_composites(merged)) == expected
    pk.assert_same_numerics(bound, merged, shape_vars={"batch": 2, "seq": 5}, rtol=0, atol=0)
