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


def _nest_then_add(nest, dtype="float32"):
    """``main(a, b, c, d)``: the divide/multiply ``nest(emit, a, b, c)``, bound step by
    step, then ``+ d`` (so the nest sits below the root)."""
    a, b, c, d = (relax.Var(n, relax.TensorType((4,), dtype)) for n in "abcd")
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b, c, d]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(nest(bb.emit, a, b, c), d))
        bb.emit_func_output(out)
    return bb.get()


def test_below_the_root_a_nest_matches_either_association():
    mod = _nest_then_add(lambda emit, a, b, c: emit(relax.op.multiply(
        a, emit(relax.op.divide(b, c)))))
    x, y, z, w = pk.wildcard(), pk.wildcard(), pk.wildcard(), pk.wildcard()
    pattern = (x * y) / z + w
    assert pk.match(pattern, mod["main"].body.blocks[0].bindings[-1].var, mod["main"])
    out = pk.rewrite(_callback(pattern, lambda m: relax.op.subtract(m[w][0], m[z][0])), mod)
    assert _ops(out) == ["relax.subtract"]


def test_a_rule_that_only_swaps_commutative_operands_settles():
    """``x * y`` -> ``y * x`` matches its own result every round: the replacement computes
    the match as it is (operands of add and multiply in either order), so it is neither a
    rewrite nor a decline, and the rewrite settles instead of running to its round limit.
    """
    mod = _two_step(relax.op.divide, relax.op.multiply)
    x, y = pk.wildcard(), pk.wildcard()
    log = pk.RewriteLog()
    out = pk.rewrite(_callback(x * y, lambda m: relax.op.multiply(m[y][0], m[x][0])), mod,
                     log=log)
    assert _ops(out) == _ops(mod) and not log.records and not log.skipped
    x, y = pk.wildcard(), pk.wildcard()  # an add, the other commutative operator
    swapped = pk.rewrite(_callback(x + y, lambda m: relax.op.add(m[y][0], m[x][0])),
                         _two_step(relax.op.add, relax.op.multiply))
    assert _ops(swapped) == ["relax.add", "relax.multiply"]


def test_an_integer_nest_is_matched_as_written_since_integer_division_truncates():
    """``(a * c) / b`` of int32 is not ``(a / b) * c``: 3 * 5 / 2 is 7, 3 / 2 * 5 is 5."""
    def product_over_b(emit, a, b, c):
        return emit(relax.op.divide(emit(relax.op.multiply(a, c)), b))

    x, y, z, w = pk.wildcard(), pk.wildcard(), pk.wildcard(), pk.wildcard()
    pattern = (x / y) * z + w
    for dtype, matches in (("int32", False), ("int64", False), ("float32", True),
                           ("float16", True)):
        mod = _nest_then_add(product_over_b, dtype)
        root = mod["main"].body.blocks[0].bindings[-1].var
        assert pk.match(pattern, root, mod["main"]) is matches, dtype
        out = pk.rewrite(_callback(pattern, lambda m: relax.op.subtract(m[w][0], m[y][0])),
                         mod)
        assert (_ops(out) != _ops(mod)) is matches, dtype
