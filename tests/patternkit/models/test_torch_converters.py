"""The converters of :mod:`patternkit.models.torch_converters`: torch spellings TVM 0.27's
``from_exported_program`` refuses import through :func:`from_torch` and compute what
torch computes; a model TVM imports imports exactly as TVM imports it.

Tolerances: float32 ``rtol = atol = 1e-5`` (the same reductions in another order);
bfloat16 ``rtol = atol = 1.6e-2`` on outputs of order one (bfloat16's epsilon is 7.8e-3:
torch and the import round the norm's result once each, at most an ulp or two apart;
a wrong axis or a dropped weight is off by the size of the values).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from patternkit.ir import dtype_of, op_name
from patternkit.models.importing import from_torch
from patternkit.verification import numeric

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

FLOAT32 = dict(rtol=1e-5, atol=1e-5)
BFLOAT16 = dict(rtol=1.6e-2, atol=1.6e-2)


class Softmaxes(torch.nn.Module):
    """A softmax written out with ``amax``, ``amin`` over two axes, ``amax`` of all."""

    def forward(self, x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True), x.amin((0, 2)), x.amax()


class InstanceNorms(torch.nn.Module):
    """``nn.InstanceNorm2d(affine=True)`` (it decomposes into a repeat of its weight and
    bias per sample and a view of the input as (1, N*C, H, W)), one without a weight,
    and a repeat of a weight by the batch and 2."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.InstanceNorm2d(4, affine=True)
        self.plain = torch.nn.InstanceNorm2d(4)
        self.row = torch.nn.Parameter(torch.linspace(-1, 1, 3))

    def forward(self, x):
        return self.norm(x), self.plain(2 * x + 1), self.row.repeat(x.shape[0], 2)


class Norms(torch.nn.Module):
    """A group norm, an instance norm and a layer norm of one input, and a layer norm
    without a weight and bias."""

    def __init__(self):
        super().__init__()
        self.group = torch.nn.GroupNorm(2, 4)
        self.instance = torch.nn.InstanceNorm2d(4, affine=True)
        self.layer = torch.nn.LayerNorm(8)
        self.plain = torch.nn.LayerNorm(8, elementwise_affine=False)

    def forward(self, x):
        return self.group(x), self.instance(x), self.layer(x), self.plain(3 * x)


def _weights(module):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(0.5, 1.5)
    return module.eval()


def _ops(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e))
    return [(op_name(e), e) for e in found if op_name(e)]


def test_amax_and_amin_import_as_max_and_min():
    model = Softmaxes()
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype("float32")
    mod, _, notes = from_torch(torch.export.export(model, (torch.from_numpy(x),)),
                               False, "main", "softmaxes", {})
    assert notes == ["2 amax.default imported as max (TVM's importer has none)",
                     "1 amin.default imported as min (TVM's importer has none)"]
    expected = [t.numpy() for t in model(torch.from_numpy(x))]
    comparison = numeric.compare_outputs(expected, numeric.run(mod, [x]), **FLOAT32)
    assert comparison.ok, comparison


class Counts(torch.nn.Module):
    """``(ids != 1).cumsum(-1)`` (transformers' packed-sequence check on position ids when
    no attention mask is given) and arithmetic on it, an int32 cumsum, and cumsums that
    name their dtype or sum floats (TVM's converter imports those)."""

    def forward(self, ids):
        counts = (ids != 1).cumsum(-1)
        return (counts, counts * 2 + 1, ids.int().cumsum(0),
                ids.cumsum(-1, dtype=torch.float32), (ids.float() * 0.5).cumsum(-1))


def test_a_cumsum_of_bools_or_integers_is_summed_in_int64_as_torch_does():
    # TVM 0.27 sums in the input's dtype: a bool sum does not build for llvm, and the
    # ops after it take its dtype (counts * 2 would multiply by a bool True)
    ids = torch.tensor([[1, 5, 1, 7, 9, 1], [3, 1, 1, 2, 1, 8]])
    mod, _, notes = from_torch(torch.export.export(Counts(), (ids,)), False, "main",
                               "counts", {})
    assert notes == ["2 cumsum.default of a bool or integer tensor summed in int64, as torch "
                     "does (TVM's importer sums it in the input's dtype; bool does not build)"]
    got = numeric.run(mod, [ids.numpy()])
    for value, expected in zip(got, Counts()(ids)):
        assert value.dtype == expected.numpy().dtype
        np.testing.assert_array_equal(value, expected.numpy())


class IntegerArithmetic(torch.nn.Module):
    """Integer tensors in arithmetic whose torch result is a float (a scalar float, true
    division, a float tensor), beside integer arithmetic that stays integer."""

    def forward(self, ids, x):
        return (ids * 0.5, ids + 0.5, ids / 2, 1.5 - ids, x + ids, (ids > 2) * 0.25,
                ids.half() * 0.5, ids * 2, x * 3)


