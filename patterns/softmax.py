"""Softmax and log-softmax written out, collapsed into ``R.nn.softmax`` / ``R.nn.log_softmax``.

Recognises (:class:`SoftmaxCollapse`, ``softmax.collapse``)::

    m = max(x, axis=[a], keepdims=True) # or torch's x.max(a, keepdim=True).values
    e = exp(x - m)                      # one binding read twice, or computed twice
    y = e / sum(e, axis=[a], keepdims=True)

the numerically stable softmax as hand-written code spells it (a model's own attention
or loss written with ``max``, ``exp`` and ``sum``), with the max and the sum over the same
single axis (negative and non-negative spellings of the axis agree).  The max is
``R.max`` (both ONNX exporters' ``ReduceMax``) or, for torch's ``x.max(a,
keepdim=True).values``, the torch importer's ``topk(x, k=1, axis=a)[0]`` (repacked with
the indices into a tuple and read back).  ``x.amax(a)`` and ``torch.logsumexp`` do not
reach Relax at all: TVM 0.27's torch importer has no converter for ``amax`` (checked).
Shifted by the max, the result is exact for every finite input: logits of 1e4 give the
softmax, where ``exp(x)`` alone overflows to ``inf`` (the tests check it).  The torch importer
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

**Log-softmax** (:class:`LogSoftmaxCollapse`, ``log_softmax.collapse``): ``(x - m) -
log(sum(exp(x - m)))`` (torch, and both ONNX exporters, which write ``x - m`` once) and
``x - (log(sum(exp(x - m))) + m)``, ``x - logsumexp(x)`` (``from_onnx`` of
``ReduceLogSumExp``; the add in either order), ``m`` as above, with the same guards ->
``R.nn.log_softmax(x, axis=a)``.  The first is what the op legalises to (bit-identical);
the second rounds ``x - (lse + m)`` instead of ``(x - m) - lse``: an ulp of ``|x|``.
``log(softmax(x))`` is the same function where the softmax does not underflow, and
``-inf`` where it does (``x - max < -103`` in float32, ``< -17`` in float16: a masked
logit), where ``R.nn.log_softmax`` is finite; like the unshifted softmax, collapsing it is
a change a user asks for: ``LogSoftmaxCollapse(form="log_of_softmax")``
(``log_softmax.collapse_log_of_softmax``), not in the library.

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
the unshifted ``x - log(sum(exp(x)))`` (it overflows where the op does not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import tvm
from tvm import relax

from patternkit.dpl import DFPattern, alt, is_op, is_tuple, is_tuple_get_item, wildcard
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


def max_along_one_axis(x: DFPattern) -> tuple[DFPattern, DFPattern, DFPattern]:
    """The pattern of ``x``'s max along one axis, and the role patterns of its two calls
    (``R.max``, ``topk``), of which a match has one.

    Hand-written code and both ONNX exporters (``ReduceMax``) give ``R.max(x, [a],
    keepdims=True)``; torch's ``x.max(a, keepdim=True).values`` reaches Relax as the torch
    importer's ``topk(x, k=1, axis=a)[0]``, which it repacks into a tuple with the indices
    and reads back (``t = (topk[0], topk[1]); t[0]``).  The tag ``max_form`` says which.
    """
    reduction, topk = is_op("max")(x), is_op("topk")(x)
    values, indices = is_tuple_get_item(topk, 0), is_tuple_get_item(topk, 1)
    return alt(tag="max_form", reduce=reduction,
               topk=values | is_tuple_get_item(is_tuple([values, indices]), 0)), reduction, topk


def checked_max_axis(match: RoleMatch, ndim: int) -> int:
    """The one axis (non-negative) along which the match's ``max`` (or ``topk``) takes the
    max; refuses a ``topk`` that is not the max (``k > 1``, or the smallest values).
    """
    if "max" in match:
        return _single_axis(match.max, ndim, "the max")
    call = match.topk
    if int(call.attrs.k) != 1 or not bool(call.attrs.largest):
        raise reject(f"the topk takes the {int(call.attrs.k)} "
                     f"{'largest' if bool(call.attrs.largest) else 'smallest'} values: only "
                     f"the single largest one is the max that a softmax subtracts", at=call)
    return int(call.attrs.axis) % ndim


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
            maximum, self.max, self.topk = max_along_one_axis(self.x)
            numerator, exps = (is_op("exp")(self.x - maximum) for _ in range(2))
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
            max_axis = checked_max_axis(match, ty.ndim)
            if max_axis != axis:
                return reject(f"the max reduces axis {max_axis} but the sum axis {axis}: "
                              f"the shift does not cancel, so this is not a softmax",
                              at=match.max if "max" in match else match.topk)
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
                "symbolic": (False, True), "max_axis": (None, 0), "exps": ("reused", "recomputed"),
                "max_form": ("reduce", "topk")}


class LogSoftmaxCollapse(RewriteRule):
    """Collapse ``x - max(x) - log(sum(exp(x - max(x))))`` over one axis into ``log_softmax``.

    Parameters
    ----------
    form : str
        ``"shifted"`` (``log_softmax.collapse``): ``(x - m) - log(sum(exp(x - m)))`` and
        ``x - (log(sum(exp(x - m))) + m)`` (``x - logsumexp(x)``), ``m`` the max.
        ``"log_of_softmax"`` (``log_softmax.collapse_log_of_softmax``): ``log(softmax(x))``,
        which gives ``-inf`` where the softmax underflows and the op does not (see the
        module docstring); not in the library.
    """

    def __init__(self, form: str = "shifted", rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        if form not in ("shifted", "log_of_softmax"):
            raise ValueError(f"LogSoftmaxCollapse(form={form!r}): expected 'shifted' or "
                             f"'log_of_softmax'")
        self.form = form
        self.name = ("log_softmax.collapse" if form == "shifted"
                     else "log_softmax.collapse_log_of_softmax")
        self.x = wildcard()
        if form == "log_of_softmax":
            self.softmax = is_op("nn.softmax")(self.x)
            self.pattern: DFPattern = is_op("log")(self.softmax)
            return
        maximum, self.max, self.topk = max_along_one_axis(self.x)
        self.sum = is_op("sum")(is_op("exp")(self.x - maximum))
        log_sum = is_op("log")(self.sum)
        self.pattern = alt(tag="spelling", shifted=(self.x - maximum) - log_sum,
                           logsumexp=self.x - alt(log_sum + maximum, maximum + log_sum,
                                                  tag="lse_order"))

    def check(self, match: RoleMatch) -> Any:
        """A :class:`SoftmaxPlan` when the max and the sum reduce the same single axis."""
        if self.form == "log_of_softmax":
            return SoftmaxPlan(int(match.softmax.attrs.axis))
        ty = type_of(match.x)
        if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
            return reject("x has an unknown rank: cannot tell which axis the sum reduces",
                          at=match.x)
        axis = _single_axis(match.sum, ty.ndim, "the sum")
        max_axis = checked_max_axis(match, ty.ndim)
        if max_axis != axis:
            return reject(f"the max reduces axis {max_axis} but the sum axis {axis}: the "
                          f"shift does not cancel, so this is not a log-softmax",
                          at=match.max if "max" in match else match.topk)
        return SoftmaxPlan(int(match.sum.attrs.axis[0]))

    def rewrite(self, match: RoleMatch) -> Any:
        """One ``nn.log_softmax`` of ``x`` over the plan's axis."""
        return relax.op.nn.log_softmax(match.x, axis=match.plan.axis)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A written-out log-softmax in this variant's form: :func:`log_softmax_written_out`."""
        if self.form == "log_of_softmax":
            knobs["spelling"] = "log_of_softmax"
        return log_softmax_written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Dtypes, ranks, axes, symbolic shapes, the spellings and the max's forms; a max
        over another axis (refused).
        """
        if self.form == "log_of_softmax":
            return {"dtype": ("float32", "float16"), "rank": (3, 2), "axis": (-1, 1),
                    "symbolic": (False, True)}
        return {"dtype": ("float32", "float16"), "rank": (3, 2, 4), "axis": (-1, 1, 0),
                "symbolic": (False, True), "spelling": ("shifted", "logsumexp", "max_first"),
                "max_form": ("reduce", "topk"), "max_axis": (None, 0)}


#: The rewrite rules of this file (the unshifted softmax and the log of a softmax are opt-in,
#: see the docstring).
RULES = (SoftmaxCollapse, LogSoftmaxCollapse)


# -- examples (the rule's example(), the tests and `patternkit verify`) --------------------
def _example_input(dtype: str, rank: int, symbolic: bool) -> relax.Var:
    """``x: (2, 5, 16)`` (rank 2: ``(4, 16)``, rank 4: ``(2, 3, 5, 16)``), leading dims
    symbolic if asked.
    """
    shape: Sequence[Any] = {2: (4, 16), 3: (2, 5, 16), 4: (2, 3, 5, 16)}[rank]
    if symbolic:
        shape = (*(tvm.tirx.Var(n, "int64") for n in ("n", "s", "h")[:rank - 1]), shape[-1])
    return relax.Var("x", relax.TensorType(shape, dtype))


def log_softmax_written_out(dtype: str = "float32", rank: int = 3, axis: int = -1,
                            symbolic: bool = False, spelling: str = "shifted",
                            max_form: str = "reduce", max_axis: int | None = None
                            ) -> tvm.IRModule:
    """A written-out log-softmax of :func:`_example_input` along ``axis``.

    ``spelling``: ``"shifted"``, ``(x - m) - log(sum(exp(x - m)))`` (torch, both ONNX
    exporters); ``"logsumexp"``, ``x - (log(sum(exp(x - m))) + m)`` (``from_onnx`` of
    ``ReduceLogSumExp``); ``"max_first"``, the same with ``m + log(...)``;
    ``"log_of_softmax"``, ``log(softmax(x))``.  ``max_form`` is :func:`max_of`'s; the rule
    must refuse ``max_axis`` other than ``axis``.
    """
    x = _example_input(dtype, rank, symbolic)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if spelling == "log_of_softmax":
                out = relax.op.log(bb.emit(relax.op.nn.softmax(x, axis)))
            else:
                m = max_of(bb, x, [axis if max_axis is None else max_axis], max_form)
                shifted = bb.emit(relax.op.subtract(x, m))
                total = bb.emit(relax.op.sum(bb.emit(relax.op.exp(shifted)), [axis],
                                             keepdims=True))
                log_sum = bb.emit(relax.op.log(total))
                if spelling == "shifted":
                    out = relax.op.subtract(shifted, log_sum)
                else:
                    lse = log_sum + m if spelling == "logsumexp" else m + log_sum
                    out = relax.op.subtract(x, bb.emit(lse))
            result = bb.emit_output(out)
        bb.emit_func_output(result)
    return bb.get()


def written_out(shifted: bool = True, dtype: str = "float32", rank: int = 3, axis: int = -1,
                symbolic: bool = False, max_axis: int | None = None,
                exps: str = "reused", max_form: str = "reduce") -> tvm.IRModule:
    """A written-out softmax of ``x: (2, 5, 16)`` (rank 2: ``(4, 16)``) along ``axis``.

    Shifted by the max if ``shifted`` (the stable form), taken as ``max_form`` says (see
    :func:`max_of`).  ``symbolic`` makes the leading dims symbolic; ``exps="recomputed"``
    computes ``exp(x - max)`` twice.  The rule must refuse ``max_axis`` other than
    ``axis``.
    """
    x = _example_input(dtype, rank, symbolic)
    max_axes = [axis if max_axis is None else max_axis] if shifted else None
    return softmax_graph(x, max_axes, [axis], exps=exps, max_form=max_form)


def max_of(bb: relax.BlockBuilder, x: relax.Expr, axes: Sequence[int], form: str = "reduce",
           k: int = 1, largest: bool = True) -> relax.Expr:
    """``x``'s max along ``axes``, keeping them, emitted in ``bb`` as ``form`` spells it.

    ``"reduce"``: ``R.max`` (hand-written Relax, both ONNX exporters' ``ReduceMax``).
    ``"topk"``: what the torch importer writes for ``x.max(axis, keepdim=True).values``,
    ``t = topk(x, k=1, axis); (t[0], t[1])[0]``; ``k`` and ``largest`` are the topk's
    (a topk that is not the max, for the negative cases).
    """
    if form == "reduce":
        return bb.emit(relax.op.max(x, list(axes), keepdims=True))
    (axis,) = axes
    top = bb.emit(relax.op.topk(x, k=k, axis=axis, ret_type="both", largest=largest,
                                dtype="int64"))
    repacked = bb.emit(relax.Tuple([bb.emit(relax.TupleGetItem(top, 0)),
                                    bb.emit(relax.TupleGetItem(top, 1))]))
    return bb.emit(relax.TupleGetItem(repacked, 0))


def softmax_graph(x: relax.Var, max_axes: Sequence[int] | None, sum_axes: Sequence[int],
                  keepdims: bool = True, exps: str = "reused", max_form: str = "reduce",
                  ) -> tvm.IRModule:
    """``main(x)``: ``exp(x - max(x)) / sum(exp(x - max(x)))`` written out, one binding per
    op, from the given parts (:func:`written_out` chooses them; a test may pass parts no
    knob makes, such as an ``x`` of unknown rank or a sum without ``keepdims``).

    ``max_axes=None`` leaves the shift out; ``keepdims`` is the sum's (the max keeps its
    dims); ``exps="recomputed"`` computes the exponentials twice; ``max_form`` is
    :func:`max_of`'s.
    """
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if max_axes is not None:
                m = max_of(bb, x, max_axes, max_form)
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
