"""Repeated layers: found by their structure, drawn once with a count."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from patternkit.viz import viz_expr
from patternkit.viz.repeats import find_repeat, fold_repeats


def _layers(count: int, stem: bool = True) -> tvm.IRModule:
    """x -> [stem relu] -> count x (matmul, add, tanh, residual add) -> sum."""
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    rng = np.random.default_rng(0)
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(x)) if stem else x
            for _ in range(count):
                w = relax.const(rng.standard_normal((4, 4)).astype("float32"))
                y = bb.emit(relax.op.matmul(h, w))
                y = bb.emit(relax.op.add(y, relax.const(np.ones(4, "float32"))))
                y = bb.emit(relax.op.tanh(y))
                h = bb.emit(relax.op.add(h, y))
            out = bb.emit_output(relax.op.sum(h))
        bb.emit_func_output(out)
    return bb.get()


def test_a_layer_repeated_in_a_row_is_found_with_its_period_and_count():
    found = find_repeat(_layers(5)["main"])
    assert (found.start, found.period, found.count) == (1, 4, 5)


def test_bindings_that_do_not_repeat_are_not_a_layer():
    assert find_repeat(_layers(1)["main"]) is None


def test_layers_wired_differently_are_not_copies():
    mod = _layers(2)
    # the same ops, but the second copy's residual adds its own matmul, not its input
    func = mod["main"]
    bindings = list(func.body.blocks[0].bindings)
    last = bindings[8]
    bindings[8] = relax.VarBinding(last.var, relax.op.add(bindings[5].var, bindings[7].var))
    rewired = relax.Function(func.params, relax.SeqExpr(
        [relax.DataflowBlock(bindings)], func.body.body), func.ret_ty)
    assert find_repeat(rewired) is None


def test_folding_keeps_one_copy_rewires_what_follows_and_says_how_many():
    mod = _layers(12)
    folded, note = fold_repeats(mod)
    assert "repeated x12 is drawn once" in note
    assert len(folded["main"].body.blocks[0].bindings) == 1 + 4 + 1  # stem, one layer, sum
    assert len(mod["main"].body.blocks[0].bindings) == 1 + 48 + 1  # the input is unchanged
    full, small = viz_expr(mod), viz_expr(folded)
    assert len(small.model.nodes) < len(full.model.nodes) / 5
    sums = [n.id for n in small.model.nodes.values() if "sum" in str(n.to_dict())]
    assert sums and any(e.dst == sums[0] for e in small.model.edges)  # wired to the layer


def test_nothing_to_fold_returns_the_module_itself():
    mod = _layers(1)
    assert fold_repeats(mod) == (mod, "")


def test_a_value_every_layer_reads_does_not_break_the_repeat():
    """Each layer adds a mask made once before the layers (at a growing distance)."""
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            mask = bb.emit(relax.op.nn.relu(x))
            h = bb.emit(relax.op.tanh(x))
            for _ in range(6):
                y = bb.emit(relax.op.matmul(h, relax.const(np.eye(4, dtype="float32"))))
                y = bb.emit(relax.op.add(y, mask))
                y = bb.emit(relax.op.tanh(y))
                h = bb.emit(relax.op.add(h, y))
            out = bb.emit_output(relax.op.sum(h))
        bb.emit_func_output(out)
    found = find_repeat(bb.get()["main"])
    assert (found.period, found.count) == (4, 6)


def test_the_first_layer_counts_when_its_input_is_made_before_the_mask():
    """A transformer's mask is computed between its input and the first layer: the first
    layer reads the input from further back than the others read theirs."""
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.tanh(x))
            mask = bb.emit(relax.op.exp(bb.emit(relax.op.negative(bb.emit(relax.op.abs(x))))))
            for _ in range(5):
                y = bb.emit(relax.op.matmul(h, relax.const(np.eye(4, dtype="float32"))))
                y = bb.emit(relax.op.add(y, mask))
                y = bb.emit(relax.op.tanh(y))
                h = bb.emit(relax.op.add(h, y))
            out = bb.emit_output(relax.op.sum(h))
        bb.emit_func_output(out)
    mod = bb.get()
    found = find_repeat(mod["main"])
    assert (found.start, found.period, found.count) == (4, 4, 5)  # after tanh and the mask
    folded, note = fold_repeats(mod)
    assert "repeated x5 is drawn once" in note
    assert len(folded["main"].body.blocks[0].bindings) == 4 + 4 + 1
