"""Property tests: DefuseOps undoes FuseOps and FuseOpsByPattern on random Relax graphs.

Budgets come from the hypothesis profile (``HYPOTHESIS_PROFILE``, see ``tests/conftest.py``):
the structural properties take the profile's ``max_examples`` (the newer ones, on
symbolic batches through MergeCompositeFunctions and on dead bindings, a quarter of it),
the numeric one, which builds twice for llvm per example, a twelfth of it.

A property that holds because nothing happened proves nothing, so each structural
property also asserts, over the examples it drew, that most of them were really fused.
"""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
import tvm  # noqa: E402
from hypothesis import (  # noqa: E402
    given,
    reject,
    settings,
    strategies as st,  # noqa: E402
)
from tvm import relax  # noqa: E402
from tvm.relax.transform import FuseOpsByPattern, MergeCompositeFunctions  # noqa: E402

import patternkit as pk  # noqa: E402
from patternkit.byoc import MergeComposite, PartitionGraph  # noqa: E402
from patternkit.fusion import function_kinds  # noqa: E402
from patternkit.testing import assert_roundtrip, fusion_patterns, relax_graphs  # noqa: E402
from patternkit.verification.roundtrip import dead_bindings  # noqa: E402

NUMERIC_EXAMPLES = max(1, settings.default.max_examples // 12)  # 25 in the ci profile
SMALL_EXAMPLES = max(10, settings.default.max_examples // 4)  # 75 in the ci profile


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


def _symbolic_batch(func) -> bool:
    """Does ``func`` take an image batch of symbolic size (``R.Tensor(("n", c, h, w))``)?"""
    return any(isinstance(p.ty, relax.TensorType) and p.ty.ndim == 4
               and not isinstance(p.ty.shape[0], tvm.tirx.IntImm)
               for p in func.params)


def _symbolic_batch_conv_composites(mod) -> int:
    return sum(str((f.attrs or {}).get("Composite", "")).startswith("test.conv2d")
               and _symbolic_batch(f) for _, f in mod.functions.items())


@settings(max_examples=SMALL_EXAMPLES)
@given(relax_graphs(max_ops=12))
def test_defuse_undoes_merge_composite_functions(mod):
    """The BYOC flow on TVM's side: composites with a symbolic batch among their
    parameters, nested in Codegen functions that each define their own ``n``."""
    def merge(m):
        return MergeCompositeFunctions()(_fuse_by_pattern(m))

    result = assert_roundtrip(mod, merge)
    assert relax.analysis.check_well_formed(result.fused)
    assert not _kinds(result.restored)


def _patternkit_table():
    """A few of :func:`fusion_patterns` in patternkit's pattern language."""
    binary = (pk.is_op("add") | pk.is_op("multiply"))(pk.wildcard(), pk.wildcard())
    return [("test.conv2d_add", pk.is_op("add")(pk.is_op("nn.conv2d")(pk.wildcard(),
                                                                      pk.wildcard()),
                                                  pk.wildcard())),
            ("test.conv2d", pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard())),
            ("test.matmul", pk.is_op("matmul")(pk.wildcard(), pk.wildcard())),
            ("test.binary_relu", pk.is_op("nn.relu")(binary)),
            ("test.concat", pk.is_op("concat")(pk.wildcard()))]


def test_defuse_undoes_patternkits_partition_graph():
    """patternkit's own BYOC flow: every external function defines its own symbolic
    variables (a concat's ``n * 2`` arrives with ``n`` in an R.Shape argument)."""
    fused, symbolic = [], []

    @settings(max_examples=SMALL_EXAMPLES)
    @given(relax_graphs(max_ops=12), st.booleans())
    def defuse_undoes_partition_graph(mod, merge):
        def partition(m):
            return PartitionGraph("test", merge=merge)(MergeComposite(_patternkit_table())(m))

        result = assert_roundtrip(mod, partition)
        assert relax.analysis.check_well_formed(result.fused)
        assert not _kinds(result.restored)
        externals = [f for _, f in result.fused.functions.items() if "codegen" in function_kinds(f)]
        fused.append(bool(externals))
        symbolic.append(any(relax.analysis.defined_symbolic_vars(f) for f in externals))

    defuse_undoes_partition_graph()
    _assert_mostly_fused(fused, "MergeComposite + PartitionGraph")
    assert any(symbolic), "no external function ever had a symbolic shape"


def test_symbolic_batches_are_drawn_and_fused():
    """The properties above cover symbolic image batches: the strategy draws them, and
    their conv2d is fused."""
    drawn = []

    @settings(max_examples=SMALL_EXAMPLES)
    @given(relax_graphs(max_ops=12))
    def draw(mod):
        if _symbolic_batch(mod["main"]):
            fused = FuseOpsByPattern(fusion_patterns())(mod)
            drawn.append(_symbolic_batch_conv_composites(fused) > 0)

    draw()
    assert len(drawn) >= SMALL_EXAMPLES // 10, f"only {len(drawn)} symbolic batches drawn"
    assert any(drawn), "no symbolic-batch conv2d was ever fused"


def test_dead_bindings_the_fusion_drops_are_listed_and_the_rest_is_compared():
    fused, dropped = [], []

    @settings(max_examples=SMALL_EXAMPLES)
    @given(relax_graphs(max_ops=10, dead=True))
    def round_trip_modulo_dead(mod):
        result = assert_roundtrip(mod)
        dead_before = dead_bindings(result.reference["main"])
        dead_after = dead_bindings(result.restored["main"])
        # every dead binding is either still there or listed as dropped: none vanishes
        # unreported
        assert len(dead_after) + len(result.dropped_dead) == len(dead_before)
        fused.append("primitive" in _kinds(result.fused))
        dropped.append(bool(result.dropped_dead))

    round_trip_modulo_dead()
    _assert_mostly_fused(fused, "FuseOps with dead bindings")
    assert any(dropped), "FuseOps never dropped a dead binding: the property is vacuous"


@settings(max_examples=NUMERIC_EXAMPLES)
@given(relax_graphs(max_ops=6))
def test_round_trip_keeps_the_numbers_on_the_vm(mod):
    result = assert_roundtrip(mod, numeric=True, rtol=1e-6, atol=1e-6,
                              numeric_options={"shape_vars": {"n": 3}})
    assert result.numeric.ok
