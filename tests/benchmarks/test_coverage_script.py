"""benchmarks/coverage.py: the numbers in docs/coverage.md agree with the rewritten module."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_row(coverage_script):
    import patternkit as pk

    return coverage_script.measure("gpt2?layers=1&hidden=32&heads=2",
                                   {"cutlass": pk.PatternTable.from_tvm("cutlass")})


def _fused_in(mod, ops) -> int:
    from tvm import relax

    from patternkit.ir import op_name

    return sum(1 for _, func in mod.functions.items() if isinstance(func, relax.Function)
               for block in func.body.blocks for b in block.bindings if op_name(b.value) in ops)


@pytest.mark.models
def test_fused_counts_are_the_fused_ops_of_the_rewritten_module(coverage_script, gpt2_row):
    for family, ops in coverage_script.FUSED_OPS.items():
        assert gpt2_row["fused"][family] == _fused_in(gpt2_row["rewritten"], ops), family


@pytest.mark.models
def test_a_one_layer_gpt2_has_its_gelu_tanh_collapsed_by_the_library(gpt2_row):
    # counted from the torch modules: two layer norms a layer and the final one
    assert gpt2_row["families"]["layernorm"] == 3
    assert gpt2_row["families"]["gelu_tanh"] == 1
    assert gpt2_row["made"]["gelu_tanh"] == gpt2_row["fused"]["gelu_tanh"] == 1
    for family, made in gpt2_row["made"].items():
        assert made <= gpt2_row["fused"].get(family, 0) + gpt2_row["removed"].get(family, 0)


@pytest.mark.models
def test_the_rewritten_model_stays_within_the_float32_bound(coverage_script, gpt2_row):
    assert gpt2_row["error"] <= coverage_script.FLOAT32_BOUND


@pytest.mark.models
def test_table_shares_are_fractions_of_the_op_calls(gpt2_row):
    before, after = gpt2_row["shares"]["cutlass"]
    assert 0 < before <= 1 and 0 < after <= 1


@pytest.mark.models
def test_the_report_lists_every_family_instance_left_uncollapsed(coverage_script, gpt2_row):
    row = {k: v for k, v in gpt2_row.items() if k != "rewritten"}
    text = coverage_script.render([row], {"zoo:broken": "ZooImportError: no"}, 1.0)
    missing = {f: n - coverage_script.handled(row, f) for f, n in row["families"].items()
               if n > coverage_script.handled(row, f)}
    for family, count in missing.items():
        assert f"`{row['spec']}`: {count} {family} - " in text
    assert "`zoo:broken`: ZooImportError" in text


@pytest.mark.models
def test_a_model_over_the_float32_bound_is_listed_with_the_rules_that_rewrote_it(
        coverage_script, gpt2_row):
    row = {k: v for k, v in gpt2_row.items() if k != "rewritten"}
    assert "## Over the float32 bound" not in coverage_script.render([row], {}, 1.0)
    row["error"] = 10 * coverage_script.FLOAT32_BOUND
    text = coverage_script.render([row], {}, 1.0)
    assert "## Over the float32 bound" in text
    line = next(x for x in text.splitlines() if x.startswith(f"- `{row['spec']}`: 0.001 max abs"))
    for rule, count in row["rules"].items():
        assert f"`{rule}` x{count}" in line
