"""patternkit.models.onnx_qdq: a conv + matmul net quantised offline to QDQ form,
deterministic for a seed, that onnxruntime and TVM's importer both take."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytestmark = pytest.mark.models

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from patternkit.models.onnx_qdq import INPUT_SHAPE, float_model, qdq_model  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet_quantizer():
    """quantize_static advises pre-processing through the root logger on every call."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    yield
    root.setLevel(level)


def _run(model, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_the_same_seed_gives_the_same_model_and_another_seed_another():
    first, again, other = qdq_model(seed=0), qdq_model(seed=0), qdq_model(seed=1)
    assert first.SerializeToString() == again.SerializeToString()
    assert first.SerializeToString() != other.SerializeToString()


@pytest.mark.parametrize("activations", ["int8", "uint8"])
def test_conv_and_matmul_read_and_write_through_quantize_dequantize_pairs(activations):
    model = qdq_model(activations=activations)
    producers = {out: node for node in model.graph.node for out in node.output}
    for op in ("Conv", "MatMul"):
        (node,) = [n for n in model.graph.node if n.op_type == op]
        assert [producers[i].op_type for i in node.input[:2]] == ["DequantizeLinear"] * 2
        (reader,) = [n for n in model.graph.node if node.output[0] in n.input]
        assert reader.op_type == "QuantizeLinear"
    quantized = {onnx.TensorProto.DataType.Name(t.data_type) for t in model.graph.initializer
                 if t.name.endswith("_zero_point")}
    assert quantized == {activations.upper(), "INT8", "INT32"}  # activations, weights, bias


def test_the_quantised_model_computes_the_float_model_to_a_few_quantisation_steps():
    x = np.random.default_rng(3).standard_normal(INPUT_SHAPE).astype("float32")
    quantised, reference = _run(qdq_model(), x), _run(float_model(), x)
    output_scale = max(float(onnx.numpy_helper.to_array(t)) for t in qdq_model().graph.initializer
                       if t.name.startswith("y_scale"))
    assert np.abs(quantised - reference).max() < 4 * output_scale


def test_an_unknown_activation_type_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"qdq_model\(activations='int4'\): expected 'int8' or "
                                         r"'uint8'"):
        qdq_model(activations="int4")
