"""Backward graphs for external compilers: the normalisation backward chains that
``relax.transform.Gradient`` emits, as ``batch_norm_grad`` and ``layer_norm_grad`` composites.

Recognises

* :class:`NormGradComposite`: the input gradient of a normalisation with batch
  statistics, ``y = gamma * (x - mean(x)) / sqrt(var(x) + eps) + beta``, exactly as
  ``Gradient`` writes it for the written-out forms of ``batchnorm.expand`` (training
  mode) and ``layernorm.expand``, which :func:`patternkit.training.gradient` applies
  before differentiating.  With ``g`` the
  upstream gradient scaled by gamma, ``xc = x - mean``, ``std = sqrt(var + eps)`` and
  ``xhat = xc / std`` (forward values the chain reads, saved activations for a kernel)::

      dstd = collapse_sum_to((-g * xhat) / std, stats)          # through the divide
      dvar = [d_var_upstream +] 0.5 * dstd / std                # through the sqrt
      dsq  = broadcast_to(dvar / N, x)                          # through the mean
      dxc  = g / std + dsq * xc + dsq * xc                      # through the square
      dx   = dxc + broadcast_to(([d_mean_upstream +] collapse_sum_to(-dxc, stats)) / N, x)

  ``g`` is ``dy * gamma`` when the norm scales (the multiply belongs to the composite:
  a kernel takes ``dy`` and ``gamma``); the ``_unscaled`` variants start at ``g``
  itself, computed outside (a norm without gamma).  The optional upstream terms are
  the adjoints ``Gradient`` propagates into the batch
  statistics from the running-mean / running-variance updates of a training-mode batch
  norm (zeros when nothing reads the updated statistics, but still in the graph).
  ``add`` / ``multiply`` operands match in either order and the two ``dsq * xc``
  products may be one binding (after common-subexpression elimination) or two (as
  ``Gradient`` emits them).  The check tells the two kinds apart by the statistics'
  shape, keepdims-shaped like ``x``: a batch norm keeps exactly one (channel) axis and
  reduces the others; a layer norm keeps leading axes and reduces a trailing run.  Where
  the shapes agree with both (a batch norm over a batch of one), gamma's axes decide:
  per channel or per normalised feature; without gamma a batch norm must reduce a batch
  of more than one.  It also checks that both divisors ``N`` are the number of elements
  each statistic averages (a symbolic batch is fine where it is not reduced).
  ``dgamma = collapse_sum_to(dy * xhat)`` and ``dbeta = collapse_sum_to(dy)`` are
  separate results (a composite has one output) and stay outside.

* :class:`FrozenBatchNormGradComposite`: the input gradient of a batch norm with running
  statistics (``training=False``: ResNet fine-tuned in eval mode), ``dy * gamma / std``.

Deliberately not covered: normalisations written other ways than the library's
expansions (TVM's ``DecomposeOpsForTraining`` computes the variance with ``R.variance``,
whose gradient is another chain; ``rsqrt``; a variance through ``power``), ``rms_norm``
and ``group_norm`` backward, and the backward chains of ``gelu`` and ``softmax``; the
gradients of a frozen batch norm's running statistics (they read ``dy * gamma`` too).
``Gradient`` cannot differentiate a training-mode batch norm over a symbolic batch in
TVM 0.27 (its ``mean`` gradient needs a static count), so the batch-norm composite only
meets static reductions; a layer norm over a symbolic batch is covered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, is_constant, is_op, wildcard
from patternkit.engine import CompositeRule, RoleMatch, reject
from patternkit.ir import (
    NotPerChannel,
    const_value,
    dims_equal,
    per_channel_axis,
    prove_equal,
    static_shape,
    type_of,
)

#: The kinds of :class:`NormGradComposite`, each with its composite name.
NORM_KINDS = {"batch_norm": "batch_norm_grad", "layer_norm": "layer_norm_grad"}


def _plus_upstream(term: DFPattern) -> DFPattern:
    """``term`` or ``upstream + term``: an adjoint that may gather a second contribution."""
    return is_op("add")(wildcard(), term) | term


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Two shapes proved equal (an undecidable symbolic comparison is not)."""
    return len(a) == len(b) and all(dims_equal(p, q) is True for p, q in zip(a, b))


