"""benchmarks/bench_from_rewriter.py: both rewriters make every replacement, and agree."""

from __future__ import annotations


def test_both_rewriters_collapse_every_unit_of_the_chain_alike(bench_from_rewriter):
    row = bench_from_rewriter.measure(6, 1)
    assert row["rewritten"] == 6
    assert row["identical"] is True
    assert row["speedup_cpu"] > 0 and row["speedup_wall"] > 0
