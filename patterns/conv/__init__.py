"""Convolutions for external compilers: ``conv2d -> [bias add] -> [relu | silu | clip]``
composites, and the batch-norm folding that has to run first.

Recognises

* :func:`conv2d_add_relu` / :class:`ConvAddReluComposite`: ``nn.conv2d`` followed by an
  optional ``add`` and an optional ``nn.relu``, Relay's ``make_conv_add_relu_pattern``.
  The composite's ``PartitionedFromPattern`` is ``"nn.conv2d_add_nn.relu_"``,
  ``"nn.conv2d_add_"``, ``"nn.conv2d_nn.relu_"`` or ``"nn.conv2d_"``.  The bias may be a
  constant or a variable shaped as real frontends produce it: ``(1, C, 1, 1)`` (torch's
  ``reshape`` of the conv bias, folded or not, and ``FoldBatchnormToConv2D``),
  ``(C, 1, 1)`` (Relay's ``prerequisite_optimize``), or ``(C,)`` for ``NHWC`` outputs.
  :class:`ConvAddReluComposite` checks that the added tensor really is a per-channel
  bias (one non-unit dimension, on the output's channel axis); the Relay-faithful
  :func:`conv2d_add_relu` pattern, like Relay's, accepts any added tensor.
  With ``activation="silu"`` or ``"clip"`` the activation is ``nn.silu`` (the torch
  importer's ``x * sigmoid(x)`` once ``silu.collapse`` has run; cutlass's
  ``conv2d_bias_silu``) or ``clip`` with constant bounds (``nn.ReLU6`` imports as
  ``clip(x, 0, 6)``; the CLML table's ``clip`` convolutions) instead of relu, named
  ``conv2d_add_silu``, ``conv2d_add_clip_strict`` and so on.  The library holds them with
  the activation required, ahead of the relu composite: an entry whose activation is
  optional would also take a conv + add that no activation follows, under a name that
  says there is one.
* :class:`BatchnormFoldIntoConv`: ``conv2d(x, W) [+ b] -> batch_norm(...)[0]`` with ``W``,
  ``b`` and the four batch-norm parameters constant and ``training=False``, rewritten to
  ``conv2d(x, W * s) + ((b - mean) * s + beta)`` with ``s = gamma / sqrt(var + eps)``:
  what Relay's ``prerequisite_optimize`` (SimplifyInference + FoldScaleAxis) did before
  ``MergeComposite``.  Unlike TVM's ``FoldBatchnormToConv2D`` it accepts the conv bias
  that the torch importer places between the conv and the batch norm (a constant, or a
  ``reshape`` of one), checks ``training`` and that the bias broadcasts along the
  output's channel axis (a ``(C,)`` bias on an ``NCHW`` output whose width happens to be
  ``C`` varies along ``W``, and is refused), and folds the constants itself (no
  ``FoldConstant`` needed).

The fold also takes ``conv1d`` (``OIW`` kernels) and an ungrouped ``conv2d_transpose``
(``IOHW`` kernels).

Deliberately not covered: 3-D convolutions, a grouped ``conv2d_transpose`` for the fold,
other kernel layouts for the fold (``OIHW``, ``OIW``, ``IOHW`` only), non-constant
weights or batch-norm parameters (bind them with ``relax.transform.BindParams`` first),
activations other than relu, silu and clip, and batch norms in training mode (they
normalise with batch statistics, so folding would change the numbers).
"""

# The family's rule classes and Relay's pattern are imported from here (tests, users): re-exported.
from .composite import (
    ConvAddReluComposite as ConvAddReluComposite,
    Presence as Presence,
    conv2d_add_relu as conv2d_add_relu,
)
from .fold import BatchnormFoldIntoConv

__all__ = ["RULES", "COMPOSITES"]

#: The rewrite rules of this family (composite rules are table entries, not rewrites).
RULES = (BatchnormFoldIntoConv,)

#: Pattern table entries of this family, for ``PatternTable`` / ``MergeComposite``, in
#: priority order: the silu and clip variants (activation required) before the relu
#: composite, whose optional relu would otherwise take their conv + add.
COMPOSITES = (ConvAddReluComposite(activation="silu", relu=Presence.REQUIRED),
              ConvAddReluComposite(activation="clip", relu=Presence.REQUIRED),
              ConvAddReluComposite)
