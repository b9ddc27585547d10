"""Built-in models, written directly in Relax with seeded random weights.

``patternkit run`` needs a model that exercises the pattern library on a fresh machine
without torch, downloads or data files.  :func:`resnet18` is ResNet-18's topology (7x7/2
stem, max-pool, four stages of two basic blocks with projection shortcuts, global
average pool, linear head) at a reduced width and input size, so that building it for
``llvm`` takes seconds on two cores.

Batch norms are emitted either as ``R.nn.batch_norm(..., training=False)`` or, with
``batchnorm="elementwise"`` (the default for the main job), spelled out the way some
exporters and hand-written graphs do (``gamma * (x - mean) / sqrt(var + eps) + beta``),
so the library's ``batchnorm.collapse`` rule has real work to do.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.op import nn

from ..ir import from_expr

BATCHNORM_STYLES = ("op", "elementwise")


class _Builder:
    def __init__(self, bb: relax.BlockBuilder, rng: np.random.Generator, batchnorm: str):
        self.bb = bb
        self.rng = rng
        self.batchnorm = batchnorm

    def const(self, shape, scale=1.0, positive=False):
        if positive:
            data = self.rng.uniform(0.5, 1.5, size=shape)
        else:
            data = self.rng.standard_normal(size=shape) * scale
        return relax.const(data.astype("float32"))

    def conv(self, x, out_channels, kernel, stride=1, padding=0):
        in_channels = int(x.ty.shape[1])
        fan_in = in_channels * kernel * kernel
        weight = self.const((out_channels, in_channels, kernel, kernel),
                            scale=(2.0 / fan_in) ** 0.5)
        return self.bb.emit(nn.conv2d(x, weight, strides=stride, padding=padding))

    def batch_norm(self, x):
        channels = int(x.ty.shape[1])
        gamma, beta = self.const((channels,), positive=True), self.const((channels,), scale=0.1)
        mean, var = self.const((channels,), scale=0.1), self.const((channels,), positive=True)
        if self.batchnorm == "op":
            bn = self.bb.emit(nn.batch_norm(x, gamma, beta, mean, var, axis=1, training=False))
            return self.bb.emit(relax.TupleGetItem(bn, 0))
        shape = (channels, 1, 1)
        g, b, m, v = (relax.const(c.value.numpy().reshape(shape)) for c in (gamma, beta, mean, var))
        eps = relax.const(1e-5, "float32")
        return self.bb.emit(g * (x - m) / relax.op.sqrt(v + eps) + b)

    def conv_bn(self, x, out_channels, kernel, stride=1, padding=0, relu=True):
        y = self.batch_norm(self.conv(x, out_channels, kernel, stride, padding))
        return self.bb.emit(nn.relu(y)) if relu else y

    def basic_block(self, x, out_channels, stride):
        in_channels = int(x.ty.shape[1])
        y = self.conv_bn(x, out_channels, 3, stride, 1)
        y = self.conv_bn(y, out_channels, 3, 1, 1, relu=False)
        if stride != 1 or in_channels != out_channels:
            x = self.conv_bn(x, out_channels, 1, stride, 0, relu=False)
        return self.bb.emit(nn.relu(relax.op.add(y, x)))


def resnet18(width: int = 8, image: int = 32, num_classes: int = 10, seed: int = 0,
             batchnorm: str = "elementwise") -> tvm.IRModule:
    """ResNet-18 topology in Relax: ``main(x: (1, 3, image, image)) -> (1, num_classes)``.

    Parameters
    ----------
    width : int
        Channels of the first stage (64 in the real network); stages use 1x, 2x, 4x, 8x.
    batchnorm : {"op", "elementwise"}
        How batch norms are written (see the module docstring).
    """
    if batchnorm not in BATCHNORM_STYLES:
        raise ValueError(f"batchnorm must be one of {BATCHNORM_STYLES}, got {batchnorm!r}")
    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((1, 3, image, image), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            b = _Builder(bb, rng, batchnorm)
            y = b.conv_bn(x, width, 7, stride=2, padding=3)
            y = bb.emit(nn.max_pool2d(y, pool_size=3, strides=2, padding=1))
            for stage, mult in enumerate((1, 2, 4, 8)):
                for block in range(2):
                    stride = 2 if stage > 0 and block == 0 else 1
                    y = b.basic_block(y, width * mult, stride)
            y = bb.emit(relax.op.mean(y, axis=[2, 3]))
            weight = b.const((width * 8, num_classes), scale=(1.0 / (width * 8)) ** 0.5)
            y = bb.emit(relax.op.add(relax.op.matmul(y, weight), b.const((num_classes,), 0.1)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def seed_batchnorm(double: bool = True) -> tvm.IRModule:
    """The seed notes' example: one or two chained elementwise batch norms."""
    x = relax.Var("x", relax.TensorType((2, 3, 8, 8), "float32"))
    gamma, beta, mean, var = (relax.Var(n, relax.TensorType((3, 1, 1), "float32"))
                              for n in ("gamma", "beta", "mean", "var"))
    eps = relax.const(1e-5, "float32")

    def bn(inp):
        return gamma * (inp - mean) / relax.op.sqrt(var + eps) + beta

    return from_expr(bn(bn(x)) if double else bn(x))


#: Models ``patternkit run`` can load by name.
BUILTIN_MODELS = {
    "resnet18": resnet18,
    "seed-batchnorm": seed_batchnorm,
}