class NormGradComposite(CompositeRule):
    """The input gradient of a batch norm or layer norm with batch statistics, as ``Gradient``
    emits it.

    Parameters
    ----------
    compiler : str
        Prefix of the composite name (the codegen that takes it).
    kind : {"batch_norm", "layer_norm"}
        Which normalisation's backward: ``<compiler>.batch_norm_grad`` or
        ``<compiler>.layer_norm_grad``.  The pattern is the same; the check tells the
        kinds apart by the axes the statistics reduce.
    scale : bool
        The chain starts at ``dy * gamma`` (taken into the composite); ``False``: at the
        upstream gradient ``g`` whatever computes it (a norm without gamma, or a scale
        the scaled variant refuses), named ``<kind>_grad_unscaled``.  A table holds the
        scaled variant first: the unscaled one would take the same chain without gamma.
    """

    def __init__(self, compiler: str = "byoc", kind: str = "batch_norm", scale: bool = True):
        super().__init__(compiler)
        if kind not in NORM_KINDS:
            raise ValueError(f"NormGradComposite: kind must be one of {tuple(NORM_KINDS)}, "
                             f"found {kind!r}")
        self.kind, self.scaled = kind, bool(scale)
        self.dy, self.gamma = wildcard(), wildcard()
        self.xc, self.std, self.xhat = wildcard(), wildcard(), wildcard()
        self.scale = is_op("multiply")(self.dy, self.gamma)
        g = self.scale if self.scaled else self.dy
        self.dstd = is_op("collapse_sum_to")(
            is_op("divide")(is_op("multiply")(is_op("negative")(g), self.xhat), self.std),
            wildcard())
        dvar = _plus_upstream(is_op("divide")(is_op("multiply")(0.5, self.dstd), self.std))
        self.var_count = is_constant()
        dsq = is_op("broadcast_to")(is_op("divide")(dvar, self.var_count), wildcard())
        self.dxc = is_op("add")(is_op("add")(is_op("divide")(g, self.std),
                                             is_op("multiply")(dsq, self.xc)),
                                is_op("multiply")(dsq, self.xc))
        self.dmean = is_op("collapse_sum_to")(is_op("negative")(self.dxc), wildcard())
        self.mean_count = is_constant()
        self.pattern: DFPattern = is_op("add")(self.dxc, is_op("broadcast_to")(
            is_op("divide")(_plus_upstream(self.dmean), self.mean_count), wildcard()))
        self.pattern_name = NORM_KINDS[kind] + ("" if self.scaled else "_unscaled")

    def check(self, match: RoleMatch) -> Any:
        """Accept when the statistics reduce this kind's axes, ``N`` counts them and gamma
        (when the chain scales by one) varies along the axes this kind scales.
        """
        x_shape = static_shape(type_of(match.root))
        stats_shape = static_shape(type_of(match.var_of("dstd")))
        mean_stats = static_shape(type_of(match.var_of("dmean")))
        if x_shape is None or stats_shape is None or mean_stats is None:
            return reject("the gradient or its statistics have no known shape", at=match.root)
        if len(stats_shape) != len(x_shape) or not _same(stats_shape, mean_stats):
            return reject(f"the statistics {tuple(stats_shape)} and {tuple(mean_stats)} are "
                          f"not one keepdims shape of the input {tuple(x_shape)}",
                          at=match.dmean)
        # collapse_sum_to's type inference has proved each statistic dim 1 or the input's
        reduced: list[int] = []
        kept: list[int] = []
        for axis, (stat, dim) in enumerate(zip(stats_shape, x_shape)):
            if not prove_equal(dim, 1):  # a unit axis is reduced and kept alike
                (reduced if prove_equal(stat, 1) else kept).append(axis)
        scaled_axes = self._scaled_axes(match, x_shape)
        if isinstance(scaled_axes, str):
            return reject(scaled_axes, at=match.scale)
        refusal = self._axes_refusal(reduced, kept, scaled_axes, len(x_shape))
        if refusal is not None:
            return reject(refusal, at=match.dstd)
        count = math.prod(x_shape[axis] for axis in reduced)
        if not isinstance(count, int):
            return reject(f"the statistics average a symbolic number of elements ({count}): "
                          f"a constant divisor cannot be checked against it", at=match.dstd)
        for role in ("var_count", "mean_count"):
            divisor = const_value(match[role]).astype("float64")
            if divisor.size != 1 or not np.isclose(float(divisor.reshape(())), count,
                                                   rtol=1e-3):
                return reject(f"the gradient divides by {divisor.reshape(-1)[:4].tolist()}, "
                              f"the statistics average {count} elements over axes "
                              f"{reduced}", at=match[role])
        return True

    def _scaled_axes(self, match: RoleMatch, x_shape: Sequence[Any]) -> set[int] | str | None:
        """The axes gamma varies along (``None`` without a scale); a refusal as a string."""
        if not self.scaled:
            return None
        shapes = [static_shape(type_of(match[role])) for role in ("dy", "gamma")]
        # add/multiply match in either order: gamma is the operand of the smaller shape
        full = [shape is not None and _same(shape, x_shape) for shape in shapes]
        if full == [False, True]:
            shapes.reverse()
        gamma = shapes[1]
        if gamma is None or len(gamma) > len(x_shape) or all(full):
            return (f"the upstream gradient is scaled by a tensor of shape "
                    f"{None if gamma is None else tuple(gamma)}, not by a gamma that "
                    f"broadcasts against the input {tuple(x_shape)}")
        offset = len(x_shape) - len(gamma)
        return {offset + i for i, dim in enumerate(gamma) if not prove_equal(dim, 1)}

    def _axes_refusal(self, reduced: list[int], kept: list[int], scaled: set[int] | None,
                      rank: int) -> str | None:
        """Why statistics reducing ``reduced`` and keeping ``kept`` (non-unit axes), with
        gamma varying along ``scaled``, are not this kind's (``None`` when they are).

        The shapes alone cannot tell a batch norm over a batch of one from a layer norm
        over its trailing axes (the arithmetic is the same); gamma's axes can: per
        channel for a batch norm, per normalised feature for a layer norm.  Without a
        gamma, a batch norm must reduce a batch of more than one.
        """
        if not reduced:
            return "the statistics reduce no axis of the input"
        if self.kind == "layer_norm":
            if any(axis > reduced[0] for axis in kept):
                return (f"the statistics reduce axes {reduced} and keep {kept} of a "
                        f"rank-{rank} input: a layer norm reduces trailing axes")
            if scaled is not None and not scaled <= set(reduced):
                return (f"gamma varies along axes {sorted(scaled)}: a layer norm's gamma "
                        f"scales the normalised axes {reduced}")
            return None
        if len(kept) != 1:
            return (f"the statistics keep axes {kept} of a rank-{rank} input: a batch norm "
                    f"keeps one channel axis")
        if scaled is not None and not scaled <= set(kept):
            return (f"gamma varies along axes {sorted(scaled)}: a batch norm's gamma scales "
                    f"its channel axis {kept[0]}")
        if scaled is None and 0 not in reduced:
            return (f"the statistics reduce axes {reduced}, not a batch: without a gamma "
                    f"to show the channel axis this is a layer norm's gradient")
        return None

    def example(self, **knobs: Any) -> tvm.IRModule:
        """The gradient of this variant's norm as ``Gradient`` emits it: :func:`norm_gradient`."""
        return norm_gradient(self.kind, self.scaled, **knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes and the batch sizes that tell this variant's norm apart (a batch norm
        without gamma over one sample reads as a layer norm's gradient).
        """
        # without gamma a batch norm over a batch of one is a layer norm's gradient
        batches: tuple = ((2, "n") if self.kind == "layer_norm"
                          else (2, 1) if self.scaled else (2,))
        return {"dtype": ("float32", "float16"), "batch": batches}


class FrozenBatchNormGradComposite(CompositeRule):
    """The input gradient of a batch norm with running statistics, ``dy * gamma / std``.

    A batch norm with ``training=False`` (a model fine-tuned in eval mode, ResNet from
    the zoo) normalises with constants, so its input gradient is the two element-wise
    ops ``Gradient`` emits as ``divide(multiply(dy, gamma), std)``; a backend fuses them
    into the producer's backward kernel.  The check asks for ``gamma`` and ``std`` that
    vary along one and the same channel axis of ``dy``.  The forward normalisation,
    ``(x - mean) / std * gamma``, ends in a ``multiply``: it is never a candidate.  The
    ``dy * gamma`` product is read by nothing else: when the running statistics are
    differentiated too, their gradients read it
    and the match is left alone.
    """

    pattern_name = "frozen_batch_norm_grad"

    def __init__(self, compiler: str = "byoc"):
        super().__init__(compiler)
        self.dy, self.gamma, self.std = wildcard(), wildcard(), wildcard()
        self.scale = is_op("multiply")(self.dy, self.gamma)
        self.divide = is_op("divide")(self.scale, self.std)
        self.pattern: DFPattern = self.divide

    def check(self, match: RoleMatch) -> Any:
        """Accept ``dy * gamma / std`` with gamma and std on one channel axis of ``dy``."""
        dy_shape = static_shape(type_of(match.root))
        if dy_shape is None:
            return reject("the gradient has no known shape", at=match.root)
        operands = {role: static_shape(type_of(match[role])) for role in ("dy", "gamma")}
        if not _same(operands["dy"] or (), dy_shape):  # multiply matches either operand order
            operands = {"dy": operands["gamma"], "gamma": operands["dy"]}
        axes = []
        for role, shape in (("gamma", operands["gamma"]),
                            ("std", static_shape(type_of(match.std)))):
            try:
                axes.append(per_channel_axis(shape, dy_shape, name=role, of="the gradient"))
            except NotPerChannel as why:
                return reject(f"not a batch norm's input gradient: {why}", at=match.root)
        if axes[0] != axes[1] or axes[0] == 0:
            return reject(f"gamma varies along axis {axes[0]} and std along axis {axes[1]}: "
                          f"a batch norm scales and normalises one channel axis, not the "
                          f"batch", at=match.std)
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """The gradient of a frozen batch norm: :func:`frozen_batch_norm_gradient`."""
        return frozen_batch_norm_gradient(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes, a static or a symbolic batch."""
        return {"dtype": ("float32", "float16"), "batch": (2, "n")}


#: The rewrite rules of this file: none (composites only).
RULES: tuple = ()

#: Pattern-table entries.  The kinds never take the same match (the check splits them).
#: Pattern-table entries: the scaled variants before the unscaled ones (which take the
#: same chains without their ``dy * gamma``), the batch-statistics chains before the frozen
#: one (their interior holds a ``dy * gamma / std``).
COMPOSITES = (NormGradComposite(kind="batch_norm"), NormGradComposite(kind="layer_norm"),
              NormGradComposite(kind="batch_norm", scale=False),
              NormGradComposite(kind="layer_norm", scale=False), FrozenBatchNormGradComposite)


# -- examples (the rules' example(), the tests and `patternkit verify`) --------------------
def norm_gradient(kind: str = "batch_norm", scaled: bool = True, dtype: str = "float32",
                  batch: int | str = 2, seed: int = 0) -> tvm.IRModule:
    """The gradient of ``sum(norm(x) * w)`` as ``Gradient`` emits it, as ``main``.

    The norm (``kind``) is written out as the library's expansions write it (batch norm of
    ``(batch, 6, 4, 3)`` over axis 1, layer norm of ``(batch, 5, 16)`` over the last
    axis), ``gamma`` and ``beta`` parameters (not ``scaled``: neither), ``w`` a
    seeded constant so the upstream gradient is no broadcast of ones.  ``batch`` is
    a size or a symbolic dimension's name (layer norm only: see the module notes).
    """
    rng = np.random.default_rng(seed)
    dims = (6, 4, 3) if kind == "batch_norm" else (5, 16)
    n = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
    shape = (n, *dims)
    axes = [0, 2, 3] if kind == "batch_norm" else [2]
    x = relax.Var("x", relax.TensorType(shape, dtype))
    feature = (1, 6, 1, 1) if kind == "batch_norm" else (16,)
    params = [relax.Var(name, relax.TensorType(feature, dtype))
              for name in ("gamma", "beta")] if scaled else []
    weight = relax.const(rng.uniform(-1, 1, (1, *dims)).astype(dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, *params]):
        with bb.dataflow():
            mean = bb.emit(relax.op.mean(x, axis=axes, keepdims=True))
            xc = bb.emit(relax.op.subtract(x, mean))
            var = bb.emit(relax.op.mean(relax.op.multiply(xc, xc), axis=axes,
                                        keepdims=True))
            std = bb.emit(relax.op.sqrt(relax.op.add(var, relax.const(1e-5, dtype))))
            y = bb.emit(relax.op.divide(xc, std))
            if scaled:
                y = bb.emit(relax.op.add(relax.op.multiply(y, params[0]), params[1]))
            loss = bb.emit_output(relax.op.sum(relax.op.multiply(y, weight)))
        bb.emit_func_output(loss)
    return _adjoint_as_main(bb.get())


def frozen_batch_norm_gradient(dtype: str = "float32", batch: int | str = 2,
                               seed: int = 0) -> tvm.IRModule:
    """The gradient of ``sum(batch_norm(x, running statistics) * w)`` w.r.t. ``x``,
    ``gamma`` and ``beta`` (statistics constant), as ``Gradient`` emits it.
    """
    rng = np.random.default_rng(seed)
    n = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
    x = relax.Var("x", relax.TensorType((n, 6, 4, 3), dtype))
    gamma, beta = (relax.Var(name, relax.TensorType((1, 6, 1, 1), dtype))
                   for name in ("gamma", "beta"))
    mean = relax.const(rng.uniform(-1, 1, (1, 6, 1, 1)).astype(dtype))
    var = relax.const(rng.uniform(0.5, 1.5, (1, 6, 1, 1)).astype(dtype))
    weight = relax.const(rng.uniform(-1, 1, (1, 6, 4, 3)).astype(dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, gamma, beta]):
        with bb.dataflow():
            std = bb.emit(relax.op.sqrt(relax.op.add(var, relax.const(1e-5, dtype))))
            y = bb.emit(relax.op.divide(relax.op.subtract(x, mean), std))
            y = bb.emit(relax.op.add(relax.op.multiply(y, gamma), beta))
            loss = bb.emit_output(relax.op.sum(relax.op.multiply(y, weight)))
        bb.emit_func_output(loss)
    return _adjoint_as_main(bb.get())


def _adjoint_as_main(forward: tvm.IRModule) -> tvm.IRModule:
    """``Gradient``'s adjoint of ``forward["main"]``, bindings canonicalised, as ``main``."""
    adjoint = relax.transform.Gradient("main")(forward)["main_adjoint"]
    module = tvm.IRModule({"main": adjoint.with_attr("global_symbol", "main")})
    return relax.transform.CanonicalizeBindings()(module)
