"""Counting rule-family instances in a source model, independently of TVM.

The counts are the "present" column of a coverage table: how many layer norms, GELUs,
attentions... the model has, before any importer or rule touched it.  Norms,
activations and attention blocks are counted from the torch modules (the only place
where a written-out ``LlamaRMSNorm`` or ``NewGELUActivation`` is still one thing);
softmax from the traced program (``aten.softmax`` nodes of ``torch.export``, or ONNX
``Softmax`` nodes), because eager attention calls it as a function and SDPA hides it.
"""

from __future__ import annotations

import torch

from .zoomodel import FAMILIES

#: Activation modules by GELU form.  ``GELUActivation`` calls the erf GELU; the others
#: compute ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` in some spelling.
_GELU_ERF = ("GELUActivation",)
_GELU_TANH = ("NewGELUActivation", "GELUTanh", "PytorchGELUTanh", "FastGELUActivation",
              "BloomGelu")
_SILU = ("SiLUActivation",)
#: RMS norms not named so: T5's (no mean subtracted, no bias) and the models built on it.
_RMS_NORM = ("T5LayerNorm", "MT5LayerNorm", "UMT5LayerNorm", "Pix2StructLayerNorm")
_SOFTMAX_TARGETS = ("aten.softmax.int", "aten._softmax.default", "aten._safe_softmax.default")


def _family_of(module: torch.nn.Module) -> str | None:
    name = type(module).__name__
    if isinstance(module, torch.nn.LayerNorm):
        return "layernorm"
    if isinstance(module, torch.nn.RMSNorm) or name.endswith("RMSNorm") or name in _RMS_NORM:
        return "rmsnorm"
    if isinstance(module, torch.nn.GELU):
        return "gelu" if module.approximate == "none" else "gelu_tanh"
    if name in _GELU_ERF:
        return "gelu"
    if name in _GELU_TANH:
        return "gelu_tanh"
    if isinstance(module, torch.nn.SiLU) or name in _SILU:
        return "silu"
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        return "batchnorm"
    if isinstance(module, torch.nn.Conv2d):
        return "conv2d"
    if name.endswith(("Attention", "AttentionSubsample")) and not any(  # LeViT's too
            type(child).__name__.endswith("Attention") for child in module.children()):
        return "attention"  # the innermost block: BertSelfAttention, not BertAttention
    return None


def count_module_families(module: torch.nn.Module) -> dict[str, int]:
    """Instances of each family of :data:`FAMILIES` among ``module``'s submodules.

    ``softmax`` is left at 0: count it in the traced program with
    :func:`count_softmax_in_program` or :func:`count_softmax_in_onnx`.
    """
    counts = dict.fromkeys(FAMILIES, 0)
    for sub in module.modules():
        family = _family_of(sub)
        if family is not None:
            counts[family] += 1
    return counts


def count_softmax_in_program(program) -> int:
    """``aten`` softmax calls in a ``torch.export.ExportedProgram`` (before decomposition)."""
    return sum(str(node.target) in _SOFTMAX_TARGETS for node in program.graph.nodes
               if node.op == "call_function")


def count_softmax_in_onnx(model) -> int:
    """``Softmax`` nodes of an ``onnx.ModelProto``'s main graph."""
    return sum(node.op_type == "Softmax" for node in model.graph.node)


def activation_modules(module: torch.nn.Module) -> list[str]:
    """Class names of the GELU / SiLU modules, for the metadata (which form a model uses)."""
    names = _GELU_ERF + _GELU_TANH + _SILU
    return sorted({type(m).__name__ for m in module.modules()
                   if type(m).__name__ in names or isinstance(m, (torch.nn.GELU, torch.nn.SiLU))})
