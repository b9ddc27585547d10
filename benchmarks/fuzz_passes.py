"""Fuzz every pass of ``relax.transform`` that takes no target-specific argument.

Each pass is built with its default arguments and differential-tested by
``patternkit.testing.fuzz.fuzz_pass`` on programs grown from the operator catalogue
(``strategy="ops"``): ``--budget`` programs per pass, each checked on llvm when the pass
changed it; a wrong result is shrunk to its smallest failing cone, and so (here) is a
pass that raises, so every failure comes with a small reproducer.

Each pass runs in a child process of its own, under a time limit: a pass that kills the
interpreter (a segmentation fault) or loops is recorded as such, and the campaign goes on.

Passes are enumerated from ``relax.transform``: every PascalCase name whose call without
arguments returns a ``tvm.transform.Pass``.  :data:`EXCLUDED` says why the others are not
fuzzed (they need arguments, a target, a tuning database or a GPU).

Usage::

    python benchmarks/fuzz_passes.py [--budget 12] [--seed 0] [--only P1,P2] \
        [--json benchmarks/fuzz_passes.json]

prints a Markdown table (pass, programs run, changed, failures by kind) and writes every
failure, with its shrunk TVMScript, to the JSON file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_BUDGET = 12
PASS_TIMEOUT = 300  # seconds per pass, child process included

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

    logging.disable(logging.WARNING)

    def factory():
        return make_pass(name)
    start = time.perf_counter()
    report = fuzz_pass(factory(), "ops", budget=budget, seed=seed, timeout=60)
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


def run_campaign(passes: list[str], budget: int, seed: int) -> list[dict]:
    results = []
    for name in passes:
        start = time.perf_counter()
        try:
            child = subprocess.run([sys.executable, __file__, "--child", name, "--budget",
                                    str(budget), "--seed", str(seed)], capture_output=True,
                                   text=True, timeout=PASS_TIMEOUT)
        except subprocess.TimeoutExpired:
            results.append({"pass": name, "crashed": f"no result after {PASS_TIMEOUT} s"})
            continue
        lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
        if child.returncode != 0 or not lines:
            results.append({"pass": name, "crashed": f"exit status {child.returncode}: "
                                                     f"{child.stderr.strip()[-400:]}"})
        else:
            results.append(json.loads(lines[-1]))
        print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return results


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
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated pass names")
    parser.add_argument("--json", default="", help="write every result here")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(fuzz_one(args.child, args.budget, args.seed)))
        return 0
    passes, excluded = candidate_passes()
    if args.only:
        passes = [p for p in passes if p in args.only.split(",")]
    start = time.perf_counter()
    results = run_campaign(passes, args.budget, args.seed)
    print(table(results))
    print(f"\n{len(passes)} passes, budget {args.budget}, seed {args.seed}, "
          f"{time.perf_counter() - start:.0f} s")
    print("\nExcluded:")
    for name, why in sorted(excluded.items()):
        print(f"- {name}: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps({"budget": args.budget, "seed": args.seed,
                                               "results": results, "excluded": excluded},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
