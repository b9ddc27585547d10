"""The torch sources of the spelling matrix: one small block per family and spelling.

Users bring the same computation spelled many ways: a layer norm as ``nn.LayerNorm`` or
written out, hard-swish as a module, a function or ``x * relu6(x + 3) / 6``, attention
as matmul-softmax-matmul, SDPA, ``einsum`` or ``bmm`` over ``(batch * heads)``.  Each
:class:`Spelling` here is one of those spellings as a torch module (a *block*: one
instance of its family, input and output of one shape), and :func:`spelling_model`
chains :data:`COPIES` blocks into the model that ``benchmarks/spellings.py`` exports
through every front door.  The instances a model holds are counted from its torch
modules (:func:`count_instances`), never from an imported graph, so an importer that
drops or duplicates an instance cannot change the count the collapses are measured
against.

A spelling says what counts as one instance collapsed after the library ran
(:class:`Target`): a fused Relax op (``relax.nn.layer_norm``), a composite of the library
(``byoc.hardswish``: Relax has no op), or a batch norm that is gone (folded into the
layer before it).  Sizes are tiny (width 16, sequence 8): the matrix measures
spellings, not speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Spelling", "Target", "SPELLINGS", "COPIES", "WIDTH", "spelling_model",
           "count_instances", "find_spelling"]

#: Blocks chained in each model: two, so that a rule that takes only the first (or only
#: the last) instance shows as 1 / 2.
COPIES = 2
#: Feature width of the token blocks; attention splits it into :data:`HEADS` heads.
WIDTH = 16
HEADS = 2
#: Channels and spatial size of the image blocks.
CHANNELS = 8


@dataclass(frozen=True)
class Target:
    """What one collapsed instance is after the library's rewrites and composites.

    ``kind`` is ``"op"`` (``names``: the fused Relax ops, any of them), ``"composite"``
    (``names``: library composite entries, ``byoc.<name>``) or ``"gone"`` (``names``: the
    ops that must be left no more: a batch norm folded into the layer before it).
    """

    kind: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class Spelling:
    """One family spelled one way, as a torch block.

    ``block()`` builds one instance (input and output of ``shape``, a tuple of sizes and
    the roles ``"batch"`` / ``"seq"``, which the dynamic-shape columns make symbolic);
    ``rules`` are the prefixes of the library rules and composites whose skip reasons
    explain a miss.  torch's SDPA front door is a spelling of the attention family
    (:class:`SdpaAttention`): the blocks here are written, not configured.
    """

    family: str
    source: str
    block: Callable[[], nn.Module]
    shape: tuple[int | str, ...]
    target: Target
    rules: tuple[str, ...]

    @property
    def key(self) -> str:
        """``family/source``, the row's name in filters."""
        return f"{self.family}/{self.source}"


class Chain(nn.Module):
    """:data:`COPIES` blocks of one spelling applied one after the other."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        """``x`` through every block in turn."""
        for block in self.blocks:
            x = block(x)
        return x


def spelling_model(spelling: Spelling, dtype: torch.dtype = torch.float32,
                   seed: int = 0) -> nn.Module:
    """:data:`COPIES` blocks of ``spelling`` in eval mode, seeded, in ``dtype``."""
    torch.manual_seed(seed)
    model = Chain([spelling.block() for _ in range(COPIES)]).eval()
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):  # statistics of a trained net
            size = module.num_features
            module.running_mean.copy_(torch.rand(size, generator=generator) - 0.5)
            module.running_var.copy_(torch.rand(size, generator=generator) + 0.5)
            module.weight.data.copy_(torch.rand(size, generator=generator) + 0.5)
            module.bias.data.copy_(torch.rand(size, generator=generator) - 0.5)
        elif isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, HandNorm)):
            for p in module.parameters():  # not the identity affine of a fresh norm
                p.data.add_(0.1 * torch.randn(p.shape, generator=generator))
    return model.to(dtype)


def count_instances(model: nn.Module, spelling: Spelling) -> int:
    """Instances of ``spelling``'s family in ``model``: its blocks, counted as modules."""
    block_type = type(spelling.block())
    return sum(type(m) is block_type for m in model.modules())


