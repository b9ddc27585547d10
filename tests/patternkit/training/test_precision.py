"""as_float64: a function recomputed in float64 (the finite-difference reference)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from patternkit.ir.compat import to_tensor
from patternkit.training.precision import as_float64
from patternkit.verification.numeric import build


def _conv_matmul(out_dtype: str) -> relax.Function:
    """conv2d then matmul, both with ``out_dtype`` set, as the torch importer writes them."""
    x = relax.Var("x", relax.TensorType((1, 2, 5, 5), "float32"))
    w = relax.Var("w", relax.TensorType((3, 2, 3, 3), "float32"))
    m = relax.Var("m", relax.TensorType((5, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, m]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, padding=1, out_dtype=out_dtype))
            out = bb.emit_output(relax.op.matmul(conv, m, out_dtype=out_dtype))
        bb.emit_func_output(out)
    return bb.get()["main"]


def test_a_conv2d_and_a_matmul_with_a_float32_out_dtype_accumulate_in_float64():
    func = as_float64(_conv_matmul("float32"))
    assert [str(p.ty.dtype) for p in func.params] == ["float64"] * 3
    rng = np.random.default_rng(0)
    x, w, m = (rng.standard_normal(tuple(int(d) for d in p.ty.shape)) for p in func.params)
    got = build(tvm.IRModule({"main": func}))["main"](*map(to_tensor, (x, w, m))).numpy()
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((1, 3, 5, 5))
    for i in range(5):
        for j in range(5):
            conv[0, :, i, j] = np.einsum("ckl,ockl->o", padded[0, :, i:i + 3, j:j + 3], w)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, conv @ m, rtol=1e-12, atol=1e-12)


def test_a_symbolic_variable_passed_as_a_value_stays_as_it_is():
    # R.arange(0, n) in every model exported with a dynamic batch: n is not a tensor
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n,), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            pos = bb.emit(relax.op.arange(0, n, 1, dtype="float16"))
            out = bb.emit_output(relax.op.add(x, pos))
        bb.emit_func_output(out)
    func = as_float64(bb.get()["main"])
    x = np.linspace(-1, 1, 5)
    got = build(tvm.IRModule({"main": func}))["main"](to_tensor(x)).numpy()
    np.testing.assert_array_equal(got, x + np.arange(5))
