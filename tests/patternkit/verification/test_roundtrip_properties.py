"""Property tests: DefuseOps undoes FuseOps and FuseOpsByPattern on random Relax graphs.

Budgets come from the hypothesis profile (``HYPOTHESIS_PROFILE``, see ``tests/conftest.py``):
the structural properties take the profile's ``max_examples``, the numeric one, which
builds twice for llvm per example, a twelfth of it.

A property that holds because nothing happened proves nothing, so each structural
property also asserts, over the examples it drew, that most of them were really fused.
"""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, reject, settings  # noqa: E402

import tvm  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.transform import FuseOpsByPattern  # noqa: E402

from patternkit.fusion import function_kinds  # noqa: E402
from patternkit.testing import assert_roundtrip, fusion_patterns, relax_graphs  # noqa: E402

NUMERIC_EXAMPLES = max(1, settings.default.max_examples // 12)  # 25 in the ci profile


def _kinds(mod):
    return {k for _, f in mod.functions.items() for k in function_kinds(f)}


def _assert_mostly_fused(fused: list[bool], what: str) -> None:
    """At least half of the drawn examples made a fused function (the property is not vacuous)."""
    assert fused, f"{what}: the property drew no example"
    assert sum(fused) >= 0.5 * len(fused), \
        f"{what}: only {sum(fused)} of {len(fused)} examples were fused"


def test_defuse_undoes_fuse_ops():
    fused = []

    @given(relax_graphs(max_ops=12))
    def defuse_undoes_fuse_ops(mod):
        result = assert_roundtrip(mod)
        assert relax.analysis.check_well_formed(result.restored)
        assert not _kinds(result.restored)
        fused.append("primitive" in _kinds(result.fused))

    defuse_undoes_fuse_ops()
    _assert_mostly_fused(fused, "FuseOps")


def _fuse_by_pattern(mod):
    """FuseOpsByPattern, discarding the inputs it cannot handle (a TVM 0.27 bug).

    When an intermediate of a match also feeds one of the match's own inputs (``m =
    matmul(x, w); r = relu(relu(m)); add(m, r)`` with ``add(matmul, *)`` as the pattern),
    FuseOpsByPattern either raises "cyclic dependency" or emits a ``main`` that reads a
    variable it never defines.  Neither is a DefuseOps question, so such draws are
    rejected rather than reported.
    """
    try:
        fused = FuseOpsByPattern(fusion_patterns())(mod)
    except tvm.error.InternalError as err:
        if "cyclic dependency" in str(err):
            reject()
        raise
    if not relax.analysis.check_well_formed(fused):
        reject()
    return fused


def test_defuse_undoes_fuse_ops_by_pattern():
    fused = []

    @given(relax_graphs(max_ops=12))
    def defuse_undoes_fuse_ops_by_pattern(mod):
        result = assert_roundtrip(mod, _fuse_by_pattern)
        assert not _kinds(result.restored)
        fused.append("composite" in _kinds(result.fused))

    defuse_undoes_fuse_ops_by_pattern()
    _assert_mostly_fused(fused, "FuseOpsByPattern")


@settings(max_examples=NUMERIC_EXAMPLES)
@given(relax_graphs(max_ops=6))
def test_round_trip_keeps_the_numbers_on_the_vm(mod):
    result = assert_roundtrip(mod, numeric=True, rtol=1e-6, atol=1e-6,
                              numeric_options={"shape_vars": {"n": 3}})
    assert result.numeric.ok
