"""Rewrites of an ONNX graph that let TVM 0.27's ``from_onnx`` import it.

Each works around an importer bug (``docs/tvm-bugs.md``) by writing nodes as other nodes
that compute the same values, so the graph's function is unchanged:

- :func:`fold_scalar_constant_of_shape`: transformers' mask code exports
  ``ConstantOfShape`` with an empty shape (a scalar), which the importer rejects
  (``broadcast_to expects the input shape to have the number of ndim at least as the
  input tensor's``); it becomes the ``Constant`` it computes.
- :func:`fold_static_shape_gathers`: with a dynamic batch, the exporter reads the
  *static* sequence length at run time (``Gather(Shape(x), 1)``, into the ``Range`` of
  position ids).  The importer's ``Range`` takes the gathered ``IntImm`` for an unknown
  and gives the ids a fresh symbolic length, so every later shape is lost and the import
  fails (BERT: ``shape_of expects a tensor input, but received R.Shape``; GPT-2:
  ``Slice requires a statically known input rank``).  A ``Gather`` of a ``Shape`` that
  picks only dimensions onnx's shape inference knows to be static becomes a ``Constant``.
- :func:`rewrite_dimension_ranges`: a ``Range(0, n, 1)`` over a dimension that *is*
  dynamic (``n = Gather(Shape(x), i)``) gets the same fresh length (through a
  ``match_cast``, on which TVM's ``FuseOps`` misplaces groups); written as
  ``CumSum(ConstantOfShape([n], 1)) - 1`` it imports with length ``n``.

:func:`prepare_for_tvm` applies all three; ``patternkit run model.onnx`` and the zoo's
ONNX entries call it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def prepare_for_tvm(model: onnx.ModelProto) -> list[str]:
    """Apply the rewrites of the module docstring to ``model`` (in place); say what they did.

    An empty list means nothing was changed.
    """
    fixups = []
    if folded := fold_scalar_constant_of_shape(model):
        fixups.append(f"{folded} ConstantOfShape of an empty shape folded to Constant")
    if folded := fold_static_shape_gathers(model):
        fixups.append(f"{folded} Gather of static Shape dimensions folded to Constant")
    if rewritten := rewrite_dimension_ranges(model):
        fixups.append(f"{rewritten} Range(0, a dynamic dimension, 1) written as CumSum of ones")
    return fixups


def fold_scalar_constant_of_shape(model: onnx.ModelProto) -> int:
    """Replace each ``ConstantOfShape`` of a constant empty shape by its scalar ``Constant``.

    Returns how many were folded (``model`` is changed in place).
    """
    shapes = {n.input[0] for n in model.graph.node if n.op_type == "ConstantOfShape"}
    constants = _constant_values(model)
    constants.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer
                      if i.name in shapes})  # not the weights: a user's model may be large

    def folded(node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        shape = constants.get(node.input[0]) if node.op_type == "ConstantOfShape" else None
        if shape is None or shape.size:
            return None
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        scalar = (numpy_helper.to_array(value).reshape(()) if value is not None
                  else np.zeros((), np.float32))  # the operator's default: float32 zero
        return [_constant_node(node, scalar)]

    return _replace_nodes(model, folded)


def fold_static_shape_gathers(model: onnx.ModelProto) -> int:
    """Replace each ``Gather(Shape(x), i)`` that picks static dimensions by a ``Constant``.

    The dimensions are those of onnx's shape inference with data propagation (so shapes
    computed by ``Concat`` into ``Reshape`` are known); a ``Gather`` that picks a symbolic
    dimension (the batch) is kept.  Returns how many were folded (``model`` is changed in
    place).
    """
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    graph = inferred.graph
    shapes = {info.name: [d.dim_value if d.HasField("dim_value") else None
                          for d in info.type.tensor_type.shape.dim]
              for info in (*graph.value_info, *graph.input, *graph.output)
              if info.type.tensor_type.HasField("shape")}
    constants = _constant_values(model)
    shape_outputs = {n.output[0]: shapes[n.input[0]] for n in model.graph.node
                     if n.op_type == "Shape" and not n.attribute and n.input[0] in shapes}

    def folded(node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        if node.op_type != "Gather" or node.input[0] not in shape_outputs:
            return None
        value = _static_dims(shape_outputs[node.input[0]], constants.get(node.input[1]),
                             next((a.i for a in node.attribute if a.name == "axis"), 0))
        return None if value is None else [_constant_node(node, value)]

    return _replace_nodes(model, folded)


def _replace_nodes(model: onnx.ModelProto,
                   replacement: Callable[[onnx.NodeProto], list[onnx.NodeProto] | None]) -> int:
    """Put ``replacement(node)`` in each node's place where it is not ``None``; return how
    many nodes were replaced (``model`` is changed in place, the order kept)."""
    nodes, replaced = [], 0
    for node in model.graph.node:
        new = replacement(node)
        nodes.extend([node] if new is None else new)
        replaced += new is not None
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return replaced


def _constant_node(node: onnx.NodeProto, value: np.ndarray) -> onnx.NodeProto:
    """A ``Constant`` of ``value`` in ``node``'s place: its outputs and its name."""
    return helper.make_node("Constant", [], list(node.output), name=node.name,
                            value=numpy_helper.from_array(value))


