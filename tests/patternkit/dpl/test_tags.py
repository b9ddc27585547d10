"""Tagged alternatives: ``alt(..., tag=...)`` and ``match.tag(...)``.

A rule that accepts several forms of one computation reads which form matched by the
alternative's name.  What users rely on: the name of the alternative that matched, in
the order they were given; no name from an alternative that failed, even one that
matched its tag before an enclosing alternative failed; the same answers from the
rewrite engine's flattened ``|`` as from the plain matcher; tags shown in the pattern's
text and dropped (the alternatives kept) in ``tvm.relax.dpl``.
"""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.dpl import alt
from patternkit.dpl.pattern import TagPattern, required_op_names, root_op_names

T = relax.TensorType((2, 3), "float32")


def _var(name: str) -> relax.Var:
    return relax.Var(name, T)


def test_positional_alternatives_are_named_by_position():
    x = pk.wildcard()
    pattern = alt(pk.is_op("exp")(x), pk.is_op("log")(x), pk.is_op("sqrt")(x), tag="unary")
    for op, name in ((relax.op.exp, "0"), (relax.op.log, "1"), (relax.op.sqrt, "2")):
        assert pk.dpl.find_match(pattern, op(_var("a"))).tag("unary") == name


def test_keyword_alternatives_are_named_by_keyword_and_tried_in_the_order_given():
    x = pk.wildcard()
    specific_first = alt(tag="form", exp=pk.is_op("exp")(x), anything=pk.wildcard())
    anything_first = alt(tag="form", anything=pk.wildcard(), exp=pk.is_op("exp")(x))
    expr = relax.op.exp(_var("a"))
    assert pk.dpl.find_match(specific_first, expr).tag("form") == "exp"
    assert pk.dpl.find_match(anything_first, expr).tag("form") == "anything"
    assert pk.dpl.find_match(specific_first, relax.op.log(_var("a"))).tag("form") == "anything"


def test_a_tag_that_is_not_part_of_the_match_answers_none():
    x = pk.wildcard()
    pattern = pk.is_op("exp")(x) | alt(tag="other", log=pk.is_op("log")(x))
    found = pk.dpl.find_match(pattern, relax.op.exp(_var("a")))
    assert found.tag("other") is None and found.tag("never_used") is None


def test_nested_tags_name_each_level():
    x = pk.wildcard()
    inner = alt(tag="inner", exp=pk.is_op("exp")(x), log=pk.is_op("log")(x))
    pattern = alt(tag="outer", unary=inner, negated=pk.is_op("negative")(x))
    found = pk.dpl.find_match(pattern, relax.op.log(_var("a")))
    assert (found.tag("outer"), found.tag("inner")) == ("unary", "log")
    found = pk.dpl.find_match(pattern, relax.op.negative(_var("a")))
    assert (found.tag("outer"), found.tag("inner")) == ("negated", None)


def test_a_tag_inside_a_failed_outer_alternative_is_not_reported():
    x, y = pk.wildcard(), pk.wildcard()
    # the first outer alternative matches its tagged first argument, then fails on the second
    first = pk.is_op("add")(alt(tag="inner", exp=pk.is_op("exp")(x)), pk.is_op("sqrt")(y))
    second = pk.is_op("add")(x, y)
    pattern = alt(tag="outer", first=first, second=second)
    expr = relax.op.add(relax.op.exp(_var("a")), relax.op.log(_var("b")))
    found = pk.dpl.find_match(pattern, expr)
    assert found.tag("outer") == "second"
    assert found.tag("inner") is None


def test_one_tag_matched_in_two_places_with_different_names_is_an_error():
    x = pk.wildcard()
    left = alt(tag="form", exp=pk.is_op("exp")(x), log=pk.is_op("log")(x))
    right = alt(tag="form", exp=pk.is_op("exp")(x), log=pk.is_op("log")(x))
    a = _var("a")
    found = pk.dpl.find_match(pk.is_op("add")(left, right),
                          relax.op.add(relax.op.exp(a), relax.op.log(a)))
    with pytest.raises(pk.PatternError, match="'form' names two alternatives"):
        found.tag("form")


