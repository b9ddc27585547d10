"""Quantised kernels in QDQ form, as composites for integer compilers.

ONNX QDQ models (onnxruntime's ``quantize_static``, the TensorRT and QNN toolchains)
keep the arithmetic in float between ``DequantizeLinear`` and ``QuantizeLinear``; TVM's
``from_onnx`` imports them as ``R.dequantize`` / ``R.quantize``.  A compiler with 8-bit
kernels takes the whole ``dequantize -> op -> [bias] [activation] -> quantize``.

Rewrites (:data:`RULES`, :mod:`.collapse`): ``dequantize.collapse``, ``(q.astype(float32)
- zp) * scale`` -> ``R.dequantize``, and ``quantize.collapse``, ``clip(round(x / scale) + zp,
qmin, qmax).astype(int8 | uint8)`` -> ``R.quantize``, per-tensor, bit-identical (quantisation
written by hand, e.g. in torch, so that the composites below see it).

Composites (:data:`COMPOSITES`, :mod:`.composite`): ``qdq_conv2d`` and ``qdq_matmul``
(:class:`~.composite.QdqComposite`), before the float conv and matmul composites of the
library, which would take the op alone.  Tested on :func:`patternkit.models.onnx_qdq.qdq_model`,
a conv + matmul net quantised offline by onnxruntime on seeded random calibration data:
one of each per model.

Deliberately not covered: per-channel quantisation written out (the axis would have to be
read off the scale's broadcast), 16-bit quantisation, and a QDQ ``add`` / ``concat`` /
pooling (no composite: integer backends take them as single ops).
"""

from __future__ import annotations

from .collapse import DequantizeCollapse, QuantizeCollapse
from .composite import QdqComposite

#: The rewrite rules of this family (before the composites, which read their ops).
RULES = (DequantizeCollapse, QuantizeCollapse)

#: The composites of this family, before the library's float conv and matmul composites.
COMPOSITES = (QdqComposite(op="conv2d"), QdqComposite(op="matmul"))
