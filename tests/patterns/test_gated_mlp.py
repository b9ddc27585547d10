"""gated_mlp: SwiGLU and GeGLU MLPs (separate or packed gate and up weights) form composites."""

from __future__ import annotations

import pytest
import tvm

import patternkit as pk
from patternkit.byoc import composite_functions, merge_composite
from patternkit.patterns import LIBRARY
from patternkit.patterns.gated_mlp import GatedMlpComposite
from patternkit.patterns.gated_mlp.examples import gated_mlp
from patternkit.testing import EXACT, Negative, RuleCase, apply_rule, check_rule

#: A Llama MLP's gate and up projections as the torch importer writes them (weights kept
#: as parameters), with symbolic batch and sequence; ``{act}`` is the gate's activation.
SEPARATE = """
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), w_gate: R.Tensor((32, 16), "float32"),
             w_up: R.Tensor((32, 16), "float32")) -> R.Tensor(("n", "s", 32), "float32"):
        n = T.int64()
        s = T.int64()
        with R.dataflow():
            wg = R.permute_dims(w_gate, axes=[1, 0])
            xg = R.reshape(x, R.shape([n * s, 16]))
            g2 = R.matmul(xg, wg)
            g = R.reshape(g2, R.shape([n, s, 32]))
            wu = R.permute_dims(w_up, axes=[1, 0])
            xu = R.reshape(x, R.shape([n * s, 16]))
            u2 = R.matmul(xu, wu)
            u = R.reshape(u2, R.shape([n, s, 32]))
            a = R.nn.{act}(g)
            out = R.multiply(a, u)
            R.output(out)
        return out
"""

SEPARATE_COMPOSITE = """
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), w_gate: R.Tensor((32, 16), "float32"),
             w_up: R.Tensor((32, 16), "float32")) -> R.Tensor(("n", "s", 32), "float32"):
        n = T.int64()
        s = T.int64()
        with R.dataflow():
            @R.function
            def composite(x1: R.Tensor((n, s, 16), "float32"),
                          w_gate1: R.Tensor((32, 16), "float32"),
                          w_up1: R.Tensor((32, 16), "float32")) -> R.Tensor((n, s, 32), "float32"):
                R.func_attr({{"Composite": "byoc.{name}",
                             "PartitionedFromPattern": "reshape_permute_dims_matmul_reshape_"
                                                       "nn.{act}_"
                                                       "reshape_permute_dims_matmul_reshape_multiply_"}})
                with R.dataflow():
                    wg = R.permute_dims(w_gate1, axes=[1, 0])
                    xg = R.reshape(x1, R.shape([n * s, 16]))
                    g2 = R.matmul(xg, wg)
                    g = R.reshape(g2, R.shape([n, s, 32]))
                    wu = R.permute_dims(w_up1, axes=[1, 0])
                    xu = R.reshape(x1, R.shape([n * s, 16]))
                    u2 = R.matmul(xu, wu)
                    u = R.reshape(u2, R.shape([n, s, 32]))
                    a = R.nn.{act}(g)
                    out1 = R.multiply(a, u)
                    R.output(out1)
                return out1

            out = composite(x, w_gate, w_up)
            R.output(out)
        return out
"""

#: One projection of twice the width chunked in two (``linear(x).chunk(2, -1)``), the
#: multiply written ``u * act(g)``.
PACKED = """
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), w: R.Tensor((64, 16), "float32"),
             ) -> R.Tensor(("n", "s", 32), "float32"):
        n = T.int64()
        s = T.int64()
        with R.dataflow():
            wt = R.permute_dims(w, axes=[1, 0])
            x2 = R.reshape(x, R.shape([n * s, 16]))
            h2 = R.matmul(x2, wt)
            h = R.reshape(h2, R.shape([n, s, 64]))
            parts = R.split(h, indices_or_sections=[32], axis=-1)
            g = parts[0]
            u = parts[1]
            a = R.nn.{act}(g)
            out = R.multiply(u, a)
            R.output(out)
        return out
"""

PACKED_COMPOSITE = """
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("n", "s", 16), "float32"), w: R.Tensor((64, 16), "float32"),
             ) -> R.Tensor(("n", "s", 32), "float32"):
        n = T.int64()
        s = T.int64()
        with R.dataflow():
            @R.function
            def composite(x1: R.Tensor((n, s, 16), "float32"), w1: R.Tensor((64, 16), "float32"),
                          ) -> R.Tensor((n, s, 32), "float32"):
                R.func_attr({{"Composite": "byoc.{name}_packed",
                             "PartitionedFromPattern": "reshape_permute_dims_matmul_reshape_split_"
                                                       "TupleGetItem1_TupleGetItem0_nn.{act}_multiply_"}})
                with R.dataflow():
                    wt = R.permute_dims(w1, axes=[1, 0])
                    x2 = R.reshape(x1, R.shape([n * s, 16]))
                    h2 = R.matmul(x2, wt)
                    h = R.reshape(h2, R.shape([n, s, 64]))
                    parts = R.split(h, indices_or_sections=[32], axis=-1)
                    g = parts[0]
                    u = parts[1]
                    a = R.nn.{act}(g)
                    out1 = R.multiply(u, a)
                    R.output(out1)
                return out1

            out = composite(x, w)
            R.output(out)
        return out
"""

