"""The ONNX rewrites that let TVM 0.27 import transformers exports (onnx_fixups).

Each rewrite must compute what the graph computed: onnx's ``ReferenceEvaluator`` runs
both; the import is checked for the shapes TVM's importer lost before.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from patternkit.models.onnx_fixups import (  # noqa: E402
    constant_expand_shapes,
    fold_constant_pads,
    fold_static_shape_gathers,
    prepare_for_tvm,
    rewrite_dimension_ranges,
    symbolic_expand_shapes,
)
from patternkit.verification.numeric import build as build_for_checks


def _scalar(name: str, value: int) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.array(value, np.int64)))


def _shape_reads(dims_read: list[int]) -> onnx.ModelProto:
    """``x: [batch, 8, 4]`` and, for each index, ``Gather(Shape(x), index)`` as an output."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"])]
    outputs = []
    for k, index in enumerate(dims_read):
        nodes += [helper.make_node("Constant", [], [f"i{k}"], value=numpy_helper.from_array(
                      np.array(index, np.int64))),
                  helper.make_node("Gather", ["shape", f"i{k}"], [f"d{k}"])]
        outputs.append(helper.make_tensor_value_info(f"d{k}", TensorProto.INT64, []))
    graph = helper.make_graph(nodes, "reads", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 8, 4])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def test_only_gathers_of_static_dimensions_are_folded_and_the_values_stay():
    model = _shape_reads([1, 0, -1])
    folded = _shape_reads([1, 0, -1])
    assert fold_static_shape_gathers(folded) == 2  # 8 and 4; the batch stays read
    onnx.checker.check_model(folded)
    assert [n.op_type for n in folded.graph.node].count("Gather") == 1
    x = {"x": np.zeros((3, 8, 4), np.float32)}
    expected = ReferenceEvaluator(model).run(None, x)
    assert [int(v) for v in ReferenceEvaluator(folded).run(None, x)] == [
        int(v) for v in expected] == [8, 3, 4]


