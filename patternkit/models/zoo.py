"""The model zoo: real models built offline with seeded random weights, imported into Relax.

Transformers models (GPT-2, BERT, a Llama-style decoder, Falcon, T5, ViT, ResNet-18/50,
and for the families of issue 36 GPT-J, Phi, Qwen2, LeViT and Swin v2) and small nets
written in torch here (a MobileNetV3-style net, a diffusion UNet middle block:
:mod:`.torch_vision_models`) are built from small configs (nothing is downloaded), given
seeded random weights and imported with ``torch.export`` + ``from_exported_program``;
``onnx:`` entries go through ``torch.onnx.export`` and ``from_onnx`` instead, and
``onnx:conv_bn`` is a hand-made ONNX graph.  Each build returns a
:class:`~patternkit.models.ZooModel`.

Spec syntax
-----------
``zoo:NAME[?OPTION=VALUE[&OPTION=VALUE...]]``, like a URL query, for example
``zoo:gpt2``, ``zoo:gpt2?layers=12&batch=dynamic``, ``zoo:bert?batch=dynamic&seq=dynamic``,
``zoo:onnx:bert?opset=14``, ``zoo:llama?keep_params=true&entry=forward``.  The ``zoo:``
prefix is optional in Python calls.  Booleans are ``true``/``false``; every entry's
options and defaults are in :data:`ZOO` (``patternkit list --models`` prints them).
Options shared by most entries:

``batch``, ``seq``: ``static`` (default) or ``dynamic``
    Export that dimension as a symbolic variable (``seq`` only for token models).
``batch_size``, ``seq_len``
    The example sizes (the export's sample; a dynamic dimension's sample must be >= 2).
``keep_params``
    ``true``: weights become parameters of the entry function (``ZooModel.params``),
    as ``keep_params_as_input`` does; ``false`` (default): constants.
``entry``
    The entry function's name (default ``main``), to exercise modules whose entry is
    not ``main``.
``seed``
    Seed of the random weights (inputs take their own seed in ``make_inputs``).
``dtype`` (the torch entries but ``zoo:t5``)
    ``float16`` converts the torch module to half precision before the export (see
    :data:`_DTYPE`'s note for T5).

Weights follow the "Traps" of the TVM 0.27 notes: matrices and kernels are drawn with
variance ``1/fan_in``, norm weights in ``[0.5, 1.5]`` and biases in ``[-0.5, 0.5]``, never
Hugging Face's init (whose tiny weights and exact ones and zeros hide wrong rewrites);
batch norms' running statistics are calibrated on a seeded batch.  Models with an
attention mask take it as an input, all ones in the examples: transformers 5 models
exported without one import but do not build for llvm.

Builds are cached per process (:func:`zoo_model` returns the same object for the same
canonical spec); nothing is written to disk except ONNX exports' scratch bytes in memory.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import logging
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping
from urllib.parse import parse_qsl

from . import import_cache
from .zoomodel import Deferred, ZooError, ZooModel, ZooSpec, described

logger = logging.getLogger(__name__)

PREFIX = "zoo:"


@dataclass(frozen=True)
class Option:
    """One option of a zoo entry: its default (which fixes its type), help and choices."""

    default: Any
    help: str
    choices: tuple = ()

    def parse(self, text: Any) -> Any:
        """The typed value of ``text`` (a string from a spec, or a Python value)."""
        kind = type(self.default)
        if isinstance(text, str) and kind is not str:
            if kind is bool:
                lowered = text.lower()
                if lowered not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(f"expected true or false, got {text!r}")
                value = lowered in ("true", "1", "yes")
            else:
                value = kind(text)
        else:
            value = text
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"expected {kind.__name__}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(map(str, self.choices))}, got {value!r}")
        return value


@dataclass(frozen=True)
class ZooEntry:
    """A model of the zoo: name, one-line summary, options and its builder.

    ``builder`` is ``"module.function"`` inside :mod:`patternkit.models`, imported on the
    first build so that listing the zoo needs neither torch nor onnx.
    """

    name: str
    summary: str
    options: Mapping[str, Option]
    builder: str
    extras: tuple[str, ...]

    def build_function(self) -> Callable[[ZooSpec], ZooModel]:
        """The entry's build function, imported now; a missing extra names its install."""
        return self._function(self.builder)

    @property
    def from_torch(self) -> bool:
        """Whether the entry is a torch model imported with ``torch.export`` (its import
        is kept in :mod:`.import_cache`; its source is ``<builder>_source``).
        """
        return self.builder.startswith("torch_")

    def source_function(self) -> Callable[[dict[str, Any]], Any]:
        """A torch entry's source builder (``gpt2_source`` for ``gpt2``), imported now."""
        return self._function(self.builder + "_source")

    def _function(self, path: str) -> Callable:
        for extra in self.extras:
            try:
                importlib.import_module(extra)
            except ImportError as err:
                hint = ("torch" if extra in ("torch", "transformers")
                        else "onnx" if extra == "onnxruntime" else extra)
                raise ZooError(f"zoo:{self.name} needs {extra}: pip install "
                               f"'patternkit[{hint}]'") from err
        module, function = path.rsplit(".", 1)
        return getattr(importlib.import_module(f"{__package__}.{module}"), function)


