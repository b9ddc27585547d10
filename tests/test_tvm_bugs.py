"""Known bugs of TVM 0.27, found by ``patternkit fuzz`` and rule tests (docs/tvm-bugs.md).

Each test states what the pass should do and is a strict xfail: when a TVM release fixes
the bug the test passes, the xfail turns into a failure, and the entry can be retired.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

from patternkit.errors import BuildError
from patternkit.verification import numeric

_RNG = np.random.default_rng(0)
WEIGHT = (_RNG.standard_normal((4, 2, 3, 3)) * 0.3).astype("float32")  # OIHW
GAMMA, BETA, MEAN = (_RNG.uniform(-1, 1, 4).astype("float32") for _ in range(3))
VAR = _RNG.uniform(0.5, 1.5, 4).astype("float32")


@I.ir_module
class NhwcConvBatchNorm:
    """conv2d on NHWC data with an OIHW kernel, then an inference batch norm on the
    channel axis (3); the 4x4 output has 4 channels, so H equals C."""

    @R.function
    def main(x: R.Tensor((1, 6, 6, 2), "float32")) -> R.Tensor((1, 4, 4, 4), "float32"):
        with R.dataflow():
            y = R.nn.conv2d(x, R.const(WEIGHT), data_layout="NHWC", kernel_layout="OIHW")
            bn = R.nn.batch_norm(y, R.const(GAMMA), R.const(BETA), R.const(MEAN), R.const(VAR),
                                 axis=3, epsilon=1e-5, training=False)
            out = bn[0]
            R.output(out)
        return out


@pytest.mark.xfail(strict=True, reason="TVM 0.27 FoldBatchnormToConv2D assumes an NCHW "
                                       "output: with NHWC data it shifts along H")
def test_fold_batchnorm_to_conv2d_keeps_the_numbers_of_an_nhwc_conv():
    folded = relax.transform.FoldBatchnormToConv2D()(NhwcConvBatchNorm)
    comparison = numeric.compare(NhwcConvBatchNorm, folded, rtol=1e-5, atol=1e-5)
    assert comparison.ok, comparison


BIAS = _RNG.uniform(-1, 1, 32).astype("float16")


@I.ir_module
class Float16AttentionThenBias:
    """A float16 attention whose result meets a float16 bias."""

    @R.function
    def main(q: R.Tensor((2, 8, 2, 16), "float16")) -> R.Tensor((2, 8, 32), "float16"):
        with R.dataflow():
            att = R.nn.attention(q, q, q, scale=0.25)
            out = R.add(R.reshape(att, R.shape([2, 8, 32])), R.const(BIAS))
            R.output(out)
        return out


@pytest.mark.xfail(strict=True, reason="TVM 0.27 legalises a float16 R.nn.attention to a "
                                       "float32 result: the float16 add then fails to build")
def test_a_float16_attention_builds_and_computes_in_float16():
    vm = relax.VirtualMachine(relax.build(Float16AttentionThenBias, target="llvm"), tvm.cpu())
    q = tvm.runtime.tensor(_RNG.uniform(-1, 1, (2, 8, 2, 16)).astype("float16"))
    assert vm["main"](q).dtype == "float16"


_SERIALISE_A_MODULE = textwrap.dedent("""
    import pickle, tvm, tvm_ffi
    from tvm import relax
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.add(x, x)))
    mod = bb.get()
    assert tvm_ffi.structural_equal(tvm.ir.load_json(tvm.ir.save_json(mod)), mod)
    assert tvm_ffi.structural_equal(pickle.loads(pickle.dumps(mod)), mod)
