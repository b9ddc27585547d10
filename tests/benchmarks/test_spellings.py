"""benchmarks/spellings.py: the spelling matrix's float32 static column, as CI runs it.

The column runs every spelling through ``torch.export`` (float32, static shapes) and the
library; every cell must collapse all its instances or name why not (a rule's skip
reason, the front door's error, or the family the library has no rule for), and the
spellings the library collapses today must keep collapsing.  The column is run once per
module without the llvm checks (about 25 s of CPU); the numeric check is tested on one
cell below.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

pytestmark = pytest.mark.models

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "spellings.py"

#: The rows the library collapses completely through torch.export in float32 today (the
#: importer's fused ops included): a regression in any of them fails CI.
COLLAPSED_TODAY = (
    "gelu/nn.GELU", "gelu/written out (erf)", "gelu_tanh/nn.GELU(approximate='tanh')",
    "gelu_tanh/written out (tanh)", "quick_gelu/x * sigmoid(1.702 x)", "silu/nn.SiLU",
    "silu/x * sigmoid(x)", "relu6/nn.ReLU6", "relu6/min(max(x, 0), 6)",
    "hardswish/nn.Hardswish", "hardswish/F.hardswish", "hardswish/x * relu6(x + 3) / 6",
    "hardsigmoid/nn.Hardsigmoid", "hardsigmoid/relu6(x + 3) / 6", "softplus/nn.Softplus",
    "mish/nn.Mish", "mish/x * tanh(softplus(x))", "layernorm/nn.LayerNorm",
    "layernorm/written out", "rmsnorm/nn.RMSNorm", "rmsnorm/written out (Llama)",
    "rmsnorm/written out (Gemma, 1 + w)", "groupnorm/nn.GroupNorm", "groupnorm/written out",
    "instancenorm/nn.InstanceNorm2d(affine)", "instancenorm/written out",
    "batchnorm/Linear + BatchNorm1d", "batchnorm/Conv1d + BatchNorm1d",
    "batchnorm/Conv2d + BatchNorm2d", "batchnorm/ConvTranspose2d + BatchNorm2d",
    "softmax/nn.Softmax", "log_softmax/nn.LogSoftmax",
    "attention/eager matmul-softmax-matmul", "attention/SDPA", "attention/einsum",
    "attention/baddbmm (batch*heads)", "attention/cosine (Swin v2)",
    "rope/half rotation (Llama)",
    "rope/interleaved (GPT-J)", "rope/partial (Phi)", "swiglu/separate gate / up",
    "swiglu/packed gate_up + chunk", "geglu/separate gate / up",
    "geglu/packed gate_up + chunk")


@pytest.fixture(scope="module")
def spellings():
    """The script as a module (registered: its dataclasses and worker look it up)."""
    spec = importlib.util.spec_from_file_location("spellings", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["spellings"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("spellings", None)


@pytest.fixture(scope="module")
def ci_column(spellings):
    column = spellings.Column("torch.export", "float32", "static")
    return spellings.run(list(spellings.SPELLINGS), [column], cache=None, numeric=False)


def test_every_cell_of_the_float32_static_column_collapses_or_names_a_reason(ci_column):
    from patternkit.models.spelling_sources import COPIES

    silent = [c.row for c in ci_column if c.silent]
    assert not silent, f"not collapsed and no reason given: {silent}"
    assert all(c.instances == COPIES for c in ci_column)


def test_the_spellings_the_library_collapses_today_still_collapse(ci_column):
    cells = {c.row: c for c in ci_column}
    regressed = {row: cells[row].why() or f"{cells[row].collapsed}/{cells[row].instances}"
                 for row in COLLAPSED_TODAY if not cells[row].complete}
    assert not regressed


def test_the_document_has_a_row_per_spelling_and_its_notes(spellings, ci_column):
    text = spellings.render(ci_column, 1.0)
    for cell in ci_column:
        family, source = cell.row.split("/", 1)
        assert f"| {family} | {source} | " in text
        if cell.why():
            assert cell.why() in text
    totals = spellings.totals(ci_column)
    assert totals["cells"] == len(ci_column)
    assert totals["instances collapsed"] <= totals["instances"]


def test_a_cell_names_the_rules_reason_and_the_front_doors_error(spellings):
    cell = spellings.Cell("attention/x", "torch.export/float32/static", 2, collapsed=1,
                          reasons={"attention.collapse": ["the mask is 4-D", "the mask is 4-D"]})
    assert cell.why() == "attention.collapse: the mask is 4-D"
    failed = spellings.Cell("softmax/x", "onnx14/float32/static", 2, error="from_onnx failed")
    assert failed.why() == "from_onnx failed" and not failed.complete
    text = spellings.render([cell, failed], 1.0)
    assert "| attention | x | 1/2 [1] |" in text and "1. attention.collapse: the mask" in text
    assert "2. from_onnx failed" in text
    silent = spellings.Cell("relu6/x", "onnx17/float32/static", 2, collapsed=0)
    assert silent.silent and not cell.silent and not failed.silent
    assert "| relu6 | x | 0/2 [1] |" in spellings.render([silent], 1.0)
    assert spellings.totals([silent, cell, failed])["no reason"] == 1


def test_rows_and_columns_are_filtered_by_glob(spellings):
    names = [str(c) for c in spellings.COLUMNS]
    picked = [names[i] for i in spellings.select(["*/float32/static"], names)]
    assert picked == [f"{door}/float32/static" for door in spellings.FRONT_DOORS]
    assert spellings.select(None, names) == list(range(len(names)))
    assert spellings.select(["nothing"], names) == []


def test_a_float32_cell_is_checked_numerically_and_a_wrong_rewrite_is_caught(spellings):
    from patternkit.models.spelling_sources import find_spelling

    cell = spellings.measure(find_spelling("hardswish/x * relu6(x + 3) / 6"),
                             spellings.Column("onnx17", "float32", "static"))
    assert cell.complete and cell.numeric == "ok"

    from tvm import relax

    def module(fn):
        x = relax.Var("x", relax.TensorType((2, 3), "float32"))
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            bb.emit_func_output(bb.emit(fn(x)))
        return bb.get()

    import torch

    example = torch.ones(2, 3)
    assert spellings._numeric_check(module(relax.op.nn.relu), module(relax.op.nn.relu),
                                    example) == "ok"
    wrong = spellings._numeric_check(module(relax.op.nn.relu), module(relax.op.nn.silu),
                                     example)
    assert wrong.startswith("max abs")


def _run(mod, example):
    import tvm

    from patternkit.verification.numeric import build, flatten

    return flatten(build(mod)["main"](tvm.runtime.tensor(example.numpy())))[0]


def test_rows_imported_side_by_side_are_cut_out_as_their_own_models(spellings):
    import torch

    from patternkit.models.spelling_sources import find_spelling, spelling_model

    # the TorchScript exporter writes GPT-J's rotation as a graph onnx's checker refuses
    rows = [find_spelling("layernorm/written out"), find_spelling("gelu/nn.GELU"),
            find_spelling("rope/interleaved (GPT-J)")]
    column = spellings.Column("onnx14", "float32", "static")
    models = [spelling_model(s) for s in rows]
    examples = [spellings._example(s, torch.float32) for s in rows]
    imported = spellings.import_side_by_side(rows, column, models, examples)
    assert isinstance(imported[rows[2].key], spellings.ZooImportError)
    assert "rope/interleaved (GPT-J) via onnx14: the exported ONNX graph is not valid" in str(
        imported[rows[2].key])
    for spelling, model, example in zip(rows[:2], models, examples):
        mod, weights = imported[spelling.key]
        bound = spellings.bind_weights(mod, weights)
        assert len(bound["main"].params) == 1  # the branch reads its own input only
        np.testing.assert_allclose(_run(bound, example), model(example).detach().numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_an_import_is_cached_and_the_cached_module_is_the_imported_one(spellings, tmp_path,
                                                                         monkeypatch):
    import torch
    import tvm

    from patternkit.models.spelling_sources import find_spelling, spelling_model

    spelling = find_spelling("layernorm/written out")
    column = spellings.Column("onnx17", "float32", "static")
    model = spelling_model(spelling)
    example = spellings._example(spelling, torch.float32)
    first = spellings.cached_imports([spelling], column, [model], [example], tmp_path)

    def no_export(*args):
        raise AssertionError("exported again")

    monkeypatch.setattr(spellings, "import_side_by_side", no_export)
    again = spellings.cached_imports([spelling], column, [model], [example], tmp_path)
    tvm.ir.assert_structural_equal(again[spelling.key]["main"], first[spelling.key]["main"],
                                   map_free_vars=True)
    np.testing.assert_allclose(_run(again[spelling.key], example),
                               model(example).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_a_front_door_error_is_one_line_in_the_cell(spellings):
    from patternkit.models.spelling_sources import find_spelling

    # TVM 0.27's torch importer has no converter for aten.amax
    cell = spellings.measure(find_spelling("softmax/exp(x - amax) / sum"),
                             spellings.Column("torch.export", "float32", "static"))
    if cell.error is None:
        pytest.skip("the importer converts amax now: the cell is no error any more")
    assert "\n" not in cell.error and "amax" in cell.error


def test_the_dynamo_export_is_the_same_with_the_torch_op_table_built_once(spellings):
    import torch

    from patternkit.models.onnx_models import export_to_onnx
    from patternkit.models.spelling_sources import find_spelling, spelling_model

    spelling = find_spelling("gelu/written out (erf)")
    model = spelling_model(spelling)
    example = spellings._example(spelling, torch.float32)

    def export():
        return export_to_onnx(model, (example,), ["x"], opset=None, exporter="dynamo")

    fresh = export()
    assert spellings.build_torchlib_table_once()
    assert export() == fresh


@pytest.mark.parametrize("door", ["torch.export", "onnx17"])
def test_rows_side_by_side_take_a_symbolic_batch_and_sequence(spellings, door):
    from patternkit.models.spelling_sources import find_spelling

    rows = [find_spelling("layernorm/written out"), find_spelling("hardswish/F.hardswish")]
    cells = spellings.measure_column(rows, spellings.Column(door, "float32", "dynamic"))
    assert [(c.error, c.complete) for c in cells] == [(None, True), (None, True)]


def test_bfloat16_weights_come_back_from_the_cache_as_bfloat16(spellings, tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")

    weights = np.array([1.5, -2.0, 0.25], dtype=ml_dtypes.bfloat16)
    np.savez(tmp_path / "w.npz", w0=weights)
    with np.load(tmp_path / "w.npz") as saved:
        again = spellings._bfloat16_again(saved["w0"])
    assert again.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(again.astype("float32"), weights.astype("float32"))


def test_the_matrix_and_the_coverage_table_count_ops_with_one_helper(spellings,
                                                                      coverage_script):
    from tvm import relax

    from patternkit.models.op_counting import op_counts

    assert spellings.op_counts is op_counts and coverage_script.op_counts is op_counts
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("helper", [x]):
        bb.emit_func_output(bb.emit(relax.op.exp(x)))
    y = relax.Var("y", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [y]):
        with bb.dataflow():
            twice = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.relu(y))))
            out = bb.emit_output(relax.op.add(twice, y))
        bb.emit_func_output(out)
    counts = op_counts(bb.get())
    assert counts == {"relax.nn.relu": 2, "relax.add": 1, "relax.exp": 1}


def _centred_module():
    """``(x - mean(x)) ** 2``: a norm's skeleton that no norm rule of the library takes."""
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2, 8, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            mean = bb.emit(relax.op.mean(x, axis=[-1], keepdims=True))
            centred = bb.emit(relax.op.subtract(x, mean))
            out = bb.emit_output(relax.op.multiply(centred, centred))
        bb.emit_func_output(out)
    return bb.get()


