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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, is_constant, is_op, wildcard
from patternkit.engine import NoSuchExample, RewriteRule, RoleMatch, reject
from patternkit.ir import (
    NotPerChannel,
    const_value,
    dtype_of,
    from_expr,
    is_tensor_constant,
    per_channel_axis,
    same_shape,
    static_shape,
    type_of,
)

_ROLES = ("gamma", "beta", "mean", "var")


class _Parameter:
    """A per-channel parameter that may arrive through ``expand_dims``."""

    def __init__(self) -> None:
        self.source = wildcard()
        self.expanded = is_op("relax.expand_dims")(self.source)
        self.pattern: DFPattern = self.expanded | self.source

    def broadcast_value(self, match: RoleMatch) -> Any:
        """The tensor as it broadcasts against ``x``."""
        if self.expanded in match:
            return match.var_of(self.expanded)
        return match[self.source]

    def channel_source(self, match: RoleMatch) -> Any:
        """The tensor before ``expand_dims`` (the parameter as the user wrote it)."""
        return match[self.source]


@dataclass(frozen=True)
class CollapsePlan:
    """What the check found, for the rewrite: the channel axis of ``x`` and epsilon.

    ``channels`` is ``x``'s size on that axis: an int, or a PrimExpr for a symbolic one.
    """

    axis: int
    channels: Any
    epsilon: float


