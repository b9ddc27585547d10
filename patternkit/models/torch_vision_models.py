"""Vision zoo entries with the families issue 36 added: hard-swish, relu6, group and batch norms.

Four small image models, each built offline with seeded weights and imported with
``torch.export`` through :func:`patternkit.models.torch_models.build`:

* ``mobilenet``: a MobileNetV3-style net written here (depthwise convolutions, batch
  norms, squeeze-and-excite gates with ``nn.Hardsigmoid``, ``nn.Hardswish`` and
  ``nn.ReLU6`` activations), the hard activations' torch spellings in one model;
* ``unet_block``: a diffusion UNet's middle block written here in plain torch (no
  diffusers): ResNet blocks (GroupNorm, SiLU, 3x3 conv, a time embedding added), and a
  transformer block behind a GroupNorm (layer norms, self-attention, a packed GEGLU
  feed-forward);
* ``levit``: transformers' ``LevitModel``, whose ``MLPLayerWithBN`` is a Linear followed
  by a ``BatchNorm1d`` over the flattened tokens, with hard-swish activations;
* ``swinv2``: transformers' ``Swinv2Model``, whose window attention is cosine attention
  (normalised queries and keys, a learned per-head scale, a position bias from a small
  MLP through a sigmoid).

Batch norms' running statistics are calibrated on a seeded batch, as in ResNet's entry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transformers
from torch import nn

from .torch_models import CALIBRATION_IMAGES, PixelModel, TorchSource, build, construct_seeded
from .weights import calibrate_batchnorm
from .zoomodel import InputSpec, ZooError, ZooModel


# -- MobileNetV3-style --------------------------------------------------------------------------
class ConvNormActivation(nn.Sequential):
    """A bias-free convolution, its batch norm and an activation (``None``: none)."""

    def __init__(self, inputs: int, outputs: int, kernel: int, stride: int = 1,
                 groups: int = 1, activation: type[nn.Module] | None = nn.Hardswish):
        layers: list[nn.Module] = [
            nn.Conv2d(inputs, outputs, kernel, stride, kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(outputs)]
        if activation is not None:
            layers.append(activation())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    """MobileNetV3's channel gate: pool, reduce, ReLU, expand, hard-sigmoid, scale."""

    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.activation = nn.ReLU()
        self.expand = nn.Conv2d(reduced, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        """``x`` scaled per channel by its gate."""
        return x * self.gate(self.expand(self.activation(self.reduce(self.pool(x)))))


class InvertedResidual(nn.Module):
    """Expand (1x1), depthwise (k x k), optional squeeze-excite, project (1x1), residual."""

    def __init__(self, inputs: int, expanded: int, outputs: int, kernel: int, stride: int,
                 squeeze: bool, activation: type[nn.Module]):
        super().__init__()
        self.expand = ConvNormActivation(inputs, expanded, 1, activation=activation)
        self.depthwise = ConvNormActivation(expanded, expanded, kernel, stride, groups=expanded,
                                            activation=activation)
        self.squeeze = SqueezeExcite(expanded, max(8, expanded // 4)) if squeeze else None
        self.project = ConvNormActivation(expanded, outputs, 1, activation=None)
        self.residual = stride == 1 and inputs == outputs

    def forward(self, x):
        """The block's output, with the input added back when the shapes allow it."""
        h = self.depthwise(self.expand(x))
        if self.squeeze is not None:
            h = self.squeeze(h)
        h = self.project(h)
        return x + h if self.residual else h


class MobileNetV3Mini(nn.Module):
    """A MobileNetV3-small-like classifier: every block kind, one of each.

    The stem and the head use hard-swish; the blocks are (ReLU, squeeze-excite, stride 2),
    (ReLU6, stride 2) and (hard-swish, squeeze-excite, residual), so the model holds each
    of torch's hard activations and ``ReLU6``.
    """

    def __init__(self, width: int, classes: int):
        super().__init__()
        self.stem = ConvNormActivation(3, width, 3, 2)
        self.blocks = nn.Sequential(
            InvertedResidual(width, width, width, 3, 2, True, nn.ReLU),
            InvertedResidual(width, 4 * width, 24, 3, 2, False, nn.ReLU6),
            InvertedResidual(24, 72, 24, 5, 1, True, nn.Hardswish))
        self.head = ConvNormActivation(24, 6 * width, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(6 * width, 8 * width), nn.Hardswish(),
                                        nn.Linear(8 * width, classes))

    def forward(self, pixel_values):
        """Class logits for a batch of images."""
        h = self.pool(self.head(self.blocks(self.stem(pixel_values))))
        return self.classifier(torch.flatten(h, 1))


# -- diffusion UNet middle block ----------------------------------------------------------------
class ResnetBlock(nn.Module):
    """diffusers' ``ResnetBlock2D``: (GroupNorm, SiLU, conv) twice, the time embedding between."""

    def __init__(self, channels: int, groups: int, time_dim: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels, eps=1e-6)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.time_proj = nn.Linear(time_dim, channels)
        self.norm2 = nn.GroupNorm(groups, channels, eps=1e-6)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        # one module per use, so that counting modules counts the SiLUs
        self.activation1, self.time_activation, self.activation2 = (nn.SiLU() for _ in range(3))

    def forward(self, x, time):
        """``x`` plus the block's residual, the projected time embedding added in between."""
        h = self.conv1(self.activation1(self.norm1(x)))
        h = h + self.time_proj(self.time_activation(time))[:, :, None, None]
        h = self.conv2(self.activation2(self.norm2(h)))
        return x + h


class UNetSelfAttention(nn.Module):
    """Multi-head self-attention written out: ``softmax(q k^T * scale) v``."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(dim, dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x):
        """The attention's output projection for tokens ``x`` of shape (batch, n, dim)."""
        batch, tokens, dim = x.shape
        head_dim = dim // self.heads

        def split(t):
            return t.reshape(batch, tokens, self.heads, head_dim).transpose(1, 2)

        q, k, v = split(self.to_q(x)), split(self.to_k(x)), split(self.to_v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) * head_dim ** -0.5
        h = torch.matmul(scores.softmax(dim=-1), v)
        return self.to_out(h.transpose(1, 2).reshape(batch, tokens, dim))


class GEGLU(nn.Module):
    """diffusers' ``GEGLU``: one projection to twice the width, halves ``h * gelu(gate)``."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * inner)
        self.activation = nn.GELU()

    def forward(self, x):
        """The gated hidden state of width ``inner``."""
        h, gate = self.proj(x).chunk(2, dim=-1)
        return h * self.activation(gate)


class SpatialTransformer(nn.Module):
    """diffusers' ``Transformer2DModel`` with one self-attention block (no cross-attention)."""

    def __init__(self, channels: int, groups: int, heads: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.proj_in = nn.Linear(channels, channels)
        self.norm1 = nn.LayerNorm(channels)
        self.attention = UNetSelfAttention(channels, heads)
        self.norm2 = nn.LayerNorm(channels)
        self.feed_forward = nn.Sequential(GEGLU(channels, 4 * channels),
                                          nn.Linear(4 * channels, channels))
        self.proj_out = nn.Linear(channels, channels)

    def forward(self, x):
        """``x`` plus the transformer's output over its pixels as tokens."""
        batch, channels, height, width = x.shape
        h = self.norm(x).permute(0, 2, 3, 1).reshape(batch, height * width, channels)
        h = self.proj_in(h)
        h = h + self.attention(self.norm1(h))
        h = h + self.feed_forward(self.norm2(h))
        h = self.proj_out(h).reshape(batch, height, width, channels).permute(0, 3, 1, 2)
        return x + h


class UNetMidBlock(nn.Module):
    """diffusers' ``UNetMidBlock2DCrossAttn`` without the cross-attention: ResNet,
    transformer, ResNet.
    """

    def __init__(self, channels: int, groups: int, heads: int, time_dim: int):
        super().__init__()
        self.resnet_in = ResnetBlock(channels, groups, time_dim)
        self.transformer = SpatialTransformer(channels, groups, heads)
        self.resnet_out = ResnetBlock(channels, groups, time_dim)

    def forward(self, sample, time_embedding):
        """The block's output for latents ``sample`` and a per-image time embedding."""
        h = self.resnet_in(sample, time_embedding)
        return self.resnet_out(self.transformer(h), time_embedding)


# -- sources ---------------------------------------------------------------------------------
def _image_spec(options: dict[str, Any], channels: int = 3) -> InputSpec:
    image = options["image"]
    return InputSpec("pixel_values", "float32", ("batch", channels, image, image))


def _calibrated(module: nn.Module, spec: InputSpec, seed: int) -> nn.Module:
    batch = torch.from_numpy(spec.draw({"batch": CALIBRATION_IMAGES},
                                       np.random.default_rng(seed)))
    calibrate_batchnorm(module, (batch,))
    return module


def mobilenet_source(options: dict[str, Any]) -> TorchSource:
    """The MobileNetV3-style net (:class:`MobileNetV3Mini`) with calibrated batch norms."""
    module = construct_seeded(lambda: MobileNetV3Mini(options["width"], options["classes"]),
                               options["seed"])
    spec = _image_spec(options)
    return TorchSource(_calibrated(module, spec, options["seed"]), (spec,), {},
                       {"architecture": "MobileNetV3Mini"})


def unet_block_source(options: dict[str, Any]) -> TorchSource:
    """The diffusion UNet middle block (:class:`UNetMidBlock`) on latents and a time embedding."""
    if options["channels"] % options["groups"] or options["channels"] % options["heads"]:
        raise ZooError(f"unet_block: channels={options['channels']} is not a multiple of "
                       f"groups={options['groups']} and heads={options['heads']}")
    module = construct_seeded(lambda: UNetMidBlock(options["channels"], options["groups"],
                                                    options["heads"], options["time_dim"]),
                               options["seed"])
    image = options["image"]
    inputs = (InputSpec("sample", "float32", ("batch", options["channels"], image, image)),
              InputSpec("time_embedding", "float32", ("batch", options["time_dim"])))
    return TorchSource(module, inputs, {}, {"architecture": "UNetMidBlock"})


def levit_source(options: dict[str, Any]) -> TorchSource:
    """LeViT (``LevitModel``): conv stem, then stages of Linear + BatchNorm1d layers."""
    hidden, heads = options["hidden"], options["heads"]
    config = transformers.LevitConfig(
        image_size=options["image"], num_channels=3, kernel_size=3, stride=2, padding=1,
        patch_size=16, hidden_sizes=[hidden, hidden + 16], num_attention_heads=[heads, heads + 1],
        depths=[options["layers"], options["layers"]], key_dim=[8, 8], drop_path_rate=0,
        mlp_ratio=[2, 2], attention_ratio=[2, 2],
        down_ops=[["Subsample", 8, hidden // 8, 4, 2, 2]])
    module = construct_seeded(
        lambda: PixelModel(transformers.LevitModel(config), "last_hidden_state"), options["seed"])
    spec = _image_spec(options)
    return TorchSource(_calibrated(module, spec, options["seed"]), (spec,), {},
                       {"architecture": "LevitModel"})


def swinv2_source(options: dict[str, Any]) -> TorchSource:
    """Swin v2 (``Swinv2Model``, no pooler): two stages of shifted-window cosine attention."""
    config = transformers.Swinv2Config(
        image_size=options["image"], patch_size=options["patch"], num_channels=3,
        embed_dim=options["hidden"], depths=[options["layers"], options["layers"]],
        num_heads=[options["heads"], 2 * options["heads"]], window_size=options["window"],
        drop_path_rate=0.0)
    module = construct_seeded(lambda: PixelModel(
        transformers.Swinv2Model(config, add_pooling_layer=False), "last_hidden_state"),
        options["seed"])
    return TorchSource(module, (_image_spec(options),), {},
                       {"architecture": "Swinv2Model", "window": options["window"]})


# -- entry points named in the registry (patternkit.models.zoo.ZOO) ---------------------------
def mobilenet(spec) -> ZooModel:
    """The ``zoo:mobilenet`` model."""
    return build(spec, mobilenet_source(spec.as_dict()))


def unet_block(spec) -> ZooModel:
    """The ``zoo:unet_block`` model."""
    return build(spec, unet_block_source(spec.as_dict()))


def levit(spec) -> ZooModel:
    """The ``zoo:levit`` model."""
    return build(spec, levit_source(spec.as_dict()))


def swinv2(spec) -> ZooModel:
    """The ``zoo:swinv2`` model."""
    return build(spec, swinv2_source(spec.as_dict()))