def test_a_cell_no_rule_matched_gives_the_near_miss_detectors_reason(spellings):
    from patternkit.models.spelling_sources import find_spelling, spelling_model

    spelling = find_spelling("layernorm/written out")
    mod = _centred_module()
    before = mod.script()
    cell = spellings._measure_cell(spelling, spellings.Column("onnx14", "float32", "static"),
                                   spelling_model(spelling), None, mod, False, 0.0)
    assert mod.script() == before  # the imported module is only read
    assert cell.collapsed == 0 and not cell.silent
    assert list(cell.reasons) == ["layernorm.collapse"]
    # the cell is the site: the reason leaves out the binding names and the printer's note
    reason = cell.reasons["layernorm.collapse"][0]
    assert reason.startswith("no match: ") and "Metadata omitted" not in reason
    assert not re.search(r"\blv\d+\b", cell.why())


def test_a_detector_of_another_family_does_not_explain_a_row(spellings):
    from patternkit.models.spelling_sources import find_spelling

    names = {rule.name for detector in spellings.family_detectors(
        find_spelling("layernorm/written out")) for rule in detector.rules}
    assert names and all(name.startswith("layernorm.") for name in names)


def test_the_committed_table_reads_back_into_the_cells_it_shows(spellings):
    text = (SCRIPT.parents[1] / "docs" / "spellings.md").read_text()
    cells = spellings.read_table(text)
    again = spellings.render(cells, 1.0)
    assert again[again.index("\n## "):] == text[text.index("\n## "):]
    totals_line = next(line for line in text.splitlines() if line.startswith("Totals: "))
    assert totals_line in again


