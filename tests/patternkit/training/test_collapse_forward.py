"""gradient(collapse_forward=True): the primal half keeps the model's fused ops."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from patternkit.training import GradientReport, check_gradients, gradient
from patternkit.verification.numeric import random_inputs, run


def gelu_mlp() -> tvm.IRModule:
    """``sum(gelu(layer_norm(x @ w1)) @ w2)``: two fused ops without a gradient."""
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    w1 = relax.Var("w1", relax.TensorType((8, 16), "float32"))
    gamma = relax.Var("gamma", relax.TensorType((16,), "float32"))
    beta = relax.Var("beta", relax.TensorType((16,), "float32"))
    w2 = relax.Var("w2", relax.TensorType((16, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w1, gamma, beta, w2]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.layer_norm(relax.op.matmul(x, w1), gamma, beta, axes=[-1]))
            a = bb.emit(relax.op.nn.gelu(h))
            loss = bb.emit_output(relax.op.sum(relax.op.matmul(a, w2)))
        bb.emit_func_output(loss)
    return bb.get()


def primal_half_ops(adjoint: relax.Function) -> list[str]:
    """The ops bound up to the primal result (the first field of the adjoint's result)."""
    primal = adjoint.body.body.fields[0]
    names = []
    for binding in adjoint.body.blocks[0].bindings:
        if isinstance(binding.value, relax.Call) and isinstance(binding.value.op, tvm.ir.Op):
            names.append(binding.value.op.name)
        if binding.var.same_as(primal):
            return names
    raise AssertionError("the primal result is not bound in the adjoint's block")


def test_the_primal_half_of_a_gelu_mlp_keeps_its_layer_norm_and_its_gelu():
    mod = gelu_mlp()
    before = mod.script()
    report = GradientReport()
    grads = gradient(mod, collapse_forward=True, report=report)
    assert mod.script() == before
    assert relax.analysis.check_well_formed(grads)
    ops = primal_half_ops(grads["main_adjoint"])
    assert ops.count("relax.nn.layer_norm") == 1 and ops.count("relax.nn.gelu") == 1
    assert report.restored is not None and not report.restored.left
    assert report.restored.restored == {"relax.nn.layer_norm": 1, "relax.nn.gelu": 1}
    result = check_gradients(mod, grads, seed=2)
    assert result.ok, result


def test_collapse_forward_changes_no_gradient_beyond_rounding():
    mod = gelu_mlp()
    inputs = random_inputs(mod["main"], seed=5)
    plain = run(gradient(mod), inputs, "main_adjoint")
    restored = run(gradient(mod, collapse_forward=True), inputs, "main_adjoint")
    assert len(plain) == len(restored) == 6
    for want, got in zip(plain, restored):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_without_collapse_forward_the_primal_half_is_written_out():
    """The baseline the option improves on: no fused op is left without it."""
    ops = primal_half_ops(gradient(gelu_mlp())["main_adjoint"])
    assert "relax.nn.layer_norm" not in ops and "relax.nn.gelu" not in ops


def test_the_backward_half_still_reads_the_interior_it_needs():
    """Only the interior the backward reads stays: the layer norm's standard deviation does;
    the restored ops take their roots' bindings, and what only fed a root goes."""
    report = GradientReport()
    adjoint = gradient(gelu_mlp(), collapse_forward=True, report=report)["main_adjoint"]
    ops = primal_half_ops(adjoint)
    assert "relax.sqrt" in ops and "relax.nn.layer_norm" in ops
    assert report.restored is not None and report.restored.removed >= 1
    plain = primal_half_ops(gradient(gelu_mlp())["main_adjoint"])
    assert len(ops) == len(plain) - report.restored.removed


@pytest.mark.parametrize("training_flag", [False, True])
def test_a_batch_norm_with_either_flag_is_restored_with_its_gradients(training_flag,
                                                                       batch_norm_loss,
                                                                       seed_inputs):
    mod = batch_norm_loss(training_flag)
    report = GradientReport()
    grads = gradient(mod, collapse_forward=True, report=report)
    assert "relax.nn.batch_norm" in primal_half_ops(grads["main_adjoint"])
    result = check_gradients(mod, grads, inputs=seed_inputs())
    assert result.ok, result
