"""Zoo entries built from transformers configs and imported with ``torch.export``.

Each ``*_source`` function builds the torch side of an entry (a module in eval mode with
seeded weights, its inputs and the bounds of its dimensions); :func:`build` exports it
with ``torch.export`` (symbolic ``batch`` / ``seq`` dimensions when asked) and imports
it with ``from_exported_program``.  The ONNX entries (:mod:`.onnx_models`) reuse the
sources.  On this project's 2-core machine a default (2-layer, width 64) model
exports in 1-3 s and imports in 1-6 s (``benchmarks/bench_zoo.py`` measures it).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import torch
import transformers

from ..errors import first_line
from . import import_cache
from .families import activation_modules, count_module_families, count_softmax_in_program
from .importing import from_torch, symbolic_dims, timed
from .weights import calibrate_batchnorm, randomize
from .zoomodel import InputSpec, ZooError, ZooImportError, ZooModel, description

logger = logging.getLogger(__name__)

ROLES = ("batch", "seq")


@dataclass
class TorchSource:
    """The torch side of a zoo entry.

    ``module(*inputs)`` (inputs in ``input_specs`` order) returns one tensor.
    """

    module: torch.nn.Module
    input_specs: tuple[InputSpec, ...]
    dim_bounds: dict[str, tuple[int, int | None]]
    metadata: dict[str, Any] = field(default_factory=dict)


# -- wrappers: positional tensors in, one tensor out (what torch.export and ONNX want) ----------
class TokenModel(torch.nn.Module):
    """``model(input_ids=, attention_mask=).last_hidden_state`` (GPT-2, Llama)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        """The last hidden state for token ids and an attention mask."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class TokenTypeModel(torch.nn.Module):
    """``model(input_ids=, token_type_ids=, attention_mask=).last_hidden_state`` (BERT).

    The position ids are passed as ``arange(seq)``: BERT's default slices its position
    buffer (``position_ids[:, :seq]``), which the importer types ``min(seq, 64)``, and an
    ``add`` of a ``seq`` and a ``min(seq, 64)`` dimension is not legalised, so the
    dynamic-sequence module would not build (``CodeGenVM cannot emit this Relax
    operator directly ... R.add``).  The numbers are the same.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        """The last hidden state for token ids, token types and a mask."""
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return self.model(input_ids=input_ids, token_type_ids=token_type_ids,
                          attention_mask=attention_mask,
                          position_ids=position_ids).last_hidden_state


class PixelModel(torch.nn.Module):
    """``getattr(model(pixel_values=), output)`` (ViT, ResNet)."""

    def __init__(self, model: torch.nn.Module, output: str):
        super().__init__()
        self.model = model
        self.output = output

    def forward(self, pixel_values):
        """The wrapped model's chosen output for a batch of images."""
        return getattr(self.model(pixel_values=pixel_values), self.output)


def construct_seeded(factory: Callable[[], torch.nn.Module], seed: int) -> torch.nn.Module:
    """``factory()`` with seeded weights, in eval mode, leaving torch's global RNG alone."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = factory()
    randomize(module, seed)
    return module.eval()


def token_inputs(vocab: int, with_types: int | None = None) -> tuple[InputSpec, ...]:
    """A text model's inputs: token ids below ``vocab``, an all-ones mask, token types."""
    ids = InputSpec("input_ids", "int64", ("batch", "seq"), 0, vocab)
    mask = InputSpec("attention_mask", "int64", ("batch", "seq"), 0, 2, fill=1)
    if with_types is None:
        return ids, mask
    return ids, InputSpec("token_type_ids", "int64", ("batch", "seq"), 0, with_types), mask


def _config_metadata(options: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: options[k] for k in keys if k in options}


# -- sources ---------------------------------------------------------------------------------
def gpt2_source(options: dict[str, Any]) -> TorchSource:
    """GPT-2 (``GPT2Model``) built from ``options`` with seeded weights."""
    config = transformers.GPT2Config(
        vocab_size=options["vocab"], n_positions=options["positions"], n_embd=options["hidden"],
        n_layer=options["layers"], n_head=options["heads"], use_cache=False,
        bos_token_id=0, eos_token_id=0, attn_implementation=options.get("attention", "eager"))
    module = construct_seeded(lambda: TokenModel(transformers.GPT2Model(config)), options["seed"])
    return TorchSource(module, token_inputs(options["vocab"]),
                       {"seq": (1, options["positions"])},
                       {"architecture": "GPT2Model", "attention": config._attn_implementation})


