"""Model Explorer export: ``pk.explore`` on a 12-layer GPT-2, graphs and overlays written.

Run ``python benchmarks/bench_explore.py`` (``--model`` for another zoo spec,
``--repeat`` for the number of timed runs).  The model is built once (the zoo build is
not timed), then the job's pipeline is run once (rewrite with the library, composites,
partition, offload report; not timed) and two things are timed, each the best of
``--repeat`` runs, from the modules to the files on disk:

1. ``explore(before).write(folder)``: the model alone;
2. ``explore(before, after, rewritten=..., log=..., offload=...).write(folder)``: the
   three stages with the rewrite and offload overlays, as ``patternkit run --explore``.

Target: under 2 s for each (issue 37).  Prints one JSON line per measurement with the
node and layer-group counts.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time

import patternkit as pk
from patternkit.app.loading import load
from patternkit.app.rules import resolve_rules
from patternkit.byoc import CompositeLog, merge_composite, partition_graph
from patternkit.byoc.reports.offload import explain_offload
from patternkit.byoc.tables import PatternTable
from patternkit.viz.explorer import explore

TARGET_SECONDS = 2.0
LAYER = re.compile(r"/layer\d+$")


def _best(make, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            result = make()
            result.write(folder)
            best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    """Time the two exports and print them as JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:gpt2?layers=12")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    before = load(args.model).mod
    chosen = resolve_rules(None)
    log = pk.RewriteLog()
    rewritten = pk.rewrite(chosen.rewrite_rules(), before, log=log)
    table = PatternTable(chosen.composites().for_compiler("ccompiler"), "ccompiler")
    merge_log = CompositeLog()
    merged = merge_composite(rewritten, table, log=merge_log)
    offload = explain_offload(merged, merge_log, table)
    after = partition_graph(merged, "ccompiler")
    cases = {
        "model": lambda: explore(before),
        "pipeline": lambda: explore(before, after, rewritten=rewritten, log=log,
                                    offload=offload),
    }
    for name, make in cases.items():
        seconds, ex = _best(make, args.repeat)
        print(json.dumps({
            "benchmark": "explore", "case": name, "model": args.model,
            "seconds": round(seconds, 3), "target_seconds": TARGET_SECONDS,
            "nodes": {m: g.node_count for m, g in ex.models.items()},
            "layer_groups": {m: sum(1 for ns in g.namespaces() if LAYER.search(ns))
                             for m, g in ex.models.items()},
            "overlays": [f"{o.name} on {o.model}" for o in ex.overlays]}))


if __name__ == "__main__":
    main()
