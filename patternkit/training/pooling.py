"""``adaptive_avg_pool2d`` written out for ``relax.transform.Gradient``, where it is a plain pool.

TVM 0.27 registers no gradient for ``R.nn.adaptive_avg_pool2d``, the head of every
ResNet-style classifier (``AdaptiveAvgPool2d((1, 1))`` before the linear layer), so a conv
net ending in one cannot be differentiated.  Two spellings have gradients and compute the
same numbers:

* an output of 1x1 is the ``mean`` over the two spatial axes with ``keepdims`` (any input
  size, symbolic ones included);
* an output that divides the input (``H = kh * oh`` and ``W = kw * ow``) is an
  ``avg_pool2d`` with ``pool_size = strides = (kh, kw)`` and no padding: TVM's adaptive
  pool averages bin ``i`` over ``[floor(i * H / oh), ceil((i + 1) * H / oh))``, exactly
  ``[i * kh, (i + 1) * kh)`` when ``oh`` divides ``H``.

Both read the call's ``layout`` for the spatial axes (``NCHW``, ``NHWC``, any order of the
four letters).  An output that does not divide the input has overlapping bins of unequal
sizes that no single pool computes: the rule refuses it with that reason, and
:func:`~patternkit.training.gradient` quotes the reason with the binding.  So are a packed
layout (``NCHW16c``), an ``out_layout`` other than the ``layout`` (TVM 0.27 does not
build one for llvm, so a written-out form could not be checked against it) and spatial
sizes unknown where the pool needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm import relax

from ..dpl.pattern import is_op, wildcard
from ..engine import RewriteRule, RoleMatch, reject
from ..ir import static_shape, type_of


@dataclass(frozen=True)
class PoolPlan:
    """How to write the pool out: ``kernel=None`` for the mean, else the pool's window.

    Attributes
    ----------
    axes : tuple of int
        The spatial axes (H, W) in the input's layout.
    kernel : tuple of int or None
        ``(kh, kw)`` of the ``avg_pool2d``; ``None``: the output is 1x1, a ``mean``.
    layout : str
        The call's layout (its ``out_layout`` too).
    """

    axes: tuple[int, int]
    kernel: tuple[int, int] | None
    layout: str


class AdaptiveAvgPoolExpand(RewriteRule):
    """``adaptive_avg_pool2d`` as a ``mean`` (output 1x1) or an ``avg_pool2d`` (output divides)."""

    name = "training.adaptive_avg_pool2d"

    def __init__(self) -> None:
        super().__init__()
        self.x = wildcard()
        self.pattern = is_op("nn.adaptive_avg_pool2d")(self.x)

    def check(self, match: RoleMatch) -> Any:
        """The plan, or why no single pool computes the call's bins."""
        call = match.root
        layout, out_layout = str(call.attrs.layout), str(call.attrs.out_layout)
        if sorted(layout) != sorted("NCHW"):
            return reject(f"layout {layout}: only the four-letter layouts (NCHW, NHWC, ...) "
                          f"are written out", at=call)
        if out_layout != layout:
            return reject(f"out_layout {out_layout} differs from layout {layout}: TVM 0.27 "
                          f"builds no such pool for llvm to check a written-out form "
                          f"against", at=call)
        axes = (layout.index("H"), layout.index("W"))
        shape = static_shape(type_of(match.x))
        if shape is None or len(shape) != 4:
            return reject("the input has no known rank-4 shape", at=call)
        spatial = tuple(shape[axis] for axis in axes)
        output = call.attrs.output_size
        if output is None:  # the output keeps the input's size: a pool of 1x1 windows
            size: tuple[Any, ...] = spatial
        else:
            size = tuple(int(d) for d in output)
            size = size * 2 if len(size) == 1 else size
        if all(isinstance(d, int) and d == 1 for d in size):
            return PoolPlan(axes, None, layout)
        if not all(isinstance(d, int) for d in spatial):
            return reject(f"the input's spatial size {_text(spatial)} is not static: the "
                          f"pool's window for an output of {_text(size)} is unknown", at=call)
        if output is None:
            return PoolPlan(axes, (1, 1), layout)
        if any(d <= 0 or s % d for s, d in zip(spatial, size)):
            return reject(f"the output size {_text(size)} does not divide the input's "
                          f"{_text(spatial)}: the adaptive bins overlap and differ in size, "
                          f"which no avg_pool2d computes", at=call)
        return PoolPlan(axes, (spatial[0] // size[0], spatial[1] // size[1]), layout)

    def rewrite(self, match: RoleMatch) -> Any:
        """The mean over the spatial axes, or the pool of the plan's window."""
        plan: PoolPlan = match.plan
        if plan.kernel is not None:
            return relax.op.nn.avg_pool2d(match.x, plan.kernel, plan.kernel, 0,
                                          layout=plan.layout)
        return relax.op.mean(match.x, axis=list(plan.axes), keepdims=True)


def _text(dims: Any) -> str:
    """``8x8``: a spatial size as the refusals quote it."""
    return "x".join(str(d) for d in dims)


#: The training module's own expansions, applied after the user's (or the library's).
TRAINING_EXPANSIONS = (AdaptiveAvgPoolExpand(),)
