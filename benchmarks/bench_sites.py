"""What per-site validation costs, beside the whole-model check it complements.

Issue 32 asks that validating every rewrite site of a 12-layer GPT-2 cost at most 1.5x
the job's numeric check.  Both are measured side by side in one process, on the same
rewritten module and the same inputs, with the build caches cleared before each: the
whole-model comparison (``numeric.compare``: builds ``before`` and ``after``, runs both)
and ``validate_sites`` (one build of the probe and every distinct site, the runs of
every draw).  Prints one JSON line per repeat; the best ratio and the median are in the
last line.

    python benchmarks/bench_sites.py                      # zoo:gpt2, 12 layers
    python benchmarks/bench_sites.py --model "zoo:llama?layers=4" --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import patternkit as pk
from patternkit.app.loading import load
from patternkit.patterns import LIBRARY
from patternkit.verification import numeric
from patternkit.verification.sites import validate_sites


def measure(spec: str, repeat: int) -> list[dict]:
    loaded = load(spec)
    zoo = loaded.zoo
    mod = loaded.mod
    entry = zoo.entry if zoo is not None else "main"
    inputs = ([np.array(a) for a in zoo.arguments()] if zoo is not None
              else numeric.random_inputs(mod[entry]))
    rules = LIBRARY.rewrite_rules()
    log = pk.RewriteLog()
    after = pk.rewrite(rules, mod, log=log)
    rows = []
    for attempt in range(repeat):
        numeric.REFERENCE_BUILDS.clear()
        numeric.CANDIDATE_BUILDS.clear()
        start = time.perf_counter()
        comparison = numeric.compare(mod, after, func_name=entry, inputs=inputs,
                                     rtol=1e-4, atol=1e-4)
        whole = time.perf_counter() - start
        start = time.perf_counter()
        report = validate_sites(mod, after, log, inputs=inputs, func_name=entry, rules=rules)
        sites = time.perf_counter() - start
        row = {"model": spec, "attempt": attempt, "rewrites": log.count(),
               "distinct_sites": len(report.sites), "site_builds": report.builds,
               "whole_model_s": round(whole, 2), "sites_s": round(sites, 2),
               "ratio": round(sites / whole, 2), "whole_model": comparison.status,
               "sites_ok": report.ok}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:gpt2?layers=12")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    rows = measure(args.model, args.repeat)
    ratios = [r["ratio"] for r in rows]
    print(json.dumps({"model": args.model, "best_ratio": min(ratios),
                      "median_ratio": statistics.median(ratios)}))


if __name__ == "__main__":
    main()
