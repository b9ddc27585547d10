"""Quantised kernels in QDQ form, as composites for integer compilers.

ONNX QDQ models (onnxruntime's ``quantize_static``, the TensorRT and QNN toolchains)
keep the arithmetic in float between ``DequantizeLinear`` and ``QuantizeLinear``; TVM's
``from_onnx`` imports them as ``R.dequantize`` / ``R.quantize``.  A compiler with 8-bit
kernels takes the whole ``dequantize -> op -> [bias] [activation] -> quantize``.

Composites (:data:`COMPOSITES`, :mod:`.composite`): ``qdq_conv2d`` and ``qdq_matmul``
(:class:`~.composite.QdqComposite`), before the float conv and matmul composites of the
library, which would take the op alone.  Tested on :func:`patternkit.models.onnx_qdq.qdq_model`,
a conv + matmul net quantised offline by onnxruntime on seeded random calibration data:
one of each per model.

Deliberately not covered: the written-out quantisation ``(q.astype(f) - zp) * scale`` and
``clip(round(x / scale) + zp, qmin, qmax).astype(int8)`` (no rule yet: onnxruntime's
models and TVM's importers write ``R.dequantize`` / ``R.quantize`` themselves), 16-bit
quantisation, and a QDQ ``add`` / ``concat`` / pooling (no composite: integer backends take
them as single ops).
"""

from __future__ import annotations

from .composite import QdqComposite

#: No rewrite rules yet (see the docstring).
RULES: tuple = ()

#: The composites of this family, before the library's float conv and matmul composites.
COMPOSITES = (QdqComposite(op="conv2d"), QdqComposite(op="matmul"))
