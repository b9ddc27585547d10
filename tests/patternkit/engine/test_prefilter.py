"""The integer prefilter drops only candidate roots the matcher would fail, and a rewrite
reads the same with the native snapshot, the pure-Python one, and no snapshot at all.

``FunctionIndex.candidates_for`` checks a pattern's top (root operator, arity, the
operators its arguments' bindings call, four levels deep) before the matcher reads a TVM
object: over the snapshot's integers on an index read from a snapshot (opt-in with
``PATTERNKIT_SNAPSHOT_INDEX=1``), over the call tables on one read field by field.  A
wrong rejection would silently lose a rewrite.  So the check is
held to the matcher on every library pattern over zoo models and random programs, and
whole library rewrites (results and logs) are compared across the three index paths.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from tvm.ir import Op
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit.dpl import is_op, wildcard
from patternkit.dpl.matcher import Matcher
from patternkit.dpl.pattern import DFPattern, root_op_names
from patternkit.engine.index import SNAPSHOT_INDEX_VARIABLE, FunctionIndex, forget_indexes
from patternkit.engine.prefilter import NO_OPERATOR, operator_keys
from patternkit.ir import compat as C
from patternkit.ir.snapshot import native
from patternkit.patterns import LIBRARY
from patternkit.testing.op_programs import op_programs

ZOO = ["zoo:gpt2?layers=1", "zoo:onnx:conv_bn", "zoo:resnet18?width=8&image=16"]


@I.ir_module
class Adds:
    """Adds whose operands are a multiply (either side), an exp, a parameter, and a
    multiply bound in another block (which the matcher does not look into)."""

    @R.function
    def main(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            m = R.multiply(x, y)
            a1 = R.add(m, y)
            a2 = R.add(y, m)
            e = R.exp(x)
            a3 = R.add(e, y)
            a4 = R.add(x, y)
            R.output(m, a1, a2, a3, a4)
        a5 = R.add(m, y)
        return (a1, a2, a3, a4, a5)


#: Two alternatives rooted on one operator (their argument checks merge).
_EITHER = is_op("relax.add")(is_op("relax.exp")(wildcard()), wildcard()) | is_op(
    "relax.add")(is_op("relax.multiply")(wildcard(), wildcard()), wildcard())


def test_candidates_the_pattern_top_cannot_match_are_dropped():
    pattern = is_op("relax.add")(is_op("relax.multiply")(wildcard(), wildcard()), wildcard())
    index = FunctionIndex.build_from_snapshot(Adds["main"])
    assert index.snapshot is not None
    # every add is a candidate by its operator; a1 and a2 (commuted) may match
    assert len(index.candidates(root_op_names(pattern))) == 5
    assert index.candidates_for(pattern) == [(0, 1), (0, 2)]
    # a pattern whose top constrains nothing keeps every candidate
    assert len(index.candidates_for(is_op("relax.add")(wildcard(), wildcard()))) == 5
    # m multiplies two parameters: no operand of its nest calls exp
    mul = is_op("relax.multiply")(is_op("relax.exp")(wildcard()), wildcard())
    assert index.candidates_for(mul) == []
    assert index.candidates_for(is_op("relax.exp")(is_op("relax.exp")(wildcard()))) == []
    # a third level: a3's exp reads a parameter, not another exp
    deep = is_op("relax.add")(is_op("relax.exp")(is_op("relax.exp")(wildcard())), wildcard())
    assert index.candidates_for(deep) == []
    # alternatives calling one operator are merged, never lost
    assert index.candidates_for(_EITHER) == [(0, 1), (0, 2), (0, 4)]


@I.ir_module
class Nests:
    """Divide/multiply nests, written the ways re-association relates."""

    @R.function
    def main(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            e = R.exp(x)
            s = R.sqrt(y)
            quotient = R.divide(e, s)
            spread = R.multiply(y, quotient)  # y * (exp(x) / sqrt(y))
            grouped = R.divide(R.multiply(y, e), s)  # (y * exp(x)) / sqrt(y)
            plain = R.multiply(x, y)
            deep = R.multiply(plain, R.multiply(x, R.divide(e, y)))
            top_spread = R.add(spread, x)
            top_grouped = R.add(grouped, x)
            top_plain = R.add(plain, x)
            top_deep = R.add(deep, x)
            R.output(top_spread, top_grouped, top_plain, top_deep)
        return (top_spread, top_grouped, top_plain, top_deep)


#: ``(y * exp(x)) / sqrt(y)`` as a pattern: the matcher also finds it re-associated.
_NEST = is_op("relax.divide")(is_op("relax.multiply")(wildcard(), is_op("relax.exp")(wildcard())),
                              is_op("relax.sqrt")(wildcard()))
_NEST_PATTERNS = [
    _NEST,
    is_op("relax.multiply")(wildcard(), is_op("relax.divide")(is_op("relax.exp")(wildcard()),
                                                             is_op("relax.sqrt")(wildcard()))),
    is_op("relax.multiply")(is_op("relax.exp")(wildcard()), wildcard()),
    is_op("relax.multiply")(is_op("relax.sqrt")(wildcard()), wildcard()),
    is_op("relax.divide")(wildcard(), is_op("relax.sqrt")(wildcard())),
    is_op("relax.multiply")(wildcard(), is_op("relax.exp")(wildcard()))
    | is_op("relax.divide")(is_op("relax.sqrt")(wildcard()), wildcard()),
]
_NEST_PATTERNS += [is_op("relax.add")(p, wildcard()) for p in _NEST_PATTERNS]


@pytest.mark.parametrize("from_snapshot", [True, False], ids=["snapshot", "tables"])
def test_a_nest_of_divides_and_multiplies_is_checked_by_its_operands(from_snapshot):
    """Re-association moves a nest's operands between its levels, so the check asks only
    that each operand pattern finds an operand somewhere in the expression's nest: the
    re-associated form is kept, a nest without an exp or a sqrt is dropped, and nothing
    dropped is a match."""
    func = Nests["main"]
    index = (FunctionIndex.build_from_snapshot(func) if from_snapshot
             else FunctionIndex.build_by_fields(func))
    on_top = is_op("relax.add")(_NEST, wildcard())  # the nest below the root
    names = [C.var_name(index.binding_at(at).var) for at in index.candidates_for(on_top)]
    # kept: the nest as written, and re-associated (the matcher finds both); dropped:
    # x * y, whose nest has no exp and no sqrt, and a deeper nest with no sqrt
    assert names == ["top_spread", "top_grouped"]
    matchers = {at: Matcher(call_args={}, table=index.values[at[0]], call_ops={})
                for at in index.candidates(None)}
    matched = [C.var_name(index.binding_at(at).var) for at in index.candidates_for(on_top)
               if matchers[at].match(on_top, index.binding_at(at).value) is not None]
    assert matched == ["top_spread", "top_grouped"]
    dropped = 0
    for pattern in _NEST_PATTERNS:
        kept = set(index.candidates_for(pattern))
        for at in index.candidates(root_op_names(pattern)):
            if at not in kept:
                dropped += 1
                assert matchers[at].match(pattern, index.binding_at(at).value) is None, (
                    pattern, index.binding_at(at))
    assert dropped > 0


def test_an_operator_name_that_is_not_registered_is_no_trie_key():
    keys = operator_keys(["relax.add", "patternkit.no_such_op", "relax.add"])
    assert keys == [C.handle(Op.get("relax.add")), NO_OPERATOR, keys[0]]


def _patterns() -> list[DFPattern]:
    found = []
    for rule in LIBRARY:
        pattern = getattr(rule, "pattern", None)
        if isinstance(pattern, DFPattern):
            found.append(pattern)
    return found


def _assert_dropped_never_match(func, from_snapshot: bool = True) -> int:
    """Every candidate the prefilter drops fails the matcher; returns how many it dropped.

    ``from_snapshot``: the snapshot's integer check, else the check over the
    field-by-field index's tables (:func:`~patternkit.engine.prefilter.table_filter`).
    """
    if from_snapshot:
        index = FunctionIndex.build_from_snapshot(func)
        assert index.snapshot is not None
    else:
        index = FunctionIndex.build_by_fields(func)
    dropped = 0
    for pattern in _patterns():
        kept = set(index.candidates_for(pattern))
        for at in index.candidates(root_op_names(pattern)):
            if at in kept:
                continue
            dropped += 1
            value = index.binding_at(at).value
            matcher = Matcher(call_args={}, table=index.values[at[0]], call_ops={})
            assert matcher.match(pattern, value) is None, (pattern, index.binding_at(at))
    return dropped


@pytest.mark.parametrize("from_snapshot", [True, False], ids=["snapshot", "tables"])
@pytest.mark.parametrize("spec", ZOO)
def test_dropped_roots_never_match_on_zoo_models(spec, from_snapshot):
    from patternkit.models.zoo import zoo_model

    model = zoo_model(spec)
    assert _assert_dropped_never_match(model.mod[model.entry], from_snapshot) > 0


@pytest.mark.parametrize("from_snapshot", [True, False], ids=["snapshot", "tables"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mod=op_programs(min_ops=2, max_ops=8))
def test_dropped_roots_never_match_on_random_programs(from_snapshot, mod):
    _assert_dropped_never_match(mod["main"], from_snapshot)


def test_the_table_check_follows_the_matcher_on_a_hand_built_function():
    """The field-by-field index's check: commuted operands, a Var looked through, and a
    multiply in another block (not looked into) as the snapshot's check does."""
    pattern = is_op("relax.add")(is_op("relax.multiply")(wildcard(), wildcard()), wildcard())
    index = FunctionIndex.build_by_fields(Adds["main"])
    assert index.snapshot is None
    assert index.candidates_for(pattern) == [(0, 1), (0, 2)]
    assert len(index.candidates_for(is_op("relax.add")(wildcard(), wildcard()))) == 5
    assert index.candidates_for(is_op("relax.exp")(is_op("relax.exp")(wildcard()))) == []
    deep = is_op("relax.add")(is_op("relax.exp")(is_op("relax.exp")(wildcard())), wildcard())
    assert index.candidates_for(deep) == []
    # alternatives calling one operator are merged, never lost
    assert index.candidates_for(_EITHER) == [(0, 1), (0, 2), (0, 4)]


