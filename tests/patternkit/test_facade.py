"""The top level is a curated façade: few names, each from its layer, and a stub that agrees."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import patternkit as pk

STUB = Path(pk.__file__).with_suffix(".pyi")


def test_the_top_level_holds_a_curated_set_of_names_each_once():
    assert len(pk.__all__) == len(set(pk.__all__))
    assert 35 <= len(pk.__all__) <= 50, len(pk.__all__)


@pytest.mark.parametrize("name", pk.__all__)
def test_each_public_name_is_the_object_its_layer_exports(name):
    home = next(home for home, names in pk.PUBLIC.items() if name in names)
    module = importlib.import_module(f"patternkit.{home}")
    assert getattr(pk, name) is getattr(module, name)
    if hasattr(module, "__path__"):  # a subpackage: the name is part of its own API
        assert name in module.__all__, f"patternkit.{home}.__all__ lacks {name}"


def test_the_stub_for_type_checkers_lists_exactly_the_public_names():
    tree = ast.parse(STUB.read_text())
    stubbed = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                assert alias.asname == alias.name, "re-export as `from .x import n as n`"
                stubbed[alias.name] = node.module
    assert stubbed == {name: home for home, names in pk.PUBLIC.items() for name in names}


def test_a_name_that_left_the_top_level_still_works_and_says_where_it_lives():
    with pytest.warns(DeprecationWarning, match=r"patternkit\.dpl\.find_match"):
        found = pk.find_match
    assert found is pk.dpl.find_match


@pytest.mark.parametrize("name", [n for names in pk.MOVED.values() for n in names])
def test_every_moved_name_resolves_in_its_new_home(name):
    home = next(home for home, names in pk.MOVED.items() if name in names)
    with pytest.warns(DeprecationWarning):
        value = getattr(pk, name)
    assert value is getattr(importlib.import_module(f"patternkit.{home}"), name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        pk.nonsense  # noqa: B018


def test_importing_the_facade_does_not_load_tvm():
    code = "import sys, patternkit\nassert 'tvm' not in sys.modules\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
