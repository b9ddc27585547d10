"""benchmarks/bench_outline.py: both outliners form the model's composites, and agree."""

from __future__ import annotations

import os

from patternkit.ir.native_build import NATIVE_VARIABLE


def test_both_outliners_form_the_same_composites(bench_outline):
    before = os.environ.get(NATIVE_VARIABLE)
    row = bench_outline.measure("zoo:gpt2?layers=1", 1)  # exits if they disagree
    assert row["composites"] >= 5  # layer norms, attention, the MLP's matmuls
    assert row["native_ms"] > 0 and row["python_ms"] > 0
    assert os.environ.get(NATIVE_VARIABLE) == before  # the switch is put back