""")


@pytest.mark.xfail(strict=True, reason="TVM 0.27's save_json, behind pickle, crashes the "
                                       "interpreter on a Relax expression (SIGSEGV)")
def test_a_module_round_trips_through_save_json_and_pickle():
    # In a child process: the crash is a segmentation fault, not an exception.
    child = subprocess.run([sys.executable, "-c", _SERIALISE_A_MODULE], capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]


@I.ir_module
class MatchCastInMain:
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            y = R.match_cast(x, R.Tensor((4,), "float32"))
            z = R.add(y, y)
            R.output(z)
        return z


@pytest.mark.xfail(strict=True, raises=TypeError,
                   reason="TVM 0.27 MergeCompositeFunctions casts every binding to a "
                          "VarBinding: 'Invalid type: relax.expr.MatchCast'")
def test_merge_composite_functions_accepts_a_match_cast():
    out = relax.transform.MergeCompositeFunctions()(MatchCastInMain)
    tvm.ir.assert_structural_equal(out, MatchCastInMain)


@I.ir_module
class CountCastFromATensor:
    """``m`` is defined by the ``match_cast`` and read by the ``arange`` after it."""

    @R.function
    def main(x: R.Tensor(("n",), "int64"), y: R.Tensor((1,), "int64")):
        m = T.int64()
        with R.dataflow():
            doubled = R.add(x, x)
            count = R.match_cast(R.tensor_to_shape(y), R.Shape([m]))
            total = R.sum(R.add(R.arange(0, m, 1, dtype="int64"), R.const(1, "int64")))
            out = R.add(doubled, total)
            R.output(out)
        return out


@pytest.mark.xfail(strict=True, reason="TVM 0.27 FuseOps emits the arange's group above "
                                       "the match_cast defining m: 'Var m is not defined'")
def test_fuse_ops_keeps_a_group_after_the_match_cast_defining_its_symbolic_variable():
    legalised = relax.transform.AnnotateTIROpPattern()(
        relax.transform.LegalizeOps()(CountCastFromATensor))
    assert relax.analysis.check_well_formed(legalised)
    assert relax.analysis.check_well_formed(relax.transform.FuseOps()(legalised))


def _positions_over_a_static_length():
    """``y = x + Range(0, Shape(x)[1], 1)`` with ``x: [batch, 8]``, as torch.onnx.export
    writes position ids for a dynamic batch."""
    from onnx import TensorProto, helper, numpy_helper

    def scalar(name, value):
        return helper.make_node("Constant", [], [name],
                                value=numpy_helper.from_array(np.array(value, np.int64)))

    nodes = [helper.make_node("Shape", ["x"], ["shape"]), scalar("one", 1), scalar("zero", 0),
             helper.make_node("Gather", ["shape", "one"], ["length"]),
             helper.make_node("Range", ["zero", "length", "one"], ["ids"]),
             helper.make_node("Cast", ["ids"], ["positions"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "positions"], ["y"])]
    graph = helper.make_graph(
        nodes, "positions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.xfail(strict=True, reason="TVM 0.27's ONNX Range takes the IntImm of a static "
                                       "dimension for a dynamic limit: the shape is lost")
def test_onnx_range_over_a_static_dimension_keeps_the_shape():
    pytest.importorskip("onnx")
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(_positions_over_a_static_length())
    assert mod["main"].ret_ty.shape is not None
    assert int(mod["main"].ret_ty.shape[1]) == 8


@I.ir_module
class FlattenedLoss:
    """A loss whose shapes compute with the symbolic batch (``R.shape([n * 4])``)."""

    @R.function
    def main(x: R.Tensor(("n", 4), "float32"), w: R.Tensor((4, 4), "float32")):
        n = T.int64()
        with R.dataflow():
            loss = R.sum(R.reshape(R.matmul(x, w), R.shape([n * 4])))
            R.output(loss)
        return loss


@pytest.mark.xfail(strict=True, raises=KeyError,
                   reason="TVM 0.27 Gradient: 'key is not in Map' on a function whose shapes "
                          "compute with a symbolic dimension")
def test_gradient_differentiates_a_function_with_a_symbolic_shape():
    out = relax.transform.Gradient("main", [FlattenedLoss["main"].params[1]])(
        FlattenedLoss)
    assert "main_adjoint" in [gv.name_hint for gv in out.get_global_vars()]


@pytest.mark.xfail(strict=True, raises=tvm.error.InternalError,
                   reason="TVM 0.27's torch importer gives the cumsum of a bool tensor a bool "
                          "result (torch: int64): llvm codegen then fails on a bool add")
def test_torch_cumsum_of_a_bool_tensor_imports_as_int64_and_builds():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class CountNotOne(torch.nn.Module):
        """``(x != 1).cumsum(-1)``, as transformers' ``find_packed_sequence_indices``
        reads position ids when no attention mask is given."""

        def forward(self, ids):
            return (ids != 1).cumsum(-1)

    ids = torch.tensor([[1, 5, 1, 7, 9, 1]])
    expected = CountNotOne()(ids).numpy()
    assert expected.dtype == np.int64  # torch sums bools (and every integer) in int64
    mod = from_exported_program(torch.export.export(CountNotOne(), (ids,)))
    [got] = numeric.run(mod, [ids.numpy()])
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)


@pytest.mark.xfail(strict=True, reason="TVM 0.27's torch importer keeps an integer tensor's "
                                       "dtype where torch's result is a float: ids * 0.5 "
                                       "imports as ids * 0")
def test_torch_integer_times_a_float_imports_as_a_float_product():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class Halves(torch.nn.Module):
        """``ids * 0.5`` and ``ids / 2`` of an int64 tensor: float32 in torch."""

        def forward(self, ids):
            return ids * 0.5, ids / 2

    ids = torch.tensor([[1, 5, 3]])
    mod = from_exported_program(torch.export.export(Halves(), (ids,)))
    for got, expected in zip(numeric.run(mod, [ids.numpy()]), Halves()(ids)):
        np.testing.assert_array_equal(got, expected.numpy())  # TVM: [[0, 0, 0]], [[0, 2, 1]]


@pytest.mark.xfail(strict=True, raises=Exception,
                   reason="TVM 0.27's LegalizeOps: a strided_slice of a symbolic shape refuses "
                          "a negative axis (Check failed: axis < src_tensor_dim)")
def test_legalize_strided_slice_of_a_symbolic_shape_takes_a_negative_axis():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 8), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.strided_slice(x, [-1], [1], [8]))
        bb.emit_func_output(out)
    values = np.arange(24, dtype="int64").reshape(3, 8)
    np.testing.assert_array_equal(numeric.run(bb.get(), [values]), values[:, 1:])


@pytest.mark.xfail(strict=True, raises=Exception,
                   reason="TVM 0.27's torch importer makes the 2 of int64 ids // 2 an int32 "
                          "constant: the import fails with a type error")
def test_torch_floor_division_of_int64_ids_by_a_scalar_imports():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class Halved(torch.nn.Module):
        def forward(self, ids):
            return torch.div(ids, 2, rounding_mode="floor")

    ids = torch.tensor([[1, 5, -3]])
    mod = from_exported_program(torch.export.export(Halved(), (ids,)))
    np.testing.assert_array_equal(numeric.run(mod, [ids.numpy()]), Halved()(ids).numpy())


@pytest.mark.xfail(strict=True, raises=Exception,
                   reason="TVM 0.27's torch importer clips an integer tensor at infinity where "
                          "torch's clamp leaves a bound out: the build fails")
def test_torch_integer_clamp_with_one_bound_builds():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class AtLeastOne(torch.nn.Module):
        def forward(self, lengths):
            return lengths.clamp(min=1)

    lengths = torch.tensor([[0, 5, -3]])
    mod = from_exported_program(torch.export.export(AtLeastOne(), (lengths,)))
    np.testing.assert_array_equal(numeric.run(mod, [lengths.numpy()]),
                                  AtLeastOne()(lengths).numpy())


@pytest.mark.xfail(strict=True, reason="TVM 0.27's torch importer keeps a negative index in "
                                       "R.take(mode='fast'): it reads outside the tensor")
def test_torch_negative_indices_read_the_numbers_torch_reads():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class SecondToLastAndLastRows(torch.nn.Module):
        """``x[..., [-2], :]`` (aten.index.Tensor), as Falcon's multi-query attention
        splits its key, and ``x[..., -1, :]`` (aten.select.int)."""

        def forward(self, x):
            return x[..., [-2], :], x[..., -1, :]

    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype("float32")
    module = SecondToLastAndLastRows()
    expected = [t.numpy() for t in module(torch.from_numpy(x))]
    mod = from_exported_program(torch.export.export(module, (torch.from_numpy(x),)))
    comparison = numeric.compare_outputs(expected, numeric.run(mod, [x]), rtol=1e-6, atol=1e-6)
    assert comparison.ok, comparison


@pytest.mark.xfail(strict=True, raises=tvm.error.InternalError,
                   reason="TVM 0.27's rms_norm over every axis of its input does not build "
                          "for llvm (Tensor dimension mismatch in read)")
def test_rms_norm_over_every_axis_builds():
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    w = relax.Var("w", relax.TensorType((4, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.rms_norm(x, w, axes=[-2, -1], epsilon=1e-6))
        bb.emit_func_output(out)
    inputs = [_RNG.standard_normal((4, 16)).astype("float32"),
              _RNG.uniform(0.5, 1.5, (4, 16)).astype("float32")]
    [got] = numeric.run(bb.get(), inputs)
    expected = inputs[0] / np.sqrt(np.mean(inputs[0] ** 2) + 1e-6) * inputs[1]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)



@pytest.mark.xfail(strict=True, raises=ValueError,
                   reason="TVM 0.27's ONNX importer takes pads computed from constants for "
                          "dynamic pads (Dynamic pads are not supported yet)")
def test_onnx_pads_computed_from_constants_import():
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    import io

    from tvm.relax.frontend.onnx import from_onnx

    class PaddedConv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return torch.nn.functional.pad(self.conv(x), (0, 1, 1, 2), value=0.5)

    torch.manual_seed(0)
    module = PaddedConv().eval()
    x = torch.randn(2, 3, 8, 8)
    buffer = io.BytesIO()
    torch.onnx.export(module, (x,), buffer, opset_version=17, dynamo=False)
    mod = from_onnx(onnx.load_from_string(buffer.getvalue()))
    [got] = numeric.run(mod, [x.numpy()])
    np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.xfail(strict=True, raises=tvm.error.DiagnosticError,
                   reason="TVM 0.27 prints a scalar -inf as R.const(\"-inf\", ...), which "
                          "its parser refuses (value has to be scalar or Tensor)")
def test_script_of_a_non_finite_scalar_parses_back():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.maximum(x, relax.const(-np.inf, "float32"))))
    mod = bb.get()
    again = tvm.script.from_source(mod.script())
    tvm.ir.assert_structural_equal(again, mod)


@pytest.mark.xfail(strict=True, raises=TypeError,
                   reason="TVM 0.27's torch importer converts a float16 linear with "
                          "out_dtype=float32, then adds the float16 bias: mixed dtypes")
def test_torch_float16_linear_imports_in_float16():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4).half().eval()
    x = torch.randn(2, 8).half()
    mod = from_exported_program(torch.export.export(linear, (x,)))
    [got] = numeric.run(mod, [x.numpy()])
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, linear(x).detach().numpy(), rtol=2e-3, atol=2e-3)


@pytest.mark.xfail(strict=True, reason="TVM 0.27's llvm legalisation of a float16 "
                   "batch_norm computes and returns float32")
def test_float16_batch_norm_returns_float16():
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((2, 4, 3, 3), "float16"))
    stats = [relax.const(rng.uniform(0.5, 1.5, 4).astype("float16")) for _ in range(4)]
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            norm = bb.emit(relax.op.nn.batch_norm(x, *stats, axis=1, training=False))
            out = bb.emit_output(relax.TupleGetItem(norm, 0))
        bb.emit_func_output(out)
    mod = bb.get()
    assert mod["main"].ret_ty.dtype == "float16"
    [got] = numeric.run(mod, [rng.standard_normal((2, 4, 3, 3)).astype("float16")])
    assert got.dtype == np.float16


@pytest.mark.xfail(strict=True, raises=tvm.error.InternalError,
                   reason="TVM 0.27's topi layer_norm takes float32 and float16 only")
def test_float64_layer_norm_builds():
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((2, 8), "float64"))
    gamma, beta = (relax.const(rng.standard_normal(8), "float64") for _ in range(2))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, gamma, beta, axes=[-1]))
        bb.emit_func_output(out)
    data = rng.standard_normal((2, 8))
    [got] = numeric.run(bb.get(), [data])
    centred = data - data.mean(axis=-1, keepdims=True)
    expected = centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, expected * gamma.data.numpy() + beta.data.numpy(),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="TVM 0.27's layer_norm legalisation adds beta and multiplies by gamma "
                          "whatever center= and scale= say")
@pytest.mark.parametrize("center, scale", [(False, True), (True, False)])
def test_layer_norm_without_center_or_scale_drops_beta_or_gamma(center, scale):
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    gamma = relax.const(rng.uniform(0.5, 1.5, 8).astype("float32"))
    beta = relax.const(rng.uniform(1.0, 2.0, 8).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, gamma, beta, axes=[-1],
                                                        center=center, scale=scale))
        bb.emit_func_output(out)
    data = rng.uniform(-1, 1, (2, 8)).astype("float32")
    [got] = numeric.run(bb.get(), [data])
    centred = data - data.mean(axis=-1, keepdims=True)
    normed = centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    expected = (normed * (gamma.value.numpy() if scale else 1.0)
                + (beta.value.numpy() if center else 0.0))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# -- found by benchmarks/fuzz_passes.py (programs grown from the operator catalogue) --------
@I.ir_module
class StackOfTwoVectors:
    """No convolution at all: ConvertLayout has nothing to convert."""

    @R.function
    def main(x: R.Tensor((8,), "float32"), y: R.Tensor((8,), "float32")
             ) -> R.Tensor((2, 8), "float32"):
        with R.dataflow():
            s = R.stack((x, y), axis=0)
            R.output(s)
        return s


@pytest.mark.xfail(strict=True, raises=IndexError,
                   reason="TVM 0.27 ConvertLayout raises 'Index -1 out of bounds 2' on any "
                          "R.stack, whatever the desired layouts")
@pytest.mark.parametrize("layouts", [["NHWC", "OHWI"], ["NCHW", "OIHW"]])
def test_convert_layout_leaves_a_stack_alone(layouts):
    out = relax.transform.ConvertLayout({"relax.nn.conv2d": layouts})(StackOfTwoVectors)
    tvm.ir.assert_structural_equal(out, StackOfTwoVectors)


BN_GAMMA, BN_BETA, BN_MEAN = (_RNG.uniform(-1, 1, 2).astype("float32") for _ in range(3))
BN_VAR = _RNG.uniform(0.5, 1.5, 2).astype("float32")


@I.ir_module
class InferenceBatchNorm:
    """An inference batch norm (``training=False``): moving statistics, no batch ones."""

    @R.function
    def main(x: R.Tensor((3, 2, 4), "float32")) -> R.Tensor((3, 2, 4), "float32"):
        with R.dataflow():
            bn = R.nn.batch_norm(x, R.const(BN_GAMMA), R.const(BN_BETA), R.const(BN_MEAN),
                                 R.const(BN_VAR), axis=1, training=False)
            out = bn[0]
            R.output(out)
        return out


@pytest.mark.xfail(strict=True, reason="TVM 0.27 DecomposeOpsForTraining normalises a "
                                       "training=False batch_norm with batch statistics")
def test_decompose_ops_for_training_keeps_an_inference_batch_norm():
    after = relax.transform.DecomposeOpsForTraining()(InferenceBatchNorm)
    comparison = numeric.compare(InferenceBatchNorm, after, rtol=1e-5, atol=1e-5)
    assert comparison.ok, comparison


@pytest.mark.xfail(strict=True, raises=AttributeError,
                   reason="TVM 0.27 legalises R.nn.pixel_shuffle to topi.nn.pixel_shuffle, "
                          "which it does not have")
def test_pixel_shuffle_builds_for_llvm():
    x = relax.Var("x", relax.TensorType((1, 4, 2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.pixel_shuffle(x, 2))
        bb.emit_func_output(out)
    data = _RNG.uniform(-1, 1, (1, 4, 2, 3)).astype("float32")
    [got] = numeric.run(bb.get(), [data])
    # depth to space: out[0, 0, 2h + i, 2w + j] = x[0, 2i + j, h, w]
    expected = data.reshape(1, 1, 2, 2, 2, 3).transpose(0, 1, 4, 2, 5, 3).reshape(1, 1, 4, 6)
    np.testing.assert_allclose(got, expected)


CPM_LHS = _RNG.uniform(-1, 1, (4, 6)).astype("float32")


@I.ir_module
class MatmulOfAConstant:
    """One matmul whose left operand is a constant: nothing to combine."""

    @R.function
    def main(w: R.Tensor((6, 3), "float32")) -> R.Tensor((4, 3), "float32"):
        with R.dataflow():
            y = R.matmul(R.const(CPM_LHS), w)
            R.output(y)
        return y


@pytest.mark.xfail(strict=True, raises=TypeError,
                   reason="TVM 0.27 CombineParallelMatmul takes every matmul's lhs for a Var: "
                          "'Cannot treat type ir.GenericConst as type ir.Var'")
def test_combine_parallel_matmul_accepts_a_constant_lhs():
    out = relax.transform.CombineParallelMatmul()(MatmulOfAConstant)
    tvm.ir.assert_structural_equal(out, MatmulOfAConstant)


CT_KERNEL = (_RNG.uniform(-1, 1, (4, 2, 1, 1)) * 0.5).astype("float32")  # OIHW
CT_WEIGHT = (_RNG.uniform(-1, 1, (4, 2, 3, 3)) * 0.3).astype("float32")  # IOHW


@I.ir_module
class ConvThenTransposedConv:
    """A conv2d feeding a conv2d_transpose, both NCHW."""

    @R.function
    def main(x: R.Tensor((2, 2, 4, 3), "float32")) -> R.Tensor((2, 2, 9, 7), "float32"):
        with R.dataflow():
            y = R.nn.conv2d(x, R.const(CT_KERNEL))
            z = R.nn.conv2d_transpose(y, R.const(CT_WEIGHT), strides=[2, 2])
            R.output(z)
        return z


@pytest.mark.xfail(strict=True, raises=BuildError,
                   reason="TVM 0.27 ConvertLayout carries NHWC into the conv2d_transpose, "
                          "which llvm cannot build in that layout")
def test_convert_layout_to_nhwc_keeps_a_transposed_conv_buildable():
    after = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(
        ConvThenTransposedConv)
    comparison = numeric.compare(ConvThenTransposedConv, after, rtol=1e-5, atol=1e-5)
    assert comparison.ok, comparison


# -- found by the engineers of issue 34 (patternkit run, attention, training) -------------
@I.ir_module
class ReluAroundAnExternCall:
    """Two relus around a ``call_pure_packed``, which passes an ``ExternFunc`` as an
    argument of ``call_pure_packed``."""

    @R.function
    def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
        with R.dataflow():
            r = R.nn.relu(x)
            p = R.call_pure_packed("my.probe", r, ty_args=R.Tensor((2, 4), "float32"))
            s = R.nn.relu(p)
            R.output(s)
        return s


@pytest.mark.xfail(strict=True, raises=tvm.error.InternalError,
                   reason="TVM 0.27 MergeCompositeFunctions: 'Do not have a default for "
                          "relax.expr.ExternFunc' on a call that passes an extern function")
def test_merge_composite_functions_passes_an_extern_call_through():
    from tvm.relax.dpl import is_op, wildcard

    fused = relax.transform.FuseOpsByPattern(
        [("cc.relu", is_op("relax.nn.relu")(wildcard()))])(ReluAroundAnExternCall)
    merged = relax.transform.MergeCompositeFunctions()(fused)
    assert relax.analysis.check_well_formed(merged)
    assert "my.probe" in merged["main"].script()


_ATTENTION_OF_AN_UNKNOWN_SHAPE = textwrap.dedent("""
    from tvm import relax
    q = relax.Var("q", relax.TensorType(dtype="float32", ndim=4))
    bb = relax.BlockBuilder()
    try:
        with bb.function("main", [q]):
            bb.emit_func_output(bb.emit(relax.op.nn.attention(q, q, q)))
    except Exception:  # a refusal is fine; killing the interpreter is not
        pass
