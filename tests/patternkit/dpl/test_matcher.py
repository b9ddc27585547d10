"""The matcher: Relay's matching semantics on Relax's A-normal form.

What a match records (captures, the bindings it looked through, its inputs) is what the
rewrite engine replaces and what a rule's callback reads, so each rule of the matcher is
checked on what it records, not only on whether it matched.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

import patternkit as pk

T = relax.TensorType((2, 3), "float32")


def _function(build, *param_names, pure=True):
    """``main`` built by ``build(bb, *params)``, and its parameters and bound Vars by name."""
    params = [relax.Var(name, T) for name in param_names]
    bb = relax.BlockBuilder()
    with bb.function("main", params, pure=pure):
        build(bb, *params)
    func = bb.get()["main"]
    named = {p.name: p for p in func.params}
    named.update({b.var.name: b.var for block in func.body.blocks for b in block.bindings})
    return func, named


def _names(exprs) -> list[str]:
    return [e.name for e in exprs]


# ---------------------------------------------------------------------- commutativity
def test_only_add_and_multiply_match_with_swapped_operands_capturing_accordingly(make_var):
    x, y = make_var("x", (2, 3)), make_var("y", (2, 3))
    w, v = pk.wildcard(), pk.wildcard()
    for op, pattern_op in ((relax.op.add, "add"), (relax.op.multiply, "multiply")):
        pattern = pk.is_op(pattern_op)(pk.is_op("exp")(w), v)
        found = pk.dpl.find_match(pattern, op(y, relax.op.exp(x)))
        assert found is not None, pattern_op
        assert found.captures[w].same_as(x) and found.captures[v].same_as(y)
    # maximum commutes too, but Relay's matcher only swaps the operands of add and multiply
    for name in ("subtract", "divide", "maximum"):
        pattern = pk.is_op(name)(pk.is_op("exp")(w), v)
        assert pk.dpl.find_match(pattern, getattr(relax.op, name)(y, relax.op.exp(x))) is None, name


def test_a_failed_operand_order_leaves_no_trace_in_the_match():
    def build(bb, x, y):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(x), "e")
            s = bb.emit(relax.op.sigmoid(y), "s")
            out = bb.emit_output(relax.op.add(e, s), "out")
        bb.emit_func_output(out)

    func, v = _function(build, "x", "y")
    first, second = pk.wildcard(), pk.wildcard()
    # as written, exp|sigmoid takes e and then exp(...) fails on s; swapped, both fit
    pattern = pk.is_op("add")((pk.is_op("exp") | pk.is_op("sigmoid"))(first),
                              pk.is_op("exp")(second))
    found = pk.dpl.find_match(pattern, v["out"], func)
    assert found.captures[first].same_as(v["y"]) and found.captures[second].same_as(v["x"])
    assert _names(found.internal) == ["out", "s", "e"]  # first-visit order of the swap
    assert _names(found.inputs) == ["y", "x"]


# ---------------------------------------------------------------------- re-association
def test_divide_of_multiply_matches_every_associated_form_with_the_same_captures(make_var):
    g, s, q = (make_var(n, (3,)) for n in "gsq")
    a, b, c = pk.wildcard(), pk.wildcard(), pk.wildcard()
    pattern = a * b / c
    forms = {"(g * s) / q": relax.op.divide(relax.op.multiply(g, s), q),
             "g * (s / q)": relax.op.multiply(g, relax.op.divide(s, q)),
             "(g / q) * s": relax.op.multiply(relax.op.divide(g, q), s),
             "(s / q) * g": relax.op.multiply(relax.op.divide(s, q), g)}
    for form, expr in forms.items():
        found = pk.dpl.find_match(pattern, expr)
        assert found is not None, form
        captured = {found.captures[p].name for p in (a, b)}
        assert captured == {"g", "s"} and found.captures[c].same_as(q), form
    assert pk.dpl.find_match(pattern, relax.op.divide(g, relax.op.multiply(s, q))) is None


def test_multiply_of_divide_matches_divide_of_multiply_through_bindings():
    def build(bb, g, s, q):
        with bb.dataflow():
            m = bb.emit(relax.op.multiply(g, s), "m")
            out = bb.emit_output(relax.op.divide(m, q), "out")
        bb.emit_func_output(out)

    func, v = _function(build, "g", "s", "q")
    a, b, c = pk.wildcard(), pk.wildcard(), pk.wildcard()
    found = pk.dpl.find_match(a * (b / c), v["out"], func)
    assert found is not None
    # a * (b / c) == (b * a) / c: multiply commutes, so a and b may take g and s either way
    assert {found.captures[a].name, found.captures[b].name} == {"g", "s"}
    assert found.captures[c].same_as(v["q"])
    assert _names(found.internal) == ["out", "m"]


# ---------------------------------------------------------------------- diamonds
def test_a_shared_sub_pattern_must_meet_the_same_binding_twice():
    def build(bb, x):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(x), "e")
            e2 = bb.emit(relax.op.exp(x), "e2")
            same = bb.emit_output(relax.op.add(e, e), "same")
            equal = bb.emit_output(relax.op.add(e, e2), "equal")
        bb.emit_func_output(relax.Tuple([same, equal]))

    func, v = _function(build, "x")
    shared = pk.is_op("exp")(pk.wildcard())
    pattern = pk.is_op("add")(shared, shared)
    found = pk.dpl.find_match(pattern, v["same"], func)
    assert found is not None and _names(found.internal) == ["same", "e"]
    # two bindings of equal values are two expressions, as in Relay's graphs
    assert pk.dpl.find_match(pattern, v["equal"], func) is None


def test_a_wildcard_used_twice_binds_one_expression(make_var):
    x, y = make_var("x", (2, 3)), make_var("y", (2, 3))
    w = pk.wildcard()
    pattern = pk.is_op("add")(w, pk.is_op("exp")(w))
    assert pk.match(pattern, relax.op.add(x, relax.op.exp(x)))
    assert not pk.match(pattern, relax.op.add(y, relax.op.exp(x)))
    found = pk.dpl.find_match(pattern, relax.op.add(relax.op.exp(x), x))  # swapped operands
    assert found is not None and _names(found.inputs) == ["x"]


def test_a_failed_alternative_leaves_no_trace():
    def build(bb, x):
        with bb.dataflow():
            s = bb.emit(relax.op.sigmoid(x), "s")
            e = bb.emit(relax.op.exp(s), "e")
            out = bb.emit_output(relax.op.nn.relu(e), "out")
        bb.emit_func_output(out)

    func, v = _function(build, "x")
    w, deep = pk.wildcard(), pk.wildcard()
    # the left branch looks through e and s before failing on sigmoid
    pattern = pk.is_op("nn.relu")(pk.is_op("exp")(pk.is_op("exp")(deep))) \
        | pk.is_op("nn.relu")(w)
    found = pk.dpl.find_match(pattern, func.body.blocks[0].bindings[2].value, func)
    assert found.internal == [] and _names(found.inputs) == ["e"]
    assert found.captures[w].same_as(v["e"]) and deep not in found.captures


# ---------------------------------------------------------------------- look-through rules
def test_wildcards_capture_the_var_and_call_patterns_capture_the_value_behind_it():
    def build(bb, x):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(x), "e")
            out = bb.emit_output(relax.op.nn.relu(e), "out")
        bb.emit_func_output(out)

    func, v = _function(build, "x")
    w = pk.wildcard()
    inner = pk.is_op("exp")(w)
    assert pk.dpl.find_match(pk.is_op("nn.relu")(w), v["out"], func).captures[w].same_as(v["e"])
    found = pk.dpl.find_match(pk.is_op("nn.relu")(inner), v["out"], func)
    assert isinstance(found.captures[inner], relax.Call)
    assert found.bound_vars[inner].same_as(v["e"]) and found.captures[w].same_as(v["x"])


def test_a_constant_pattern_looks_through_a_var_bound_to_a_constant():
    def build(bb, x):
        with bb.dataflow():
            c = bb.emit(relax.const(np.ones((2, 3), "float32")), "c")
            out = bb.emit_output(relax.op.add(x, c), "out")
        bb.emit_func_output(out)

    func, v = _function(build, "x")
    pattern = pk.wildcard() + pk.is_constant()
    found = pk.dpl.find_match(pattern, v["out"], func)
    assert found is not None and _names(found.internal) == ["out", "c"]
    # without the function the binding is unknown, and a Var is not a constant
    assert not pk.match(pattern, func.body.blocks[0].bindings[1].value)


def test_impure_calls_are_never_looked_through():
    def build(bb, x):
        packed = bb.emit(relax.Call(relax.ExternFunc("my_kernel"), [x], None, [T]), "packed")
        out = bb.emit(relax.op.nn.relu(packed), "out")
        bb.emit_func_output(out)

    func, v = _function(build, "x", pure=False)
    any_call = pk.wildcard()(None)
    assert pk.match(any_call, func.body.blocks[0].bindings[0].value)  # it is a call
    assert not pk.match(pk.is_op("nn.relu")(any_call), v["out"], func)
    assert pk.match(pk.is_op("nn.relu")(pk.wildcard()), v["out"], func)


def test_bindings_outside_dataflow_blocks_are_looked_through_by_match():
    def build(bb, x):
        e = bb.emit(relax.op.exp(x), "e")
        out = bb.emit(relax.op.nn.relu(e), "out")
        bb.emit_func_output(out)

    func, v = _function(build, "x")
    assert pk.match(pk.is_op("nn.relu")(pk.is_op("exp")(pk.wildcard())), v["out"], func)


# ---------------------------------------------------------------------- variables
def test_a_var_pattern_matches_parameters_never_bound_vars():
    def build(bb, x, y):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x), "a")
            out = bb.emit_output(relax.op.add(a, y), "out")
        bb.emit_func_output(out)

    func, v = _function(build, "x", "y")
    value = func.body.blocks[0].bindings[1].value  # add(a, y)
    assert pk.match(pk.wildcard() + pk.is_var("y"), value, func)
    assert not pk.match(pk.wildcard() + pk.is_var("x"), value, func)  # the name must agree
    # 'a' is bound in the function: no variable pattern takes it, not even by its name
    assert not pk.match(pk.is_var() + pk.is_var("y"), value, func)
    assert not pk.match(pk.is_var("a") + pk.wildcard(), value, func)
    assert pk.match(pk.is_op("exp")(pk.is_var("x")) + pk.is_var("y"), value, func)


def test_without_the_function_a_bound_var_looks_free():
    def build(bb, x, y):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x), "a")
            out = bb.emit_output(relax.op.add(a, y), "out")
        bb.emit_func_output(out)

    func, _ = _function(build, "x", "y")
    value = func.body.blocks[0].bindings[1].value
    assert pk.match(pk.is_var("a") + pk.wildcard(), value)
    assert not pk.match(pk.is_op("exp")(pk.wildcard()) + pk.wildcard(), value)


# ------------------------------------------------- alternatives on the engine's index
# With the index's table the matcher tries a nest of ``|`` flattened, skipping the
# alternatives whose operator (or whose arguments' operators, one level down) the
# expression does not call; with a look-up function it recurses.  Both must record the
# same match: the rewrite engine uses the first, explain and user look-ups the second.
def _engine_and_recursive_matchers(func):
    from patternkit.dpl.matcher import Matcher
    from patternkit.engine.index import FunctionIndex

    index = FunctionIndex.build(func)
    for bi, table in enumerate(index.values):
        engine = Matcher(call_args={}, table=table)
        recursive = Matcher(lambda var, table=table: table.get(var.__chandle__()), {})
        for binding in index.blocks[bi]:
            yield engine, recursive, binding.value


def _nodes(pattern) -> set[int]:
    """Ids of the nodes of ``pattern``: the re-associated forms the matcher builds while
    matching are new objects each time, and what they capture is captured by the
    pattern's own nodes too."""
    seen, work = set(), [pattern]
    while work:
        node = work.pop()
        if id(node) not in seen:
            seen.add(id(node))
            work.extend(node.children())
    return seen


