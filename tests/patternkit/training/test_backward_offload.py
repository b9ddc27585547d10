"""The seed's flow: a batch norm differentiated, its backward handed to "xpucompiler"."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from patternkit.byoc import inline_external
from patternkit.errors import GradientError
from patternkit.ir import function_kinds
from patternkit.training import check_gradients, gradient, offload

torch = pytest.importorskip("torch")


def torch_batch_norm_loss(data, gamma, beta, mean, var):
    """Inference batch norm in torch, written out: torch's own op refuses gradients for the
    running statistics, which the seed's test asks for too."""
    along_c = lambda t: t.reshape(1, -1, 1, 1)  # noqa: E731
    return ((data - along_c(mean)) / torch.sqrt(along_c(var) + 1e-5) * along_c(gamma)
            + along_c(beta)).sum()


def test_the_seed_batch_norm_backward_runs_as_an_external_function_with_torch_gradients(
        batch_norm_loss, seed_inputs):
    mod = batch_norm_loss(False)
    ext = offload(gradient(mod))
    assert relax.analysis.check_well_formed(ext)
    xpu = ext["xpu"]
    assert xpu.attrs["Compiler"] == "xpucompiler" and xpu.attrs["global_symbol"] == "xpu"
    assert int(xpu.attrs["Primitive"]) == 1
    assert "codegen" in {str(k) for k in function_kinds(xpu)}
    runnable = inline_external(ext)  # no xpucompiler here: inline it back for llvm
    result = check_gradients(mod, runnable, inputs=seed_inputs(), reference="torch",
                             torch_fn=torch_batch_norm_loss)
    assert result.ok, result


def test_training_batch_norm_matches_torch_autograd_with_batch_statistics(batch_norm_loss,
                                                                          seed_inputs):
    def torch_loss(data, gamma, beta, mean, var):
        return torch.nn.functional.batch_norm(data, mean.detach().clone(), var.detach().clone(),
                                              gamma, beta, training=True, eps=1e-5).sum()

    mod = batch_norm_loss(True)
    result = check_gradients(mod, gradient(mod, wrt=["data", "bn_gamma", "bn_beta"]),
                             inputs=seed_inputs(), reference="torch", torch_fn=torch_loss)
    assert result.ok, result


def test_offload_refuses_a_missing_function_and_a_taken_symbol(batch_norm_loss):
    grad = gradient(batch_norm_loss(False))
    with pytest.raises(GradientError, match="no Relax function 'forward_adjoint'"):
        offload(grad, func="forward_adjoint")
    with pytest.raises(GradientError, match="already has a function named 'main'"):
        offload(grad, global_symbol="main")


def test_a_wrong_gradient_fails_the_check(batch_norm_loss, seed_inputs):
    """The check can fail: scale one gradient and it must say which."""
    mod = batch_norm_loss(False)
    grad = gradient(mod)
    inputs = seed_inputs()
    good = check_gradients(mod, grad, inputs=inputs, reference="torch",
                           torch_fn=torch_batch_norm_loss)
    assert good.ok
    wrong = check_gradients(mod, grad, inputs=inputs, reference="torch",
                            torch_fn=lambda d, g, b, m, v: torch_batch_norm_loss(d, g * 1.01, b,
                                                                                 m, v))
    assert not wrong.ok
    failed = {p.name for p in wrong.parameters if not p.ok}
    assert "data" in failed and "bn_beta" not in failed
    assert np.isfinite(wrong.loss_error)