""")


@pytest.mark.xfail(strict=True, reason="TVM 0.27 segfaults building R.nn.attention on a "
                                       "query whose shape is unknown (ndim=4 only)")
def test_attention_on_a_query_of_unknown_shape_does_not_crash():
    # In a child process: the crash is a segmentation fault, not an exception.
    child = subprocess.run([sys.executable, "-c", _ATTENTION_OF_AN_UNKNOWN_SHAPE],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]


@I.ir_module
class WindowedCausalAttention:
    """Self-attention, causal from the top left, each query seeing its 3 latest keys."""

    @R.function
    def main(q: R.Tensor((1, 6, 2, 4), "float32")) -> R.Tensor((1, 6, 2, 4), "float32"):
        with R.dataflow():
            a = R.nn.attention(q, q, q, causal_mask="TopLeft", window_size=3)
            R.output(a)
        return a


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="TVM 0.27 cannot legalise a windowed R.nn.attention for llvm "
                          "('sliding-window attention is not supported yet')")
def test_windowed_causal_attention_builds_for_llvm():
    data = _RNG.standard_normal((1, 6, 2, 4)).astype("float32")
    ex = relax.build(WindowedCausalAttention, target="llvm")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    q = data.transpose(0, 2, 1, 3)  # (batch, heads, seq, dim)
    scores = q @ q.transpose(0, 1, 3, 2) / np.sqrt(4)
    i, j = np.indices((6, 6))
    scores = np.where((j <= i) & (j >= i - 3 + 1), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(got, (weights @ q).transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-5)


@I.ir_module
class AdaptivePoolToChannelsLast:
    """``adaptive_avg_pool2d`` reading NCHW and writing NHWC."""

    @R.function
    def main(x: R.Tensor((1, 2, 4, 4), "float32")) -> R.Tensor((1, 2, 2, 2), "float32"):
        with R.dataflow():
            a = R.nn.adaptive_avg_pool2d(x, output_size=[2, 2], layout="NCHW",
                                         out_layout="NHWC")
            R.output(a)
        return a


@pytest.mark.xfail(strict=True, raises=tvm.error.InternalError,
                   reason="TVM 0.27 leaves an adaptive_avg_pool2d whose out_layout differs "
                          "from its layout unlegalised: llvm cannot build it")
def test_adaptive_avg_pool2d_to_another_layout_builds_for_llvm():
    data = _RNG.standard_normal((1, 2, 4, 4)).astype("float32")
    ex = relax.build(AdaptivePoolToChannelsLast, target="llvm")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    pooled = data.reshape(1, 2, 2, 2, 2, 2).mean(axis=(3, 5))  # NCHW, 2x2 windows
    np.testing.assert_allclose(got, pooled.transpose(0, 2, 3, 1), rtol=1e-6, atol=1e-6)


@pytest.mark.xfail(strict=True, raises=tvm.error.InternalError,
                   reason="TVM 0.27's llvm codegen has no float16 cosh, sinh, acos, asin, "
                          "atan, acosh or asinh ('unknown intrinsic')")
@pytest.mark.parametrize("name, reference", [
    ("cosh", np.cosh), ("sinh", np.sinh), ("acos", np.arccos), ("asin", np.arcsin),
    ("atan", np.arctan), ("acosh", np.arccosh), ("asinh", np.arcsinh)])
def test_float16_hyperbolic_and_inverse_trigonometric_ops_build_for_llvm(name, reference):
    x = relax.Var("x", relax.TensorType((6,), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(getattr(relax.op, name)(x))
        bb.emit_func_output(out)
    data = _RNG.uniform(0.1, 0.9, 6).astype("float16") + (1 if name == "acosh" else 0)
    [got] = numeric.run(bb.get(), [data])
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, reference(data.astype("float32")), rtol=2e-3, atol=2e-3)


@I.ir_module
class OuterProduct:
    """One ``R.outer`` of two float32 vectors."""

    @R.function
    def main(x: R.Tensor((2,), "float32"), y: R.Tensor((3,), "float32")
             ) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            o = R.outer(x, y)
            R.output(o)
        return o


@pytest.mark.xfail(strict=True, raises=tvm.error.InternalError,
                   reason="TVM 0.27 ToMixedPrecision has no mixed-precision policy for "
                          "R.outer: 'Check failed: (attr_map.count(op))'")
def test_to_mixed_precision_accepts_an_outer_product():
    after = relax.transform.ToMixedPrecision()(OuterProduct)
    comparison = numeric.compare(OuterProduct, after, rtol=2e-3, atol=2e-3)
    assert comparison.ok, comparison


def _shape_of_a_shapeless_sum():
    """``Shape(x + Range(0, Cast(Shape(x)[1])))[0]``: the sum's shape is lost in TVM."""
    from onnx import TensorProto, helper

    def constant(name, proto_type, value):
        return helper.make_node("Constant", [], [name],
                                value=helper.make_tensor(name, proto_type, [], [value]))

    nodes = [helper.make_node("Shape", ["x"], ["s"]), constant("i1", TensorProto.INT64, 1),
             helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             constant("zero", TensorProto.FLOAT, 0.0), constant("one", TensorProto.FLOAT, 1.0),
             helper.make_node("Range", ["zero", "nf", "one"], ["r"]),
             helper.make_node("Add", ["x", "r"], ["y"]),
             helper.make_node("Shape", ["y"], ["sy"]), constant("i0", TensorProto.INT64, 0),
             helper.make_node("Gather", ["sy", "i0"], ["out"], axis=0)]
    graph = helper.make_graph(
        nodes, "shape_of_a_shapeless_sum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("out", TensorProto.INT64, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.xfail(strict=True, raises=tvm.error.InternalError,
                   reason="TVM 0.27 from_onnx: Gather of the Shape of a tensor of unknown "
                          "shape calls shape_of on an R.Shape")
