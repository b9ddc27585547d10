"""Recorded campaigns: example-level shards, JSON Lines records, merge, resume after SIGKILL.

A campaign here is two cheap rules at a budget of 3 (a few seconds on llvm); the shards
and the resumed runs are compared with one unsharded run, record for record, ignoring the
timings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import tvm
from relu_as_clip import ReluAsClip

from patternkit.app.cli import main
from patternkit.testing.campaign import (
    Campaign,
    Unit,
    merge_folders,
    read_records,
    run_verify_campaign,
)
from patternkit.testing.fuzz import verify_rules
from patternkit.verification.script import parse_module_text

RULES = ["relu6.collapse", "batchnorm.collapse"]
BUDGET = 3
ROOT = Path(__file__).resolve().parents[3]


def _verify(folder: Path, *extra: str, flag: str = "--out") -> int:
    return main(["verify", *RULES, "--budget", str(BUDGET), flag, str(folder), "--quiet",
                 *extra])


def _without_timings(records: list[dict]) -> list[dict]:
    return sorted(({k: v for k, v in r.items() if k != "seconds"} for r in records),
                  key=lambda r: (r["subject"], r["instance"]))


def _keys(records: list[dict]) -> list[str]:
    return [f"{r['subject']}#{r['instance']}" for r in records]


def _numbers(report) -> list[tuple]:
    return [(t.target, t.tried, t.fired, t.rejected, t.max_abs_error, t.tolerances,
             [(f.kind, f.error) for f in t.failures]) for t in report.targets]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """One unsharded recorded run of the campaign."""
    folder = tmp_path_factory.mktemp("whole")
    assert _verify(folder) == 0
    return folder


def test_units_are_rule_instance_pairs_and_shards_partition_them_evenly():
    campaign = Campaign("verify", ("a.rule", "b.rule", "c.rule"), 200, 0)
    units = campaign.units()
    assert units[:2] == [Unit("a.rule", 0), Unit("a.rule", 1)] and len(units) == 600
    shards = [campaign.units((k, 4)) for k in range(1, 5)]
    assert sorted(u.key for s in shards for u in s) == sorted(u.key for u in units)
    assert all(120 <= len(s) <= 180 for s in shards), [len(s) for s in shards]
    # every rule is spread over every shard: one slow rule does not set the wall time
    assert all({u.subject for u in s} == {"a.rule", "b.rule", "c.rule"} for s in shards)


@pytest.mark.parametrize("spec", ["3/2", "0/2", "2"])
def test_a_bad_shard_is_a_one_line_error_before_any_work(tmp_path, capsys, spec):
    assert _verify(tmp_path / "out", "--shard", spec) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "shard" in err
    assert not (tmp_path / "out").exists()


def test_records_are_one_json_line_per_unit_and_the_report_is_verifys(whole):
    records = read_records(whole)
    assert _keys(records) == [f"{r}#{i}" for r in RULES for i in range(BUDGET)]
    assert {r["outcome"] for r in records} <= {"fired", "rejected", "no-instance"}
    assert all(isinstance(r["seconds"], float) and r["seed"] == 0 for r in records)
    header = json.loads((whole / "campaign.json").read_text())
    assert header["subjects"] == RULES and header["budget"] == BUDGET
    # the recorded campaign counts what the classic one counts
    from patternkit.patterns import LIBRARY
    classic = verify_rules([LIBRARY[name] for name in RULES], budget=BUDGET)
    merged, missing = merge_folders([whole])
    assert missing == 0
    assert _numbers(merged) == _numbers(classic)


@pytest.mark.slow
def test_two_shards_merged_equal_one_run_record_for_record(whole, tmp_path, capsys):
    shards = [tmp_path / "s1", tmp_path / "s2"]
    assert _verify(shards[0], "--shard", "1/2") == 0
    assert _verify(shards[1], "--shard", "2/2", "--jobs", "2") == 0  # in worker processes
    parts = [read_records(folder) for folder in shards]
    assert parts[0] and parts[1] and not set(_keys(parts[0])) & set(_keys(parts[1]))
    assert _without_timings(parts[0] + parts[1]) == _without_timings(read_records(whole))
    merged, missing = merge_folders(shards)
    alone, _ = merge_folders([whole])
    assert missing == 0 and _numbers(merged) == _numbers(alone)
    capsys.readouterr()
    assert main(["merge", *map(str, shards), "--quiet"]) == 0
    from_shards = capsys.readouterr().out
    assert main(["merge", str(whole), "--quiet"]) == 0
    assert from_shards == capsys.readouterr().out and from_shards.count("\n") == len(RULES)
    # a missing shard is reported, not passed off as the whole campaign
    assert main(["merge", str(shards[0]), "--quiet"]) == 1
    assert "incomplete:" in capsys.readouterr().out


def test_a_run_killed_with_sigkill_resumes_losing_and_repeating_nothing(whole, tmp_path):
    """A shard killed in another process (another hash seed), then resumed here."""
    folder = tmp_path / "killed"
    records = folder / "records-1-of-2.jsonl"
    command = [sys.executable, "-m", "patternkit.app.cli", "verify", *RULES, "--budget",
               str(BUDGET), "--out", str(folder), "--shard", "1/2", "--quiet"]
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": "7"})
    try:
        deadline = time.monotonic() + 300
        while not (records.exists() and records.read_bytes().count(b"\n") >= 1):
            assert run.poll() is None, "the campaign ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        run.send_signal(signal.SIGKILL)
    finally:
        run.kill()
        run.wait(timeout=60)
    shard = [u.key for u in Campaign("verify", tuple(RULES), BUDGET, 0).units((1, 2))]
    before = read_records(folder)
    assert 1 <= len(before) < len(shard)
    with records.open("ab") as out:  # as if killed in the middle of a line
        out.write(b'{"subject": "relu6.coll')
    assert _verify(folder, "--shard", "1/2", flag="--resume") == 0
    after = read_records(folder)
    # the other process hashed the units as this one does: the shard is the same units
    assert sorted(_keys(after)) == sorted(shard)  # nothing lost, nothing repeated
    assert Counter(_keys(after)).most_common(1)[0][1] == 1
    expected = [r for r in read_records(whole) if f"{r['subject']}#{r['instance']}" in shard]
    assert _without_timings(after) == _without_timings(expected)
    assert _without_timings(after[:len(before)]) == _without_timings(before)


def test_a_resume_folder_of_another_campaign_is_refused_before_any_work(whole, capsys):
    before = (whole / "records.jsonl").read_bytes()
    for argv in (["verify", RULES[0], "--budget", str(BUDGET)],
                 ["verify", *RULES, "--budget", str(BUDGET + 1)],
                 ["verify", *RULES, "--budget", str(BUDGET), "--seed", "1"]):
        assert main([*argv, "--resume", str(whole), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "another campaign" in err, err
    assert (whole / "records.jsonl").read_bytes() == before
    # --out onto recorded units would mix two runs: refused as well
    assert _verify(whole) == 2
    assert "--resume" in capsys.readouterr().err


def test_resume_needs_a_recorded_campaign_and_merge_one_campaign(whole, tmp_path, capsys):
    assert _verify(tmp_path / "empty", flag="--resume") == 2
    assert "no campaign recorded" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "campaign.json").write_text(json.dumps(
        {**json.loads((whole / "campaign.json").read_text()), "budget": 9}))
    assert main(["merge", str(whole), str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another campaign" in err and "budget 9" in err
    assert main(["merge", str(tmp_path / "nowhere")]) == 2
    assert "no folder" in capsys.readouterr().err


def test_worker_processes_take_library_rules_only(tmp_path):
    from patternkit.patterns import LIBRARY

    class Mine(type(LIBRARY["batchnorm.collapse"])):  # type: ignore[misc]
        pass

    with pytest.raises(ValueError, match="library rules only"):
        run_verify_campaign([Mine()], tmp_path / "mine", budget=1, jobs=2)
    assert not (tmp_path / "mine").exists()


def test_a_failure_is_recorded_with_its_reproducer_and_fails_the_merge(tmp_path, capsys):
    report = run_verify_campaign([ReluAsClip()], tmp_path / "bad", budget=1)
    [record] = read_records(tmp_path / "bad")
    assert record["outcome"] == "failed" and record["failure"]["kind"] == "mismatch"
    reproducer = parse_module_text(record["failure"]["reproducer"])  # pastes into a test
    assert isinstance(reproducer, tvm.IRModule) and "R.nn.relu" in reproducer.script()
    assert not report.ok and report.failures[0].kind == "mismatch"
    capsys.readouterr()
    assert main(["merge", str(tmp_path / "bad")]) == 1
    out = capsys.readouterr().out
    assert "user.relu_as_clip: mismatch" in out and "R.nn.relu" in out