def _record(found, pattern):
    from patternkit.ir.compat import handle

    if found is None:
        return None
    nodes = _nodes(pattern)
    return (sorted((id(p), handle(e)) for p, e in found.captures.items() if id(p) in nodes),
            sorted((id(p), handle(e)) for p, e in found.bound_vars.items() if id(p) in nodes),
            list(found.internal_keys), [handle(e) for e in found.inputs])


def _library_patterns():
    from patternkit.patterns import EXPANSIONS, LIBRARY

    rules = [*LIBRARY, *EXPANSIONS]
    return [(rule.name, rule.pattern) for rule in rules if getattr(rule, "pattern", None)]


def test_the_flattened_alternatives_record_what_the_recursive_match_records():
    from hypothesis import given, settings, strategies as st

    from patternkit.testing import relax_graphs, relax_programs

    patterns = _library_patterns()
    assert len(patterns) > 20  # every family's rules and composites

    @settings(max_examples=40, deadline=None)
    @given(st.one_of(relax_programs(max_ops=10), relax_graphs(max_ops=10)))
    def check(mod):
        for engine, recursive, value in _engine_and_recursive_matchers(mod["main"]):
            for name, pattern in patterns:
                assert _record(engine.match(pattern, value), pattern) == \
                    _record(recursive.match(pattern, value), pattern), (name, value)

    check()


