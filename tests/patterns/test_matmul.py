"""patterns/matmul.py: matmul [+ bias] [-> activation] composites under TVM's table names."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.byoc import CompositeLog, PatternTable, composite_functions, merge_composite
from patternkit.patterns import LIBRARY
from patternkit.patterns.matmul import (ACTIVATIONS, COMPOSITES, RULES, MatmulComposite,
                                        matmul_table)
from patternkit.testing import EXACT, Negative, RuleCase, check_rule

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
    assert RULES == ()
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
