"""A check build linked at LLVM opt-level 0 against the same build JIT-compiled at level 1.

Run ``python benchmarks/bench_check_build.py`` (``--models "gpt2?layers=12" resnet50
bert``, ``--repeat 2``).

For each zoo model (random weights, nothing downloaded), in one process, alternating
``--repeat`` times: ``jit`` is what :func:`patternkit.verification.numeric.build` did
before :mod:`patternkit.verification.linked` (``relax.build`` at ``opt-level`` 1, the VM
created from the executable, which JIT-compiles it), ``linked`` what it does now for a
small model (``relax.build`` at ``opt-level`` 0, ``export_library`` through the system's
compiler, ``load_module``).  Each side's line has its best wall times for the build, for
getting a running VM (JIT compile, or link and load) and for one run of the model on the
check's seeded inputs (the second of two runs), and the work estimate that decides which
path a model takes.  The last line per model gives the ratio of the time to a running VM
(build + VM) and whether both sides' outputs are the same to the bit.  Wall time: the
compiler runs in a child process; the machine is shared, so compare within a line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def _time_side(mod, inputs, linked: bool) -> tuple[dict[str, float], list[np.ndarray]]:
    import tvm
    from tvm import relax

    from patternkit.verification import numeric
    from patternkit.verification.linked import load_linked

    start = time.perf_counter()
    executable = relax.build(mod, target=numeric.check_target(linked=linked),
                             relax_pipeline=numeric.legalize_once_pipeline())
    built = time.perf_counter()
    loaded = load_linked(executable) if linked else None
    if linked and loaded is None:
        raise SystemExit("no C compiler found: nothing to compare")
    vm = relax.VirtualMachine(executable if loaded is None else loaded, tvm.cpu())
    ready = time.perf_counter()
    numeric.run(mod, inputs, vm=vm)
    run_start = time.perf_counter()
    outputs = numeric.run(mod, inputs, vm=vm)
    done = time.perf_counter()
    return ({"build_s": built - start, "vm_s": ready - built, "run_s": done - run_start},
            outputs)


def bench(spec: str, repeat: int) -> list[dict]:
    from patternkit.models import zoo_model
    from patternkit.verification.linked import estimated_work, pays_for
    from patternkit.verification.numeric import random_inputs

    mod = zoo_model(spec).mod
    inputs = random_inputs(mod["main"], seed=0)
    best: dict[str, dict[str, float]] = {}
    outputs: dict[str, list[np.ndarray]] = {}
    for _ in range(repeat):
        for side in ("jit", "linked"):
            times, outputs[side] = _time_side(mod, inputs, side == "linked")
            kept = best.setdefault(side, times)
            for key, value in times.items():
                kept[key] = min(kept[key], value)
    lines = [{"model": spec, "side": side, **{k: round(v, 3) for k, v in t.items()}}
             for side, t in best.items()]
    same = all(np.array_equal(a, b) for a, b in zip(outputs["jit"], outputs["linked"]))
    to_vm = {side: t["build_s"] + t["vm_s"] for side, t in best.items()}
    lines.append({"model": spec, "work": estimated_work(mod), "linked_by_default":
                  pays_for(mod), "to_running_vm_ratio": round(to_vm["linked"] / to_vm["jit"], 3),
                  "same_outputs": same, "load_average": round(os.getloadavg()[0], 1)})
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2?layers=12", "resnet50", "bert"])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    for spec in args.models:
        for line in bench(spec, args.repeat):
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
