"""Outlining a match into a local function (used by partition and MergeComposite)."""

from __future__ import annotations

import gc

from tvm import relax

import patternkit as pk
from patternkit.ir.kinds import PARTITIONED_FROM_PATTERN
from patternkit.testing import batchnorm_chain


def batchnorm_pattern() -> pk.DFPattern:
    x, gamma, beta, mean, var = (pk.wildcard() for _ in range(5))
    return gamma * (x - mean) / pk.is_op("sqrt")(var + pk.is_constant()) + beta


def local_functions(mod) -> list[relax.Function]:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Function)]


def test_outlined_functions_are_named_after_their_ops_in_post_order():
    functions = local_functions(pk.partition(batchnorm_pattern(), batchnorm_chain(2)))
    assert [str(f.attrs[PARTITIONED_FROM_PATTERN]) for f in functions] == \
        ["subtract_multiply_add_sqrt_divide_add_"] * 2


def test_outlining_leaves_no_reference_cycles_for_the_garbage_collector():
    # A cycle per match kept the function's whole index alive after the pass, until a
    # collection swept it: 180 ms at 24,000 bindings (benchmarks/README.md).
    mod = batchnorm_chain(20)
    gc.collect()
    gc.disable()
    try:
        out = pk.partition(batchnorm_pattern(), mod)
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert len(local_functions(out)) == 20
