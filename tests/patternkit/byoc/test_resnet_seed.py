"""Seed reproduction: ResNet-18's first block and the whole network, through the BYOC flow.

The Relay workflow (seed 002) ran ``prerequisite_optimize`` (batch norm folded into conv
weights and a bias add), ``MergeComposite`` with Relay's conv2d -> optional add -> optional
relu pattern and ``PartitionGraph`` on the first residual block of ResNet-18, and printed
three ``ccompiler.conv_add_relu`` composites: two ``nn.conv2d_add_nn.relu_`` and one
``nn.conv2d_add_``, with max_pool and the residual add left outside.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import patternkit as pk
from patternkit import ir as C
from patternkit.byoc import (
    MergeComposite,
    PartitionGraph,
    composite_counts,
    composite_functions,
    external_functions,
    graph_split,
    inline_external,
    offload_report,
    run_split,
)
from patternkit.patterns.conv import BatchnormFoldIntoConv, conv2d_add_relu
from patternkit.verification.numeric import random_inputs, run

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

TABLE = [("ccompiler.conv_add_relu", conv2d_add_relu())]
# Folding batch norm changes the arithmetic: the weights are scaled in float64 and cast
# back to float32, so each folded conv rounds differently.  Measured on these seeds: max
# abs error 5e-7 on the first block, 5e-6 through ResNet-18's 20 folded convs; 1e-4
# leaves a wide margin.  Merging and partitioning only wrap bindings in functions, so
# they are checked bit-exact against the folded module.
FOLD_TOL = {"rtol": 1e-4, "atol": 1e-4}


def _import(model, shape):
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    x = torch.randn(*shape)
    with torch.no_grad():
        program = torch.export.export(model.eval(), (x,))
    return from_exported_program(program, unwrap_unit_return_tuple=True)


class FirstBlock(torch.nn.Module):
    """conv 7x7/2 + BN + relu, max_pool, conv 3x3 + BN + relu, conv 3x3 + BN, residual add."""

    def __init__(self, channels=8):
        super().__init__()
        nn = torch.nn
        self.conv1, self.bn1 = nn.Conv2d(3, channels, 7, 2, 3, bias=False), nn.BatchNorm2d(channels)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv3 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels)
        with torch.no_grad():  # non-trivial running statistics, so folding is exercised
            for bn in (self.bn1, self.bn2, self.bn3):
                bn.running_mean.uniform_(-1, 1)
                bn.running_var.uniform_(0.5, 2)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-1, 1)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn1(self.conv1(x))))
        z = torch.relu(self.bn2(self.conv2(y)))
        return self.bn3(self.conv3(z)) + y


@pytest.fixture(scope="module")
def first_block():
    torch.manual_seed(0)
    return _import(FirstBlock(), (1, 3, 32, 32))


def test_first_block_partitions_into_the_three_seed_composites(first_block, flow, main_ops,
                                                               bit_exact):
    prepare = pk.Rewrite([BatchnormFoldIntoConv()])
    merged = flow(first_block, prepare, MergeComposite(TABLE))
    names = [str(f.attrs["PartitionedFromPattern"]) for _, f in composite_functions(merged)]
    assert names == ["nn.conv2d_add_nn.relu_", "nn.conv2d_add_nn.relu_", "nn.conv2d_add_"]
    assert composite_counts(merged) == {"ccompiler.conv_add_relu": 3}
    assert main_ops(merged) == ["relax.nn.max_pool2d", "relax.zeros_like", "relax.add"]
    pk.assert_same_numerics(first_block, merged, **FOLD_TOL)

    partitioned = flow(merged, PartitionGraph("ccompiler"))
    assert sorted(external_functions(partitioned)) == ["ccompiler_main_0", "ccompiler_main_1"]
    assert composite_counts(partitioned) == {"ccompiler.conv_add_relu": 3}
    pk.assert_same_numerics(first_block, inline_external(partitioned), **FOLD_TOL)
    bit_exact(merged, inline_external(partitioned))


def test_first_block_offload_report_keeps_pool_and_residual_add_on_the_host(first_block):
    folded = pk.rewrite([BatchnormFoldIntoConv()], first_block)
    report = offload_report(folded, TABLE, compiler="ccompiler")
    assert report.composites == {"ccompiler.conv_add_relu": 3}
    assert {h.op: h.kind for h in report.host_ops} == {
        "relax.nn.max_pool2d": "uncovered", "relax.zeros_like": "uncovered",
        "relax.add": "uncovered"}


def test_seed_graph_split_then_partition(first_block, flow):
    pieces = graph_split(first_block["main"], [{"op_name": "add", "op_index": 0}])
    assert len(pieces) == 1  # the first add is the residual add: the whole block
    conf = [{"op_name": "nn.max_pool2d", "op_index": 0}]
    pieces = graph_split(first_block["main"], conf)
    assert len(pieces) == 2
    inputs = random_inputs(first_block["main"], seed=0)
    got = run_split(pieces, inputs)
    want = run(first_block, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):  # the pieces run the same kernels: bit-identical
        np.testing.assert_array_equal(g, w)
    second = flow(pieces[1], pk.Rewrite([BatchnormFoldIntoConv()]), MergeComposite(TABLE))
    assert composite_counts(second) == {"ccompiler.conv_add_relu": 2}


def test_whole_resnet18_from_transformers_puts_every_conv_in_a_composite(flow):
    transformers = pytest.importorskip("transformers")
    config = transformers.ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512],
                                       depths=[2, 2, 2, 2], layer_type="basic")
    torch.manual_seed(0)
    mod = _import(transformers.ResNetModel(config), (1, 3, 64, 64))
    convs = sum(C.op_name(b.value) == "relax.nn.conv2d"
                for blk in mod["main"].body.blocks for b in blk.bindings)
    assert convs == 20
    out = flow(mod, pk.Rewrite([BatchnormFoldIntoConv()]), MergeComposite(TABLE),
               PartitionGraph("ccompiler"))
    assert composite_counts(out) == {"ccompiler.conv_add_relu": convs}
    host_convs = [b for blk in out["main"].body.blocks for b in blk.bindings
                  if C.op_name(b.value) == "relax.nn.conv2d"]
    assert host_convs == []
    assert relax.analysis.check_well_formed(out)
    pk.assert_same_numerics(mod, inline_external(out), **FOLD_TOL)