NAMES = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu_tanh"}


def _module(template: str, act: str) -> tvm.IRModule:
    return tvm.script.from_source(template.format(act=act, name=NAMES[act]))


def _negatives(act: str, packed: bool) -> list[Negative]:
    """Every refusal of the variant, each at its edge (the examples' knobs)."""
    def example(**knobs):
        return gated_mlp(activation=act, packed=packed, **knobs)

    projection = "packed" if packed else "gate"
    cases = [
        Negative("weight_permute_is_no_transpose",
                 example(shape="matrix", weights="permuted_wrongly"),
                 f"the {projection} projection's permute_dims(weight, axes=[1, 0, 2]) does not "
                 f"swap the last two axes of its rank-3 weight: the product is not "
                 f"x @ weight^T"),
        Negative("bias_is_a_full_tensor", example(shape="static", bias=True, bias_shape="full"),
                 f"the {projection} projection adds a tensor of shape "
                 f"(10, {64 if packed else 32}) that is not a per-feature bias"),
        Negative("float32_mlp_narrowed_to_float16", example(accumulate="narrowed"),
                 f"the {projection} projection's product is cast to float16, not back to the "
                 f"input's float32: the MLP does not compute in its input's dtype"),
        Negative("activation_in_float16_on_a_float32_gate",
                 example(accumulate="activation_in_float16"),
                 "the activation computes in float16 on a float32 gate and gives float32: only "
                 "a round trip through a float as wide or wider"),
    ]
    if packed:
        cases += [
            Negative("split_in_three", example(halves="thirds"),
                     "the packed projection is split into 3 parts of shapes [(batch, seq, 32), "
                     "(batch, seq, 32), (batch, seq, 32)] along axis -1: a packed gate and up "
                     "projection is split into two equal halves of its last axis"),
            Negative("one_half_read_twice", example(halves="same"),
                     "the activation and the multiply read the same half (0) of the packed "
                     "projection: not a gate times an up product"),
            Negative("one_slice_read_twice", example(halves="same", cut="slices"),
                     "the packed projection's halves are sliced as [0, 32) (the gate) and "
                     "[0, 32) (the up product) of its last axis of 64 lanes: a packed gate "
                     "and up projection is cut in two equal halves of its last axis"),
            Negative("slices_of_thirds", example(halves="thirds", cut="slices"),
                     "the packed projection's halves are sliced as [0, 32) (the gate) and "
                     "[32, 64) (the up product) of its last axis of 96 lanes"),
            Negative("gate_split_up_sliced", example(cut="mixed"),
                     "the gate is read as an item of a split and the up product by a "
                     "strided_slice of the packed projection: a packed gate and up projection "
                     "is cut in two halves one way"),
        ]
    else:
        cases.append(Negative("multiply_broadcasts", example(up_width=1),
                              "the multiply broadcasts operands of shapes (batch, seq, 32) and "
                              "(batch, seq, 1): a gated MLP multiplies the gate and the up "
                              "product elementwise"))
    return cases


def _case(act: str, packed: bool) -> RuleCase:
    before, expected = (PACKED, PACKED_COMPOSITE) if packed else (SEPARATE, SEPARATE_COMPOSITE)
    return RuleCase(GatedMlpComposite(activation=act, packed=packed), _module(before, act),
                    _module(expected, act), negatives=_negatives(act, packed), tolerance=EXACT)


SWIGLU_CASE = _case("silu", packed=False)
SWIGLU_PACKED_CASE = _case("silu", packed=True)
GEGLU_CASE = _case("gelu", packed=False)
GEGLU_PACKED_CASE = _case("gelu", packed=True)
GEGLU_TANH_CASE = _case("gelu_tanh", packed=False)
GEGLU_TANH_PACKED_CASE = _case("gelu_tanh", packed=True)


def test_swiglu_composite_meets_the_rule_contract():
    check_rule(SWIGLU_CASE)


def test_packed_swiglu_composite_meets_the_rule_contract():
    check_rule(SWIGLU_PACKED_CASE)


def test_geglu_composite_meets_the_rule_contract():
    check_rule(GEGLU_CASE)


def test_packed_geglu_composite_meets_the_rule_contract():
    check_rule(GEGLU_PACKED_CASE)


def test_geglu_tanh_composite_meets_the_rule_contract():
    check_rule(GEGLU_TANH_CASE)


def test_packed_geglu_tanh_composite_meets_the_rule_contract():
    check_rule(GEGLU_TANH_PACKED_CASE)


FORMS = [dict(order="gate_first"), dict(order="up_first"), dict(weights="direct"),
         dict(bias=True), dict(bias=True, order="up_first", shape="static"),
         dict(shape="matrix")]


