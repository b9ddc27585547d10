"""Zoo entries imported from ONNX with ``tvm.relax.frontend.onnx.from_onnx``.

``onnx:gpt2`` and ``onnx:bert`` are the torch sources of :mod:`.torch_models` exported
with ``torch.onnx.export(..., dynamo=False)``, the TorchScript exporter: it works offline
and writes opset 14 (LayerNorm spelled out: ``ReduceMean``, ``Sub``, ``Pow``, ``Sqrt``,
``Div``) and 17 (``LayerNormalization``) as asked.  The dynamo exporter (needs
onnxscript) was tried and not used: it only writes opset >= 18, and its down-conversion
keeps ``LayerNormalization`` at opset 14 (invalid) and fails ``check_model`` at 17
(``Unrecognized attribute: num_outputs for operator Split``).

The export goes through :func:`.onnx_fixups.prepare_for_tvm` before ``from_onnx``: the
rewrites that work around TVM 0.27 importer bugs without changing what the graph
computes, recorded in ``metadata["onnx_fixups"]`` (the reference below runs on the
export as written).

``onnx:conv_bn`` is written with ``onnx.helper``: ``Conv`` (with bias) ->
``BatchNormalization`` -> ``Relu``.  TVM's importer reads all three outputs of its
``batch_norm`` (``lv2 = lv1[0]; lv3 = lv1[1]; lv4 = lv1[2]``) and only the first is
used: the dead bindings fusion passes drop.

The reference is onnx's own ``ReferenceEvaluator`` on the same graph.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from .families import count_module_families, count_softmax_in_onnx
from .importing import from_onnx_model, symbolic_dims, timed
from .onnx_fixups import prepare_for_tvm
from .zoomodel import FAMILIES, InputSpec, ZooImportError, ZooModel


def onnx_reference(model: onnx.ModelProto, names: tuple[str, ...]):
    """A reference function: numpy inputs by name -> ``ReferenceEvaluator`` outputs."""
    evaluator = ReferenceEvaluator(model)

    def reference(inputs) -> list[np.ndarray]:
        return [np.asarray(o) for o in evaluator.run(None, {n: np.asarray(inputs[n])
                                                            for n in names})]

    return reference


def _finish(spec, model: onnx.ModelProto, input_specs, families, seconds, metadata,
            sizes, dim_bounds, source, reference_model: onnx.ModelProto | None = None
            ) -> ZooModel:
    """Import ``model``; the reference evaluates ``reference_model`` (default: ``model``)."""
    options = spec.as_dict()
    mod, params = from_onnx_model(model, options["keep_params"], options["entry"], spec.text,
                                  seconds)
    names = tuple(s.name for s in input_specs)
    return ZooModel(spec=spec, mod=mod, entry=options["entry"], input_specs=input_specs,
                    sizes=sizes, symbolic_dims=symbolic_dims(mod[options["entry"]], input_specs),
                    dim_bounds=dim_bounds, params=params, families=families, source=source,
                    metadata=metadata, seconds=seconds,
                    reference_fn=onnx_reference(reference_model or model, names))


def _exported(spec, source_fn) -> ZooModel:
    import torch

    from .torch_models import dynamic_roles, example_sizes

    options = spec.as_dict()
    source = source_fn(options)
    roles = dynamic_roles(spec, options)
    sizes = example_sizes(options)
    rng = np.random.default_rng(0)
    example = tuple(torch.from_numpy(s.draw(sizes, rng)) for s in source.input_specs)
    names = [s.name for s in source.input_specs]
    dynamic_axes = {s.name: {axis: d for axis, d in enumerate(s.shape) if d in roles}
                    for s in source.input_specs}
    seconds: dict[str, float] = {}
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # TracerWarnings of the mask code
            timed(seconds, "export", torch.onnx.export, source.module, example, buffer,
                  input_names=names, output_names=["last_hidden_state"],
                  opset_version=options["opset"], dynamo=False,
                  dynamic_axes={k: v for k, v in dynamic_axes.items() if v} or None)
    except Exception as err:
        raise ZooImportError(f"{spec.text}: torch.onnx.export failed: {type(err).__name__}: "
                             f"{str(err).strip().splitlines()[0]}") from err
    exported = onnx.load_from_string(buffer.getvalue())
    model = onnx.load_from_string(buffer.getvalue())
    fixups = prepare_for_tvm(model)
    onnx.checker.check_model(model)
    families = count_module_families(source.module)
    families["softmax"] = count_softmax_in_onnx(model)
    metadata = {**source.metadata, "exporter": "torch.onnx.export(dynamo=False)",
                "opset": options["opset"], "onnx_fixups": fixups,
                "onnx_ops": _op_counts(model)}
    bounds = {r: source.dim_bounds.get(r, (1, None)) for r in sizes}
    return _finish(spec, model, source.input_specs, families, seconds, metadata, sizes, bounds,
                   model, reference_model=exported)


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def gpt2(spec) -> ZooModel:
    """The ``onnx:gpt2`` zoo model: GPT-2 exported to ONNX, imported with ``from_onnx``."""
    from .torch_models import gpt2_source

    return _exported(spec, gpt2_source)


def bert(spec) -> ZooModel:
    """The ``onnx:bert`` zoo model: BERT exported to ONNX, imported with ``from_onnx``."""
    from .torch_models import bert_source

    return _exported(spec, bert_source)


def t5(spec) -> ZooModel:
    """``zoo:t5`` through ONNX: opset 14 writes its RMS norms out with ``Sqrt`` +
    ``Reciprocal`` for ``torch.rsqrt``, as every opset before 23 does.
    """
    from .torch_models import t5_source

    return _exported(spec, t5_source)


def conv_bn(spec) -> ZooModel:
    """``Conv(3->8, 3x3, pad 1, bias) -> BatchNormalization -> Relu`` on 8x8 images."""
    options: dict[str, Any] = spec.as_dict()
    rng = np.random.default_rng(options["seed"])
    channels, fan_in = 8, 3 * 3 * 3
    arrays = {
        "W": (rng.standard_normal((channels, 3, 3, 3)) * fan_in ** -0.5).astype("float32"),
        "B": rng.uniform(-0.5, 0.5, channels).astype("float32"),
        "scale": rng.uniform(0.5, 1.5, channels).astype("float32"),
        "bias": rng.uniform(-0.5, 0.5, channels).astype("float32"),
        "mean": rng.uniform(-0.5, 0.5, channels).astype("float32"),
        "var": rng.uniform(0.5, 1.5, channels).astype("float32"),
    }
    dynamic = options["batch"] == "dynamic"
    batch = "batch" if dynamic else options["batch_size"]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W", "B"], ["conv"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["conv", "scale", "bias", "mean", "var"],
                          ["bn"], epsilon=1e-5),
         helper.make_node("Relu", ["bn"], ["y"])],
        "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, channels, 8, 8])],
        initializer=[numpy_helper.from_array(a, k) for k, a in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", options["opset"])])
    onnx.checker.check_model(model)
    input_specs = (InputSpec("x", "float32", ("batch", 3, 8, 8)),)
    families = {f: int(f in ("batchnorm", "conv2d")) for f in FAMILIES}
    metadata = {"architecture": "Conv+BatchNormalization+Relu", "exporter": "onnx.helper",
                "opset": options["opset"], "onnx_fixups": [], "onnx_ops": _op_counts(model)}
    return _finish(spec, model, input_specs, families, {}, metadata,
                   {"batch": options["batch_size"]}, {"batch": (1, None)}, model)