# -- the registry ----------------------------------------------------------------------------
def _common(static_seq: bool = False) -> dict[str, Option]:
    options = {
        "batch": Option("static", "static or dynamic (symbolic) batch dimension",
                        ("static", "dynamic")),
        "batch_size": Option(2, "example batch size"),
        "keep_params": Option(False, "weights as entry-function parameters"),
        "entry": Option("main", "name of the entry function"),
        "seed": Option(0, "seed of the random weights"),
    }
    if not static_seq:
        options["seq"] = Option("static", "static or dynamic (symbolic) sequence length",
                                ("static", "dynamic"))
        options["seq_len"] = Option(8, "example sequence length")
    return options


def _transformer(layers=2, hidden=64, heads=4, **extra) -> dict[str, Option]:
    return {
        "layers": Option(layers, "number of transformer layers"),
        "hidden": Option(hidden, "hidden size"),
        "heads": Option(heads, "attention heads"),
        **extra,
    }


#: GPT-2 with SDPA does not import: torch's ``run_decompositions`` (which
#: ``from_exported_program`` runs) cannot view its strided attention input, and TVM 0.27's
#: converter for an undecomposed SDPA takes float masks only (GPT-2's is boolean).
_ATTENTION = Option("eager", "attention implementation; with sdpa BERT, Llama and ViT import, "
                    "GPT-2 does not (torch's decomposition of its SDPA fails)",
                    ("eager", "sdpa"))
#: Offered where the model imports in float16: every torch entry but T5, whose float16
#: clamp (``torch.isinf(h).any()``) TVM 0.27's importer cannot convert ("Unsupported
#: function types ['any.default']").  The matmuls and convs stay float16 through
#: :mod:`.low_precision` (TVM's own converters return float32: docs/tvm-bugs.md).
#: The decoders added for the rotary family take eager attention only: their SDPA
#: imports were not checked.
_ATTENTION_EAGER = Option("eager", "attention implementation", ("eager",))
_DTYPE = Option("float32", "weights' dtype (float16: the torch module in half precision)",
                ("float32", "float16"))
_T5_FEED_FORWARD = Option("gated-gelu", "T5's feed-forward (gated-gelu: T5 v1.1 and Flan-T5)",
                          ("gated-gelu", "relu"))
_TORCH = ("torch", "transformers")
_ONNX = ("torch", "transformers", "onnx")
_EXPORTER = Option("torchscript", "torch.onnx.export exporter (dynamo: through onnxscript, "
                   "opset 18 converted down)", ("torchscript", "dynamo"))
_KV_HEADS = Option(2, "key/value heads (GQA when < heads)")
_MLP_WIDTH = Option(128, "MLP width")
_TYPE_VOCAB = Option(2, "token type vocabulary size")
_IMAGE_32 = Option(32, "image size")