def test_a_cell_read_back_keeps_its_counts_reason_error_and_mismatch(spellings):
    make = spellings.Cell
    cells = [make("relu6/x", "onnx14/float32/static", 2, collapsed=1,
                  reasons={"relu6.collapse": ["the bounds are not constants"]},
                  numeric="max abs 0.5"),
             make("relu6/x", "torch.export/float32/static", 2, collapsed=2, by_import=True),
             make("relu6/x", "onnx17/float16/dynamic", 2, collapsed=0),
             make("mish/y", "onnx14/float32/static", 2, error="from_onnx failed: no op")]
    back = {(c.row, c.column): c for c in spellings.read_table(spellings.render(cells, 1.0),
                                                               "the old table")}
    for cell in cells:
        read = back[(cell.row, cell.column)]
        assert (read.collapsed, read.instances, read.by_import, read.error, read.silent,
                read.complete, read.why()) == (cell.collapsed, cell.instances, cell.by_import,
                                               cell.error, cell.silent, cell.complete,
                                               cell.why())
        assert read.source == "the old table"
    assert back[("relu6/x", "onnx14/float32/static")].numeric == "max abs 0.5"
    assert spellings.totals(list(back.values())) == spellings.totals(cells)


def test_from_json_over_a_table_replaces_its_cells_and_says_which_rows_came_from_where(
        spellings, tmp_path, monkeypatch):
    import dataclasses
    import json

    make = spellings.Cell
    old = [make("relu6/x", "onnx14/float32/static", 2, collapsed=0),
           make("relu6/x", "onnx17/float32/static", 2, collapsed=0),
           make("mish/y", "onnx14/float32/static", 2, collapsed=0),
           make("mish/y", "onnx17/float32/static", 2, collapsed=2)]
    table = tmp_path / "old.md"
    table.write_text(spellings.render(old, 60.0).replace(
        "Generated by `benchmarks/spellings.py` on ", "Generated by `benchmarks/spellings.py` "
        "on 2026-01-02 (was ", 1))
    new = [make("relu6/x", "onnx14/float32/static", 2, collapsed=0,
                reasons={"relu6.collapse": ["the bounds are not 0 and 6"]})]
    measured = tmp_path / "new.json"
    measured.write_text(json.dumps({"seconds": 30.0, "generated": "2026-01-03 10:00 UTC",
                                    "cells": [dataclasses.asdict(c) for c in new]}))
    out = tmp_path / "out.md"
    monkeypatch.setattr(sys, "argv", ["spellings.py", "--from-table", str(table),
                                      "--from-json", str(measured), "--out", str(out)])
    spellings.main()
    text = out.read_text()
    assert "| relu6 | x | 0/2 [1] | 0/2 [2] |" in text
    assert "1. relu6.collapse: the bounds are not 0 and 6" in text
    assert "* measured by a run started 2026-01-03 10:00 UTC: 1 row(s) in columns " \
           "`onnx14/float32/static`: " \
           "`relu6/x`" in text
    assert "* the table generated on 2026-01-02: 1 row(s) in columns `onnx17/float32/static`: " \
           "`relu6/x`" in text
    assert "* the table generated on 2026-01-02: 1 row(s) in every column: `mish/y`" in text
    # oldest first, as the measurements were layered
    assert text.index("* the table generated") < text.index("* measured by a run started")
    assert "Totals: 4 cells, 1 collapsed, 1 with a named reason, 0 front-door errors, " \
           "2 without a reason; 2 of 8 instances collapsed." in text


