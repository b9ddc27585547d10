"""Torch ``written`` functions: the pattern is what patternkit's importer emits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tvm import relax

import patternkit as pk
from patternkit.errors import PatternError
from patternkit.models.importing import from_torch
from patternkit.verification import rule_by_example
from patternkit.verification.numeric import assert_same_numerics

torch = pytest.importorskip("torch")


def _hardswish(x):
    return x * torch.clamp(x + 3, 0, 6) / 6


class _Block(torch.nn.Module):
    """A model that spells hard-swish out, as MobileNet ports do."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return _hardswish(self.linear(x))


def _imported(model, *inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model.eval(), inputs)
    mod, _, _ = from_torch(program, keep_params=False, entry="main", text="model", seconds={})
    return mod


def test_a_torch_written_without_fused_is_the_composite_of_its_name_in_an_imported_model():
    rule = rule_by_example("hardswish", _hardswish)
    assert rule.name == "byoc.hardswish"
    assert "numbers 3, 6: in any float dtype" in rule.describe()
    mod = _imported(_Block(), torch.randn(3, 8))
    merged = pk.MergeComposite([rule])(mod)
    assert '"Composite": "byoc.hardswish"' in merged.script()
    assert_same_numerics(mod, merged, rtol=0.0, atol=0.0)


def test_a_torch_written_with_a_relax_fused_is_verified_and_rewrites_the_import():
    def written(x):
        return x * torch.sigmoid(x)

    def fused(x):
        return relax.op.nn.silu(x)

    rule = rule_by_example("silu.torch", written, fused, dtypes=("float32",))

    class Swish(torch.nn.Module):
        def forward(self, x):
            y = torch.tanh(x)
            return y * torch.sigmoid(y)

    mod = _imported(Swish(), torch.randn(2, 3, 5))
    after = pk.rewrite(rule, mod)
    assert "R.nn.silu" in after.script()
    assert_same_numerics(mod, after, rtol=1e-5, atol=1e-5)


def test_a_torch_written_that_differs_from_fused_is_refused():
    with pytest.raises(PatternError, match="hardswish.wrong: written and fused differ"):
        rule_by_example("hardswish.wrong", _hardswish, lambda x: relax.op.nn.silu(x),
                        dtypes=("float32",))


def test_a_torch_function_the_importer_cannot_import_is_a_one_line_error():
    with pytest.raises(PatternError) as err:
        rule_by_example("fft.rule", lambda x: torch.fft.rfft(x).real)
    text = str(err.value)
    assert text.startswith("fft.rule: ") and "\n" not in text
    assert "cannot" in text


def test_a_torch_fused_is_refused_by_name():
    with pytest.raises(PatternError, match="silu.t: fused computes with torch"):
        rule_by_example("silu.t", lambda x: x * torch.sigmoid(x),
                        lambda x: torch.nn.functional.silu(x))


def test_tracing_a_torch_function_leaves_numpy_inputs_alone():
    x = np.ones((2, 2), "float32")
    rule_by_example("hardswish", _hardswish).example()
    assert (x == 1).all()
