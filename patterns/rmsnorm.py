"""RMS normalisation written out, collapsed into ``R.nn.rms_norm``; expanded back; composite.

Recognises (:class:`RmsNormCollapse`, ``rmsnorm.collapse``)::

    h   = astype(x, float32)                     # optional (Llama, T5 in float16)
    var = mean(h ** 2, axes, keepdims=True)      # axes: the last k axes; h ** 2 is
                                                 # power(h, 2) | h * h | square(h)
    y   = h * rsqrt(var + eps)                   # or h / sqrt(var + eps), h * (1 / sqrt(...))
                                                 # (ONNX); this h may be a second astype(x)
                                                 # (T5LayerNorm)
    y   = astype(y, x.dtype)                     # optional cast back
    y   = w * y                                  # optional weight

which covers transformers' ``LlamaRMSNorm`` (one cast read twice, weight after the cast
back) and ``T5LayerNorm`` (the variance from a cast of ``x``, the numerator from another)
in float32, float16 and bfloat16, as ``torch.export`` and the Relax importer deliver them, and as
ONNX exports them (``torch.rsqrt`` becomes ``Sqrt`` + ``Reciprocal``; the exporter ties
the no-op ``astype`` of a float32 ``x`` to the residual that reads it next, and the
rewrite keeps that cast for its other reader).

Produces ``R.nn.rms_norm(x, w, axes=[-k, ..., -1], epsilon=eps)``.  TVM's ``rms_norm``
computes in float32 whatever the input dtype and casts the result back, which is exactly
what the Llama spelling writes out; a float16 model that normalises in float16 gets the
more accurate float32 result.  When the casts make the output dtype differ from ``x``'s
(``x`` float16, output float32), ``x`` and ``w`` are cast *up* to the wider dtype and the
result cast to the output dtype, so no cast loses precision.  An absent weight becomes
``R.ones``.

The guards, each refusing with its reason: ``x`` has a known shape, every dtype involved
is float32, float16 or bfloat16 (not float16 and bfloat16 together), the mean reduces
trailing axes with ``keepdims=True``, ``eps`` is a scalar constant, the weight is
per-feature (its shape is the normalised dims, compared symbolically).  A match whose
intermediate is read elsewhere is not rewritten.

Numerics: float32 agrees to rounding (``rsqrt(v + eps) * x * w`` against the model's
order of the same operations).  float16 agrees within float16 rounding, with one known
difference of TVM's kernel: it rounds ``eps`` to the data dtype, so a float16 model's
``eps = 1e-6`` (a float16 subnormal) becomes ``1.013e-6``; this moves the output by
about ``0.65 * 1.3e-8 / (mean(x^2) + eps)`` relative, invisible unless a row's mean
square is comparable to ``eps``.  bfloat16 builds as float16 does (TVM's kernel computes
in float32 and rounds once, bit for bit the float32 norm rounded, checked on llvm): the
Llama spelling rounds twice and so moves by one bfloat16 ulp; the log says at which norm
the float32 computation stands in for the model's.

:class:`RmsNormExpand` (``rmsnorm.expand``, in :data:`patternkit.patterns.EXPANSIONS`)
writes ``R.nn.rms_norm`` out for training graphs, since ``relax.transform.Gradient`` has
no gradient for it (TVM has none for ``rsqrt`` either): ``h = astype(x, float32)``
(float16 and bfloat16 only), ``y = h / sqrt(mean(h * h) + eps)``, cast back, times ``w``,
all ops with a gradient in TVM 0.27 (``astype``, ``multiply``, ``mean``, ``add``, ``sqrt``,
``divide``).  It is the
Llama spelling, so ``rmsnorm.collapse`` undoes it.

:class:`RmsNormComposite` (``<compiler>.rms_norm``) takes ``R.nn.rms_norm`` over the last
axis for an external compiler.  TVM's own ``cutlass.rms_norm`` entry matches only a
``call_tir`` of an ``rms_norm`` PrimFunc (the MLC-LLM form), so a graph with the Relax
op offloads no RMS norm without this entry.

Deliberately not covered: ``x / sqrt(mean(x^2) + eps)`` with a mean over non-trailing
axes or over every axis of ``x`` (TVM 0.27's ``rms_norm`` does not build then, see
docs/tvm-bugs.md), ``eps`` added outside the root (``sqrt(var) + eps``: a
different function), float64 models, and a weight of another dtype than the
normalised value (the Relax importer casts it first, which this rule would see as a
different spelling).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, alt, divide_by_sqrt, is_op, square, wildcard
from patternkit.engine import CompositeRule, NoSuchExample, RewriteRule, RoleMatch, reject
from patternkit.ir import (
    NotTrailing,
    dtype_of,
    from_expr,
    static_shape,
    trailing_axes,
    type_of,
    var_name,
)

from .layernorm.examples import example_shape
from .layernorm.guards import (
    as_feature_tensor,
    per_feature,
    reduced_trailing_axes,
    scalar_epsilon,
    shape_and_dtype,
)

#: The dtypes the rules of this file are verified for (numerically, on llvm).  TVM 0.27's
#: ``rms_norm`` builds all three and computes in float32 whatever the data dtype: a
#: bfloat16 result is the float32 norm rounded once (checked bit for bit on llvm).
RMS_NORM_DTYPES = ("float32", "float16", "bfloat16")

_LOG = logging.getLogger(__name__)


def _wider(a: str, b: str) -> str:
    """Of two dtypes of :data:`RMS_NORM_DTYPES`, the one with more bits."""
    return a if tvm.DataType(a).bits >= tvm.DataType(b).bits else b


def _joined(dtypes: Sequence[str]) -> str:
    return ", ".join(dtypes[:-1]) + " and " + dtypes[-1]


def _where(match: RoleMatch) -> str:
    """The variable the matched norm's mean square is bound to, for the log."""
    at = match.var_of("variance")
    return var_name(at) if isinstance(at, relax.Var) else "its mean square"


