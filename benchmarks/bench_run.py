"""Where ``patternkit run`` spends its time, with the builds shared and drawn aside, or not.

Issue 38 asks for ``patternkit run "zoo:gpt2?layers=12"`` end to end in 15 s with the
per-site validation on.  This runs the whole job (:func:`patternkit.app.job.run`, files
written to a temporary folder, the model loaded by the job) in one process once per mode:

* ``apart``: as before issue 38: every build made on its own (before, after, the
  per-site module, and both sides again at a second size; no cached builds,
  ``patternkit.verification.builds.caching(False)``), the drawings and the scripts
  made in line, the model exported and imported;
* ``shared``: one joint build for before, after and the sites
  (:mod:`patternkit.verification.joint`), builds cached by structure, the drawings laid
  out in a thread while the job builds and checks; the scripts in line, the model
  exported and imported (the run before the import cache);
* ``cached``: ``shared``, with the model's import read from the import cache
  (:mod:`patternkit.models.import_cache`, the torch module still built on load),
  ``before.py`` / ``after.py`` written and read back in a thread alongside the checks,
  and the checks' builds compiled at LLVM's ``opt-level`` 1
  (:data:`patternkit.verification.numeric.CHECK_OPT_LEVEL`; the modes above: TVM's
  default, 3);
* ``kept``: ``cached``, with the torch module built only if something reads it
  (nothing does in a run) and each distinct operator call of a check build legalised
  once (:mod:`patternkit.verification.legalize_once`);
* ``linked``: as ``patternkit run`` does now: ``kept``, with the check builds linked into
  a shared library at LLVM's ``opt-level`` 0 by the system's compiler instead of
  JIT-compiled on load (:mod:`patternkit.verification.linked`; the compiler's CPU time is
  in the line's children's time).

A first, untimed-in-the-modes load imports torch and transformers (no mode pays for
that) and writes the cache entry ``kept`` reads, in a temporary cache folder; its line
says what a cold load costs.  Every mode loads the model again (the zoo's per-process
memo is cleared).  The machine is shared, so wall time alone says little: each mode's
line has the whole run's wall time, the process's CPU time (all its threads) and its
child processes' (``dot``), the job's phases in CPU time (the threads' counted in the
phase they overlap), the number of builds and the load average.  The last line says
whether the reports (timings aside) and the written scripts are the same in every mode.

    python benchmarks/bench_run.py                               # zoo:gpt2, 12 layers
    python benchmarks/bench_run.py --model "zoo:gpt2?layers=2" --modes linked,kept,cached,shared
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from patternkit.app import drawings, job, scripts
from patternkit.app.loading import load
from patternkit.models import import_cache, zoo
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


def _written_in_line(out: Path, modules: dict[str, Any]) -> Future:
    """``start_writing`` without the thread: the scripts written in line."""
    done: Future = Future()
    done.set_result([scripts.write_script(out / f"{name}.py", mod)
                     for name, mod in modules.items()])
    return done


def run_mode(spec: str, mode: str) -> tuple[dict, dict]:
    """One job run in ``mode``; ``(its JSON line, its report without timings and the
    scripts it wrote)``.
    """
    numeric.REFERENCE_BUILDS.clear()
    numeric.CANDIDATE_BUILDS.clear()
    zoo._build.cache_clear()  # every mode loads the model
    builds = []
    real_build, real_start = numeric.build, drawings.start_drawing
    real_writing = scripts.start_writing

    def counted(mod, *args, **kwargs):
        builds.append(1)
        return real_build(mod, *args, **kwargs)

    numeric.build = counted  # type: ignore[assignment]
    if mode == "apart":
        drawings.start_drawing = _drawn_in_line  # type: ignore[assignment]
    if mode in ("apart", "shared"):
        scripts.start_writing = _written_in_line  # type: ignore[assignment]
    # the user's switch: the job's loader asks for the cache
    os.environ[import_cache.SWITCH] = "1" if mode in ("linked", "kept", "cached") else "0"
    opt_level, once, link, described = (numeric.CHECK_OPT_LEVEL, numeric.LEGALIZE_ONCE,
                                        numeric.LINK_CHECKS, zoo._from_import_cache)
    if mode not in ("linked", "kept", "cached"):
        numeric.CHECK_OPT_LEVEL = None  # TVM's default
    if mode != "linked":
        numeric.LINK_CHECKS = False  # JIT-compiled on load, as TVM does
    if mode not in ("linked", "kept"):
        numeric.LEGALIZE_ONCE = False  # TVM's default pipeline
        zoo._from_import_cache = lambda spec, entry: None  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as out, caching(mode != "apart"):
            load_before = os.getloadavg()[0]
            wall, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
            job.time = SimpleNamespace(perf_counter=time.process_time)  # type: ignore
            report = job.run(spec, out_dir=out)
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
            children = _children_cpu() - children
            written = {name: (Path(out) / name).read_bytes()
                       for name in ("before.py", "after.py", "before.weights.npz",
                                    "after.weights.npz") if (Path(out) / name).exists()}
    finally:
        numeric.build, drawings.start_drawing = real_build, real_start  # type: ignore
        scripts.start_writing = real_writing  # type: ignore[assignment]
        job.time = time  # type: ignore[assignment]
        os.environ.pop(import_cache.SWITCH)
        numeric.CHECK_OPT_LEVEL, numeric.LEGALIZE_ONCE = opt_level, once
        numeric.LINK_CHECKS = link
        zoo._from_import_cache = described  # type: ignore[assignment]
    found = report.to_dict()
    found.pop("seconds", None)
    found.pop("drawings", None)  # each picture's line says how long its layout took
    found["written"] = written
    line = {"model": spec, "mode": mode, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "dot_cpu_s": round(children, 2), "builds": len(builds),
            "phases_cpu_s": report.seconds, "ok": report.ok,
            "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "drawn": {k: v.split(" (")[0] for k, v in report.drawings.items()}}
    return line, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:gpt2?layers=12")
    parser.add_argument("--modes", default="kept,linked",
                        help="of apart, shared, cached, kept, linked (default: the run "
                             "before and after linking the check builds)")
    args = parser.parse_args()
    os.environ[import_cache.FOLDER] = tempfile.mkdtemp(prefix="bench-run-imports-")
    os.environ.pop(import_cache.SWITCH, None)
    wall, cpu = time.perf_counter(), time.process_time()
    with import_cache.using():
        load(args.model)  # torch and transformers imported, the cache entry written
    print(json.dumps({"model": args.model, "phase": "cold load (writes the cache)",
                      "wall_s": round(time.perf_counter() - wall, 2),
                      "cpu_s": round(time.process_time() - cpu, 2),
                      "load_average": round(os.getloadavg()[0], 1)}), flush=True)
    reports = {}
    for mode in args.modes.split(","):
        line, reports[mode] = run_mode(args.model, mode)
        print(json.dumps(line), flush=True)
    first, *others = reports.values()
    print(json.dumps({"model": args.model,
                      "same_report": all(other == first for other in others)}), flush=True)
    import shutil

    shutil.rmtree(os.environ[import_cache.FOLDER], ignore_errors=True)


if __name__ == "__main__":
    main()
