"""A quantised ONNX model in QDQ form, made offline: the test model of the ``qdq_*`` composites.

Quantisation tools hand external compilers ONNX graphs in QDQ form: every tensor a
quantised kernel reads or writes goes through ``DequantizeLinear`` / ``QuantizeLinear``
and the operator between them stays in float.  TVM's ``from_onnx`` imports those nodes
as ``R.dequantize`` / ``R.quantize``, so a compiler that runs int8 kernels recognises
``dequantize -> conv2d / matmul -> [bias] -> quantize`` (the composites of
:mod:`patternkit.patterns.quantize`).

:func:`float_model` is a small net written with ``onnx.helper`` (random weights from a
seed): ``Conv`` (3 -> 8 channels, 3x3, bias) -> ``Relu`` -> ``Reshape`` -> ``MatMul``
(288 -> 10) -> ``Add`` (bias).  :func:`qdq_model` quantises it with onnxruntime's
``quantize_static`` (QDQ format, int8 or uint8 activations, int8 weights, MinMax
calibration on seeded random inputs): no download, the same model for the same seed.
onnxruntime folds the ``Relu`` into the quantisation of the conv's output (its zero point
is the lowest int8), as it does for real models.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The input's shape: one 3-channel 8x8 image.
INPUT_SHAPE = (1, 3, 8, 8)
#: Channels of the conv, classes of the matmul.
CHANNELS, CLASSES = 8, 10
#: Calibration batches ``quantize_static`` runs the float model on.
CALIBRATION_BATCHES = 8


def float_model(seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """The float net (see the module docstring), weights drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    side = INPUT_SHAPE[2] - 2
    features = CHANNELS * side * side
    weights = {
        "conv_weight": rng.standard_normal((CHANNELS, INPUT_SHAPE[1], 3, 3)) * 0.3,
        "conv_bias": rng.standard_normal(CHANNELS) * 0.1,
        "fc_weight": rng.standard_normal((features, CLASSES)) * 0.1,
        "fc_bias": rng.standard_normal(CLASSES) * 0.1,
    }
    initializers = [numpy_helper.from_array(v.astype("float32"), k) for k, v in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([1, features], "int64"), "flat"))
    nodes = [helper.make_node("Conv", ["x", "conv_weight", "conv_bias"], ["conv"]),
             helper.make_node("Relu", ["conv"], ["relu"]),
             helper.make_node("Reshape", ["relu", "flat"], ["features"]),
             helper.make_node("MatMul", ["features", "fc_weight"], ["logits"]),
             helper.make_node("Add", ["logits", "fc_bias"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv_matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             list(INPUT_SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, CLASSES])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


class _RandomCalibration:
    """Seeded random inputs for ``quantize_static`` (a ``CalibrationDataReader``)."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed + 1)
        self._batches = iter([{"x": rng.standard_normal(INPUT_SHAPE).astype("float32")}
                              for _ in range(CALIBRATION_BATCHES)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next batch, ``None`` when calibration is done."""
        return next(self._batches, None)

    def rewind(self) -> None:
        """Nothing to rewind: ``quantize_static`` reads the batches once."""


def qdq_model(seed: int = 0, activations: str = "int8", opset: int = 17) -> onnx.ModelProto:
    """:func:`float_model` quantised to QDQ form by onnxruntime's ``quantize_static``.

    Parameters
    ----------
    seed : int
        Seeds the weights and the calibration inputs.
    activations : str
        ``"int8"`` or ``"uint8"``: the activations' quantised type (weights are int8).
    opset : int
        The float model's opset (QDQ needs 13 or later for per-axis quantisation).

    Returns
    -------
    onnx.ModelProto
        The quantised model; it passes ``onnx.checker.check_model``.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    if activations not in types:
        raise ValueError(f"qdq_model(activations={activations!r}): expected 'int8' or 'uint8'")
    reader: Any = type("Calibration", (_RandomCalibration, CalibrationDataReader), {})(seed)
    with tempfile.TemporaryDirectory() as folder:
        source, target = os.path.join(folder, "float.onnx"), os.path.join(folder, "qdq.onnx")
        onnx.save(float_model(seed, opset), source)
        quantize_static(source, target, reader, quant_format=QuantFormat.QDQ,
                        activation_type=types[activations], weight_type=QuantType.QInt8)
        model = onnx.load(target)
    onnx.checker.check_model(model)
    return model
