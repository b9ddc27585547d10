"""graph_split: consecutive, runnable pieces whose composition computes the original."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from patternkit import ir as C
from patternkit.engine.splitting import GraphSplitError, graph_split
from patternkit.verification.numeric import random_inputs, run
from patternkit.verification.split_run import run_split


def _assert_composes(mod, pieces):
    inputs = random_inputs(mod["main"], seed=0)
    expected = run(mod, inputs)
    got = run_split(pieces, inputs)
    assert len(got) == len(expected)
    # the pieces run the same kernels on the same values: the numbers are bit-identical
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(g, e)


def test_split_at_the_first_add_as_in_the_seed(resnet_block, main_ops):
    pieces = graph_split(resnet_block["main"], [{"op_name": "add", "op_index": 0}])
    assert len(pieces) == 2
    assert main_ops(pieces[0]) == ["relax.nn.conv2d", "relax.add"]
    assert [C.var_name(p) for p in pieces[1]["main"].params] == ["lv1"]
    for piece in pieces:
        assert relax.analysis.check_well_formed(piece)
    _assert_composes(resnet_block, pieces)


def test_split_at_several_points_carries_every_value_a_later_piece_needs(resnet_block):
    conf = [{"op_name": "nn.max_pool2d", "op_index": 0}, {"op_name": "nn.relu", "op_index": 1}]
    pieces = graph_split(resnet_block, conf)
    assert len(pieces) == 3
    assert [str(n) for n in pieces[0]["main"].attrs["split_outputs"]] == ["lv3"]
    # The pooled value feeds both the middle piece and the residual add at the end.
    assert [str(n) for n in pieces[1]["main"].attrs["split_outputs"]] == ["lv6"]
    assert sorted(C.var_name(p) for p in pieces[2]["main"].params) == ["lv3", "lv6"]
    _assert_composes(resnet_block, pieces)


def test_split_at_the_last_op_gives_one_piece(resnet_block):
    pieces = graph_split(resnet_block, [{"op_name": "add", "op_index": 3}])
    assert len(pieces) == 1
    _assert_composes(resnet_block, pieces)


@pytest.mark.parametrize("conf, message", [
    ([{"op_name": "add", "op_index": 9}], r"split entry 0 .* only 4 call\(s\) of relax.add"),
    ([{"op_name": "relu", "op_index": 0}], r"split entry 0 .*unknown operator 'relu'"),
    ([{"op_name": "add", "op_index": 2}, {"op_name": "add", "op_index": 1}],
     r"split entry 1 .* not after the previous split point"),
    ([{"op": "add"}], r"split entry 0 must be a dict with 'op_name' and 'op_index'"),
])
def test_bad_split_entries_are_named(resnet_block, conf, message):
    with pytest.raises(GraphSplitError, match=message):
        graph_split(resnet_block, conf)