# -- activations -------------------------------------------------------------------------------
class Activation(nn.Module):
    """An activation given as a function of one tensor (subclassed per spelling)."""

    fn: Callable = staticmethod(lambda x: x)

    def forward(self, x):
        """The activation of ``x``."""
        return type(self).fn(x)


def _activation(name: str, fn: Callable) -> Callable[[], nn.Module]:
    cls = type(name, (Activation,), {"fn": staticmethod(fn), "__doc__": f"{name} block."})
    return cls


class Wrapped(nn.Module):
    """A torch activation module (``nn.Hardswish()``) as a block."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.inner = module

    def forward(self, x):
        """``inner(x)``."""
        return self.inner(x)


def _module(cls_name: str, factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def init(self):
        Wrapped.__init__(self, factory())

    return type(cls_name, (Wrapped,), {"__init__": init, "__doc__": f"{cls_name} block."})


#: What a relu6 block scales its input by: a clip of a clip is one clip, and the dynamo
#: exporter merges two chained ReLU6 into one ``Clip``; a scale between them keeps the
#: model's copies apart, so a cell counts what the rule did, not what the exporter did.
RELU6_INPUT_SCALE = 1.5


class ScaledRelu6(Wrapped):
    """``nn.ReLU6`` of ``x * RELU6_INPUT_SCALE`` as a block."""

    def __init__(self):
        super().__init__(nn.ReLU6())

    def forward(self, x):
        """``relu6(x * RELU6_INPUT_SCALE)``."""
        return self.inner(x * RELU6_INPUT_SCALE)


_SQRT1_2 = 1 / math.sqrt(2)
_TANH_C = math.sqrt(2 / math.pi)


# -- norms -------------------------------------------------------------------------------------
class HandNorm(nn.Module):
    """Base of the written-out norms: a learned weight (and bias) of ``WIDTH`` lanes."""

    def __init__(self, width: int = WIDTH, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None


class HandLayerNorm(HandNorm):
    """A layer norm written out: mean, biased variance, ``rsqrt``, scale and shift."""

    def forward(self, x):
        """Normalise the last axis."""
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + 1e-5) * self.weight + self.bias


class LlamaRMSNorm(HandNorm):
    """Llama's RMS norm: computed in float32, cast back, then the weight."""

    def __init__(self):
        super().__init__(bias=False)

    def forward(self, x):
        """Normalise the last axis by its root mean square."""
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(dtype)


class GemmaRMSNorm(HandNorm):
    """Gemma's RMS norm: ``(1 + w)`` as the scale, applied in float32."""

    def __init__(self):
        super().__init__(bias=False)
        self.weight.data.zero_()

    def forward(self, x):
        """Normalise the last axis; scale by ``1 + weight``."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (h * (1.0 + self.weight.float())).type_as(x)


class HandGroupNorm(nn.Module):
    """A group norm written out: reshape to groups, mean / variance, reshape back."""

    def __init__(self, groups: int = 2, channels: int = CHANNELS):
        super().__init__()
        self.groups = groups
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(channels))
        self.bias = nn.Parameter(0.1 * torch.randn(channels))

    def forward(self, x):
        """Normalise each group of channels over its channels and positions."""
        b, c, h, w = x.shape
        g = x.reshape(b, self.groups, -1)
        mean = g.mean(-1, keepdim=True)
        var = g.var(-1, keepdim=True, unbiased=False)
        g = (g - mean) / torch.sqrt(var + 1e-5)
        return g.reshape(b, c, h, w) * self.weight[:, None, None] + self.bias[:, None, None]


class HandInstanceNorm(nn.Module):
    """An instance norm written out over the spatial axes, then a per-channel affine."""

    def __init__(self, channels: int = CHANNELS):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(channels))
        self.bias = nn.Parameter(0.1 * torch.randn(channels))

    def forward(self, x):
        """Normalise every channel of every image over its positions."""
        mean = x.mean((2, 3), keepdim=True)
        var = x.var((2, 3), keepdim=True, unbiased=False)
        x = (x - mean) / torch.sqrt(var + 1e-5)
        return x * self.weight[:, None, None] + self.bias[:, None, None]


class HandSoftmax(nn.Module):
    """A softmax written out: ``exp(x - max)`` over its sum."""

    def forward(self, x):
        """Softmax over the last axis."""
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)


class HandLogSoftmax(nn.Module):
    """A log-softmax written out: ``x - max - log(sum(exp(x - max)))``."""

    def forward(self, x):
        """Log-softmax over the last axis."""
        shifted = x - x.amax(-1, keepdim=True)
        return shifted - torch.log(torch.exp(shifted).sum(-1, keepdim=True))


# -- batch norm after a layer ------------------------------------------------------------------
class LinearBatchNorm(nn.Module):
    """LeViT's ``LinearNorm``: a ``Linear`` then ``BatchNorm1d`` over its features."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH, bias=False)
        self.norm = nn.BatchNorm1d(WIDTH)

    def forward(self, x):
        """``norm(linear(x))`` for ``x`` of shape (batch, WIDTH)."""
        return self.norm(self.linear(x))


