"""Softmax written out, collapsed into ``R.nn.softmax``.

Recognises (:class:`SoftmaxCollapse`, ``softmax.collapse``)::

    m = max(x, axis=[a], keepdims=True)
    e = exp(x - m)                      # one binding read twice, or computed twice
    y = e / sum(e, axis=[a], keepdims=True)

the numerically stable softmax as hand-written code spells it (a model's own attention
or loss written with ``max``, ``exp`` and ``sum``), with the max and the sum over the same
single axis (negative and non-negative spellings of the axis agree).  The torch importer
and ONNX exports deliver ``R.nn.softmax`` itself (torch's ONNX exporter writes a softmax
over a non-final axis as ``Transpose, Softmax, Transpose`` at opset 11 and as ``Softmax``
at 14: checked), so they need no collapse.  Produces
``R.nn.softmax(x, axis=a)``, whose legalisation subtracts the max too, so the result
agrees to rounding in float32 and float16.

The guards, each refusing with its reason: ``x`` has a known rank; the max and the sum
each reduce exactly one axis with ``keepdims=True`` (without it the result does not
broadcast back along that axis); the sum reduces the axis the max does (a max over
another axis does not cancel: that is not a softmax).  A match whose intermediate is
read elsewhere is not rewritten.

**The form without the max**, ``exp(x) / sum(exp(x))``, is mathematically the same
function but not numerically: it overflows where ``exp(x)`` does (``x > 88.7`` in
float32, ``x > 11.1`` in float16, well inside the range of attention logits) and gives
``inf / inf = NaN``, and it underflows to ``0 / 0`` for very negative rows, where
``R.nn.softmax`` gives the right answer.  Collapsing it therefore changes results exactly
where the model's own results are wrong, and agrees to rounding everywhere else.  That is
a change of behaviour a user must ask for: ``SoftmaxCollapse(shifted=False)``
(``softmax.collapse_unshifted``) does it, and it is **not** in
:data:`patternkit.patterns.LIBRARY`.

No expand rule: ``relax.transform.Gradient`` differentiates ``R.nn.softmax`` itself.
No composite: TVM's tables (tensorrt, openclml, coreml, example_npu) take the single op
``R.nn.softmax``, which this collapse produces.

Deliberately not covered: a max or a sum over several axes (a softmax over several axes
has no Relax op), ``e * (1 / sum(e))``, the max and the exponentials both computed twice,
``log_softmax`` (``x - max - log(sum(exp(x - max)))``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import tvm
from tvm import relax

from patternkit.dpl import DFPattern, is_op, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import type_of


def _single_axis(call: Any, ndim: int, what: str) -> int:
    """The one axis (non-negative) that the reduction ``call`` reduces, with keepdims."""
    axes = call.attrs.axis
    found = None if axes is None else [int(a) for a in axes]
    if found is None or len(found) != 1:
        raise reject(f"{what} reduces the axes {found}: a softmax normalises along one "
                     f"axis", at=call)
    if not bool(call.attrs.keepdims):
        raise reject(f"{what} over axis {found[0]} drops it (keepdims=False): the result "
                     f"does not broadcast back along that axis", at=call)
    return found[0] % ndim  # in range: the op's type inference refuses other axes


@dataclass(frozen=True)
class SoftmaxPlan:
    """The axis of ``x`` the softmax normalises, as the sum spells it."""

    axis: int


class SoftmaxCollapse(RewriteRule):
    """Collapse ``exp(x - max(x)) / sum(exp(x - max(x)))`` over one axis into ``softmax``.

    Parameters
    ----------
    shifted : bool
        ``True`` (``softmax.collapse``): the stable form, with the max subtracted.
        ``False`` (``softmax.collapse_unshifted``): ``exp(x) / sum(exp(x))``, which
        changes the results where the model overflows (see the module docstring); not in
        the library.
    """

    def __init__(self, shifted: bool = True, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.shifted = bool(shifted)
        self.name = "softmax.collapse" if self.shifted else "softmax.collapse_unshifted"
        self.x = wildcard()
        if self.shifted:
            self.max = is_op("max")(self.x)
            numerator, exps = (is_op("exp")(self.x - self.max) for _ in range(2))
        else:
            numerator, exps = (is_op("exp")(self.x) for _ in range(2))
        self.sum = is_op("sum")(exps)
        self.pattern: DFPattern = numerator / self.sum

    def check(self, match: RoleMatch) -> Any:
        """A :class:`SoftmaxPlan` when the max and the sum reduce the same single axis."""
        ty = type_of(match.x)
        if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
            return reject("x has an unknown rank: cannot tell which axis the sum reduces",
                          at=match.x)
        axis = _single_axis(match.sum, ty.ndim, "the sum")
        if self.shifted:
            max_axis = _single_axis(match.max, ty.ndim, "the max")
            if max_axis != axis:
                return reject(f"the max reduces axis {max_axis} but the sum axis {axis}: "
                              f"the shift does not cancel, so this is not a softmax",
                              at=match.max)
        return SoftmaxPlan(int(match.sum.attrs.axis[0]))

    def rewrite(self, match: RoleMatch) -> Any:
        """One ``nn.softmax`` of ``x`` over the plan's axis."""
        return relax.op.nn.softmax(match.x, axis=match.plan.axis)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A written-out softmax, shifted by the max or not as this variant expects:
        :func:`written_out` with ``knobs``.
        """
        return written_out(self.shifted, **knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes, ranks and axes, symbolic shapes; a max over another axis (refused) and
        the exponentials reused or computed twice.
        """
        return {"dtype": ("float32", "float16"), "rank": (3, 2, 4), "axis": (-1, 1, 0),
                "symbolic": (False, True), "max_axis": (None, 0), "exps": ("reused", "recomputed")}


