"""The ``onnx:qdq`` zoo entry: :mod:`.onnx_qdq`'s quantised QDQ model, imported with from_onnx.

The model (``Conv -> Relu -> Reshape -> MatMul -> Add`` quantised by onnxruntime's
``quantize_static``, every tensor between ``DequantizeLinear`` / ``QuantizeLinear``) has
one fixed input shape, ``(1, 3, 8, 8)``: the entry refuses a dynamic batch or another
batch size instead of exporting something else.  The reference evaluates the ONNX model
itself (:func:`~patternkit.models.onnx_models.onnx_reference`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .importing import from_onnx_model, symbolic_dims
from .onnx_models import onnx_op_counts
from .zoomodel import FAMILIES, InputSpec, ZooError, ZooModel


def onnxruntime_reference(model, names: tuple[str, ...]):
    """A reference function run by onnxruntime: onnx's ``ReferenceEvaluator`` has no
    ``DequantizeLinear`` below opset 19.
    """
    import onnxruntime  # type: ignore[import-untyped]

    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])

    def reference(inputs) -> list[np.ndarray]:
        return [np.asarray(o) for o in session.run(None, {n: np.asarray(inputs[n])
                                                          for n in names})]

    return reference


#: ONNX operators a QDQ model runs on integers when both operands are dequantized.
QUANTIZABLE = ("Conv", "MatMul", "Gemm")


def count_quantized_ops(model) -> int:
    """Nodes of :data:`QUANTIZABLE` whose first two inputs both come from a
    ``DequantizeLinear``: the quantised kernels a QDQ graph asks for (the ``qdq``
    family's instances).
    """
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear"
                   for out in node.output}
    return sum(node.op_type in QUANTIZABLE and len(node.input) >= 2
               and all(name in dequantized for name in node.input[:2])
               for node in model.graph.node)


def qdq(spec) -> ZooModel:
    """The ``zoo:onnx:qdq`` model."""
    from .onnx_qdq import INPUT_SHAPE, qdq_model

    options: dict[str, Any] = spec.as_dict()
    if options["batch"] != "static" or options["batch_size"] != INPUT_SHAPE[0]:
        raise ZooError(f"{spec.text}: the QDQ model's input is fixed at {INPUT_SHAPE}; "
                       f"batch=static and batch_size={INPUT_SHAPE[0]} only")
    model = qdq_model(options["seed"], options["activations"], options["opset"])
    input_specs = (InputSpec("x", "float32", tuple(INPUT_SHAPE)),)
    counts = onnx_op_counts(model)
    seconds: dict[str, float] = {}
    mod, params = from_onnx_model(model, options["keep_params"], options["entry"], spec.text,
                                  seconds)
    families = {f: counts.get("Conv", 0) if f == "conv2d" else 0 for f in FAMILIES}
    families["qdq"] = count_quantized_ops(model)
    metadata = {"architecture": "QDQ Conv+Relu+MatMul+Add", "exporter": "quantize_static",
                "opset": options["opset"], "activations": options["activations"],
                "onnx_fixups": [], "onnx_ops": counts}
    return ZooModel(spec=spec, mod=mod, entry=options["entry"], input_specs=input_specs,
                    sizes={"batch": INPUT_SHAPE[0]},
                    symbolic_dims=symbolic_dims(mod[options["entry"]], input_specs),
                    dim_bounds={"batch": (INPUT_SHAPE[0], INPUT_SHAPE[0])}, params=params,
                    families=families, source=model, metadata=metadata, seconds=seconds,
                    reference_fn=onnxruntime_reference(model, ("x",)))