class Conv1dBatchNorm(nn.Module):
    """A ``Conv1d`` then ``BatchNorm1d`` (audio and text CNNs)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(CHANNELS, CHANNELS, 3, padding=1)
        self.norm = nn.BatchNorm1d(CHANNELS)

    def forward(self, x):
        """``norm(conv(x))`` for ``x`` of shape (batch, CHANNELS, length)."""
        return self.norm(self.conv(x))


class Conv2dBatchNorm(nn.Module):
    """A ``Conv2d`` (no bias) then ``BatchNorm2d``: the ResNet stem."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(CHANNELS)

    def forward(self, x):
        """``norm(conv(x))``."""
        return self.norm(self.conv(x))


class ConvTransposeBatchNorm(nn.Module):
    """A shape-keeping ``ConvTranspose2d`` then ``BatchNorm2d`` (decoders, GAN generators)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose2d(CHANNELS, CHANNELS, 3, padding=1)
        self.norm = nn.BatchNorm2d(CHANNELS)

    def forward(self, x):
        """``norm(conv_transpose(x))``."""
        return self.norm(self.conv(x))


# -- attention ---------------------------------------------------------------------------------
class Attention(nn.Module):
    """Self-attention over ``(batch, seq, WIDTH)``: projections, heads, the core, output.

    Subclasses write the core (scores, softmax, weighted sum) their own way.
    """

    def __init__(self):
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.out = nn.Linear(WIDTH, WIDTH)
        self.scale = (WIDTH // HEADS) ** -0.5

    def forward(self, x):
        """Attention of ``x`` to itself."""
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, HEADS, WIDTH // HEADS).transpose(1, 2) for p in self.qkv)
        o = self.core(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, s, WIDTH))

    def core(self, q, k, v):
        """``softmax(q k^T * scale) v`` over ``(batch, heads, seq, head_dim)``."""
        raise NotImplementedError


class EagerAttention(Attention):
    """matmul -> softmax -> matmul, as HF's eager attention writes it."""

    def core(self, q, k, v):
        """The eager core."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        return torch.matmul(F.softmax(scores, dim=-1), v)


class SdpaAttention(Attention):
    """``F.scaled_dot_product_attention``, torch's fused front door."""

    def core(self, q, k, v):
        """The SDPA core."""
        return F.scaled_dot_product_attention(q, k, v)


class MaskedSdpaAttention(Attention):
    """``F.scaled_dot_product_attention`` with a bool causal mask: torch.export writes the
    safe softmax, torch's ONNX exporter a NaN guard on the probabilities.
    """

    def core(self, q, k, v):
        """The SDPA core, masked."""
        s = q.shape[-2]
        allowed = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


class EinsumAttention(Attention):
    """``einsum("bhqd,bhkd->bhqk")``, softmax, ``einsum("bhqk,bhkd->bhqd")``."""

    def core(self, q, k, v):
        """The einsum core."""
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.scale
        return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)