def _positions(start: int, cast: bool, limit_from_shape: bool = True) -> onnx.ModelProto:
    """``y = x + Range(start, Shape(x)[1], 1)`` with ``x: [batch, seq]``, as
    torch.onnx.export writes position ids (BERT casts the length to int64 again)."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), _scalar("one", 1),
             _scalar("start", start), helper.make_node("Gather", ["shape", "one"], ["length"])]
    limit = "length"
    if cast:
        nodes.append(helper.make_node("Cast", ["length"], ["length64"], to=TensorProto.INT64))
        limit = "length64"
    if not limit_from_shape:
        nodes.append(helper.make_node("Add", [limit, "one"], ["other"]))
        limit = "other"
    nodes += [helper.make_node("Range", ["start", limit, "one"], ["ids"]),
              helper.make_node("Cast", ["ids"], ["positions"], to=TensorProto.FLOAT),
              helper.make_node("Add", ["x", "positions"], ["y"])]
    graph = helper.make_graph(
        nodes, "positions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("cast", [False, True])
def test_a_range_over_a_dynamic_dimension_imports_with_that_length(cast):
    from tvm.relax.frontend.onnx import from_onnx

    model, rewritten = _positions(0, cast), _positions(0, cast)
    assert prepare_for_tvm(rewritten) == [
        "1 Range(0, a dynamic dimension, 1) written as CumSum of ones"]
    onnx.checker.check_model(rewritten)
    assert "Range" not in [n.op_type for n in rewritten.graph.node]
    x = np.random.default_rng(0).standard_normal((3, 5)).astype("float32")
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ReferenceEvaluator(rewritten).run(None, {"x": x})[0],
                                  expected)
    mod = from_onnx(rewritten)
    batch, seq = (str(d) for d in mod["main"].params[0].ty.shape)
    assert [str(d) for d in mod["main"].ret_ty.shape] == [batch, seq]  # not lost
    vm = build_for_checks(mod)
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), expected)


@pytest.mark.parametrize("start, limit_from_shape", [(1, True), (0, False)])
def test_other_ranges_are_left_as_they_are(start, limit_from_shape):
    # only Range(0, a dimension, 1) is known to be 0..n-1 with n >= 0
    model = _positions(start, cast=False, limit_from_shape=limit_from_shape)
    assert rewrite_dimension_ranges(model) == 0
    assert "Range" in [n.op_type for n in model.graph.node]


def _exported_pad(batch: str | int = 2) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """``F.pad(conv(x), (0, 1, 1, 2))`` through the TorchScript exporter, which writes the
    pads as integer arithmetic on constants (MobileNetV2's TensorFlow-style padding); the
    model, an input and torch's output for it."""
    import io

    torch = pytest.importorskip("torch")

    class PaddedConv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return torch.nn.functional.pad(self.conv(x), (0, 1, 1, 2), value=0.5)

    torch.manual_seed(0)
    module = PaddedConv().eval()
    x = torch.randn(2, 3, 8, 8)
    buffer = io.BytesIO()
    dynamic = {"x": {0: "batch"}} if isinstance(batch, str) else None
    torch.onnx.export(module, (x,), buffer, opset_version=17, dynamo=False,
                      input_names=["x"], dynamic_axes=dynamic)
    return onnx.load_from_string(buffer.getvalue()), x.numpy(), module(x).detach().numpy()


@pytest.mark.parametrize("batch", [2, "batch"])
def test_pads_computed_from_constants_become_a_constant_and_the_model_imports(batch):
    from tvm.relax.frontend.onnx import from_onnx

    model, x, expected = _exported_pad(batch)
    original = ReferenceEvaluator(model).run(None, {"x": x})[0]
    with pytest.raises(Exception, match="Dynamic pads are not supported"):
        from_onnx(model)  # the bug worked around (docs/tvm-bugs.md)
    assert fold_constant_pads(model) == 1
    pad = next(n for n in model.graph.node if n.op_type == "Pad")
    assert pad.input[1].endswith("/patternkit_pads")
    np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, {"x": x})[0], original)
    mod = from_onnx(model)
    vm = build_for_checks(mod)
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_pads_read_from_a_graph_input_are_left_to_the_importer():
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")]
    graph = helper.make_graph(nodes, "pad", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("pads", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    assert fold_constant_pads(model) == 0
    assert model.SerializeToString() == before


def _expand_by_initializer(readers: int) -> onnx.ModelProto:
    """``x: [1, 4]`` expanded ``readers`` times to ``[2, 3, 4]`` by one initializer shape."""
    shape = numpy_helper.from_array(np.array([2, 3, 4], np.int64), "shape")
    nodes = [helper.make_node("Expand", ["x", "shape"], [f"y{k}"]) for k in range(readers)]
    outputs = [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None)
               for k in range(readers)]
    graph = helper.make_graph(nodes, "expand", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4])], outputs, initializer=[shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_expand_shape_read_from_an_initializer_becomes_a_constant_and_imports_well_formed():
    from tvm.relax.frontend.onnx import from_onnx

    model = _expand_by_initializer(readers=2)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    original = ReferenceEvaluator(model).run(None, {"x": x})
    # the bug worked around (docs/tvm-bugs.md): an impure call in the pure main
    assert not relax.analysis.check_well_formed(from_onnx(model, keep_params_in_input=True))
    assert constant_expand_shapes(model) == 2
    assert [n.op_type for n in model.graph.node] == ["Constant", "Expand", "Expand"]
    assert [i.name for i in model.graph.initializer] == ["shape"]  # kept for other readers
    for got, want in zip(ReferenceEvaluator(model).run(None, {"x": x}), original):
        np.testing.assert_array_equal(got, want)
    mod = from_onnx(model, keep_params_in_input=True)
    assert relax.analysis.check_well_formed(mod)
    vm = build_for_checks(mod)
    out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array([2, 3, 4], np.int64)))
    np.testing.assert_array_equal(out[0].numpy(), np.broadcast_to(x, (2, 3, 4)))


def test_an_expand_shape_computed_in_the_graph_is_left_to_the_importer():
    model = _expand_by_initializer(readers=1)
    model.graph.node[0].input[1] = "computed"
    model.graph.node.insert(0, helper.make_node("Shape", ["x"], ["computed"]))
    before = model.SerializeToString()
    assert constant_expand_shapes(model) == 0
    assert model.SerializeToString() == before


