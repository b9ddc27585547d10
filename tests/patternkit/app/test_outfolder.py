"""The output folder holds the files of the run that last wrote it, and only those: a run
that fails or crashes replaces the previous run's report by its own error, never leaves
the previous PASS report (nor its own half-written files) behind."""

from __future__ import annotations

import json

import pytest

from patternkit.app import job
from patternkit.app.cli import main
from patternkit.app.outfolder import STAGING_PREFIX

MODEL = "seed-batchnorm"


def passing_run(out, *extra) -> None:
    assert main(["run", MODEL, "--out", str(out), "--quiet", *extra]) == 0
    assert json.loads((out / "report.json").read_text())["ok"] is True


def assert_failed_report(out, reason: str) -> None:
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is False and reason in report["error"]
    markdown = (out / "report.md").read_text()
    assert "**ERROR**" in markdown and reason in markdown and "PASS" not in markdown


def test_a_failed_run_replaces_the_previous_pass_report_by_its_error(tmp_path, capsys):
    out = tmp_path / "out"
    passing_run(out, "--no-draw")
    (out / "notes.txt").write_text("mine")
    assert main(["run", str(tmp_path / "missing.py"), "--out", str(out), "--quiet"]) == 2
    assert "model file not found" in capsys.readouterr().err
    assert_failed_report(out, "model file not found")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "report.json", "report.md"]
    assert (out / "notes.txt").read_text() == "mine"  # the user's own file stays


def test_a_run_that_crashes_while_writing_leaves_no_half_written_files(tmp_path, monkeypatch):
    out = tmp_path / "out"
    passing_run(out, "--no-draw")

    def crash(staging, *args, **kwargs):
        (staging / "before.py").write_text("# half written")
        (staging / "report.md").write_text("")
        raise RuntimeError("disk full\nsecond line")

    monkeypatch.setattr(job, "write_outputs", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        job.run(MODEL, out_dir=out, draw=False)
    assert_failed_report(out, "RuntimeError: disk full")
    assert "second line" not in (out / "report.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]


def test_a_failed_run_creates_no_folder_that_did_not_exist(tmp_path):
    out = tmp_path / "new"
    assert main(["run", "no-such-model", "--out", str(out), "--quiet"]) == 2
    assert not out.exists()


def test_a_new_run_removes_the_files_of_the_previous_one_it_did_not_write(tmp_path):
    out = tmp_path / "out"
    passing_run(out)  # with drawings
    assert (out / "diff.svg").is_file()
    (out / "mine.svg").write_text("<svg/>")
    passing_run(out, "--no-draw")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["after.py", "before.py", "mine.svg", "report.html", "report.json",
                     "report.md"]
    assert not any(p.name.startswith(STAGING_PREFIX) for p in tmp_path.rglob("*"))


def test_a_failed_run_leaves_a_folder_without_a_previous_report_as_it_was(tmp_path):
    (tmp_path / "report.md").write_text("my own notes")
    assert main(["run", "no-such-model", "--out", str(tmp_path), "--quiet"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]
    assert (tmp_path / "report.md").read_text() == "my own notes"
