"""One rule protocol: a name, a pattern or a context, ``check(match)``, ``rewrite(match)``.

Single-root and multi-root rules are the same kind of object to every pass, and Relay's
``DFPatternCallback`` is an adapter onto it: written the Relay way, applied like a rule.
"""

from __future__ import annotations

import re

import pytest
from tvm import relax

import patternkit as pk
from patternkit.engine import CallbackRule, RoleMatch, as_rule
from patternkit.patterns import EXPANSIONS, LIBRARY
from patternkit.patterns.matmul import CombineParallelMatmul

X = relax.TensorType((2, 8), "float32")
WT = relax.TensorType((8, 4), "float32")


def _module(body, params):
    vars_ = [relax.Var(name, ty) for name, ty in params]
    bb = relax.BlockBuilder()
    with bb.function("main", vars_):
        with bb.dataflow():
            gv = bb.emit_output(body(lambda e, n: bb.emit(e, n), *vars_))
        bb.emit_func_output(gv)
    return bb.get()


def _two_matmuls(emit, x, w0, w1):
    a = emit(relax.op.matmul(x, w0), "a")
    b = emit(relax.op.matmul(x, w1), "b")
    return relax.op.add(a, b)


TWO = (("x", X), ("w0", WT), ("w1", WT))


def _exp_module():
    x = relax.Var("x", X)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.exp(x))
        bb.emit_func_output(gv)
    return bb.get()


class SwapMatmuls(pk.RewriteRule):
    """A multi-root rule on the plain protocol: a context instead of a pattern."""

    name = "test.swap_matmuls"

    def __init__(self, fail: str = ""):
        super().__init__(rewrite_once=True)
        self.fail = fail
        with pk.PatternContext() as context:
            self.x = pk.wildcard()
            self.first = pk.is_op("relax.matmul")(self.x, pk.wildcard())
            self.second = pk.is_op("relax.matmul")(self.x, pk.wildcard())
        self.context = context

    def check(self, match):
        return pk.reject("no second input", at=match.x) if self.fail == "check" else "plan"

    def rewrite(self, match):
        assert match.plan == "plan"
        if self.fail == "rewrite":
            raise ValueError("boom")
        if self.fail == "foreign":
            return {match.x: match.x}
        return {match.first: match.value("second"), match.second: match.value("first")}


def test_a_multi_root_rule_is_a_rewrite_rule_with_a_context_and_gets_a_role_match():
    rule = SwapMatmuls()
    assert isinstance(rule, pk.RewriteRule) and rule.multi_root and rule.pattern is None
    log = pk.RewriteLog()
    out = pk.rewrite(rule, _module(_two_matmuls, TWO), log=log)
    assert log.counts() == {"test.swap_matmuls": 1}
    a, b = list(out["main"].body.blocks[0].bindings)[:2]
    assert (a.var.name, b.var.name) == ("a", "b")
    assert a.value.args[1].name == "w1" and b.value.args[1].name == "w0"


def test_a_multi_root_rules_refusal_is_logged_under_its_name():
    log = pk.RewriteLog()
    pk.rewrite(SwapMatmuls(fail="check"), _module(_two_matmuls, TWO), log=log)
    assert log.reasons("test.swap_matmuls") == ["no second input"]


@pytest.mark.parametrize("fail, message", [
    ("rewrite", r"rule test\.swap_matmuls: ValueError in the rule: boom"),
    ("foreign", r"rule test\.swap_matmuls: the rewriter returned a replacement for 'x'"),
])
def test_every_error_of_a_multi_root_rule_names_the_rule(fail, message):
    with pytest.raises(pk.errors.CallbackError, match=message) as caught:
        pk.rewrite(SwapMatmuls(fail=fail), _module(_two_matmuls, TWO))
    assert caught.value.callback == "test.swap_matmuls"


def test_both_matches_read_roles_through_one_base():
    seen = []

    class Spy(SwapMatmuls):
        def check(self, match):
            seen.append(match)
            return pk.reject("only looking")

    class SingleSpy(pk.RewriteRule):
        def __init__(self):
            super().__init__()
            self.x = pk.wildcard()
            self.pattern = pk.is_op("relax.exp")(self.x)

        def check(self, match):
            seen.append(match)
            return pk.reject("only looking")

    pk.rewrite(Spy(), _module(_two_matmuls, TWO))
    pk.rewrite(SingleSpy(), _exp_module())
    multi, single = seen
    assert isinstance(multi, RoleMatch) and isinstance(single, RoleMatch)
    for match in (multi, single):
        assert "x" in match and match.x.name == "x" and match["x"].same_as(match.x)
        with pytest.raises(KeyError, match="no role 'gamma' in this rule"):
            match["gamma"]
    assert set(multi.roles) == {"x", "first", "second"} and single.roles == ("x",)