# -- the collapse ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RmsNormPlan:
    """What the check found: axes, epsilon, normalised dims and the dtypes to cast to.

    ``data_dtype`` is what ``rms_norm`` runs on (``x``'s dtype or the wider output
    dtype), ``out_dtype`` the dtype the matched expression has.
    """

    axes: tuple[int, ...]
    epsilon: float
    features: tuple
    x_dtype: str
    data_dtype: str
    out_dtype: str
    reshape_weight: bool = False  # it has leading unit dims


class RmsNormCollapse(RewriteRule):
    """Collapse a written-out RMS norm (Llama's, T5's, with or without casts) into ``rms_norm``."""

    name = "rmsnorm.collapse"
    #: An ONNX export ties the (no-op) cast of x to the next residual add, which then
    #: reads it: the rewrite keeps the cast for it instead of skipping the norm.
    escapable_roles = ("cast", "numerator_cast")

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        # x in the compute dtype, for the variance and for the numerator: Llama casts
        # once and reads the cast twice, T5 casts twice; two patterns match both.
        self.cast = is_op("astype")(self.x)
        self.numerator_cast = is_op("astype")(self.x)
        self.variance = is_op("mean")(square(self.cast | self.x))
        self.eps = wildcard()
        normalised = divide_by_sqrt(self.numerator_cast | self.x, self.variance + self.eps)
        self.cast_back = is_op("astype")(normalised)
        back = self.cast_back | normalised
        self.weight = wildcard()
        self.scaled = back * self.weight
        self.pattern: DFPattern = alt(tag="weight", scaled=self.scaled, plain=back)

    def check(self, match: RoleMatch) -> Any:
        """An :class:`RmsNormPlan` when the match is an RMS norm over trailing axes of ``x``."""
        shape, x_dtype = shape_and_dtype(match.x)
        compute_dtype = dtype_of(type_of(match.variance))
        out_dtype = dtype_of(type_of(match.root))
        for what, dtype in (("x", x_dtype), ("the normalisation", compute_dtype),
                            ("the result", out_dtype)):
            if dtype not in RMS_NORM_DTYPES:
                return reject(f"{what} has dtype {dtype}: rmsnorm.collapse handles "
                              f"{_joined(RMS_NORM_DTYPES)} (TVM's rms_norm computes in "
                              f"float32)", at=match.x)
        assert x_dtype is not None and out_dtype is not None  # the loop refused the others
        if {x_dtype, out_dtype} == {"float16", "bfloat16"}:
            return reject(f"x has dtype {x_dtype} and the result {out_dtype}: neither holds "
                          f"the other's values, so no cast of x is exact", at=match.root)
        ndim = len(shape)
        k = reduced_trailing_axes(match.variance, ndim, "the mean")
        if k == ndim:
            return reject(f"the mean reduces every axis of the rank-{ndim} x: TVM 0.27's "
                          f"rms_norm over all of its input's axes does not build for llvm "
                          f"(docs/tvm-bugs.md)", at=match.variance)
        epsilon = scalar_epsilon(match.eps, ndim)
        weighted = match.tag("weight") == "scaled"
        reshape = weighted and per_feature(match.weight, shape, k, out_dtype, "the weight")
        return RmsNormPlan(tuple(range(-k, 0)), epsilon, shape[ndim - k:], x_dtype,
                           _wider(x_dtype, out_dtype), out_dtype, reshape)

    def rewrite(self, match: RoleMatch) -> Any:
        """One ``nn.rms_norm`` over the plan's axes, widened or without a weight as planned."""
        plan: RmsNormPlan = match.plan
        data = match.x
        if plan.x_dtype != plan.data_dtype:  # widening: exact
            data = relax.op.astype(data, plan.data_dtype)
        if match.tag("weight") == "scaled":
            weight = as_feature_tensor(match.weight, plan.features, plan.reshape_weight)
            if plan.out_dtype != plan.data_dtype:  # widening: exact
                weight = relax.op.astype(weight, plan.data_dtype)
        else:
            weight = relax.op.ones(plan.features, plan.data_dtype)
        out = relax.op.nn.rms_norm(data, weight, axes=list(plan.axes), epsilon=plan.epsilon)
        if plan.data_dtype == "bfloat16":
            _LOG.info("%s: the bfloat16 norm at %s is computed in float32 by R.nn.rms_norm "
                      "and rounded once to bfloat16, within bfloat16 rounding of the "
                      "written-out form", self.name, _where(match))
        if plan.out_dtype != plan.data_dtype:
            out = relax.op.astype(out, plan.out_dtype)
        return out

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A written-out RMS norm: :func:`written_out` with ``knobs``."""
        return written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """The spellings of an RMS norm met in exports (Llama, T5, plain; root, square,
        epsilon, axes), three dtypes.
        """
        return {"dtype": ("float32", "float16", "bfloat16", "float64"),
                "spelling": ("llama", "t5", "plain"), "rank": (3, 2, 4), "axes": (1, 2),
                "symbolic": (False, True), "weight": ("per_feature", "none", "full"),
                "root": ("rsqrt", "sqrt", "reciprocal"),
                "square": ("power", "multiply", "square"),
                "eps": ("scalar", "vector"), "mean_axes": ("trailing", "leading")}


# -- the expansion -----------------------------------------------------------------------------
class RmsNormExpand(RewriteRule):
    """Write ``rms_norm`` out in ops that ``relax.transform.Gradient`` differentiates."""

    name = "rmsnorm.expand"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x, self.weight = wildcard(), wildcard()
        self.norm = is_op("nn.rms_norm")(self.x, self.weight)
        self.pattern: DFPattern = self.norm

    def check(self, match: RoleMatch) -> Any:
        """Accept an ``rms_norm`` of float32, float16 or bfloat16 data over trailing axes."""
        shape, dtype = shape_and_dtype(match.x)
        if dtype not in RMS_NORM_DTYPES:
            return reject(f"x has dtype {dtype}: rmsnorm.expand writes out "
                          f"{_joined(RMS_NORM_DTYPES)} norms only", at=match.x)
        axes = [int(a) for a in match.norm.attrs.axes]
        try:
            trailing_axes(axes, len(shape), what="the rms_norm")
        except NotTrailing as why:
            return reject(f"{why}: the weight would not broadcast against x", at=match.norm)
        return dtype

    def rewrite(self, match: RoleMatch) -> Any:
        """The RMS norm written out in float32 and cast back to the dtype of ``x``."""
        dtype = match.plan
        attrs = match.norm.attrs
        axes = [int(a) for a in attrs.axes]
        h = match.x if dtype == "float32" else relax.op.astype(match.x, "float32")
        mean_square = relax.op.mean(relax.op.multiply(h, h), axes, keepdims=True)
        radicand = relax.op.add(mean_square, relax.const(float(attrs.epsilon), "float32"))
        y = relax.op.divide(h, relax.op.sqrt(radicand))
        if dtype != "float32":
            y = relax.op.astype(y, dtype)
        return relax.op.multiply(y, match.weight)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """One ``rms_norm`` call: :func:`rms_norm_call` with ``knobs`` (``axes=0``: the
        first axis, and ``dtype="float64"``: refused).
        """
        return rms_norm_call(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Three dtypes (float64 refused), ranks, symbolic shapes, and axes (the first refused)."""
        return {"dtype": ("float32", "float16", "float64"), "rank": (3, 2, 4),
                "axes": (1, 2, 0),
                "symbolic": (False, True)}


