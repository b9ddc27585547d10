"""The einsum family: ``from_onnx``'s ``call_tir`` of ``topi.einsum`` lifted back into
``R.einsum`` (einsum.from_call_tir), and a two-operand ``R.einsum`` that is a batched
matmul written as one (einsum.to_matmul), so that attention written with
``torch.einsum`` and exported to ONNX collapses like its ``torch.export`` import.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import tvm
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.ir import compat as C
from patternkit.patterns import LIBRARY
from patternkit.patterns.attention.plan import FLOAT16, FLOAT32
from patternkit.patterns.einsum import EinsumFromCallTir, EinsumToMatmul
from patternkit.patterns.einsum.examples import onnx_einsum, onnx_einsum_attention, relax_einsum
from patternkit.testing import EXACT, Negative, RuleCase, check_rule

LIFT = "einsum.from_call_tir"
MATMUL = "einsum.to_matmul"
COLLAPSE = "attention.collapse"


def _with_main(before: tvm.IRModule, main) -> tvm.IRModule:
    """``before`` with its ``main`` replaced (the PrimFuncs stay, as the rewrite leaves them)."""
    main = main.with_attr("global_symbol", "main")
    return C.copy_module(before, {gv: main if gv.name_hint == "main" else func
                                  for gv, func in before.functions.items()})


# -- einsum.from_call_tir ----------------------------------------------------------------------
#: ``from_onnx``'s ``einsum("bhsd,bhkd->bhsk")``, labels renamed in loop order.
@R.function
def lifted_scores(a: R.Tensor(("batch", 2, "seq", 16), "float32"),
                  b: R.Tensor(("batch", 2, 8, 16), "float32"),
                  ) -> R.Tensor(("batch", 2, "seq", 8), "float32"):
    batch, seq = T.int64(), T.int64()
    with R.dataflow():
        lv = R.einsum((a, b), subscripts="abce,abde->abcd")
        gv = lv
        R.output(gv)
    return gv


@I.ir_module
class InitElsewhere:
    """An einsum-shaped PrimFunc that zeroes ``out[i, 0]`` but sums into ``out[i, j]``."""

    @T.prim_func(private=True, s_tir=True)
    def einsum(a: T.Buffer((T.int64(4), T.int64(6)), "float32"),
               b: T.Buffer((T.int64(6), T.int64(5)), "float32"),
               out: T.Buffer((T.int64(4), T.int64(5)), "float32")):
        for i, j, k in T.grid(T.int64(4), T.int64(5), T.int64(6)):
            with T.sblock("T_einsum"):
                v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    out[v_i, T.int64(0)] = T.float32(0.0)
                out[v_i, v_j] = out[v_i, v_j] + a[v_i, v_k] * b[v_k, v_j]

    @R.function
    def main(a: R.Tensor((4, 6), "float32"), b: R.Tensor((6, 5), "float32"),
             ) -> R.Tensor((4, 5), "float32"):
        cls = InitElsewhere
        with R.dataflow():
            lv = R.call_tir(cls.einsum, (a, b), out_ty=R.Tensor((4, 5), "float32"))
            gv = lv
            R.output(gv)
        return gv


LIFT_BEFORE = onnx_einsum("bhsd,bhkd->bhsk", shape="symbolic")

LIFT_CASE = RuleCase(
    EinsumFromCallTir(), LIFT_BEFORE, _with_main(LIFT_BEFORE, lifted_scores),
    negatives=[
        Negative("first_operand_broadcast", onnx_einsum(broadcast=True),
                 "the first operand of einsum is read at T.int64(0) on axis 0: not a plain "
                 "loop variable"),
        Negative("cast_inside_the_product", onnx_einsum("ij,jk->ik", "float16", body="cast"),
                 "the block of einsum casts inside its product"),
        Negative("no_reduction_named_einsum", onnx_einsum("ij,ij->ij", body="add"),
                 "the block of einsum computes a[v_ax0, v_ax1] + b[v_ax0, v_ax1], not a "
                 "product of its operands"),
        Negative("diagonal", onnx_einsum("bii,bij->bij"),
                 "the first operand of einsum repeats the label of v_ax1 (a diagonal)"),
        Negative("initialises_another_element", InitElsewhere,
                 "the PrimFunc einsum initialises another element than it sums"),
        Negative("three_operands", onnx_einsum("ij,jk,kl->il"),
                 "the call_tir passes 3 operands to einsum: only two-operand einsums"),
    ],
    tolerance=EXACT)


def test_lift_contract():
    check_rule(LIFT_CASE)


def test_lift_refuses_a_lone_function_whose_primfunc_it_cannot_read():
    log = pk.RewriteLog()
    main = onnx_einsum()["main"]
    out = pk.rewrite(EinsumFromCallTir(), main, log=log)
    assert C.structural_equal(out, main)
    (reason,) = log.reasons(LIFT)
    assert "the module being rewritten does not define einsum" in reason


@pytest.mark.parametrize("equation", ["bshd,bkhd->bhsk", "bhsk,bkhd->bshd", "bi,bj->bij",
                                      "bsd,d->bs", "ij,jk->ik"])
def test_every_two_operand_equation_is_recovered_to_the_same_numbers(equation):
    """The equation read back is the one written (up to renaming): the lifted module
    computes the same values, in float16 with symbolic batch and sequence."""
    before = onnx_einsum(equation, "float16", shape="symbolic")
    log = pk.RewriteLog()
    after = pk.rewrite(EinsumFromCallTir(), before, log=log)
    assert log.count(LIFT) == 1 and "R.einsum" in after.script()
    pk.assert_same_numerics(before, after, rtol=0, atol=0, shape_vars={"batch": 3, "seq": 5})


# -- einsum.to_matmul --------------------------------------------------------------------------
@I.ir_module
class MatmulOfHeadsLast:
    """``einsum("bshd,bkhd->bhsk")`` (BSNH q and k): both operands permuted into heads."""

    @R.function
    def main(a: R.Tensor(("batch", "seq", 2, 16), "float32"),
             b: R.Tensor(("batch", 8, 2, 16), "float32"),
             ) -> R.Tensor(("batch", 2, "seq", 8), "float32"):
        batch, seq = T.int64(), T.int64()
        with R.dataflow():
            a_t = R.permute_dims(a, axes=[0, 2, 1, 3])
            b_t = R.permute_dims(b, axes=[0, 2, 3, 1])
            lv = R.matmul(a_t, b_t)
            gv = lv
            R.output(gv)
        return gv


MATMUL_CASE = RuleCase(
    EinsumToMatmul(), relax_einsum("bshd,bkhd->bhsk", shape="symbolic"), MatmulOfHeadsLast,
    negatives=[
        Negative("elementwise_product", relax_einsum("bij,bij->bij"),
                 "has 0 row, 0 column, 0 contracted and 3 batch labels"),
        Negative("matrix_vector", relax_einsum("bsd,d->bs"),
                 "reads operands of rank 3 and 1 into a result of rank 2"),
        Negative("broadcast_batch", relax_einsum("bij,bjk->bik", broadcast=True),
                 "the batch label 'b' has extent 1 in the first operand and 2 in the "
                 "second"),
    ],
    tolerance=EXACT)


def test_matmul_contract():
    check_rule(MATMUL_CASE)


# -- the library, end to end ---------------------------------------------------------------------
def test_the_from_onnx_einsum_attention_collapses_through_the_library():
    """Both head layouts, float16: lifted, written as matmuls, collapsed, numbers kept."""
    for layout in ("bhqd", "bqhd"):
        before = onnx_einsum_attention("float16", "symbolic", layout)
        log = pk.RewriteLog()
        after = pk.rewrite(LIBRARY, before, log=log)
        assert (log.count(LIFT), log.count(MATMUL), log.count(COLLAPSE)) == (2, 2, 1), layout
        text = after["main"].script()
        assert "R.nn.attention" in text and "call_tir" not in text and "softmax" not in text
        pk.assert_same_numerics(before, after, rtol=FLOAT16.rtol, atol=FLOAT16.atol,
                                shape_vars={"batch": 2, "seq": 8})


torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")


class EinsumAttention(torch.nn.Module):
    """Attention written with ``torch.einsum`` over BNSH q, k, v."""

    def forward(self, q, k, v):
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * 0.25
        return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)


def test_a_torch_einsum_attention_exported_to_onnx_collapses_with_the_numbers_kept():
    from tvm.relax.frontend.onnx import from_onnx

    x = torch.randn(2, 2, 8, 16)
    data = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(EinsumAttention(), (x, x, x), data, dynamo=False, opset_version=17,
                          input_names=list("qkv"),
                          dynamic_axes={n: {0: "batch", 2: "seq"} for n in "qkv"})
    before = from_onnx(onnx.load_from_string(data.getvalue()))
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert (log.count(LIFT), log.count(COLLAPSE)) == (2, 1)
    assert "R.nn.attention" in after["main"].script()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((3, 2, 5, 16)).astype("float32") for _ in range(3)]
    pk.assert_same_numerics(before, after, inputs=inputs, rtol=FLOAT32.rtol, atol=FLOAT32.atol)


def test_an_attention_einsum_that_is_no_matmul_is_a_near_miss_with_the_refusal():
    """Values shared by the heads (``"bhsk,bkd->bhsd"``): lifted, but no batched matmul,
    so attention stays written out; the near miss gives einsum.to_matmul's reason."""
    from tvm import relax, topi

    from patternkit.patterns.near_misses import NEAR_MISSES

    q = relax.Var("q", relax.TensorType((2, 2, 8, 16), "float32"))
    v = relax.Var("v", relax.TensorType((2, 8, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, v]):
        with bb.dataflow():
            scores = bb.emit_te(topi.einsum, "bhsd,bhkd->bhsk", q, q)
            p = bb.emit(relax.op.nn.softmax(scores, axis=-1))
            out = bb.emit_output(bb.emit_te(topi.einsum, "bhsk,bkd->bhsd", p, v))
        bb.emit_func_output(out)
    log = pk.RewriteLog()
    pk.rewrite(LIBRARY, bb.get(), log=log)
    assert (log.count(LIFT), log.count(MATMUL), log.count(COLLAPSE)) == (2, 1, 0)
    (miss,) = [m for m in log.near_misses(NEAR_MISSES) if m.family == "attention"]
    assert "softmax -> einsum" in miss.shape
    assert "reads operands of rank 4 and 3 into a result of rank 4" in miss.reason
