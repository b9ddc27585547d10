"""patterns/matmul/: matmul [+ bias] [-> activation] composites under TVM's table names, and
parallel matmuls sharing their left operand combined into one matmul and a split."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from test_matmul_fold import FOLD_CASE  # matmul.fold_batchnorm's tests: test_matmul_fold.py
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit import ir as C
from patternkit.byoc import CompositeLog, PatternTable, composite_functions, merge_composite
from patternkit.patterns import LIBRARY
from patternkit.patterns.matmul import (
    ACTIVATIONS,
    COMPOSITES,
    RULES,
    BatchnormFoldIntoMatmul,
    CombineParallelMatmul,
    MatmulComposite,
    matmul_table,
)
from patternkit.patterns.matmul.examples import parallel_projections
from patternkit.testing import EXACT, Negative, RuleCase, Tolerance, check_rule
from patternkit.verification.numeric import build as build_for_checks

#: TVMScript spelling of each activation call on ``a``.
_ACT_CALLS = {"relu": "R.nn.relu(a)", "gelu": "R.nn.gelu(a)",
              "gelu_tanh": "R.nn.gelu_tanh(a)", "silu": "R.nn.silu(a)"}


def _script(transposed: bool, bias: bool, activation: str | None, composite: bool) -> str:
    """TVMScript of one ``nn.Linear``-like layer on a (4, 16) input, 8 features: as it is,
    or with its ops in the composite that ``MatmulComposite`` names."""
    w_shape = "(8, 16)" if transposed else "(16, 8)"

    def signature(p: str) -> str:
        params = [f'x{p}: R.Tensor((4, 16), "float32")', f'w{p}: R.Tensor({w_shape}, "float32")']
        params += [f'b{p}: R.Tensor((8,), "float32")'] if bias else []
        return f'({", ".join(params)}) -> R.Tensor((4, 8), "float32")'

    def body(p: str, indent: str) -> str:
        lines = [f"wt = R.permute_dims(w{p}, axes=[1, 0])"] if transposed else []
        lines.append(f"y = R.matmul(x{p}, {'wt' if transposed else f'w{p}'})")
        last = "y"
        if bias:
            lines.append(f"a = R.add(b{p}, y)")  # the torch importer's operand order
            last = "a"
        if activation:
            call = _ACT_CALLS[activation] if bias else _ACT_CALLS[activation].replace("(a)", "(y)")
            lines.append(f"out = {call}")
            last = "out"
        lines.append(f"R.output({last})")
        return "".join(f"{indent}{line}\n" for line in lines), last

    head = "@I.ir_module\nclass Module:\n    @R.function\n"
    if not composite:
        ops, last = body("", " " * 12)
        return (head + f"    def main{signature('')}:\n        with R.dataflow():\n{ops}"
                f"        return {last}\n")
    rule = MatmulComposite(transposed=transposed, bias=bias, activation=activation)
    parts = (["permute_dims"] if transposed else []) + ["matmul"] + (["add"] if bias else [])
    parts += [ACTIVATIONS[activation]] if activation else []
    ops, last = body("1", " " * 20)
    args = "x, w, b" if bias else "x, w"
    return (head + f"    def main{signature('')}:\n        with R.dataflow():\n"
            f"            @R.function\n            def composite{signature('1')}:\n"
            f'                R.func_attr({{"Composite": "{rule.name}", '
            f'"PartitionedFromPattern": "{"_".join(parts)}_"}})\n'
            f"                with R.dataflow():\n{ops}                return {last}\n\n"
            f"            out = composite({args})\n            R.output(out)\n"
            f"        return out\n")


def _layer(transposed: bool, bias_shape: tuple | None, activation: str | None,
           x_ty=None, w_ty=None, axes=None, bias_dtype="float32") -> tvm.IRModule:
    """The layer of :func:`_script` with any input types, to reach the check's edges."""
    x = relax.Var("x", x_ty or relax.TensorType((4, 16), "float32"))
    w = relax.Var("w", w_ty or relax.TensorType((8, 16) if transposed else (16, 8), "float32"))
    y = relax.op.matmul(x, relax.op.permute_dims(w, axes) if transposed else w)
    if bias_shape is not None:
        y = relax.op.add(relax.Var("b", relax.TensorType(bias_shape, bias_dtype)), y)
    if activation is not None:
        y = {"relu": relax.op.nn.relu, "gelu": relax.op.nn.gelu,
             "gelu_tanh": relax.op.nn.gelu_tanh, "silu": relax.op.nn.silu}[activation](y)
    return pk.from_expr(y)