# -- the composite -----------------------------------------------------------------------------
class RmsNormComposite(CompositeRule):
    """``rms_norm`` over the last axis as a pattern-table entry (``<compiler>.rms_norm``)."""

    pattern_name = "rms_norm"

    def __init__(self, compiler: str = "byoc"):
        super().__init__(compiler)
        self.x, self.weight = wildcard(), wildcard()
        self.norm = is_op("nn.rms_norm")(self.x, self.weight)
        self.pattern: DFPattern = self.norm

    def check(self, match: RoleMatch) -> Any:
        """Accept a norm over the last axis (the RMS-norm kernels' layout)."""
        ndim = type_of(match.norm).ndim
        axes = [int(a) for a in match.norm.attrs.axes]
        if len(axes) != 1 or axes[0] % max(ndim, 1) != ndim - 1:
            return reject(f"the rms_norm normalises axes {axes} of a rank-{ndim} tensor: "
                          f"the backends' kernels take the last axis only", at=match.norm)
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """One ``rms_norm`` call: :func:`rms_norm_call` with ``knobs`` (``axes=2`` or ``0``:
        refused).
        """
        return rms_norm_call(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes, ranks, symbolic shapes; axes other than the last one refused."""
        return {"dtype": ("float32", "float16"), "rank": (3, 2, 4), "axes": (1, 2, 0),
                "symbolic": (False, True)}


#: The rewrite rules of this file.
RULES = (RmsNormCollapse,)

#: Expand rules, for :data:`patternkit.patterns.EXPANSIONS` (never with the collapse).
EXPANSIONS = (RmsNormExpand,)

#: Pattern-table entries of this file.
COMPOSITES = (RmsNormComposite,)


# -- examples (the rules' example(), the tests and `patternkit verify`) --------------------
def written_out(dtype: str = "float32", spelling: str = "llama", rank: int = 3, axes: int = 1,
                symbolic: bool = False, weight: str = "per_feature", root: str = "rsqrt",
                square: str = "power", eps: str = "scalar",
                mean_axes: str = "trailing") -> tvm.IRModule:
    """An RMS norm over the last ``axes`` axes of a rank-``rank`` ``x`` of ``dtype``.

    ``spelling``: ``"llama"`` (``LlamaRMSNorm``: cast to float32 once for a float16
    ``x``, weight after the cast back), ``"t5"`` (``T5LayerNorm``: the variance and
    the numerator each from their own cast) or ``"plain"`` (no casts, computed in
    ``dtype``).  ``weight``: ``"per_feature"``, ``"none"``, or ``"full"`` (a weight of
    ``x``'s whole shape: refused).  ``root``: ``"rsqrt"``, ``"sqrt"`` (divide) or
    ``"reciprocal"`` (``h * (1 / sqrt)``, ONNX's spelling of ``rsqrt``);
    ``square``: ``"power"``, ``"multiply"`` or ``"square"``; ``eps``: ``"scalar"`` or
    ``"vector"`` (refused); ``mean_axes``: ``"trailing"`` or ``"leading"`` (the mean
    over the first ``axes`` axes: refused).  ``dtype="float64"`` is refused too; a
    ``"plain"`` bfloat16 norm squared by ``power`` is no example (TVM does not build it).
    """
    x = relax.Var("x", relax.TensorType(example_shape(rank, symbolic), dtype))
    shape = static_shape(x.ty)
    assert shape is not None  # x was just given one
    features = shape[rank - axes:]
    w = relax.Var("w", relax.TensorType(shape if weight == "full" else features, dtype))
    compute = "float32" if spelling != "plain" else dtype
    if compute == "bfloat16" and square == "power":
        raise NoSuchExample("TVM 0.27 does not build power in bfloat16 (\"power only applies "
                            "to float\"): the model has no numeric reference on llvm")
    eps_value = (relax.const(1e-6, compute) if eps == "scalar" else  # float32 numbers, cast
                 relax.const(np.full(int(shape[-1]), 1e-6, "float32"), compute))
    bb = relax.BlockBuilder()
    with bb.function("main", [x] + ([] if weight == "none" else [w])):
        with bb.dataflow():
            h = bb.emit(relax.op.astype(x, compute)) if compute != dtype else x
            sq = bb.emit({"power": lambda: relax.op.power(h, relax.const(2.0, compute)),
                          "multiply": lambda: relax.op.multiply(h, h),
                          "square": lambda: relax.op.square(h)}[square]())
            reduce = range(-axes, 0) if mean_axes == "trailing" else range(axes)
            var = bb.emit(relax.op.mean(sq, list(reduce), keepdims=True))
            radicand = bb.emit(relax.op.add(var, eps_value))
            if spelling == "t5" and compute != dtype:
                h = bb.emit(relax.op.astype(x, compute))
            if root == "rsqrt":
                y = bb.emit(relax.op.multiply(h, bb.emit(relax.op.rsqrt(radicand))))
            elif root == "reciprocal":
                inverse = relax.op.divide(relax.const(1.0, compute),
                                          bb.emit(relax.op.sqrt(radicand)))
                y = bb.emit(relax.op.multiply(h, bb.emit(inverse)))
            else:
                y = bb.emit(relax.op.divide(h, bb.emit(relax.op.sqrt(radicand))))
            if compute != dtype:
                y = bb.emit(relax.op.astype(y, dtype))
            if weight != "none":
                y = bb.emit(relax.op.multiply(w, y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def rms_norm_call(dtype: str = "float32", rank: int = 3, axes: int = 1,
                  symbolic: bool = False) -> tvm.IRModule:
    """``rms_norm(x, w)`` over the last ``axes`` axes, or over axis 0 when ``axes == 0``."""
    shape = example_shape(rank, symbolic)
    reduce = list(range(-axes, 0)) if axes else [0]
    x = relax.Var("x", relax.TensorType(shape, dtype))
    w = relax.Var("w", relax.TensorType([shape[a] for a in reduce], dtype))
    return from_expr(relax.op.nn.rms_norm(x, w, axes=reduce, epsilon=1e-6))