def bert_source(options: dict[str, Any]) -> TorchSource:
    """BERT (``BertModel``, no pooler) built from ``options`` with seeded weights."""
    config = transformers.BertConfig(
        vocab_size=options["vocab"], hidden_size=options["hidden"],
        num_hidden_layers=options["layers"], num_attention_heads=options["heads"],
        intermediate_size=2 * options["hidden"], max_position_embeddings=options["positions"],
        type_vocab_size=options["type_vocab"], pad_token_id=0,
        attn_implementation=options.get("attention", "eager"))
    module = construct_seeded(lambda: TokenTypeModel(
        transformers.BertModel(config, add_pooling_layer=False)), options["seed"])
    inputs = token_inputs(options["vocab"], with_types=options["type_vocab"])
    return TorchSource(module, (inputs[0], inputs[1], inputs[2]),
                       {"seq": (1, options["positions"])},
                       {"architecture": "BertModel", "attention": config._attn_implementation})


def llama_source(options: dict[str, Any]) -> TorchSource:
    """A Llama-style decoder built from ``options`` (GQA when kv_heads < heads)."""
    if options["heads"] % options["kv_heads"]:
        raise ZooError(f"llama: heads={options['heads']} is not a multiple of "
                       f"kv_heads={options['kv_heads']}")
    config = transformers.LlamaConfig(
        vocab_size=options["vocab"], hidden_size=options["hidden"],
        intermediate_size=options["intermediate"], num_hidden_layers=options["layers"],
        num_attention_heads=options["heads"], num_key_value_heads=options["kv_heads"],
        max_position_embeddings=options["positions"], rms_norm_eps=1e-5, use_cache=False,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
        attn_implementation=options.get("attention", "eager"))
    module = construct_seeded(lambda: TokenModel(transformers.LlamaModel(config)), options["seed"])
    return TorchSource(module, token_inputs(options["vocab"]),
                       {"seq": (1, options["positions"])},
                       {"architecture": "LlamaModel", "attention": config._attn_implementation,
                        "gqa": (options["heads"], options["kv_heads"])})


def falcon_source(options: dict[str, Any]) -> TorchSource:
    """Falcon (``FalconModel``): attention and MLP in parallel.  The ``7b`` layout has
    multi-query attention (one key/value head, which the torch importer broadcasts to the
    query's heads) unless ``multi_query`` is false; the ``40b`` layout
    (``new_decoder_architecture``) groups ``kv_heads`` key/value heads with their queries
    in the fused projection and broadcasts each to its group before the attention.
    ``alibi`` replaces the rotary positions by a bias added to the scores before the
    scale.
    """
    new_layout = options["layout"] == "40b"
    if new_layout and options["heads"] % options["kv_heads"]:
        raise ZooError(f"falcon: heads={options['heads']} is not a multiple of "
                       f"kv_heads={options['kv_heads']}")
    config = transformers.FalconConfig(
        vocab_size=options["vocab"], hidden_size=options["hidden"],
        num_hidden_layers=options["layers"], num_attention_heads=options["heads"],
        num_kv_heads=options["kv_heads"] if new_layout else None,
        multi_query=options["multi_query"], new_decoder_architecture=new_layout,
        parallel_attn=True, alibi=options["alibi"], bias=False,
        max_position_embeddings=options["positions"], use_cache=False,
        attn_implementation=options.get("attention", "eager"))
    module = construct_seeded(lambda: TokenModel(transformers.FalconModel(config)), options["seed"])
    return TorchSource(module, token_inputs(options["vocab"]),
                       {"seq": (1, options["positions"])},
                       {"architecture": "FalconModel", "attention": config._attn_implementation,
                        "layout": options["layout"], "alibi": options["alibi"],
                        "multi_query": options["multi_query"] and not new_layout,
                        "kv_heads": (options["kv_heads"] if new_layout else
                                     1 if options["multi_query"] else options["heads"])})


def t5_source(options: dict[str, Any]) -> TorchSource:
    """T5's encoder (``T5EncoderModel``): RMS norms named ``T5LayerNorm``, a relative
    position bias added to the scores before the mask, no scale on the scores.
    """
    config = transformers.T5Config(
        vocab_size=options["vocab"], d_model=options["hidden"],
        d_kv=options["hidden"] // options["heads"], d_ff=2 * options["hidden"],
        num_layers=options["layers"], num_heads=options["heads"],
        feed_forward_proj=options["feed_forward"], use_cache=False, pad_token_id=0,
        eos_token_id=1, decoder_start_token_id=0,
        attn_implementation=options.get("attention", "eager"))
    module = construct_seeded(lambda: TokenModel(transformers.T5EncoderModel(config)),
                               options["seed"])
    return TorchSource(module, token_inputs(options["vocab"]),
                       {"seq": (1, options["positions"])},
                       {"architecture": "T5EncoderModel", "attention": config._attn_implementation,
                        "feed_forward": options["feed_forward"]})


