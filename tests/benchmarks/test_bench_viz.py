"""benchmarks/bench_viz.py --job: the job's diff is redrawn with the job's own rewrite log."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from tvm import relax

from patternkit.app.job import run
from patternkit.app.loading import load_model

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_viz.py"


def _silu_chain():
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(3):  # x * sigmoid(x): silu.collapse's form
                y = bb.emit(relax.op.matmul(h, relax.const(np.eye(4, dtype="float32"))))
                h = bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))))
            out = bb.emit_output(relax.op.sum(h))
        bb.emit_func_output(out)
    return bb.get()


def test_the_job_folder_gives_back_the_jobs_rewrite_log(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_viz", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench_viz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_viz)
    report = run(_silu_chain(), out_dir=tmp_path / "job", draw=False)
    before, _ = load_model(str(tmp_path / "job" / "before.py"))
    log = bench_viz._rewrite_log(tmp_path / "job", before)
    assert log.counts() == report.rewrites == {"silu.collapse": 3}
