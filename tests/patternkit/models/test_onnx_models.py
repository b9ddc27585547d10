"""ONNX entries: torch.onnx exports at opset 14 and 17, and a hand-made conv + batch norm.

Reference: onnx's ``ReferenceEvaluator`` on the same graph; float32 tolerance
``rtol=1e-4, atol=1e-4`` (errors seen: about 2e-6).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from patternkit.ir import op_name, var_name
from patternkit.ir.walk import vars_read

pytestmark = pytest.mark.models

FLOAT32 = dict(rtol=1e-4, atol=1e-4)


def _ops(mod, func="main"):
    return [op_name(b.value) for block in mod[func].body.blocks for b in block.bindings]


@pytest.mark.parametrize("name, opset", [("onnx:gpt2", 14), ("onnx:bert", 17),
                                         ("onnx:conv_bn", 17), ("onnx:t5", 14)])
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


@pytest.mark.parametrize("name, opset, dynamic", [
    ("onnx:gpt2", 14, ("batch",)), ("onnx:bert", 17, ("batch",)),
    ("onnx:gpt2", 17, ("batch", "seq")), ("onnx:bert", 14, ("batch", "seq"))])
def test_transformers_exported_with_dynamic_dims_import_and_match_the_export(
        name, opset, dynamic, zoo, zoo_vm):
    # TVM 0.27's Range gives the position ids a fresh length (the exporter reads the
    # sequence length at run time), every later shape is lost and the import failed; the
    # graph is rewritten first (onnx_fixups), and the reference runs the export as written
    model = zoo(name, opset=opset, **{role: "dynamic" for role in dynamic})
    assert relax.analysis.check_well_formed(model.mod)
    assert model.metadata["onnx_fixups"]
    batch_dim, seq_dim, _ = model.mod["main"].ret_ty.shape  # symbolic where asked, else static
    assert [str(d) if tvm.ir.is_prim_var(d) else int(d) for d in (batch_dim, seq_dim)] == [
        model.symbolic_dims.get(role, model.sizes[role]) for role in ("batch", "seq")]
    for batch, seq in ((1, 5), (3, 8)):
        sizes = {"batch": batch, "seq": seq}
        inputs = model.make_inputs(seed=batch, **{role: sizes[role] for role in dynamic})
        expected = model.reference(inputs)[0]
        np.testing.assert_allclose(zoo_vm(model)(inputs), expected, **FLOAT32)


# -- the dynamo exporter (torch.onnx.export(dynamo=True), through onnxscript) ------------------
def test_the_dynamo_exporter_at_opset_17_imports_and_matches_the_export(zoo, zoo_vm):
    # the version converter leaves Split(num_outputs=...) at 17, which check_model refused
    # ("Unrecognized attribute: num_outputs for operator Split") until it was repaired
    model = zoo("onnx:gpt2", opset=17, exporter="dynamo")
    assert model.metadata["exporter"] == "torch.onnx.export(dynamo=True)"
    assert model.metadata["onnx_ops"]["LayerNormalization"] == model.families["layernorm"]
    assert relax.analysis.check_well_formed(model.mod)
    np.testing.assert_allclose(zoo_vm(model)(), model.reference()[0], **FLOAT32)


def test_the_dynamo_exporter_cannot_write_a_layer_norm_at_opset_14_and_says_so(zoo):
    from patternkit.models import ZooImportError

    # LayerNormalization has no version before 17: onnx's converter keeps opset 18
    with pytest.raises(ZooImportError, match="wrote opset 18, not 14") as info:
        zoo("onnx:gpt2", opset=14, exporter="dynamo")
    assert "\n" not in str(info.value)


def _split_model(length, parts=2):
    import onnx
    from onnx import TensorProto, helper

    outputs = [f"y{i}" for i in range(parts)]
    graph = helper.make_graph(
        [helper.make_node("Split", ["x"], outputs, axis=1, num_outputs=parts)], "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, length])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, None]) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), onnx


def test_a_split_into_equal_parts_below_opset_18_gets_its_sizes_as_an_input():
    from onnx.reference import ReferenceEvaluator

    from patternkit.models.onnx_models import split_sizes_as_inputs

    model, onnx = _split_model(6)
    with pytest.raises(onnx.checker.ValidationError, match="num_outputs"):
        onnx.checker.check_model(model)
    assert split_sizes_as_inputs(model) == 1
    onnx.checker.check_model(model)
    x = np.arange(12, dtype="float32").reshape(2, 6)
    for got, want in zip(ReferenceEvaluator(model).run(None, {"x": x}), np.split(x, 2, 1)):
        np.testing.assert_array_equal(got, want)


def test_a_split_of_an_indivisible_axis_is_refused_in_one_line():
    from patternkit.models import ZooImportError
    from patternkit.models.onnx_models import split_sizes_as_inputs

    model, _ = _split_model(5)
    with pytest.raises(ZooImportError, match="Split .* 2 parts .* below opset 18"):
        split_sizes_as_inputs(model, "m")