def test_onnx_gather_of_the_shape_of_a_shapeless_tensor_imports():
    onnx = pytest.importorskip("onnx")
    from tvm.relax.frontend.onnx import from_onnx

    model = _shape_of_a_shapeless_sum()
    onnx.checker.check_model(model, full_check=True)  # a valid graph: onnxruntime runs it
    mod = from_onnx(model)
    assert relax.analysis.check_well_formed(mod)


@pytest.mark.xfail(strict=True, reason="TVM 0.27 from_onnx: Expand to an initializer's shape "
                                       "emits call_packed(tensor_to_shape) in a pure main")
def test_onnx_expand_to_an_initializer_shape_is_well_formed():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"])], "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[numpy_helper.from_array(np.array([2, 3], "int64"), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    mod = from_onnx(model, keep_params_in_input=True)
    assert relax.analysis.check_well_formed(mod)


@pytest.mark.xfail(strict=True, raises=tvm.error.InternalError,
                   reason="TVM 0.27 tirx pow: 'power only applies to float' on bfloat16")
def test_power_of_a_bfloat16_tensor_builds():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "bfloat16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.power(x, relax.const(2.0, "bfloat16")))
        bb.emit_func_output(out)
    data = np.array([0.5, 1.5, -2.0, 3.0], "float32")
    [got] = numeric.run(bb.get(), [data])
    np.testing.assert_allclose(np.asarray(got, "float32"), data ** 2, rtol=1e-2)


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="TVM 0.27's torch importer has no converter of aten.amax / amin")
def test_torch_amax_imports():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class SoftmaxWrittenOut(torch.nn.Module):
        def forward(self, x):
            e = torch.exp(x - x.amax(-1, keepdim=True))
            return e / e.sum(-1, keepdim=True)

    x = torch.randn(2, 8)
    mod = from_exported_program(torch.export.export(SoftmaxWrittenOut(), (x,)))
    [got] = numeric.run(mod, [x.numpy()])
    np.testing.assert_allclose(got, torch.softmax(x, -1).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.xfail(strict=True, raises=TypeError,
                   reason="TVM 0.27's torch importer converts aten.repeat to R.tile, which "
                          "takes integer repeats only: a symbolic count is refused")
def test_torch_instance_norm_of_a_dynamic_batch_imports():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    norm = torch.nn.InstanceNorm2d(4, affine=True).eval()
    x = torch.randn(2, 4, 8, 8)
    program = torch.export.export(norm, (x,), dynamic_shapes={"input": {0: torch.export.Dim("n")}})
    mod = from_exported_program(program)
    [got] = numeric.run(mod, [x.numpy()])
    np.testing.assert_allclose(got, norm(x).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.xfail(strict=True, raises=ValueError,
                   reason="TVM 0.27's torch importer compares a view's symbolic extents with "
                          "== to skip an identity reshape, which raises")
def test_torch_view_to_a_symbolic_shape_imports():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class Regroup(torch.nn.Module):
        def forward(self, x):
            n = x.shape[0]
            return (x.reshape(1, n * 4, 8) * 2).reshape(n, 4, 8)

    x = torch.randn(2, 4, 8)
    program = torch.export.export(Regroup(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("n")}})
    mod = from_exported_program(program)
    [got] = numeric.run(mod, [x.numpy()])
    np.testing.assert_allclose(got, 2 * x.numpy(), rtol=0, atol=0)


@pytest.mark.xfail(strict=True, raises=TypeError,
                   reason="TVM 0.27's torch importer converts a float16 conv_transpose2d with "
                          "out_dtype=float32, then adds the float16 bias: mixed dtypes")
def test_torch_float16_conv_transpose_imports_in_float16():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    conv = torch.nn.ConvTranspose2d(4, 4, 3, padding=1).half().eval()
    x = torch.randn(1, 4, 5, 5).half()
    mod = from_exported_program(torch.export.export(conv, (x,)))
    [got] = numeric.run(mod, [x.numpy()])
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, conv(x).detach().numpy(), rtol=1e-2, atol=1e-2)


@pytest.mark.xfail(strict=True, raises=TypeError,
                   reason="TVM 0.27's R.nn.group_norm refuses bfloat16 data")
def test_torch_bfloat16_group_norm_imports():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    norm = torch.nn.GroupNorm(2, 4).to(torch.bfloat16).eval()
    x = torch.randn(2, 4, 3, 3).to(torch.bfloat16)
    mod = from_exported_program(torch.export.export(norm, (x,)))
    assert relax.analysis.check_well_formed(mod)


@pytest.mark.xfail(strict=True, raises=tvm.error.InternalError,
                   reason="TVM 0.27 topi layer_norm: only float32 and float16")
def test_bfloat16_layer_norm_builds():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "bfloat16"))
    gamma = relax.const(np.ones(8, "float32"), "bfloat16")
    beta = relax.const(np.zeros(8, "float32"), "bfloat16")
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, gamma, beta, axes=[-1]))
        bb.emit_func_output(out)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    data = np.linspace(-2, 2, 16, dtype="float32").reshape(2, 8)
    [got] = numeric.run(bb.get(), [data.astype(ml_dtypes.bfloat16)])
    mean, var = data.mean(-1, keepdims=True), data.var(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(got, "float32"), (data - mean) / np.sqrt(var + 1e-5),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.xfail(strict=True, raises=AttributeError,
                   reason="TVM 0.27 from_onnx: Expand to a constant shape reads dim.value of "
                          "every input dimension, and a symbolic one has none")
def test_onnx_expand_of_a_symbolic_shape_to_a_constant_one_imports():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    shape = numpy_helper.from_array(np.array([1, 2], "int64"))
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["shape"], value=shape),
         helper.make_node("Expand", ["x", "shape"], ["y"])], "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    mod = from_onnx(model)
    n = mod["main"].params[0].ty.shape[0]
    assert relax.analysis.check_well_formed(mod)
    assert mod["main"].ret_ty.shape[0].same_as(n) and int(mod["main"].ret_ty.shape[1]) == 2
