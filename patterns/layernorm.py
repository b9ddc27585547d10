"""Layer normalisation written out, collapsed into ``R.nn.layer_norm``; its composites.

Recognises (:class:`LayerNormCollapse`, ``layernorm.collapse``)::

    mean = mean(x, axes, keepdims=True)          # axes: the last k axes of x, any k
    d    = x - mean                              # one binding read twice, or computed twice
    var  = mean(d ** 2, axes, keepdims=True)     # power(d, 2) | d * d | square(d),
                                                 # or variance(x, axes, keepdims=True)
    y    = d / sqrt(var + eps)                   # or d * rsqrt(var + eps), d * (1 / sqrt(..))
    y    = y * gamma                             # optional
    y    = y + beta                              # optional

which is what ONNX exports below opset 17 (``ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt,
Div, Mul, Add``), hand-written torch modules, and TVM's own
``relax.transform.DecomposeOpsForTraining`` (the ``variance`` form) produce.  The
multiplies match with their operands either way round, and ``gamma * d / sqrt(...)``
(the association batch norms are written with) matches too.

Produces ``R.nn.layer_norm(x, gamma, beta, axes=[-k, ..., -1], epsilon=eps)``.  An
absent ``gamma`` / ``beta`` becomes ``R.ones`` / ``R.zeros`` of the normalised shape
(TVM's legalisation reads the two arguments and ignores the ``center`` / ``scale``
flags), a ``gamma`` with extra leading unit dims is reshaped to the normalised shape.

The guards, each refusing with its reason in the rewrite log: ``x`` has a known shape
and dtype float32 or float16 (TVM's ``layer_norm`` has kernels for these only); both
means reduce the same trailing axes with ``keepdims=True``; ``eps`` is a scalar
constant; ``gamma`` and ``beta`` are per-feature, their shape *is* the normalised dims
(after leading ones), compared symbolically where dims are symbolic (a comparison that
cannot be decided refuses).  A match whose intermediate is read elsewhere is not
rewritten (the engine's rule).  A scalar or full-tensor ``gamma`` / ``beta`` stays
outside: the bare norm underneath still collapses.

Numerics: the fused op computes the same mean and variance (two-pass, float32
accumulation for float16 inputs), so float32 models agree to rounding.  float16 models
agree within float16 rounding; the fused op is the more accurate of the two, because the
written-out float16 graph accumulates its means in float16.

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

Deliberately not covered: a layer norm computed in float32 between casts of a float16
``x`` (write it with :func:`patternkit.dpl.up_to_cast` if a model needs it: none of the
zoo's does), non-trailing axes (group and instance norms), ``x + (-mean)``,
``d * (1 / sqrt(...))``, an unbiased (Bessel-corrected) variance, and bfloat16 or
float64 models (no ``layer_norm`` kernel in TVM 0.27).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, divide_by_sqrt, is_op, square, wildcard
from patternkit.engine import CompositeRule, RewriteRule, RuleMatch, reject
from patternkit.ir import (NotPerFeature, NotTrailing, const_value, dims_equal, dtype_of,
                           from_expr, int_list, is_constant, per_feature_shape, static_shape,
                           trailing_axes, type_of, var_name)

#: The dtypes TVM 0.27's ``layer_norm`` legalises (its TOPI kernel checks them).
LAYER_NORM_DTYPES = ("float32", "float16")


# -- guards shared by the normalisation rules (rmsnorm.py imports them) -----------------------
def shape_and_dtype(x: Any) -> tuple[tuple, str]:
    """``(shape, dtype)`` of ``x``, refusing when the shape is unknown."""
    ty = type_of(x)
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
        raise reject("x has an unknown rank: cannot tell which axes the means reduce",
                     at=x)
    shape = static_shape(ty)
    if shape is None:
        raise reject(f"x has rank {ty.ndim} but no known shape: cannot compare gamma and "
                     f"beta with the normalised dims", at=x)
    return shape, dtype_of(ty)


def reduced_trailing_axes(call: Any, ndim: int, what: str) -> int:
    """How many trailing axes the reduction ``call`` reduces, with ``keepdims=True``."""
    attrs = call.attrs
    found = int_list(attrs.axis)
    if not bool(attrs.keepdims):
        raise reject(f"{what} over axes {found} drops the reduced axes (keepdims=False): "
                     f"it does not broadcast back against x", at=call)
    try:
        return trailing_axes(found, ndim, what=what)
    except NotTrailing as why:
        raise reject(f"{why}: a layer norm normalises trailing axes", at=call) from None


def scalar_epsilon(eps: Any, ndim: int) -> float:
    """The value of ``eps``, which must be a one-element constant of rank at most ``ndim``."""
    if not is_constant(eps):
        what = f"'{var_name(eps)}'" if isinstance(eps, relax.Var) else type(eps).__name__
        raise reject(f"eps is {what}, not a constant: epsilon is an attribute of the fused "
                     f"op, so it must be known at compile time", at=eps)
    value = const_value(eps)
    if value.size != 1:
        raise reject(f"eps has shape {value.shape}: epsilon must be a scalar constant",
                     at=eps)
    if value.ndim > ndim:
        raise reject(f"eps has rank {value.ndim}, more than x's {ndim}: adding it "
                     f"broadcasts the result to a higher rank", at=eps)
    return float(value.reshape(()))


def per_feature(value: Any, x_shape: tuple, k: int, dtype: str, role: str) -> bool:
    """Whether ``value`` (gamma, beta, a weight), a per-feature parameter, needs a reshape.

    It needs one when it has leading unit dims: the fused ops take the normalised shape.
    """
    ty = type_of(value)
    if dtype_of(ty) != dtype:
        raise reject(f"{role} has dtype {dtype_of(ty)}, x has {dtype}", at=value)
    # A constant's shape is its data's (one FFI read, where the type's shape is several).
    shape = (tuple(value.value.shape) if type(value) is tvm.ir.GenericConst
             else static_shape(ty))
    try:
        per_feature_shape(shape, x_shape, k, name=role)
    except NotPerFeature as why:
        raise reject(str(why), at=value) from None
    return len(shape) != k


def as_feature_tensor(value: Any, features: tuple, reshape: bool) -> Any:
    """``value``, reshaped to ``features`` (the fused op's parameter shape) if ``reshape``."""
    if not reshape:
        return value
    if is_constant(value):
        return relax.const(const_value(value).reshape([int(d) for d in features]))
    return relax.op.reshape(value, features)


# -- the collapse ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerNormPlan:
    """What the check found: the normalised axes (``-k .. -1``), epsilon, their dims."""

    axes: tuple[int, ...]
    epsilon: float
    features: tuple
    dtype: str
    reshape: frozenset = frozenset()  # roles with leading unit dims to reshape away


class LayerNormCollapse(RewriteRule):
    """Collapse a written-out layer norm (mean, variance, eps, [gamma], [beta]) into one op."""

    name = "layernorm.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.mean = is_op("mean")(self.x)
        # Two patterns for x - mean: the same binding read twice matches both, and so
        # does x - mean computed once for the variance and once for the numerator.
        centered = self.x - self.mean
        self.variance_mean = is_op("mean")(square(centered))
        self.variance_op = is_op("variance")(self.x)
        self.eps = wildcard()
        normalised = divide_by_sqrt(self.x - self.mean,
                                    (self.variance_mean | self.variance_op) + self.eps)
        self.gamma, self.beta = wildcard(), wildcard()
        self.scaled = normalised * self.gamma
        scaled = self.scaled | normalised
        self.shifted = scaled + self.beta
        self.pattern: DFPattern = self.shifted | scaled

    def check(self, match: RuleMatch) -> Any:
        """A :class:`LayerNormPlan` when the match normalises trailing axes of ``x``."""
        shape, dtype = shape_and_dtype(match.x)
        if dtype not in LAYER_NORM_DTYPES:
            return reject(f"x has dtype {dtype}: TVM's layer_norm computes "
                          f"{' and '.join(LAYER_NORM_DTYPES)} only", at=match.x)
        ndim = len(shape)
        k = reduced_trailing_axes(match.mean, ndim, "the mean")
        variance = match.variance_mean if "variance_mean" in match else match.variance_op
        k_var = reduced_trailing_axes(variance, ndim, "the variance")
        if k_var != k:
            return reject(f"the mean reduces the last {k} axes of x but the variance the "
                          f"last {k_var}", at=variance)
        epsilon = scalar_epsilon(match.eps, ndim)
        reshape = frozenset(role for role in ("gamma", "beta")
                            if role in match and per_feature(match[role], shape, k, dtype, role))
        return LayerNormPlan(tuple(range(-k, 0)), epsilon, shape[ndim - k:], dtype, reshape)

    def rewrite(self, match: RuleMatch) -> Any:
        plan: LayerNormPlan = match.plan
        gamma = (as_feature_tensor(match["gamma"], plan.features, "gamma" in plan.reshape)
                 if "gamma" in match else relax.op.ones(plan.features, plan.dtype))
        beta = (as_feature_tensor(match["beta"], plan.features, "beta" in plan.reshape)
                if "beta" in match else relax.op.zeros(plan.features, plan.dtype))
        return relax.op.nn.layer_norm(match.x, gamma, beta, axes=list(plan.axes),
                                      epsilon=plan.epsilon)

    # -- self-check example (used by tests and `patternkit verify`) ---------------------------
    @staticmethod
    def example(dtype: str = "float32", rank: int = 3, axes: int = 1, symbolic: bool = False,
                affine: str = "both", root: str = "sqrt", square: str = "power",
                centered: str = "reused", mean_axes: str = "trailing", eps: str = "scalar",
                gamma: str = "per_feature") -> tvm.IRModule:
        """A written-out layer norm over the last ``axes`` axes of a rank-``rank`` ``x``.

        ``symbolic`` makes the leading dims of ``x`` symbolic (``n``, ``s``); ``affine``
        is ``"both"``, ``"gamma"``, ``"beta"`` or ``"none"``; ``root`` ``"sqrt"`` (divide)
        ``"rsqrt"`` (multiply) or ``"reciprocal"`` (times ``1 / sqrt``); ``square`` ``"power"``, ``"multiply"``, ``"square"`` or
        ``"variance"`` (the ``variance`` op instead of the second mean); ``centered``
        ``"reused"`` or ``"recomputed"``.  Knobs the rule must refuse: ``mean_axes=
        "leading"`` (the means reduce the first axes), ``eps="vector"`` or
        ``"variable"``, ``gamma="scalar"`` or ``"full"`` (not per-feature).
        """
        x = relax.Var("x", relax.TensorType(example_shape(rank, symbolic), dtype))
        shape = static_shape(x.ty)
        reduce = list(range(-axes, 0)) if mean_axes == "trailing" else list(range(axes))
        features = shape[rank - axes:]
        gamma_shape = {"per_feature": features, "scalar": (), "full": shape}[gamma]
        params = [x]
        g = relax.Var("gamma", relax.TensorType(gamma_shape, dtype))
        b = relax.Var("beta", relax.TensorType(features, dtype))
        params += [p for p, role in ((g, "gamma"), (b, "beta")) if affine in (role, "both")]
        eps_value = {"scalar": relax.const(1e-5, dtype),
                     "vector": relax.const(np.full(int(shape[-1]), 1e-5, dtype), dtype),
                     "variable": relax.Var("eps", relax.TensorType((), dtype))}[eps]
        if eps == "variable":
            params.append(eps_value)
        bb = relax.BlockBuilder()
        with bb.function("main", params):
            with bb.dataflow():
                mean = bb.emit(relax.op.mean(x, reduce, keepdims=True))
                d = bb.emit(relax.op.subtract(x, mean))
                if square == "variance":
                    var = bb.emit(relax.op.variance(x, reduce, keepdims=True))
                else:
                    sq = bb.emit({"power": lambda: relax.op.power(d, relax.const(2.0, dtype)),
                                  "multiply": lambda: relax.op.multiply(d, d),
                                  "square": lambda: relax.op.square(d)}[square]())
                    var = bb.emit(relax.op.mean(sq, reduce, keepdims=True))
                radicand = bb.emit(relax.op.add(var, eps_value))
                if centered == "recomputed":
                    d = bb.emit(relax.op.subtract(x, mean))
                if root == "sqrt":
                    y = bb.emit(relax.op.divide(d, bb.emit(relax.op.sqrt(radicand))))
                elif root == "reciprocal":  # torch.rsqrt exported to ONNX
                    inverse = relax.op.divide(relax.const(1.0, dtype),
                                              bb.emit(relax.op.sqrt(radicand)))
                    y = bb.emit(relax.op.multiply(d, bb.emit(inverse)))
                else:
                    y = bb.emit(relax.op.multiply(d, bb.emit(relax.op.rsqrt(radicand))))
                if affine in ("gamma", "both"):
                    y = bb.emit(relax.op.multiply(y, g))
                if affine in ("beta", "both"):
                    y = bb.emit(relax.op.add(y, b))
                out = bb.emit_output(y)
            bb.emit_func_output(out)
        return bb.get()

    @classmethod
    def example_space(cls) -> dict[str, Sequence[Any]]:
        return {"dtype": ("float32", "float16"), "rank": (3, 2, 4), "axes": (1, 2),
                "symbolic": (False, True), "affine": ("both", "gamma", "beta", "none"),
                "root": ("sqrt", "rsqrt", "reciprocal"),
                "square": ("power", "multiply", "square", "variance"),
                "centered": ("reused", "recomputed"), "mean_axes": ("trailing", "leading"),
                "eps": ("scalar", "vector", "variable"),
                "gamma": ("per_feature", "scalar", "full")}


def example_shape(rank: int, symbolic: bool) -> tuple:
    """``x``'s shape in the examples: ``(batch, [seq, [heads,]] 16)``, symbolic if asked."""
    static = {2: (4, 16), 3: (2, 5, 16), 4: (2, 3, 5, 16)}[rank]
    if not symbolic:
        return static
    names = ("n", "s", "h")[:rank - 1]
    return (*(tvm.tirx.Var(name, "int64") for name in names), static[-1])


# -- the expansion -----------------------------------------------------------------------------
class LayerNormExpand(RewriteRule):
    """Write ``layer_norm`` out in ops that ``relax.transform.Gradient`` differentiates."""

    name = "layernorm.expand"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x, self.gamma, self.beta = wildcard(), wildcard(), wildcard()
        self.norm = is_op("nn.layer_norm")(self.x, self.gamma, self.beta)
        self.pattern: DFPattern = self.norm

    def check(self, match: RuleMatch) -> Any:
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

    def rewrite(self, match: RuleMatch) -> Any:
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

    def example(self, dtype: str = "float32", rank: int = 3, axes: int = 1,
                symbolic: bool = False, known_rank: bool = True) -> tvm.IRModule:
        """``layer_norm(x, gamma, beta)`` over the last ``axes`` axes of a rank-``rank``
        ``x`` (``known_rank=False``: an ``x`` of unknown rank, refused)."""
        shape = example_shape(rank, symbolic)
        features = shape[rank - axes:]
        x_ty = (relax.TensorType(shape, dtype) if known_rank
                else relax.TensorType(ndim=-1, dtype=dtype))
        x = relax.Var("x", x_ty)
        g, b = (relax.Var(n, relax.TensorType(features, dtype)) for n in ("gamma", "beta"))
        return from_expr(relax.op.nn.layer_norm(x, g, b, axes=list(range(-axes, 0))))

    @classmethod
    def example_space(cls) -> dict[str, Sequence[Any]]:
        return {"dtype": ("float32", "float16", "float64"), "rank": (3, 2, 4),
                "axes": (1, 2), "symbolic": (False, True), "known_rank": (True, False)}


# -- composites --------------------------------------------------------------------------------
class LayerNormComposite(CompositeRule):
    """``layer_norm`` (optionally after a residual ``add``) as a pattern-table entry.

    Parameters
    ----------
    compiler : str
        Prefix of the composite name (the codegen that takes it).
    skip : bool
        ``False``: ``<compiler>.layer_norm``, the op alone (TVM's ``cutlass.layer_norm``
        and ``tensorrt.nn.layer_norm`` take it).  ``True``:
        ``<compiler>.add_layer_norm``, ``layer_norm(a + b, ...)`` where ``a`` and ``b``
        have the norm's input shape (a residual, onnxruntime's SkipLayerNormalization).
    """

    def __init__(self, compiler: str = "byoc", skip: bool = False):
        super().__init__(compiler)
        self.skip = bool(skip)
        self.x, self.gamma, self.beta = wildcard(), wildcard(), wildcard()
        self.residual, self.input = wildcard(), wildcard()
        self.add = is_op("add")(self.input, self.residual)
        self.norm = is_op("nn.layer_norm")(self.add if self.skip else self.x, self.gamma,
                                          self.beta)
        self.pattern: DFPattern = self.norm
        self.pattern_name = "add_layer_norm" if self.skip else "layer_norm"

    def check(self, match: RuleMatch) -> Any:
        """Accept a norm over the last axis, with gamma and beta (cutlass's conditions)."""
        norm = match.norm
        attrs = norm.attrs
        if not (bool(attrs.center) and bool(attrs.scale)):
            return reject("the layer_norm has center or scale off: the backends' kernels "
                          "apply gamma and beta", at=norm)
        ndim = type_of(norm).ndim
        axes = [int(a) for a in attrs.axes]
        if len(axes) != 1 or axes[0] % max(ndim, 1) != ndim - 1:
            return reject(f"the layer_norm normalises axes {axes} of a rank-{ndim} tensor: "
                          f"the backends' kernels take the last axis only", at=norm)
        if self.skip:
            out_shape = static_shape(type_of(match.var_of("add")))
            for role in ("input", "residual"):
                shape = static_shape(type_of(match[role]))
                if not _same_shape(shape, out_shape):
                    return reject(f"the add broadcasts its {role} of shape {shape} to "
                                  f"{out_shape}: a skip connection adds two tensors of one "
                                  f"shape", at=match[role])
        return True

    def example(self, dtype: str = "float32", symbolic: bool = False,
                axes: int = 1) -> tvm.IRModule:
        """``layer_norm`` over the last ``axes`` axes of ``(2, 5, 16)``, after ``x + r``
        for the skip variant (``axes=2``: refused)."""
        skip = self.skip
        shape = example_shape(3, symbolic)
        x = relax.Var("x", relax.TensorType(shape, dtype))
        r = relax.Var("r", relax.TensorType(shape, dtype))
        features = shape[3 - axes:]
        g, b = (relax.Var(n, relax.TensorType(features, dtype)) for n in ("gamma", "beta"))
        data = x + r if skip else x
        return from_expr(relax.op.nn.layer_norm(data, g, b, axes=list(range(-axes, 0))))

    @classmethod
    def example_space(cls) -> dict[str, Sequence[Any]]:
        return {"dtype": ("float32", "float16"), "symbolic": (False, True), "axes": (1, 2)}


def _same_shape(a: tuple | None, b: tuple | None) -> bool:
    """Two shapes proved equal (an undecidable symbolic comparison is not)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(dims_equal(p, q) is True for p, q in zip(a, b))


#: The rewrite rules of this file.
RULES = (LayerNormCollapse,)

#: Expand rules, for :data:`patternkit.patterns.EXPANSIONS` (never with the collapse).
EXPANSIONS = (LayerNormExpand,)

#: Pattern-table entries, the residual form first (a table's earlier entries win).
COMPOSITES = (LayerNormComposite(skip=True), LayerNormComposite())
