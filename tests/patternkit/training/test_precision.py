"""as_float64: a function recomputed in float64 (the finite-difference reference)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from patternkit.ir import is_tensor_constant, type_of
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


def _bfloat16_block() -> relax.Function:
    """A Qwen3-like block in bfloat16: a matmul on a constant weight, an RMS norm
    computed in float32 between casts, a layer norm with bfloat16 constants, a filled
    constant, SiLU."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((2, 8), "bfloat16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(
                rng.uniform(-1, 1, (8, 8)).astype(ml_dtypes.bfloat16))))
            up = bb.emit(relax.op.astype(y, "float32"))
            normed = bb.emit(relax.op.nn.rms_norm(up, relax.const(np.ones(8, "float32")),
                                                  axes=[-1]))
            down = bb.emit(relax.op.astype(normed, "bfloat16"))
            gamma = relax.const(rng.uniform(0.5, 1.5, 8).astype(ml_dtypes.bfloat16))
            beta = relax.const(rng.uniform(-1, 1, 8).astype(ml_dtypes.bfloat16))
            z = bb.emit(relax.op.nn.layer_norm(down, gamma, beta, axes=[-1]))
            shifted = bb.emit(relax.op.add(z, relax.op.full(
                (2, 8), relax.const(1.5, "bfloat16"), "bfloat16")))
            out = bb.emit_output(relax.op.nn.silu(shifted))
        bb.emit_func_output(out)
    return bb.get()["main"]


def _dtypes(func: relax.Function) -> set[str]:
    found: set[str] = set()

    def visit(expr):
        ty = type_of(expr) if isinstance(expr, relax.Var) or is_tensor_constant(expr) else None
        if isinstance(ty, relax.TensorType):
            found.add(str(ty.dtype))
        for name in ("dtype", "out_dtype"):
            value = getattr(getattr(expr, "attrs", None), name, None)
            if value is not None and str(value):
                found.add(str(value))

    relax.analysis.post_order_visit(func, visit)
    return found


def test_a_bfloat16_model_is_float64_everywhere_constants_and_casts_included():
    func = as_float64(_bfloat16_block())
    assert not {"bfloat16", "float16", "float32"} & _dtypes(func), func
    x = np.random.default_rng(1).uniform(-1, 1, (2, 8))
    got = build(tvm.IRModule({"main": func}))["main"](to_tensor(x)).numpy()
    assert got.dtype == np.float64 and np.all(np.isfinite(got))


def _norm_model(norm: str) -> tuple[relax.Function, list[np.ndarray]]:
    """One layer, instance or group norm in float32 (not the last axes only, for the
    layer norm), and inputs for it."""
    shapes = {"layer_norm": [(2, 3, 4), (3,), (3,)],
              "instance_norm": [(2, 4, 3, 3), (4,), (4,)],
              "group_norm": [(2, 3, 3, 4), (4,), (4,)]}[norm]
    params = [relax.Var(name, relax.TensorType(shape, "float32"))
              for name, shape in zip(("x", "gamma", "beta"), shapes)]
    make = {"layer_norm": lambda x, g, b: relax.op.nn.layer_norm(x, g, b, axes=[1],
                                                                  epsilon=1e-3),
            "instance_norm": lambda x, g, b: relax.op.nn.instance_norm(
                x, g, b, channel_axis=1, axes=[2, 3]),
            "group_norm": lambda x, g, b: relax.op.nn.group_norm(  # channels last
                x, g, b, num_groups=2, channel_axis=-1, axes=[1, 2])}[norm]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make(*params))
        bb.emit_func_output(out)
    rng = np.random.default_rng(2)
    return bb.get()["main"], [rng.uniform(-1, 1, s).astype("float32") for s in shapes]


@pytest.mark.parametrize("norm", ["layer_norm", "instance_norm", "group_norm"])
def test_norms_without_a_float64_kernel_are_written_out_and_match_the_kernel(norm):
    # TOPI's layer/group/instance norms take float32 and float16 only (docs/tvm-bugs.md)
    func, inputs = _norm_model(norm)
    kernel = build(tvm.IRModule({"main": func}))["main"](*map(to_tensor, inputs)).numpy()
    wide = as_float64(func)
    assert f"relax.nn.{norm}" not in wide.script()
    got = build(tvm.IRModule({"main": wide}))["main"](
        *[to_tensor(a.astype(np.float64)) for a in inputs]).numpy()
    np.testing.assert_allclose(got, kernel, rtol=1e-5, atol=1e-5)
