"""The rewrites of :mod:`patternkit.models.torch_fixups`: a module from TVM 0.27's torch
importer computes what torch computes (``docs/tvm-bugs.md``), and nothing else changes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from patternkit.ir import const_value, is_tensor_constant, op_name
from patternkit.models.torch_fixups import prepare_torch_import, wrap_negative_take_indices
from patternkit.verification import numeric

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(3)


class NegativeRows(torch.nn.Module):
    """``x[..., [-2], :]`` (aten.index.Tensor: Falcon's multi-query key) and
    ``x[..., -1, :]`` (aten.select.int), beside a non-negative index."""

    def forward(self, x):
        return x[..., [-2], :], x[..., -1, :], x[..., [1], :]


def _imported(module: torch.nn.Module, x: np.ndarray) -> tvm.IRModule:
    from tvm.relax.frontend.torch import from_exported_program

    return from_exported_program(torch.export.export(module, (torch.from_numpy(x),)))


def test_negative_indices_read_what_torch_reads_after_the_rewrite():
    x = RNG.standard_normal((2, 3, 4, 5)).astype("float32")
    expected = [t.numpy() for t in NegativeRows()(torch.from_numpy(x))]
    mod = _imported(NegativeRows(), x)
    fixed, notes = prepare_torch_import(mod)
    assert notes == ["wrapped the negative indices of 2 take(mode='fast') "
                     "(TVM's torch importer keeps them)"]
    assert relax.analysis.check_well_formed(fixed)
    # a gather: exact
    comparison = numeric.compare_outputs(expected, numeric.run(fixed, [x]), rtol=0, atol=0)
    assert comparison.ok, comparison


def test_the_imported_module_is_left_as_it_was():
    x = RNG.standard_normal((2, 3, 4, 5)).astype("float32")
    mod = _imported(NegativeRows(), x)
    text = mod.script()
    wrap_negative_take_indices(mod)
    assert mod.script() == text


def test_a_module_without_negative_constant_indices_is_returned_unchanged():
    x = relax.Var("x", relax.TensorType((4, 5), "float32"))
    idx = relax.Var("idx", relax.TensorType((2,), "int64"))  # read at run time: unknown
    bb = relax.BlockBuilder()
    with bb.function("main", [x, idx]):
        with bb.dataflow():
            a = bb.emit(relax.op.take(x, idx, axis=0))
            b = bb.emit(relax.op.take(x, relax.const(np.array([0, 3], "int64")), axis=0))
            out = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(out)
    mod = bb.get()
    fixed, notes = prepare_torch_import(mod)
    assert fixed is mod and notes == []


def test_an_axis_of_symbolic_extent_keeps_its_negative_index():
    # idx + n needs n: with a symbolic extent the rewrite cannot say what torch reads
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 5), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.take(x, relax.const(np.array([-1], "int64")),
                                               axis=0))
        bb.emit_func_output(out)
    mod = bb.get()
    fixed, wrapped = wrap_negative_take_indices(mod)
    assert fixed is mod and wrapped == 0


@pytest.mark.models
def test_a_zoo_import_reads_no_negative_constant_index(zoo):
    # Falcon's multi-query split is x[..., [-2], :] in transformers 5.24 (two takes wrapped
    # per layer) and a slice in later releases: either way no take may read a negative one
    model = zoo("falcon")
    takes = [b.value for block in model.mod[model.entry].body.blocks for b in block.bindings
             if op_name(b.value) == "relax.take" and is_tensor_constant(b.value.args[1])]
    assert all((const_value(t.args[1]) >= 0).all() for t in takes)
    fixups = model.metadata["import_fixups"]
    assert fixups == [] or fixups == [
        f"wrapped the negative indices of {len(takes)} take(mode='fast') "
        f"(TVM's torch importer keeps them)"]


class Differences(torch.nn.Module):
    """``torch.diff`` of position ids along the last axis (transformers' mask code calls it),
    which TVM imports as ``strided_slice`` with the axis ``-1``."""

    def forward(self, pos):
        return torch.diff(pos, dim=-1)


def test_a_negative_strided_slice_axis_of_a_symbolic_shape_builds_and_reads_what_torch_does():
    # TVM 0.27's legalisation of a strided slice of symbolic shape refuses a negative axis
    # ("Check failed: axis < src_tensor_dim (-1 vs. 2)"): a dynamic-batch Phi-3 did not build
    from tvm.relax.frontend.torch import from_exported_program

    pos = torch.arange(8).repeat(3, 1) * torch.tensor([[1], [2], [3]])
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Differences(), (pos,), dynamic_shapes=({0: batch},))
    mod = from_exported_program(program)
    fixed, notes = prepare_torch_import(mod)
    assert notes == ["counted the negative axes of 2 strided_slice of a symbolic shape from "
                     "the front (TVM's legalisation refuses them)"]
    got = numeric.run(fixed, [pos.numpy()])
    np.testing.assert_array_equal(got[0], Differences()(pos).numpy())
    static = from_exported_program(torch.export.export(Differences(), (pos,)))
    assert prepare_torch_import(static) == (static, [])  # a static shape legalises as it is