# -- the matrix as a recorded campaign (issue 39): a unit is a column -------------------------
#: Two cheap columns the stable hash puts in different shards of 2 (checked below).
CAMPAIGN_COLUMNS = ["torch.export/float32/static", "onnx14/float32/static"]


def _matrix(spellings, monkeypatch, *options):
    """Run the script's ``main`` on two gelu rows and ``CAMPAIGN_COLUMNS``, no llvm check."""
    monkeypatch.setattr(sys, "argv", ["spellings.py", "--rows", "gelu/*", "--no-numeric",
                                      "--columns", *CAMPAIGN_COLUMNS, *options])
    spellings.main()


def _table_text(path):
    """A rendered table without its header line's date and minutes (timing varies)."""
    return "\n".join(line for line in path.read_text().splitlines()
                     if not line.startswith("Generated by"))


def test_two_shards_rendered_together_give_the_unsharded_table_and_resume_skips_units(
        spellings, tmp_path, monkeypatch):
    import json

    from patternkit.testing.campaign_units import Unit, shard_of

    assert sorted(shard_of(Unit(c, 0), 2) for c in CAMPAIGN_COLUMNS) == [1, 2]
    cache = str(tmp_path / "cache")
    whole = tmp_path / "whole"
    _matrix(spellings, monkeypatch, "--cache", cache, "--out", str(whole))
    records = [json.loads(line) for line in (whole / "records.jsonl").read_text().splitlines()]
    assert [(r["subject"], r["instance"], r["seed"]) for r in records] == \
        [(c, 0, 0) for c in CAMPAIGN_COLUMNS]
    assert {c["column"] for c in records[0]["cells"]} == {CAMPAIGN_COLUMNS[0]}
    assert [c["row"] for c in records[0]["cells"]] == ["gelu/nn.GELU", "gelu/written out (erf)"]
    assert "| gelu | nn.GELU | " in (whole / "spellings.md").read_text()
    plain = tmp_path / "plain.md"  # the matrix measured without recording: the same table
    _matrix(spellings, monkeypatch, "--cache", cache, "--table", str(plain))
    assert _table_text(plain) == _table_text(whole / "spellings.md")

    for k in (1, 2):
        _matrix(spellings, monkeypatch, "--cache", cache, "--shard", f"{k}/2",
                "--out", str(tmp_path / f"shard-{k}"))
        assert len((tmp_path / f"shard-{k}" / f"records-{k}-of-2.jsonl")
                   .read_text().splitlines()) == 1
    merged = tmp_path / "merged.md"
    monkeypatch.setattr(sys, "argv", ["spellings.py", "--from-records", str(tmp_path / "shard-1"),
                                      str(tmp_path / "shard-2"), "--table", str(merged)])
    spellings.main()
    assert _table_text(merged) == _table_text(whole / "spellings.md")

    # one shard alone is a lost column, not a pass
    monkeypatch.setattr(sys, "argv", ["spellings.py", "--from-records", str(tmp_path / "shard-1"),
                                      "--table", str(tmp_path / "half.md")])
    with pytest.raises(SystemExit) as lost:
        spellings.main()
    assert lost.value.code == 1

    # a run killed after its first column: the resume measures only the second
    (whole / "records.jsonl").write_text(json.dumps(records[0]) + "\n")
    measured = []
    real = spellings._measure_column
    monkeypatch.setattr(spellings, "_measure_column",
                        lambda work: measured.append(work[1]) or real(work))
    _matrix(spellings, monkeypatch, "--cache", cache, "--resume", str(whole))
    assert measured == [CAMPAIGN_COLUMNS[1]]
    assert _table_text(whole / "spellings.md") == _table_text(merged)
    # resumed again: nothing left to measure
    _matrix(spellings, monkeypatch, "--cache", cache, "--resume", str(whole))
    assert measured == [CAMPAIGN_COLUMNS[1]]


