"""Batch normalisation written out elementwise, collapsed into one ``nn.batch_norm``.

Recognises ``gamma * (x - mean) / sqrt(var + eps) + beta`` and the spellings that
commutativity and re-association give (``(x - mean) * gamma / ...``,
``gamma / sqrt(...) * (x - mean)``, ``(x - mean) / sqrt(...) * gamma``), including the
form ``relax.transform.DecomposeOpsForInference`` produces from a real ``batch_norm``
(parameters passed through ``expand_dims``).

:class:`BatchnormCollapse` (``batchnorm.collapse``) produces
``R.nn.batch_norm(x, gamma, beta, mean, var, axis, epsilon, training=False)[0]`` with
per-channel ``(C,)`` parameters: an ``expand_dims`` is looked through, a constant is
reshaped at compile time, any other parameter gets an explicit ``reshape``.

Parameters may be shaped ``(C,)``, ``(C, 1, 1)`` or ``(1, C, 1, 1)`` (any shape with one
non-unit dimension that broadcasts onto one axis of ``x``); the axis is derived from it.

Deliberately not covered: a non-constant or non-scalar epsilon, parameters that vary
along more than one axis (that is not a per-channel batch norm), ``x - mean`` written as
``x + (-mean)``, and ``rsqrt``.  The rule does not claim a speed-up: the legalised
``batch_norm`` is slower on CPU than the elementwise chain; collapse it to hand batch
norms to a backend with a native kernel or to fold them into a convolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from patternkit.dpl import DFPattern, is_constant, is_op, wildcard
from patternkit.engine import DFPatternCallback, NodeMap, RewriteRule, reject
from patternkit.ir import (NotPerChannel, const_value, dtype_of, from_expr, is_tensor_constant,
                           per_channel_axis, static_shape, type_of)

_ROLES = ("gamma", "beta", "mean", "var")


class _Parameter:
    """A per-channel parameter that may arrive through ``expand_dims``."""

    def __init__(self) -> None:
        self.source = wildcard()
        self.expanded = is_op("relax.expand_dims")(self.source)
        self.pattern: DFPattern = self.expanded | self.source

    def broadcast_value(self, node_map: NodeMap) -> Any:
        """The tensor as it broadcasts against ``x``."""
        if self.expanded in node_map:
            return node_map.var(self.expanded)
        return node_map[self.source][0]

    def channel_source(self, node_map: NodeMap) -> Any:
        """The tensor before ``expand_dims`` (the parameter as the user wrote it)."""
        return node_map[self.source][0]


@dataclass(frozen=True)
class CollapsePlan:
    """What the check found, for the callback: the channel axis of ``x`` and epsilon."""

    axis: int
    channels: int
    epsilon: float


class BatchnormCollapse(DFPatternCallback):
    """Collapse elementwise batch norm into ``nn.batch_norm(..., training=False)[0]``."""

    name = "batchnorm.collapse"

    def __init__(self, require_type: bool = False, rewrite_once: bool = False):
        super().__init__(require_type=require_type, rewrite_once=rewrite_once)
        self.x = wildcard()
        self.params = {role: _Parameter() for role in _ROLES}
        self.eps = is_constant()
        gamma, beta, mean, var = (self.params[r].pattern for r in _ROLES)
        self.pattern = gamma * (self.x - mean) / is_op("sqrt")(var + self.eps) + beta

    def roles(self) -> dict[str, DFPattern]:
        return {"x": self.x, "eps": self.eps,
                **{role: param.source for role, param in self.params.items()}}

    def check(self, pre: Any, node_map: NodeMap) -> Any:
        """A :class:`CollapsePlan` when the match is a per-channel batch norm of ``x``."""
        x_ty = type_of(node_map[self.x][0])
        x_shape = static_shape(x_ty)
        if x_shape is None:
            return reject("x has no known shape")
        dtype = dtype_of(x_ty)
        eps_value = const_value(node_map[self.eps][0])
        if eps_value.size != 1:
            return reject(f"epsilon must be a scalar constant, found shape {eps_value.shape}")
        axes = {}
        for role in _ROLES:
            ty = type_of(self.params[role].broadcast_value(node_map))
            if dtype_of(ty) != dtype:
                return reject(f"{role} has dtype {dtype_of(ty)}, x has {dtype}")
            try:
                axes[role] = per_channel_axis(static_shape(ty), x_shape, name=role)
            except NotPerChannel as why:
                return reject(str(why))
        distinct = set(axes.values())
        if len(distinct) != 1:
            return reject(f"parameters broadcast along different axes of x: {axes}")
        axis = distinct.pop()
        return CollapsePlan(axis, x_shape[axis], float(eps_value.reshape(())))

    def callback(self, pre: Any, post: Any, node_map: NodeMap) -> Any:
        plan: CollapsePlan = node_map.plan
        args = [self._per_channel(role, node_map, plan.channels) for role in _ROLES]
        bn = relax.op.nn.batch_norm(node_map[self.x][0], *args, axis=plan.axis,
                                    epsilon=plan.epsilon, training=False)
        return relax.TupleGetItem(bn, 0)

    def _per_channel(self, role: str, node_map: NodeMap, channels: int) -> Any:
        param = self.params[role]
        source = param.channel_source(node_map)
        if param.expanded in node_map and static_shape(type_of(source)) == (channels,):
            return source
        value = param.broadcast_value(node_map)
        if is_tensor_constant(value):
            return relax.const(const_value(value).reshape(channels))
        if static_shape(type_of(value)) == (channels,):
            return value
        return relax.op.reshape(value, (channels,))

    # -- self-check example (used by tests and `patternkit verify`) ---------------------------
    @staticmethod
    def example(channels: int = 3, param_shape: str = "C11") -> tvm.IRModule:
        """``gamma * (x - mean) / sqrt(var + eps) + beta`` on ``x: (2, C, 4, 4)``."""
        shape = {"C": (channels,), "C11": (channels, 1, 1), "1C11": (1, channels, 1, 1)}[param_shape]
        x = relax.Var("x", relax.TensorType((2, channels, 4, 4), "float32"))
        gamma, beta, mean, var = (relax.Var(n, relax.TensorType(shape, "float32")) for n in _ROLES)
        if param_shape == "C":  # (C,) broadcasts onto the last axis: use NHWC
            x = relax.Var("x", relax.TensorType((2, 4, 4, channels), "float32"))
        eps = relax.const(1e-5, "float32")
        return from_expr(gamma * (x - mean) / relax.op.sqrt(var + eps) + beta)


#: The rule's name before the rule model (kept: the README and notebooks use it).
BatchnormCallback = BatchnormCollapse

#: The rules of this file, in priority order.
RULES = (BatchnormCollapse,)


@dataclass(frozen=True)
class ExpandPlan:
    """What the check found: the rank of ``x``, to reshape parameters along ``axis``."""

    rank: int
    channels: Any  # the length of x's channel axis: an int or a symbolic PrimExpr


class BatchnormExpand(RewriteRule):
    """Write ``nn.batch_norm`` out in ops that ``relax.transform.Gradient`` differentiates.

    ``batchnorm.expand`` is the inverse direction of :class:`BatchnormCollapse`, for
    training graphs: Relax 0.27 has no gradient for ``nn.batch_norm``.  Each call keeps its
    own semantics, read from its attributes: ``training=False`` normalises with the moving
    statistics and returns them unchanged; ``training=True`` normalises with the batch's
    statistics (biased variance, as the legalised op) and returns the moving statistics
    updated with ``momentum``.  ``center`` and ``scale`` are respected.  (TVM's
    ``DecomposeOpsForTraining`` uses batch statistics for every call, whatever its flag.)

    The replacement is the tuple ``(out, moving_mean', moving_var')`` the op returns, so
    every reader of the call's fields keeps reading the same values.
    """

    name = "batchnorm.expand"

    def __init__(self) -> None:
        super().__init__()
        self.bn = is_op("relax.nn.batch_norm")(wildcard(), wildcard(), wildcard(), wildcard(),
                                               wildcard())
        self.pattern = self.bn

    def roles(self) -> dict[str, DFPattern]:
        return {"bn": self.bn}

    def check(self, match: Any) -> Any:
        """An :class:`ExpandPlan` when the shape of ``x`` is known (static or symbolic)."""
        x = match.bn.args[0]
        shape = getattr(type_of(x), "shape", None)
        if not isinstance(shape, relax.ShapeExpr):
            return reject("x has no known shape", at=x)
        rank = len(shape.values)
        return ExpandPlan(rank, shape.values[int(match.bn.attrs.axis) % rank])

    def rewrite(self, match: Any) -> Any:
        call = match.bn
        x, gamma, beta, moving_mean, moving_var = call.args
        attrs, rank = call.attrs, match.plan.rank
        axis = int(attrs.axis) % rank
        dtype = dtype_of(type_of(x))
        others = [i for i in range(rank) if i != axis]
        broadcast = [match.plan.channels if i == axis else 1 for i in range(rank)]
        channels = [match.plan.channels]

        def along_axis(param: Any) -> Any:
            return relax.op.reshape(param, broadcast)

        if bool(attrs.training):
            mean = relax.op.mean(x, axis=others, keepdims=True)
            centred = relax.op.subtract(x, mean)
            var = relax.op.mean(relax.op.multiply(centred, centred), axis=others, keepdims=True)
            momentum = relax.const(float(attrs.momentum), dtype)
            keep = relax.const(1.0 - float(attrs.momentum), dtype)
            new_mean = keep * moving_mean + momentum * relax.op.reshape(mean, channels)
            new_var = keep * moving_var + momentum * relax.op.reshape(var, channels)
        else:
            centred = relax.op.subtract(x, along_axis(moving_mean))
            var = along_axis(moving_var)
            new_mean, new_var = moving_mean, moving_var
        eps = relax.const(float(attrs.epsilon), dtype)
        out = relax.op.divide(centred, relax.op.sqrt(relax.op.add(var, eps)))
        if bool(attrs.scale):
            out = relax.op.multiply(out, along_axis(gamma))
        if bool(attrs.center):
            out = relax.op.add(out, along_axis(beta))
        return relax.Tuple([out, new_mean, new_var])

    @staticmethod
    def example(training: bool = False, axis: int = 1, dtype: str = "float32") -> tvm.IRModule:
        """One ``batch_norm`` of ``x: (2, 3, 4, 4)`` (``axis=3``: ``(2, 4, 4, 3)``), all outputs read."""
        shape = (2, 3, 4, 4) if axis == 1 else (2, 4, 4, 3)
        x = relax.Var("x", relax.TensorType(shape, dtype))
        params = [relax.Var(n, relax.TensorType((3,), dtype)) for n in _ROLES]
        bn = relax.op.nn.batch_norm(x, *params, axis=axis, epsilon=1e-5, training=training,
                                    momentum=0.1)
        return from_expr(bn)

    @classmethod
    def example_space(cls) -> dict[str, Any]:
        return {"training": (False, True), "axis": (1, 3), "dtype": ("float32", "float16")}


#: The expand rules of this file (for training graphs; never mixed with ``RULES``).
EXPANSIONS = (BatchnormExpand,)
