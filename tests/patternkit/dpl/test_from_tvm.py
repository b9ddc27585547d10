"""from_dpl: tvm.relax.dpl patterns, as TVM's backend tables write them, in patternkit."""

from __future__ import annotations

import pytest
from tvm import relax
from tvm.relax import dpl

import patternkit as pk
from patternkit.byoc.tables import tvm_tables
from patternkit.dpl.pattern import pattern_to_text


def test_a_converted_call_pattern_matches_what_tvms_matches(make_var):
    x, w = make_var("x", (1, 3, 8, 8)), make_var("w", (4, 3, 3, 3))
    tvm_pattern = dpl.is_op("relax.nn.relu")(dpl.is_op("relax.nn.conv2d")(dpl.wildcard(),
                                                                          dpl.wildcard()))
    pattern = pk.dpl.from_dpl(tvm_pattern)
    assert pattern_to_text(pattern) == "nn.relu(nn.conv2d(*, *))"
    conv = relax.op.nn.conv2d(x, w)
    assert pk.match(pattern, relax.op.nn.relu(conv))
    assert not pk.match(pattern, relax.op.nn.gelu(conv))


def test_every_kind_the_backend_tables_use_converts_and_keeps_its_meaning(make_var):
    x, y, z = (make_var(n, (2, 3)) for n in "xyz")
    lhs = dpl.wildcard().has_dtype("float32").has_shape([2, 3])
    sub = dpl.is_op("relax.subtract")(lhs, dpl.is_var("y") | dpl.is_const())
    guarded = sub & ~dpl.is_op("relax.subtract")(dpl.is_var("z"), dpl.wildcard())
    pattern = pk.dpl.from_dpl(guarded)
    assert isinstance(pattern, pk.dpl.AndPattern) and isinstance(pattern.right, pk.dpl.NotPattern)
    cases = {
        "x - y": relax.op.subtract(x, y),  # matches
        "z - y": relax.op.subtract(z, y),  # the Not side matches
        "x - z": relax.op.subtract(x, z),  # neither var y nor a constant
        "x - 1": relax.op.subtract(x, relax.const(1.0, "float32")),
    }
    for text, expr in cases.items():
        assert bool(pk.match(pattern, expr)) == bool(guarded.match(expr)), text
    assert [t for t, e in cases.items() if pk.match(pattern, e)] == ["x - y", "x - 1"]


def test_tuple_get_item_any_index_becomes_none():
    item = pk.dpl.from_dpl(dpl.is_tuple_get_item(dpl.wildcard()))
    assert isinstance(item, pk.dpl.TupleGetItemPattern) and item.index is None
    assert pk.dpl.from_dpl(dpl.is_tuple_get_item(dpl.wildcard(), 1)).index == 1


def test_varargs_and_call_tir_callees_survive_conversion():
    varargs = pk.dpl.from_dpl(dpl.is_op("relax.concat")(dpl.wildcard(), varg_default_wildcard=True))
    assert varargs.varg_default_wildcard
    call_tir = pk.dpl.from_dpl(dpl.is_call_tir("rms_norm", [dpl.wildcard(), dpl.wildcard()]))
    callee = call_tir.args[0]
    assert isinstance(callee, pk.dpl.GlobalVarPattern) and callee.name == "rms_norm"


def test_shared_sub_patterns_stay_shared():
    x = dpl.wildcard()
    pattern = pk.dpl.from_dpl(dpl.is_op("relax.multiply")(x, dpl.is_op("relax.nn.relu")(x)))
    assert pattern.args[0] is pattern.args[1].args[0]


@pytest.mark.parametrize("kind, tvm_pattern", [
    ("UnorderedTuplePattern", lambda: dpl.is_tuple([dpl.wildcard(), dpl.wildcard()],
                                                   unordered=True)),
    ("PrimArrPattern", lambda: dpl.is_shape([1, 2])),
])
def test_a_kind_patternkit_cannot_express_is_named_in_the_error(kind, tvm_pattern):
    with pytest.raises(pk.dpl.FromDplError, match=kind) as info:
        pk.dpl.from_dpl(dpl.is_op("relax.nn.relu")(tvm_pattern()))
    assert info.value.kind == kind


def test_something_that_is_not_a_dpl_pattern_is_refused():
    with pytest.raises(pk.PatternError, match="expects a tvm.relax.dpl pattern"):
        pk.dpl.from_dpl(pk.wildcard())


def test_every_registered_backend_pattern_round_trips_through_to_dpl():
    patterns = tvm_tables.registered_patterns("")
    assert len(patterns) > 250  # 301 in 0.27.0.post1, from nine backends
    for fusion_pattern in patterns:
        back = pk.dpl.from_dpl(fusion_pattern.pattern).to_dpl()
        assert str(back) == str(fusion_pattern.pattern), fusion_pattern.name
