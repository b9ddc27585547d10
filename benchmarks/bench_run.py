"""Where ``patternkit run`` spends its time, with the builds shared and drawn aside, or not.

Issue 38 asks for ``patternkit run "zoo:gpt2?layers=12"`` end to end in 15 s with the
per-site validation on.  This runs the whole job (:func:`patternkit.app.job.run`, files
written to a temporary folder) in one process once per mode:

* ``apart``: as before issue 38: every build made on its own (before, after, the
  per-site module, and both sides again at a second size; no cached builds,
  ``patternkit.verification.builds.caching(False)``) and the drawings drawn in line;
* ``shared``: as ``patternkit run`` does now: one joint build for before, after and the
  sites (:mod:`patternkit.verification.joint`), builds cached by structure, and the
  drawings laid out in a thread while the job builds and checks.

The model is imported first, on its own line (the zoo keeps it: neither mode pays for
it again).  The machine is shared, so wall time alone says little: each mode's line has
the whole run's wall time, the process's CPU time (all its threads) and its child
processes' (``dot``), the job's phases in CPU time (the drawing thread's counted in the
phase it overlaps), and the number of builds.  The last line says whether the two
reports are the same, timings aside.  ``--modes shared,apart`` swaps the order.

    python benchmarks/bench_run.py                               # zoo:gpt2, 12 layers
    python benchmarks/bench_run.py --model "zoo:gpt2?layers=2" --modes shared,apart
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from patternkit.app import drawings, job
from patternkit.app.loading import load
from patternkit.verification import numeric
from patternkit.verification.builds import caching


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _drawn_in_line(out: Path, pictures: dict, before: Any, after: Any,
                   **options: Any) -> Future:
    """``start_drawing`` without the thread: the drawings before the checks, in line."""
    done: Future = Future()
    done.set_result(drawings.draw_job(out, pictures, before, after, **options))
    return done


def run_mode(spec: str, mode: str) -> tuple[dict, dict]:
    """One job run in ``mode``; ``(its JSON line, its report without timings)``."""
    numeric.REFERENCE_BUILDS.clear()
    numeric.CANDIDATE_BUILDS.clear()
    builds = []
    real_build, real_start = numeric.build, drawings.start_drawing

    def counted(mod, *args, **kwargs):
        builds.append(1)
        return real_build(mod, *args, **kwargs)

    numeric.build = counted  # type: ignore[assignment]
    if mode == "apart":
        drawings.start_drawing = _drawn_in_line  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as out, caching(mode == "shared"):
            wall, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
            job.time = SimpleNamespace(perf_counter=time.process_time)  # type: ignore
            report = job.run(spec, out_dir=out)
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
            children = _children_cpu() - children
    finally:
        numeric.build, drawings.start_drawing = real_build, real_start  # type: ignore
        job.time = time  # type: ignore[assignment]
    found = report.to_dict()
    found.pop("seconds", None)
    found.pop("drawings", None)  # each picture's line says how long its layout took
    line = {"model": spec, "mode": mode, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "dot_cpu_s": round(children, 2), "builds": len(builds),
            "phases_cpu_s": report.seconds, "ok": report.ok,
            "drawn": {k: v.split(" (")[0] for k, v in report.drawings.items()}}
    return line, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:gpt2?layers=12")
    parser.add_argument("--modes", default="apart,shared")
    args = parser.parse_args()
    wall, cpu = time.perf_counter(), time.process_time()
    load(args.model)  # imported once: the zoo keeps it, so neither mode pays for it
    print(json.dumps({"model": args.model, "phase": "load",
                      "wall_s": round(time.perf_counter() - wall, 2),
                      "cpu_s": round(time.process_time() - cpu, 2)}), flush=True)
    reports = {}
    for mode in args.modes.split(","):
        line, reports[mode] = run_mode(args.model, mode)
        print(json.dumps(line), flush=True)
    first, *others = reports.values()
    print(json.dumps({"model": args.model,
                      "same_report": all(other == first for other in others)}), flush=True)


if __name__ == "__main__":
    main()
