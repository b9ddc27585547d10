"""Real models differentiated end to end and checked against torch autograd (same weights)."""

from __future__ import annotations

import pytest
from tvm import relax

from patternkit.training import GradientReport, check_gradients, gradient, with_loss

pytestmark = pytest.mark.models


def torch_loss_of(model):
    """``sum(model(x))`` as a function of the input and the weights, in Relax parameter order."""
    import torch

    torch_names = {("p_" + n.replace(".", "_")).lower(): n
                   for n, _ in model.source.named_parameters()}
    names = [torch_names[p.lower()] for p in model.params]

    def loss(*tensors):
        inputs, weights = tensors[:len(model.input_names)], tensors[len(model.input_names):]
        out = torch.func.functional_call(model.source, dict(zip(names, weights)), tuple(inputs))
        return (out[0] if isinstance(out, (tuple, list)) else out).sum()

    return loss


def gradients_against_torch(model):
    loss_mod = with_loss(model.mod, model.entry)
    report = GradientReport()
    grad = gradient(loss_mod, func=model.entry + "_loss", wrt=list(model.params), report=report)
    inputs = [model.inputs[n] for n in model.input_names] + list(model.params.values())
    result = check_gradients(loss_mod, grad, func=model.entry + "_loss", inputs=inputs,
                             reference="torch", torch_fn=torch_loss_of(model))
    return report, result


def test_resnet18_gradients_of_every_weight_match_torch_autograd(zoo):
    """Eval-mode batch norms (running statistics) expanded as such, 60 weights checked."""
    model = zoo("resnet18", keep_params=True)
    report, result = gradients_against_torch(model)
    assert report.expanded == {"relax.nn.batch_norm": model.families["batchnorm"]}
    assert len(result.parameters) == len(model.params) == 60
    assert result.ok, result


def test_two_layer_bert_gradients_of_every_weight_match_torch_autograd(zoo):
    """Layer norms (layernorm.expand) and erf GELUs (gelu.expand) on the path; the
    attention mask's integer ops (arange, bitwise_and) are off it and need no gradient."""
    model = zoo("bert", layers=2, keep_params=True)
    report, result = gradients_against_torch(model)
    assert report.expanded == {"relax.nn.layer_norm": model.families["layernorm"],
                               "relax.nn.gelu": model.families["gelu"]}
    assert not report.decomposed_by_tvm  # the library's own rules covered every op
    assert result.ok, result


def test_gpt2_gradients_match_torch_autograd(zoo):
    model = zoo("gpt2", keep_params=True)
    report, result = gradients_against_torch(model)
    assert report.expanded == {"relax.nn.layer_norm": model.families["layernorm"]}
    assert result.ok, result


def test_gpt2_with_collapse_forward_keeps_every_layer_norm_and_matches_torch(zoo):
    """Two layers: five layer norms (two a layer and the final one) computed fused in the
    adjoint's primal half, the gradients still torch's."""
    model = zoo("gpt2", layers=2, keep_params=True)
    loss_mod = with_loss(model.mod, model.entry)
    func = model.entry + "_loss"
    report = GradientReport()
    grad = gradient(loss_mod, func=func, wrt=list(model.params), collapse_forward=True,
                    report=report)
    assert report.expanded == {"relax.nn.layer_norm": 5}
    assert report.restored is not None and report.restored.restored == {"relax.nn.layer_norm": 5}
    adjoint = grad[func + "_adjoint"]
    norms = [b for b in adjoint.body.blocks[0].bindings if isinstance(b.value, relax.Call)
             and getattr(b.value.op, "name", None) == "relax.nn.layer_norm"]
    assert len(norms) == 5
    inputs = [model.inputs[n] for n in model.input_names] + list(model.params.values())
    result = check_gradients(loss_mod, grad, func=func, inputs=inputs, reference="torch",
                             torch_fn=torch_loss_of(model))
    assert result.ok, result
