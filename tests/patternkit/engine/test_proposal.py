"""find_groups: Relay's grouping of non-overlapping matches, with a reason for every skip.

Roots are tried from the function's result back to its inputs; a match claims its
interior bindings; a later candidate that would reuse a claimed binding, or whose
interior result is read outside it, is skipped and says why.  These rules decide what
``rewrite``, ``partition`` and ``MergeComposite`` touch, so they are pinned here directly.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit.engine.index import FunctionIndex
from patternkit.engine.proposal import Group, SkipKind, adapt_check, find_groups, match_bindings
from patternkit.engine.rule import judge
from patternkit.testing import relax_graphs

EXP_EXP = pk.is_op("exp")(pk.is_op("exp")(pk.wildcard()))
ADD_OF_EXP = pk.is_op("add")(pk.is_op("exp")(pk.wildcard()), pk.wildcard())


def _skips(skipped):
    """What a skip record says: root, reason, position and kind."""
    return [(s.root, s.reason, s.position, s.kind) for s in skipped]


@I.ir_module
class ExpChain:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.exp(a)
            c = R.exp(b)
            d = R.exp(c)
            R.output(d)
        return d


@I.ir_module
class SharedExp:
    """One exp read by two adds: each add's match would take it from the other."""

    @R.function
    def main(x: R.Tensor((2, 3), "float32"), y: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            e = R.exp(x)
            a1 = R.add(e, y)
            a2 = R.add(e, x)
            R.output(a1, a2)
        return (a1, a2)


@I.ir_module
class ExpIsOutput:
    @R.function
    def main(x: R.Tensor((2, 3), "float32"), y: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            e = R.exp(x)
            a = R.add(e, y)
            R.output(e, a)
        return (e, a)


@I.ir_module
class TwoBlocks:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")):
        a = R.exp(x)
        with R.dataflow():
            b = R.exp(a)
            R.output(b)
        return b


def _groups(mod, pattern, check=None, **options):
    return find_groups(FunctionIndex.build(mod["main"]), pattern, check, **options)


def _roots(groups) -> list[str]:
    return [g.root_var.name for g in groups]


# ---------------------------------------------------------------------- order and claims
def test_roots_are_taken_from_the_result_back_and_each_match_claims_its_interior():
    groups, skipped = _groups(ExpChain, EXP_EXP)
    # d takes c, so c cannot be a root; b takes a
    assert _roots(groups) == ["b", "d"]  # returned in program order
    assert [[v.name for v in g.interior] for g in groups] == [["a", "b"], ["c", "d"]]


def test_a_root_an_earlier_match_claimed_is_reported_as_an_overlap_with_what_it_covered():
    _, skipped = _groups(ExpChain, EXP_EXP)
    assert _skips(skipped) == [("c", "overlaps a match that already claimed 'c'", (0, 2),
                                SkipKind.OVERLAP)]
    assert [v.name for v in skipped[0].covered] == ["b", "c"]
    # Relay skipped such a root silently; asked not to report, find_groups does too
    assert _groups(ExpChain, EXP_EXP, report_claimed=False)[1] == []


def test_groups_are_numbered_in_discovery_order_from_the_result():
    groups, _ = _groups(ExpChain, EXP_EXP)
    assert [(g.root_var.name, g.gid) for g in groups] == [("b", 1), ("d", 0)]
    assert [g.position for g in groups] == [(0, 1), (0, 3)]


def test_a_match_that_would_take_a_claimed_binding_is_skipped_as_an_overlap():
    groups, skipped = _groups(SharedExp, ADD_OF_EXP, allow_escaping_intermediates=True)
    assert _roots(groups) == ["a2"]
    assert _skips(skipped) == [("a1", "overlaps a match that already claimed 'e'", (0, 1),
                                SkipKind.OVERLAP)]
    assert [v.name for v in skipped[0].covered] == ["e", "a1"]


def test_an_interior_result_read_outside_the_match_skips_it_by_default():
    groups, skipped = _groups(SharedExp, ADD_OF_EXP)
    assert groups == []
    assert [(s.root, s.reason) for s in skipped] == [
        ("a2", "intermediate 'e' is also used by 'a1' outside the match"),
        ("a1", "intermediate 'e' is also used by 'a2' outside the match")]
    assert {s.kind for s in skipped} == {SkipKind.ESCAPE}


def test_an_interior_result_that_leaves_the_block_skips_the_match():
    groups, skipped = _groups(ExpIsOutput, ADD_OF_EXP)
    assert groups == []
    assert [(s.root, s.reason) for s in skipped] == [
        ("a", "intermediate 'e' is an output of its block or of the function")]
    groups, _ = _groups(ExpIsOutput, ADD_OF_EXP, allow_escaping_intermediates=True)
    assert _roots(groups) == ["a"]


def test_matches_never_look_into_another_block():
    index = FunctionIndex.build(TwoBlocks["main"])
    assert index.position_of(TwoBlocks["main"].body.blocks[1].bindings[0].var) == (1, 0)
    groups, skipped = find_groups(index, EXP_EXP)
    assert groups == [] and skipped == []


# ---------------------------------------------------------------------- checks
def test_the_check_sees_each_candidate_from_the_result_back():
    seen = []

    def check(group):
        assert isinstance(group, Group) and group.match.root.same_as(group.binding.value)
        seen.append(group.root_var.name)
        return True

    _groups(ExpChain, EXP_EXP, check)
    assert seen == ["d", "b"]


def test_a_vetoed_match_claims_nothing_so_a_smaller_root_can_match():
    def check(group):
        return pk.reject("not the last one") if group.root_var.name == "d" else True

    groups, skipped = _groups(ExpChain, EXP_EXP, check)
    assert _roots(groups) == ["c"]  # c takes b once d let it go; a is left over
    assert _skips(skipped) == [("d", "not the last one", (0, 3), SkipKind.CHECK),
                               ("b", "overlaps a match that already claimed 'b'", (0, 1),
                                SkipKind.OVERLAP)]


@pytest.mark.parametrize("result, reason", [(False, "check returned False"),
                                            (None, "check returned None"),
                                            (pk.reject("too big"), "too big")])
def test_a_falsy_check_result_or_a_reject_vetoes_with_its_reason(result, reason):
    groups, skipped = _groups(ExpChain, EXP_EXP, lambda group: result)
    assert groups == []  # nothing is claimed, so every exp(exp(.)) is a candidate in turn
    assert [(s.root, s.reason) for s in skipped] == [(root, reason) for root in "dcb"]


def test_the_check_runs_after_the_overlap_and_escape_rules():
    seen = []

    def check(group):
        seen.append(group)
        return True

    _groups(SharedExp, ADD_OF_EXP, check)
    assert seen == []  # both candidates were skipped for the escaping exp first


def test_an_exception_in_the_check_propagates_to_the_caller():
    def broken(group):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _groups(ExpChain, EXP_EXP, broken)


def test_judge_tells_an_acceptance_a_plan_and_a_refusal_apart():
    assert judge(lambda match: True, None) == (None, None)
    refusal, plan = judge(lambda match: [1], None)
    assert refusal is None and plan == [1]  # any other object is the check's plan
    assert judge(lambda match: 0, None) == (None, 0)  # a number too (an axis of 0)
    assert judge(lambda match: None, None)[0].reason == "check returned None"
    assert judge(lambda match: pk.reject("why"), None)[0].reason == "why"

    def raising(match):
        raise pk.reject("raised from a helper")

    assert judge(raising, None)[0].reason == "raised from a helper"
    assert not pk.reject("why") and repr(pk.reject("why")) == "reject('why')"


def test_adapt_check_accepts_both_relay_signatures():
    class FakeMatch:
        root, node_map = 3, "node map"

    assert adapt_check(lambda pre: pre * 2)(FakeMatch()) == 6
    assert adapt_check(lambda pre, node_map: node_map)(FakeMatch()) == "node map"
    assert adapt_check(bool)(FakeMatch()) is True  # a builtin: called with pre only


# ---------------------------------------------------------------------- match_bindings
def test_match_bindings_names_roots_inputs_and_interior_ops():
    found = match_bindings(ADD_OF_EXP, ExpIsOutput["main"])
    assert [{role: v.name for role, v in entry.items()} for entry in found] == [
        {"root": "a", "input0": "x", "input1": "y", "exp": "e"}]


def test_match_bindings_reports_a_rules_roles():
    class AddOfExp(pk.DFPatternCallback):
        name = "test.add_of_exp"

        def __init__(self):
            super().__init__()
            self.x, self.other = pk.wildcard(), pk.wildcard()
            self.pattern = pk.is_op("add")(pk.is_op("exp")(self.x), self.other)

    found = match_bindings(AddOfExp(), SharedExp["main"])
    # as for a drawing, intermediates read elsewhere do not hide a match
    assert [{role: v.name for role, v in entry.items()} for entry in found] == [
        {"root": "a2", "x": "x", "other": "x", "exp": "e"}]
    with pytest.raises(TypeError, match="expected a pattern or a rule with a pattern"):
        match_bindings(object(), SharedExp["main"])


# ---------------------------------------------------------------------- on random graphs
_BINARY = pk.is_op("add") | pk.is_op("multiply") | pk.is_op("subtract") | pk.is_op("maximum")
_UNARY = (pk.is_op("nn.relu") | pk.is_op("sigmoid") | pk.is_op("tanh") | pk.is_op("negative")
          | pk.is_op("abs") | pk.is_op("cos"))
_ANY_CALL = pk.wildcard()(None)
# an elementwise op reading the result of any call: chains random graphs are full of
CHAIN = _UNARY(_ANY_CALL) | _BINARY(_ANY_CALL, pk.wildcard())
GROUPING_EXAMPLES = max(1, settings.default.max_examples // 3)  # 100 in the ci profile


def _readers(func) -> dict[str, set[str]]:
    """Var name -> names of the bindings reading it (TVM's free_vars, not the index)."""
    readers: dict[str, set[str]] = {}
    for block in func.body.blocks:
        for b in block.bindings:
            for var in relax.analysis.free_vars(b.value):
                readers.setdefault(var.name, set()).add(b.var.name)
    return readers


def test_groups_on_random_graphs_are_disjoint_self_contained_and_account_for_every_match():
    grouped, skipping = [], []

    @settings(max_examples=GROUPING_EXAMPLES)
    @given(relax_graphs(max_ops=12))
    def grouping_rules_hold(mod):
        func = mod["main"]
        groups, skipped = find_groups(FunctionIndex.build(func), CHAIN)
        interiors = [[v.name for v in g.interior] for g in groups]
        taken = [name for interior in interiors for name in interior]
        assert len(taken) == len(set(taken)), "two groups share a binding"
        readers = _readers(func)
        result = {v.name for v in relax.analysis.free_vars(func.body.body)}
        outputs = {b.var.name for block in func.body.blocks for b in block.bindings
                   if not isinstance(b.var, relax.DataflowVar)}
        for interior in interiors:
            for name in interior[:-1]:  # the root is the group's result; the rest is hidden
                assert readers.get(name, set()) <= set(interior)
                assert name not in result and name not in outputs
        by_discovery = sorted(groups, key=lambda g: g.position, reverse=True)
        assert [g.gid for g in by_discovery] == list(range(len(groups)))
        assert all(s.reason for s in skipped)
        matched = {b.var.name for block in func.body.blocks for b in block.bindings
                   if isinstance(b.value, relax.Call)
                   and pk.dpl.find_match(CHAIN, b.value, func) is not None}
        # every binding whose value matches is a group, inside one, or skipped with a reason
        assert matched <= set(taken) | {s.root for s in skipped}
        grouped.append(bool(groups))
        skipping.append(bool(skipped))

    grouping_rules_hold()
    # not vacuous: many graphs had groups, and some had matches the rules skipped
    assert sum(grouped) >= len(grouped) / 3, f"groups in only {sum(grouped)}/{len(grouped)}"
    assert sum(skipping) >= len(skipping) / 6, f"skips in only {sum(skipping)}/{len(skipping)}"
