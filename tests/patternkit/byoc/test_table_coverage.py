"""coverage: the share of a model's op calls a table offloads, and a reason for each other one."""

from __future__ import annotations

import json

import pytest
from tvm import relax
from tvm.relax import dpl
from tvm.relax.transform import FusionPattern

import patternkit as pk
from patternkit.models import resnet18
from patternkit.patterns import LIBRARY


@pytest.fixture(scope="module")
def resnet():
    return resnet18()  # batch norms written out elementwise


def test_every_op_call_has_a_composite_or_a_reason(resnet):
    report = pk.byoc.coverage(resnet, pk.PatternTable.from_tvm("cutlass"))
    assert 0.0 < report.share < 0.1
    assert all((r.composite is None) != (r.reason is None) for r in report.ops)
    vetoed = [r for r in report.ops if r.kind == "vetoed"]
    assert vetoed and {r.op for r in vetoed} == {"relax.nn.conv2d"}
    assert vetoed[0].reason == "check of cutlass.conv2d rejected it"
    assert {r.kind for r in report.ops if r.composite is None} == {"vetoed", "uncovered"}


def test_a_table_that_takes_everything_makes_one_region_of_every_op(resnet):
    report = pk.byoc.coverage(resnet, pk.PatternTable.from_tvm("tensorrt"))
    assert report.share == 1.0
    assert report.regions == 1 and report.largest_region == len(report.ops)


def test_the_librarys_rewrites_raise_the_share_of_a_fused_op_table(resnet):
    table = pk.PatternTable.from_tvm("cutlass")
    before = pk.byoc.coverage(resnet, table)
    after = pk.byoc.coverage(pk.rewrite(LIBRARY.rewrite_rules(), resnet), table)
    assert after.share > before.share
    data = json.loads(after.to_json())
    assert data["share"] == after.share and len(data["ops"]) == len(after.ops)


def _relu_then_add(*, add_reads_exp: bool):
    """``a = relu(x)``, then ``add(a, exp(a))`` (a path around the add) or ``add(a, x)``."""
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(x))
            other = bb.emit(relax.op.exp(a)) if add_reads_exp else x
            out = bb.emit_output(relax.op.add(a, other))
        bb.emit_func_output(out)
    return bb.get()


RELU_ADD_TABLES = {
    "tvm": [FusionPattern("t.relu", dpl.is_op("relax.nn.relu")(dpl.wildcard())),
            FusionPattern("t.add", dpl.is_op("relax.add")(dpl.wildcard(), dpl.wildcard()))],
    "relay": [("t.relu", pk.is_op("nn.relu")(pk.wildcard())),
              ("t.add", pk.is_op("add")(pk.wildcard(), pk.wildcard()))],
}


def _table(semantics):
    entries = RELU_ADD_TABLES[semantics]
    return pk.PatternTable.from_tvm(entries) if semantics == "tvm" else pk.PatternTable(entries)


@pytest.mark.parametrize("semantics", ["tvm", "relay"])
def test_an_op_region_merging_splits_off_to_avoid_a_cycle_says_so(semantics):
    report = pk.byoc.coverage(_relu_then_add(add_reads_exp=True), _table(semantics))
    relu, exp, add = report.ops
    assert (relu.composite, exp.composite, add.composite) == ("t.relu", None, "t.add")
    assert report.regions == 2 and relu.region != add.region
    assert relu.split is None
    assert add.split == (f"region merging split it off from '{relu.region}' to avoid a cycle "
                         f"(it reads 'lv' both directly and through 'lv1')")
    assert report.split == 1 and "split off to avoid a cycle: 1" in str(report)
    assert json.loads(report.to_json())["split"] == 1


@pytest.mark.parametrize("semantics", ["tvm", "relay"])
def test_adjacent_composites_without_a_path_around_them_share_a_region(semantics):
    report = pk.byoc.coverage(_relu_then_add(add_reads_exp=False), _table(semantics))
    assert report.regions == 1 and report.split == 0
    assert len({r.region for r in report.ops}) == 1 and report.ops[0].region is not None
