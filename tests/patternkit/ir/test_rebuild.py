"""Rebuilding functions around new blocks, and the one-line binding text of error messages."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from patternkit.ir.rebuild import (
    binding_text,
    describe_binding,
    expr_text,
    make_block,
    rebuild_function,
)


def tensor(name, shape=(2, 3)):
    return relax.Var(name, relax.TensorType(shape, "float32"))


def add_relu_function():
    x, y = tensor("x"), tensor("y")
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y], attrs={"my_attr": "kept"}):
        with bb.dataflow():
            s = bb.emit(relax.op.add(x, y), "s")
            out = bb.emit_output(relax.op.nn.relu(s), "out")
        bb.emit_func_output(out)
    return bb.get()["main"]


def test_make_block_makes_a_dataflow_block_or_a_binding_block():
    x = tensor("x")
    binding = relax.VarBinding(relax.Var("v", x.ty), x)
    assert type(make_block([binding], True)) is relax.DataflowBlock
    assert type(make_block([binding], False)) is relax.BindingBlock
    assert make_block([binding], True).bindings[0].same_as(binding)


def test_rebuild_function_keeps_signature_attributes_and_result_around_new_blocks():
    func = add_relu_function()
    (block,) = func.body.blocks
    s_binding, out_binding = block.bindings
    # the relu now reads x directly: the add is gone
    x = func.params[0]
    new_out = relax.VarBinding(out_binding.var, relax.op.nn.relu(x))
    rebuilt = rebuild_function(func, [make_block([new_out], True)])
    assert rebuilt is not func and [p.name for p in rebuilt.params] == ["x", "y"]
    assert rebuilt.attrs["my_attr"] == "kept"
    assert rebuilt.body.body.same_as(func.body.body)
    assert tvm_ffi.structural_equal(rebuilt.ret_ty, func.ret_ty)
    assert isinstance(rebuilt.body.ty, relax.TensorType)  # normalised: the body is typed
    assert relax.analysis.check_well_formed(tvm.IRModule({"main": rebuilt}))
    assert len(func.body.blocks[0].bindings) == 2  # the input is untouched


def test_rebuild_function_takes_a_whole_seq_expr_and_new_parameters():
    func = add_relu_function()
    new_x = tensor("new_x")
    body = relax.SeqExpr([], relax.op.nn.relu(new_x))
    rebuilt = rebuild_function(func, body, params=[new_x],
                               ret_ty=relax.TensorType((2, 3), "float32"))
    assert [p.name for p in rebuilt.params] == ["new_x"]
    assert relax.analysis.check_well_formed(tvm.IRModule({"main": rebuilt}))


def test_expr_text_is_one_line_cut_at_the_limit():
    func = add_relu_function()
    text = expr_text(func, limit=40)
    assert "\n" not in text and text.endswith("...") and len(text) == 43
    assert "\n" in str(func) and "  " not in expr_text(func, limit=None)


def test_expr_text_survives_a_printer_that_raises():
    class Unprintable:
        def __str__(self):
            raise RuntimeError("printer bug")

    assert expr_text(Unprintable()) == "Unprintable"


def test_binding_text_and_describe_binding_name_the_variable_and_the_function():
    func = add_relu_function()
    s_binding = func.body.blocks[0].bindings[0]
    assert binding_text(s_binding.var, s_binding.value) == "s = R.add(x, y)"
    assert describe_binding("main", s_binding) == "main: s = R.add(x, y)"
    typed = binding_text(s_binding.var, s_binding.value, with_type=True)
    assert typed.startswith("s: R.Tensor((2, 3), dtype=\"float32\") = R.add")
    assert binding_text(s_binding.var, s_binding.value, limit=5) == "s = R.add..."
