"""The converters of :mod:`patternkit.models.low_precision`: a float16 torch model imports
in float16, computes what torch computes in float16, and a float32 model imports exactly
as TVM imports it.

Tolerance (float16): ``rtol = atol = 1e-2`` on outputs of order one.  float16's epsilon is
9.8e-4; torch rounds a matmul once (bias included) where the import rounds before the
bias, and the two kernels sum in different orders, so a few ulps apart is expected and a
wrong conversion (a bias dropped, a transposed weight) is off by the size of the values.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from patternkit.ir import dtype_of, op_name, type_of
from patternkit.models.importing import from_torch
from patternkit.verification import numeric

torch = pytest.importorskip("torch")

FLOAT16 = dict(rtol=1e-2, atol=1e-2)
#: Ops that accumulate: the only ones allowed a float32 result in a float16 import, and
#: only when a cast back to float16 reads it.
ACCUMULATING = {"relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d",
                "relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose"}


class Linears(torch.nn.Module):
    """``nn.Linear`` with and without a bias, on a 3-D input (``aten.linear`` decomposes
    to ``mm`` + ``view``) and a 2-D one (``addmm``), then a batched matmul."""

    def __init__(self):
        super().__init__()
        self.biased, self.plain = torch.nn.Linear(16, 8), torch.nn.Linear(8, 8, bias=False)

    def forward(self, x, y):
        h = self.plain(self.biased(x))
        return torch.matmul(h, h.transpose(-1, -2)), self.biased(y)


class Convs(torch.nn.Module):
    """A biased conv2d, a grouped one without a bias, and a conv1d."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.grouped = torch.nn.Conv2d(8, 8, 3, stride=2, groups=4, bias=False)
        self.line = torch.nn.Conv1d(4, 6, 3)

    def forward(self, x, s):
        return self.grouped(torch.relu(self.conv(x))), self.line(s)


class TransposedConvs(torch.nn.Module):
    """A biased, strided conv_transpose2d with an output padding (a decoder's upsampling),
    then a grouped conv_transpose1d without a bias."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.line = torch.nn.ConvTranspose1d(4, 6, 3, groups=2, bias=False)

    def forward(self, x, s):
        return self.up(x), self.line(s)


def _draw(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _weights(module, dtype):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.5, 0.5)
    return module.to(getattr(torch, dtype)).eval()


def _import(module, inputs):
    program = torch.export.export(module, tuple(torch.from_numpy(a) for a in inputs))
    mod, _, notes = from_torch(program, False, "main", "test", {})
    return mod, notes


def _float32_values_not_cast_back(mod):
    """Bindings whose float32 result is not an accumulation read by a cast back."""
    func = mod["main"]
    readers: dict = {}
    values = {}
    for block in func.body.blocks:
        for b in block.bindings:
            values[b.var] = b.value
            if isinstance(b.value, relax.Call):
                for a in b.value.args:
                    readers.setdefault(a, []).append(b.value)
    bad = []
    for var, value in values.items():
        if not isinstance(type_of(var), relax.TensorType) or dtype_of(type_of(var)) != "float32":
            continue
        uses = readers.get(var, [])
        cast_back = (op_name(value) in ACCUMULATING and uses
                     and all(op_name(u) == "relax.astype" and str(u.attrs.dtype) == "float16"
                             for u in uses))
        if not cast_back:
            bad.append(f"{var.name_hint}: {op_name(value)}")
    return bad


@pytest.mark.parametrize("module, shapes", [
    (Linears, [(2, 5, 16), (3, 16)]), (Convs, [(2, 4, 8, 8), (2, 4, 10)]),
    (TransposedConvs, [(2, 4, 5, 5), (2, 4, 7)])],
    ids=["linears", "convs", "transposed-convs"])
def test_a_float16_model_imports_in_float16_and_matches_torch(module, shapes):
    model = _weights(module(), "float16")
    inputs = _draw(shapes, "float16")
    mod, notes = _import(model, inputs)
    assert relax.analysis.check_well_formed(mod)
    assert all(dtype_of(t) == "float16" for t in type_of(mod["main"].body).fields)
    assert _float32_values_not_cast_back(mod) == []
    assert notes and all("kept in the input's dtype" in n for n in notes)
    with torch.no_grad():
        expected = [t.numpy() for t in model(*(torch.from_numpy(a) for a in inputs))]
    got = numeric.run(mod, inputs)
    assert all(g.dtype == np.float16 for g in got)
    comparison = numeric.compare_outputs(expected, got, **FLOAT16)
    assert comparison.ok, comparison
    assert max(np.abs(e).max() for e in expected) > 0.5  # not a comparison of near-zeros


def test_the_notes_count_each_converted_op():
    model = _weights(Linears(), "float16")
    _, notes = _import(model, _draw([(2, 5, 16), (3, 16)], "float16"))
    # torch.export flattens a linear's batch axes: the two biased ones (3-D and 2-D
    # input) are addmm, the one without a bias mm, the batched matmul bmm
    assert notes == ["2 addmm kept in the input's dtype (TVM's torch importer returns float32)",
                     "1 bmm kept in the input's dtype (TVM's torch importer returns float32)",
                     "1 mm kept in the input's dtype (TVM's torch importer returns float32)"]


@pytest.mark.parametrize("module, shapes", [
    (Linears, [(2, 5, 16), (3, 16)]), (Convs, [(2, 4, 8, 8), (2, 4, 10)]),
    (TransposedConvs, [(2, 4, 5, 5), (2, 4, 7)])],
    ids=["linears", "convs", "transposed-convs"])
def test_a_float32_model_imports_exactly_as_tvm_imports_it(module, shapes):
    from tvm.relax.frontend.torch import from_exported_program

    model = _weights(module(), "float32")
    inputs = _draw(shapes, "float32")
    program = torch.export.export(model, tuple(torch.from_numpy(a) for a in inputs))
    ours, notes = _import(model, inputs)
    theirs = from_exported_program(program, unwrap_unit_return_tuple=True)
    assert notes == []
    tvm.ir.assert_structural_equal(ours, theirs)


def test_a_bfloat16_model_imports_in_bfloat16():
    # numpy has no bfloat16: the import's types are checked, not its numbers
    model = Linears().to(torch.bfloat16).eval()
    example = (torch.randn(2, 5, 16, dtype=torch.bfloat16),
               torch.randn(3, 16, dtype=torch.bfloat16))
    mod, _, notes = from_torch(torch.export.export(model, example), False, "main", "t", {})
    assert [dtype_of(t) for t in type_of(mod["main"].body).fields] == ["bfloat16"] * 2
    assert notes


def test_a_3d_transposed_convolution_is_left_to_tvm():
    # TVM has no conv3d_transpose converter: its own refusal comes through, in every dtype
    model = torch.nn.ConvTranspose3d(2, 2, 2).half().eval()
    program = torch.export.export(model, (torch.randn(1, 2, 3, 3, 3, dtype=torch.float16),))
    from patternkit.models import ZooImportError

    with pytest.raises(ZooImportError, match="dimensionality"):
        from_torch(program, False, "main", "convT3d", {})