def _cast_to_bfloat16_layer(transposed: bool, activation: str | None) -> tvm.IRModule:
    """A float16 layer whose float32 product is cast to bfloat16, not back to float16."""
    x = relax.Var("x", relax.TensorType((4, 16), "float16"))
    w = relax.Var("w", relax.TensorType((8, 16) if transposed else (16, 8), "float16"))
    y = relax.op.matmul(x, relax.op.permute_dims(w) if transposed else w, out_dtype="float32")
    y = relax.op.add(relax.op.astype(y, "bfloat16"),
                     relax.Var("b", relax.TensorType((8,), "bfloat16")))
    if activation is not None:
        y = {"relu": relax.op.nn.relu, "gelu": relax.op.nn.gelu,
             "gelu_tanh": relax.op.nn.gelu_tanh, "silu": relax.op.nn.silu}[activation](y)
    return pk.from_expr(y)


def _negatives(transposed: bool, bias: bool, activation: str | None) -> list[Negative]:
    """The check's edges for this variant, and near misses of its pattern."""
    b = (8,) if bias else None
    out: list[Negative] = []
    if transposed:
        out += [
            Negative("permute_that_swaps_the_leading_axes", _layer(
                True, (8,) if bias else None, activation,
                w_ty=relax.TensorType((16, 2, 8), "float32"), axes=[1, 0, 2]),
                "permute_dims(weight, axes=[1, 0, 2]) does not swap the last two axes of the "
                "rank-3 weight: the product is not x @ weight^T"),
            Negative("weight_of_unknown_rank", _layer(
                True, b, activation, w_ty=relax.TensorType(ndim=-1, dtype="float32")),
                "the permuted weight has an unknown rank: a transposed weight has at least "
                "two axes"),
            Negative("vector_weight", _layer(
                True, (4,) if bias else None, activation,
                w_ty=relax.TensorType((16,), "float32")),
                "the permuted weight has rank 1: a transposed weight has at least two axes"),
        ]
    if bias:
        out += [
            Negative("full_tensor_add", _layer(transposed, (4, 8), activation),
                     "the added tensor of shape (4, 8) is not a per-feature bias of the matmul "
                     "output (4, 8): it has shape (4, 8)"),
            Negative("single_value_add", _layer(transposed, (1,), activation),
                     "the added tensor of shape (1,) is not a per-feature bias of the matmul "
                     "output (4, 8): it has shape (1,)"),
            Negative("bias_along_the_rows", _layer(
                transposed, (4, 1), activation, w_ty=relax.TensorType(
                    (4, 16) if transposed else (16, 4), "float32")),
                "the added tensor of shape (4, 1) is not a per-feature bias of the matmul "
                "output (4, 4): it varies along axis 0, the feature axis is 1"),
            Negative("bias_of_unknown_dtype", _layer(transposed, (8,), activation,
                                                     bias_dtype=""),
                     "bias dtype None differs from the matmul output dtype float32"),
            Negative("cast_to_another_dtype", _cast_to_bfloat16_layer(transposed, activation),
                     "the matmul's result is cast to bfloat16, not back to its operands' "
                     "float16"),
            Negative("output_of_unknown_shape", _layer(
                transposed, (8,), activation, x_ty=relax.TensorType(ndim=-1, dtype="float32")),
                "the matmul output has no known shape"),
        ]
    if activation is not None:
        other = "relu" if activation != "relu" else "silu"
        out.append(Negative(f"{other}_instead_of_{activation}", _layer(transposed, b, other),
                            "no match"))
    if transposed:
        out.append(Negative("weight_not_permuted", _layer(False, b, activation), "no match"))
    elif bias:
        out.append(Negative("no_bias_added", _layer(False, None, activation), "no match"))
    if not transposed and not bias and activation is None:
        x = relax.Var("x", relax.TensorType((4, 16), "float32"))
        out.append(Negative("no_matmul", pk.from_expr(relax.op.nn.relu(x)), "no match"))
    return out


