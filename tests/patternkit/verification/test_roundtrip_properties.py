"""Property tests: DefuseOps undoes FuseOps and FuseOpsByPattern on random Relax graphs.

Profiles (select with the ``HYPOTHESIS_PROFILE`` environment variable):

``ci`` (default)
    300 examples per structural property (25 for the numeric one), derandomised (fixed
    seed) so CI failures reproduce;
``long``
    5000 examples per structural property (300 numeric), random seed, for a soak run.
"""

from __future__ import annotations

import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, reject, settings  # noqa: E402

import tvm  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.transform import FuseOpsByPattern  # noqa: E402

from patternkit.fusion import function_kinds  # noqa: E402
from patternkit.testing import assert_roundtrip, fusion_patterns, relax_graphs  # noqa: E402

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=300, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=5000, **_COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")


def _kinds(mod):
    return {k for _, f in mod.functions.items() for k in function_kinds(f)}


# examples seen / examples where fusion created functions, per fusion
STATS = {"primitive": [0, 0], "composite": [0, 0]}


def _record(kind, fused):
    STATS[kind][0] += 1
    STATS[kind][1] += kind in _kinds(fused)


@settings(settings.get_profile(PROFILE))
@given(relax_graphs(max_ops=12))
def test_defuse_undoes_fuse_ops(mod):
    result = assert_roundtrip(mod)
    assert relax.analysis.check_well_formed(result.restored)
    _record("primitive", result.fused)
    assert not _kinds(result.restored)


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


@settings(settings.get_profile(PROFILE))
@given(relax_graphs(max_ops=12))
def test_defuse_undoes_fuse_ops_by_pattern(mod):
    result = assert_roundtrip(mod, _fuse_by_pattern)
    _record("composite", result.fused)
    assert not _kinds(result.restored)


NUMERIC_EXAMPLES = {"ci": 25, "long": 300}.get(PROFILE, 25)


@settings(settings.get_profile(PROFILE), max_examples=NUMERIC_EXAMPLES)
@given(relax_graphs(max_ops=6))
def test_round_trip_keeps_the_numbers_on_the_vm(mod):
    # two llvm builds per example (~0.1-0.3 s), so fewer examples than the structural tests
    result = assert_roundtrip(mod, numeric=True, rtol=1e-6, atol=1e-6,
                              numeric_options={"shape_vars": {"n": 3}})
    assert result.numeric.ok


def test_the_random_graphs_really_exercised_fusion():
    """Guard against a vacuous property: most drawn graphs must have been fused."""
    for kind, (seen, fused) in STATS.items():
        if seen < 50:
            pytest.skip("run together with the property tests above")
        assert fused >= 0.5 * seen, f"{kind}: only {fused} of {seen} examples were fused"
