"""The import's error names who is at fault: the exporter's graph, or TVM's importer."""

import pytest

from patternkit.models.importing import from_onnx_model
from patternkit.models.zoomodel import ZooImportError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def _model(nodes, inputs, output):
    graph = helper.make_graph(nodes, "g", inputs, [output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_graph_onnx_itself_refuses_is_blamed_on_the_exporter():
    """A ``Mul`` of (2, 3) and (2, 4), as the TorchScript exporter writes GPT-J's rotation."""
    model = _model([helper.make_node("Mul", ["a", "b"], ["y"])],
                   [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                    helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 4])],
                   helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]))
    with pytest.raises(ZooImportError) as caught:
        from_onnx_model(model, keep_params=False, entry="main", text="bad.onnx", seconds={})
    message = str(caught.value)
    assert message.startswith("bad.onnx: the exported ONNX graph is not valid (onnx.checker")
    assert "Incompatible dimensions" in message and "TVM" not in message
    assert "\n" not in message


def test_a_valid_graph_tvm_cannot_import_is_blamed_on_tvm():
    """``Shape(x + Range(0, Shape(x)[1]))[0]``: valid ONNX (docs/tvm-bugs.md entry)."""
    def constant(name, proto, value):
        return helper.make_node("Constant", [], [name],
                                value=helper.make_tensor(name, proto, [], [value]))

    nodes = [helper.make_node("Shape", ["x"], ["s"]), constant("i1", TensorProto.INT64, 1),
             helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             constant("z", TensorProto.FLOAT, 0.0), constant("one", TensorProto.FLOAT, 1.0),
             helper.make_node("Range", ["z", "nf", "one"], ["r"]),
             helper.make_node("Add", ["x", "r"], ["y"]),
             helper.make_node("Shape", ["y"], ["sy"]), constant("i0", TensorProto.INT64, 0),
             helper.make_node("Gather", ["sy", "i0"], ["out"], axis=0)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n"])],
                   helper.make_tensor_value_info("out", TensorProto.INT64, []))
    with pytest.raises(ZooImportError) as caught:
        from_onnx_model(model, keep_params=False, entry="main", text="ok.onnx", seconds={})
    assert str(caught.value).startswith("ok.onnx: from_onnx failed in TVM ")


def test_a_program_taking_a_constant_input_names_it_in_one_line():
    # model(x, return_dict=False) exported with the flag as a keyword argument: the bool
    # becomes an input of the program, and TVM's importer fails on it with
    # "'bool' object has no attribute 'shape'"
    torch = pytest.importorskip("torch")
    from patternkit.models.importing import from_torch

    class Flagged(torch.nn.Module):
        def forward(self, x, return_dict=True):
            return x * 2.0 if return_dict else x - 1.0

    program = torch.export.export(Flagged(), (torch.randn(2, 3),), {"return_dict": False})
    with pytest.raises(ZooImportError) as caught:
        from_torch(program, False, "main", "flagged.pt2", {})
    message = str(caught.value)
    assert message.startswith("flagged.pt2: the program takes return_dict=False as input(s), "
                              "which from_exported_program")
    assert "export a function that fixes them" in message and "\n" not in message
