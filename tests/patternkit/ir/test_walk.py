"""The IR walk: expression kinds, the Vars a value reads, and substitution."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from patternkit.errors import MalformedIRError
from patternkit.ir.compat import handle
from patternkit.ir.walk import (
    KIND_OF,
    LEAF_KINDS,
    ExprKind,
    expr_kind,
    map_type_dims,
    substitute,
    vars_read,
)


def tensor(name, shape=(2, 3), dtype="float32", cls=relax.Var):
    return cls(name, relax.TensorType(shape, dtype))


def bound_function(*params, body):
    """A normalised function computing ``body`` (a nested expression) from ``params``."""
    bb = relax.BlockBuilder()
    with bb.function("main", list(params)):
        with bb.dataflow():
            out = bb.emit_output(body)
        bb.emit_func_output(out)
    return bb.get()["main"]


# ---------------------------------------------------------------------------- kinds
@pytest.mark.parametrize("expr, kind", [
    (tensor("x"), ExprKind.VAR),
    (tensor("x", cls=relax.DataflowVar), ExprKind.VAR),
    (relax.op.add(tensor("x"), tensor("y")), ExprKind.CALL),
    (relax.Tuple([tensor("x")]), ExprKind.TUPLE),
    (relax.TupleGetItem(relax.Tuple([tensor("x")]), 0), ExprKind.GET_ITEM),
    (tvm.ir.Op.get("relax.add"), ExprKind.OP),
    (tvm.ir.GlobalVar("f"), ExprKind.GLOBAL_VAR),
    (relax.const(np.ones(3, "float32")), ExprKind.CONSTANT),
    (relax.prim_value(3), ExprKind.LEAF),
    (relax.ShapeExpr([2, 3]), ExprKind.LEAF),
    (relax.ExternFunc("my_kernel"), ExprKind.LEAF),
    (tvm.ir.StringImm("text"), ExprKind.LEAF),
])
def test_expr_kind_classifies_each_relax_node(expr, kind):
    assert expr_kind(expr) is kind
    assert KIND_OF[type(expr)] is kind  # cached by exact type for the hot loops


def test_expr_kind_tells_functions_and_ifs_from_other_nodes():
    x = tensor("x")
    func = relax.Function([x], relax.SeqExpr([], x), ret_ty=x.ty)
    cond = relax.Var("c", relax.TensorType((), "bool"))
    branch = relax.If(cond, relax.SeqExpr([], x), relax.SeqExpr([], x))
    assert expr_kind(func) is ExprKind.FUNCTION
    assert expr_kind(branch) is ExprKind.IF
    assert expr_kind(relax.SeqExpr([], x)) is ExprKind.OTHER
    assert expr_kind("not IR") is ExprKind.OTHER


def test_leaf_kinds_are_the_kinds_that_read_no_variable():
    assert LEAF_KINDS == {ExprKind.OP, ExprKind.GLOBAL_VAR, ExprKind.CONSTANT, ExprKind.LEAF}


# ---------------------------------------------------------------------------- vars_read
def test_vars_read_lists_a_call_s_callee_then_its_arguments_in_order():
    f, x, y = tensor("f"), tensor("x"), tensor("y")
    call = relax.Call(f, [x, y, x])
    assert [v.name for v in vars_read(call)] == ["f", "x", "y", "x"]


def test_vars_read_enters_tuples_and_tuple_projections():
    x, y, z = tensor("x"), tensor("y"), tensor("z")
    nested = relax.TupleGetItem(relax.Tuple([x, relax.Tuple([y, z])]), 1)
    assert [v.name for v in vars_read(nested)] == ["x", "y", "z"]


def test_vars_read_skips_constants_operators_and_shape_literals():
    x = tensor("x")
    call = relax.op.reshape(relax.op.add(x, relax.const(1.0, "float32")), relax.ShapeExpr([3, 2]))
    assert [v.name for v in vars_read(call)] == ["x"]
    assert vars_read(relax.const(np.zeros(2, "float32"))) == []
    assert vars_read(relax.ShapeExpr([1, 2])) == []


def test_vars_read_does_not_follow_bindings():
    x, y = tensor("x"), tensor("y")
    func = bound_function(x, y, body=relax.op.multiply(relax.op.add(x, y), y))
    last = func.body.blocks[0].bindings[-1]
    assert [v.name for v in vars_read(last.value)][1:] == ["y"]
    assert vars_read(last.value)[0].same_as(func.body.blocks[0].bindings[0].var)


def test_vars_read_of_a_local_function_is_its_free_variables():
    x, y, p = tensor("x"), tensor("y"), tensor("p")
    local = relax.Function([p], relax.SeqExpr([], relax.op.add(p, y)), ret_ty=p.ty)
    assert [v.name for v in vars_read(local)] == ["y"]
    assert [v.name for v in vars_read(relax.Tuple([x, local]))] == ["x", "y"]


# ---------------------------------------------------------------------------- substitute
def test_substitute_replaces_vars_in_calls_tuples_and_projections_and_keeps_types():
    x, y = tensor("x"), tensor("y")
    func = bound_function(x, y, body=relax.op.add(x, y))
    call = func.body.blocks[0].bindings[0].value
    a, b = tensor("a"), tensor("b")
    new = substitute(call, {func.params[0]: a, func.params[1]: b})
    assert [v.name for v in vars_read(new)] == ["a", "b"]
    assert tvm_ffi.structural_equal(new.ty, call.ty)  # typed without re-normalising
    pair = substitute(relax.TupleGetItem(relax.Tuple([x, y]), 1), {y: a})
    assert [v.name for v in vars_read(pair)] == ["x", "a"]


def test_substitute_returns_the_expression_itself_when_nothing_is_mapped():
    x, y = tensor("x"), tensor("y")
    call = relax.op.add(x, relax.Tuple([y])[0])
    assert substitute(call, {tensor("unrelated"): x}) is call


def test_substitute_maps_a_call_s_callee_variable():
    f, x, g = tensor("f"), tensor("x"), tensor("g")
    new = substitute(relax.Call(f, [x]), {f: g})
    assert new.op.same_as(g) and new.args[0].same_as(x)


def test_substitute_by_handle_maps_captured_constants_too():
    x = tensor("x")
    weight = relax.const(np.ones((2, 3), "float32"))
    param = tensor("w")
    call = relax.op.add(x, weight)
    new = substitute(call, {handle(weight): param}, by_handle=True)
    assert new.args[1].same_as(param) and new.args[0].same_as(x)
    # keyed by the Var itself, a constant is never looked up
    assert substitute(call, {weight: param}) is call


def test_substitute_without_types_rebuilds_an_untyped_expression_like_relax_op():
    x, y = tensor("x"), tensor("y")
    func = bound_function(x, y, body=relax.op.add(x, y))
    typed = func.body.blocks[0].bindings[0].value
    untyped = substitute(typed, {}, keep_types=False)
    assert untyped is not typed
    assert not isinstance(untyped.ty, relax.TensorType)
    assert tvm_ffi.structural_equal(untyped, relax.op.add(func.params[0], func.params[1]))


def test_substitute_copies_a_local_function_with_fresh_variables_when_asked():
    p, y = tensor("p"), tensor("y")
    local = relax.BlockBuilder().normalize(
        relax.Function([p], relax.SeqExpr([], relax.op.add(p, y)), ret_ty=p.ty))
    assert substitute(local, {}) is local
    copy = substitute(local, {}, copy_functions=True)
    assert copy is not local and not copy.params[0].same_as(p)
    assert tvm_ffi.structural_equal(copy, local)


def test_substitute_refuses_a_local_function_that_captures_a_mapped_variable():
    p, y = tensor("p"), tensor("y")
    local = relax.Function([p], relax.SeqExpr([], relax.op.add(p, y)), ret_ty=p.ty)
    with pytest.raises(MalformedIRError, match="captures them"):
        substitute(local, {y: tensor("z")})


def test_substitute_maps_symbolic_dims_of_types_and_shape_literals():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n * 2, 3), "float32"))
    func = bound_function(x, body=relax.op.reshape(x, relax.ShapeExpr([n * 6])))
    call = func.body.blocks[0].bindings[0].value
    doubled = substitute(call, {}, map_dim=lambda d: d * 2)
    assert str(doubled.args[1].values[0]) == str(call.args[1].values[0] * 2)
    assert str(doubled.ty.shape[0]) == str(call.ty.shape[0] * 2)


def test_map_type_dims_rewrites_tensor_shape_and_tuple_types():
    n = tvm.tirx.Var("n", "int64")
    ty = relax.TupleType([relax.TensorType((n, 4), "float32"), relax.ShapeType([n])])
    mapped = map_type_dims(ty, lambda d: d + 1)
    assert str(mapped.fields[0].shape[0]) == str(n + 1)
    assert int(mapped.fields[0].shape[1]) == 5
    assert str(mapped.fields[1].values[0]) == str(n + 1)
    unknown = relax.TensorType(ndim=2, dtype="float32")
    assert map_type_dims(unknown, lambda d: d + 1) is unknown


# ---------------------------------------------------------------------- repeats and nesting
def _names_of(vars_) -> list[str]:
    return sorted(v.name for v in vars_)


def test_vars_read_lists_repeats_and_skips_leaves(make_var):
    x, y = make_var("x", (2,)), make_var("y", (2,))
    assert _names_of(vars_read(relax.op.add(x, x))) == ["x", "x"]
    assert vars_read(relax.const(1.0)) == [] and vars_read(relax.ShapeExpr([2, 3])) == []
    assert _names_of(vars_read(relax.op.reshape(x, [2, 1]))) == ["x"]  # a shape reads nothing
    assert _names_of(vars_read(relax.TupleGetItem(relax.Tuple([x, relax.const(2.0), y]), 1))) \
        == ["x", "y"]


def test_vars_read_sees_a_called_local_function_and_the_free_vars_of_a_nested_one(make_var):
    x, y, z = make_var("x", (2,)), make_var("y", (2,)), make_var("z", (2,))
    f = relax.Var("f", relax.FuncType([relax.TensorType((2,), "float32")],
                                      relax.TensorType((2,), "float32")))
    assert _names_of(vars_read(relax.Call(f, [x]))) == ["f", "x"]
    nested = relax.Function([z], relax.SeqExpr([], relax.op.add(z, y)),
                            ret_ty=relax.TensorType((2,), "float32"))
    assert _names_of(vars_read(nested)) == ["y"]  # its own parameter is not read from outside