def _torch_vision(**extra: Option) -> dict[str, Option]:
    """A torch vision model's options: the common ones (no sequence), the weights' dtype,
    then ``extra``.
    """
    return {**_common(static_seq=True), "dtype": _DTYPE, **extra}


def _entries() -> dict[str, ZooEntry]:
    text = dict(_common(), **_transformer(vocab=Option(128, "vocabulary size"),
                                          positions=Option(64, "position table size")))

    def torch_text(attention: Option, **extra: Option) -> dict[str, Option]:
        """A torch text model's options: ``text``, the attention, the dtype, ``extra``."""
        return {**text, "attention": attention, "dtype": _DTYPE, **extra}

    def onnx_text(**extra: Option) -> dict[str, Option]:
        """An ONNX export's options: ``text``, the exporter and opset, then ``extra``."""
        return {**text, "exporter": _EXPORTER, "opset": Option(17, "ONNX opset", (14, 17)),
                **extra}

    entries = [
        ZooEntry("gpt2", "GPT-2 (GPT2Model): pre-LN, GELU-tanh (NewGELUActivation), causal "
                 "attention", torch_text(_ATTENTION),
                 "torch_models.gpt2", _TORCH),
        ZooEntry("bert", "BERT (BertModel, no pooler): token types, padding mask, GELU erf",
                 torch_text(_ATTENTION, type_vocab=_TYPE_VOCAB),
                 "torch_models.bert", _TORCH),
        ZooEntry("llama", "Llama-style decoder (LlamaModel): RMSNorm, SiLU-gated MLP, RoPE, "
                 "grouped-query attention",
                 torch_text(_ATTENTION, kv_heads=_KV_HEADS, intermediate=_MLP_WIDTH),
                 "torch_models.llama", _TORCH),
        ZooEntry("falcon", "Falcon (FalconModel): parallel attention and MLP, RoPE or ALiBi, "
                 "multi-query (7B layout) or grouped key/value heads (40B layout)",
                 torch_text(_ATTENTION,
                            multi_query=Option(True, "7b layout: one key/value head (false: "
                                               "one per head)"),
                            layout=Option("7b", "7b: multi-query; 40b: grouped key/value "
                                          "heads (new_decoder_architecture)", ("7b", "40b")),
                            kv_heads=Option(1, "40b layout: key/value heads"),
                            alibi=Option(False, "ALiBi bias on the scores instead of RoPE")),
                 "torch_models.falcon", _TORCH),
        ZooEntry("t5", "T5 encoder (T5EncoderModel): RMS norms (T5LayerNorm), relative "
                 "position bias and padding mask on unscaled scores, gated GELU-tanh",
                 {**text, "attention": _ATTENTION, "feed_forward": _T5_FEED_FORWARD},
                 "torch_models.t5", _TORCH),
        ZooEntry("vit", "ViT (ViTModel, no pooler): patch conv, pre-LN, GELU erf",
                 {**_common(static_seq=True), **_transformer(), "attention": _ATTENTION,
                  "dtype": _DTYPE,
                  "image": Option(32, "image size"), "patch": Option(8, "patch size")},
                 "torch_models.vit", _TORCH),
        ZooEntry("resnet18", "ResNet-18 (transformers ResNetModel, basic blocks 2-2-2-2)",
                 _torch_vision(width=Option(16, "stem width (64 in the paper)"),
                               image=_IMAGE_32), "torch_models.resnet18", _TORCH),
        ZooEntry("resnet50", "ResNet-50 (transformers ResNetModel, bottlenecks 3-4-6-3)",
                 _torch_vision(width=Option(8, "stem width (64 in the paper)"),
                               image=_IMAGE_32), "torch_models.resnet50", _TORCH),
        ZooEntry("gptj", "GPT-J (GPTJModel): rotary embeddings on interleaved lanes over "
                 "rotary_dim lanes of each head, parallel attention and MLP",
                 torch_text(_ATTENTION_EAGER,
                            rotary_dim=Option(8, "lanes of each head the rotation takes (even)")),
                 "torch_decoder_models.gptj", _TORCH),
        ZooEntry("phi", "Phi (PhiModel): partial half-rotation rotary embeddings, parallel "
                 "attention and MLP, GELU-tanh",
                 torch_text(_ATTENTION_EAGER,
                            partial_rotary=Option(0.5, "share of each head the rotation takes"),
                            intermediate=_MLP_WIDTH),
                 "torch_decoder_models.phi", _TORCH),
        ZooEntry("qwen2", "Qwen2 (Qwen2Model): SwiGLU decoder, RMS norms, RoPE, grouped-query "
                 "attention with biased q/k/v",
                 torch_text(_ATTENTION_EAGER, kv_heads=_KV_HEADS, intermediate=_MLP_WIDTH),
                 "torch_decoder_models.qwen2", _TORCH),
        ZooEntry("mobilenet", "MobileNetV3-style net: depthwise convs, batch norms, "
                 "squeeze-excite with hard-sigmoid, hard-swish and ReLU6",
                 _torch_vision(width=Option(16, "stem width"),
                               classes=Option(10, "output classes"), image=_IMAGE_32),
                 "torch_vision_models.mobilenet", ("torch",)),
        ZooEntry("unet_block", "diffusion UNet middle block in torch: ResNet blocks (GroupNorm, "
                 "SiLU, conv, time embedding) around a GroupNorm + transformer with GEGLU",
                 _torch_vision(channels=Option(32, "channels"),
                               groups=Option(8, "group-norm groups"),
                               heads=Option(2, "attention heads"),
                               time_dim=Option(32, "time embedding size"),
                               image=Option(8, "latent size")),
                 "torch_vision_models.unet_block", ("torch",)),
        ZooEntry("levit", "LeViT (LevitModel): Linear + BatchNorm1d layers, hard-swish, "
                 "attention with learned position biases",
                 _torch_vision(layers=Option(1, "blocks per stage (two stages)"),
                               hidden=Option(32, "first stage width (a multiple of 8)"),
                               heads=Option(2, "first stage heads"),
                               image=Option(64, "image size")),
                 "torch_vision_models.levit", _TORCH),
        ZooEntry("swinv2", "Swin v2 (Swinv2Model, no pooler): shifted-window cosine "
                 "attention with a log-spaced position bias MLP, two stages",
                 _torch_vision(layers=Option(1, "blocks per stage (two stages)"),
                               hidden=Option(16, "embedding size"),
                               heads=Option(2, "first stage heads"),
                               window=Option(4, "window size"), patch=Option(4, "patch size"),
                               image=_IMAGE_32),
                 "torch_vision_models.swinv2", _TORCH),
        ZooEntry("onnx:gpt2", "GPT-2 through torch.onnx.export (opset 14 writes LayerNorm out)",
                 onnx_text(), "onnx_models.gpt2", _ONNX),
        ZooEntry("onnx:bert", "BERT through torch.onnx.export (opset 14 writes LayerNorm out)",
                 onnx_text(type_vocab=_TYPE_VOCAB),
                 "onnx_models.bert", _ONNX),
        ZooEntry("onnx:t5", "T5 encoder through torch.onnx.export (every opset before 23 "
                 "writes RMS norms out)",
                 onnx_text(feed_forward=_T5_FEED_FORWARD),
                 "onnx_models.t5", _ONNX),
        ZooEntry("onnx:qdq", "ONNX QDQ model (patternkit.models.onnx_qdq): Conv + Relu + "
                 "MatMul + Add quantised by onnxruntime's quantize_static, one fixed input "
                 "(1, 3, 8, 8)",
                 {**_common(static_seq=True),
                  "batch_size": Option(1, "example batch size (the model's is fixed at 1)"),
                  "opset": Option(17, "ONNX opset of the float model", (13, 17)),
                  "activations": Option("int8", "activations' quantised type",
                                        ("int8", "uint8"))},
                 "onnx_qdq_zoo.qdq", ("onnx", "onnxruntime")),
        ZooEntry("onnx:conv_bn", "hand-made ONNX Conv + BatchNormalization + Relu; TVM's "
                 "importer leaves dead bindings of the batch-norm statistics",
                 {**_common(static_seq=True), "opset": Option(17, "ONNX opset", (14, 17))},
                 "onnx_models.conv_bn", ("onnx",)),
    ]
    return {e.name: e for e in entries}