@pytest.mark.parametrize(("options", "message"), [
    (["--shard", "3/2", "--out", "runs"], "--shard 3/2: shard is (k, n) with 1 <= k <= n"),
    (["--shard", "two", "--out", "runs"], "--shard takes K/N"),
    (["--shard", "1/2"], "give --out DIR (or --resume DIR) too"),
    (["--resume", "nowhere"], "no campaign recorded there"),
])
def test_a_bad_shard_or_resume_is_a_one_line_error_before_any_work(
        spellings, tmp_path, monkeypatch, capsys, options, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(spellings, "_measure_column", lambda work: pytest.fail("measured"))
    with pytest.raises(SystemExit) as exit_:
        _matrix(spellings, monkeypatch, *options)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_resuming_another_matrix_campaigns_folder_says_what_differs(spellings, tmp_path,
                                                                    monkeypatch, capsys):
    import json

    other = spellings.matrix_campaign([spellings.SPELLINGS[0]],
                                      [spellings.Column("torch.export", "float32", "static")],
                                      numeric=False)
    (tmp_path / "campaign.json").write_text(json.dumps(other.identity()))
    monkeypatch.setattr(spellings, "_measure_column", lambda work: pytest.fail("measured"))
    with pytest.raises(SystemExit) as exit_:
        _matrix(spellings, monkeypatch, "--resume", str(tmp_path))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "it holds another campaign" in err, err
    assert "'rows': ['gelu/nn.GELU', 'gelu/written out (erf)']" in err
