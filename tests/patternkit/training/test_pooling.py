"""adaptive_avg_pool2d: a conv net with a ResNet-style head differentiates, or is told why not."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.errors import GradientError
from patternkit.training import GradientReport, check_gradients, gradient
from patternkit.training.pooling import AdaptiveAvgPoolExpand

SPATIAL = {"NCHW": (2, 3, 8, 12), "NHWC": (2, 8, 12, 3)}


def pool(layout: str, output_size, out_layout: str | None = None, shape=None) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType(shape or SPATIAL[layout], "float32"))
    return pk.from_expr(relax.op.nn.adaptive_avg_pool2d(x, output_size, layout=layout,
                                                        out_layout=out_layout))


def op_names(mod: tvm.IRModule) -> list[str]:
    return [b.value.op.name for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("output_size, written_as", [
    ((1, 1), "relax.mean"), (1, "relax.mean"), ((2, 3), "relax.nn.avg_pool2d"),
    ((4, 4), "relax.nn.avg_pool2d"), ((8, 12), "relax.nn.avg_pool2d"),
    (None, "relax.nn.avg_pool2d")])
def test_a_pool_whose_output_divides_its_input_is_written_out_with_the_same_numbers(
        layout, output_size, written_as):
    fused = pool(layout, output_size, out_layout=layout)
    before = fused.script()
    log = pk.RewriteLog()
    expanded = pk.rewrite([AdaptiveAvgPoolExpand()], fused, log=log)
    assert fused.script() == before
    assert log.count("training.adaptive_avg_pool2d") == 1
    assert "relax.nn.adaptive_avg_pool2d" not in op_names(expanded)
    assert written_as in op_names(expanded)
    assert relax.analysis.check_well_formed(expanded)
    pk.assert_same_numerics(fused, expanded, rtol=1e-6, atol=1e-6)


def test_a_global_pool_of_a_symbolic_image_is_a_mean():
    n, h, w = (tvm.tirx.Var(name, "int64") for name in ("n", "h", "w"))
    fused = pool("NCHW", (1, 1), shape=(n, 3, h, w))
    expanded = pk.rewrite([AdaptiveAvgPoolExpand()], fused)
    assert op_names(expanded) == ["relax.mean"]
    pk.assert_same_numerics(fused, expanded, rtol=1e-6, atol=1e-6,
                            shape_vars={"n": 2, "h": 5, "w": 7})


@pytest.mark.parametrize("shape, options, reason", [
    (SPATIAL["NCHW"], {"output_size": (3, 5)},
     "the output size 3x5 does not divide the input's 8x12"),
    ((2, 1, 8, 12, 16), {"output_size": (2, 2), "layout": "NCHW16c"}, "layout NCHW16c"),
    (SPATIAL["NCHW"], {"output_size": (2, 2), "out_layout": "NHWC"},
     "out_layout NHWC differs from layout NCHW"),
], ids=["not_dividing", "packed_layout", "other_out_layout"])
def test_a_pool_no_avg_pool2d_computes_is_refused_by_gradient_naming_the_binding(
        shape, options, reason):
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    mod = pk.from_expr(relax.op.sum(relax.op.nn.adaptive_avg_pool2d(x, **options)))
    before = mod.script()
    with pytest.raises(GradientError) as caught:
        gradient(mod)
    message = str(caught.value)
    assert "\n" not in message
    assert "relax.nn.adaptive_avg_pool2d (1x, e.g. main: " in message
    assert f"training.adaptive_avg_pool2d refused: {reason}" in message
    assert mod.script() == before


def conv_net(layout: str, output_size) -> tuple[tvm.IRModule, list[np.ndarray]]:
    """conv2d -> relu -> adaptive_avg_pool2d -> flatten -> matmul -> sum, as torch would
    run it; the weights drawn with variance 1/fan_in.  NHWC: a per-channel scale instead
    of the convolution (TVM 0.27's conv2d gradient is for NCHW only)."""
    rng = np.random.default_rng(7)
    nchw = layout == "NCHW"
    image = (2, 3, 8, 8) if nchw else (2, 8, 8, 3)
    kernel = (4, 3, 3, 3) if nchw else (3,)
    pooled = (4 if nchw else 3) * int(np.prod(output_size))
    x = relax.Var("x", relax.TensorType(image, "float32"))
    w = relax.Var("w", relax.TensorType(kernel, "float32"))
    fc = relax.Var("fc", relax.TensorType((pooled, 5), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, fc]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.relu(
                relax.op.nn.conv2d(x, w, padding=1) if nchw else relax.op.multiply(x, w)))
            p = bb.emit(relax.op.nn.adaptive_avg_pool2d(c, output_size, layout=layout))
            if not nchw:  # flatten in torch's (C, H, W) order
                p = bb.emit(relax.op.permute_dims(p, [0, 3, 1, 2]))
            flat = bb.emit(relax.op.reshape(p, (2, pooled)))
            loss = bb.emit_output(relax.op.sum(relax.op.matmul(flat, fc)))
        bb.emit_func_output(loss)
    inputs = [rng.standard_normal(image).astype("float32"),
              (rng.standard_normal(kernel) / np.sqrt(27)).astype("float32"),
              (rng.standard_normal((pooled, 5)) / np.sqrt(pooled)).astype("float32")]
    return bb.get(), inputs


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("output_size", [(1, 1), (2, 2)])
def test_a_conv_net_ending_in_adaptive_pooling_differentiates_as_torch_does(layout, output_size):
    import torch

    mod, inputs = conv_net(layout, output_size)
    report = GradientReport()
    grads = gradient(mod, report=report)
    assert report.expanded == {"relax.nn.adaptive_avg_pool2d": 1}

    def torch_loss(x, w, fc):
        if layout == "NHWC":
            c = torch.relu(x * w).permute(0, 3, 1, 2)
        else:
            c = torch.relu(torch.nn.functional.conv2d(x, w, padding=1))
        p = torch.nn.functional.adaptive_avg_pool2d(c, output_size)
        return (p.reshape(2, -1) @ fc).sum()

    by_torch = check_gradients(mod, grads, inputs=inputs, reference="torch", torch_fn=torch_loss)
    assert by_torch.ok, by_torch
    by_finite_differences = check_gradients(mod, grads, inputs=inputs)
    assert by_finite_differences.ok, by_finite_differences