#: name -> :class:`ZooEntry`, in listing order.
ZOO: Mapping[str, ZooEntry] = MappingProxyType(_entries())


def _unknown(kind: str, value: str, known) -> str:
    close = difflib.get_close_matches(value, list(known), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown {kind} {value!r} (known: {', '.join(known)}){hint}"


def parse_spec(text: str, **overrides: Any) -> ZooSpec:
    """The :class:`ZooSpec` of ``zoo:NAME?option=value&...``; ``overrides`` win.

    Raises
    ------
    ZooError
        Unknown model or option, or a value of the wrong type or outside the choices.
    """
    body = text[len(PREFIX):] if text.startswith(PREFIX) else text
    name, _, query = body.partition("?")
    if name not in ZOO:
        raise ZooError(f"{PREFIX}{name}: " + _unknown("zoo model", name, ZOO))
    entry = ZOO[name]
    try:
        given: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=True,
                                               strict_parsing=bool(query)))
    except ValueError as err:  # "layers" without "=value"
        raise ZooError(f"{PREFIX}{name}: {err} (options are option=value, joined by &)") from None
    given.update(overrides)
    values = {}
    for key, value in given.items():
        if key not in entry.options:
            raise ZooError(f"{PREFIX}{name}: " + _unknown("option", key, entry.options))
        try:
            values[key] = entry.options[key].parse(value)
        except ValueError as err:
            raise ZooError(f"{PREFIX}{name}: option {key}: {err}") from None
    resolved = {key: values.get(key, option.default) for key, option in entry.options.items()}
    changed = [f"{k}={_format(v)}" for k, v in resolved.items() if k in values
               and v != entry.options[k].default]
    canonical = PREFIX + name + ("?" + "&".join(changed) if changed else "")
    return ZooSpec(name, tuple(sorted(resolved.items())), canonical)