def _forms_one_composite(before, rule):
    applied = apply_rule(rule, before)
    assert applied.fired == 1
    names = [str(f.attrs["Composite"]) for _, f in composite_functions(applied.module)]
    assert names == [rule.rule_name]
    pk.assert_same_numerics(before, applied.module, shape_vars={"batch": 2, "seq": 3},
                            rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("knobs", FORMS, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_every_form_forms_one_composite_computing_what_its_region_computed(knobs, packed, dtype):
    rule = GatedMlpComposite(packed=packed)
    _forms_one_composite(gated_mlp(packed=packed, dtype=dtype, **knobs), rule)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("packed", [False, True])
def test_geglu_forms_in_float16_too(act, packed):
    rule = GatedMlpComposite(activation=act, packed=packed)
    _forms_one_composite(gated_mlp(activation=act, packed=packed, dtype="float16",
                                   order="up_first"), rule)


def test_a_half_precision_mlp_accumulated_in_float32_forms_one_composite():
    # torch.export of a float16 / bfloat16 MLP: matmul(out_dtype="float32") cast back, the
    # activation computed in float32 between casts
    _forms_one_composite(gated_mlp(dtype="float16", accumulate="float32", bias=True),
                         GatedMlpComposite())
    _forms_one_composite(gated_mlp(activation="gelu", packed=True, dtype="bfloat16",
                                   accumulate="float32"),
                         GatedMlpComposite(activation="gelu", packed=True))


def test_packed_halves_cut_by_two_strided_slices_form_the_packed_composite():
    # the TorchScript ONNX exporter writes chunk(2, -1) as two Slice: strided_slice [0, 32)
    # and [32, 64) of the packed product's last axis (either half the gate)
    _forms_one_composite(gated_mlp(packed=True, cut="slices"), GatedMlpComposite(packed=True))
    _forms_one_composite(gated_mlp(activation="gelu", packed=True, cut="slices",
                                   halves="up_gate", dtype="float16"),
                         GatedMlpComposite(activation="gelu", packed=True))


@pytest.mark.parametrize("packed", [False, True])
def test_the_library_takes_the_gated_mlp_before_the_gate_matmul_silu_composite(packed):
    before = gated_mlp(packed=packed)
    merged = merge_composite(before, LIBRARY.composites())
    names = sorted(str(f.attrs["Composite"]) for _, f in composite_functions(merged))
    expected = "byoc.swiglu_packed" if packed else "byoc.swiglu"
    assert names == ["byoc.matmul_transposed", expected]  # the down projection stays a matmul


def test_composites_are_named_for_their_compiler():
    assert GatedMlpComposite("tensorrt").rule_name == "tensorrt.swiglu"
    assert GatedMlpComposite("cutlass", "gelu_tanh", packed=True).rule_name == \
        "cutlass.geglu_tanh_packed"
    with pytest.raises(ValueError, match="activation must be one of"):
        GatedMlpComposite(activation="relu")


# -- as the torch importer writes transformers' MLPs ------------------------------------------
@pytest.mark.models
def test_every_mlp_of_a_torch_exported_llama_and_phi3_stack_forms_one_composite():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP
    from transformers.models.phi3.modeling_phi3 import Phi3MLP

    from patternkit.models.importing import from_torch

    config = dict(hidden_size=16, intermediate_size=32, hidden_act="silu", num_attention_heads=4,
                  num_key_value_heads=4)
    llama = transformers.LlamaConfig(**config)
    phi3 = transformers.Phi3Config(**config)

    class Stack(torch.nn.Module):
        """Two Llama MLPs (separate gate and up) and one Phi-3 MLP (packed), residuals."""

        def __init__(self):
            super().__init__()
            self.mlps = torch.nn.ModuleList([LlamaMLP(llama), LlamaMLP(llama), Phi3MLP(phi3)])

        def forward(self, x):
            for mlp in self.mlps:
                x = x + mlp(x)
            return x

    torch.manual_seed(0)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    exported = torch.export.export(Stack().eval(), (torch.randn(2, 5, 16),),
                                   dynamic_shapes=(dims,))
    mod, _, _ = from_torch(exported, False, "main", "stack", {})
    collapsed = pk.rewrite(LIBRARY, mod)
    merged = merge_composite(collapsed, LIBRARY.composites())
    names = sorted(str(f.attrs["Composite"]) for _, f in composite_functions(merged))
    assert names.count("byoc.swiglu") == 2 and names.count("byoc.swiglu_packed") == 1
    assert "byoc.matmul_transposed_silu" not in names  # no gate taken alone
    shapes = {str(v): 3 for v in _shape_vars(mod)}
    pk.assert_same_numerics(collapsed, merged, shape_vars=shapes, rtol=0, atol=0)


def _shape_vars(mod):
    """The symbolic dimensions of ``main``'s first parameter."""
    return [d for d in mod["main"].params[0].ty.shape if not isinstance(d, tvm.tirx.IntImm)]
