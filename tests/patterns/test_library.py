"""Every rule in the pattern library is named, documented, tested and verified."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import patternkit as pk
from patternkit.patterns import FAMILIES, all_rules

TESTS = Path(__file__).resolve().parent
RULES = all_rules()


def test_rule_names_are_unique_and_dotted():
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", name), name


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule_is_documented_and_tested(rule):
    assert rule.__doc__ and rule.__doc__.strip()
    family = rule.__module__.rsplit(".", 1)[-1]
    assert family in FAMILIES
    module_doc = __import__(rule.__module__, fromlist=["x"]).__doc__
    assert module_doc and len(module_doc.strip().splitlines()) > 3
    test_file = TESTS / f"test_{family}.py"
    assert test_file.exists() and rule.__name__ in test_file.read_text()


@pytest.mark.parametrize("rule", [r for r in RULES if hasattr(r, "example")],
                         ids=lambda r: r.name)
def test_rule_example_rewrites_and_keeps_the_numbers(rule):
    before = rule.example()
    log = pk.RewriteLog()
    after = pk.rewrite(rule(), before, log=log)
    assert log.count(rule.name) >= 1
    pk.assert_same_numerics(before, after, positive=("var",), rtol=1e-5, atol=1e-5)
