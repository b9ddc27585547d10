"""Relay's divide/multiply re-association: which equivalent patterns the matcher tries."""

from __future__ import annotations

from tvm import relax

import patternkit as pk
from patternkit.dpl.association import reassociations
from patternkit.dpl.pattern import pattern_to_text, root_op_names


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


def _two_step(first, second):
    """``main(a, b, c)``: ``t = first(b, c)`` then the result ``second(a, t)``, in ANF."""
    a, b, c = (relax.Var(n, relax.TensorType((4,), "float32")) for n in "abc")
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b, c]):
        with bb.dataflow():
            inner = bb.emit(first(b, c))
            out = bb.emit_output(second(a, inner))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod):
    return [b.value.op.name for b in mod["main"].body.blocks[0].bindings]


def _callback(pattern, build):
    class Rewrite(pk.DFPatternCallback):
        def __init__(self):
            super().__init__()
            self.pattern = pattern

        def callback(self, pre, post, node_map):
            return build(node_map)

    return Rewrite()


def test_a_rewrite_tries_the_root_the_matcher_reassociates_to():
    """``match`` accepts ``a * (b / c)`` for ``(x * y) / z``: the rewrite must try the
    multiply binding too, not only bindings calling the pattern's own root operator.
    """
    mod = _two_step(relax.op.divide, relax.op.multiply)
    x, y, z = pk.wildcard(), pk.wildcard(), pk.wildcard()
    pattern = (x * y) / z
    assert pk.match(pattern, mod["main"].body.blocks[0].bindings[-1].var, mod["main"])
    out = pk.rewrite(_callback(pattern, lambda m: relax.op.subtract(
        relax.op.multiply(m[x][0], m[y][0]), m[z][0])), mod)
    assert _ops(out) == ["relax.multiply", "relax.subtract"]
    assert _ops(mod) == ["relax.divide", "relax.multiply"]  # the input is not changed


def test_a_multiply_pattern_over_a_divide_is_tried_at_a_divide_root():
    mod = _two_step(relax.op.multiply, lambda a, t: relax.op.divide(t, a))
    x, y, z = pk.wildcard(), pk.wildcard(), pk.wildcard()
    pattern = x * (y / z)
    assert pk.match(pattern, mod["main"].body.blocks[0].bindings[-1].var, mod["main"])
    assert root_op_names(pattern) == {"relax.multiply", "relax.divide"}
    assert root_op_names(pk.wildcard() * pk.wildcard()) == {"relax.multiply"}
    out = pk.rewrite(_callback(pattern, lambda m: relax.op.add(m[x][0], m[z][0])), mod)
    assert _ops(out) == ["relax.add"]


def test_a_rule_rewriting_one_association_into_the_other_settles():
    """``x * (y / z)`` -> ``(x * y) / z`` matches its own result at the divide root (the
    matcher re-associates it): that replacement recomputes the match and is declined, so
    the rewrite settles instead of running to its round limit.
    """
    mod = _two_step(relax.op.divide, relax.op.multiply)
    x, y, z = pk.wildcard(), pk.wildcard(), pk.wildcard()
    log = pk.RewriteLog()
    out = pk.rewrite(_callback(x * (y / z), lambda m: relax.op.divide(
        relax.op.multiply(m[x][0], m[y][0]), m[z][0])), mod, log=log)
    assert _ops(out) == ["relax.multiply", "relax.divide"]
    assert len(log.records) == 1
    again = pk.RewriteLog()
    assert _ops(pk.rewrite(_callback(x * (y / z), lambda m: relax.op.divide(
        relax.op.multiply(m[x][0], m[y][0]), m[z][0])), out, log=again)) == _ops(out)
    assert not again.records and not again.skipped  # its own result: nothing to report


def test_an_integer_nest_is_matched_as_written_since_integer_division_truncates():
    """``(a * c) / b`` of int32 is not ``(a / b) * c``: 3 * 5 / 2 is 7, 3 / 2 * 5 is 5."""
    def nest(dtype):
        a, b, c = (relax.Var(n, relax.TensorType((4,), dtype)) for n in "abc")
        bb = relax.BlockBuilder()
        with bb.function("main", [a, b, c]):
            with bb.dataflow():
                product = bb.emit(relax.op.multiply(a, c))
                out = bb.emit_output(relax.op.divide(product, b))
            bb.emit_func_output(out)
        return bb.get()

    x, y, z = pk.wildcard(), pk.wildcard(), pk.wildcard()
    pattern = (x / y) * z
    for dtype, matches in (("int32", False), ("int64", False), ("float32", True),
                           ("float16", True)):
        mod = nest(dtype)
        root = mod["main"].body.blocks[0].bindings[-1].var
        assert pk.match(pattern, root, mod["main"]) is matches, dtype
        out = pk.rewrite(_callback(pattern, lambda m: relax.op.multiply(
            relax.op.divide(m[x][0], m[y][0]), m[z][0])), mod)
        assert (_ops(out) != _ops(mod)) is matches, dtype
