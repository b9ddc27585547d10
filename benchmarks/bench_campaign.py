"""``patternkit verify`` campaigns: ``--jobs 2`` against ``--executor ray``, and 4 shards merged.

Run ``python benchmarks/bench_campaign.py`` (``--rules relu6.collapse``,
``--budget 200``, ``--shards 4``, ``--folder DIR``; ``--skip-shards`` for the throughput
alone).

Three recorded campaigns of the same rules, budget and seed, each the command line a user
types, in a child process, one after the other:

* ``--jobs 2``: the local executor's two spawned worker processes;
* ``--executor ray``: a local Ray started with this machine's CPUs (its start is counted),
  units as tasks on long-lived workers;
* ``--shard K/N --jobs 2`` for K = 1..N, folded by ``patternkit merge``.

Each run's records file is watched as it grows (every 0.1 s), so besides the wall time
the time to the first record (start-up: imports, workers, Ray) and the steady throughput
after it (units a second between the first and the last record) are reported.  The
records of all three are compared with their timings left out (they must be identical),
and the merged report with the unsharded run's.  One JSON line per run, then a summary
line with Ray's overhead (wall, and steady throughput) against ``--jobs 2``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATTERNKIT = [sys.executable, "-m", "patternkit.app.cli"]


def _lines(folder: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in folder.glob("*.jsonl"))


def _run(args: list[str], folder: Path) -> dict:
    """Run ``patternkit verify ... --out folder``; wall, first record, last record."""
    command = [*PATTERNKIT, "verify", *args, "--out", str(folder), "--quiet"]
    start = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    first = last = None
    seen = 0
    while child.poll() is None:
        time.sleep(0.1)
        count = _lines(folder) if folder.exists() else 0
        if count > seen:
            now = time.perf_counter() - start
            first = now if first is None else first
            last, seen = now, count
    wall = time.perf_counter() - start
    out, err = child.communicate()
    if child.returncode not in (0, 1):  # 1: a failing unit, still a measured campaign
        raise SystemExit(f"{' '.join(command)} failed:\n{err[-2000:]}")
    count = _lines(folder)
    if count > seen or first is None:  # the last records landed after the last look
        last = wall
        first = wall if first is None else first
    return {"wall_s": round(wall, 1), "first_record_s": round(first, 1),
            "units": count, "steady_units_per_s":
                round((count - 1) / (last - first), 3) if last > first else None,
            "exit": child.returncode, "summary": out.strip().splitlines()}


def _records(folder: Path) -> list[dict]:
    from patternkit.testing.campaign import read_records

    return sorted(({k: v for k, v in r.items() if k != "seconds"}
                   for r in read_records(folder)),
                  key=lambda r: (r["subject"], r["instance"]))


def _merge(folders: list[Path]) -> list[str]:
    done = subprocess.run([*PATTERNKIT, "merge", *map(str, folders), "--quiet"], cwd=ROOT,
                          capture_output=True, text=True)
    return done.stdout.strip().splitlines()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one JSON line per run and a summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", nargs="+", default=["relu6.collapse"])
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--skip-shards", action="store_true",
                        help="measure the throughput only")
    parser.add_argument("--folder", default=None, help="keep the record folders here")
    args = parser.parse_args(argv)
    base = Path(args.folder or tempfile.mkdtemp(prefix="bench-campaign-"))
    if base.exists() and any(base.iterdir()):
        raise SystemExit(f"{base} is not empty")
    what = [*args.rules, "--budget", str(args.budget), "--seed", str(args.seed)]

    runs = {"jobs2": _run([*what, "--jobs", "2"], base / "jobs2"),
            "ray": _run([*what, "--executor", "ray"], base / "ray")}
    for name, run in runs.items():
        print(json.dumps({"run": name, **run}))
    same = _records(base / "jobs2") == _records(base / "ray")
    summary = {"rules": args.rules, "budget": args.budget, "units": runs["jobs2"]["units"],
               "ray_records_identical": same,
               "ray_wall_overhead": round(runs["ray"]["wall_s"] / runs["jobs2"]["wall_s"] - 1,
                                          3)}
    jobs_rate, ray_rate = (runs[n]["steady_units_per_s"] for n in ("jobs2", "ray"))
    if jobs_rate and ray_rate:
        summary["ray_steady_overhead"] = round(jobs_rate / ray_rate - 1, 3)
    if not args.skip_shards:
        shards = [base / f"shard{k}" for k in range(1, args.shards + 1)]
        for k, folder in enumerate(shards, 1):
            run = _run([*what, "--jobs", "2", "--shard", f"{k}/{args.shards}"], folder)
            print(json.dumps({"run": f"shard {k}/{args.shards}", **run}))
        merged = [r for folder in shards for r in _records(folder)]
        summary["shard_units"] = [len(_records(folder)) for folder in shards]
        summary["shards_records_identical"] = (
            sorted(merged, key=lambda r: (r["subject"], r["instance"]))
            == _records(base / "jobs2"))
        summary["merge_report_identical"] = _merge(shards) == _merge([base / "jobs2"])
    print(json.dumps({"summary": summary}))
    print(f"records in {base}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