def test_integer_tensors_with_a_float_result_are_computed_in_that_float_as_torch_does():
    # TVM 0.27 keeps the integer dtype and makes the scalar an integer: ids * 0.5 is all
    # zeros and ids / 2 rounds, silently (docs/tvm-bugs.md)
    ids = torch.tensor([[1, 5, 3, -7]])
    x = torch.randn(1, 4)
    mod, _, notes = from_torch(torch.export.export(IntegerArithmetic(), (ids, x)), False,
                               "main", "integers", {})
    assert [n.split(" ")[:2] for n in notes] == [["2", "add.Tensor"], ["1", "div.Tensor"],
                                                 ["2", "mul.Tensor"], ["1", "sub.Tensor"]]
    got = numeric.run(mod, [ids.numpy(), x.numpy()])
    for value, expected in zip(got, IntegerArithmetic()(ids, x)):
        assert value.dtype == expected.numpy().dtype
        np.testing.assert_allclose(value, expected.numpy(), **FLOAT32)


class RoundedDivisions(torch.nn.Module):
    """Divisions that round, of int64 ids (position ids, packed sequences) and of float16
    and float32 tensors by Python scalars, and an integer clamp with one bound, as models
    write them; beside a clamp with both bounds and a float clamp (TVM imports those)."""

    def forward(self, ids, x, h):
        lengths = ids.clamp(min=1)
        return (torch.div(ids, 2, rounding_mode="floor"), -ids // 4,
                torch.div(-ids, 3, rounding_mode="trunc"), ids // 2.5,
                torch.div(x, 2.0, rounding_mode="trunc"), h // 0.7, x // lengths,
                ids.clamp(max=2), ids.int().clamp(min=-1), ids.clamp(0, 2), x.clamp(min=0.5))


def test_rounding_divisions_and_one_sided_integer_clamps_import_and_match_torch():
    # TVM 0.27 makes the scalar of ids // 2 an int32 constant beside int64 ids ("Binary
    # operators must have the same datatype"), and clips an integer tensor at infinity
    # where torch leaves a bound out ("Cannot convert infinity to BigInt" at the build)
    ids = torch.arange(-3, 5).reshape(2, 4)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0)) * 5
    h = (torch.randn(2, 4, generator=torch.Generator().manual_seed(1)) * 4).half()
    program = torch.export.export(RoundedDivisions(), (ids, x, h))
    mod, _, notes = from_torch(program, False, "main", "divisions", {})
    assert [n.split(" ")[:2] for n in notes] == [["3", "clamp.default"],
                                                 ["7", "div.Tensor_mode"]]
    got = numeric.run(mod, [ids.numpy(), x.numpy(), h.numpy()])
    for value, expected in zip(got, RoundedDivisions()(ids, x, h)):
        assert value.dtype == expected.numpy().dtype
        np.testing.assert_array_equal(value, expected.numpy())


def test_an_instance_norm_of_a_dynamic_batch_imports_and_matches_torch():
    model = _weights(InstanceNorms())
    x = np.random.default_rng(0).standard_normal((3, 4, 8, 8)).astype("float32")
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, (torch.from_numpy(x),),
                                  dynamic_shapes={"x": {0: batch}})
    mod, _, notes = from_torch(program, False, "main", "instance", {})
    assert relax.analysis.check_well_formed(mod)
    assert [n.split(" ")[:2] for n in notes] == [
        ["2", "_native_batch_norm_legit.no_stats"], ["3", "repeat.default"],
        ["2", "view.default"]]
    assert "relax.tile" not in dict(_ops(mod))
    with torch.no_grad():
        expected = [t.numpy() for t in model(torch.from_numpy(x))]
    assert expected[2].shape == (3, 6)
    comparison = numeric.compare_outputs(expected, numeric.run(mod, [x]), **FLOAT32)
    assert comparison.ok, comparison


def test_a_float32_model_tvm_imports_imports_exactly_as_tvm_imports_it():
    from tvm.relax.frontend.torch import from_exported_program

    model = _weights(Norms())
    program = torch.export.export(model, (torch.randn(2, 4, 8, 8),))
    ours, _, notes = from_torch(program, False, "main", "norms", {})
    assert notes == []
    tvm.ir.assert_structural_equal(ours, from_exported_program(
        program, unwrap_unit_return_tuple=True))


def test_bfloat16_norms_are_computed_in_float32_between_casts_and_match_torch():
    model = _weights(Norms()).to(torch.bfloat16)
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    mod, _, notes = from_torch(torch.export.export(model, (x,)), False, "main", "norms", {})
    norms = [(name, call) for name, call in _ops(mod)
             if name in ("relax.nn.group_norm", "relax.nn.instance_norm", "relax.nn.layer_norm")]
    assert sorted(name for name, _ in norms) == [
        "relax.nn.group_norm", "relax.nn.instance_norm", "relax.nn.layer_norm",
        "relax.nn.layer_norm"]
    assert all(dtype_of(call.ty) == "float32" for _, call in norms)
    assert len(notes) == 3 and all("between casts" in n or "bfloat16" in n for n in notes)
    with torch.no_grad():
        expected = [t.float().numpy() for t in model(x)]
    got = numeric.run(mod, [x.float().numpy().astype(ml_dtypes.bfloat16)])
    assert all(g.dtype == ml_dtypes.bfloat16 for g in got)
    comparison = numeric.compare_outputs(expected, [np.asarray(g, "float32") for g in got],
                                         **BFLOAT16)
    assert comparison.ok, comparison
    assert max(np.abs(e).max() for e in expected) > 1.0  # not a comparison of near-zeros



