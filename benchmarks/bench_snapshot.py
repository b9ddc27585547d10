"""Native vs pure-Python :func:`patternkit.ir.snapshot.snapshot` on long chains.

Run ``python benchmarks/bench_snapshot.py`` (``--bindings 24000 144000``, ``--repeat 3``).

The workload is ``bench_layernorm.py``'s chain of written-out layer norms (9 bindings a
norm, each with its constants), cut to about the asked number of bindings.  Both readers
run on the same function in the same process, one after the other, ``--repeat`` times
each with the garbage collector off; the best CPU time of each (``time.process_time``,
as in ``bench_layernorm.py``: the machine is shared) is kept, the two snapshots are
checked to be equal, and the ratio is printed side by side.  The native reader's
one-off build (cached by tvm-ffi after the first run on a machine) is timed apart and
not counted.  One JSON line per size, then a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_layernorm import BINDINGS_PER_NORM, layernorm_chain  # noqa: E402


def _best(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            start = time.process_time()
            result = fn()
            best = min(best, time.process_time() - start)
        finally:
            gc.enable()
    return best, result


def measure(bindings: int, repeat: int) -> dict:
    """Time both readers on a chain of about ``bindings`` bindings."""
    from patternkit.ir.snapshot import snapshot

    mod = layernorm_chain(max(1, bindings // BINDINGS_PER_NORM))
    func = mod["main"]
    native_s, native_snap = _best(lambda: snapshot(func, native_reader=True), repeat)
    python_s, python_snap = _best(lambda: snapshot(func, native_reader=False), repeat)
    if native_snap != python_snap:
        raise SystemExit(f"the readers disagree at {bindings} bindings")
    n = len(native_snap)  # type: ignore[arg-type]
    return {"bindings": n, "native_ms": round(native_s * 1e3, 1),
            "python_ms": round(python_s * 1e3, 1),
            "native_us_per_binding": round(native_s * 1e6 / n, 3),
            "python_us_per_binding": round(python_s * 1e6 / n, 3),
            "speedup": round(python_s / native_s, 1)}


def main() -> None:
    """Parse the arguments, build the native reader, time each size, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=int, nargs="+", default=[24000, 144000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from patternkit.ir.snapshot import native

    start = time.perf_counter()
    if native.walker() is None:
        raise SystemExit("the native reader could not be built here (g++ and ninja needed)")
    print(json.dumps({"native_build_or_cache_load_s": round(time.perf_counter() - start, 2)}))
    rows = []
    for bindings in args.bindings:
        row = measure(bindings, args.repeat)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"{'bindings':>9} {'native ms':>10} {'python ms':>10} {'native us/b':>12} "
          f"{'python us/b':>12} {'speed-up':>9}")
    for r in rows:
        print(f"{r['bindings']:>9} {r['native_ms']:>10} {r['python_ms']:>10} "
              f"{r['native_us_per_binding']:>12} {r['python_us_per_binding']:>12} "
              f"{r['speedup']:>8}x")


if __name__ == "__main__":
    main()