def _constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}


def _static_dims(dims: list[int | None], indices: np.ndarray | None,
                 axis: int) -> np.ndarray | None:
    """The int64 values ``Gather(dims, indices)`` computes, or None unless all are static."""
    if indices is None or axis != 0 or not np.issubdtype(indices.dtype, np.integer):
        return None
    rank = len(dims)
    if any(not -rank <= int(i) < rank for i in indices.flat):
        return None
    picked = [dims[int(i)] for i in indices.flat]
    if any(p is None for p in picked):
        return None
    return np.array(picked, np.int64).reshape(indices.shape)


def rewrite_dimension_ranges(model: onnx.ModelProto) -> int:
    """Write each ``Range(0, n, 1)`` over a dimension ``n`` as ``CumSum(ones([n])) - 1``.

    ``n`` must be read from a shape (``Gather(Shape(x), i)``, maybe through a ``Cast`` to
    int64), so it is a non-negative int64 and the two agree: ``0, 1, ..., n - 1``.  Static
    dimensions are folded before (:func:`fold_static_shape_gathers`) and their ranges,
    all constant, import as they are.  Returns how many were rewritten (``model`` is
    changed in place).
    """
    constants = _constant_values(model)
    dimensions = _dimension_reads(model, constants)

    def counted(node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        if node.op_type != "Range" or not _counts_from_zero(node, constants, dimensions):
            return None
        _, limit, delta = node.input
        name = f"{node.output[0]}/patternkit_range"
        return [
            helper.make_node("Constant", [], [f"{name}/axes"],
                             value=numpy_helper.from_array(np.array([0], np.int64))),
            helper.make_node("Unsqueeze", [limit, f"{name}/axes"], [f"{name}/shape"]),
            helper.make_node("ConstantOfShape", [f"{name}/shape"], [f"{name}/ones"],
                             value=numpy_helper.from_array(np.array([1], np.int64))),
            helper.make_node("Constant", [], [f"{name}/axis"],
                             value=numpy_helper.from_array(np.array(0, np.int64))),
            helper.make_node("CumSum", [f"{name}/ones", f"{name}/axis"], [f"{name}/counts"]),
            helper.make_node("Sub", [f"{name}/counts", delta], list(node.output),
                             name=node.name),
        ]

    return _replace_nodes(model, counted)


def _dimension_reads(model: onnx.ModelProto, constants: dict[str, np.ndarray]) -> set[str]:
    """Names of the int64 scalars that are one dimension of a shape."""
    shapes = {n.output[0] for n in model.graph.node if n.op_type == "Shape"}
    reads: set[str] = set()
    for node in model.graph.node:  # in order: a Cast comes after what it reads
        if (node.op_type == "Gather" and node.input[0] in shapes
                and constants.get(node.input[1], np.zeros(1)).ndim == 0):
            reads.add(node.output[0])
        elif (node.op_type == "Cast" and node.input[0] in reads
              and any(a.name == "to" and a.i == TensorProto.INT64 for a in node.attribute)):
            reads.add(node.output[0])
    return reads


def _counts_from_zero(node: onnx.NodeProto, constants: dict[str, np.ndarray],
                      dimensions: set[str]) -> bool:
    """Is ``node`` ``Range(0, n, 1)`` in int64 with ``n`` a dimension?"""
    start, limit, delta = (constants.get(name) for name in node.input)
    return (node.input[1] in dimensions and limit is None
            and all(c is not None and c.shape == () and c.dtype == np.int64 and int(c) == v
                    for c, v in ((start, 0), (delta, 1))))
