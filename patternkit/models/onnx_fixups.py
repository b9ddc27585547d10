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
- :func:`fold_constant_pads`: the TorchScript exporter writes ``F.pad``'s pads as integer
  arithmetic on constants (``ConstantOfShape``, ``Concat``, ``Reshape``, ``Slice``,
  ``Transpose``, ``Cast``: MobileNetV2's TensorFlow-style padding), and the importer
  takes anything but a ``Constant`` there for run-time pads ("Dynamic pads are not
  supported yet").  Pads computed from constants and static shapes alone are evaluated
  (with onnx's reference evaluator) and given to the ``Pad`` as a ``Constant``.
- :func:`constant_expand_shapes`: an ``Expand`` whose shape is an initializer (the dynamo
  exporter's ``F.normalize``) imports, under ``keep_params_in_input=True``, as a shape read
  from a parameter at run time by an impure ``call_packed`` inside a pure function, which
  fails TVM's well-formedness check.  The ``Expand`` is given that shape as a ``Constant``.
- :func:`symbolic_expand_shapes`: an ``Expand`` to a constant shape imports only when its
  input's shape is static (the converter reads ``dim.value`` of every dimension:
  ``AttributeError: 'Var' object has no attribute 'value'``; GPT-J's ``repeat_interleave``
  with a dynamic sequence).  Its shape is written as the output shape it broadcasts to,
  the input's symbolic dimensions read by ``Shape(x, start, end)`` and concatenated with
  constants, which the importer takes as a symbolic shape.

:func:`prepare_for_tvm` applies all six; ``patternkit run model.onnx`` and the zoo's
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
    if folded := fold_constant_pads(model):
        fixups.append(f"{folded} Pad pads computed from constants folded to Constant")
    if given := constant_expand_shapes(model):
        fixups.append(f"{given} Expand shapes read from initializers given as Constant")
    if written := symbolic_expand_shapes(model):
        fixups.append(f"{written} Expand of a symbolic shape to a constant one given its "
                      "output shape")
    return fixups


#: ``Shape``'s ``start``/``end`` attributes, which :func:`symbolic_expand_shapes` writes,
#: came with opset 15.
_SHAPE_SLICES_OPSET = 15


def symbolic_expand_shapes(model: onnx.ModelProto) -> int:
    """Give each ``Expand`` of a tensor with a symbolic dimension to a constant shape the
    output shape it broadcasts to, as ``Concat`` of constants and ``Shape`` slices.

    ``Expand(x, c)`` broadcasts ``x`` with ``c`` (both padded with leading 1s to one
    rank): dimension ``i`` of the output is ``c[i]`` unless ``c[i]`` is 1, and then ``x``'s.
    That output shape, with ``x``'s symbolic dimensions read as ``Shape(x, start=j,
    end=j + 1)``, gives ``x`` the same broadcast.  Rewritten: an ``Expand`` whose shape is
    a non-negative int64 vector (a ``Constant`` or an initializer), whose input's rank
    onnx's shape inference knows, with a dimension it does not, and every such dimension
    meeting a 1 in the shape (the importer compares a constant target with a symbolic
    dimension with ``==``, which raises); at opset 15 or later.  Returns how many were
    rewritten (``model`` is changed in place).
    """
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    expands = [n for n in model.graph.node if n.op_type == "Expand" and len(n.input) == 2]
    if opset < _SHAPE_SLICES_OPSET or not expands:
        return 0
    targets = {n.input[1] for n in expands}
    constants = _constant_values(model)
    constants.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer
                      if i.name in targets})
    dims: dict[str, list[int | None]] | None = None

    def with_output_shape(node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        nonlocal dims
        shape = constants.get(node.input[1]) if node.op_type == "Expand" else None
        if (shape is None or shape.ndim != 1 or shape.dtype != np.int64
                or bool((shape < 0).any())):
            return None
        if dims is None:
            dims = _inferred_shapes(model)
        data = dims.get(node.input[0])
        if data is None or all(d is not None for d in data):
            return None  # rank unknown (left to the importer), or static: it imports
        rank = max(len(data), len(shape))
        padded = [1] * (rank - len(shape)) + [int(v) for v in shape]
        if any(d is None and s != 1 for d, s in zip([1] * (rank - len(data)) + data, padded)):
            return None  # a symbolic dimension broadcast to the shape's
        pieces = _output_shape_pieces(data, padded)
        name = f"{node.output[0]}/patternkit_expand"
        made, parts = [], []
        for k, (kind, values) in enumerate(pieces):
            part = f"{name}/{k}"
            parts.append(part)
            if kind == "constant":
                made.append(helper.make_node("Constant", [], [part], value=numpy_helper.from_array(
                    np.array(values, np.int64))))
            else:
                made.append(helper.make_node("Shape", [node.input[0]], [part],
                                             start=values[0], end=values[-1] + 1))
        made.append(helper.make_node("Concat", parts, [f"{name}/shape"], axis=0))
        node.input[1] = f"{name}/shape"
        return [*made, node]

    return _replace_nodes(model, with_output_shape)


def _output_shape_pieces(data: list[int | None], shape: list[int]
                         ) -> list[tuple[str, list[int]]]:
    """The broadcast of ``data`` (``None``: symbolic, met by a 1) with ``shape`` (of the
    higher rank), as runs of ``("constant", dims)`` and ``("shape", axes of data)`` in order.
    """
    lead = len(shape) - len(data)
    pieces: list[tuple[str, list[int]]] = []
    for i, s in enumerate(shape):
        d = data[i - lead] if i >= lead else 1
        kind, value = ("shape", i - lead) if d is None else ("constant", d if s == 1 else s)
        if pieces and pieces[-1][0] == kind:
            pieces[-1][1].append(value)
        else:
            pieces.append((kind, [value]))
    return pieces


def constant_expand_shapes(model: onnx.ModelProto) -> int:
    """Give each ``Expand`` whose shape is an initializer that shape as a ``Constant``.

    The initializer stays (other nodes may read it); one ``Constant`` is made per
    initializer and placed first.  Returns how many ``Expand`` nodes now read a
    ``Constant`` (``model`` is changed in place).
    """
    initializers = {i.name: i for i in model.graph.initializer}
    constant_of: dict[str, str] = {}
    given = 0
    for node in model.graph.node:
        if node.op_type != "Expand" or len(node.input) < 2 or node.input[1] not in initializers:
            continue
        shape = node.input[1]
        constant_of.setdefault(shape, f"{shape}/patternkit_expand_shape")
        node.input[1] = constant_of[shape]
        given += 1
    constants = [helper.make_node("Constant", [], [name], value=initializers[shape])
                 for shape, name in constant_of.items()]
    if constants:
        nodes = constants + list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return given


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
    shapes = _inferred_shapes(model)
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
    many nodes were replaced (``model`` is changed in place, the order kept).
    """
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


#: Operators :func:`fold_constant_pads` evaluates when all their inputs are known: the
#: integer arithmetic exporters write for pads.  Anything else ends the fold.
_PAD_ARITHMETIC = frozenset({
    "Add", "Cast", "Concat", "ConstantOfShape", "Div", "Expand", "Gather", "Identity",
    "Max", "Min", "Mod", "Mul", "Neg", "Range", "Reshape", "Shape", "Slice", "Squeeze", "Sub",
    "Transpose", "Unsqueeze"})

#: A pads tensor has two entries per axis; more than this is not pads arithmetic.
_MAX_FOLDED_ELEMENTS = 64


def fold_constant_pads(model: onnx.ModelProto) -> int:
    """Give each ``Pad`` whose pads are computed from constants and static shapes alone a
    ``Constant`` of those pads (inserted before it; what computed them stays for any other
    reader).  Returns how many ``Pad`` nodes were given one (``model`` is changed in place).
    """
    graph = model.graph
    pads = [n for n in graph.node if n.op_type == "Pad" and len(n.input) > 1 and n.input[1]]
    constants = _constant_values(model)
    if not pads or all(n.input[1] in constants for n in pads):
        return 0
    producers = {out: node for node in graph.node for out in node.output}
    initializers = {i.name: i for i in graph.initializer}
    opsets = list(model.opset_import)
    known: dict[str, np.ndarray | None] = {}
    static: dict[str, list[int | None]] | None = None

    def shape_of(name: str) -> list[int | None] | None:
        nonlocal static
        if static is None:
            static = _inferred_shapes(model)
        return static.get(name)

    def value(name: str) -> np.ndarray | None:
        if name in known:
            return known[name]
        known[name] = None  # a cycle (not a valid graph) ends here
        found: np.ndarray | None
        if name in constants:
            found = constants[name]
        elif name in initializers:
            tensor = initializers[name]
            small = np.prod(tensor.dims, dtype=np.int64) <= _MAX_FOLDED_ELEMENTS
            found = numpy_helper.to_array(tensor) if small else None
        else:
            found = _evaluated(producers.get(name), name, value, shape_of, opsets)
        known[name] = found
        return found

    def with_constant_pads(node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        if node.op_type != "Pad" or len(node.input) < 2 or node.input[1] in constants:
            return None
        found = value(node.input[1])
        if found is None or not np.issubdtype(found.dtype, np.integer):
            return None
        name = f"{node.output[0]}/patternkit_pads"
        constant = helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
            found.astype(np.int64)))
        node.input[1] = name
        return [constant, node]

    return _replace_nodes(model, with_constant_pads)


def _evaluated(node: onnx.NodeProto | None, name: str, value: Callable, shape_of: Callable,
               opsets: list) -> np.ndarray | None:
    """``name``, the output of ``node``, evaluated when it is small integer arithmetic on
    known values; ``None`` when it cannot be (a graph input, a float computation, a
    dynamic dimension).
    """
    if node is None or node.op_type not in _PAD_ARITHMETIC or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Shape":
        dims = shape_of(node.input[0])
        if dims is None or any(d is None for d in dims) or node.attribute:
            return None  # unknown, dynamic, or a start/end slice of the shape
        return np.array(dims, np.int64)
    inputs = {}
    for input_name in node.input:
        if not input_name:  # an optional input left out
            continue
        found = value(input_name)
        if found is None:
            return None
        inputs[input_name] = found
    from onnx.reference import ReferenceEvaluator

    single = helper.make_model(
        helper.make_graph([node], "fold", [], [helper.make_value_info(o, onnx.TypeProto())
                                              for o in node.output]),
        opset_imports=opsets)
    try:
        outputs = ReferenceEvaluator(single).run(None, inputs)
    except Exception:  # the reference evaluator does not take it: leave it to the importer
        return None
    found = np.asarray(outputs[list(node.output).index(name)])
    if found.size > _MAX_FOLDED_ELEMENTS or not np.issubdtype(found.dtype, np.integer):
        return None
    return found


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Every tensor's dimensions as onnx's shape inference knows them (None: symbolic)."""
    graph = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    return {info.name: [d.dim_value if d.HasField("dim_value") else None
                        for d in info.type.tensor_type.shape.dim]
            for info in (*graph.value_info, *graph.input, *graph.output)
            if info.type.tensor_type.HasField("shape")}