def _case(transposed: bool, bias: bool, activation: str | None) -> RuleCase:
    return RuleCase(MatmulComposite(transposed=transposed, bias=bias, activation=activation),
                    tvm.script.from_source(_script(transposed, bias, activation, False)),
                    tvm.script.from_source(_script(transposed, bias, activation, True)),
                    negatives=_negatives(transposed, bias, activation), tolerance=EXACT)


MATMUL_TRANSPOSED_BIAS_RELU_CASE = _case(True, True, "relu")
MATMUL_TRANSPOSED_BIAS_GELU_CASE = _case(True, True, "gelu")
MATMUL_TRANSPOSED_BIAS_GELU_TANH_CASE = _case(True, True, "gelu_tanh")
MATMUL_TRANSPOSED_BIAS_SILU_CASE = _case(True, True, "silu")
MATMUL_TRANSPOSED_BIAS_CASE = _case(True, True, None)
MATMUL_TRANSPOSED_SILU_CASE = _case(True, False, "silu")
MATMUL_TRANSPOSED_CASE = _case(True, False, None)
MATMUL_BIAS_RELU_CASE = _case(False, True, "relu")
MATMUL_BIAS_GELU_CASE = _case(False, True, "gelu")
MATMUL_BIAS_GELU_TANH_CASE = _case(False, True, "gelu_tanh")
MATMUL_BIAS_SILU_CASE = _case(False, True, "silu")
MATMUL_BIAS_CASE = _case(False, True, None)
MATMUL_SILU_CASE = _case(False, False, "silu")
MATMUL_CASE = _case(False, False, None)


def test_matmul_transposed_bias_relu_meets_the_rule_contract():
    check_rule(MATMUL_TRANSPOSED_BIAS_RELU_CASE)


def test_matmul_transposed_bias_gelu_meets_the_rule_contract():
    check_rule(MATMUL_TRANSPOSED_BIAS_GELU_CASE)


def test_matmul_transposed_bias_gelu_tanh_meets_the_rule_contract():
    check_rule(MATMUL_TRANSPOSED_BIAS_GELU_TANH_CASE)


def test_matmul_transposed_bias_silu_meets_the_rule_contract():
    check_rule(MATMUL_TRANSPOSED_BIAS_SILU_CASE)


def test_matmul_transposed_bias_meets_the_rule_contract():
    check_rule(MATMUL_TRANSPOSED_BIAS_CASE)


def test_matmul_transposed_silu_meets_the_rule_contract():
    check_rule(MATMUL_TRANSPOSED_SILU_CASE)


def test_matmul_transposed_meets_the_rule_contract():
    check_rule(MATMUL_TRANSPOSED_CASE)


def test_matmul_bias_relu_meets_the_rule_contract():
    check_rule(MATMUL_BIAS_RELU_CASE)


def test_matmul_bias_gelu_meets_the_rule_contract():
    check_rule(MATMUL_BIAS_GELU_CASE)


def test_matmul_bias_gelu_tanh_meets_the_rule_contract():
    check_rule(MATMUL_BIAS_GELU_TANH_CASE)


def test_matmul_bias_silu_meets_the_rule_contract():
    check_rule(MATMUL_BIAS_SILU_CASE)


def test_matmul_bias_meets_the_rule_contract():
    check_rule(MATMUL_BIAS_CASE)


def test_matmul_silu_meets_the_rule_contract():
    check_rule(MATMUL_SILU_CASE)


def test_matmul_meets_the_rule_contract():
    check_rule(MATMUL_CASE)


# -- names and table order ----------------------------------------------------------------------
def test_variants_carry_tvm_table_names():
    """cutlass / cublas name these entries exactly so (python/tvm/relax/backend/cuda)."""
    names = {r.name.split(".", 1)[1] for r in matmul_table()}
    assert {"matmul", "matmul_bias", "matmul_bias_relu", "matmul_bias_gelu",
            "matmul_transposed", "matmul_transposed_bias", "matmul_transposed_bias_relu",
            "matmul_transposed_bias_gelu"} <= names
    every = [MatmulComposite("c", t, b, a) for t in (False, True) for b in (False, True)
             for a in (None, *ACTIVATIONS)]
    assert len({r.name for r in every}) == len(every) == 20
    assert PatternTable(matmul_table("cutlass")).names[0] == "cutlass.matmul_transposed_bias_relu"
    with pytest.raises(ValueError, match="activation must be None or one of"):
        MatmulComposite(activation="tanh")


