"""``patternkit run`` reports the families' shapes the rewrite left ("Near misses" in
report.md, ``near_misses`` in report.json): family, function, binding, rule and reason;
a model with none says so."""

from __future__ import annotations

import json
import textwrap

import pytest

from patternkit.app.cli import main
from patternkit.app.near_misses import NearMissSection
from patternkit.app.report import JobReport, report_markdown
from patternkit.engine import NearMiss

pytest.importorskip("torch")

#: A written-out layer norm whose epsilon is a per-feature tensor (layernorm.collapse
#: refuses it), then a GELU (imported as ``R.nn.gelu``: no skeleton left).
TENSOR_EPS_MODEL = textwrap.dedent('''
    import torch

    from patternkit.models.importing import from_torch


    class TensorEpsLayerNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("eps", torch.full((16,), 1e-5))

        def forward(self, x):
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            return torch.nn.functional.gelu((x - mu) / torch.sqrt(var + self.eps))


    program = torch.export.export(TensorEpsLayerNorm().eval(), (torch.randn(2, 5, 16),))
    mod, _, _ = from_torch(program, False, "main", "tensor_eps", {})
''')

#: The same norm with a scalar epsilon: it collapses, and nothing is left over.
SCALAR_EPS_MODEL = TENSOR_EPS_MODEL.replace('self.register_buffer("eps", torch.full((16,), '
                                            '1e-5))', 'self.eps = 1e-5')


def run(tmp_path, source: str, *options: str):
    model = tmp_path / "model.py"
    model.write_text(source)
    out = tmp_path / "out"
    assert main(["run", str(model), "--out", str(out), "--no-draw", *options]) == 0
    return (out / "report.md").read_text(), json.loads((out / "report.json").read_text())


def test_run_names_the_rule_and_reason_of_a_near_miss_in_report_md_and_json(tmp_path, capsys):
    markdown, saved = run(tmp_path, TENSOR_EPS_MODEL)
    assert "; 1 near miss(es) (a family's shape its rules declined" in capsys.readouterr().out
    section = markdown.split("## Near misses", 1)[1].split("\n## ", 1)[0]
    assert "| family | function | binding | rule | reason |" in section
    (row,) = [line for line in section.splitlines() if line.startswith("| norm")]
    assert "`main`" in row and "`layernorm.collapse`" in row
    assert "eps has shape (16,): epsilon must be a scalar constant" in row
    (miss,) = saved["near_misses"]["misses"]
    assert miss["family"] == "norm" and miss["rule"] == "layernorm.collapse"
    assert miss["function"] == "main" and miss["binding"] in row
    assert miss["kind"] == "check"
    assert saved["rewrites"] == {}


def test_run_on_a_model_without_near_misses_says_there_are_none(tmp_path):
    markdown, saved = run(tmp_path, SCALAR_EPS_MODEL, "--quiet")
    assert saved["rewrites"] == {"layernorm.collapse": 1}
    assert saved["near_misses"]["misses"] == []
    families = saved["near_misses"]["families"]
    assert "norm" in families and len(families) == len(set(families))  # each family once
    section = markdown.split("## Near misses", 1)[1].split("\n## ", 1)[0]
    assert section.strip().splitlines()[-1].startswith("none: no skeleton of attention, ")
    assert "attention, attention" not in section


def miss(binding: str, reason: str = "eps has shape (16,)") -> NearMiss:
    return NearMiss("norm", "x - mean(x)", "main", binding, "layernorm.collapse", reason,
                    "check")


def test_a_reason_with_a_pipe_stays_in_its_table_cell():
    report = JobReport("m", "ccompiler", near_misses=NearMissSection([miss("lv4", "a | b")],
                                                                     families=["norm"]))
    (row,) = [line for line in report_markdown(report).splitlines() if line.startswith("| norm")]
    assert row.endswith("| a \\| b |")


def test_report_md_lists_forty_near_misses_and_points_at_report_json_for_the_rest():
    misses = [miss(f"lv{i}") for i in range(45)]
    report = JobReport("m", "ccompiler", near_misses=NearMissSection(misses, families=["norm"]))
    markdown = report_markdown(report)
    assert sum(line.startswith("| norm") for line in markdown.splitlines()) == 40
    assert "... and 5 more (report.json)" in markdown
    saved = report.to_dict()
    assert len(saved["near_misses"]["misses"]) == 45
    # a new key, after those report.json has always written (their order is kept)
    assert list(saved)[-3:] == ["near_misses", "ok", "verdict"]
    assert list(saved)[:-3] == list(JobReport("m", "ccompiler").to_dict())[:-2]


def test_near_misses_not_looked_for_or_not_run_say_so():
    assert "Near misses" not in report_markdown(JobReport("m", "ccompiler"))
    assert "near_misses" not in JobReport("m", "ccompiler").to_dict()
    section = NearMissSection(not_run="ValueError: boom")
    report = JobReport("m", "ccompiler", near_misses=section)
    assert "NOT RUN: ValueError: boom" in report_markdown(report)
    assert report.to_dict()["near_misses"] == {"not_run": "ValueError: boom"}
