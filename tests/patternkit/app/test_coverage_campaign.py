"""``patternkit coverage`` as a recorded campaign: one unit per model, sharded, resumed.

The campaign is the built-in ``seed-batchnorm`` and a model file that does not exist
(a failed unit, not the end of the campaign), against one table.
"""

from __future__ import annotations

import json

from patternkit.app.cli import main
from patternkit.testing.campaign import Unit, read_records, shard_of


def _coverage(models: list[str], *extra: str) -> int:
    return main(["coverage", "--table", "cutlass", *models, "--quiet", *extra])


def _without_timings(records: list[dict]) -> list[dict]:
    return sorted(({k: v for k, v in r.items() if k != "seconds"} for r in records),
                  key=lambda r: r["subject"])


def test_coverage_is_a_campaign_of_models_sharded_resumed_and_merged(tmp_path, capsys):
    models = ["seed-batchnorm", "nowhere/model.py"]  # by their stable hash: shards 2 and 1
    whole = tmp_path / "whole"
    assert _coverage(models, "--out", str(whole)) == 1  # one model did not load
    assert "nowhere/model.py: JobError: model file not found" in capsys.readouterr().out
    records = read_records(whole)
    assert [(r["subject"], r["instance"], r["outcome"]) for r in records] == [
        (models[0], 0, "measured"), (models[1], 0, "failed")]
    rows = json.loads((whole / "coverage.json").read_text())
    assert rows == records[0]["rows"] and [r["stage"] for r in rows] == [
        "as loaded", "after rewrites"]
    assert json.loads((whole / "campaign.json").read_text())["options"] == {
        "tables": "cutlass"}
    # shards: the union is the whole campaign, unit for unit, and merges into its report
    shards = [tmp_path / "s1", tmp_path / "s2"]
    for k, folder in enumerate(shards, 1):
        # a shard fails for the models it holds only, not for the others' (none tried)
        holds_missing = shard_of(Unit(models[1], 0), 2) == k
        assert _coverage(models, "--out", str(folder), "--shard", f"{k}/2") == holds_missing
    parts = [read_records(folder) for folder in shards]
    assert _without_timings(parts[0] + parts[1]) == _without_timings(records)
    capsys.readouterr()
    assert main(["merge", *map(str, shards), "--quiet"]) == 1  # the missing model fails
    from_shards = capsys.readouterr().out
    assert main(["merge", str(whole), "--quiet"]) == 1
    assert from_shards == capsys.readouterr().out and "nowhere/model.py" in from_shards
    # --resume measures nothing again; --out again starts over (as coverage always did)
    report = (whole / "coverage.md").read_text()
    assert _coverage(models, "--resume", str(whole)) == 1
    assert len(read_records(whole)) == 2 and (whole / "coverage.md").read_text() == report
    assert _coverage(models[:1], "--out", str(whole)) == 0
    assert [r["subject"] for r in read_records(whole)] == models[:1]
    # a folder of another campaign is refused before any model loads
    assert main(["fuzz", "roundtrip", "--budget", "1", "--out", str(tmp_path / "fz"),
                 "--quiet"]) == 0
    capsys.readouterr()
    assert _coverage(models, "--out", str(tmp_path / "fz")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another campaign" in err
    assert not (tmp_path / "fz" / "coverage.json").exists()
    # a shard that holds no unit has nothing to fail
    assert _coverage(models[:1], "--out", str(tmp_path / "empty"), "--shard", "1/2") == 0
    assert main(["fuzz", "roundtrip", "--budget", "1", "--shard", "1/2", "--out",
                 str(tmp_path / "fz2")]) == 0
    assert "shard 1/2 holds none of the campaign's units" in capsys.readouterr().out


def test_bad_coverage_input_is_a_one_line_error_before_any_work(tmp_path, capsys):
    for extra, words in ((["--shard", "3/2"], "shard"), (["--table", "nosuch"], "nosuch"),
                         (["--ray-address", "localhost:1"], "--executor ray")):
        assert _coverage(["seed-batchnorm"], "--out", str(tmp_path / "out"), *extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "out").exists()
