"""``MergeComposite`` with the native composite outliner against the Python one.

Run ``python benchmarks/bench_outline.py`` (``--models "zoo:gpt2?layers=12" ...``,
``--repeat 30``).

Each model is rewritten with the library (untimed), then ``merge_composite`` with the
library's ``ccompiler`` composites runs on the result ``--repeat`` times with
``PATTERNKIT_NATIVE`` unset and set to ``0`` in turn, in one process, so that a burst of
load falls on both alike; the best CPU time of each is kept (``time.process_time``, as in
``bench_library.py``: the machine is shared).  The two results are checked to be
structurally equal and to print the same.  The outliner's one-off build (cached by
tvm-ffi after the first run on a machine) is waited for before timing.  One JSON line per
model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_MODELS = ["zoo:gpt2?layers=12", "zoo:onnx:gpt2?opset=14&layers=12", "zoo:resnet50"]


def measure(spec: str, repeat: int) -> dict:
    """Time ``merge_composite`` on ``spec`` with each outliner; check they agree."""
    import tvm_ffi

    import patternkit as pk
    from patternkit.byoc.merge import merge_composite
    from patternkit.ir.native_build import NATIVE_VARIABLE
    from patternkit.ir.outline import OUTLINE
    from patternkit.models import zoo_model
    from patternkit.patterns import LIBRARY

    if OUTLINE.get(wait=True) is None:
        raise SystemExit("the native outliner could not be built here")
    mod = pk.rewrite(LIBRARY.rewrite_rules(), zoo_model(spec.removeprefix("zoo:")).mod)
    table = LIBRARY.composites().for_compiler("ccompiler")
    best = {"native": float("inf"), "python": float("inf")}
    results = {}
    saved = os.environ.get(NATIVE_VARIABLE)
    try:
        for _ in range(repeat):
            for side, flag in (("native", ""), ("python", "0")):
                os.environ[NATIVE_VARIABLE] = flag
                start = time.process_time()
                results[side] = merge_composite(mod, table)
                best[side] = min(best[side], time.process_time() - start)
    finally:
        if saved is None:
            os.environ.pop(NATIVE_VARIABLE, None)
        else:
            os.environ[NATIVE_VARIABLE] = saved
    same = (tvm_ffi.structural_equal(results["native"], results["python"])
            and results["native"].script() == results["python"].script())
    if not same:
        raise SystemExit(f"{spec}: the outliners disagree")
    composites = results["native"].script().count('"Composite"')
    return {"model": spec, "composites": composites,
            "native_ms": round(best["native"] * 1e3, 2),
            "python_ms": round(best["python"] * 1e3, 2),
            "native_over_python": round(best["native"] / best["python"], 3),
            "saved_us_per_composite": round((best["python"] - best["native"]) * 1e6
                                            / max(composites, 1), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    for spec in args.models:
        print(json.dumps(measure(spec, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
