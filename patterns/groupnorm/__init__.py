"""Group norms: a written-out group norm collapsed to ``R.nn.group_norm``, and its composites.

Recognises

* :class:`GroupNormCollapse` (``groupnorm.collapse``, ``collapse.py``): ``reshape`` of
  ``x: (N, C, *spatial)`` to ``(N, G, K)``, a layer norm over the last axis with unit
  gamma and zero beta (what ``layernorm.collapse`` makes of a hand-written mean /
  variance, or ``F.layer_norm`` over the groups as the torch importer writes it) or an
  instance norm over it with the groups as channels (``nn.GroupNorm`` exported to ONNX:
  ``InstanceNormalization`` plus reshapes, as ``instancenorm.collapse`` leaves it),
  ``reshape`` back, ``* scale + shift`` per channel -> ``R.nn.group_norm``;
* :class:`GroupNormComposite` (``composite.py``): ``<compiler>.group_norm`` and
  ``<compiler>.group_norm_silu`` (the diffusion UNet / VAE resnet block's norm and
  activation).

Deliberately not covered: channels-last grouping, a written-out group norm without the
affine step, and an expand rule (``relax.transform.Gradient`` has no gradient for ``group_norm``).
"""

from .collapse import GroupNormCollapse as GroupNormCollapse
from .composite import GroupNormComposite as GroupNormComposite

__all__ = ["RULES", "COMPOSITES"]

#: The rewrite rules of this family.
RULES = (GroupNormCollapse,)

#: Pattern table entries of this family, most specific first: the plain entry would
#: otherwise take the norm of a ``group_norm_silu`` chain.
COMPOSITES = (GroupNormComposite(silu=True), GroupNormComposite)