def test_a_role_on_a_nested_alternative_is_captured_through_the_index(make_var):
    from patternkit.dpl.matcher import Matcher
    from patternkit.engine.index import FunctionIndex

    w = pk.wildcard()
    inner = pk.is_op("exp")(w) | pk.is_op("log")(w)
    outer = (inner | pk.is_op("sqrt")(w)) | pk.is_op("tanh")(w)
    def build(bb, x):
        with bb.dataflow():
            lg = bb.emit(relax.op.log(x), "lg")
            out = bb.emit_output(relax.op.abs(lg), "out")
        bb.emit_func_output(out)

    func, named = _function(build, "x")
    index = FunctionIndex.build(func)
    engine = Matcher(call_args=index.call_args, table=index.values[0])
    found = engine.match(pk.is_op("abs")(outer), index.blocks[0][1].value)
    assert found is not None
    assert found.captures[inner].op.name == "relax.log"  # the nested alternative's role
    assert found.captures[outer] is found.captures[inner]
    assert found.bound_vars[inner].same_as(named["lg"])
    assert _names(found.internal) == ["lg"]


def test_the_look_ahead_tries_swapped_operands_of_add_and_multiply(make_var):
    from patternkit.dpl.matcher import Matcher
    from patternkit.engine.index import FunctionIndex

    w, v = pk.wildcard(), pk.wildcard()
    for op, name in ((relax.op.add, "add"), (relax.op.multiply, "multiply")):
        pattern = pk.is_op(name)(pk.is_op("exp")(w), v) | pk.is_op("negative")(w)

        def build(bb, x, y, op=op):
            with bb.dataflow():
                e = bb.emit(relax.op.exp(x), "e")
                out = bb.emit_output(op(y, e), "out")
            bb.emit_func_output(out)

        func, _ = _function(build, "x", "y")
        index = FunctionIndex.build(func)
        engine = Matcher(call_args=index.call_args, table=index.values[0])
        found = engine.match(pattern, index.blocks[0][1].value)
        assert found is not None, name
        assert found.captures[w].name == "x" and found.captures[v].name == "y"


