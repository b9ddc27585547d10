"""Recorded ``fuzz`` and ``fuzz roundtrip`` campaigns, executors, and the counterexample db.

Campaigns here are six drawn programs (about a second each on llvm); shards and other
executors are compared with one unsharded run record for record, ignoring timings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from relu_as_clip import ReluAsClip

from patternkit.app.cli import main
from patternkit.testing.campaign import (
    Campaign,
    Unit,
    local_executor,
    merge_folders,
    read_records,
    run_fuzz_campaign,
    run_roundtrip_campaign,
    run_verify_campaign,
)
from patternkit.testing.campaign_checks import RoundtripCheck
from patternkit.testing.example_db import CounterexampleDB
from patternkit.verification.script import module_text, parse_module_text

PASS = "CanonicalizeBindings"  # changes one of the six programs: one build
BUDGET = 6


def _fuzz(target: str, folder: Path, *extra: str, flag: str = "--out") -> int:
    return main(["fuzz", target, "--budget", str(BUDGET), flag, str(folder), "--quiet",
                 *extra])


def _without_timings(records: list[dict]) -> list[dict]:
    return sorted(({k: v for k, v in r.items() if k != "seconds"} for r in records),
                  key=lambda r: (r["subject"], str(r["instance"])))


def _keys(records: list[dict]) -> list[str]:
    return [f"{r['subject']}#{r['instance']}" for r in records]


@pytest.mark.parametrize("target", [PASS, "roundtrip"])
def test_fuzz_shards_union_is_the_unsharded_campaign_unit_for_unit(tmp_path, capsys, target):
    whole, shards = tmp_path / "whole", [tmp_path / "s1", tmp_path / "s2"]
    assert _fuzz(target, whole) == 0
    records = read_records(whole)
    subject = "roundtrip" if target == "roundtrip" else PASS
    assert _keys(records) == [f"{subject}#{i}" for i in range(BUDGET)]
    assert all(r["seed"] == 0 and isinstance(r["seconds"], float) and r["failure"] is None
               for r in records)
    assert {r["outcome"] for r in records} <= {"changed", "unchanged", "skipped"}
    assert "changed" in {r["outcome"] for r in records}  # a result was built and compared
    header = json.loads((whole / "campaign.json").read_text())
    assert header["what"] == f"fuzz {subject}" and header["budget"] == BUDGET
    for k, folder in enumerate(shards, 1):
        assert _fuzz(target, folder, "--shard", f"{k}/2") == 0
    parts = [read_records(folder) for folder in shards]
    assert sum(map(len, parts)) == BUDGET  # no unit twice, none lost
    assert _without_timings([r for p in parts for r in p]) == _without_timings(records)
    capsys.readouterr()
    assert main(["merge", *map(str, shards), "--quiet"]) == 0
    from_shards = capsys.readouterr().out
    assert main(["merge", str(whole), "--quiet"]) == 0
    assert from_shards == capsys.readouterr().out and f"{BUDGET} tried" in from_shards


def test_any_executor_gives_the_local_records(tmp_path):
    """The executor interface: units in any order, anywhere, the same records."""
    seen: list[Unit] = []

    def backwards(units, check):
        units = list(units)
        seen.extend(units)
        for unit in reversed(units):
            yield check(unit)

    run_roundtrip_campaign(tmp_path / "here", budget=4, executor=local_executor)
    run_roundtrip_campaign(tmp_path / "there", budget=4, executor=backwards)
    assert [u.key for u in seen] == [f"roundtrip#{i}" for i in range(4)]
    assert _without_timings(read_records(tmp_path / "there")) == \
        _without_timings(read_records(tmp_path / "here"))
    # a check is plain data: it pickles to travel to a worker
    import pickle
    check = RoundtripCheck(4, 0)
    assert pickle.loads(pickle.dumps(check)) == check


def test_a_counterexample_found_once_is_replayed_first_next_time(tmp_path):
    db = tmp_path / "db"
    first = run_verify_campaign([ReluAsClip()], tmp_path / "run1", budget=2, db=db)
    assert not first.ok
    [kept] = CounterexampleDB(db).counterexamples(Campaign("verify", (), 0, 0),
                                                  "user.relu_as_clip")
    assert "R.nn.relu" in parse_module_text(kept["reproducer"]).script()
    # run 2, another folder and seed: the kept reproducer is checked before any unit
    second = run_verify_campaign([ReluAsClip()], tmp_path / "run2", budget=2, seed=5, db=db)
    lines = (tmp_path / "run2" / "records.jsonl").read_text().splitlines()
    replay = json.loads(lines[0])
    assert replay["replay"] is True and replay["instance"].startswith("replay:")
    assert replay["outcome"] == "failed" and replay["failure"]["kind"] == "mismatch"
    assert [json.loads(line)["instance"] for line in lines[1:]] == [0, 1]
    assert not second.ok and second.failures[0].kind == "mismatch"
    assert second.targets[0].tried == 3  # the replay and the campaign's two units
    # merge keeps the replay's failure; resuming does not replay it twice
    assert not merge_folders([tmp_path / "run2"])[0].ok
    run_verify_campaign([ReluAsClip()], tmp_path / "run2", budget=2, seed=5, db=db,
                        resume=True)
    assert len(read_records(tmp_path / "run2")) == 3
    # once the rule is right, the replay passes and the database forgets it
    third = run_verify_campaign([ReluAsClip(right=True)], tmp_path / "run3", budget=1, db=db)
    assert third.ok and read_records(tmp_path / "run3")[0]["outcome"] == "changed"
    assert CounterexampleDB(db).counterexamples(Campaign("verify", (), 0, 0),
                                                "user.relu_as_clip") == []


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_campaign_input_is_a_one_line_error_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    for spec in ("3/2", "0/2", "1/0", "a/b"):
        assert _fuzz(PASS, out, "--shard", spec) == 2
        assert "shard" in _one_line_error(capsys)
    assert _fuzz(PASS, out, "--db", str(tmp_path / "no" / "db")) == 2
    assert "no folder" in _one_line_error(capsys)
    assert main(["verify", "relu6.collapse", "--db", str(tmp_path / "db")]) == 2
    assert "--out" in _one_line_error(capsys)
    assert _fuzz("NoSuchPass", out) == 2
    assert "NoSuchPass" in _one_line_error(capsys)
    assert not out.exists() and not (tmp_path / "db").exists()
    # a resume folder of another campaign: another budget, strategy or target
    assert _fuzz("roundtrip", out) == 0
    before = (out / "records.jsonl").read_bytes()
    for argv in (["fuzz", "roundtrip", "--budget", str(BUDGET + 1)],
                 ["fuzz", PASS, "--budget", str(BUDGET)],
                 ["fuzz", "roundtrip", "--budget", str(BUDGET), "--seed", "3"]):
        assert main([*argv, "--resume", str(out), "--quiet", "--db", str(tmp_path / "db")]) == 2
        assert "another campaign" in _one_line_error(capsys)
    assert (out / "records.jsonl").read_bytes() == before
    assert not (tmp_path / "db").exists()


def test_fuzz_and_roundtrip_campaigns_replay_kept_counterexamples(tmp_path):
    """A reproducer kept by another run: replayed first through the fuzzed transform."""
    db = CounterexampleDB(tmp_path / "db")
    script = module_text(ReluAsClip.example())
    for what, subject in (("fuzz user.relu_as_clip", "user.relu_as_clip"),
                          ("fuzz roundtrip", "roundtrip")):
        kept = {"subject": subject, "instance": 0, "failure": {
            "kind": "mismatch", "error": "found before", "reproducer": script}}
        assert db.keep(Campaign(what, (subject,), 1, 0), [kept]) == 1
    report = run_fuzz_campaign(ReluAsClip(), tmp_path / "fuzz", budget=1, strategy="ops",
                               db=db.folder)
    replay = read_records(tmp_path / "fuzz")[0]
    assert replay["replay"] and replay["outcome"] == "failed"
    assert "wide" in replay["failure"]["error"] and not report.ok
    # the round trip of the same module is right: replayed, passed, forgotten
    run_roundtrip_campaign(tmp_path / "rt", budget=1, db=db.folder)
    replay = read_records(tmp_path / "rt")[0]
    assert replay["replay"] and replay["outcome"] == "changed"
    assert db.counterexamples(Campaign("fuzz roundtrip", (), 0, 0), "roundtrip") == []
