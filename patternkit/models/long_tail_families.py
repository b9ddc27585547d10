"""Counting issue 36's families in a torch model: the "present" column of their coverage.

The families of :data:`patternkit.models.FAMILIES` are counted by
:mod:`patternkit.models.families`; this module counts the ones issue 36 ("the long tail of
spellings") added to the library, the same way: from the torch modules, before any
exporter or importer touched them, so that a spelling the library misses still counts.

* ``groupnorm``, ``instancenorm``: ``nn.GroupNorm`` and ``nn.InstanceNorm*d`` modules.
* ``hardswish``, ``hardsigmoid``, ``relu6``: ``nn.Hardswish``, ``nn.Hardsigmoid`` and
  ``nn.ReLU6`` modules.
* ``rope``: two per attention block (the query's rotation and the key's) in a model that
  has a rotary embedding module (a class named ``...RotaryEmbedding``: Llama, Qwen2, Phi,
  GPT-J) and whose config does not ask for ALiBi instead (Falcon builds its rotary
  module either way).
* ``swiglu``, ``geglu``: a gated MLP is a module with a gate and an up projection
  (``gate_proj`` / ``up_proj``, T5's ``wi_0`` / ``wi_1``) or a ``GEGLU`` module (one
  projection chunked in two); its activation (``act_fn``, ``act``, ``activation``) says
  which (SiLU: swiglu, either GELU: geglu).
* ``batchnorm_linear``: a ``BatchNorm1d`` whose parent module also holds a ``Linear``
  (LeViT's ``MLPLayerWithBN``), the batch norm ``matmul.fold_batchnorm`` folds.
"""

from __future__ import annotations

import torch

#: The families counted here, in the coverage table's column order.
LONG_TAIL_FAMILIES = ("groupnorm", "instancenorm", "hardswish", "hardsigmoid", "relu6", "rope",
                      "swiglu", "geglu", "batchnorm_linear")

_GATE_PAIRS = (("gate_proj", "up_proj"), ("wi_0", "wi_1"))
_ACTIVATION_NAMES = ("act_fn", "act", "activation")
_SILU_NAMES = ("SiLU", "SiLUActivation")
_GELU_NAMES = ("GELU", "GELUActivation", "NewGELUActivation", "GELUTanh", "PytorchGELUTanh",
               "FastGELUActivation")


def _gated_mlp_kind(module: torch.nn.Module) -> str | None:
    if type(module).__name__ == "GEGLU":
        return "geglu"
    children = dict(module.named_children())
    if not any(gate in children and up in children for gate, up in _GATE_PAIRS):
        return None
    activation = next((children[n] for n in _ACTIVATION_NAMES if n in children), None)
    name = type(activation).__name__
    if name in _SILU_NAMES:
        return "swiglu"
    if name in _GELU_NAMES:
        return "geglu"
    return None


def _is_innermost_attention(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("Attention") and not any(
        type(child).__name__.endswith("Attention") for child in module.children())


def count_long_tail_families(module: torch.nn.Module) -> dict[str, int]:
    """Instances of each family of :data:`LONG_TAIL_FAMILIES` in ``module``."""
    counts = dict.fromkeys(LONG_TAIL_FAMILIES, 0)
    modules = list(module.modules())
    for sub in modules:
        if isinstance(sub, torch.nn.GroupNorm):
            counts["groupnorm"] += 1
        elif isinstance(sub, torch.nn.modules.instancenorm._InstanceNorm):
            counts["instancenorm"] += 1
        elif isinstance(sub, torch.nn.Hardswish):
            counts["hardswish"] += 1
        elif isinstance(sub, torch.nn.Hardsigmoid):
            counts["hardsigmoid"] += 1
        elif isinstance(sub, torch.nn.ReLU6):
            counts["relu6"] += 1
        elif (kind := _gated_mlp_kind(sub)) is not None:
            counts[kind] += 1
        for child in sub.children():
            if isinstance(child, torch.nn.BatchNorm1d) and any(
                    isinstance(c, torch.nn.Linear) for c in sub.children()):
                counts["batchnorm_linear"] += 1
    alibi = any(getattr(getattr(sub, "config", None), "alibi", False) for sub in modules)
    if not alibi and any(type(sub).__name__.endswith("RotaryEmbedding") for sub in modules):
        counts["rope"] = 2 * sum(_is_innermost_attention(sub) for sub in modules)
    return counts