def vit_source(options: dict[str, Any]) -> TorchSource:
    """ViT (``ViTModel``) built from ``options`` with seeded weights."""
    config = transformers.ViTConfig(
        image_size=options["image"], patch_size=options["patch"], num_channels=3,
        hidden_size=options["hidden"], num_hidden_layers=options["layers"],
        num_attention_heads=options["heads"], intermediate_size=2 * options["hidden"],
        attn_implementation=options.get("attention", "eager"))
    module = construct_seeded(lambda: PixelModel(
        transformers.ViTModel(config, add_pooling_layer=False), "last_hidden_state"),
        options["seed"])
    image = options["image"]
    return TorchSource(module, (InputSpec("pixel_values", "float32", ("batch", 3, image, image)),),
                       {}, {"architecture": "ViTModel", "attention": config._attn_implementation})


#: Images the batch norms' running statistics are calibrated on.
CALIBRATION_IMAGES = 64


def _resnet_source(options: dict[str, Any], layer_type: str, depths, widths) -> TorchSource:
    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=options["width"],
        hidden_sizes=[options["width"] * m for m in widths], depths=list(depths),
        layer_type=layer_type)
    module = construct_seeded(lambda: PixelModel(transformers.ResNetModel(config), "pooler_output"),
                               options["seed"])
    image = options["image"]
    spec = InputSpec("pixel_values", "float32", ("batch", 3, image, image))
    # At 32 x 32 the last stage is 1 x 1: a batch norm there sees one value per image.
    # Statistics of 8 images gave ResNet-50 scales gamma / sqrt(var) up to 20 (64: 10),
    # and a float32 output that folding the batch norms moved by 2.6e-3 (64: 2.7e-4)
    calibration = torch.from_numpy(spec.draw({"batch": CALIBRATION_IMAGES},
                                             np.random.default_rng(options["seed"])))
    calibrate_batchnorm(module, (calibration,))
    return TorchSource(module, (spec,), {},
                       {"architecture": "ResNetModel", "layer_type": layer_type,
                        "depths": tuple(depths)})


def resnet18_source(options: dict[str, Any]) -> TorchSource:
    """ResNet-18 (basic blocks) built from ``options`` with seeded weights."""
    return _resnet_source(options, "basic", (2, 2, 2, 2), (1, 2, 4, 8))


def resnet50_source(options: dict[str, Any]) -> TorchSource:
    """ResNet-50 (bottleneck blocks) built from ``options`` with seeded weights."""
    return _resnet_source(options, "bottleneck", (3, 4, 6, 3), (4, 8, 16, 32))


# -- export and import -----------------------------------------------------------------------
def in_dtype(source: TorchSource, dtype: str) -> TorchSource:
    """``source`` with its module's floating-point weights and float inputs in ``dtype``."""
    source.module.to(getattr(torch, dtype))
    specs = tuple(s if s.is_integer else replace(s, dtype=dtype) for s in source.input_specs)
    return replace(source, input_specs=specs, metadata={**source.metadata, "dtype": dtype})


def example_sizes(options: dict[str, Any]) -> dict[str, int]:
    """The sizes of the symbolic dimensions the example inputs are drawn with."""
    sizes = {"batch": options["batch_size"]}
    if "seq_len" in options:
        sizes["seq"] = options["seq_len"]
    return sizes


def dynamic_roles(spec, options: dict[str, Any]) -> tuple[str, ...]:
    """The roles exported as symbolic dimensions; their example size must be >= 2."""
    roles = tuple(r for r in ROLES if options.get(r) == "dynamic")
    sizes = example_sizes(options)
    for role in roles:
        if sizes[role] < 2:
            raise ZooError(f"{spec.text}: a dynamic {role} needs an example size >= 2 "
                           f"(torch.export specialises sizes 0 and 1), got {sizes[role]}")
    return roles


def torch_reference(module: torch.nn.Module, names: tuple[str, ...]):
    """A reference function: numpy inputs by name -> the module's outputs as numpy."""

    def reference(inputs) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*(torch.from_numpy(np.array(inputs[n])) for n in names))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [o.detach().numpy() for o in outs]

    return reference


def export(source: TorchSource, roles: tuple[str, ...], sizes: dict[str, int], text: str,
           seconds: dict[str, float]):
    """``torch.export.export`` of the source on its example inputs, ``roles`` symbolic."""
    dims = {role: torch.export.Dim(role, min=source.dim_bounds.get(role, (1, None))[0],
                                   max=source.dim_bounds.get(role, (1, None))[1])
            for role in roles}
    dynamic_shapes = tuple({axis: dims[d] for axis, d in enumerate(s.shape) if d in dims} or None
                           for s in source.input_specs)
    rng = np.random.default_rng(0)
    example = tuple(torch.from_numpy(s.draw(sizes, rng)) for s in source.input_specs)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # torch.export's LeafSpec FutureWarning
            return timed(seconds, "export", torch.export.export, source.module, example,
                         dynamic_shapes=dynamic_shapes if roles else None)
    except Exception as err:
        raise ZooImportError(f"{text}: torch.export failed: {type(err).__name__}: "
                             f"{first_line(err)}") from err


