"""The job's rules: library names, the user's rule objects and rule files, clear errors."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

import patternkit as pk
from patternkit.app.job import JobError, run
from patternkit.app.rules import resolve_rules
from patternkit.patterns import LIBRARY

RULES_FILE = Path(__file__).with_name("user_rules.py")


def _negated_twice():
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    return pk.ir.from_expr(relax.op.nn.relu(relax.op.nn.relu(relax.op.negative(
        relax.op.negative(x)))))


def test_library_names_are_resolved_in_the_order_given():
    assert resolve_rules(["conv.fold_batchnorm", "batchnorm.collapse"]).names == (
        "conv.fold_batchnorm", "batchnorm.collapse")
    assert resolve_rules(None) is LIBRARY


def _user_rules() -> dict:
    return runpy.run_path(str(RULES_FILE))


def test_rule_instances_and_rule_sets_are_taken_as_they_are():
    rules = _user_rules()
    negation, relu = rules["double_negation"], rules["double_relu"]
    chosen = resolve_rules([negation, pk.RuleSet([relu]), "batchnorm.collapse"])
    assert list(chosen)[:2] == [negation, relu]
    assert chosen.names[2] == "batchnorm.collapse"
    assert list(resolve_rules(relu)) == [relu]


def test_a_rule_file_gives_every_rule_it_defines_and_file_name_one_of_them():
    assert resolve_rules([str(RULES_FILE)]).names == ("user.double_negation", "user.double_relu")
    assert resolve_rules([f"{RULES_FILE}:double_relu"]).names == ("user.double_relu",)
    assert resolve_rules([f"{RULES_FILE}:BOTH", "batchnorm.collapse"]).names == (
        "user.double_negation", "user.double_relu", "batchnorm.collapse")


@pytest.mark.parametrize("patterns, message", [
    ([pk.RewriteRule], "RewriteRule() is no usable rule: RewriteRule.pattern must be a "
                       "patternkit pattern"),
    ([pk.CompositeRule], "CompositeRule() is no usable rule"),
    ([42], "expected rule names, rules or RuleSets, found a int"),
    (["batchnorm.colapse"], "did you mean batchnorm.collapse"),
    ([f"{RULES_FILE}:nosuch"], "defines no 'nosuch'"),
    (["missing_rules.py"], "rule file not found"),
])
def test_what_is_not_a_rule_is_a_clear_error(patterns, message):
    with pytest.raises(JobError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_rules(patterns)


def test_the_job_applies_the_users_rules_and_reports_them_by_the_names_it_accepts(tmp_path):
    rules = _user_rules()
    mod = _negated_twice()
    report = run(mod, patterns=[rules["DropDoubleNegation"](),
                                pk.RuleSet([rules["DropDoubleRelu"]()])],
                 out_dir=None)
    assert report.ok and report.rewrites == {"user.double_negation": 1, "user.double_relu": 1}
    assert report.patterns == ["user.double_negation", "user.double_relu"]
    again = run(mod, patterns=[str(RULES_FILE)], out_dir=None)
    assert again.rewrites == report.rewrites


def test_the_reported_pattern_names_are_accepted_back_as_patterns():
    report = run("seed-batchnorm", out_dir=None)
    assert report.patterns == list(LIBRARY.names)  # byoc.conv2d_add_relu, not ccompiler.*
    assert resolve_rules(report.patterns).names == LIBRARY.names


NEW_KINDS_FILE = Path(__file__).with_name("user_rules_by_example.py")


def _every_kind_of_user_graph():
    """``-(-x)``, hard-swish written out, ``y - (-y)`` and swish, one after another."""
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    y = relax.op.negative(relax.op.negative(x))
    y = y * relax.op.clip(y + relax.const(3.0, "float32"), 0.0, 6.0) / relax.const(6.0,
                                                                                 "float32")
    y = relax.op.subtract(y, relax.op.negative(y))
    return pk.ir.from_expr(y * relax.op.sigmoid(y))


def test_a_rule_file_gives_its_by_example_and_rewriter_rules_and_builds_its_rule_classes():
    assert resolve_rules([str(NEW_KINDS_FILE)]).names == (
        "user.hardswish", "user.minus_negative", "user.double_negation")


def test_a_rule_class_that_needs_no_argument_is_built_and_one_that_does_is_named():
    rules = runpy.run_path(str(NEW_KINDS_FILE))
    assert resolve_rules([rules["DropDoubleNegation"]]).names == ("user.double_negation",)
    assert resolve_rules([f"{NEW_KINDS_FILE}:DropDoubleNegation"]).names == (
        "user.double_negation",)
    with pytest.raises(JobError, match=r"ScaleBy is a rule class whose constructor needs "
                                       r"factor; pass an instance, ScaleBy\(...\)"):
        resolve_rules([rules["ScaleBy"]])


def test_a_file_of_classes_needing_arguments_says_which_it_skipped(tmp_path):
    path = tmp_path / "rules.py"
    path.write_text("import patternkit as pk\n\n"
                    "class Scale(pk.RewriteRule):\n"
                    "    def __init__(self, factor):\n"
                    "        super().__init__()\n")
    with pytest.raises(JobError, match=r"defines no rules .*skipped: Scale \(its constructor "
                                       r"needs factor\)"):
        resolve_rules([str(path)])


def test_library_and_a_rule_file_apply_together_where_the_file_alone_replaces_the_library():
    mod = _every_kind_of_user_graph()
    user = {"user.double_negation": 1, "user.hardswish": 1, "user.minus_negative": 1}
    alone = run(mod, patterns=[str(NEW_KINDS_FILE)], out_dir=None)
    assert alone.ok and alone.rewrites == user
    both = run(mod, patterns=f"library,{NEW_KINDS_FILE}", out_dir=None)
    assert both.ok and both.rewrites == {**user, "silu.collapse": 1}
    assert resolve_rules(["library", str(NEW_KINDS_FILE)]).names == (
        *LIBRARY.names, "user.hardswish", "user.minus_negative", "user.double_negation")


def test_run_help_spells_how_to_apply_a_rule_file_with_the_library():
    from patternkit.app.cli import build_parser

    parser = build_parser()
    run_parser = parser._subparsers._group_actions[0].choices["run"]  # noqa: SLF001
    text = " ".join(run_parser.format_help().split())
    assert "'library' is the whole library, so library,rules.py applies the file's rules " \
           "with the library" in text
