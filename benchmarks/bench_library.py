"""The whole pattern library against one rule, on GPT-2 graphs of 1 to 48 layers.

Run ``python benchmarks/bench_library.py`` (``--layers 1 4 12 48``, ``--repeat 3``,
``--graphs gpt2 onnx:gpt2?opset=14``, ``--rule gelu_tanh.collapse``, ``--before DIR``).

What is timed, on the same imported module:

* **library**: what ``patternkit run`` applies by default, ``pk.rewrite`` with every
  rewrite rule of :data:`patternkit.patterns.LIBRARY` (to the fixed point), then
  ``merge_composite`` with every composite of the library on the rewritten module;
* **rewrites**: the rewrite half of that alone;
* **one rule**: ``pk.rewrite`` with the single rule ``--rule`` (default
  ``gelu_tanh.collapse``, which fires once per layer on both graphs);
* **composites**: the composite half of the library alone, ``merge_composite`` on the
  rewrites' result with the function index the rewrite left (as in the library run).

``--stages`` prints instead where the time goes, per stage, in one process per size (the
best CPU time of each stage over ``--repeat`` runs): the function indexes, each rule's
matching and check (each composite entry's, for the composites), emission, the multi-root
rules, the composites' functions.

``--before DIR`` also times a checkout of an older commit (``git archive <commit> | tar -x
-C DIR``): its processes alternate with this code's, so both meet the same load, and each
row gives the older code's times and ratio beside this code's (``before_*``).

Graphs, from :func:`patternkit.models.zoo_model` (random weights, nothing downloaded):
``gpt2`` (torch export: the importer emits ``R.nn.layer_norm`` and ``R.nn.softmax``
itself, so ``attention.collapse`` and ``gelu_tanh.collapse`` fire, once a layer each, then
the matmul and layer-norm composites) and ``onnx:gpt2?opset=14`` (layer norms, softmax-free
attention and GELU-tanh written out, so the collapse rules fire on every layer).

How it times: every (graph, layers) pair runs in ``--processes`` fresh processes (a
process that has just imported a 48-layer model runs what follows it slower), each of
which builds the model untimed and then times each of the three ``--repeat`` times,
interleaved, keeping the best CPU time of the process (``time.process_time``: user +
system, steadier than wall time on a shared machine); the row takes each time's best
over the processes, and also gives the median of the processes' own ratios.  Each
process prints one JSON line; the parent prints the combined row of every size and a
summary line per graph: library / one rule at every size, and time per binding relative
to the smallest size (linear growth keeps it flat).  The function indexes that
passes hand each other (``FunctionIndex.of``) are dropped before every timed run, so no
run finds its input indexed by the run before.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkout import child_env, import_checkout_library  # noqa: E402

DEFAULT_LAYERS = [1, 4, 12, 48]
DEFAULT_GRAPHS = ["gpt2", "onnx:gpt2?opset=14"]


def _cpu_seconds(fn) -> float:
    from patternkit.engine.index import forget_indexes

    forget_indexes()  # each run indexes its input, as the first run on a module does
    start = time.process_time()
    fn()
    return time.process_time() - start


def _composites_seconds(rewrite, rules, mod, composites) -> float:
    """CPU time of ``merge_composite`` on the rewrites' result, the rewrite untimed: the
    composites' share of the library run (the index the rewrite's last round built is
    kept, as the library run finds it).
    """
    from patternkit.byoc.merge import merge_composite
    from patternkit.engine.index import forget_indexes

    forget_indexes()
    rewritten = rewrite(rules, mod)
    start = time.process_time()
    merge_composite(rewritten, composites)
    return time.process_time() - start


@contextmanager
def timed_calls(probes: list[tuple[Any, str, str]], name_of: Callable[..., str],
                times: dict[str, float]) -> Iterator[None]:
    """Within the block, every call of each probe's ``owner.attribute`` adds its CPU time to
    ``times[label]`` (a label with ``{}`` is completed by ``name_of(args, kwargs)``); the
    attributes are put back on leaving, even after an error.  Labels may nest (a multi-root
    rule builds an index): their times are not meant to add up.
    """
    saved = [(owner, attribute, vars(owner)[attribute]) for owner, attribute, _ in probes]

    def probe(original: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            name = label.format(name_of(args, kwargs)) if "{}" in label else label
            start = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                times[name] = times.get(name, 0.0) + time.process_time() - start
        return timed

    try:
        for owner, attribute, label in probes:
            setattr(owner, attribute, probe(getattr(owner, attribute), label))
        yield
    finally:
        for owner, attribute, original in saved:
            setattr(owner, attribute, original)


def stage_times(graph: str, layers: int, rule_name: str, repeat: int) -> dict:
    """Where the library run's time goes (``--stages``): per stage, the best CPU time over
    ``repeat`` runs, in ms, for the one rule, the rewrites and the composites.
    """
    import patternkit as pk
    import patternkit.byoc.merge.composites as composites_module
    import patternkit.engine.driver as driver
    from patternkit.byoc.merge import merge_composite
    from patternkit.engine.index import FunctionIndex, forget_indexes
    from patternkit.models import zoo_model
    from patternkit.patterns import LIBRARY

    separator = "&" if "?" in graph else "?"
    mod = zoo_model(f"{graph}{separator}layers={layers}").mod
    rules = LIBRARY.rewrite_rules()
    composites = LIBRARY.composites().for_compiler("ccompiler")
    one = LIBRARY.find(rule_name)
    entry_of = {id(rule.pattern): rule.name for rule in composites}

    def name_of(args: tuple, kwargs: dict) -> str:  # find_groups: the rule, or the entry
        return str(kwargs.get("rule") or entry_of.get(id(args[1]), "?"))

    probes = [(driver, "find_groups", "match and check: {}"),
              (composites_module, "find_groups", "match and check: {}"),
              (driver, "emit_rewrites", "emission"),
              (composites_module, "emit_rewrites", "emission"),
              (driver, "rewrite_function_bindings", "multi-root rules (with their index)"),
              (FunctionIndex, "build", "index"),
              (composites_module, "build_group_function", "composite functions")]
    best: dict[str, dict[str, float]] = {}
    for _ in range(repeat):
        runs: dict[str, dict[str, float]] = {"one_rule": {}, "rewrites": {}, "composites": {}}
        forget_indexes()
        with timed_calls(probes, name_of, runs["one_rule"]):
            runs["one_rule"]["total"] = _cpu_seconds(lambda: pk.rewrite([one], mod))
        forget_indexes()
        with timed_calls(probes, name_of, runs["rewrites"]):
            start = time.process_time()
            rewritten = pk.rewrite(rules, mod)
            runs["rewrites"]["total"] = time.process_time() - start
        with timed_calls(probes, name_of, runs["composites"]):
            start = time.process_time()
            merge_composite(rewritten, composites)
            runs["composites"]["total"] = time.process_time() - start
        for part, times in runs.items():
            kept = best.setdefault(part, {})
            for label, seconds in times.items():
                kept[label] = min(kept.get(label, float("inf")), seconds)
    return {"graph": graph, "layers": layers, "stages_ms": {
        part: {label: round(seconds * 1000, 2)
               for label, seconds in sorted(times.items(), key=lambda item: -item[1])}
        for part, times in best.items()}}


def measure(graph: str, layers: int, rule_name: str, repeat: int) -> dict:
    """Time the library, its rewrites and one rule on ``graph`` with ``layers`` layers."""
    import patternkit as pk
    from patternkit.byoc.merge import merge_composite
    from patternkit.models import zoo_model
    from patternkit.patterns import LIBRARY

    separator = "&" if "?" in graph else "?"
    model = zoo_model(f"{graph}{separator}layers={layers}")
    mod = model.mod
    bindings = sum(len(block.bindings) for block in mod[model.entry].body.blocks)
    rules = LIBRARY.rewrite_rules()
    composites = LIBRARY.composites().for_compiler("ccompiler")
    one = LIBRARY.find(rule_name)

    def library():
        return merge_composite(pk.rewrite(rules, mod), composites)

    times: dict[str, float] = {}
    for _ in range(repeat):  # interleaved, so load bursts fall on all of them alike
        for name, fn in (("library", library), ("rewrites", lambda: pk.rewrite(rules, mod)),
                         ("one_rule", lambda: pk.rewrite([one], mod))):
            times[name] = min(times.get(name, float("inf")), _cpu_seconds(fn))
        times["composites"] = min(times.get("composites", float("inf")),
                                  _composites_seconds(pk.rewrite, rules, mod, composites))
    log = pk.RewriteLog()
    pk.rewrite(rules, mod, log=log)
    one_log = pk.RewriteLog()
    pk.rewrite([one], mod, log=one_log)
    return {"graph": graph, "layers": layers, "bindings": bindings, "rule": rule_name,
            **{f"{k}_s": round(v, 4) for k, v in times.items()},
            "library_over_one_rule": round(times["library"] / times["one_rule"], 2),
            "rewrites_over_one_rule": round(times["rewrites"] / times["one_rule"], 2),
            "library_rewrites": log.count(), "library_rounds": log.rounds,
            "one_rule_rewrites": one_log.count()}


def summarize(rows: list[dict]) -> dict:
    """Ratios at each size, and time per binding relative to the smallest size."""
    rows = sorted(rows, key=lambda r: r["layers"])
    base = rows[0]
    return {"graph": base["graph"], "summary": True,
            "library_over_one_rule": {r["layers"]: r["library_over_one_rule"] for r in rows},
            "per_binding_vs_smallest": {
                name: {r["layers"]: round((r[f"{name}_s"] / r["bindings"])
                                          / (base[f"{name}_s"] / base["bindings"]), 2)
                       for r in rows}
                for name in ("library", "one_rule")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=DEFAULT_LAYERS)
    parser.add_argument("--graphs", nargs="+", default=DEFAULT_GRAPHS)
    parser.add_argument("--rule", default="gelu_tanh.collapse")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--processes", type=int, default=3,
                        help="fresh processes per (graph, layers); each time is the best")
    parser.add_argument("--before", metavar="DIR",
                        help="also time this checkout of an older commit, in alternate "
                             "processes")
    parser.add_argument("--stages", action="store_true",
                        help="instead: where the time goes, per stage (one process each)")
    parser.add_argument("--child", nargs=2, metavar=("GRAPH", "LAYERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import_checkout_library()
        run = stage_times if args.stages else measure
        print(json.dumps(run(args.child[0], int(args.child[1]), args.rule, args.repeat)))
        return
    for graph in args.graphs:
        rows = []
        for layers in args.layers:
            child = ["--child", graph, str(layers), "--rule", args.rule,
                     "--repeat", str(args.repeat)]
            if args.stages:
                print(json.dumps(_child([*child, "--stages"])), flush=True)
                continue
            runs, before = [], []
            for _ in range(args.processes):  # alternate, so both codes meet the same load
                runs.append(_child(child))
                if args.before:
                    before.append(_child(child, args.before))
            row = combine(runs)
            if before:
                row = compare(row, combine(before))
            rows.append(row)
            print(json.dumps(rows[-1]), flush=True)
        if rows:
            print(json.dumps(summarize(rows)), flush=True)


def _child(args: list[str], code: str | None = None) -> dict:
    """The JSON line of this script run with ``args`` in a fresh process; ``code``: a checkout
    of patternkit to import instead of the installed one (``--before``).
    """
    cmd = [sys.executable, __file__, *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=child_env(code)).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def compare(after: dict, before: dict) -> dict:
    """``after``'s row with ``before``'s times and ratios beside it (``before_*``).

    ``before`` comes from an older checkout whose rows may lack the composites' time.
    """
    row = dict(after)
    for name in ("library", "rewrites", "one_rule", "composites"):
        if f"{name}_s" in before:
            row[f"before_{name}_s"] = before[f"{name}_s"]
    row["before_library_over_one_rule"] = before["library_over_one_rule"]
    row["before_median_of_process_ratios"] = before["median_of_process_ratios"]
    row["library_after_over_before"] = round(after["library_s"] / before["library_s"], 2)
    return row


def combine(runs: list[dict]) -> dict:
    """One row from the processes' rows: each time the best over the processes.

    The same code in two fresh processes can differ by up to 2x here (other tenants),
    and the one rule and the library need not suffer alike, so a single process's ratio
    can be far off; the ratios of the best times are the steady figures.  The median of
    the processes' own ratios is kept beside them.
    """
    row = dict(runs[0])
    for name in ("library", "rewrites", "one_rule", "composites"):
        if all(f"{name}_s" in run for run in runs):  # an older checkout's rows lack some
            row[f"{name}_s"] = min(run[f"{name}_s"] for run in runs)
    row["library_over_one_rule"] = round(row["library_s"] / row["one_rule_s"], 2)
    row["rewrites_over_one_rule"] = round(row["rewrites_s"] / row["one_rule_s"], 2)
    row["processes"] = len(runs)
    row["median_of_process_ratios"] = sorted(run["library_over_one_rule"]
                                             for run in runs)[len(runs) // 2]
    return row


if __name__ == "__main__":
    main()