def build(spec, source: TorchSource) -> ZooModel:
    """Export ``source`` with ``torch.export``, import it, and describe the result.

    A fresh import is kept in :mod:`.import_cache` with the model's description (when the
    caller asked for the cache), so the next load needs neither torch nor the source.
    """
    options = spec.as_dict()
    roles = dynamic_roles(spec, options)
    sizes = example_sizes(options)
    seconds: dict[str, float] = {}
    if options.get("dtype", "float32") != "float32":
        source = in_dtype(source, options["dtype"])
    imported, fresh = _imported(spec, source, roles, sizes, seconds)
    families = count_module_families(source.module)
    families["softmax"] = imported.softmax
    names = tuple(s.name for s in source.input_specs)
    metadata = {**source.metadata, "exporter": "torch.export",
                "import_fixups": imported.fixups,
                "activations": activation_modules(source.module),
                "config": _config_metadata(options, "layers", "hidden", "heads", "kv_heads",
                                           "vocab", "type_vocab", "positions", "intermediate",
                                           "image", "patch", "width")}
    mod = imported.mod
    model = ZooModel(spec=spec, mod=mod, entry=options["entry"],
                     input_specs=source.input_specs, sizes=sizes,
                     symbolic_dims=symbolic_dims(mod[options["entry"]], source.input_specs),
                     dim_bounds={r: source.dim_bounds.get(r, (1, None)) for r in sizes},
                     params=imported.params, families=families, source=source.module,
                     metadata=metadata, seconds=seconds,
                     reference_fn=torch_reference(source.module, names))
    if fresh:
        try:
            kept = replace(imported, description=description(model))
        except ZooError as err:  # a value JSON cannot hold: the model is not kept
            logger.info("import cache: %s not kept: %s", spec.text, err)
        else:
            import_cache.write(spec.text, kept)
    return model


def built_source(spec, make_source: Callable[[dict[str, Any]], TorchSource]
                 ) -> tuple[torch.nn.Module, Callable[..., list[np.ndarray]]]:
    """``(module, reference function)`` of ``make_source`` as :func:`build` makes them:
    what a model read from the import cache builds when its source is first read.
    """
    options = spec.as_dict()
    source = make_source(options)
    if options.get("dtype", "float32") != "float32":
        source = in_dtype(source, options["dtype"])
    return source.module, torch_reference(source.module,
                                          tuple(s.name for s in source.input_specs))


def _imported(spec, source: TorchSource, roles: tuple[str, ...], sizes: dict[str, int],
              seconds: dict[str, float]) -> tuple[import_cache.Imported, bool]:
    """``(the source's export and import, whether it was made now)``, read from
    :mod:`.import_cache` when the caller asked for it and it holds them.
    """
    options = spec.as_dict()
    cached = timed(seconds, "cached_import", import_cache.read, spec.text)
    if cached is not None:
        return cached, False
    seconds.pop("cached_import")
    program = export(source, roles, sizes, spec.text, seconds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod, params, fixups = from_torch(program, options["keep_params"], options["entry"],
                                         spec.text, seconds)
    return import_cache.Imported(mod, params, fixups, count_softmax_in_program(program)), True


# -- entry points named in the registry (patternkit.models.zoo.ZOO) ---------------------------
def gpt2(spec) -> ZooModel:
    """The ``zoo:gpt2`` model."""
    return build(spec, gpt2_source(spec.as_dict()))


def bert(spec) -> ZooModel:
    """The ``zoo:bert`` model."""
    return build(spec, bert_source(spec.as_dict()))


def llama(spec) -> ZooModel:
    """The ``zoo:llama`` model."""
    return build(spec, llama_source(spec.as_dict()))


def falcon(spec) -> ZooModel:
    """The ``zoo:falcon`` model."""
    return build(spec, falcon_source(spec.as_dict()))


def t5(spec) -> ZooModel:
    """The ``zoo:t5`` model."""
    return build(spec, t5_source(spec.as_dict()))


def vit(spec) -> ZooModel:
    """The ``zoo:vit`` model."""
    return build(spec, vit_source(spec.as_dict()))


def resnet18(spec) -> ZooModel:
    """The ``zoo:resnet18`` model."""
    return build(spec, resnet18_source(spec.as_dict()))


def resnet50(spec) -> ZooModel:
    """The ``zoo:resnet50`` model."""
    return build(spec, resnet50_source(spec.as_dict()))
