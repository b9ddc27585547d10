"""Fused-function kinds: which attribute makes which kind, for DefuseOps and the visualiser."""

from __future__ import annotations

import pytest
from tvm import relax

from patternkit.ir.kinds import FunctionKind, cluster_kind, function_kinds, is_fused


def function(**attrs):
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    func = relax.Function([x], relax.SeqExpr([], x), ret_ty=x.ty)
    for key, value in attrs.items():
        func = func.with_attr(key, value)
    return func


def test_an_ordinary_function_has_no_kind_and_is_not_fused():
    plain = function(global_symbol="main")
    assert function_kinds(plain) == frozenset()
    assert not is_fused(plain)
    assert cluster_kind(plain) == ("function", "")


@pytest.mark.parametrize("attrs, kinds", [
    ({"Primitive": True}, {FunctionKind.PRIMITIVE}),
    ({"Composite": "dnnl.conv2d_relu"}, {FunctionKind.COMPOSITE}),
    ({"Codegen": "dnnl"}, {FunctionKind.CODEGEN}),
    ({"PartitionedFromPattern": "add_relu_"}, {FunctionKind.PARTITION}),
    # FuseOpsByPattern marks composites Primitive too: they are composites only, so that
    # undoing FuseOps leaves pattern-based composites alone
    ({"Primitive": True, "Composite": "dnnl.conv2d_relu"}, {FunctionKind.COMPOSITE}),
    ({"Codegen": "dnnl", "Composite": "dnnl.add"}, {FunctionKind.CODEGEN, FunctionKind.COMPOSITE}),
])
def test_function_kinds_follow_the_fusion_attributes(attrs, kinds):
    func = function(**attrs)
    assert function_kinds(func) == kinds
    assert is_fused(func)


def test_a_primitive_attribute_set_to_false_is_not_a_primitive_kind():
    assert function_kinds(function(Primitive=False)) == frozenset()


def test_function_kinds_compare_equal_to_the_names_defuse_ops_takes():
    assert FunctionKind.PRIMITIVE == "primitive" and str(FunctionKind.PARTITION) == "partition"
    assert {k.value for k in FunctionKind} == {"primitive", "composite", "codegen", "partition"}


@pytest.mark.parametrize("attrs, drawn_as", [
    ({"Codegen": "dnnl"}, ("codegen", "dnnl")),
    ({"Compiler": "ccompiler"}, ("codegen", "ccompiler")),  # Relay's name of Codegen
    ({"Composite": "dnnl.conv2d_relu", "Primitive": True}, ("composite", "dnnl.conv2d_relu")),
    ({"PartitionedFromPattern": "add_relu_"}, ("partition", "add_relu_")),
    ({"Primitive": True}, ("primitive", "")),
])
def test_cluster_kind_names_the_box_the_visualiser_draws(attrs, drawn_as):
    assert cluster_kind(function(**attrs)) == drawn_as
