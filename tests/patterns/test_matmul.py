"""patterns/matmul.py: parallel matmuls sharing their left operand become one and a split."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import patternkit as pk
from patternkit import ir as C
from patternkit.patterns.matmul import CombineParallelMatmul
from patternkit.testing import Negative, RuleCase, Tolerance, check_rule

#: Each output element is the same K-term dot product, summed in the same order, whether
#: its weight column sits in a narrow or in the concatenated matrix; the bias add is the
#: same add.  Measured bit-identical on llvm: no tolerance is needed.
SAME_DOT_PRODUCTS = Tolerance(0.0, 0.0, "every output element is the same dot product over "
                                        "K in the same order, and the same bias add")


def _ops(mod):
    return [C.op_name(b.value) for block in mod["main"].body.blocks for b in block.bindings
            if C.op_name(b.value)]


@I.ir_module
class QKVBias:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), w0: R.Tensor((8, 4), "float32"),
             w1: R.Tensor((8, 4), "float32"), w2: R.Tensor((8, 6), "float32"),
             b0: R.Tensor((4,), "float32"), b1: R.Tensor((4,), "float32"),
             b2: R.Tensor((6,), "float32")) -> R.Tensor((2, 14), "float32"):
        with R.dataflow():
            m0 = R.matmul(x, w0)
            q = R.add(m0, b0)
            m1 = R.matmul(x, w1)
            k = R.add(b1, m1)
            m2 = R.matmul(x, w2)
            v = R.add(m2, b2)
            out = R.concat((q, k, v), axis=1)
            R.output(out)
        return out


@I.ir_module
class QKVBiasCombined:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), w0: R.Tensor((8, 4), "float32"),
             w1: R.Tensor((8, 4), "float32"), w2: R.Tensor((8, 6), "float32"),
             b0: R.Tensor((4,), "float32"), b1: R.Tensor((4,), "float32"),
             b2: R.Tensor((6,), "float32")) -> R.Tensor((2, 14), "float32"):
        with R.dataflow():
            w = R.concat((w0, w1, w2), axis=-1)
            m = R.matmul(x, w)
            b = R.concat((b0, b1, b2), axis=0)
            a = R.add(m, b)
            parts = R.split(a, indices_or_sections=[4, 8], axis=-1)
            q = parts[0]
            k = parts[1]
            v = parts[2]
            out = R.concat((q, k, v), axis=1)
            R.output(out)
        return out


@I.ir_module
class RankOneInput:
    @R.function
    def main(x: R.Tensor((8,), "float32"), w0: R.Tensor((8, 4), "float32"),
             w1: R.Tensor((8, 4), "float32")) -> R.Tensor((8,), "float32"):
        with R.dataflow():
            a = R.matmul(x, w0)
            b = R.matmul(x, w1)
            out = R.concat((a, b), axis=0)
            R.output(out)
        return out


@I.ir_module
class ComputedWeights:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), w0: R.Tensor((4, 8), "float32"),
             w1: R.Tensor((4, 8), "float32")) -> R.Tensor((2, 8), "float32"):
        with R.dataflow():
            t0 = R.permute_dims(R.exp(w0))
            t1 = R.permute_dims(R.exp(w1))
            a = R.matmul(x, t0)
            b = R.matmul(x, t1)
            out = R.concat((a, b), axis=1)
            R.output(out)
        return out


@I.ir_module
class MixedOutDtypes:
    @R.function
    def main(x: R.Tensor((2, 8), "float16"), w0: R.Tensor((8, 4), "float16"),
             w1: R.Tensor((8, 4), "float16")) -> R.Tensor((2, 4), "float32"):
        with R.dataflow():
            a = R.matmul(x, w0, out_dtype="float32")
            b = R.matmul(x, w1)
            c = R.astype(b, "float32")
            out = R.add(a, c)
            R.output(out)
        return out


@I.ir_module
class BatchedWeights:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), w0: R.Tensor((3, 8, 4), "float32"),
             w1: R.Tensor((3, 8, 4), "float32")) -> R.Tensor((3, 2, 4), "float32"):
        with R.dataflow():
            a = R.matmul(x, w0)
            b = R.matmul(x, w1)
            out = R.add(a, b)
            R.output(out)
        return out


@I.ir_module
class UnknownWeightShape:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), w0: R.Tensor(ndim=2, dtype="float32"),
             w1: R.Tensor(ndim=2, dtype="float32")) -> R.Tensor(ndim=2, dtype="float32"):
        with R.dataflow():
            a = R.matmul(x, w0)
            b = R.matmul(x, w1)
            out = R.add(a, b)
            R.output(out)
        return out


CASE = RuleCase(
    CombineParallelMatmul(), QKVBias, QKVBiasCombined,
    negatives=[
        Negative("rank_one_input", RankOneInput, "the shared operand 'x' is rank 1"),
        Negative("computed_weights", ComputedWeights,
                 "fewer than two matmuls of 'x' can be combined: 'a': its weight is computed "
                 "in the function"),
        Negative("mixed_out_dtypes", MixedOutDtypes,
                 "'b': weight dtype float16 / out_dtype default differ from the first "
                 "branch's float16 / float32"),
        Negative("batched_weights", BatchedWeights, "'a': its weight has rank 3, not 2"),
        Negative("unknown_weight_shape", UnknownWeightShape,
                 "'a': its weight has no static shape"),
    ],
    tolerance=SAME_DOT_PRODUCTS)


def test_combine_parallel_meets_the_rule_contract():
    check_rule(CASE)


def test_constant_weights_and_biases_fold_into_one_constant_each():
    before = CombineParallelMatmul.example(branches=4, bias=True)
    after = pk.rewrite(CombineParallelMatmul(), before)
    assert _ops(after) == ["relax.matmul", "relax.add", "relax.split", "relax.concat"]
    matmul = next(b.value for b in after["main"].body.blocks[0].bindings
                  if C.op_name(b.value) == "relax.matmul")
    assert C.is_tensor_constant(matmul.args[1])
    assert C.static_shape(C.type_of(matmul.args[1])) == (8, 4 + 5 + 6 + 7)
    pk.assert_same_numerics(before, after, rtol=0, atol=0)


def test_float16_branches_keep_their_dtype():
    before = CombineParallelMatmul.example(dtype="float16")
    after = pk.rewrite(CombineParallelMatmul(), before)
    assert _ops(after).count("relax.matmul") == 1
    assert C.dtype_of(C.type_of(after["main"].body.body)) == "float16"
    pk.assert_same_numerics(before, after, rtol=0, atol=0)


def _three_branches(out_dtypes, read_twice=False):
    """Three matmuls of x (float16) with the given out_dtypes; the first read twice."""
    rng = np.random.default_rng(3)
    x = relax.Var("x", relax.TensorType((2, 8), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for i, out_dtype in enumerate(out_dtypes):
                w = relax.const(rng.standard_normal((8, 4)).astype("float16"))
                y = bb.emit(relax.op.matmul(x, w, out_dtype=out_dtype))
                b = bb.emit(relax.op.add(y, relax.const(rng.standard_normal((4,)).astype(
                    C.dtype_of(C.type_of(y))))))
                if read_twice and i == 0:
                    b = bb.emit(relax.op.multiply(b, y))
                outs.append(bb.emit(relax.op.astype(b, "float32")))
            out = bb.emit_output(relax.op.concat(outs, axis=1))
        bb.emit_func_output(out)
    return bb.get()


def test_branches_of_another_out_dtype_are_not_combined_with_the_first():
    before = _three_branches([None, "float32", None])
    log = pk.RewriteLog()
    after = pk.rewrite(CombineParallelMatmul(), before, log=log)
    matmuls = [b.value for b in after["main"].body.blocks[0].bindings
               if C.op_name(b.value) == "relax.matmul"]
    # the two default branches became one (8 -> 4 + 4 wide), the float32 one is left alone
    assert sorted(C.static_shape(C.type_of(m))[-1] for m in matmuls) == [4, 8]
    assert {C.dtype_of(C.type_of(m)) for m in matmuls} == {"float16", "float32"}
    assert log.count("matmul.combine_parallel") == 1
    pk.assert_same_numerics(before, after, rtol=0, atol=0)


def test_a_branch_read_elsewhere_keeps_the_bias_adds_unfolded():
    before = _three_branches([None, None, None], read_twice=True)
    after = pk.rewrite(CombineParallelMatmul(), before)
    ops = _ops(after)
    assert ops.count("relax.matmul") == 1 and ops.count("relax.split") == 1
    assert ops.count("relax.add") == 3  # one per branch: the raw first result is needed
    pk.assert_same_numerics(before, after, rtol=0, atol=0)


@I.ir_module
class TorchLinears:
    """Three ``nn.Linear`` as the torch importer writes them: ``permute_dims`` of the
    weight parameter, ``matmul``, bias ``add``; the third transposed after the first
    matmul, so the combined matmul must be emitted after it."""

    @R.function
    def main(x: R.Tensor((2, 3, 8), "float32"), wq: R.Tensor((8, 8), "float32"),
             bq: R.Tensor((8,), "float32"), wk: R.Tensor((8, 8), "float32"),
             bk: R.Tensor((8,), "float32"), wv: R.Tensor((8, 8), "float32"),
             bv: R.Tensor((8,), "float32")) -> R.Tensor((2, 3, 8), "float32"):
        with R.dataflow():
            tq = R.permute_dims(wq)
            mq = R.matmul(x, tq)
            q = R.add(mq, bq)
            tk = R.permute_dims(wk)
            mk = R.matmul(x, tk)
            k = R.add(mk, bk)
            tv = R.permute_dims(wv, axes=[1, 0])
            mv = R.matmul(x, tv)
            v = R.add(mv, bv)
            s = R.multiply(q, k)
            out = R.add(s, v)
            R.output(out)
        return out


def test_the_torch_importers_linears_are_combined_through_their_transposes():
    after = pk.rewrite(CombineParallelMatmul(), TorchLinears)
    ops = _ops(after)
    assert ops.count("relax.matmul") == 1 and ops.count("relax.split") == 1
    assert ops.count("relax.add") == 2  # the three bias adds became one, plus the final add
    assert relax.analysis.check_well_formed(after)
    pk.assert_same_numerics(TorchLinears, after, rtol=0, atol=0)


def test_the_input_module_is_not_modified():
    text = QKVBias.script()
    pk.rewrite(CombineParallelMatmul(), QKVBias)
    assert QKVBias.script() == text


@pytest.mark.models
def test_a_small_berts_query_key_value_projections_are_combined_in_every_layer():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=16, attn_implementation="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's LeafSpec FutureWarning
        exported = torch.export.export(transformers.BertModel(config).eval(),
                                       (torch.randint(0, 100, (1, 8)),))
    # the importer reshapes the hidden states once per Linear: one reshape after CSE
    mod = relax.transform.EliminateCommonSubexpr()(
        from_exported_program(exported, unwrap_unit_return_tuple=True))
    log = pk.RewriteLog()
    after = pk.rewrite(CombineParallelMatmul(), mod, log=log)
    # one combination per layer: query, key and value read the same hidden states
    assert [len(r.replaced) for r in log.records] == [3, 3]
    assert _ops(after).count("relax.split") == 2
    assert _ops(after).count("relax.matmul") == _ops(mod).count("relax.matmul") - 4
    # the concatenated weights change no dot product: bit-identical on llvm
    pk.assert_same_numerics(mod, after, rtol=0, atol=0)
