"""Folding an inference ``batch_norm`` into the constant weight and bias of a matmul.

A ``BatchNorm1d`` after an ``nn.Linear`` (LeViT's ``LinearNorm``, a classifier head) is a
per-feature affine map after a linear one: :class:`BatchnormFoldIntoMatmul`
(``matmul.fold_batchnorm``) scales the weight's output features and adds the folded bias,
so the batch norm is gone and the matmul composites see a matmul and a bias add.  It is
``conv.fold_batchnorm`` for the matmul, with the shapes the torch importer writes:

* the weight a constant ``(in, out)``, or ``permute_dims`` of an ``(out, in)`` constant
  (``nn.Linear``), either possibly ``broadcast_to`` a batch ``(.., in, out)`` (``nn.Linear``
  on a 3-D input as the torch importer writes it in LeViT's attention subsample: a batched
  matmul of two ``broadcast_to``); the weight keeps its output features on its last axis,
  so scaling them before the broadcast scales them after it;
* an optional bias add, in either operand order, of a constant that is per feature
  (varies along the product's last axis only) or one value;
* an optional ``astype`` straight back to the weight's dtype (a float16 matmul
  accumulated in float32, as ``ToMixedPrecision`` writes it);
* up to two ``reshape`` between the product and the batch norm, each keeping the
  features on the last axis (LeViT: ``reshape`` back to 3-D after the linear layer, then
  ``flatten(0, 1)`` for the batch norm);
* the batch norm over the last axis, which holds the features.

The constants are folded in float64 and rounded once.  Not covered: a weight that is a
function parameter (bind it with ``relax.transform.BindParams`` first), a batched
(rank > 2) weight constant, a broadcast that widens the weight's output features, a batch
norm in training mode, reshapes that move the features
off the last axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import alt, is_constant, is_op, is_tuple_get_item, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import (
    NotPerChannel,
    const_value,
    dtype_of,
    machine_epsilon,
    per_channel_axis,
    prove_equal,
    static_shape,
    type_of,
)

from .examples import linear_batch_norm


@dataclass(frozen=True)
class MatmulFoldPlan:
    """What the check found, for the rewrite: the number of output features."""

    features: int


class BatchnormFoldIntoMatmul(RewriteRule):
    """Fold an inference ``batch_norm`` over a matmul's features into its weight and bias."""

    name = "matmul.fold_batchnorm"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.weight = is_constant()
        self.permuted_weight = is_op("permute_dims")(self.weight)
        weight = alt(tag="weight_form", transposed=self.permuted_weight, direct=self.weight)
        self.broadcast_weight = is_op("broadcast_to")(weight, wildcard())
        self.matmul = is_op("matmul")(self.x, alt(tag="batch", broadcast=self.broadcast_weight,
                                                  plain=weight))
        self.cast_back = is_op("astype")(self.matmul)
        product = alt(tag="cast", cast_back=self.cast_back, direct=self.matmul)
        self.bias = is_constant()
        self.bias_after = is_op("add")(product, self.bias)
        self.bias_before = is_op("add")(self.bias, product)
        linear = alt(tag="bias", after=self.bias_after, before=self.bias_before,
                     unbiased=product)
        self.reshaped = is_op("reshape")(linear, wildcard())
        self.reshaped_again = is_op("reshape")(self.reshaped, wildcard())
        self.gamma, self.beta, self.mean, self.var = (is_constant() for _ in range(4))
        self.bn = is_op("nn.batch_norm")(
            alt(tag="reshapes", two=self.reshaped_again, one=self.reshaped, none=linear),
            self.gamma, self.beta, self.mean, self.var)
        self.pattern = is_tuple_get_item(self.bn, 0)

    def check(self, match: RoleMatch) -> Any:
        """A :class:`MatmulFoldPlan` when the batch norm normalises the matmul's features."""
        bn = match.bn
        if bool(bn.attrs.training):
            return reject("batch_norm is in training mode (batch statistics); only an "
                          "inference batch norm can be folded", at=bn)
        weight_ty = type_of(match.weight)
        weight_dtype = dtype_of(weight_ty)
        if machine_epsilon(weight_dtype) is None:
            return reject(f"weight dtype {weight_dtype} is not floating point", at=match.weight)
        weight_shape = static_shape(weight_ty)
        assert weight_shape is not None  # a constant's shape is static
        if len(weight_shape) != 2:
            return reject(f"the weight has rank {len(weight_shape)}: only a 2-D weight has "
                          f"one set of output features to scale", at=match.weight)
        transposed = match.tag("weight_form") == "transposed"
        if transposed:
            axes = match.permuted_weight.attrs.axes
            if axes is not None and [int(a) for a in axes] != [1, 0]:
                return reject(f"permute_dims axes {[int(a) for a in axes]} on the 2-D weight "
                              f"are no transpose", at=match.permuted_weight)
        features = int(weight_shape[0] if transposed else weight_shape[1])
        if match.tag("batch") == "broadcast":
            batched = static_shape(type_of(match.var_of("broadcast_weight"))) or ()
            if not batched or not prove_equal(batched[-1], features):
                return reject(f"the broadcast_to takes the weight's {features} output "
                              f"features to {_shape_text(batched)}: only a broadcast that "
                              f"keeps them on the last axis scales with them",
                              at=match.broadcast_weight)
        if match.tag("cast") == "cast_back":
            cast = match.cast_back
            if str(cast.attrs.dtype) != str(weight_dtype):
                return reject(f"the matmul's result is cast to {cast.attrs.dtype}, not back to "
                              f"its weight's {weight_dtype}: the batch norm does not run in "
                              f"the matmul's dtype", at=cast)
        bn_shape = static_shape(type_of(bn.args[0])) or ()
        axis = int(bn.attrs.axis)
        if axis % max(len(bn_shape), 1) != len(bn_shape) - 1:
            return reject(f"batch_norm axis {axis} is not the last axis of its input "
                          f"{_shape_text(bn_shape)}, which holds the matmul's features",
                          at=bn)
        for role in ("reshaped", "reshaped_again"):
            if role in match:
                shape = static_shape(type_of(match.var_of(role)))
                if not shape or not prove_equal(shape[-1], features):
                    return reject(f"the reshape to {_shape_text(shape)} does not keep the "
                                  f"matmul's {features} features on its last axis",
                                  at=match[role])
        if match.tag("bias") != "unbiased":
            problem = _not_per_feature(match)
            if problem is not None:
                return reject(problem, at=match.bias)
        return MatmulFoldPlan(features)

    def rewrite(self, match: RoleMatch) -> Any:
        """The matmul with its weight scaled along the output features and a bias added
        (folded in float64, rounded to the weight's and the product's dtypes), then the
        same reshapes: the batch norm is gone.
        """
        plan: MatmulFoldPlan = match.plan
        bn, matmul = match.bn, match.matmul
        features = plan.features

        def per_feature(pattern):
            return const_value(match[pattern]).astype("float64").reshape(features)

        gamma = per_feature(self.gamma) if bool(bn.attrs.scale) else np.ones(features)
        beta = per_feature(self.beta) if bool(bn.attrs.center) else np.zeros(features)
        mean, var = per_feature(self.mean), per_feature(self.var)
        scale = gamma / np.sqrt(var + float(bn.attrs.epsilon))
        bias = np.zeros(features)
        if match.tag("bias") != "unbiased":  # per feature, or one value for every feature
            values = const_value(match.bias).astype("float64").reshape(-1)
            bias = np.broadcast_to(values, (features,))
        weight = const_value(match.weight)
        transposed = match.tag("weight_form") == "transposed"
        scaled = weight.astype("float64") * (scale.reshape(-1, 1) if transposed else scale)
        rhs: relax.Expr = relax.const(scaled.astype(weight.dtype))
        if transposed:
            rhs = relax.op.permute_dims(rhs, [1, 0])
        if match.tag("batch") == "broadcast":
            rhs = relax.op.broadcast_to(rhs, match.broadcast_weight.args[1])
        out: relax.Expr = relax.Call(matmul.op, [match.x, rhs], matmul.attrs)
        out_dtype = dtype_of(type_of(bn.args[0]))
        if match.tag("cast") == "cast_back":
            out = relax.op.astype(out, out_dtype)
        out = relax.op.add(out, relax.const(((bias - mean) * scale + beta).astype(out_dtype)))
        for role in ("reshaped", "reshaped_again"):
            if role in match:
                out = relax.op.reshape(out, match[role].args[1])
        return out

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A linear layer and a batch norm: :func:`~.examples.linear_batch_norm`."""
        return linear_batch_norm(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """LeViT's reshapes, a flat head and LeViT's batched matmul of a broadcast weight
        (and, an edge, a broadcast that widens one output feature), both weight forms,
        every bias spelling (a full tensor among them), training mode, a batch norm over
        the rows, reshapes that regroup the features, the float dtypes with and without a
        float32 accumulation, a symbolic batch.
        """
        return {"form": ("levit", "flat", "batched", "batched_widened"),
                "transposed": (True, False),
                "bias": ("none", "feature", "feature_first", "scalar", "full"),
                "training": (False, True), "bn_axis": ("feature", "rows"),
                "reshape": ("keep", "regroup"), "dtype": ("float32", "float16", "bfloat16"),
                "accumulate": ("same", "cast_back"), "batch": (2, "n"), "seed": (0, 1)}


def _shape_text(shape: Any) -> str:
    return "(" + ", ".join(str(d) for d in shape or ()) + ")"


def _not_per_feature(match: RoleMatch) -> str | None:
    """Why the added constant is not one bias per feature (or one value), or ``None``."""
    bias_shape = static_shape(type_of(match.bias))
    out_shape = static_shape(type_of(match.var_of("bias_after" if match.tag("bias") == "after"
                                                  else "bias_before")))
    assert bias_shape is not None and out_shape is not None  # a constant; an add of it
    if all(prove_equal(d, 1) for d in bias_shape):
        return None
    try:
        axis = per_channel_axis(bias_shape, out_shape, name="the matmul bias",
                                of="the matmul output")
    except NotPerChannel as why:
        return str(why)
    if axis != len(out_shape) - 1:
        return (f"the matmul bias varies along axis {axis} of the matmul output "
                f"{_shape_text(out_shape)}, not along its features (the last axis)")
    return None
