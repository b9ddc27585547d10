"""Seeded random weights that do not hide wrong rewrites.

Hugging Face's own initialisation (``std=0.02`` matrices, norm weights of exactly 1 and
biases of exactly 0) makes many wrong rewrites invisible: a dropped bias, a gamma applied
twice, a 1 % error in an attention scale all moved outputs by less than 1e-4 (tvm-0.27
notes, "Traps").  Here every matrix and kernel has variance ``1/fan_in`` (activations stay
O(1) through the layers), embeddings and other free tensors are standard normal, norm
weights lie in ``[0.5, 1.5]`` and biases in ``[-0.5, 0.5]``.  Batch norms get running
statistics calibrated on one seeded batch, as a trained network would have.
"""

from __future__ import annotations

import torch

_NORMS = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.modules.batchnorm._BatchNorm)


def _is_norm(module: torch.nn.Module) -> bool:
    return isinstance(module, _NORMS) or type(module).__name__.endswith(("RMSNorm", "LayerNorm"))


def _fan_in(module: torch.nn.Module, weight: torch.Tensor) -> int | None:
    if isinstance(module, torch.nn.Linear):
        return weight.shape[1]
    if isinstance(module, torch.nn.modules.conv._ConvNd):
        return weight[0].numel()
    if type(module).__name__ == "Conv1D":  # transformers' GPT-2 linear: weight is (in, out)
        return weight.shape[0]
    return None


@torch.no_grad()
def randomize(module: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter of ``module`` in place, deterministically from ``seed``."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(p, low, high):
        p.copy_(torch.rand(p.shape, generator=generator) * (high - low) + low)

    for sub in module.modules():
        for name, p in sub.named_parameters(recurse=False):
            if _is_norm(sub) and name == "weight":
                uniform(p, 0.5, 1.5)
            elif name == "bias":
                uniform(p, -0.5, 0.5)
            elif (fan_in := _fan_in(sub, p)) is not None:
                p.copy_(torch.randn(p.shape, generator=generator) * fan_in ** -0.5)
            else:  # embeddings, class tokens, position tables
                p.copy_(torch.randn(p.shape, generator=generator))


@torch.no_grad()
def calibrate_batchnorm(module: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> None:
    """Set every batch norm's running statistics to those of ``module(*batch)``.

    Leaves ``module`` in eval mode.  Without this, random running statistics scale the
    activations arbitrarily from one block to the next (ResNet-50 has 53 batch norms).
    """
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: one batch gives exactly its statistics
    module.train()
    module(*batch)
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
    module.eval()
