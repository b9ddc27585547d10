"""Counting family instances from torch modules: the "present" column of coverage."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
activations = pytest.importorskip("transformers.activations")

from patternkit.models.families import activation_modules, count_module_families  # noqa: E402


def test_each_transformers_activation_and_norm_counts_in_its_family():
    from transformers.models.bloom.modeling_bloom import BloomGelu
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    model = torch.nn.Sequential(
        activations.GELUActivation(), torch.nn.GELU(),  # erf
        activations.NewGELUActivation(), activations.FastGELUActivation(), BloomGelu(),
        torch.nn.GELU(approximate="tanh"),  # tanh
        torch.nn.SiLU(), torch.nn.LayerNorm(4), LlamaRMSNorm(4), torch.nn.RMSNorm(4),
        T5LayerNorm(4))  # an RMS norm by another name
    counts = count_module_families(model)
    assert {k: v for k, v in counts.items() if v} == {
        "gelu": 2, "gelu_tanh": 4, "silu": 1, "layernorm": 1, "rmsnorm": 3}
    assert "BloomGelu" in activation_modules(model)
