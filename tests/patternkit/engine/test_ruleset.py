"""Rule sets are values: they compose, filter by prefix, and go wherever rules are taken."""

from __future__ import annotations

import pytest
import tvm

import patternkit as pk
from patternkit.patterns import LIBRARY
from patternkit.patterns.batchnorm import BatchnormCollapse
from patternkit.patterns.conv import BatchnormFoldIntoConv, ConvAddReluComposite


@pytest.fixture
def rules():
    return (BatchnormCollapse(), BatchnormFoldIntoConv(), ConvAddReluComposite("ccompiler"))


def test_a_rule_set_is_an_ordered_sequence_of_named_rules(rules):
    ruleset = pk.RuleSet(rules)
    assert list(ruleset) == list(rules) and len(ruleset) == 3
    assert ruleset.names == ("batchnorm.collapse", "conv.fold_batchnorm",
                             "ccompiler.conv2d_add_relu")
    assert ruleset[1] is rules[1] and ruleset["conv.fold_batchnorm"] is rules[1]
    assert "batchnorm.collapse" in ruleset and rules[2] in ruleset


def test_rule_sets_compose_with_or_the_left_side_first(rules):
    a, b = pk.RuleSet(rules[:1]), pk.RuleSet(rules[1:])
    assert list(a | b) == list(rules) and list(b | a) == [*rules[1:], rules[0]]
    assert (a | b) == pk.RuleSet(rules) and hash(a | b) == hash(pk.RuleSet(rules))
    assert list(a | rules[2]) == [rules[0], rules[2]]
    assert list([rules[2]] | a) == [rules[2], rules[0]]
    assert list(a | a | b) == list(rules)  # the same rule is kept once
    assert list(a) == [rules[0]]  # a value: composing made new sets


def test_two_different_rules_with_one_name_do_not_share_a_set():
    with pytest.raises(pk.PatternError, match="two different rules are named "
                                              r"'batchnorm.collapse' \(two instances of "
                                              r"BatchnormCollapse; give each its own `name`\)"):
        pk.RuleSet([BatchnormCollapse()]) | pk.RuleSet([BatchnormCollapse()])


def test_a_rule_set_holds_only_rules():
    with pytest.raises(pk.PatternError, match="item 0 is a tuple"):
        pk.RuleSet([("c.x", pk.wildcard())])


def test_rule_sets_filter_by_prefix_and_kind(rules):
    ruleset = pk.RuleSet(rules)
    assert ruleset.by_prefix("batchnorm.").names == ("batchnorm.collapse",)
    assert ruleset.by_prefix("nothing.") == pk.RuleSet()
    assert ruleset.rewrite_rules().names == ("batchnorm.collapse", "conv.fold_batchnorm")
    assert ruleset.composites().names == ("ccompiler.conv2d_add_relu",)
    assert ruleset.for_compiler("dnnl").names[-1] == "dnnl.conv2d_add_relu"
    assert ruleset.for_compiler("dnnl")[0] is rules[0]  # rewrite rules are not renamed


def test_find_and_select_name_rules_and_suggest_close_names():
    assert LIBRARY.select(["conv.fold_batchnorm", "batchnorm.collapse"]).names == (
        "conv.fold_batchnorm", "batchnorm.collapse")
    with pytest.raises(KeyError, match="did you mean batchnorm.collapse"):
        LIBRARY.find("batchnorm.colapse")


def test_rewrite_applies_the_rewrite_rules_of_a_set():
    mod = BatchnormCollapse().example()
    log = pk.RewriteLog()
    out = pk.rewrite(LIBRARY, mod, log=log)
    assert log.counts() == {"batchnorm.collapse": 1}
    tvm.ir.assert_structural_equal(out, pk.rewrite(BatchnormCollapse(), mod))
    seq = tvm.transform.Sequential([pk.Rewrite(LIBRARY.by_prefix("batchnorm."))])
    tvm.ir.assert_structural_equal(seq(mod), out)


def test_a_set_without_rewrite_rules_cannot_rewrite():
    with pytest.raises(pk.PatternError, match="has no rewrite rules"):
        pk.rewrite(LIBRARY.composites(), BatchnormCollapse().example())


def test_external_compiler_passes_take_the_composites_of_a_set():
    block = ConvAddReluComposite().example()
    ruleset = LIBRARY.for_compiler("ccompiler")
    out = pk.MergeComposite(ruleset)(block)
    assert pk.byoc.composite_counts(out) == {"ccompiler.conv2d_add_relu": 3}
    tvm.ir.assert_structural_equal(out, pk.byoc.merge_composite(
        block, [ConvAddReluComposite("ccompiler")]))
    report = pk.offload_report(block, ruleset, compiler="ccompiler")
    assert report.composites == {"ccompiler.conv2d_add_relu": 3}


def test_a_rule_class_where_a_rule_belongs_is_a_type_error_naming_it(rules):
    for make in (lambda: pk.RuleSet([BatchnormCollapse]), lambda: pk.RuleSet(BatchnormCollapse),
                 lambda: pk.RuleSet(rules) | BatchnormCollapse,
                 lambda: BatchnormCollapse | pk.RuleSet(rules)):
        with pytest.raises(TypeError, match=r"BatchnormCollapse is a rule class, not a rule; "
                                            r"pass an instance: BatchnormCollapse\(\)"):
            make()