def test_the_library_rule_with_several_roots_has_its_dotted_name():
    rule = CombineParallelMatmul()
    assert rule.name == rule.rule_name == "matmul.combine_parallel"
    assert LIBRARY.find("matmul.combine_parallel").multi_root


def test_every_library_rule_has_a_unique_dotted_name():
    names = [rule.name for rule in (*LIBRARY, *EXPANSIONS)]
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    for name in names:
        assert re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", name), name


# -- Relay's DFPatternCallback, an adapter -------------------------------------------------------
class ExpToSigmoid(pk.DFPatternCallback):
    name = "test.exp_to_sigmoid"

    def __init__(self, refuse: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.refuse = refuse
        self.x = pk.wildcard()
        self.pattern = pk.is_op("relax.exp")(self.x)

    def check(self, pre, node_map):
        return pk.reject("refused the Relay way", at=pre) if self.refuse else "plan"

    def callback(self, pre, post, node_map):
        assert node_map.plan == "plan" and pre.same_as(post)
        return relax.op.sigmoid(node_map[self.x][0])


def test_a_callback_is_written_the_relay_way_and_applied_as_the_rule_it_stands_for():
    callback = ExpToSigmoid(require_type=True, rewrite_once=True)
    assert not isinstance(callback, pk.Rule)
    rule = as_rule(callback)
    assert isinstance(rule, CallbackRule) and rule.callback is callback
    assert rule.name == "test.exp_to_sigmoid" and rule.rewrite_once
    assert callback.require_type and set(rule.roles()) == {"x"}
    for out in (pk.rewrite(callback, _exp_module()), callback.rewrite(_exp_module()),
                pk.rewrite(callbacks=[callback], target=_exp_module())):
        (binding,) = out["main"].body.blocks[0].bindings
        assert binding.value.op.name == "relax.sigmoid"


def test_a_callbacks_relay_check_refuses_with_its_reason_under_its_name():
    log = pk.RewriteLog()
    out = pk.rewrite(pk.RuleSet([ExpToSigmoid(refuse=True)]), _exp_module(), log=log)
    assert log.reasons("test.exp_to_sigmoid") == ["refused the Relay way"]
    assert out["main"].body.blocks[0].bindings[0].value.op.name == "relax.exp"


def test_a_rule_set_keeps_a_callback_as_it_was_given():
    callback = ExpToSigmoid()
    rules = pk.RuleSet([callback])
    assert rules.find("test.exp_to_sigmoid") is callback
    assert list(rules.rewrite_rules()) == [callback]


def test_rules_and_callbacks_cannot_both_be_given():
    with pytest.raises(TypeError, match="got rules twice"):
        pk.rewrite(ExpToSigmoid(), _exp_module(), callbacks=[ExpToSigmoid()])


# -- one skip record ------------------------------------------------------------------------------
def test_every_skip_is_one_record_naming_the_rule_function_and_kind():
    class Declines(pk.RewriteRule):
        name = "test.declines"

        def __init__(self):
            super().__init__()
            self.pattern = pk.is_op("relax.exp")(pk.wildcard())

        def rewrite(self, match):
            return None

    log = pk.RewriteLog()
    pk.rewrite([ExpToSigmoid(refuse=True), Declines()], _exp_module(), log=log)
    refused, declined = log.skipped
    assert all(isinstance(s, pk.engine.Skip) for s in log.skipped)
    assert (refused.rule, refused.function, refused.kind) == ("test.exp_to_sigmoid", "main",
                                                             pk.engine.SkipKind.CHECK)
    assert refused.rejection is not None and refused.rejection.reason == refused.reason
    assert (declined.rule, declined.kind, declined.position) == ("test.declines",
                                                                "declined", (0, 0))
    skipped: list = []
    pk.partition(pk.is_op("relax.exp")(pk.wildcard()), _exp_module(),
                 check=lambda pre: pk.reject("not here"), skipped=skipped)
    assert [(s.rule, s.function, s.reason) for s in skipped] == [("partition", "main",
                                                                 "not here")]
