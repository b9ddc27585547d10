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


# -- issue 36's families ----------------------------------------------------------------------
def _clips(body):
    """A module ``main(x)`` whose body is ``body(x)`` (float32 (2, 8))."""
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def test_relu6_counts_clips_to_six_but_not_the_clip_inside_a_hard_activation(coverage_script):
    from tvm import relax

    def relu6_then_hardswish(bb, x):
        r = bb.emit(relax.op.clip(x, 0, 6))
        shifted = bb.emit(relax.op.add(r, relax.const(3.0, "float32")))
        hard = bb.emit(relax.op.clip(shifted, 0, 6))
        other = bb.emit(relax.op.clip(hard, 0, 5))
        return relax.op.divide(relax.op.multiply(r, other), relax.const(6.0, "float32"))

    assert coverage_script.relu6_count(_clips(relu6_then_hardswish)) == 1


def test_a_batch_norm_left_over_is_named_by_the_form_it_reads(coverage_script):
    import numpy as np
    from tvm import relax

    def broadcast_linear_bn(bb, x):
        w = relax.const(np.ones((8, 8), "float32"))
        wide = bb.emit(relax.op.broadcast_to(x, relax.ShapeExpr([1, 2, 8])))
        mm = bb.emit(relax.op.matmul(wide, relax.op.broadcast_to(w, relax.ShapeExpr([1, 8, 8]))))
        flat = bb.emit(relax.op.reshape(mm, (2, 8)))
        stats = [relax.const(np.ones(8, "float32")) for _ in range(4)]
        bn = bb.emit(relax.op.nn.batch_norm(flat, *stats, axis=1))
        return relax.TupleGetItem(bn, 0)

    spellings = coverage_script.leftover_spellings(_clips(broadcast_linear_bn),
                                                   "relax.nn.batch_norm")
    assert spellings == {"reshape(matmul(broadcast_to(Var), broadcast_to))": 1}


@pytest.mark.models
def test_the_long_tail_columns_count_a_mobilenets_hard_activations(coverage_script):
    row = coverage_script.measure("mobilenet?width=8", numeric=False)
    for family, composite in (("hardswish", "byoc.hardswish"),
                              ("hardsigmoid", "byoc.hardsigmoid")):
        # counted from the torch modules; handled: inside the library's composite
        assert row["families"][family] == row["fused"][family] == row["made"][family] > 0
    assert row["families"]["relu6"] == row["fused"]["relu6"] > 0
    assert row["families"]["batchnorm"] == coverage_script.handled(row, "batchnorm")
    row.pop("rewritten")
    header = coverage_script.render([row], {}, 1.0).splitlines()
    columns = next(line for line in header if line.startswith("| model |"))
    assert "| hardswish | hardsigmoid | relu6 |" in columns
    assert "rope" not in columns  # a family absent from every row gets no column


def test_a_family_not_counted_in_an_onnx_source_shows_a_question_mark(coverage_script):
    # an ONNX export has no torch modules: its gated MLPs are not counted, only found
    row = dict(spec="zoo:onnx:t5", families={"rmsnorm": 5}, fused={"rmsnorm": 5, "geglu": 2},
               removed={}, made={"rmsnorm": 5, "geglu": 2}, error=None, scale=None,
               shares={}, left_on_host={}, rewrite_seconds=0.01, rules={}, reasons={})
    text = coverage_script.render([row], {}, 1.0)
    assert "| 5 / 5 (5) | ? / 2 (2) |" in text
    assert "## Not collapsed\n" in text and "- none" in text