def _format(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def zoo_model(spec: str | ZooSpec, **options: Any) -> ZooModel:
    """Build (or return the cached) zoo model ``spec``, with ``options`` on top.

    ``zoo_model("gpt2", layers=4, batch="dynamic")`` is
    ``zoo_model("zoo:gpt2?layers=4&batch=dynamic")``; both return the same object.

    Raises
    ------
    ZooError
        Bad spec, or the extra the entry needs (torch, transformers, onnx) is missing.
    ZooImportError
        The export or the Relax import failed (see the entry's notes).
    """
    resolved = spec if isinstance(spec, ZooSpec) and not options else parse_spec(
        spec.text if isinstance(spec, ZooSpec) else spec, **options)
    return _build(resolved)


@functools.cache
def _build(spec: ZooSpec) -> ZooModel:
    entry = ZOO[spec.name]
    model = _from_import_cache(spec, entry) or entry.build_function()(spec)
    logger.info("built %s in %s", spec.text,
                ", ".join(f"{step} {t:.1f}s" for step, t in model.seconds.items()))
    return model


def _from_import_cache(spec: ZooSpec, entry: ZooEntry) -> ZooModel | None:
    """A torch entry's model as the import cache kept it, its torch module built only when
    read (:class:`~.zoomodel.Deferred`); ``None`` when not cached (or not asked for).
    """
    if not entry.from_torch or not import_cache.active():
        return None
    start = time.perf_counter()
    found = import_cache.read(spec.text)
    if found is None or found.description is None:
        return None
    seconds = {"cached_import": time.perf_counter() - start}

    def build_source() -> tuple[Any, Callable]:
        make_source = entry.source_function()  # torch and transformers imported here
        from .torch_models import built_source

        return built_source(spec, make_source)

    return described(spec, found.mod, found.params, found.description, Deferred(build_source),
                     seconds)