class BmmAttention(Attention):
    """``baddbmm`` over ``(batch * heads, q, k)`` with a zero bias, as older HF models do."""

    def core(self, q, k, v):
        """The 3-D core, split back into heads."""
        b, h, s, d = q.shape
        q3, k3, v3 = (t.reshape(b * h, s, d) for t in (q, k, v))
        bias = torch.zeros(b * h, s, s, dtype=q.dtype)
        scores = torch.baddbmm(bias, q3, k3.transpose(1, 2), beta=1.0, alpha=self.scale)
        return torch.bmm(scores.softmax(-1), v3).view(b, h, s, d)


class HandSoftmaxAttention(Attention):
    """matmul -> a softmax written out as ``exp(x - amax)`` -> matmul."""

    def core(self, q, k, v):
        """The eager core with the softmax written out."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        e = torch.exp(scores - scores.amax(-1, keepdim=True))
        return torch.matmul(e / e.sum(-1, keepdim=True), v)


#: Swin v2's clamp of the learned logit scale: the scale is at most 100.
MAX_LOGIT = math.log(100.0)
#: The tokens of one window (Swin's windows are of a fixed size; the batch is images *
#: windows, so only the batch varies in the dynamic columns).
WINDOW_TOKENS = 8


class CosineAttention(Attention):
    """Swin v2's cosine attention: ``F.normalize``d queries and keys, the scores times a
    learned per-head scale ``exp(clamp(logit_scale, max=log(100)))``, then a position bias
    ``16 * sigmoid(table)`` added before the softmax (transformers' ``Swinv2SelfAttention``).
    """

    def __init__(self):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(HEADS, 1, 1))
                                        + 0.3 * torch.randn(HEADS, 1, 1))
        self.table = nn.Parameter(torch.randn(HEADS, WINDOW_TOKENS, WINDOW_TOKENS))

    def core(self, q, k, v):
        """The cosine core."""
        scores = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        scores = scores * torch.clamp(self.logit_scale, max=MAX_LOGIT).exp()
        scores = scores + 16 * torch.sigmoid(self.table).unsqueeze(0)
        return torch.matmul(scores.softmax(-1), v)


# -- rotary embeddings -------------------------------------------------------------------------
class Rotary(nn.Module):
    """A rotary embedding of ``(batch, heads, seq, 8)`` with tables computed on the fly
    from ``inv_freq`` and the positions (HF's rotary module, Qwen3).
    """

    head_dim = 8
    rotary_dim = 8

    def __init__(self):
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, self.rotary_dim, 2).float() / self.rotary_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def tables(self, x):
        """``cos`` and ``sin`` of the angles for ``x``'s positions."""
        t = torch.arange(x.shape[2], dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)
        emb = self.layout(freqs)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def layout(self, freqs):
        """The angles per lane: the halves repeated (Llama / NeoX)."""
        return torch.cat((freqs, freqs), dim=-1)

    def rotate(self, x):
        """``rotate_half``: the second half negated, then the first."""
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, x):
        """``x * cos + rotate(x) * sin``."""
        cos, sin = self.tables(x)
        return x * cos + self.rotate(x) * sin


class InterleavedRotary(Rotary):
    """GPT-J's rotary embedding: lanes rotated in even/odd pairs."""

    def layout(self, freqs):
        """The angles per lane: each repeated twice in place."""
        return torch.repeat_interleave(freqs, 2, dim=-1)

    def rotate(self, x):
        """``rotate_every_two``: ``(-odd, even)`` interleaved."""
        even, odd = x[..., ::2], x[..., 1::2]
        return torch.stack((-odd, even), dim=-1).flatten(-2)


class PartialRotary(Rotary):
    """Phi / NeoX ``rotary_pct``: the first half of the lanes rotated, the rest passed."""

    rotary_dim = 4

    def forward(self, x):
        """Rotate ``x[..., :rotary_dim]``; concatenate ``x[..., rotary_dim:]`` after it."""
        rot, passed = x[..., : self.rotary_dim], x[..., self.rotary_dim:]
        cos, sin = self.tables(x)
        return torch.cat((rot * cos + self.rotate(rot) * sin, passed), dim=-1)


# -- gated MLPs --------------------------------------------------------------------------------
class GatedMLP(nn.Module):
    """``down(act(x @ Wg) * (x @ Wu))`` with separate gate and up projections."""

    hidden = 2 * WIDTH

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(WIDTH, self.hidden, bias=False)
        self.up = nn.Linear(WIDTH, self.hidden, bias=False)
        self.down = nn.Linear(self.hidden, WIDTH, bias=False)

    def act(self, x):
        """The gate's activation."""
        return F.silu(x)

    def forward(self, x):
        """The gated MLP of ``x``."""
        return self.down(self.act(self.gate(x)) * self.up(x))


class PackedGatedMLP(GatedMLP):
    """One projection to ``[gate, up]`` then ``chunk`` (Phi-3, ChatGLM)."""

    def __init__(self):
        super().__init__()
        del self.gate, self.up
        self.gate_up = nn.Linear(WIDTH, 2 * self.hidden, bias=False)

    def forward(self, x):
        """The gated MLP of ``x`` from one packed projection."""
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)


