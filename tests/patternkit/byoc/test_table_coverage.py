"""coverage: the share of a model's op calls a table offloads, and a reason for each other one."""

from __future__ import annotations

import json

import pytest

import patternkit as pk
from patternkit.models import resnet18
from patternkit.patterns import LIBRARY


@pytest.fixture(scope="module")
def resnet():
    return resnet18()  # batch norms written out elementwise


def test_every_op_call_has_a_composite_or_a_reason(resnet):
    report = pk.coverage(resnet, pk.PatternTable.from_tvm("cutlass"))
    assert 0.0 < report.share < 0.1
    assert all((r.composite is None) != (r.reason is None) for r in report.ops)
    vetoed = [r for r in report.ops if r.kind == "vetoed"]
    assert vetoed and {r.op for r in vetoed} == {"relax.nn.conv2d"}
    assert vetoed[0].reason == "check of cutlass.conv2d rejected it"
    assert {r.kind for r in report.ops if r.composite is None} == {"vetoed", "uncovered"}


def test_a_table_that_takes_everything_makes_one_region_of_every_op(resnet):
    report = pk.coverage(resnet, pk.PatternTable.from_tvm("tensorrt"))
    assert report.share == 1.0
    assert report.regions == 1 and report.largest_region == len(report.ops)


def test_the_librarys_rewrites_raise_the_share_of_a_fused_op_table(resnet):
    table = pk.PatternTable.from_tvm("cutlass")
    before = pk.coverage(resnet, table)
    after = pk.coverage(pk.rewrite(LIBRARY.rewrite_rules(), resnet), table)
    assert after.share > before.share
    data = json.loads(after.to_json())
    assert data["share"] == after.share and len(data["ops"]) == len(after.ops)
