"""Relay's divide/multiply re-association: which equivalent patterns the matcher tries."""

from __future__ import annotations

from tvm import relax

import patternkit as pk
from patternkit.dpl.association import reassociations
from patternkit.dpl.pattern import pattern_to_text


def tensor(name):
    return relax.Var(name, relax.TensorType((2, 3), "float32"))


def no_bindings(expr):
    return expr


def args_of(call):
    return list(call.args)


def test_a_divide_pattern_against_a_multiply_of_a_divide_gets_both_associated_forms():
    g, s, q = tensor("g"), tensor("s"), tensor("q")
    pattern = (pk.is_var("g") * pk.is_var("s")) / pk.is_var("q")
    call = relax.op.multiply(g, relax.op.divide(s, q))
    forms = [pattern_to_text(p) for p in reassociations(pattern, call, args_of, no_bindings)]
    assert forms == ["multiply(var(s), divide(var(g), var(q)))",
                     "multiply(var(g), divide(var(s), var(q)))"]


def test_a_multiply_pattern_against_a_divide_of_a_multiply_moves_the_divide_out():
    g, s, q = tensor("g"), tensor("s"), tensor("q")
    pattern = pk.is_var("g") * (pk.is_var("s") / pk.is_var("q"))
    call = relax.op.divide(relax.op.multiply(g, s), q)
    forms = [pattern_to_text(p) for p in reassociations(pattern, call, args_of, no_bindings)]
    assert forms == ["divide(multiply(var(s), var(g)), var(q))"]


def test_nothing_is_proposed_without_the_nested_operator_or_for_other_operators():
    g, s, q = tensor("g"), tensor("s"), tensor("q")
    divide_pattern = (pk.wildcard() * pk.wildcard()) / pk.wildcard()
    plain_multiply = relax.op.multiply(g, relax.op.add(s, q))
    assert reassociations(divide_pattern, plain_multiply, args_of, no_bindings) == []
    add_pattern = pk.wildcard() + pk.wildcard()
    assert reassociations(add_pattern, relax.op.add(g, s), args_of, no_bindings) == []


def test_the_nested_operator_is_found_through_a_binding():
    g, s, q = tensor("g"), tensor("s"), tensor("q")
    bound = relax.Var("d", relax.TensorType((2, 3), "float32"))
    values = {bound: relax.op.divide(s, q)}
    pattern = (pk.wildcard() * pk.wildcard()) / pk.wildcard()
    call = relax.op.multiply(g, bound)
    assert len(reassociations(pattern, call, args_of, lambda e: values.get(e, e))) == 2
    assert reassociations(pattern, call, args_of, no_bindings) == []