class BatchnormCollapse(RewriteRule):
    """Collapse elementwise batch norm into ``nn.batch_norm(..., training=False)[0]``."""

    name = "batchnorm.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.params = {role: _Parameter() for role in _ROLES}
        self.eps = is_constant()
        gamma, beta, mean, var = (self.params[r].pattern for r in _ROLES)
        self.pattern = gamma * (self.x - mean) / is_op("sqrt")(var + self.eps) + beta

    def roles(self) -> dict[str, DFPattern]:
        """The input, epsilon and the four parameters, each by the node it is read from."""
        return {"x": self.x, "eps": self.eps,
                **{role: param.source for role, param in self.params.items()}}

    def check(self, match: RoleMatch) -> Any:
        """A :class:`CollapsePlan` when the match is a per-channel batch norm of ``x``."""
        x_ty = type_of(match.x)
        x_shape = static_shape(x_ty)
        if x_shape is None:
            return reject("x has no known shape", at=match.x)
        dtype = dtype_of(x_ty)
        eps_value = const_value(match.eps)
        if eps_value.size != 1:
            return reject(f"epsilon must be a scalar constant, found shape {eps_value.shape}",
                          at=match.eps)
        axes = {}
        for role in _ROLES:
            value = self.params[role].broadcast_value(match)
            ty = type_of(value)
            if dtype_of(ty) != dtype:
                return reject(f"{role} has dtype {dtype_of(ty)}, x has {dtype}", at=value)
            try:
                axes[role] = per_channel_axis(static_shape(ty), x_shape, name=role)
            except NotPerChannel as why:
                return reject(str(why), at=value)
        if len(set(axes.values())) != 1:
            odd = next(role for role in _ROLES if axes[role] != axes["gamma"])
            return reject(f"parameters broadcast along different axes of x: {axes}",
                          at=self.params[odd].broadcast_value(match))
        axis = axes["gamma"]
        return CollapsePlan(axis, x_shape[axis], float(eps_value.reshape(())))

    def rewrite(self, match: RoleMatch) -> Any:
        """One inference-mode ``nn.batch_norm`` of ``x`` on the plan's axis, its first output."""
        plan: CollapsePlan = match.plan
        args = [self._per_channel(role, match, plan.channels) for role in _ROLES]
        bn = relax.op.nn.batch_norm(match.x, *args, axis=plan.axis,
                                    epsilon=plan.epsilon, training=False)
        return relax.TupleGetItem(bn, 0)

    def _per_channel(self, role: str, match: RoleMatch, channels: int) -> Any:
        param = self.params[role]
        source = param.channel_source(match)
        if param.expanded in match and same_shape(static_shape(type_of(source)), (channels,)):
            return source
        value = param.broadcast_value(match)
        if is_tensor_constant(value):  # the check proved its channel count is x's: an int
            return relax.const(const_value(value).reshape(int(channels)))
        if same_shape(static_shape(type_of(value)), (channels,)):
            return value
        return relax.op.reshape(value, (channels,))

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A written-out batch norm: :func:`written_out` with ``knobs``."""
        return written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Layouts and ranks, parameter spellings that broadcast along other axes, channel
        counts equal to the batch (2) or the spatial size (4), symbolic sizes, the three
        float dtypes, every spelling, a per-channel epsilon, constants.
        """
        return {"channels": (3, 4, 2, "c"),
                "param_shape": ("C11", "1C11", "C", "C1", "full", "mixed"),
                "layout": ("NCHW", "NHWC"), "rank": (4, 2, 1),
                "dtype": ("float32", "float16", "bfloat16"), "batch": (2, "n"),
                "spelling": (*SPELLINGS, "decomposed"),
                "epsilon": ("scalar", "per_channel"), "params": ("inputs", "constants"),
                "seed": (0, 1)}


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
        """The batch norm call, the only node this rule reads."""
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
        """The batch norm written out with the call's moving statistics (inference form)."""
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

    def example(self, **knobs: Any) -> tvm.IRModule:
        """One ``nn.batch_norm`` call: :func:`batch_norm_call` with ``knobs``."""
        return batch_norm_call(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Inference and training calls, the channel axis first or last, two dtypes."""
        return {"training": (False, True), "axis": (1, 3), "dtype": ("float32", "float16")}


#: The expand rules of this file (for training graphs; never mixed with ``RULES``).
EXPANSIONS = (BatchnormExpand,)


# -- examples (the rules' example(), the tests and `patternkit verify`) --------------------
def written_out(channels: int | str = 3, param_shape: str = "C11", layout: str = "NCHW",
                rank: int = 4, dtype: str = "float32", batch: int | str = 2,
                spelling: str = "relay", epsilon: str = "scalar", params: str = "inputs",
                seed: int = 0) -> tvm.IRModule:
    """``gamma * (x - mean) / sqrt(var + eps) + beta``, by default on ``x: (2, 3, 4, 4)``.

    Parameters
    ----------
    channels : int or str
        ``C``; a string is a symbolic dimension of that name.
    param_shape : {"C11", "1C11", "C", "C1", "full", "mixed"}
        How the four parameters are shaped, as written (broadcasting decides the axis
        they vary along): ``"full"`` is ``x``'s own shape, ``"mixed"`` gives ``beta``
        the shape ``(C,)`` and the others ``(C, 1, 1)``.
    layout : {"NCHW", "NHWC"}
        Where the channels are in a rank-4 ``x`` (spatial size 4).
    rank : {4, 2, 1}
        ``x`` is ``(N, C, 4, 4)`` / ``(N, 4, 4, C)``, ``(N, C)`` or ``(C,)``.
    dtype : str
        Of ``x``, the parameters and epsilon.
    batch : int or str
        ``N``; a string is a symbolic dimension.
    spelling : str
        One of :data:`SPELLINGS`, or ``"decomposed"``: a real ``nn.batch_norm`` on
        the channel axis through ``relax.transform.DecomposeOpsForInference`` (the
        parameters are ``(C,)`` and reach the arithmetic through ``expand_dims``).
    epsilon : {"scalar", "per_channel"}
        A scalar constant, or one per channel (which is not a batch norm's).
    params : {"inputs", "constants"}
        The parameters as function inputs, or as seeded constants (a constant
        cannot have a symbolic size: it gets 3 channels then).
    seed : int
        Seed of the constants.
    """
    rng = np.random.default_rng(seed)
    sym: dict[int | str, Any] = {name: tvm.tirx.Var(name, "int64") for name in (channels, batch)
           if isinstance(name, str)}
    c, n = (sym.get(v, v) for v in (channels, batch))
    static_c = c if isinstance(c, int) else 3
    x_shape = {4: (n, c, 4, 4) if layout == "NCHW" else (n, 4, 4, c), 2: (n, c), 1: (c,)}[rank]
    x = relax.Var("x", relax.TensorType(x_shape, dtype))

    def param(role: str, shape: tuple) -> Any:
        if params == "inputs":
            return relax.Var(role, relax.TensorType(shape, dtype))
        shape = tuple(static_c if not isinstance(d, int) else d for d in shape)
        values = rng.uniform(0.5, 1.5, shape) if role == "var" else rng.uniform(-1, 1, shape)
        return relax.const(values.astype("float32"), dtype)

    eps = (relax.const(1e-5, dtype) if epsilon == "scalar"
           else relax.const(np.full((static_c, 1, 1), 1e-5, "float32"), dtype))
    if spelling == "decomposed":
        return _decomposed(x, [param(role, (c,)) for role in _ROLES], rank, layout, eps)
    shapes = {"C": (c,), "C11": (c, 1, 1), "1C11": (1, c, 1, 1), "C1": (c, 1),
              "full": x_shape, "mixed": (c, 1, 1)}
    gamma, beta, mean, var = (param(role, shapes[param_shape]) for role in _ROLES)
    if param_shape == "mixed":
        beta = param("beta", (c,))
    try:
        return from_expr(SPELLINGS[spelling](x, gamma, beta, mean, relax.op.sqrt(var + eps)))
    except ValueError as err:  # Relax's type inference: the shapes do not broadcast
        raise NoSuchExample(f"parameters shaped {param_shape} do not broadcast against "
                            f"x of shape {x_shape}") from err


#: Ways frontends and hand-written models order the arithmetic (all collapse).
SPELLINGS = {
    "relay": lambda x, g, b, m, std: g * (x - m) / std + b,
    "operands_swapped": lambda x, g, b, m, std: b + (x - m) * g / std,
    "gamma_over_sqrt_first": lambda x, g, b, m, std: g / std * (x - m) + b,
    "normalised_then_scaled": lambda x, g, b, m, std: (x - m) / std * g + b,
}


def _decomposed(x: Any, params: list, rank: int, layout: str, eps: Any) -> tvm.IRModule:
    """``DecomposeOpsForInference(batch_norm(x, ...)[0])`` on ``x``'s channel axis."""
    axis = {4: 1 if layout == "NCHW" else 3, 2: 1, 1: 0}[rank]
    bb = relax.BlockBuilder()
    with bb.function("main", [x] + [p for p in params if isinstance(p, relax.Var)]):
        with bb.dataflow():
            bn = bb.emit(relax.op.nn.batch_norm(x, *params, axis=axis,
                                                epsilon=float(const_value(eps).reshape(-1)[0]),
                                                training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    return relax.transform.DecomposeOpsForInference()(bb.get())


def batch_norm_call(training: bool = False, axis: int = 1, dtype: str = "float32") -> tvm.IRModule:
    """One ``batch_norm`` of ``x: (2, 3, 4, 4)`` (``axis=3``: ``(2, 4, 4, 3)``), all outputs
    read.
    """
    shape = (2, 3, 4, 4) if axis == 1 else (2, 4, 4, 3)
    x = relax.Var("x", relax.TensorType(shape, dtype))
    params = [relax.Var(n, relax.TensorType((3,), dtype)) for n in _ROLES]
    bn = relax.op.nn.batch_norm(x, *params, axis=axis, epsilon=1e-5, training=training,
                                momentum=0.1)
    return from_expr(bn)

