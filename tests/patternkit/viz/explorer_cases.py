"""Models and a deliberately wrong rule shared by the Model Explorer tests."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

import patternkit as pk
from patternkit.dpl import is_op, wildcard

COMPILER = "ccompiler"


def conv_layers(count: int, stem: bool = False) -> tvm.IRModule:
    """[a stem tanh,] ``count`` x (conv2d, batch_norm, relu), then a mean: the library
    folds each batch norm into its conv and offloads conv + add + relu; the mean stays
    on the host."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    bb = relax.BlockBuilder()

    def const(*shape, positive=False):
        values = rng.standard_normal(shape).astype("float32")
        return relax.const(np.abs(values) + 0.5 if positive else values)

    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.tanh(x)) if stem else x
            for _ in range(count):
                c = bb.emit(relax.op.nn.conv2d(h, const(4, 4, 3, 3), padding=1))
                bn = bb.emit(relax.op.nn.batch_norm(c, const(4, positive=True), const(4),
                                                    const(4), const(4, positive=True), axis=1,
                                                    training=False))
                h = bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0))))
            out = bb.emit_output(relax.op.mean(h, axis=[2, 3]))
        bb.emit_func_output(out)
    return bb.get()


class TanhIsRelu(pk.DFPatternCallback):
    """Deliberately wrong: ``tanh(x) -> relu(x)``."""

    name = "test.tanh_is_relu"

    def __init__(self):
        super().__init__()
        self.x = wildcard()
        self.pattern = is_op("relax.tanh")(self.x)

    def callback(self, pre, post, node_map):
        return relax.op.nn.relu(node_map[self.x][0])


def tanh_model() -> tvm.IRModule:
    """relu, tanh, add: the wrong rule fires on the tanh."""
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(x))
            t = bb.emit(relax.op.tanh(r))
            out = bb.emit_output(relax.op.add(t, r))
        bb.emit_func_output(out)
    return bb.get()