def _repeat_interleave(dims: list[str | int]) -> onnx.ModelProto:
    """``torch.repeat_interleave(x, 2, dim=-1)`` of ``x: dims`` (rank 2, last 4) as
    ``torch.onnx.export(dynamo=True)`` writes it (GPT-J's rotary angles): ``Unsqueeze``,
    ``Expand`` to the initializer ``[1, 1, 2]``, ``Reshape`` to ``[-1, 8]``."""
    initializers = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
                    (("axes", [2]), ("pairs", [1, 1, 2]), ("lanes", [-1, 8]))]
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["column"]),
             helper.make_node("Expand", ["column", "pairs"], ["repeated"]),
             helper.make_node("Reshape", ["repeated", "lanes"], ["y"], allowzero=1)]
    graph = helper.make_graph(
        nodes, "repeat_interleave", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dims[0], 8])],
        initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _expand(dims: list[str | int], shape: list[int], opset: int = 18,
            output: list[str | int] | None = None) -> onnx.ModelProto:
    """``Expand(x: dims, Constant(shape))`` (``y: output``)."""
    nodes = [helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(
                 np.array(shape, np.int64))),
             helper.make_node("Expand", ["x", "shape"], ["y"])]
    graph = helper.make_graph(
        nodes, "expand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _imports_and_matches(model: onnx.ModelProto, original: onnx.ModelProto,
                         inputs: list[np.ndarray], output_dims: list[str]) -> None:
    """``model`` computes what ``original`` does on each input (onnx's reference evaluator,
    bit for bit), imports with the output dimensions ``output_dims`` (a symbolic one
    named as in ``x``'s type), and its llvm build gives the same numbers."""
    from tvm.relax.frontend.onnx import from_onnx

    onnx.checker.check_model(model, full_check=True)
    mod = from_onnx(model)
    assert relax.analysis.check_well_formed(mod)
    assert [str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d)
            for d in mod["main"].ret_ty.shape] == output_dims
    vm = build_for_checks(mod)
    for x in inputs:
        expected = ReferenceEvaluator(original).run(None, {"x": x})[0]
        np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, {"x": x})[0],
                                      expected)
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_array_equal(got, expected)  # a broadcast copies: exact


def test_gptj_repeat_interleave_of_a_dynamic_length_imports_with_that_length():
    from tvm.relax.frontend.onnx import from_onnx

    model, original = _repeat_interleave(["n", 4]), _repeat_interleave(["n", 4])
    with pytest.raises(AttributeError, match="'Var' object has no attribute 'value'"):
        from_onnx(original)  # the bug worked around (docs/tvm-bugs.md)
    assert prepare_for_tvm(model) == [
        "1 Expand shapes read from initializers given as Constant",
        "1 Expand of a symbolic shape to a constant one given its output shape"]
    expand = next(n for n in model.graph.node if n.op_type == "Expand")
    assert expand.input[1] == "repeated/patternkit_expand/shape"
    rng = np.random.default_rng(0)
    _imports_and_matches(model, original,
                         [rng.standard_normal((n, 4)).astype("float32") for n in (3, 5)],
                         ["n", "8"])


@pytest.mark.parametrize("dims, shape, output_dims", [
    (["n", 1], [3, 1, 2], ["3", "n", "2"]),       # the shape has the higher rank
    (["b", 1, 4], [2, 1], ["b", "2", "4"]),       # the input has the higher rank
    (["b", "s"], [1], ["b", "s"]),                # every dimension from the input
])
def test_an_expand_of_a_symbolic_shape_broadcasts_to_the_same_output_shape(
        dims, shape, output_dims):
    output = [int(d) if d.isdigit() else d for d in output_dims]
    model, original = _expand(dims, shape, output=output), _expand(dims, shape, output=output)
    assert symbolic_expand_shapes(model) == 1
    sizes = [{"n": 1, "b": 2, "s": 3}.get(d, d) if isinstance(d, str) else d for d in dims]
    other = [{"n": 4, "b": 3, "s": 2}.get(d, d) if isinstance(d, str) else d for d in dims]
    rng = np.random.default_rng(1)
    _imports_and_matches(model, original,
                         [rng.standard_normal(s).astype("float32") for s in (sizes, other)],
                         output_dims)


@pytest.mark.parametrize("case", ["static input", "shape read at run time", "opset 14",
                                  "rank unknown", "symbolic dimension broadcast"])
def test_other_expands_are_left_to_the_importer(case):
    # the last: n must be 1 or 4, and TVM's importer refuses a constant meeting a symbol
    model = _expand([2, 1] if case == "static input" else ["n", 1],
                    [4, 2] if case == "symbolic dimension broadcast" else [1, 2],
                    opset=14 if case == "opset 14" else 18)
    if case == "shape read at run time":
        model.graph.node[0].CopyFrom(helper.make_node("Shape", ["x"], ["shape"]))
    if case == "rank unknown":
        model.graph.input[0].type.tensor_type.ClearField("shape")
    before = model.SerializeToString()
    assert symbolic_expand_shapes(model) == 0
    assert model.SerializeToString() == before
