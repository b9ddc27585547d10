"""Every rule of the library is named, documented, and proved four ways by its family's tests.

The contract (``patternkit.testing``): each rule and composite in ``LIBRARY`` has a
``RuleCase`` in ``tests/patterns/test_<family>.py`` that a test of that file runs with
``check_rule``; and every ``reject(...)`` in a rule module's source is reached by a
negative case of that case, which asserts its reason.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import patternkit as pk
import patternkit.patterns as library
from patternkit.patterns import EXPANSIONS, FAMILIES, LIBRARY, family_of
from patternkit.testing import RuleCase
from patternkit.testing.contract import prove_reasons

TESTS = Path(__file__).resolve().parent
RULES = [*LIBRARY, *EXPANSIONS]  # expand rules are proved like the rest


def _family(rule) -> str:
    return family_of(rule)


def _test_module(family: str):
    """``tests/patterns/test_<family>.py`` as pytest imports it (its folder is on the path)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    return importlib.import_module(f"test_{family}")


def _cases(family: str) -> dict[str, tuple[str, RuleCase]]:
    """Rule name -> (global name, case) of the cases a family's test module defines."""
    module = _test_module(family)
    return {value.name: (name, value) for name, value in vars(module).items()
            if isinstance(value, RuleCase)}


def _case(rule) -> RuleCase:
    cases = _cases(_family(rule))
    assert rule.rule_name in cases, (f"tests/patterns/test_{_family(rule)}.py has no RuleCase "
                                     f"for {rule.rule_name}")
    return cases[rule.rule_name][1]


def test_library_rule_names_are_unique_and_dotted():
    names = [*LIBRARY.names, *EXPANSIONS.names]
    assert len(names) == len(set(names)) == len(RULES)
    for name in names:
        assert re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", name), name


def test_the_library_holds_every_rule_and_composite_of_every_family_module():
    modules = sorted(info.name for info in pkgutil.iter_modules(library.__path__)
                     if info.name != "near_misses")  # the families' detectors, no family
    assert sorted(FAMILIES) == modules, "a rule module that LIBRARY does not include"
    # A family tuple holds rule classes (built with their defaults) or instances (variants).
    def built(entry, *args):
        return entry if isinstance(entry, pk.Rule) else entry(*args)

    def tuples(family):
        module = getattr(library, family)
        return ([built(e) for e in module.RULES]
                + [built(e, library.COMPOSITE_PREFIX).for_compiler(library.COMPOSITE_PREFIX)
                   for e in getattr(module, "COMPOSITES", ())],
                [built(e) for e in getattr(module, "EXPANSIONS", ())])

    expected = [rule for family in FAMILIES for rule in tuples(family)[0]]
    assert [(type(r), r.rule_name) for r in LIBRARY] == [(type(r), r.rule_name) for r in expected]
    expansions = [rule for family in FAMILIES for rule in tuples(family)[1]]
    assert [(type(r), r.rule_name) for r in EXPANSIONS] == [(type(r), r.rule_name)
                                                            for r in expansions]
    assert all(".expand" in name for name in EXPANSIONS.names)


def test_expand_rules_are_kept_out_of_the_library():
    assert EXPANSIONS.names and all(".expand" in name for name in EXPANSIONS.names)
    assert not set(EXPANSIONS.names) & set(LIBRARY.names)
    assert not any(".expand" in name for name in LIBRARY.names)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.rule_name)
def test_rule_is_documented_and_has_an_example(rule):
    assert type(rule).__doc__ and type(rule).__doc__.strip()
    module_doc = sys.modules[type(rule).__module__].__doc__
    assert module_doc and len(module_doc.strip().splitlines()) > 3
    assert rule.example() is not None, f"{rule.rule_name} has no example() for verify"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.rule_name)
def test_rule_has_a_contract_case_with_every_proof(rule):
    case = _case(rule)
    assert type(case.rule) is type(rule)
    assert case.before is not None and case.expected is not None  # 1. structure
    assert case.negatives  # 2. reasons
    assert case.tolerance.why.strip()  # 4. numerics, with the reason for the tolerance
    if isinstance(rule, pk.CompositeRule):  # a composite only moves bindings
        assert case.tolerance.exact, f"{rule.rule_name}: composites are proved bit-exact"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.rule_name)
def test_the_family_tests_run_the_contract_case(rule):
    family = _family(rule)
    global_name, _ = _cases(family)[rule.rule_name]
    tree = ast.parse((TESTS / f"test_{family}.py").read_text())
    runs = [fn.name for fn in tree.body
            if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")
            for call in ast.walk(fn) if isinstance(call, ast.Call)
            and getattr(call.func, "id", None) == "check_rule"
            and [getattr(a, "id", None) for a in call.args] == [global_name]]
    assert runs, f"no test in test_{family}.py calls check_rule({global_name})"


def _reject_sites(module) -> list[tuple[str | None, int, int]]:
    """``(enclosing class or None, first line, last line)`` of each reject(...) / Reject(...)."""
    tree = ast.parse(inspect.getsource(module))
    sites = []

    def visit(node, owner):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.ClassDef) else owner
            if isinstance(child, ast.Call):
                func = child.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name in ("reject", "Reject"):
                    sites.append((owner, child.lineno, child.end_lineno))
            visit(child, inner)

    visit(tree, None)
    return sites


def _family_modules(family: str) -> list:
    """A family's modules: the family module, and every module under it if it is a package."""
    module = importlib.import_module(f"patternkit.patterns.{family}")
    found = [module]
    for info in pkgutil.walk_packages(getattr(module, "__path__", ()), f"{module.__name__}."):
        found.append(importlib.import_module(info.name))
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_every_reject_in_a_rule_module_has_a_negative_case_asserting_its_reason(family):
    modules = {inspect.getsourcefile(module): module for module in _family_modules(family)}
    hit: dict[str, list[tuple[str, int]]] = {}
    for _, case in _cases(family).values():
        # Several cases may prove one class (its variants): their sites add up.
        hit.setdefault(type(case.rule).__name__, []).extend(
            r.site for r in prove_reasons(case) if r.site is not None and r.site[0] in modules)
    everywhere = [site for sites in hit.values() for site in sites]
    missing = []
    for path, module in modules.items():
        for owner, first, last in _reject_sites(module):
            sites = everywhere if owner is None else hit.get(owner, [])
            if not any(file == path and first <= line <= last for file, line in sites):
                missing.append(f"{os.path.relpath(path, TESTS.parents[1])}:{first} "
                               f"({owner or 'module level'})")
    assert not missing, ("reject(...) sites that no negative case reaches (add a Negative "
                         "with the reason to the rule's RuleCase): " + ", ".join(missing))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.rule_name)
def test_rule_example_fires_and_keeps_the_numbers(rule):
    from patternkit.testing import apply_rule

    before = rule.example()
    applied = apply_rule(rule, before)
    assert applied.fired >= 1
    # Composites only wrap bindings: bit-exact.  Rewrites change arithmetic order.
    tol = 0.0 if isinstance(rule, pk.CompositeRule) else 1e-5
    pk.assert_same_numerics(before, applied.module, positive=("var",), rtol=tol, atol=tol)
