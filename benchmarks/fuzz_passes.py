"""Fuzz every pass of ``relax.transform`` that takes no target-specific argument.

Each pass is built with its default arguments and differential-tested by
``patternkit.testing.fuzz.fuzz_pass`` on programs grown from the operator catalogue
(``strategy="ops"``): ``--budget`` programs per pass, each checked on llvm when the pass
changed it; a wrong result is shrunk to its smallest failing cone, and so (here) is a
pass that raises, so every failure comes with a small reproducer.

The passes run in a child process, one after the other, each under a time limit: a pass
that kills the interpreter (a segmentation fault) or loops is recorded as such, and the
campaign goes on in a new child with the passes after it.  (One child per pass, as the
campaign first ran, imported TVM and patternkit 55 times, some 8 s each on this machine.)

Passes are enumerated from ``relax.transform``: every PascalCase name whose call without
arguments returns a ``tvm.transform.Pass``.  :data:`EXCLUDED` says why the others are not
fuzzed (they need arguments, a target, a tuning database or a GPU).

The default run takes minutes: the passes that rewrite graphs draw ``--budget`` programs
(40), the steps of the build in :data:`LOWERING_STEPS` (whose output is no input of
``relax.build``, so every changed program "fails" the same way) ``--lowering-budget``
(3).  ``--full`` gives every pass ``--budget`` programs, as the table of
``docs/tvm-bugs.md`` was made.

Usage::

    python benchmarks/fuzz_passes.py [--budget 40] [--lowering-budget 3] [--full] \
        [--seed 0] [--only P1,P2] [--jobs 2] [--json benchmarks/fuzz_passes.json]

prints a Markdown table (pass, programs run, changed, failures by kind) and writes every
failure, with its shrunk TVMScript, to the JSON file.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

DEFAULT_BUDGET = 40
LOWERING_BUDGET = 3
PASS_TIMEOUT = 300  # seconds per pass
START_TIMEOUT = 120  # seconds for a child to import TVM and patternkit

#: Steps of the build rather than graph rewrites: their output is a lower-level IR that
#: ``relax.build`` does not take as input (or a module the build would make anyway), so
#: a few programs show what they do; more programs only repeat it.
LOWERING_STEPS = frozenset({
    "AnnotateTIROpPattern", "AttachAttrLayoutFreeBuffers", "AttachGlobalSymbol",
    "BundleModelParams", "CallTIRRewrite", "ComputePrimValue", "DataflowUseInplaceCalls",
    "FuseOps", "FuseTIR", "KillAfterLastUse", "LazyGetInput", "LazySetOutput",
    "LazyTransformParams", "LegalizeOps", "LiftTransformParams", "LowerAllocTensor",
    "LowerRuntimeBuiltin", "NormalizeGlobalVar", "OptimizeLayoutTransform",
    "RemovePurityChecking", "RewriteDataflowReshape", "SpecializePrimFuncBasedOnCallSite",
    "SplitLayoutRewritePreproc", "StaticPlanBlockMemory", "ToNonDataflow", "VMBuiltinLower",
    "VMShapeLower",
})

#: Passes not fuzzed, and why.  Factories that need arguments are found by calling them.
EXCLUDED = {
    "MetaScheduleApplyDatabase": "needs a tuning database and a target",
    "MetaScheduleTuneIRMod": "tunes for a target (needs its parameters and a work dir)",
    "MetaScheduleTuneTIR": "tunes for a target (needs its parameters and a work dir)",
    "RunCodegen": "runs external codegens (targets)",
    "RewriteCUDAGraph": "CUDA graphs: GPU only",
    "LowerGPUIPCAllocStorage": "GPU inter-process memory",
    "IPCAllReduceRewrite": "GPU inter-process all-reduce",
    "AllocateWorkspace": "workspaces for external kernels (targets)",
    "RealizeVDevice": "virtual devices of a target",
    "UpdateVDevice": "needs a virtual device (an argument)",
}


#: Passes whose arguments are not target-specific, fuzzed with these (name -> factory).
WITH_ARGUMENTS = {
    "ConvertLayout[NHWC]": lambda t: t.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]}),
    "ConvertLayout[NCHW]": lambda t: t.ConvertLayout({"relax.nn.conv2d": ["NCHW", "OIHW"]}),
    "BindSymbolicVars[n=3]": lambda t: t.BindSymbolicVars({"n": 3}),
}


def make_pass(name: str):
    """The pass called ``name`` (:data:`WITH_ARGUMENTS`, or built without arguments)."""
    from tvm import relax

    if name in WITH_ARGUMENTS:
        return WITH_ARGUMENTS[name](relax.transform)
    return getattr(relax.transform, name)()


def candidate_passes() -> tuple[list[str], dict[str, str]]:
    """(passes to fuzz, excluded name -> why), from ``relax.transform`` itself."""
    import tvm
    from tvm import relax

    passes, excluded = [], {}
    for name in sorted(dir(relax.transform)):
        factory = getattr(relax.transform, name)
        if not name[:1].isupper() or not callable(factory):
            continue
        if name in EXCLUDED:
            excluded[name] = EXCLUDED[name]
            continue
        if isinstance(factory, type) and not issubclass(factory, tvm.transform.Pass):
            excluded[name] = f"not a pass ({factory.__name__} is a helper class)"
            continue
        try:
            made = factory()
        except TypeError as err:
            excluded[name] = f"needs arguments ({str(err).splitlines()[0][:80]})"
            continue
        except Exception as err:  # noqa: BLE001 - recorded as the reason
            excluded[name] = f"cannot be built without arguments ({type(err).__name__})"
            continue
        if not isinstance(made, tvm.transform.Pass):
            excluded[name] = f"returns a {type(made).__name__}, not a pass"
            continue
        passes.append(name)
    for name in WITH_ARGUMENTS:
        excluded.pop(name.split("[")[0], None)
    return sorted(passes + list(WITH_ARGUMENTS)), excluded


def fuzz_one(name: str, budget: int, seed: int) -> dict:
    """Fuzz one pass (in this process); its result as JSON-ready data."""
    import logging

    from patternkit.testing.fuzz import fuzz_pass
    from patternkit.verification.differential import apply_transform
    from patternkit.verification.report import _text
    from patternkit.verification.shrink import shrink_module

    def factory():
        return make_pass(name)
    start = time.perf_counter()
    # TVM's passes warn on many drawn programs; silenced for this call only (a caller in
    # the same process, the test suite, keeps its own log).
    logging.disable(logging.WARNING)
    try:
        report = fuzz_pass(factory(), "ops", budget=budget, seed=seed, timeout=60)
    finally:
        logging.disable(logging.NOTSET)
    target = report.targets[0]
    failures = []
    shrunk_errors: set[str] = set()
    for failure in target.failures:
        text, shrunk = failure.script, failure.shrunk
        first_line = failure.error.split(":", 1)[0]
        if failure.kind == "raised" and first_line + failure.error[:60] not in shrunk_errors:
            shrunk_errors.add(first_line + failure.error[:60])

            def still_raises(candidate, error=failure.error):
                again = apply_transform(factory(), candidate, 60)
                return again.kind == "raised" and again.error[:60] == error[:60]

            small = shrink_module(failure.module, still_raises)
            text, shrunk = _text(small), True
        failures.append({"kind": failure.kind, "error": failure.error[:2000],
                         "occurrences": failure.occurrences, "shrunk": shrunk,
                         "script": text})
    return {"pass": name, "tried": target.tried, "changed": target.fired,
            "skipped": target.rejected, "failures": failures,
            "seconds": round(time.perf_counter() - start, 1)}


def budget_of(name: str, budget: int, lowering_budget: int) -> int:
    """Programs to draw for the pass ``name``."""
    return lowering_budget if name in LOWERING_STEPS else budget


def child_main(names: list[str], budgets: list[int], seed: int) -> None:
    """Fuzz ``names`` one after the other, a JSON line announcing and reporting each."""
    for name, budget in zip(names, budgets):
        print(json.dumps({"start": name}), flush=True)
        print(json.dumps(fuzz_one(name, budget, seed)), flush=True)


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_share(passes: list[str], budgets: dict[str, int], seed: int) -> list[dict]:
    """Fuzz ``passes`` in child processes, a new child after a pass crashes or hangs."""
    results: list[dict] = []
    todo = list(passes)
    while todo:
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", ",".join(todo), "--budgets",
             ",".join(str(budgets[p]) for p in todo), "--seed", str(seed)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_read_lines, args=(child.stdout, lines), daemon=True).start()
        stderr: list[str] = []
        threading.Thread(target=lambda: stderr.extend(child.stderr), daemon=True).start()
        current, started = None, time.perf_counter()
        while True:
            limit = PASS_TIMEOUT if current else START_TIMEOUT
            try:
                line = lines.get(timeout=max(1.0, limit - (time.perf_counter() - started)))
            except queue.Empty:
                child.kill()
                child.wait()
                if current is None:  # the child did not start: nothing to blame
                    current = todo[0]
                results.append({"pass": current, "crashed": f"no result after {limit} s"})
                todo.remove(current)
                break
            if line is None:  # the child is gone
                status = child.wait()
                if current is not None:
                    results.append({"pass": current, "crashed": f"exit status {status}: "
                                    f"{''.join(stderr).strip()[-400:]}"})
                    todo.remove(current)
                elif todo:  # died before its first pass: do not loop on it
                    results.append({"pass": todo[0], "crashed": f"exit status {status}"})
                    todo.pop(0)
                break
            if not line.startswith("{"):
                continue
            data = json.loads(line)
            if "start" in data:
                current, started = data["start"], time.perf_counter()
                continue
            results.append(data)
            todo.remove(data["pass"])
            print(f"{data['pass']}: {data['seconds']:.0f} s", file=sys.stderr, flush=True)
            current = None
            if not todo:
                child.wait()
                break
    return results


def run_campaign(passes: list[str], budgets: dict[str, int], seed: int,
                 jobs: int = 1) -> list[dict]:
    """Every pass's result, in the order of ``passes``; ``jobs`` children at a time."""
    shares = [passes[k::jobs] for k in range(jobs)]
    outcomes: list[list[dict]] = [[] for _ in shares]

    def run(k: int) -> None:
        outcomes[k] = run_share(shares[k], budgets, seed)
    workers = [threading.Thread(target=run, args=(k,)) for k in range(len(shares))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    by_name = {r["pass"]: r for share in outcomes for r in share}
    return [by_name[p] for p in passes]


def table(results: list[dict]) -> str:
    rows = ["| pass | programs run | changed | failures |", "| --- | ---: | ---: | --- |"]
    for r in results:
        if "crashed" in r:
            rows.append(f"| {r['pass']} | - | - | crashed: {r['crashed'][:80]} |")
            continue
        kinds: dict[str, int] = {}
        for f in r["failures"]:
            kinds[f["kind"]] = kinds.get(f["kind"], 0) + f["occurrences"]
        text = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "0"
        rows.append(f"| {r['pass']} | {r['tried']} | {r['changed']} | {text} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                        help="programs for each pass that rewrites graphs")
    parser.add_argument("--lowering-budget", type=int, default=LOWERING_BUDGET,
                        help="programs for each step of the build (LOWERING_STEPS)")
    parser.add_argument("--full", action="store_true",
                        help="every pass gets --budget programs (the full table)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated pass names")
    parser.add_argument("--jobs", type=int, default=1, help="child processes at a time")
    parser.add_argument("--json", default="", help="write every result here")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--budgets", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child.split(","), [int(b) for b in args.budgets.split(",")],
                   args.seed)
        return 0
    passes, excluded = candidate_passes()
    if args.only:
        passes = [p for p in passes if p in args.only.split(",")]
    lowering_budget = args.budget if args.full else args.lowering_budget
    budgets = {p: budget_of(p, args.budget, lowering_budget) for p in passes}
    start = time.perf_counter()
    results = run_campaign(passes, budgets, args.seed, max(1, args.jobs))
    print(table(results))
    print(f"\n{len(passes)} passes, budget {args.budget} (steps of the build "
          f"{lowering_budget}), seed {args.seed}, jobs {args.jobs}, "
          f"{time.perf_counter() - start:.0f} s")
    print("\nExcluded:")
    for name, why in sorted(excluded.items()):
        print(f"- {name}: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps({"budget": args.budget,
                                               "lowering_budget": lowering_budget,
                                               "seed": args.seed, "results": results,
                                               "excluded": excluded}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
