"""verify_table: every entry of a TVM table that fires on a model keeps its numbers on llvm."""

from __future__ import annotations

import numpy as np
from tvm import relax

import patternkit as pk


def _conv_relu_dense():
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((4, 3, 3, 3)).astype("float32"))
            c = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
            flat = bb.emit(relax.op.reshape(c, (1, 256)))
            d = relax.const(rng.standard_normal((256, 10)).astype("float32"))
            out = bb.emit_output(relax.op.add(relax.op.matmul(flat, d), relax.const(
                rng.standard_normal((10,)).astype("float32"))))
        bb.emit_func_output(out)
    return bb.get()


def test_each_entry_that_fires_is_partitioned_alone_and_keeps_the_numbers():
    mod = _conv_relu_dense()
    report = pk.byoc.verify_table(pk.PatternTable.from_tvm("example_npu"), mod)
    assert report.ok and report.failures == []
    assert set(report.fired) >= {"example_npu.conv2d_relu_fused", "example_npu.matmul"}
    assert all(n >= 1 for n in report.fired.values())
    assert all(report.errors[name] <= 1e-5 for name in report.fired)
    assert "entries fired, 0 changed the numbers" in str(report)


def test_entries_that_do_not_fire_are_not_reported():
    # no hipblas entry fires on this model
    report = pk.byoc.verify_table(pk.PatternTable.from_tvm("hipblas"), _conv_relu_dense())
    assert report.fired == {} and report.ok
