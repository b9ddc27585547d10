"""The dynamo exporter's half-precision softplus, divided by its ``beta``: collapsed.

``torch.onnx.export(dynamo=True)`` writes a bfloat16 ``F.softplus(x)`` (in Mish, say) as
``Softplus`` between torch's threshold and a division by ``beta``, the ``beta`` a float32
constant cast to ``x``'s dtype (``CastLike``); TVM's importer writes ``Softplus`` in its
stable form, which ``softplus.collapse`` makes ``R.nn.softplus``, and leaves::

    beta = astype(const(1.0, "float32"), x.dtype)    # or the constant, folded
    y    = where(x > 20, x, nn.softplus(x) / beta)

The by-example ``softplus.collapse`` spellings cannot say "cast to ``x``'s dtype" (a traced
``astype`` keeps the dtype it was traced in), so :class:`SoftplusCastBetaCollapse`
(``softplus.collapse_cast_beta``) takes this form and gives ``R.nn.softplus(x)``.  Exact:
``R.nn.softplus`` thresholds at 20 itself (the ``where`` changes nothing), and dividing by
1 is no rounding.  Then the ``mish`` composite takes ``x * tanh(R.nn.softplus(x))``.

The guards, each refusing with its reason: the softplus is the default one (beta 1,
threshold 20), the cast ``beta`` is 1 and the threshold 20 (another beta or threshold is
another function).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, is_constant, is_op, through, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import const_value, from_expr

from .examples import SHAPES, example_input


class SoftplusCastBetaCollapse(RewriteRule):
    """Collapse ``where(x > 20, x, nn.softplus(x) / astype(1.0))`` into ``nn.softplus(x)``."""

    name = "softplus.collapse_cast_beta"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.threshold, self.beta = is_constant(), is_constant()
        self.softplus = is_op("nn.softplus")(self.x)
        # the beta as the exporter's CastLike of a float32 constant, or folded already
        self.divided = is_op("divide")(self.softplus, through(self.beta, ("astype",), depth=1))
        self.pattern: DFPattern = is_op("where")(is_op("greater")(self.x, self.threshold),
                                                 self.x, self.divided)

    def check(self, match: RoleMatch) -> Any:
        """Accept the default softplus divided by a cast 1, thresholded at 20."""
        attrs = match.softplus.attrs
        beta, threshold = float(attrs.beta), float(attrs.threshold)
        if (beta, threshold) != (1.0, 20.0):
            return reject(f"the softplus has beta {beta:g} and threshold {threshold:g}: only "
                          f"the default one (beta 1, threshold 20) is torch's softplus "
                          f"thresholded at 20", at=match.softplus)
        for role, wanted in (("beta", 1.0), ("threshold", 20.0)):
            value = np.asarray(const_value(match[role]), dtype="float64")
            if value.size != 1 or float(value.reshape(())) != wanted:
                shown = (f"{float(value.reshape(())):g}" if value.size == 1
                         else f"of shape {value.shape}")
                return reject(f"the {role} is {shown}, not {wanted:g}: another {role} is "
                              f"another function", at=match[role])
        return True

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.nn.softplus(x)``, which thresholds at 20 itself."""
        return relax.op.nn.softplus(match.x, beta=1.0, threshold=20.0)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """The dynamo exporter's form: :func:`softplus_cast_beta` with ``knobs``."""
        return softplus_cast_beta(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Three dtypes, shapes; another beta, threshold or softplus (refused)."""
        return {"dtype": ("bfloat16", "float16", "float32"), "shape": SHAPES,
                "cast": (True, False),
                "beta": (1.0, 2.0), "threshold": (20.0, 10.0), "softplus_beta": (1.0, 2.0)}


def softplus_cast_beta(dtype: str = "bfloat16", shape: str = "batch_seq", beta: float = 1.0,
                       threshold: float = 20.0, softplus_beta: float = 1.0,
                       cast: bool = True) -> tvm.IRModule:
    """``where(x > threshold, x, nn.softplus(x, softplus_beta) / astype(beta, dtype))``
    (``cast=False``: the ``beta`` a constant of ``dtype``, the cast folded).

    The dynamo exporter's bfloat16 softplus after ``softplus.collapse`` (``beta=1``,
    ``threshold=20``, ``softplus_beta=1``); other values are the edges the rule refuses.
    """
    x = example_input(dtype, shape)
    cast_beta = (relax.op.astype(relax.const(beta, "float32"), dtype) if cast
                 else relax.const(beta, dtype))
    softplus = relax.op.nn.softplus(x, beta=softplus_beta, threshold=20.0)
    return from_expr(relax.op.where(relax.op.greater(x, relax.const(threshold, dtype)), x,
                                    relax.op.divide(softplus, cast_beta)))