def test_the_library_holds_the_table_in_priority_order():
    # the batch-norm fold first: combining parallel matmuls would hide each one's batch norm
    assert RULES == (BatchnormFoldIntoMatmul, CombineParallelMatmul)
    assert [r.name for r in COMPOSITES] == [r.name for r in matmul_table()]
    library = [r.rule_name for r in LIBRARY if isinstance(r, MatmulComposite)]
    assert library == [r.name for r in matmul_table()]


def test_a_transposed_chain_goes_to_the_transposed_entry_with_its_bias_and_gelu():
    """With the whole table, the most specific entry wins: not matmul_bias with a gelu left
    over, nor an untransposed matmul that leaves the permute_dims out."""
    mod = _layer(True, (8,), "gelu")
    log = CompositeLog()
    out = merge_composite(mod, matmul_table(), log=log)
    [(_, func)] = composite_functions(out)
    assert str(func.attrs["Composite"]) == "byoc.matmul_transposed_bias_gelu"
    pk.assert_same_numerics(mod, out, rtol=0, atol=0)


# -- the examples: torch's reshape around nn.Linear, symbolic batch, float16 ----------------------
@pytest.mark.parametrize("rule", matmul_table(), ids=lambda r: r.name)
def test_each_entry_takes_both_layers_of_a_float16_mlp_with_symbolic_batch(rule):
    mod = rule.example(dtype="float16")
    out = merge_composite(mod, [rule])
    composites = composite_functions(out)
    assert [str(f.attrs["Composite"]) for _, f in composites] == [rule.name] * 2
    pk.assert_same_numerics(mod, out, shape_vars={"batch": 2, "seq": 5}, rtol=0, atol=0)


@pytest.mark.parametrize("rule", matmul_table(), ids=lambda r: r.name)
def test_each_entry_takes_a_float16_matmul_accumulated_in_float32_with_its_cast(rule):
    # astype(matmul(x, w, out_dtype="float32"), "float16"): ToMixedPrecision's form and
    # patternkit's float16 torch import; the cast goes into the composite
    mod = rule.example(dtype="float16", accumulate="cast_back")
    out = merge_composite(mod, [rule])
    composites = composite_functions(out)
    assert [str(f.attrs["Composite"]) for _, f in composites] == [rule.name] * 2
    for _, func in composites:
        ops = {pk.ir.op_name(b.value) for block in func.body.blocks for b in block.bindings}
        assert {"relax.matmul", "relax.astype"} <= ops
    pk.assert_same_numerics(mod, out, shape_vars={"batch": 2, "seq": 5}, rtol=0, atol=0)


