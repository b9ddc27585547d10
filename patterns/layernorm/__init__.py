"""Layer normalisation written out, collapsed into ``R.nn.layer_norm``; its composites.

Recognises (:class:`LayerNormCollapse`, ``layernorm.collapse``)::

    mean = mean(x, axes, keepdims=True)          # axes: the last k axes of x, any k
    d    = x - mean                              # one binding read twice, or computed twice
    var  = mean(d ** 2, axes, keepdims=True)     # power(d, 2) | d * d | square(d),
                                                 # or variance(x, axes, keepdims=True)
                                                 # or either with keepdims=False, then a
                                                 # reshape to the mean's shape
    y    = d / sqrt(var + eps)                   # or d * rsqrt(var + eps), d * (1 / sqrt(..))
    y    = y * gamma                             # optional
    y    = y + beta                              # optional

which is what ONNX exports below opset 17 (``ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt,
Div, Mul, Add``), hand-written torch modules, and TVM's own
``relax.transform.DecomposeOpsForTraining`` (the ``variance`` form) produce.  The
multiplies match with their operands either way round, and ``gamma * d / sqrt(...)``
(the association batch norms are written with) matches too.  Spellings that differ only
by bookkeeping match as one: ``mean(x)`` computed twice (the TorchScript exporter), its
axes spelled positive in one and negative in the other, and the variance taken with
``keepdims=False`` plus a reshape (the dynamo exporter); the check proves the two means
reduce the same axes and the reshape restores the mean's shape.

Produces ``R.nn.layer_norm(x, gamma, beta, axes=[-k, ..., -1], epsilon=eps)``.  An
absent ``gamma`` / ``beta`` becomes ``R.ones`` / ``R.zeros`` of the normalised shape
(TVM's legalisation reads the two arguments and ignores the ``center`` / ``scale``
flags), a ``gamma`` with extra leading unit dims is reshaped to the normalised shape.

The guards, each refusing with its reason in the rewrite log: ``x`` has a known shape
and dtype float32, float16 or bfloat16 (TVM's ``layer_norm`` has kernels for the first
two only: a bfloat16 norm becomes ``astype(layer_norm(astype(x, float32), ...), bfloat16)``,
the float32 norm rounded once, and the rule logs at INFO which norm runs in float32); both
means reduce the same trailing axes with ``keepdims=True``; ``eps`` is a scalar
constant; ``gamma`` and ``beta`` are per-feature, their shape *is* the normalised dims
(after leading ones), compared symbolically where dims are symbolic (a comparison that
cannot be decided refuses).  A match whose intermediate is read elsewhere is not
rewritten (the engine's rule).  A scalar or full-tensor ``gamma`` / ``beta`` stays
outside: the bare norm underneath still collapses.

Numerics: the fused op computes the same mean and variance (two-pass, float32
accumulation for float16 inputs), so float32 models agree to rounding.  float16 models
agree within float16 rounding; the fused op is the more accurate of the two, because the
written-out float16 graph accumulates its means in float16.  bfloat16 models agree
within a bfloat16 ulp or two of outputs below 4, for the same reason.

:class:`LayerNormComposite` gives the external-compiler entries named as TVM's tables
name them: ``<compiler>.layer_norm`` (TVM's cutlass ``layer_norm`` check: one axis, the
last, with ``center`` and ``scale``) and, with ``skip=True``, ``<compiler>.add_layer_norm``
(a residual ``add`` of two tensors of one shape, then the norm: onnxruntime's
SkipLayerNormalization).  Where the sum is also read by the next residual, as in pre-norm
transformers, the skip composite is left alone and the norm alone is taken.

:class:`LayerNormExpand` (``layernorm.expand``, in :data:`patternkit.patterns.EXPANSIONS`)
writes ``R.nn.layer_norm`` out for training graphs: ``relax.transform.Gradient`` has no
gradient for it in TVM 0.27.  ``relax.transform.DecomposeOpsForTraining`` writes it out
too, but all at once with every other op it decomposes (batch norm in training mode
among them); the rule writes out layer norms only, in the ONNX spelling (``mean``,
``subtract``, ``multiply``, ``mean``, ``add``, ``sqrt``, ``divide``, then gamma and
beta), every op of which has a gradient, and which ``layernorm.collapse`` undoes in
float32.  A float16 norm is expanded in float32 between casts, as the fused op computes
it, so the expansion keeps the fused op's accuracy.

A float16 norm whose statistics run wider is collapsed too: the variance taken in float32
between casts (the dynamo exporter's ``var`` over several axes: ``x`` cast to float32,
centred, squared, averaged, cast back) and the whole normalisation run in float32 or
float64 between casts of ``x - mean`` (the TorchScript exporter's float16 ``LayerNorm``
below opset 17, in float64).  The fused op accumulates float16 statistics in float32 and
rounds once, so the result stays within float16 rounding of the written-out form; the
rule logs, at INFO on its module's logger, the cast's binding and the precision.  A
float32 norm widened to float64 is refused with the dtypes named (the fused op would
compute in float32).

Deliberately not covered: a layer norm computed in float32 between casts of the whole
float16 ``x`` (both means and the numerator: none of the exporters writes it),
non-trailing axes (group and instance norms), ``x + (-mean)``, an
unbiased (Bessel-corrected) variance, and float64 models (no ``layer_norm`` kernel in
TVM 0.27).
"""

from .collapse import LayerNormCollapse
from .composite import LayerNormComposite
from .expand import LayerNormExpand

__all__ = ["RULES", "EXPANSIONS", "COMPOSITES"]

#: The rewrite rules of this family.
RULES = (LayerNormCollapse,)

#: Expand rules, for :data:`patternkit.patterns.EXPANSIONS` (never with the collapse).
EXPANSIONS = (LayerNormExpand,)

#: Pattern-table entries, the residual form first (a table's earlier entries win).
COMPOSITES = (LayerNormComposite(skip=True), LayerNormComposite())