#: The rewrite rules of this file (the unshifted variant is opt-in, see the docstring).
RULES = (SoftmaxCollapse,)


# -- examples (the rule's example(), the tests and `patternkit verify`) --------------------
def written_out(shifted: bool = True, dtype: str = "float32", rank: int = 3, axis: int = -1,
                symbolic: bool = False, max_axis: int | None = None,
                exps: str = "reused") -> tvm.IRModule:
    """A written-out softmax of ``x: (2, 5, 16)`` (rank 2: ``(4, 16)``) along ``axis``.

    Shifted by the max if ``shifted`` (the stable form).  ``symbolic`` makes the
    leading dims symbolic; ``exps="recomputed"`` computes ``exp(x - max)`` twice.  The
    rule must refuse ``max_axis`` other than ``axis``.
    """
    shape = {2: (4, 16), 3: (2, 5, 16), 4: (2, 3, 5, 16)}[rank]
    if symbolic:
        shape = (*(tvm.tirx.Var(n, "int64") for n in ("n", "s", "h")[:rank - 1]),
                 shape[-1])
    x = relax.Var("x", relax.TensorType(shape, dtype))
    max_axes = [axis if max_axis is None else max_axis] if shifted else None
    return softmax_graph(x, max_axes, [axis], exps=exps)


def softmax_graph(x: relax.Var, max_axes: Sequence[int] | None, sum_axes: Sequence[int],
                  keepdims: bool = True, exps: str = "reused") -> tvm.IRModule:
    """``main(x)``: ``exp(x - max(x)) / sum(exp(x - max(x)))`` written out, one binding per
    op, from the given parts (:func:`written_out` chooses them; a test may pass parts no
    knob makes, such as an ``x`` of unknown rank or a sum without ``keepdims``).

    ``max_axes=None`` leaves the shift out; ``keepdims`` is the sum's (the max keeps its
    dims); ``exps="recomputed"`` computes the exponentials twice.
    """
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if max_axes is not None:
                m = bb.emit(relax.op.max(x, list(max_axes), keepdims=True))
                shifted_x = bb.emit(relax.op.subtract(x, m))
            else:
                shifted_x = x
            e = bb.emit(relax.op.exp(shifted_x))
            s = bb.emit(relax.op.sum(e, list(sum_axes), keepdims=keepdims))
            if exps == "recomputed":
                e = bb.emit(relax.op.exp(shifted_x))
            out = bb.emit_output(relax.op.divide(e, s))
        bb.emit_func_output(out)
    return bb.get()