@pytest.mark.parametrize("knobs", [{"frontend": "direct"}, {"shape": "static"},
                                   {"shape": "matrix"}, {"bias_shape": "row"}],
                         ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_the_biased_gelu_entry_takes_every_frontend_spelling(knobs):
    rule = MatmulComposite(transposed=True, bias=True, activation="gelu")
    mod = rule.example(**knobs)
    out = merge_composite(mod, [rule])
    assert len(composite_functions(out)) == 2
    pk.assert_same_numerics(mod, out, rtol=0, atol=0)


@pytest.mark.parametrize("bias_shape, reason", [
    ("scalar", "it has shape (1,)"), ("residual", "is not a per-feature bias")])
def test_the_biased_entries_refuse_what_is_no_bias_in_the_example(bias_shape, reason):
    rule = MatmulComposite(bias=True, activation="relu")
    mod = rule.example(bias_shape=bias_shape)
    log = CompositeLog()
    out = merge_composite(mod, [rule], log=log)
    assert composite_functions(out) == []
    assert log.skipped and all(reason in s.reason for s in log.skipped)


# -- a torch-exported MLP: the activation collapses feed the matmul composites ------------------
@pytest.mark.models
def test_a_torch_exported_mlp_with_dynamic_batch_offloads_every_linear_with_its_activation():
    torch = pytest.importorskip("torch")
    activations = pytest.importorskip("transformers.activations")
    from tvm.relax.frontend.torch import from_exported_program

    class MLP(torch.nn.Module):
        """GPT-2's GELU, BERT's erf GELU written out, and a bias-free Llama-style gate."""

        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(16, 32)
            self.mid = torch.nn.Linear(32, 32)
            self.gate = torch.nn.Linear(32, 16, bias=False)
            self.new_gelu = activations.NewGELUActivation()
            self.erf_gelu = activations.GELUActivation(use_gelu_python=True)

        def forward(self, x):
            h = self.erf_gelu(self.mid(self.new_gelu(self.up(x))))
            g = self.gate(h)
            return g * torch.sigmoid(g)

    torch.manual_seed(0)
    exported = torch.export.export(MLP().eval(), (torch.randn(2, 5, 16),),
                                   dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    mod = from_exported_program(exported, unwrap_unit_return_tuple=True)
    log = pk.RewriteLog()
    collapsed = pk.rewrite(LIBRARY, mod, log=log)
    assert {name: log.count(name) for name in ("gelu.collapse", "gelu_tanh.collapse",
                                               "silu.collapse")} == {
        "gelu.collapse": 1, "gelu_tanh.collapse": 1, "silu.collapse": 1}
    # float32, inputs in [-3, 3): the fused ops round a few ulp differently (measured 3e-8)
    pk.assert_same_numerics(mod, collapsed, shape_vars={"batch": 3}, low=-3.0, high=3.0,
                            rtol=1e-5, atol=1e-5)
    merged = merge_composite(collapsed, LIBRARY.composites())
    assert sorted(str(f.attrs["Composite"]) for _, f in composite_functions(merged)) == [
        "byoc.matmul_transposed_bias_gelu", "byoc.matmul_transposed_bias_gelu_tanh",
        "byoc.matmul_transposed_silu"]
    pk.assert_same_numerics(collapsed, merged, shape_vars={"batch": 3}, rtol=0, atol=0)


# -- matmul.combine_parallel --------------------------------------------------------------

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


@I.ir_module
class ComputedWeightsReshaped:
    @R.function
    def main(x: R.Tensor((2, 4, 8), "float32"), w: R.Tensor((8, 4), "float32"),
             ) -> R.Tensor((8, 8), "float32"):
        with R.dataflow():
            w2 = R.multiply(w, w)
            ra = R.reshape(x, R.shape([8, 8]))
            a = R.matmul(ra, w2)
            rb = R.reshape(x, R.shape([8, 8]))
            b = R.matmul(rb, w)
            out = R.concat((a, b), axis=-1)
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


@I.ir_module
class TorchLinearsReshaped:  # the torch importer's q/k/v: x reshaped once per nn.Linear
    @R.function
    def main(x: R.Tensor((2, 4, 8), "float32"), wq: R.Tensor((6, 8), "float32"),
             wk: R.Tensor((6, 8), "float32"), bq: R.Tensor((6,), "float32"),
             bk: R.Tensor((6,), "float32")) -> R.Tensor((8, 6), "float32"):
        with R.dataflow():
            xq = R.reshape(x, R.shape([8, 8]))
            tq = R.permute_dims(wq, axes=None)
            q = R.matmul(xq, tq)
            q1 = R.add(bq, q)
            xk = R.reshape(x, R.shape([8, 8]))
            tk = R.permute_dims(wk, axes=None)
            k = R.matmul(xk, tk)
            k1 = R.add(bk, k)
            out = R.multiply(q1, k1)
            R.output(out)
        return out


@I.ir_module
class TorchLinearsReshapedCombined:
    @R.function
    def main(x: R.Tensor((2, 4, 8), "float32"), wq: R.Tensor((6, 8), "float32"),
             wk: R.Tensor((6, 8), "float32"), bq: R.Tensor((6,), "float32"),
             bk: R.Tensor((6,), "float32")) -> R.Tensor((8, 6), "float32"):
        with R.dataflow():
            tq = R.permute_dims(wq, axes=None)
            tk = R.permute_dims(wk, axes=None)
            left = R.reshape(x, R.shape([8, 8]))
            merged = R.matmul(left, R.concat((tq, tk), axis=-1))
            biased = R.add(merged, R.concat((bq, bk), axis=0))
            parts = R.split(biased, indices_or_sections=[6], axis=-1)
            q1 = parts[0]
            k1 = parts[1]
            out = R.multiply(q1, k1)
            R.output(out)
        return out


@I.ir_module
class ReshapedAlsoReadElsewhere:
    @R.function
    def main(x: R.Tensor((2, 4, 8), "float32"), w0: R.Tensor((8, 4), "float32"),
             w1: R.Tensor((8, 4), "float32")) -> R.Tensor((8, 8), "float32"):
        with R.dataflow():
            a = R.reshape(x, R.shape([8, 8]))
            p = R.matmul(a, w0)
            b = R.reshape(x, R.shape([8, 8]))
            q = R.matmul(b, w1)
            s = R.concat((p, q), axis=-1)
            out = R.add(s, a)
            R.output(out)
        return out


RESHAPED_CASE = RuleCase(
    CombineParallelMatmul(reshaped=True), TorchLinearsReshaped, TorchLinearsReshapedCombined,
    negatives=[
        Negative("reshaped_to_other_shapes",
                 parallel_projections(branches=2, reshaped=True, shapes=[(8, 8), (4, 16)]),
                 "fewer than two matmuls of 'x' can be combined: 'lv2': x is reshaped to "
                 "(4, 16), not to the first branch's (8, 8)"),
        Negative("reshape_also_read_elsewhere", ReshapedAlsoReadElsewhere,
                 "'a': this reshape of x is not read by one matmul alone, as its left "
                 "operand"),
        Negative("computed_weights_after_reshapes", ComputedWeightsReshaped,
                 "'a': its weight is computed in the function"),
    ],
    tolerance=SAME_DOT_PRODUCTS)


def test_combine_parallel_reshaped_meets_the_rule_contract():
    check_rule(RESHAPED_CASE)


@pytest.mark.parametrize("knobs", [{}, {"bias": True, "branches": 4},
                                   {"dtype": "float16", "branches": 2}],
                         ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "qkv")
def test_matmuls_of_x_reshaped_once_per_branch_are_combined_on_one_reshape(knobs):
    rule = CombineParallelMatmul(reshaped=True)
    before = rule.example(**knobs)
    after = pk.rewrite(rule, before)
    ops = _ops(after)
    assert ops.count("relax.reshape") == 1 and ops.count("relax.matmul") == 1
    pk.assert_same_numerics(before, after, rtol=0, atol=0)


def test_constant_weights_and_biases_fold_into_one_constant_each():
    before = parallel_projections(branches=4, bias=True)
    after = pk.rewrite(CombineParallelMatmul(), before)
    assert _ops(after) == ["relax.matmul", "relax.add", "relax.split", "relax.concat"]
    matmul = next(b.value for b in after["main"].body.blocks[0].bindings
                  if C.op_name(b.value) == "relax.matmul")
    assert C.is_tensor_constant(matmul.args[1])
    assert C.static_shape(C.type_of(matmul.args[1])) == (8, 4 + 5 + 6 + 7)
    pk.assert_same_numerics(before, after, rtol=0, atol=0)


def test_float16_branches_keep_their_dtype():
    before = parallel_projections(dtype="float16")
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


def test_batchnorm_fold_into_a_linear_meets_the_rule_contract():
    check_rule(FOLD_CASE)


@pytest.mark.models
def test_a_torch_imported_berts_projections_are_combined_without_cse(zoo):
    """The torch importer reshapes the hidden states once per nn.Linear: there
    matmul.combine_parallel combines nothing, the reshaped variant every layer's q/k/v."""
    model = zoo("bert")
    plain = pk.RewriteLog()
    pk.rewrite(CombineParallelMatmul(), model.mod, log=plain)
    assert plain.count("matmul.combine_parallel") == 0
    log = pk.RewriteLog()
    after = pk.rewrite(CombineParallelMatmul(reshaped=True), model.mod, log=log)
    layers = model.spec.as_dict()["layers"]
    # one combination per layer: query, key and value read the same hidden states
    assert log.count("matmul.combine_parallel_reshaped") == layers
    assert [len(r.replaced) for r in log.records
            if r.rule == "matmul.combine_parallel_reshaped"] == [3] * layers
    vm = build_for_checks(after)
    out = vm[model.entry](*(tvm.runtime.tensor(np.array(a)) for a in model.arguments()))
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    # float32 through the whole model: within 1e-4 of the torch module's own output
    np.testing.assert_allclose(got, model.reference()[0], rtol=0, atol=1e-4)
