"""attention.einsum_matmul: attention written with ``torch.einsum`` (``"bhqd,bhkd->bhqk"``,
``"bhqk,bhkd->bhqd"``), which torch.export decomposes into ``expand_dims``, permutes and
reshapes around 3-D batched matmuls, becomes two 4-D matmuls, and attention.collapse then
takes the attention.

The rule's contract case lives here (run from test_attention.py, where the library's
meta-test looks for it); the end-to-end tests export small torch modules and import them
with patternkit's importer, as users bring them.
"""

from __future__ import annotations

import warnings

import pytest
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.engine.driver import RewriteLog
from patternkit.patterns import LIBRARY
from patternkit.patterns.attention.einsum import EinsumMatmul, einsum_attention
from patternkit.patterns.attention.plan import FLOAT16, FLOAT32
from patternkit.testing import EXACT, Negative, RuleCase

RULE = "attention.einsum_matmul"
COLLAPSE = "attention.collapse"
TOLERANCE = {"float32": FLOAT32, "float16": FLOAT16}


@I.ir_module
class EinsumAttentionMatmuls:
    """:func:`einsum_attention` with symbolic batch and sequence, the einsums rewritten."""

    @R.function
    def main(q: R.Tensor(("batch", 2, "seq", 16), "float32"),
             k: R.Tensor(("batch", 2, "seq", 16), "float32"),
             v: R.Tensor(("batch", 2, "seq", 16), "float32"),
             ) -> R.Tensor(("batch", 2, "seq", 16), "float32"):
        batch, seq = T.int64(), T.int64()
        with R.dataflow():
            k_t = R.permute_dims(k, axes=[0, 1, 3, 2])
            scores = R.matmul(q, k_t, out_dtype="float32")
            scaled = R.multiply(scores, R.const(0.25, "float32"))
            p = R.nn.softmax(scaled, axis=-1)
            o = R.matmul(p, v, out_dtype="float32")
            out = o  # the example's R.output of the einsum's result
            R.output(out)
        return out


EINSUM_CASE = RuleCase(
    EinsumMatmul(), einsum_attention(shape="symbolic"), EinsumAttentionMatmuls,
    negatives=[
        Negative("key_merged_heads_before_batch",
                 einsum_attention(pairing="scrambled", scores_only=True),
                 "the matmul pairs the batch axes [left axis 0 (4), left axis 1 (2)] with "
                 "[right axis 1 (2), right axis 0 (4)]: not axis for axis of the same "
                 "extents"),
        Negative("scores_reshaped_sequence_first", einsum_attention(regroup="scrambled"),
                 "the reshape to (2, 8, 2, 8) splits or scrambles the axes [left axis 0 (2), "
                 "left axis 1 (2), left axis 2 (8), right axis 2 (8)]"),
    ],
    tolerance=EXACT)


def test_the_rewritten_einsums_are_the_4d_matmuls_attention_collapse_takes():
    log = RewriteLog()
    after = pk.rewrite(LIBRARY, einsum_attention(shape="symbolic"), log=log)
    assert log.count(RULE) == 2
    assert log.count(COLLAPSE) == 1
    assert "R.nn.attention" in after.script() and "R.matmul" not in after.script()


# -- end to end: torch modules, torch.export, patternkit's importer ----------------------------
torch = pytest.importorskip("torch")


class EinsumAttention(torch.nn.Module):
    """Attention with two einsums over BNSH (``layout="bhqd"``) or BSNH q, k, v."""

    EQUATIONS = {"bhqd": ("bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd"),
                 "bqhd": ("bqhd,bkhd->bhqk", "bhqk,bkhd->bqhd")}

    def __init__(self, layout: str = "bhqd"):
        super().__init__()
        self.scores_eq, self.out_eq = self.EQUATIONS[layout]

    def forward(self, q, k, v):
        scores = torch.einsum(self.scores_eq, q, k) * q.shape[-1] ** -0.5
        return torch.einsum(self.out_eq, scores.softmax(-1), v)


def _imported(module, args, dynamic: bool = False):
    from patternkit.models.importing import from_torch

    shapes = None
    if dynamic:
        batch = torch.export.Dim("batch", min=1, max=16)
        seq = torch.export.Dim("seq", min=2, max=64)
        seq_axis = 2 if isinstance(module, EinsumAttention) and module.scores_eq[1] == "h" \
            else 1
        shapes = tuple({0: batch, seq_axis: seq} for _ in args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.export.export(module.eval(), args, dynamic_shapes=shapes)
    mod, _, _ = from_torch(program, False, "main", type(module).__name__, {})
    return mod


def _inputs(layout: str, dtype: str):
    torch.manual_seed(0)
    shape = (2, 2, 8, 16) if layout == "bhqd" else (2, 8, 2, 16)
    return tuple(torch.randn(*shape).to(getattr(torch, dtype)) for _ in range(3))


# two of the eight combinations (about 12 s each): every knob moves once
@pytest.mark.parametrize("layout, dtype, dynamic", [("bhqd", "float32", True),
                                                    ("bqhd", "float16", False)])
def test_a_torch_einsum_attention_collapses_with_the_numbers_kept(layout, dtype, dynamic):
    before = _imported(EinsumAttention(layout), _inputs(layout, dtype), dynamic)
    log = RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count(RULE) == 2
    assert log.count(COLLAPSE) == 1
    text = after.script()
    assert text.count("R.nn.attention") == 1 and "R.nn.softmax" not in text
    tol = TOLERANCE[dtype]
    pk.assert_same_numerics(before, after, rtol=tol.rtol, atol=tol.atol,
                            shape_vars={"s0": 8, "s1": 8, "s33": 2, "s19": 2})


def test_an_onnx_einsum_attention_the_lift_refuses_is_a_near_miss_naming_its_reason():
    """``from_onnx`` lowers ONNX ``Einsum`` to a ``call_tir`` of topi's einsum, which
    ``einsum.from_call_tir`` reads back; one it refuses (here a diagonal, ``bhqq``) stays
    a ``call_tir``, and the attention near miss gives the refusal instead of staying silent."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from tvm.relax.frontend.onnx import from_onnx

    from patternkit.patterns.near_misses import NEAR_MISSES

    shape = [2, 2, 8, 16]
    nodes = [helper.make_node("Einsum", ["q", "k"], ["s"], equation="bhqd,bhkd->bhqk"),
             helper.make_node("Mul", ["s", "scale"], ["scaled"]),
             helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
             helper.make_node("Einsum", ["p", "v"], ["o"], equation="bhqq,bhqd->bhqd")]
    graph = helper.make_graph(
        nodes, "einsum_attention",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, shape)],
        [helper.make_tensor("scale", TensorProto.FLOAT, [], [0.25])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    mod = from_onnx(onnx.shape_inference.infer_shapes(model))
    assert "R.call_tir(" in mod.script()
    log = RewriteLog()
    pk.rewrite(LIBRARY, mod, log=log)
    (miss,) = [m for m in log.near_misses(NEAR_MISSES) if m.family == "attention"]
    assert "call_tir" in miss.shape and "ONNX Einsum" in miss.shape
    assert "repeats the label of v_ax2 (a diagonal)" in miss.reason
