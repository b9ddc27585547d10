"""ONNX entries: torch.onnx exports at opset 14 and 17, and a hand-made conv + batch norm.

Reference: onnx's ``ReferenceEvaluator`` on the same graph; float32 tolerance
``rtol=1e-4, atol=1e-4`` (errors seen: about 2e-6).
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from patternkit.ir import op_name, var_name
from patternkit.ir.walk import vars_read
from patternkit.models.onnx_models import fold_static_shape_gathers  # noqa: E402

pytestmark = pytest.mark.models

FLOAT32 = dict(rtol=1e-4, atol=1e-4)


def _ops(mod, func="main"):
    return [op_name(b.value) for block in mod[func].body.blocks for b in block.bindings]


@pytest.mark.parametrize("name, opset", [("onnx:gpt2", 14), ("onnx:bert", 17),
                                         ("onnx:conv_bn", 17)])
def test_the_onnx_import_is_well_formed_and_matches_the_reference_evaluator(
        name, opset, zoo, zoo_vm):
    model = zoo(name, opset=opset)
    assert relax.analysis.check_well_formed(model.mod)
    np.testing.assert_allclose(zoo_vm(model)(), model.reference()[0], **FLOAT32)


def test_opset_14_writes_layer_norm_out_and_opset_17_keeps_it_fused(zoo):
    written_out = zoo("onnx:gpt2", opset=14)
    fused = zoo("onnx:gpt2", opset=17)
    assert "relax.nn.layer_norm" not in _ops(written_out.mod)
    assert "LayerNormalization" not in written_out.metadata["onnx_ops"]
    assert _ops(fused.mod).count("relax.nn.layer_norm") == fused.families["layernorm"] == 3


def test_bert_takes_token_types_through_onnx(zoo):
    model = zoo("onnx:bert", opset=14)
    assert [var_name(p) for p in model.mod["main"].params] == [
        "input_ids", "token_type_ids", "attention_mask"]
    assert model.input_ranges["token_type_ids"] == (0, 2)


def test_conv_bn_keeps_the_dead_batch_norm_statistics_the_importer_emits(zoo):
    model = zoo("onnx:conv_bn")
    bindings = [b for block in model.mod["main"].body.blocks for b in block.bindings]
    read = {v for b in bindings for v in vars_read(b.value)}
    read |= set(vars_read(model.mod["main"].body.body))
    dead = [b for b in bindings if b.var not in read]
    # batch_norm's mean and variance outputs: read by nobody
    assert [b.value.index for b in dead if isinstance(b.value, relax.TupleGetItem)] == [1, 2]
    assert "relax.nn.batch_norm" in _ops(model.mod)


def test_a_dynamic_batch_is_symbolic_through_onnx(zoo, zoo_vm):
    model = zoo("onnx:conv_bn", batch="dynamic")
    assert str(model.mod["main"].params[0].ty.shape[0]) == model.symbolic_dims["batch"]
    inputs = model.make_inputs(seed=2, batch=3)
    np.testing.assert_allclose(zoo_vm(model)(inputs), model.reference(inputs)[0], **FLOAT32)


@pytest.mark.parametrize("name, opset", [("onnx:gpt2", 14), ("onnx:bert", 17)])
def test_transformers_exported_with_a_dynamic_batch_import_and_match_the_export(
        name, opset, zoo, zoo_vm):
    # TVM 0.27's Range gives the position ids a fresh length when the exporter reads the
    # static sequence length at run time, and the import then failed; the static
    # dimensions are folded first, and the reference runs the export as written
    model = zoo(name, opset=opset, batch="dynamic")
    assert relax.analysis.check_well_formed(model.mod)
    assert any("Gather of static Shape dimensions" in f for f in model.metadata["onnx_fixups"])
    batch_dim, *dims = model.mod["main"].ret_ty.shape
    assert str(batch_dim) == model.symbolic_dims["batch"]
    for batch in (1, 3):
        inputs = model.make_inputs(seed=batch, batch=batch)
        expected = model.reference(inputs)[0]
        assert [int(d) for d in dims] == list(expected.shape[1:])  # static: none was lost
        np.testing.assert_allclose(zoo_vm(model)(inputs), expected, **FLOAT32)


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
