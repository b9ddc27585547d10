"""Zoo entries imported from ONNX with ``tvm.relax.frontend.onnx.from_onnx``.

``onnx:gpt2`` and ``onnx:bert`` are the torch sources of :mod:`.torch_models` exported
with ``torch.onnx.export(..., dynamo=False)``, the TorchScript exporter: it works offline
and writes opset 14 (LayerNorm spelled out: ``ReduceMean``, ``Sub``, ``Pow``, ``Sqrt``,
``Div``) and 17 (``LayerNormalization``) as asked.  ``exporter=dynamo`` exports with
``torch.onnx.export(..., dynamo=True)`` instead (through onnxscript, the exporter torch
recommends since 2.9): it writes opset 18 and converts down to the opset asked for with
onnx's version converter.  Where the conversion fails (``LayerNormalization`` has no
version before 17, so a model with a layer norm cannot go to opset 14) the exporter keeps
opset 18; :func:`export_to_onnx` then raises a one-line :class:`ZooImportError` naming
the opset it got rather than hand out another opset than asked.  What the converter
leaves of opset 18's ``Split(num_outputs=n)`` at 17 (an attribute 17 does not have) is
repaired into the sizes input 17 takes (:func:`split_sizes_as_inputs`).

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

import contextlib
import io
import warnings
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ..errors import first_line
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
    exporter = options.get("exporter", "torchscript")
    data = timed(seconds, "export", export_to_onnx, source.module, example, names,
                 opset=options["opset"], exporter=exporter, dynamic_axes=dynamic_axes,
                 output_names=["last_hidden_state"], text=spec.text)
    exported = onnx.load_from_string(data)
    model = onnx.load_from_string(data)
    fixups = prepare_for_tvm(model)
    onnx.checker.check_model(model)
    families = count_module_families(source.module)
    families["softmax"] = count_softmax_in_onnx(model)
    metadata = {**source.metadata, "exporter": EXPORTERS[exporter],
                "opset": options["opset"], "onnx_fixups": fixups,
                "onnx_ops": onnx_op_counts(model)}
    bounds = {r: source.dim_bounds.get(r, (1, None)) for r in sizes}
    return _finish(spec, model, source.input_specs, families, seconds, metadata, sizes, bounds,
                   model, reference_model=exported)


#: The exporters of ``torch.onnx.export``, by the zoo option's value.
EXPORTERS = {"torchscript": "torch.onnx.export(dynamo=False)",
             "dynamo": "torch.onnx.export(dynamo=True)"}


def export_to_onnx(module, example: tuple, names: list[str], *, opset: int | None,
                   exporter: str = "torchscript",
                   dynamic_axes: dict[str, dict[int, str]] | None = None,
                   output_names: list[str] | None = None, text: str = "") -> bytes:
    """``module`` exported to ONNX on ``example`` (serialised ``ModelProto`` bytes).

    Parameters
    ----------
    module : torch.nn.Module
        In eval mode; called on ``example``.
    names : list of str
        The ONNX graph's input names, one per example tensor.
    opset : int or None
        The opset asked for; ``None``: the exporter's default (18 for ``dynamo``).
    exporter : {"torchscript", "dynamo"}
        ``torch.onnx.export(dynamo=False)`` or ``dynamo=True`` (through onnxscript).
    dynamic_axes : dict, optional
        Input name -> {axis: dimension name} for the symbolic dimensions.
    text : str
        Names the model in errors.

    Raises
    ------
    ZooImportError
        The export failed, or the dynamo exporter could not convert its opset 18 to the
        one asked for: one line.
    """
    import torch

    if exporter not in EXPORTERS:
        raise ZooImportError(f"{text}: unknown exporter {exporter!r} "
                             f"(one of {', '.join(EXPORTERS)})")
    axes = {k: v for k, v in (dynamic_axes or {}).items() if v}
    kwargs: dict[str, Any] = dict(input_names=names, output_names=output_names)
    if opset is not None:
        kwargs["opset_version"] = opset
    if exporter == "dynamo":
        dims: dict[str, Any] = {}
        kwargs["dynamic_shapes"] = tuple(
            {axis: dims.setdefault(role, torch.export.Dim(role))
             for axis, role in axes.get(name, {}).items()} or None
            for name in names) if axes else None
    else:
        kwargs["dynamic_axes"] = axes or None
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.no_grad(), _quiet_exporter(), \
                contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")  # TracerWarnings of the mask code
            if exporter == "dynamo":
                program = torch.onnx.export(module, example, dynamo=True, verbose=False,
                                            **kwargs)
                buffer.write(program.model_proto.SerializeToString())
            else:
                torch.onnx.export(module, example, buffer, dynamo=False, **kwargs)
    except Exception as err:
        raise ZooImportError(f"{text}: {EXPORTERS[exporter]} failed: "
                             f"{type(err).__name__}: {first_line(err, limit=300)}") from err
    data = buffer.getvalue()
    if opset is not None and exporter == "dynamo":
        model = onnx.load_from_string(data)
        written = _default_opset(model)
        if written != opset:
            raise ZooImportError(f"{text}: torch.onnx.export(dynamo=True) wrote opset "
                                 f"{written}, not {opset}: onnx's version converter cannot "
                                 f"take this graph down to {opset}")
        if split_sizes_as_inputs(model, text):
            data = model.SerializeToString()
    return data


def split_sizes_as_inputs(model: onnx.ModelProto, text: str = "") -> int:
    """Repair what onnx's version converter leaves of opset 18's ``Split(num_outputs=n)``
    below opset 18 (where the attribute does not exist and ``check_model`` refuses it):
    the equal parts become a ``split`` sizes input.  Returns the nodes repaired.

    Raises
    ------
    ZooImportError
        A split axis whose length is not known or not divisible by ``num_outputs``.
    """
    if _default_opset(model) >= 18:
        return 0
    splits = [n for n in model.graph.node if n.op_type == "Split"
              and any(a.name == "num_outputs" for a in n.attribute)]
    if not splits:
        return 0
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: v.type.tensor_type.shape for v in (
        *inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
    for node in splits:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        parts, axis = attrs["num_outputs"], attrs.get("axis", 0)
        shape = shapes.get(node.input[0])
        dims = list(shape.dim) if shape is not None else []
        length = dims[axis].dim_value if -len(dims) <= axis < len(dims) else 0
        if not length or length % parts:
            raise ZooImportError(f"{text}: Split {node.name!r} into {parts} parts along an axis "
                                 f"of unknown or indivisible length: it cannot be written "
                                 f"below opset 18")
        sizes = f"{node.name}_sizes"
        model.graph.initializer.append(numpy_helper.from_array(
            np.full(parts, length // parts, dtype=np.int64), sizes))
        kept = [a for a in node.attribute if a.name != "num_outputs"]
        del node.attribute[:]
        node.attribute.extend(kept)
        del node.input[1:]
        node.input.append(sizes)
    return len(splits)


@contextlib.contextmanager
def _quiet_exporter():
    """The dynamo exporter's logging (version conversion, skipped torchvision ops) silenced."""
    import logging

    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _default_opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def onnx_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each ONNX op type ``model``'s graph holds (what an export wrote)."""
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
                "opset": options["opset"], "onnx_fixups": [], "onnx_ops": onnx_op_counts(model)}
    return _finish(spec, model, input_specs, families, {}, metadata,
                   {"batch": options["batch_size"]}, {"batch": (1, None)}, model)
