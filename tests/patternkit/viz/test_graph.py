"""Tests of patternkit.viz.graph: VizGraph's exports when optional packages are missing."""

from __future__ import annotations

import sys

import pytest

from patternkit.testing import batchnorm_chain
from patternkit.viz import viz_expr


def test_to_networkx_without_networkx_names_the_extra_to_install(monkeypatch):
    graph = viz_expr(batchnorm_chain(1))
    monkeypatch.setitem(sys.modules, "networkx", None)  # makes `import networkx` fail
    with pytest.raises(ImportError, match=r"pip install 'patternkit\[networkx\]'"):
        graph.to_networkx()
    assert "digraph" in graph.source  # the DOT text needs no optional package
