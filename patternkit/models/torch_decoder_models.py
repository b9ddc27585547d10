"""Decoder zoo entries for the rotary and gated-MLP families: GPT-J, Phi and Qwen2.

Each is a transformers model built from a small config (nothing downloaded), with seeded
weights, imported with ``torch.export`` through
:func:`patternkit.models.torch_models.build`:

* ``gptj``: ``GPTJModel``, rotary embeddings on interleaved lanes (even and odd lanes
  paired) over the first ``rotary_dim`` lanes of each head only;
* ``phi``: ``PhiModel``, the half-rotation over a ``partial_rotary`` share of each head,
  parallel attention and MLP behind one layer norm;
* ``qwen2``: ``Qwen2Model``, a SwiGLU decoder (``silu(x Wg) * (x Wu)``), RMS norms,
  grouped key/value heads and biased q/k/v projections.
"""

from __future__ import annotations

from typing import Any

import transformers

from .torch_models import TokenModel, TorchSource, build, construct_seeded, token_inputs
from .zoomodel import ZooError, ZooModel


def _ids(options: dict[str, Any]) -> dict[str, Any]:
    return dict(vocab_size=options["vocab"], max_position_embeddings=options["positions"],
                use_cache=False, bos_token_id=0, eos_token_id=0,
                attn_implementation=options.get("attention", "eager"))


def _head_dim(name: str, options: dict[str, Any]) -> int:
    if options["hidden"] % options["heads"]:
        raise ZooError(f"{name}: hidden={options['hidden']} is not a multiple of "
                       f"heads={options['heads']}")
    return options["hidden"] // options["heads"]


def _source(module, options: dict[str, Any], metadata: dict[str, Any]) -> TorchSource:
    return TorchSource(module, token_inputs(options["vocab"]),
                       {"seq": (1, options["positions"])}, metadata)


def gptj_source(options: dict[str, Any]) -> TorchSource:
    """GPT-J (``GPTJModel``): interleaved rotary over ``rotary_dim`` lanes of each head."""
    head_dim = _head_dim("gptj", options)
    if options["rotary_dim"] % 2 or not 0 < options["rotary_dim"] <= head_dim:
        raise ZooError(f"gptj: rotary_dim={options['rotary_dim']} must be even and in "
                       f"(0, {head_dim}] (the head size)")
    ids = _ids(options)
    config = transformers.GPTJConfig(
        vocab_size=ids.pop("vocab_size"), n_positions=ids.pop("max_position_embeddings"),
        n_embd=options["hidden"], n_layer=options["layers"], n_head=options["heads"],
        rotary_dim=options["rotary_dim"], **ids)
    module = construct_seeded(lambda: TokenModel(transformers.GPTJModel(config)), options["seed"])
    return _source(module, options, {"architecture": "GPTJModel",
                                     "attention": config._attn_implementation,
                                     "rotary": ("interleaved", options["rotary_dim"], head_dim)})


def phi_source(options: dict[str, Any]) -> TorchSource:
    """Phi (``PhiModel``): the half-rotation over ``partial_rotary`` of each head."""
    head_dim = _head_dim("phi", options)
    rotary = int(head_dim * options["partial_rotary"])
    if rotary % 2 or not 0 < rotary <= head_dim:
        raise ZooError(f"phi: partial_rotary={options['partial_rotary']} of a head of "
                       f"{head_dim} rotates {rotary} lanes; it must be an even number > 0")
    config = transformers.PhiConfig(
        hidden_size=options["hidden"], intermediate_size=options["intermediate"],
        num_hidden_layers=options["layers"], num_attention_heads=options["heads"],
        partial_rotary_factor=options["partial_rotary"], **_ids(options))
    module = construct_seeded(lambda: TokenModel(transformers.PhiModel(config)), options["seed"])
    return _source(module, options, {"architecture": "PhiModel",
                                     "attention": config._attn_implementation,
                                     "rotary": ("half", rotary, head_dim)})


def qwen2_source(options: dict[str, Any]) -> TorchSource:
    """Qwen2 (``Qwen2Model``): SwiGLU MLPs, RMS norms, GQA when kv_heads < heads."""
    _head_dim("qwen2", options)
    if options["heads"] % options["kv_heads"]:
        raise ZooError(f"qwen2: heads={options['heads']} is not a multiple of "
                       f"kv_heads={options['kv_heads']}")
    config = transformers.Qwen2Config(
        hidden_size=options["hidden"], intermediate_size=options["intermediate"],
        num_hidden_layers=options["layers"], num_attention_heads=options["heads"],
        num_key_value_heads=options["kv_heads"], rms_norm_eps=1e-6, **_ids(options))
    module = construct_seeded(lambda: TokenModel(transformers.Qwen2Model(config)), options["seed"])
    return _source(module, options, {"architecture": "Qwen2Model",
                                     "attention": config._attn_implementation,
                                     "gqa": (options["heads"], options["kv_heads"])})


# -- entry points named in the registry (patternkit.models.zoo.ZOO) ---------------------------
def gptj(spec) -> ZooModel:
    """The ``zoo:gptj`` model."""
    return build(spec, gptj_source(spec.as_dict()))


def phi(spec) -> ZooModel:
    """The ``zoo:phi`` model."""
    return build(spec, phi_source(spec.as_dict()))


def qwen2(spec) -> ZooModel:
    """The ``zoo:qwen2`` model."""
    return build(spec, qwen2_source(spec.as_dict()))
