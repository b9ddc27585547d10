"""Matrix multiplications for external compilers: ``matmul [+ bias] [-> activation]`` composites
named as TVM's backend tables name them.

Recognises (:class:`MatmulComposite`, one variant per constructor arguments)

* ``matmul(x, w)``, or ``matmul(x, permute_dims(w))`` (``transposed=True``: a weight
  stored ``(out, in)``, as ``nn.Linear`` keeps it and the torch importer emits it);
* then, with ``bias=True``, ``add`` of a per-feature bias: a tensor that varies along the
  output's last axis only (``(N,)``, ``(1, N)``, ``(1, 1, N)``), in either operand order
  (the torch importer writes ``add(bias, matmul(...))``);
* then, with ``activation`` one of ``relu``, ``gelu``, ``gelu_tanh``, ``silu``, that
  activation, applied to the result or to a ``reshape`` of it: the torch importer runs an
  ``nn.Linear`` on a 3-D input as ``reshape`` to 2-D, matmul, add, ``reshape`` back, and
  the activation follows the last ``reshape`` (BERT's ``intermediate``, GPT-2's MLP, a
  Llama MLP's gate).  An elementwise activation commutes with a reshape, so the
  composite computes the same values either way.

Names are TVM's (``python/tvm/relax/backend/cuda/cutlass.py`` and ``cublas.py``):
``"<compiler>.matmul"``, then ``"_transposed"``, ``"_bias"`` and ``"_<activation>"`` for
the parts present: ``matmul_bias_relu``, ``matmul_transposed_bias_gelu``, ... .  cutlass and
cublas ship the ``relu`` and ``gelu`` variants with a bias; the ``gelu_tanh`` and ``silu``
ones, and activations without a bias (a Llama MLP has none), are named by the same rule
(TVM's ``_get_activation_from_name`` already parses ``_gelu_tanh`` and ``_silu``).  Each
part is named by one fixed piece in a fixed order, so distinct variants get distinct
names.  :func:`matmul_table` lists every variant, most specific first: the order a
pattern table needs, since a plain ``matmul`` entry would otherwise take the matmul of a
``matmul_bias_relu`` chain (and an untransposed one the matmul of a transposed chain).

The check refuses what a backend's epilogue would compute differently: a ``permute_dims``
that is not a transpose of the weight's last two axes, and an added tensor that is not a
per-feature bias (a full tensor, one that varies along another axis, a single value).  It
runs after the activation collapses of ``patternkit.patterns.activation``, which turn the
written-out GELU / SiLU into the ``nn`` ops matched here.

Deliberately not covered: residual ``add`` / ``multiply`` after the activation (cutlass's
``*_residual_*`` entries), quantised and dequantised weights (``decode_matmul``), a bias
reshaped inside the composite, and ``reshape`` between the matmul and the bias add.

Parallel matmuls that share their left operand are combined into one matmul and a split
(a rewrite rule, not a composite):

Recognises N >= 2 ``R.matmul(x, w_i)`` bindings of one block that read the same ``x`` as
their left operand (a q/k/v projection, the gates of an LSTM cell), each ``w_i`` a
constant or a parameter of the function or the ``permute_dims`` of one (the torch
importer's ``nn.Linear``), rank 2, shaped ``(K, N_i)`` with a static
width ``N_i``.

:class:`CombineParallelMatmul` (``matmul.combine_parallel``) produces
``R.matmul(x, W)`` on the weights concatenated along their last axis (folded into one
constant when every ``w_i`` is a constant, an ``R.concat`` of the ``w_i`` otherwise) and
an ``R.split`` of the result along its last axis; each matched binding becomes its part
of the split.
When every branch is read only by an ``R.add`` of a rank-1 bias ``b_i`` of shape
``(N_i,)`` (constant or parameter), the adds are folded along: one add of the
concatenated biases before the split, and each add binding becomes its part.

Guards, each a reason in the log:

* branches of different weight dtypes or ``out_dtype`` are never combined together
  (TVM's own ``CombineParallelMatmul`` once produced a matmul of the wrong dtype there);
  the largest group that agrees with the first branch is combined, and the others are
  left for a later round;
* a rank-1 operand (``x`` or ``w_i``), a weight that is computed in the function, or a
  weight without a static shape or width is not combined;
* a branch whose result is also read elsewhere than by its bias add keeps all the bias
  adds unfolded (the raw matmul result is needed), the matmuls are still combined.

The torch importer reshapes the shared input once per ``nn.Linear``, so the matmuls read
equal values through different Vars: ``CombineParallelMatmul(reshaped=True)``
(``matmul.combine_parallel_reshaped``) takes N >= 2 ``R.matmul(reshape(x, s), w_i)``
whose reshapes of one ``x`` are all to one shape ``s`` and each read by its matmul alone
(as its left operand), with the weight guards above, and reshapes ``x`` once for the
combined matmul; a reshape to another shape, or read by anything else, is named in the
log and left alone.  It is not in the library: on a torch-imported Llama it would combine
the MLP's gate and up projections too, and the ``swiglu`` composites (2 of 2) would be
lost to ``matmul_transposed`` ones; pass it to :func:`patternkit.rewrite` where no gated
MLP composite is wanted (a BERT's q/k/v).

The rule claims no speed-up on every target: one wide matmul usually beats N narrow
ones on CPU and GPU, and the split is a view after legalisation only where the backend
makes it one.  It builds on :class:`patternkit.engine.BindingsRewriteRule`: a
``PatternContext`` whose ``x.used_by_all(matmul, 0, at_least=2)`` takes every matmul
reading ``x`` at once.

An inference batch norm over a matmul's features (``BatchNorm1d`` after ``nn.Linear``,
LeViT's ``LinearNorm``) is folded into the matmul's constant weight and bias by
:class:`BatchnormFoldIntoMatmul` (``matmul.fold_batchnorm``, in ``fold.py``), as
``conv.fold_batchnorm`` folds one into a conv: the composites above then take the
matmul and its bias.
"""

# The family's rule classes and constants are imported from here (tests, users): re-exported.
from .combine import CombineParallelMatmul
from .composite import ACTIVATIONS as ACTIVATIONS, MatmulComposite as MatmulComposite, matmul_table
from .fold import BatchnormFoldIntoMatmul as BatchnormFoldIntoMatmul

__all__ = ["RULES", "COMPOSITES"]

#: The rewrite rules of this family.
RULES = (BatchnormFoldIntoMatmul, CombineParallelMatmul)

#: Pattern table entries of this family, in priority order (see :func:`matmul_table`).
COMPOSITES = tuple(matmul_table())