def test_re_associated_forms_match_alike_through_the_index_and_the_look_up():
    # divide and multiply patterns match calls of the other operator with other
    # arguments: the look-ahead must not judge those by the pattern's own arguments
    a, b, c = pk.wildcard(), pk.wildcard(), pk.wildcard()
    for name, pattern in (("divide of multiply", a * b / c), ("multiply of divide", a * (b / c))):
        alternatives = pattern | pk.is_op("negative")(a)
        nested = pk.is_op("exp")(alternatives)
        forms = {"(g * s) / q": lambda g, s, q: relax.op.divide(relax.op.multiply(g, s), q),
                 "g * (s / q)": lambda g, s, q: relax.op.multiply(g, relax.op.divide(s, q)),
                 "(g / q) * s": lambda g, s, q: relax.op.multiply(relax.op.divide(g, q), s),
                 "(s / q) * g": lambda g, s, q: relax.op.multiply(relax.op.divide(s, q), g)}
        for form, make in forms.items():
            def build(bb, g, s, q, make=make):
                with bb.dataflow():
                    inner = make(g, s, q)
                    first = bb.emit(relax.Call(inner.op, [bb.emit(inner.args[0]), inner.args[1]]
                                               if isinstance(inner.args[0], relax.Call) else
                                               [inner.args[0], bb.emit(inner.args[1])],
                                               inner.attrs), "product")
                    out = bb.emit_output(relax.op.exp(first), "out")
                bb.emit_func_output(out)

            func, _ = _function(build, "g", "s", "q")
            found = {}
            for engine, recursive, value in _engine_and_recursive_matchers(func):
                for label, p in (("alternatives", alternatives), ("nested", nested)):
                    record = _record(engine.match(p, value), p)
                    assert record == _record(recursive.match(p, value), p), (name, form, label)
                    found[label] = found.get(label) or record is not None
            assert found == {"alternatives": True, "nested": True}, (name, form)
