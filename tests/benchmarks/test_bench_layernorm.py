"""benchmarks/bench_layernorm.py: both sides time the same chain, and each checks its work.

The speed-up it reports is a ratio of two times measured in one run, so the two graphs
must be the same computation: N written-out layer norms of one shape, each feeding the
next, which each side's fusion collapses into N fused ops.
"""

from __future__ import annotations

import pytest


def test_the_relax_chain_is_collapsed_into_one_layer_norm_a_norm(bench_layernorm):
    row = bench_layernorm.measure(5, 1)
    assert row["bindings"] == 5 * bench_layernorm.BINDINGS_PER_NORM
    assert row["collapsed"] == 5


def test_the_onnx_chain_computes_what_the_relax_chain_computes(bench_layernorm):
    pytest.importorskip("onnx")
    import numpy as np
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    from patternkit.verification.numeric import build as build_for_checks

    proto = bench_layernorm.onnx_layernorm_chain(3)
    assert [node.op_type for node in proto.graph.node][:bench_layernorm.BINDINGS_PER_NORM] == [
        "ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"]
    assert len(proto.graph.node) == 3 * bench_layernorm.BINDINGS_PER_NORM
    x = np.random.default_rng(1).standard_normal(bench_layernorm.X_SHAPE).astype("float32")

    def run(mod):
        vm = build_for_checks(mod)
        return vm["main"](tvm.runtime.tensor(x)).numpy()

    expected = run(bench_layernorm.layernorm_chain(3))
    np.testing.assert_allclose(run(from_onnx(proto, keep_params_in_input=False)), expected,
                               rtol=1e-6, atol=1e-6)


def test_onnxscript_fuses_every_norm_of_the_onnx_chain(bench_layernorm):
    pytest.importorskip("onnxscript")
    row = bench_layernorm.measure_anchor(3)  # exits unless all 3 became LayerNormalization
    assert row["nodes"] == 3 * bench_layernorm.BINDINGS_PER_NORM and row["norms"] == 3
