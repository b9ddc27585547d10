"""``layernorm.expand``: ``R.nn.layer_norm`` written out for training graphs.

``relax.transform.Gradient`` has no gradient for ``layer_norm`` in TVM 0.27; the rule
writes each norm out in the ONNX spelling, every op of which has one (a float16 norm in
float32 between casts, as the fused op computes it).
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm
from tvm import relax

from patternkit.dpl import DFPattern, is_op, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import dtype_of, type_of

from .examples import layer_norm_call
from .guards import LAYER_NORM_DTYPES


class LayerNormExpand(RewriteRule):
    """Write ``layer_norm`` out in ops that ``relax.transform.Gradient`` differentiates."""

    name = "layernorm.expand"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x, self.gamma, self.beta = wildcard(), wildcard(), wildcard()
        self.norm = is_op("nn.layer_norm")(self.x, self.gamma, self.beta)
        self.pattern: DFPattern = self.norm

    def check(self, match: RoleMatch) -> Any:
        """The dtype of ``x`` when it is float32 or float16 and its rank is known."""
        ty = type_of(match.x)
        if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
            return reject("x has an unknown rank: cannot tell which axes the norm "
                          "reduces", at=match.x)
        dtype = dtype_of(ty)
        if dtype not in LAYER_NORM_DTYPES:
            return reject(f"x has dtype {dtype}: layernorm.expand writes out "
                          f"{' and '.join(LAYER_NORM_DTYPES)} norms only", at=match.x)
        return dtype

    def rewrite(self, match: RoleMatch) -> Any:
        """The layer norm written out, computed in float32 as the fused op is and cast back."""
        dtype, attrs = match.plan, match.norm.attrs
        axes = [int(a) for a in attrs.axes]
        widen = dtype != "float32"  # compute in float32 as the fused op does

        def f32(value: Any) -> Any:
            return relax.op.astype(value, "float32") if widen else value

        h = f32(match.x)
        centered = relax.op.subtract(h, relax.op.mean(h, axes, keepdims=True))
        variance = relax.op.mean(relax.op.multiply(centered, centered), axes, keepdims=True)
        radicand = relax.op.add(variance, relax.const(float(attrs.epsilon), "float32"))
        y = relax.op.divide(centered, relax.op.sqrt(radicand))
        if bool(attrs.scale):
            y = relax.op.multiply(y, f32(match.gamma))
        if bool(attrs.center):
            y = relax.op.add(y, f32(match.beta))
        return relax.op.astype(y, dtype) if widen else y

    def example(self, **knobs: Any) -> tvm.IRModule:
        """One ``layer_norm`` call: :func:`~.examples.layer_norm_call` with ``knobs``."""
        return layer_norm_call(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Three dtypes (float64 refused), ranks, axes, symbolic shapes and an unknown rank."""
        return {"dtype": ("float32", "float16", "float64"), "rank": (3, 2, 4),
                "axes": (1, 2), "symbolic": (False, True), "known_rank": (True, False)}