def test_a_match_answers_every_tag_alike_however_often_asked():
    # tags are indexed once per match: asking again, asking others, asking after the
    # error, and asking a match whose captures grew all answer from the captures
    x = pk.wildcard()
    left = alt(tag="form", exp=pk.is_op("exp")(x), log=pk.is_op("log")(x))
    right = alt(tag="other", exp=pk.is_op("exp")(x), log=pk.is_op("log")(x))
    a = _var("a")
    found = pk.dpl.find_match(pk.is_op("add")(left, right),
                              relax.op.add(relax.op.log(a), relax.op.exp(a)))
    for _ in range(2):
        assert (found.tag("form"), found.tag("other"), found.tag("never")) == (
            "log", "exp", None)
    clash = TagPattern(pk.is_op("exp")(x), "form", "exp")
    found.captures[clash] = found.root  # a second alternative of "form" recorded
    with pytest.raises(pk.PatternError, match="'form' names two alternatives that both "
                                              "matched \\('log' and 'exp'\\)"):
        found.tag("form")
    assert found.tag("other") == "exp"


def test_alt_refuses_a_missing_tag_and_an_empty_list():
    with pytest.raises(pk.PatternError, match="non-empty string tag"):
        alt(pk.wildcard(), tag="")
    with pytest.raises(pk.PatternError, match="no alternative"):
        alt(tag="form")


def test_tags_need_no_operators_and_hide_none_from_the_index():
    x = pk.wildcard()
    plain = pk.is_op("exp")(x) | pk.is_op("log")(x)
    tagged = alt(pk.is_op("exp")(x), pk.is_op("log")(x), tag="unary")
    assert root_op_names(tagged) == root_op_names(plain) == {"relax.exp", "relax.log"}
    assert required_op_names(pk.is_op("add")(tagged, x)) == \
        required_op_names(pk.is_op("add")(plain, x))


class _ReadsTheForm(pk.RewriteRule):
    """``exp(x) * c`` / ``c * exp(x)`` / ``exp(x) / c``: the form reaches the plan by name."""

    name = "test.reads_the_form"

    def __init__(self):
        super().__init__()
        self.x, self.c = pk.wildcard(), pk.wildcard()
        e = pk.is_op("exp")(self.x)
        self.pattern = alt(tag="site", right=pk.is_op("multiply")(e, self.c),
                           divided=pk.is_op("divide")(e, self.c))
        self.forms: list[str | None] = []

    def check(self, match):
        self.forms.append(match.tag("site"))
        return True

    def rewrite(self, match):
        return relax.op.exp(match.x)


def _module(build) -> tvm.IRModule:
    a, b = _var("a"), _var("b")
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, a, b))
        bb.emit_func_output(out)
    return bb.get()


def test_a_rule_reads_the_alternative_that_matched_through_the_rewrite_engine():
    # the engine matches with its index, where a nest of | is flattened (tags looked through)
    cases = [("right", lambda bb, a, b: relax.op.multiply(bb.emit(relax.op.exp(a)), b)),
             ("right", lambda bb, a, b: relax.op.multiply(b, bb.emit(relax.op.exp(a)))),
             ("divided", lambda bb, a, b: relax.op.divide(bb.emit(relax.op.exp(a)), b))]
    for form, build in cases:
        rule = _ReadsTheForm()
        out = pk.rewrite(rule, _module(build))
        assert rule.forms == [form]
        assert out["main"].body.blocks[0].bindings[-1].value.op.name == "relax.exp"