class Squares(torch.nn.Module):
    """``pow(x, 2)`` and ``pow(x, 0.5)``."""

    def forward(self, x):
        return x.pow(2), x.pow(0.5)


class HandLayerNorm(torch.nn.Module):
    """A layer norm written out, its variance as ``(x - mean).pow(2)``."""

    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        variance = centred.pow(2).mean(-1, keepdim=True)
        return centred * torch.rsqrt(variance + 1e-5)


def _bits(values):
    """bfloat16 values as their bits, every NaN as one pattern."""
    values = np.asarray(values, ml_dtypes.bfloat16)
    return np.where(np.isnan(values.astype("float32")), -1, values.view(np.int16))


def test_bfloat16_squares_and_square_roots_import_as_torch_computes_them_bit_for_bit():
    """bfloat16 pow(x, 2) and pow(x, 0.5) import as x * x and sqrt(x) (TVM 0.27 builds no
    bfloat16 power): on every finite bfloat16 value the built import gives torch's values
    bit for bit.  float32 powers and a bfloat16 cube stay TVM's R.power.
    """
    every = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16)
    every = every[np.isfinite(every.astype("float32"))]
    x = torch.from_numpy(every.view(np.int16).copy()).view(torch.bfloat16)
    mod, _, notes = from_torch(torch.export.export(Squares(), (x,)), False, "main", "sq", {})
    assert notes == ["2 pow.Tensor_Scalar (bfloat16, exponent 2 or 0.5) imported as x * x or "
                     "sqrt(x), as torch computes it (no TVM kernel for bfloat16 power)"]
    assert "relax.power" not in [name for name, _ in _ops(mod)]
    got = numeric.run(mod, [every])
    with torch.no_grad():
        expected = [t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) for t in Squares()(x)]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(_bits(g), _bits(e))
    for dtype, module in ((torch.float32, Squares()), (torch.bfloat16, _Cube())):
        left, _, notes = from_torch(torch.export.export(module, (x.to(dtype),)), False,
                                    "main", "powers", {})
        assert notes == [] and "relax.power" in [name for name, _ in _ops(left)]


class _Cube(torch.nn.Module):
    def forward(self, x):
        return x.pow(3)


def test_a_bfloat16_layer_norm_written_out_builds_and_matches_torch():
    """The spelling matrix's bfloat16 layer norm written out (``(x - mean).pow(2)``) via
    torch.export: before, its import did not build on llvm (bfloat16 R.power), so its
    numeric check said NOT RUN; now it builds and agrees with torch.
    """
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    model = HandLayerNorm().eval()
    mod, _, _ = from_torch(torch.export.export(model, (x,)), False, "main", "norm", {})
    (got,) = numeric.run(mod, [x.float().numpy().astype(ml_dtypes.bfloat16)])
    with torch.no_grad():
        expected = model(x).float().numpy()
    np.testing.assert_allclose(np.asarray(got, "float32"), expected, **BFLOAT16)
    assert np.abs(expected).max() > 1.0  # not a comparison of near-zeros


class Normalised(torch.nn.Module):
    """``F.normalize`` over the last axis and a vector norm over two axes."""

    def forward(self, x):
        return (torch.nn.functional.normalize(x, dim=-1),
                torch.linalg.vector_norm(x, dim=(0, 2)))


def test_a_bfloat16_vector_norm_is_computed_in_float32_between_casts_as_torch_computes_it():
    """bfloat16 F.normalize / vector_norm (TVM writes R.power, which does not build): the
    norm imported as astype(sqrt(sum(x32 * x32)), bfloat16) builds and gives torch's
    values bit for bit here; a float32 norm imports as TVM imports it.
    """
    x = (3 * torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(0))).to(
        torch.bfloat16)
    mod, _, notes = from_torch(torch.export.export(Normalised(), (x,)), False, "main", "n", {})
    assert notes == ["2 linalg_vector_norm.default (bfloat16, order 2) computed in float32 "
                     "between casts (bfloat16: no TVM kernel)"]
    assert "relax.power" not in [name for name, _ in _ops(mod)]
    got = numeric.run(mod, [x.float().numpy().astype(ml_dtypes.bfloat16)])
    with torch.no_grad():
        expected = [t.float().numpy() for t in Normalised()(x)]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(np.asarray(g, "float32"), e)
    wide, _, notes = from_torch(torch.export.export(Normalised(), (x.float(),)), False,
                                "main", "n", {})
    assert notes == [] and "relax.power" in [name for name, _ in _ops(wide)]
