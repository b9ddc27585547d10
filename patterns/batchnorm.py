"""Batch normalisation written out elementwise, collapsed into one ``nn.batch_norm``.

Recognises ``gamma * (x - mean) / sqrt(var + eps) + beta`` and the spellings that
commutativity and re-association give (``(x - mean) * gamma / ...``,
``gamma / sqrt(...) * (x - mean)``, ``(x - mean) / sqrt(...) * gamma``), including the
form ``relax.transform.DecomposeOpsForInference`` produces from a real ``batch_norm``
(parameters passed through ``expand_dims``).

Produces ``R.nn.batch_norm(x, gamma, beta, mean, var, axis, epsilon, training=False)[0]``
with per-channel ``(C,)`` parameters: an ``expand_dims`` is looked through, a constant is
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

from typing import Any

import tvm
from tvm import relax

from patternkit.engine import DFPatternCallback, NodeMap, reject
from patternkit.ir import compat as C
from patternkit.dpl import DFPattern, is_constant, is_op, wildcard

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


class BatchnormCallback(DFPatternCallback):
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

    # -- check -----------------------------------------------------------------------------
    def check(self, pre: Any, node_map: NodeMap) -> Any:
        try:
            self._plan(node_map)
        except _NotBatchnorm as why:
            return reject(str(why))
        return True

    def callback(self, pre: Any, post: Any, node_map: NodeMap) -> Any:
        plan = self._plan(node_map)
        x = node_map[self.x][0]
        args = [self._per_channel(role, node_map, plan["channels"]) for role in _ROLES]
        bn = relax.op.nn.batch_norm(x, *args, axis=plan["axis"], epsilon=plan["epsilon"],
                                    training=False)
        return relax.TupleGetItem(bn, 0)

    # -- analysis ----------------------------------------------------------------------------
    def _plan(self, node_map: NodeMap) -> dict[str, Any]:
        x = node_map[self.x][0]
        x_ty = C.type_of(x)
        x_shape = C.static_shape(x_ty)
        if x_shape is None:
            raise _NotBatchnorm("x has no known shape")
        dtype = C.dtype_of(x_ty)
        eps_value = C.const_to_numpy(node_map[self.eps][0])
        if eps_value.size != 1:
            raise _NotBatchnorm(f"epsilon must be a scalar constant, found shape {eps_value.shape}")
        axes = {}
        for role in _ROLES:
            value = self.params[role].broadcast_value(node_map)
            ty = C.type_of(value)
            if C.dtype_of(ty) != dtype:
                raise _NotBatchnorm(f"{role} has dtype {C.dtype_of(ty)}, x has {dtype}")
            axes[role] = _channel_axis(role, C.static_shape(ty), x_shape)
        distinct = set(axes.values())
        if len(distinct) != 1:
            raise _NotBatchnorm(f"parameters broadcast along different axes of x: {axes}")
        axis = distinct.pop()
        return {"axis": axis, "channels": x_shape[axis], "epsilon": float(eps_value.reshape(()))}

    def _per_channel(self, role: str, node_map: NodeMap, channels: int) -> Any:
        param = self.params[role]
        source = param.channel_source(node_map)
        if param.expanded in node_map and C.static_shape(C.type_of(source)) == (channels,):
            return source
        value = param.broadcast_value(node_map)
        if C.is_tensor_constant(value):
            return relax.const(C.const_to_numpy(value).reshape(channels))
        if C.static_shape(C.type_of(value)) == (channels,):
            return value
        return relax.op.reshape(value, (channels,))

    # -- self-check example (used by tests and `patternkit verify`) ---------------------------
    @staticmethod
    def example(channels: int = 3, param_shape: str = "C11") -> tvm.IRModule:
        """``gamma * (x - mean) / sqrt(var + eps) + beta`` on ``x: (2, C, 4, 4)``."""
        from patternkit.ir import from_expr

        shape = {"C": (channels,), "C11": (channels, 1, 1), "1C11": (1, channels, 1, 1)}[param_shape]
        x = relax.Var("x", relax.TensorType((2, channels, 4, 4), "float32"))
        gamma, beta, mean, var = (relax.Var(n, relax.TensorType(shape, "float32")) for n in _ROLES)
        if param_shape == "C":  # (C,) broadcasts onto the last axis: use NHWC
            x = relax.Var("x", relax.TensorType((2, 4, 4, channels), "float32"))
        eps = relax.const(1e-5, "float32")
        return from_expr(gamma * (x - mean) / relax.op.sqrt(var + eps) + beta)


class _NotBatchnorm(Exception):
    """Internal: the match is not a per-channel batch norm (message = the reason)."""


def _channel_axis(role: str, shape: tuple | None, x_shape: tuple) -> int:
    """The axis of ``x`` a parameter of ``shape`` varies along, or raise with the reason."""
    if shape is None or any(not isinstance(d, int) for d in shape):
        raise _NotBatchnorm(f"{role} has no static shape")
    n = len(x_shape)
    if len(shape) > n:
        raise _NotBatchnorm(f"{role} has more dimensions ({len(shape)}) than x ({n})")
    padded = (1,) * (n - len(shape)) + tuple(shape)
    varying = [i for i, d in enumerate(padded) if d != 1]
    if len(varying) != 1:
        raise _NotBatchnorm(f"{role} has shape {tuple(shape)}: a per-channel parameter varies "
                            f"along exactly one axis of x {tuple(x_shape)}")
    axis = varying[0]
    if padded[axis] != x_shape[axis]:
        raise _NotBatchnorm(f"{role} has {padded[axis]} channels on axis {axis}, "
                            f"x has {x_shape[axis]}")
    return axis


#: The rules of this file, in priority order.
RULES = (BatchnormCallback,)
