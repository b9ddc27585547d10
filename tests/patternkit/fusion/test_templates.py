"""Callee templates: a fused function read once, instantiated at each call site."""

from __future__ import annotations

import tvm_ffi
from tvm import relax

from patternkit.fusion.templates import (
    CalleeTemplate,
    CallTemplate,
    OpaqueTemplate,
    TupleTemplate,
    VarTemplate,
)


def tensor(name, shape=(2, 3)):
    return relax.Var(name, relax.TensorType(shape, "float32"))


def add_relu(returns_tuple=False):
    """``s = x + y; r = relu(s)``, returning ``r`` or the literal tuple ``(s, r)``."""
    x, y = tensor("x"), tensor("y")
    s, r = tensor("s"), tensor("r")
    block = relax.DataflowBlock([relax.VarBinding(s, relax.op.add(x, y)),
                                 relax.VarBinding(r, relax.op.nn.relu(s))])
    result = relax.Tuple([s, r]) if returns_tuple else r
    ret_ty = relax.TupleType([s.ty, r.ty]) if returns_tuple else r.ty
    body = relax.SeqExpr([block], result)
    return relax.BlockBuilder().normalize(relax.Function([x, y], body, ret_ty=ret_ty))


def test_a_template_records_each_binding_and_the_bound_result():
    func = add_relu()
    tpl = CalleeTemplate(func, num_params=2)
    assert [b.name for b in tpl.bindings] == ["s", "r"]
    assert [b.is_result for b in tpl.bindings] == [False, True]
    assert tpl.result_is_bound and not tpl.returns_tuple
    assert all(type(b.value) is CallTemplate and not b.may_call for b in tpl.bindings)


def test_instantiating_a_call_substitutes_the_arguments_and_keeps_the_type():
    func = add_relu()
    tpl = CalleeTemplate(func, num_params=2)
    a, b = tensor("a"), tensor("b")
    mapping = dict(zip(tpl.params, [a, b]))
    add = tpl.bindings[0].value.instantiate(mapping)
    assert add.args[0].same_as(a) and add.args[1].same_as(b)
    assert tvm_ffi.structural_equal(add.ty, func.body.blocks[0].bindings[0].var.ty)


def test_a_tuple_result_is_a_template_of_its_own():
    tpl = CalleeTemplate(add_relu(returns_tuple=True), num_params=2)
    assert not tpl.result_is_bound and tpl.returns_tuple
    assert type(tpl.result) is TupleTemplate
    assert [type(f) for f in tpl.result.fields] == [VarTemplate, VarTemplate]


def test_a_trailing_parameter_beyond_the_call_s_arguments_is_not_a_template_parameter():
    func = add_relu()
    assert [p.name for p in CalleeTemplate(func, num_params=1).params] == ["x"]


def test_a_call_through_a_local_function_may_need_inlining_itself():
    p = tensor("p")
    inner = relax.Function([p], relax.SeqExpr([], relax.op.nn.relu(p)), ret_ty=p.ty)
    x = tensor("x")
    bb = relax.BlockBuilder()
    with bb.function("outer", [x]):
        f = bb.emit(inner, "f")
        out = bb.emit(relax.Call(f, [x]), "out")
        bb.emit_func_output(out)
    tpl = CalleeTemplate(bb.get()["outer"], num_params=1)
    local, call = tpl.bindings
    assert type(local.value) is OpaqueTemplate and local.binds_function and local.may_call
    assert type(call.value.op) is VarTemplate and call.may_call