def _rewrite(mod, path: str, monkeypatch) -> tuple:
    """The library's rewrite of ``mod`` and its log, with the index read one way."""
    with monkeypatch.context() as patch:
        if path == "fields":
            patch.delenv(SNAPSHOT_INDEX_VARIABLE, raising=False)
        elif path == "python":
            patch.setenv(SNAPSHOT_INDEX_VARIABLE, "1")
            patch.setenv(native.NATIVE_VARIABLE, "0")
        else:
            patch.setenv(SNAPSHOT_INDEX_VARIABLE, "1")
            assert native.walker() is not None, "the native reader did not build here"
            patch.delenv(native.NATIVE_VARIABLE, raising=False)
        forget_indexes()
        log = pk.RewriteLog()
        out = pk.rewrite(LIBRARY.rewrite_rules(), mod, log=log)
        forget_indexes()
    records = [(r.rule, r.function, r.root, r.replaced, r.round) for r in log.records]
    skipped = [(s.rule, s.function, s.root, s.reason, s.kind, s.position) for s in log.skipped]
    return out, records, skipped


def _assert_paths_agree(mod, monkeypatch) -> int:
    """The three index paths rewrite ``mod`` alike; returns how many rewrites they made."""
    fields = _rewrite(mod, "fields", monkeypatch)
    for path in ("native", "python"):
        out, records, skipped = _rewrite(mod, path, monkeypatch)
        assert C.structural_equal(out, fields[0]), path
        assert records == fields[1], path
        assert skipped == fields[2], path
    return len(fields[1])


@pytest.mark.parametrize("spec", ZOO)
def test_library_rewrites_agree_on_every_index_path(spec, monkeypatch):
    from patternkit.models.zoo import zoo_model

    model = zoo_model(spec)
    assert _assert_paths_agree(model.mod, monkeypatch) > 0


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mod=op_programs(min_ops=2, max_ops=8))
def test_library_rewrites_agree_on_random_programs(monkeypatch, mod):
    _assert_paths_agree(mod, monkeypatch)
