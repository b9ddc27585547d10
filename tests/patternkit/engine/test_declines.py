"""A rule that declines every match with a bare ``None`` (a forgotten ``return``) is
warned about once per ``rewrite`` call, pointing at the user's method; a rule that
declines on purpose, or rewrites anything, is not."""

from __future__ import annotations

import warnings

import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.errors import PatternkitWarning, RuleDeclinedEveryMatch


def exp_chain(length: int) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    expr = x
    for _ in range(length):
        expr = relax.op.exp(expr)
    return pk.from_expr(expr)


class ExpToSigmoid(pk.RewriteRule):
    """exp(w) -> sigmoid(w); the subclasses below break it the ways users do."""

    name = "test.exp_to_sigmoid"

    def __init__(self):
        super().__init__()
        self.w = pk.wildcard()
        self.pattern = pk.is_op("relax.exp")(self.w)

    def rewrite(self, match):
        return relax.op.sigmoid(match.w)


class ForgotTheReturn(ExpToSigmoid):
    def rewrite(self, match):
        relax.op.sigmoid(match.w)  # the return is missing


class CheckForgotReturnTrue(ExpToSigmoid):
    def check(self, match):
        if match.w.ty.ndim != 2:
            return pk.reject("not a matrix")


class RelayForgotTheReturn(pk.DFPatternCallback):
    name = "test.relay_exp"

    def __init__(self):
        super().__init__()
        self.w = pk.wildcard()
        self.pattern = pk.is_op("relax.exp")(self.w)

    def callback(self, pre, post, node_map):
        relax.op.sigmoid(node_map[self.w][0])


def declined_warnings(record) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, RuleDeclinedEveryMatch)]


def test_a_rewrite_that_returns_none_for_every_match_warns_once_at_its_own_line():
    mod = exp_chain(3)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = pk.rewrite(ForgotTheReturn(), mod)
    tvm.ir.assert_structural_equal(out, mod)  # nothing rewritten, the module untouched
    (warning,) = declined_warnings(record)
    assert issubclass(warning.category, PatternkitWarning)
    text = str(warning.message)
    assert text.startswith("rule test.exp_to_sigmoid: its rewrite returned None for all 3 "
                           "match(es) it was offered")
    assert "is a `return` missing?" in text and "\n" not in text
    assert warning.filename == __file__
    assert warning.lineno == ForgotTheReturn.rewrite.__code__.co_firstlineno


def test_a_relay_callback_that_returns_none_is_named_as_a_callback():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pk.rewrite(RelayForgotTheReturn(), exp_chain(2))
    (warning,) = declined_warnings(record)
    assert "rule test.relay_exp: its callback returned None for all 2" in str(warning.message)
    assert "return post" in str(warning.message)
    assert warning.lineno == RelayForgotTheReturn.callback.__code__.co_firstlineno


def test_a_check_that_returns_none_for_every_match_warns():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pk.rewrite(CheckForgotReturnTrue(), exp_chain(2))
    (warning,) = declined_warnings(record)
    assert "its check returned None for all 2 match(es)" in str(warning.message)
    assert "`return True` missing" in str(warning.message)


def test_each_rewrite_call_warns_once_per_silent_rule():
    rules = [ForgotTheReturn(), RelayForgotTheReturn()]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pk.rewrite(rules, exp_chain(4))
        pk.rewrite(rules, exp_chain(4))
    names = [str(w.message).split(":")[0] for w in declined_warnings(record)]
    assert names == ["rule test.exp_to_sigmoid", "rule test.relay_exp"] * 2


def test_a_rule_that_declines_on_purpose_or_rewrites_something_is_not_warned_about():
    class Sometimes(ExpToSigmoid):
        def rewrite(self, match):
            if isinstance(match.w, relax.Var) and match.w.name == "x":  # the first exp only
                return relax.op.sigmoid(match.w)
            return None

    class ReturnsTheMatch(pk.DFPatternCallback):
        def __init__(self):
            super().__init__()
            self.pattern = pk.is_op("relax.exp")(pk.wildcard())

        def callback(self, pre, post, node_map):
            return post

    class Refuses(ExpToSigmoid):
        def check(self, match):
            return pk.reject("never")

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuleDeclinedEveryMatch)
        for rule in (Sometimes(), ReturnsTheMatch(), Refuses(), ExpToSigmoid()):
            pk.rewrite(rule, exp_chain(3))
        # offered no match at all: nothing to say
        relu = relax.op.nn.relu(relax.Var("x", relax.TensorType((2,), "float32")))
        pk.rewrite(ForgotTheReturn(), pk.from_expr(relu))


def test_the_warning_filters_by_its_category():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=RuleDeclinedEveryMatch)
        pk.rewrite(ForgotTheReturn(), exp_chain(2))
    assert declined_warnings(record) == []


def test_a_run_that_fails_does_not_warn():
    class Raises(ForgotTheReturn):
        def check(self, match):
            raise RuntimeError("boom")

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuleDeclinedEveryMatch)
        with pytest.raises(pk.errors.CallbackError, match="boom"):
            pk.rewrite(Raises(), exp_chain(2))


class TwoExpsForgotTheReturn(pk.engine.BindingsRewriteRule):
    """A rule with two roots (two exps of one input) whose rewrite lost its return."""

    name = "test.two_exps"

    def __init__(self):
        super().__init__()
        with pk.PatternContext() as self.context:
            self.x = pk.wildcard()
            self.first, self.second = (pk.is_op("relax.exp")(self.x) for _ in range(2))

    def rewrite(self, match):
        sigmoid = relax.op.sigmoid(match.matchings[self.x])
        {match.matchings[self.first]: sigmoid, match.matchings[self.second]: sigmoid}


def two_exps() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x), "a")
            b = bb.emit(relax.op.exp(x), "b")
            out = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(out)
    return bb.get()


def test_a_rule_with_several_roots_that_returns_none_warns_too():
    mod = two_exps()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = pk.rewrite(TwoExpsForgotTheReturn(), mod)
    tvm.ir.assert_structural_equal(out, mod)
    (warning,) = declined_warnings(record)
    assert str(warning.message).startswith("rule test.two_exps: its rewrite returned None")
    assert warning.lineno == TwoExpsForgotTheReturn.rewrite.__code__.co_firstlineno
