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

**Half precision, widened** (the dynamo exporter's float16 and bfloat16 softmax): the max
and the sum each run in float32 between two casts, ``astype(max(astype(x, "float32")),
dtype)`` and ``astype(sum(astype(e, "float32")), dtype)``.  The widened max is the same
number (the widening is exact), so a max widened alone collapses as the plain form; a
widened sum gives ``astype(R.nn.softmax(astype(x, "float32")), dtype)`` (and the same for
``log_softmax``): the model's float32 accumulation kept, the whole op in float32 and rounded
once, a few ulp of the narrow dtype from the written-out form (which also rounds the
exponentials and the quotient), logged at INFO with the precision.  That is the form
``attention.collapse`` takes as a widened softmax, so a written-out half-precision attention
collapses too.  Any other cast (a float32 model's reduction cast to float32 or float64, a
float16 sum in float64) is refused with the dtypes named.

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

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import tvm
from tvm import relax

from patternkit.dpl import DFPattern, alt, is_op, is_tuple, is_tuple_get_item, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import HALF_WIDENINGS, dtype_of, type_of, var_name

_LOG = logging.getLogger(__name__)


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


class MaxPatterns(NamedTuple):
    """:func:`max_along_one_axis`'s pattern and the role patterns of its calls."""

    pattern: DFPattern
    reduction: DFPattern
    topk: DFPattern
    widen: DFPattern


def max_along_one_axis(x: DFPattern) -> MaxPatterns:
    """The pattern of ``x``'s max along one axis, and the role patterns of its two calls
    (``R.max``, ``topk``), of which a match has one, and of the max's widening cast.

    Hand-written code and both ONNX exporters (``ReduceMax``) give ``R.max(x, [a],
    keepdims=True)``; torch's ``x.max(a, keepdim=True).values`` reaches Relax as the torch
    importer's ``topk(x, k=1, axis=a)[0]``, which it repacks into a tuple with the indices
    and reads back (``t = (topk[0], topk[1]); t[0]``).  The tag ``max_form`` says which.
    The dynamo exporter takes a float16 or bfloat16 max in float32 between two casts
    (``astype(max(astype(x, "float32")), dtype)``, tags ``max_input="widened"`` and
    ``max_width="narrowed"``): the widening is exact, so is the max of the widened values
    and its cast back, and the max is the same number (:func:`checked_widening`).
    """
    widen = is_op("astype")(x)
    reduction = is_op("max")(alt(tag="max_input", plain=x, widened=widen))
    topk = is_op("topk")(x)
    values, indices = is_tuple_get_item(topk, 0), is_tuple_get_item(topk, 1)
    reduce = alt(tag="max_width", narrowed=is_op("astype")(reduction), plain=reduction)
    return MaxPatterns(alt(tag="max_form", reduce=reduce,
                           topk=values | is_tuple_get_item(is_tuple([values, indices]), 0)),
                       reduction, topk, widen)


def checked_widening(cast: Any, x: Any, what: str) -> str:
    """The dtype ``cast`` widens the ``x`` values of a softmax to; refuses any other cast.

    Only float16 and bfloat16 widened to float32 are taken
    (:data:`patternkit.ir.HALF_WIDENINGS`): the widening is exact, so a max taken there is
    the same number, and a sum taken there is the float32 accumulation the collapse keeps.
    Any other cast (a float32 model's reduction in float64, a narrowing) is a precision
    the collapse would not reproduce.
    """
    narrow, wide = dtype_of(type_of(x)), str(cast.attrs.dtype)
    if HALF_WIDENINGS.get(narrow or "") != wide:
        raise reject(f"{what} runs in {wide} on {narrow} values: only float16 and bfloat16 "
                     f"widened to float32 are taken (an exact widening, the precision the "
                     f"collapse keeps)", at=cast)
    return wide


def checked_max_axis(match: RoleMatch, ndim: int) -> int:
    """The one axis (non-negative) along which the match's ``max`` (or ``topk``) takes the
    max; refuses a ``topk`` that is not the max (``k > 1``, or the smallest values) and a
    max taken after a cast other than an exact widening (:func:`checked_widening`).
    """
    if "max" in match:
        if match.tag("max_input") == "widened":
            checked_widening(match.max_widen, match.x, "the max")
        return _single_axis(match.max, ndim, "the max")
    call = match.topk
    if int(call.attrs.k) != 1 or not bool(call.attrs.largest):
        raise reject(f"the topk takes the {int(call.attrs.k)} "
                     f"{'largest' if bool(call.attrs.largest) else 'smallest'} values: only "
                     f"the single largest one is the max that a softmax subtracts", at=call)
    return int(call.attrs.axis) % ndim


@dataclass(frozen=True)
class SoftmaxPlan:
    """The axis of ``x`` the softmax normalises, as the sum spells it, and the dtype the
    sum accumulates in when the model widened it (``None``: ``x``'s own).
    """

    axis: int
    wide: str | None = None


def sum_of(exps: DFPattern) -> tuple[DFPattern, DFPattern, DFPattern]:
    """``sum(exps)``, in ``exps``' dtype or widened and cast back (the dynamo exporter's
    float16 and bfloat16 sum: ``astype(sum(astype(e, "float32")), dtype)``, tags
    ``sum_input="widened"``, ``sum_width="narrowed"``); with the role patterns of the sum
    and of its widening cast.
    """
    widen = is_op("astype")(exps)
    total = is_op("sum")(alt(tag="sum_input", plain=exps, widened=widen))
    return alt(tag="sum_width", narrowed=is_op("astype")(total), plain=total), total, widen


def checked_plan(match: RoleMatch, ndim: int, what: str) -> SoftmaxPlan:
    """The plan of a shifted softmax or log-softmax: the max and the sum reduce the same
    single axis, each in ``x``'s dtype or exactly widened.
    """
    axis = _single_axis(match.sum, ndim, "the sum")
    max_axis = checked_max_axis(match, ndim)
    if max_axis != axis:
        raise reject(f"the max reduces axis {max_axis} but the sum axis {axis}: the shift "
                     f"does not cancel, so this is not a {what}",
                     at=match.max if "max" in match else match.topk)
    return SoftmaxPlan(int(match.sum.attrs.axis[0]), _widened_sum(match))


def _widened_sum(match: RoleMatch) -> str | None:
    if match.tag("sum_input") != "widened":
        return None
    return checked_widening(match.sum_widen, match.x, "the sum")


def in_width(op: Any, match: RoleMatch, rule: str) -> Any:
    """``op(x, axis)`` over the plan's axis, computed in the dtype the model's sum was (a
    widened sum: ``astype(op(astype(x, wide)), dtype)``, logged at INFO with its precision).
    """
    plan: SoftmaxPlan = match.plan
    x = match.x
    if plan.wide is None:
        return op(x, axis=plan.axis)
    narrow = dtype_of(type_of(x))
    _LOG.info("%s: the sum at %s ran in %s on %s values; the collapse computes the op in "
              "%s and rounds once to %s (within %s's tolerance of the written-out form)", rule,
              var_name(match.var_of("sum")), plan.wide, narrow, plan.wide, narrow, narrow)
    return relax.op.astype(op(relax.op.astype(x, plan.wide), axis=plan.axis), narrow)


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
            maximum, self.max, self.topk, self.max_widen = max_along_one_axis(self.x)
            numerator, exps = (is_op("exp")(self.x - maximum) for _ in range(2))
        else:
            numerator, exps = (is_op("exp")(self.x) for _ in range(2))
        total, self.sum, self.sum_widen = sum_of(exps)
        self.pattern: DFPattern = numerator / total

    def check(self, match: RoleMatch) -> Any:
        """A :class:`SoftmaxPlan` when the max and the sum reduce the same single axis."""
        ty = type_of(match.x)
        if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
            return reject("x has an unknown rank: cannot tell which axis the sum reduces",
                          at=match.x)
        if self.shifted:
            return checked_plan(match, ty.ndim, "softmax")
        _single_axis(match.sum, ty.ndim, "the sum")
        return SoftmaxPlan(int(match.sum.attrs.axis[0]), _widened_sum(match))

    def rewrite(self, match: RoleMatch) -> Any:
        """One ``nn.softmax`` of ``x`` over the plan's axis (in the widened sum's dtype
        between two casts, if the model widened it).
        """
        return in_width(relax.op.nn.softmax, match, self.name)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A written-out softmax, shifted by the max or not as this variant expects:
        :func:`written_out` with ``knobs``.
        """
        return written_out(self.shifted, **knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes, ranks and axes, symbolic shapes; a max over another axis (refused),
        the exponentials reused or computed twice, the max and the sum widened to float32
        (a float32 model's cast to float32 is refused: no widening).
        """
        return {"dtype": ("float32", "float16"), "rank": (3, 2, 4), "axis": (-1, 1, 0),
                "symbolic": (False, True), "max_axis": (None, 0), "exps": ("reused", "recomputed"),
                "max_form": ("reduce", "topk"), "wide": (None, "float32")}


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
        maximum, self.max, self.topk, self.max_widen = max_along_one_axis(self.x)
        total, self.sum, self.sum_widen = sum_of(is_op("exp")(self.x - maximum))
        log_sum = is_op("log")(total)
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
        return checked_plan(match, ty.ndim, "log-softmax")

    def rewrite(self, match: RoleMatch) -> Any:
        """One ``nn.log_softmax`` of ``x`` over the plan's axis (in the widened sum's
        dtype between two casts, if the model widened it).
        """
        if self.form == "log_of_softmax":
            return relax.op.nn.log_softmax(match.x, axis=match.plan.axis)
        return in_width(relax.op.nn.log_softmax, match, self.name)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A written-out log-softmax in this variant's form: :func:`log_softmax_written_out`."""
        if self.form == "log_of_softmax":
            knobs["spelling"] = "log_of_softmax"
        return log_softmax_written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Dtypes, ranks, axes, symbolic shapes, the spellings and the max's forms; a max
        over another axis (refused); the max and the sum widened to float32.
        """
        if self.form == "log_of_softmax":
            return {"dtype": ("float32", "float16"), "rank": (3, 2), "axis": (-1, 1),
                    "symbolic": (False, True)}
        return {"dtype": ("float32", "float16"), "rank": (3, 2, 4), "axis": (-1, 1, 0),
                "symbolic": (False, True), "spelling": ("shifted", "logsumexp", "max_first"),
                "max_form": ("reduce", "topk"), "max_axis": (None, 0), "wide": (None, "float32")}


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
                            max_form: str = "reduce", max_axis: int | None = None,
                            wide: str | None = None) -> tvm.IRModule:
    """A written-out log-softmax of :func:`_example_input` along ``axis``.

    ``spelling``: ``"shifted"``, ``(x - m) - log(sum(exp(x - m)))`` (torch, both ONNX
    exporters); ``"logsumexp"``, ``x - (log(sum(exp(x - m))) + m)`` (``from_onnx`` of
    ``ReduceLogSumExp``); ``"max_first"``, the same with ``m + log(...)``;
    ``"log_of_softmax"``, ``log(softmax(x))``.  ``max_form`` is :func:`max_of`'s; the rule
    must refuse ``max_axis`` other than ``axis``.  ``wide``: the max and the sum run in that
    dtype between casts (the dynamo exporter's float16 and bfloat16 form).
    """
    x = _example_input(dtype, rank, symbolic)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if spelling == "log_of_softmax":
                out = relax.op.log(bb.emit(relax.op.nn.softmax(x, axis)))
            else:
                m = max_of(bb, x, [axis if max_axis is None else max_axis], max_form,
                           wide=wide)
                shifted = bb.emit(relax.op.subtract(x, m))
                total = _in(bb, wide, bb.emit(relax.op.exp(shifted)),
                            lambda v: relax.op.sum(v, [axis], keepdims=True))
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
                exps: str = "reused", max_form: str = "reduce",
                wide: str | None = None) -> tvm.IRModule:
    """A written-out softmax of ``x: (2, 5, 16)`` (rank 2: ``(4, 16)``) along ``axis``.

    Shifted by the max if ``shifted`` (the stable form), taken as ``max_form`` says (see
    :func:`max_of`).  ``symbolic`` makes the leading dims symbolic; ``exps="recomputed"``
    computes ``exp(x - max)`` twice.  The rule must refuse ``max_axis`` other than
    ``axis``.  ``wide``: the max and the sum run in that dtype between casts (``"float32"``
    for a float16 or bfloat16 ``x``, as the dynamo exporter writes it).
    """
    x = _example_input(dtype, rank, symbolic)
    max_axes = [axis if max_axis is None else max_axis] if shifted else None
    return softmax_graph(x, max_axes, [axis], exps=exps, max_form=max_form, wide=wide)


def max_of(bb: relax.BlockBuilder, x: relax.Expr, axes: Sequence[int], form: str = "reduce",
           k: int = 1, largest: bool = True, wide: str | None = None) -> relax.Expr:
    """``x``'s max along ``axes``, keeping them, emitted in ``bb`` as ``form`` spells it.

    ``"reduce"``: ``R.max`` (hand-written Relax, both ONNX exporters' ``ReduceMax``).
    ``"topk"``: what the torch importer writes for ``x.max(axis, keepdim=True).values``,
    ``t = topk(x, k=1, axis); (t[0], t[1])[0]``; ``k`` and ``largest`` are the topk's
    (a topk that is not the max, for the negative cases).  ``wide``: the ``R.max`` runs in
    that dtype between two casts (the dynamo exporter's float16 and bfloat16 ``ReduceMax``).
    """
    if form == "reduce":
        return _in(bb, wide, x, lambda v: relax.op.max(v, list(axes), keepdims=True))
    (axis,) = axes
    top = bb.emit(relax.op.topk(x, k=k, axis=axis, ret_type="both", largest=largest,
                                dtype="int64"))
    repacked = bb.emit(relax.Tuple([bb.emit(relax.TupleGetItem(top, 0)),
                                    bb.emit(relax.TupleGetItem(top, 1))]))
    return bb.emit(relax.TupleGetItem(repacked, 0))


def _in(bb: relax.BlockBuilder, wide: str | None, x: relax.Expr, op: Any) -> relax.Expr:
    """``op(x)`` emitted in ``bb``, or ``astype(op(astype(x, wide)), dtype)`` if ``wide``."""
    if wide is None:
        return bb.emit(op(x))
    narrow = dtype_of(type_of(x))
    return bb.emit(relax.op.astype(bb.emit(op(bb.emit(relax.op.astype(x, wide)))), narrow))


def softmax_graph(x: relax.Var, max_axes: Sequence[int] | None, sum_axes: Sequence[int],
                  keepdims: bool = True, exps: str = "reused", max_form: str = "reduce",
                  wide: str | None = None) -> tvm.IRModule:
    """``main(x)``: ``exp(x - max(x)) / sum(exp(x - max(x)))`` written out, one binding per
    op, from the given parts (:func:`written_out` chooses them; a test may pass parts no
    knob makes, such as an ``x`` of unknown rank or a sum without ``keepdims``).

    ``max_axes=None`` leaves the shift out; ``keepdims`` is the sum's (the max keeps its
    dims); ``exps="recomputed"`` computes the exponentials twice; ``max_form`` is
    :func:`max_of`'s; ``wide``: the max and the sum run in that dtype between casts, as
    the dynamo exporter writes a float16 or bfloat16 softmax.
    """
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if max_axes is not None:
                m = max_of(bb, x, max_axes, max_form, wide=wide)
                shifted_x = bb.emit(relax.op.subtract(x, m))
            else:
                shifted_x = x
            e = bb.emit(relax.op.exp(shifted_x))
            s = _in(bb, wide, e, lambda v: relax.op.sum(v, list(sum_axes), keepdims=keepdims))
            if exps == "recomputed":
                e = bb.emit(relax.op.exp(shifted_x))
            out = bb.emit_output(relax.op.divide(e, s))
        bb.emit_func_output(out)
    return bb.get()
