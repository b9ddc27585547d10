"""Fixtures of the benchmark scripts' tests: the scripts loaded as modules."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(file_name: str):
    """``benchmarks/<file_name>`` imported under its stem (scripts are not a package;
    their ``main`` does not run)."""
    path = BENCHMARKS / file_name
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def coverage_script():
    return _load("coverage.py")


@pytest.fixture(scope="module")
def bench_layernorm():
    return _load("bench_layernorm.py")


@pytest.fixture(scope="module")
def bench_from_rewriter():
    return _load("bench_from_rewriter.py")


@pytest.fixture(scope="module")
def bench_library():
    return _load("bench_library.py")


@pytest.fixture(scope="module")
def bench_outline():
    return _load("bench_outline.py")
