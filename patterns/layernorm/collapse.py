"""``layernorm.collapse``: a written-out layer norm collapsed into ``R.nn.layer_norm``.

The pattern reads as the formula (mean, centred input, variance, epsilon, optional gamma
and beta); the check runs the shared guards (:mod:`.guards`) and returns a
:class:`LayerNormPlan` that the rewrite reads.  The family's docstring lists the forms.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import tvm
from tvm import relax

from patternkit.dpl import DFPattern, alt, divide_by_sqrt, is_op, square, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import var_name

from .examples import written_out
from .guards import (
    LAYER_NORM_DTYPES,
    NORM_DTYPES,
    NORM_IN_FLOAT32,
    as_feature_tensor,
    log_float32_norm,
    norm_compute_dtype,
    per_feature,
    reduced_trailing_axes,
    same_as_mean,
    scalar_epsilon,
    shape_and_dtype,
    widened,
    widened_dtype,
)

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerNormPlan:
    """What the check found: the normalised axes (``-k .. -1``), epsilon, their dims."""

    axes: tuple[int, ...]
    epsilon: float
    features: tuple
    dtype: str
    reshape: frozenset = frozenset()  # roles with leading unit dims to reshape away
    widened: str | None = None  # the dtype a float16 norm's statistics ran in, if wider


def _affine_roles(match: RoleMatch) -> tuple[str, ...]:
    """The affine parameters the matched form applies: ``gamma`` when it scales,
    ``beta`` when it shifts (read from the ``gamma`` and ``beta`` alternatives' tags).
    """
    return tuple(role for role, form in (("gamma", "scaled"), ("beta", "shifted"))
                 if match.tag(role) == form)


class LayerNormCollapse(RewriteRule):
    """Collapse a written-out layer norm (mean, variance, eps, [gamma], [beta]) into one op."""

    name = "layernorm.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.mean = is_op("mean")(self.x)
        # Two patterns for x - mean, and two for the mean itself: the same binding read
        # twice matches both, and so does a mean (or x - mean) computed once for the
        # variance and once for the numerator, as the ONNX exporters write it.  The
        # check proves the two means equal (same x, same trailing axes, either spelling).
        self.centering_mean = is_op("mean")(self.x)
        centered = self.x - self.centering_mean
        self.variance_mean = is_op("mean")(square(centered))
        self.variance_op = is_op("variance")(self.x)
        self.eps = wildcard()
        reduced = alt(tag="variance", mean=self.variance_mean, op=self.variance_op)
        # keepdims=False plus a reshape back to the mean's shape (the dynamo exporter).
        self.variance_reshape = is_op("reshape")(reduced, wildcard())
        # The variance taken in a wider dtype and cast back (the dynamo exporter's float16
        # var over several axes: x cast to float32, centred, squared, averaged).
        self.wide_x = is_op("astype")(self.x)
        self.wide_mean = is_op("mean")(self.wide_x)
        self.wide_variance = is_op("mean")(square(self.wide_x - self.wide_mean))
        self.wide_variance_reshape = is_op("reshape")(self.wide_variance, wildcard())
        self.variance_cast = is_op("astype")(alt(tag="wide_keepdims", kept=self.wide_variance,
                                                 reshaped=self.wide_variance_reshape))
        variance = alt(tag="keepdims", kept=reduced, reshaped=self.variance_reshape,
                       widened=self.variance_cast)
        plain = divide_by_sqrt(self.x - self.mean, variance + self.eps)
        # The whole normalisation in a wider dtype between casts of x - mean (the
        # TorchScript exporter's float16 LayerNorm below opset 17 runs it in float64).
        self.wide_centred = is_op("astype")(self.x - self.mean)
        self.wide_norm_variance = is_op("mean")(square(self.wide_centred))
        self.normalisation_cast = is_op("astype")(
            divide_by_sqrt(self.wide_centred, self.wide_norm_variance + self.eps))
        normalised = alt(tag="normalisation", plain=plain, widened=self.normalisation_cast)
        self.gamma, self.beta = wildcard(), wildcard()
        self.scaled = normalised * self.gamma
        scaled = alt(tag="gamma", scaled=self.scaled, plain=normalised)
        self.shifted = scaled + self.beta
        self.pattern: DFPattern = alt(tag="beta", shifted=self.shifted, plain=scaled)

    def check(self, match: RoleMatch) -> Any:
        """A :class:`LayerNormPlan` when the match normalises trailing axes of ``x``."""
        shape, dtype = shape_and_dtype(match.x)
        if dtype not in NORM_DTYPES:
            return reject(f"x has dtype {dtype}: TVM's layer_norm computes "
                          f"{' and '.join(LAYER_NORM_DTYPES)} only (and "
                          f"{' and '.join(NORM_IN_FLOAT32)} in float32 between casts)",
                          at=match.x)
        ndim = len(shape)
        k = reduced_trailing_axes(match.mean, ndim, "the mean")
        widened = None
        if match.tag("normalisation") == "widened":
            widened = widened_dtype(match.wide_centred, match.normalisation_cast,
                                    "the normalisation")
            variance, reshaped, centring = match.wide_norm_variance, False, None
        elif match.tag("keepdims") == "widened":
            widened = widened_dtype(match.wide_x, match.variance_cast, "the variance")
            variance, centring = match.wide_variance, match.wide_mean
            reshaped = match.tag("wide_keepdims") == "reshaped"
        else:
            variance = (match.variance_mean if match.tag("variance") == "mean"
                        else match.variance_op)
            reshaped = match.tag("keepdims") == "reshaped"
            centring = (match.centering_mean if match.tag("variance") == "mean"
                        and match.centering_mean is not match.mean else None)
        k_var = reduced_trailing_axes(variance, ndim, "the variance", reshaped=reshaped)
        if k_var != k:
            return reject(f"the mean reduces the last {k} axes of x but the variance the "
                          f"last {k_var}", at=variance)
        if reshaped:
            same_as_mean(match.wide_variance_reshape if widened else match.variance_reshape,
                         match.mean, "the variance")
        if centring is not None:
            k_centre = reduced_trailing_axes(centring, ndim, "the centring mean")
            if k_centre != k:
                return reject(f"the variance centres x with a mean over its last {k_centre} "
                              f"axes, the numerator with one over its last {k}: not one "
                              f"mean computed twice", at=centring)
        epsilon = scalar_epsilon(match.eps, ndim)
        reshape = frozenset(role for role in _affine_roles(match)
                            if per_feature(match[role], shape, k, dtype, role))
        return LayerNormPlan(tuple(range(-k, 0)), epsilon, shape[ndim - k:], dtype, reshape,
                             widened)

    def rewrite(self, match: RoleMatch) -> Any:
        """One ``nn.layer_norm`` over the plan's axes; a missing gamma or beta becomes ones or
        zeros.
        """
        plan: LayerNormPlan = match.plan
        if plan.widened is not None:
            cast = ("normalisation_cast" if match.tag("normalisation") == "widened"
                    else "variance_cast")
            at = match.var_of(cast)  # the match's root has no binding of its own here
            _LOG.info("%s: the norm's statistics at %s ran in %s between casts of %s x; "
                      "R.nn.layer_norm computes them in float32 and rounds once to %s, "
                      "within %s rounding of the written-out form", self.name,
                      var_name(at) if isinstance(at, relax.Var) else "its result",
                      plan.widened, plan.dtype, plan.dtype, plan.dtype)
        given = _affine_roles(match)
        compute = norm_compute_dtype(plan.dtype)
        gamma = (widened(as_feature_tensor(match.gamma, plan.features, "gamma" in plan.reshape),
                         compute)
                 if "gamma" in given else relax.op.ones(plan.features, compute))
        beta = (widened(as_feature_tensor(match.beta, plan.features, "beta" in plan.reshape),
                        compute)
                if "beta" in given else relax.op.zeros(plan.features, compute))
        norm = relax.op.nn.layer_norm(widened(match.x, compute), gamma, beta,
                                      axes=list(plan.axes), epsilon=plan.epsilon)
        if compute == plan.dtype:
            return norm
        log_float32_norm(_LOG, self.name, "layer_norm", match.var_of("mean"), plan.dtype)
        return relax.op.astype(norm, plan.dtype)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A written-out layer norm: :func:`~.examples.written_out` with ``knobs``."""
        return written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """The spellings of a layer norm met in exports (root, square, affine parameters,
        epsilon, axes), each product a real form.
        """
        return {"dtype": ("float32", "float16", "bfloat16"), "rank": (3, 2, 4), "axes": (1, 2),
                "symbolic": (False, True), "affine": ("both", "gamma", "beta", "none"),
                "root": ("sqrt", "rsqrt", "reciprocal"),
                "square": ("power", "multiply", "square", "variance"),
                "centered": ("reused", "recomputed"), "mean_axes": ("trailing", "leading"),
                "eps": ("scalar", "vector", "variable"),
                "gamma": ("per_feature", "scalar", "full"), "mean": ("once", "twice"),
                "variance_keepdims": ("kept", "reshaped"),
                "widened": ("none", "variance", "normalisation")}