class GegluMLP(GatedMLP):
    """GeGLU with separate projections (T5 v1.1, Gemma use the tanh GELU)."""

    def act(self, x):
        """The erf GELU."""
        return F.gelu(x)


class PackedGegluMLP(PackedGatedMLP):
    """GeGLU from one packed projection (diffusers' ``GEGLU``)."""

    def act(self, x):
        """The erf GELU."""
        return F.gelu(x)


# -- the rows ----------------------------------------------------------------------------------
_TOKENS = ("batch", "seq", WIDTH)
_IMAGES = ("batch", CHANNELS, 8, 8)
_HEADS = ("batch", HEADS, "seq", 8)


def _op(*names: str) -> Target:
    return Target("op", names)


def _composite(*names: str) -> Target:
    return Target("composite", tuple(f"byoc.{n}" for n in names))


_BN_GONE = Target("gone", ("relax.nn.batch_norm",))

#: Every row of the matrix, family by family.
SPELLINGS: tuple[Spelling, ...] = (
    # activations
    Spelling("gelu", "nn.GELU", _module("TorchGelu", nn.GELU), _TOKENS,
             _op("relax.nn.gelu"), ("gelu.",)),
    Spelling("gelu", "written out (erf)", _activation(
        "HandGelu", lambda x: 0.5 * x * (1 + torch.erf(x * _SQRT1_2))), _TOKENS,
        _op("relax.nn.gelu"), ("gelu.",)),
    Spelling("gelu_tanh", "nn.GELU(approximate='tanh')",
             _module("TorchGeluTanh", lambda: nn.GELU(approximate="tanh")), _TOKENS,
             _op("relax.nn.gelu_tanh"), ("gelu_tanh.",)),
    Spelling("gelu_tanh", "written out (tanh)", _activation(
        "HandGeluTanh",
        lambda x: 0.5 * x * (1 + torch.tanh(_TANH_C * (x + 0.044715 * x.pow(3))))),
        _TOKENS, _op("relax.nn.gelu_tanh"), ("gelu_tanh.",)),
    Spelling("quick_gelu", "x * sigmoid(1.702 x)", _activation(
        "QuickGelu", lambda x: x * torch.sigmoid(1.702 * x)), _TOKENS,
        _composite("quick_gelu"), ("byoc.quick_gelu", "silu.")),
    Spelling("silu", "nn.SiLU", _module("TorchSilu", nn.SiLU), _TOKENS,
             _op("relax.nn.silu"), ("silu.",)),
    Spelling("silu", "x * sigmoid(x)", _activation("HandSilu", lambda x: x * torch.sigmoid(x)),
             _TOKENS, _op("relax.nn.silu"), ("silu.",)),
    Spelling("relu6", "nn.ReLU6", ScaledRelu6, _IMAGES, _op("relax.clip"), ("relu6.",)),
    Spelling("relu6", "min(max(x, 0), 6)", _activation(
        "MinMaxRelu6", lambda x: torch.minimum(
            torch.maximum(x * RELU6_INPUT_SCALE, torch.tensor(0.0, dtype=x.dtype)),
            torch.tensor(6.0, dtype=x.dtype))),
        _IMAGES, _op("relax.clip"), ("relu6.",)),
    Spelling("hardswish", "nn.Hardswish", _module("TorchHardswish", nn.Hardswish), _IMAGES,
             _composite("hardswish"), ("hardswish.", "byoc.hardswish", "relu6.")),
    Spelling("hardswish", "F.hardswish", _activation("FunctionalHardswish", F.hardswish),
             _IMAGES, _composite("hardswish"), ("hardswish.", "byoc.hardswish", "relu6.")),
    Spelling("hardswish", "x * relu6(x + 3) / 6", _activation(
        "HandHardswish", lambda x: x * F.relu6(x + 3) / 6), _IMAGES,
        _composite("hardswish"), ("hardswish.", "byoc.hardswish", "relu6.")),
    Spelling("hardsigmoid", "nn.Hardsigmoid", _module("TorchHardsigmoid", nn.Hardsigmoid),
             _IMAGES, _composite("hardsigmoid"),
             ("hardsigmoid.", "byoc.hardsigmoid", "relu6.")),
    Spelling("hardsigmoid", "relu6(x + 3) / 6", _activation(
        "HandHardsigmoid", lambda x: F.relu6(x + 3) / 6), _IMAGES,
        _composite("hardsigmoid"), ("hardsigmoid.", "byoc.hardsigmoid", "relu6.")),
    Spelling("softplus", "nn.Softplus", _module("TorchSoftplus", nn.Softplus), _TOKENS,
             _op("relax.nn.softplus"), ("softplus.",)),
    Spelling("mish", "nn.Mish", _module("TorchMish", nn.Mish), _TOKENS,
             _composite("mish"), ("byoc.mish", "softplus.")),
    Spelling("mish", "x * tanh(softplus(x))", _activation(
        "HandMish", lambda x: x * torch.tanh(F.softplus(x))), _TOKENS,
        _composite("mish"), ("byoc.mish", "softplus.")),
    # norms
    Spelling("layernorm", "nn.LayerNorm", _module("TorchLayerNorm", lambda: nn.LayerNorm(WIDTH)),
             _TOKENS, _op("relax.nn.layer_norm"), ("layernorm.",)),
    Spelling("layernorm", "written out", HandLayerNorm, _TOKENS,
             _op("relax.nn.layer_norm"), ("layernorm.",)),
    Spelling("rmsnorm", "nn.RMSNorm", _module("TorchRMSNorm", lambda: nn.RMSNorm(WIDTH, 1e-6)),
             _TOKENS, _op("relax.nn.rms_norm"), ("rmsnorm.",)),
    Spelling("rmsnorm", "written out (Llama)", LlamaRMSNorm, _TOKENS,
             _op("relax.nn.rms_norm"), ("rmsnorm.",)),
    Spelling("rmsnorm", "written out (Gemma, 1 + w)", GemmaRMSNorm, _TOKENS,
             _op("relax.nn.rms_norm"), ("rmsnorm.",)),
    Spelling("groupnorm", "nn.GroupNorm", _module("TorchGroupNorm",
                                                  lambda: nn.GroupNorm(2, CHANNELS)),
             _IMAGES, _op("relax.nn.group_norm"), ("groupnorm.",)),
    Spelling("groupnorm", "written out", HandGroupNorm, _IMAGES,
             _op("relax.nn.group_norm"), ("groupnorm.", "layernorm.")),
    Spelling("instancenorm", "nn.InstanceNorm2d(affine)", _module(
        "TorchInstanceNorm", lambda: nn.InstanceNorm2d(CHANNELS, affine=True)), _IMAGES,
        _op("relax.nn.instance_norm"), ("instancenorm.", "layernorm.")),
    Spelling("instancenorm", "written out", HandInstanceNorm, _IMAGES,
             _op("relax.nn.instance_norm"), ("instancenorm.", "layernorm.")),
    Spelling("batchnorm", "Linear + BatchNorm1d", LinearBatchNorm, ("batch", WIDTH),
             _BN_GONE, ("matmul.fold_batchnorm", "batchnorm.")),
    Spelling("batchnorm", "Conv1d + BatchNorm1d", Conv1dBatchNorm, ("batch", CHANNELS, "seq"),
             _BN_GONE, ("conv.fold_batchnorm", "batchnorm.")),
    Spelling("batchnorm", "Conv2d + BatchNorm2d", Conv2dBatchNorm, _IMAGES,
             _BN_GONE, ("conv.fold_batchnorm", "batchnorm.")),
    Spelling("batchnorm", "ConvTranspose2d + BatchNorm2d", ConvTransposeBatchNorm, _IMAGES,
             _BN_GONE, ("conv.fold_batchnorm", "batchnorm.")),
    # softmax
    Spelling("softmax", "nn.Softmax", _module("TorchSoftmax", lambda: nn.Softmax(-1)), _TOKENS,
             _op("relax.nn.softmax"), ("softmax.",)),
    Spelling("softmax", "exp(x - amax) / sum", HandSoftmax, _TOKENS,
             _op("relax.nn.softmax"), ("softmax.",)),
    Spelling("log_softmax", "nn.LogSoftmax", _module("TorchLogSoftmax",
                                                     lambda: nn.LogSoftmax(-1)),
             _TOKENS, _op("relax.nn.log_softmax"), ("log_softmax.", "softmax.")),
    Spelling("log_softmax", "x - amax - log(sum(exp))", HandLogSoftmax, _TOKENS,
             _op("relax.nn.log_softmax"), ("log_softmax.", "softmax.")),
    # attention
    Spelling("attention", "eager matmul-softmax-matmul", EagerAttention, _TOKENS,
             _op("relax.nn.attention", "relax.nn.attention_bias"), ("attention.",)),
    Spelling("attention", "SDPA", SdpaAttention, _TOKENS,
             _op("relax.nn.attention", "relax.nn.attention_bias"), ("attention.",)),
    Spelling("attention", "SDPA, bool mask", MaskedSdpaAttention, _TOKENS,
             _op("relax.nn.attention", "relax.nn.attention_bias"), ("attention.",)),
    Spelling("attention", "einsum", EinsumAttention, _TOKENS,
             _op("relax.nn.attention", "relax.nn.attention_bias"), ("attention.",)),
    Spelling("attention", "baddbmm (batch*heads)", BmmAttention, _TOKENS,
             _op("relax.nn.attention", "relax.nn.attention_bias"), ("attention.",)),
    Spelling("attention", "softmax written out", HandSoftmaxAttention, _TOKENS,
             _op("relax.nn.attention", "relax.nn.attention_bias"), ("attention.", "softmax.")),
    Spelling("attention", "cosine (Swin v2)", CosineAttention, ("batch", WINDOW_TOKENS, WIDTH),
             _op("relax.nn.attention", "relax.nn.attention_bias"), ("attention.",)),
    # rotary embeddings
    Spelling("rope", "half rotation (Llama)", Rotary, _HEADS, _composite("rope"),
             ("byoc.rope",)),
    Spelling("rope", "interleaved (GPT-J)", InterleavedRotary, _HEADS,
             _composite("rope_interleaved"), ("byoc.rope",)),
    Spelling("rope", "partial (Phi)", PartialRotary, _HEADS, _composite("rope_partial"),
             ("byoc.rope",)),
    # gated MLPs
    # separate projections of one x are one packed projection once matmul.combine_parallel
    # joins them (the ONNX imports): the packed composite then takes the whole MLP
    Spelling("swiglu", "separate gate / up", GatedMLP, _TOKENS,
             _composite("swiglu", "swiglu_packed"), ("byoc.swiglu",)),
    Spelling("swiglu", "packed gate_up + chunk", PackedGatedMLP, _TOKENS,
             _composite("swiglu_packed"), ("byoc.swiglu",)),
    Spelling("geglu", "separate gate / up", GegluMLP, _TOKENS,
             _composite("geglu", "geglu_packed"), ("byoc.geglu",)),
    Spelling("geglu", "packed gate_up + chunk", PackedGegluMLP, _TOKENS,
             _composite("geglu_packed"), ("byoc.geglu",)),
)


def find_spelling(key: str) -> Spelling:
    """The row called ``key`` (``"layernorm/written out"``); ``KeyError`` lists the rows."""
    for spelling in SPELLINGS:
        if spelling.key == key:
            return spelling
    raise KeyError(f"no spelling {key!r}; rows: {', '.join(s.key for s in SPELLINGS)}")