def test_the_engine_records_the_same_tags_as_the_plain_matcher():
    x, y = pk.wildcard(), pk.wildcard()
    first = pk.is_op("add")(alt(tag="inner", exp=pk.is_op("exp")(x)), pk.is_op("sqrt")(y))
    second = pk.is_op("add")(alt(tag="inner", exp=pk.is_op("exp")(x)), pk.is_op("log")(y))
    scaled = alt(tag="site", product=pk.is_op("multiply")(pk.wildcard(), pk.wildcard()),
                 plain=alt(first, second, tag="which"))
    pattern = pk.is_op("negative")(scaled)
    mod = _module(lambda bb, a, b: relax.op.negative(bb.emit(relax.op.add(
        bb.emit(relax.op.exp(a)), bb.emit(relax.op.log(b))))))
    func = mod["main"]
    plain = pk.dpl.find_match(pattern, func.body.blocks[0].bindings[-1].value, func)
    expected = {"site": "plain", "which": "1", "inner": "exp"}
    assert {t: plain.tag(t) for t in expected} == expected
    rule = _ReadsTheForm()
    rule.pattern = pattern
    seen = []
    rule.check = lambda match: seen.append({t: match.tag(t) for t in expected}) or pk.reject(
        "only read the tags")
    pk.rewrite(rule, mod)
    assert seen == [expected]


def test_the_text_of_a_pattern_and_explain_show_the_tag():
    x = pk.wildcard()
    pattern = alt(tag="unary", exp=pk.is_op("exp")(x), log=pk.is_op("log")(x))
    assert pk.dpl.pattern.pattern_to_text(pattern) == "(unary=exp: exp(*) | unary=log: log(*))"
    near_miss = pk.explain(pk.is_op("add")(alt(tag="unary", log=pk.is_op("log")(x)), x),
                           relax.op.add(relax.op.sqrt(_var("a")), _var("b")))
    assert near_miss == "no match: log(*) (depth 2 in unary=log) vs R.sqrt(a)", near_miss
    untagged = pk.explain(pk.is_op("add")(pk.is_op("log")(x), x),
                          relax.op.add(relax.op.sqrt(_var("a")), _var("b")))
    assert untagged == "no match: log(*) (depth 2) vs R.sqrt(a)"  # a tag is no pattern level


def test_to_dpl_drops_the_tags_and_keeps_the_alternatives():
    a = _var("a")
    pattern = alt(tag="unary", exp=pk.is_op("exp")(pk.wildcard()),
                  log=pk.is_op("log")(pk.wildcard()))
    converted = pattern.to_dpl()
    assert isinstance(converted, relax.dpl.OrPattern)
    assert converted.match(relax.op.log(a)) and converted.match(relax.op.exp(a))
    assert not converted.match(relax.op.sqrt(a))


class _TwoReadersOfX(pk.engine.BindingsRewriteRule):
    """``exp(x)`` and ``log(x)`` or ``sqrt(x)`` of one ``x``: a rule with two roots that
    reads which second reader matched, and refuses (it only reads the tag)."""

    name = "test.two_readers_of_x"

    def __init__(self):
        super().__init__()
        self.x = pk.wildcard()
        # built outside the context: its alternatives are not each a reader of x
        self.second = alt(tag="second", log=pk.is_op("log")(self.x),
                          sqrt=pk.is_op("sqrt")(self.x))
        with pk.PatternContext() as self.context:
            self.first = pk.is_op("exp")(self.x)
            self.x.used_by(self.second)
        self.seen: list[tuple[str | None, str | None]] = []

    def check(self, match):
        self.seen.append((match.tag("second"), match.tag("unknown")))
        return pk.reject("only read the tag")


def test_a_rule_with_several_roots_reads_the_tag_of_its_match():
    mod = _module(lambda bb, a, b: relax.op.add(bb.emit(relax.op.exp(a)),
                                                bb.emit(relax.op.sqrt(a))))
    rule = _TwoReadersOfX()
    pk.rewrite(rule, mod)
    assert rule.seen == [("sqrt", None)]
