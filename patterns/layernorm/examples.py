"""The layer norm family's example modules: what its rules' ``example()`` build, and the
tests reuse.

:func:`written_out` is a layer norm as ONNX, torch modules and TVM's own decompositions
write it (``layernorm.collapse``'s example), :func:`layer_norm_call` one fused
``layer_norm`` (the expansion's and the composites').  Knobs the rules must refuse reach
every guard.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.engine import NoSuchExample
from patternkit.ir import from_expr, static_shape

#: The dtype the ``widened`` examples compute their statistics in, by form and x's dtype:
#: what the exporters write for float16 (the dynamo exporter's variance in float32, the
#: TorchScript exporter's normalisation in float64); float32 x widened to float64 is an
#: edge the rule refuses.
WIDE_DTYPE = {("variance", "float16"): "float32", ("normalisation", "float16"): "float64",
              ("variance", "bfloat16"): "float32",
              ("variance", "float32"): "float64", ("normalisation", "float32"): "float64"}


def example_shape(rank: int, symbolic: bool) -> tuple:
    """``x``'s shape in the examples: ``(batch, [seq, [heads,]] 16)``, symbolic if asked."""
    static = {2: (4, 16), 3: (2, 5, 16), 4: (2, 3, 5, 16)}[rank]
    if not symbolic:
        return static
    names = ("n", "s", "h")[:rank - 1]
    return (*(tvm.tirx.Var(name, "int64") for name in names), static[-1])


def written_out(dtype: str = "float32", rank: int = 3, axes: int = 1, symbolic: bool = False,
                affine: str = "both", root: str = "sqrt", square: str = "power",
                centered: str = "reused", mean_axes: str = "trailing", eps: str = "scalar",
                gamma: str = "per_feature", mean: str = "once",
                variance_keepdims: str = "kept", widened: str = "none") -> tvm.IRModule:
    """A written-out layer norm over the last ``axes`` axes of a rank-``rank`` ``x``.

    ``symbolic`` makes the leading dims of ``x`` symbolic (``n``, ``s``); ``affine``
    is ``"both"``, ``"gamma"``, ``"beta"`` or ``"none"``; ``root`` ``"sqrt"`` (divide)
    ``"rsqrt"`` (multiply) or ``"reciprocal"`` (times ``1 / sqrt``); ``square``
    ``"power"``, ``"multiply"``, ``"square"`` or ``"variance"`` (the ``variance`` op
    instead of the second mean); ``centered`` ``"reused"`` or ``"recomputed"``;
    ``mean`` ``"once"`` or ``"twice"`` (the numerator's mean computed again, its axes
    spelled positive: the ONNX exporters' form); ``variance_keepdims`` ``"kept"`` or
    ``"reshaped"`` (the variance drops its axes, then a reshape puts them back: the dynamo
    exporter's form); ``widened`` ``"none"``, ``"variance"`` (the variance taken in a
    wider dtype and cast back: the dynamo exporter's float16 var over several axes) or
    ``"normalisation"`` (``x - mean`` cast wider, normalised, cast back: the TorchScript
    exporter's float16 LayerNorm), widened as :data:`WIDE_DTYPE` says.  Knobs
    the rule must refuse: ``mean_axes="leading"`` (the means reduce the first axes),
    ``eps="vector"`` or ``"variable"``, ``gamma="scalar"`` or ``"full"`` (not
    per-feature).
    """
    if widened != "none" and (square == "variance" or centered == "recomputed"
                              or mean == "twice"):
        raise NoSuchExample("a widened norm is written with one mean and a squared "
                            "difference (square != 'variance', centered='reused', "
                            "mean='once')")
    if widened == "normalisation" and (variance_keepdims == "reshaped" or eps == "variable"):
        raise NoSuchExample("the widened normalisation keeps the variance's dims and adds a "
                            "constant eps (cast with it)")
    if dtype == "bfloat16" and square == "power" and widened == "none":
        raise NoSuchExample("TVM 0.27 does not build power in bfloat16 (\"power only applies "
                            "to float\"): the model has no numeric reference on llvm")
    x = relax.Var("x", relax.TensorType(example_shape(rank, symbolic), dtype))
    shape = static_shape(x.ty)
    assert shape is not None  # x was just given one
    reduce = list(range(-axes, 0)) if mean_axes == "trailing" else list(range(axes))
    features = shape[rank - axes:]
    gamma_shape = {"per_feature": features, "scalar": (), "full": shape}[gamma]
    g = relax.Var("gamma", relax.TensorType(gamma_shape, dtype))
    b = relax.Var("beta", relax.TensorType(features, dtype))
    eps_value = {"scalar": relax.const(1e-5, dtype),
                 "vector": relax.const(np.full(int(shape[-1]), 1e-5, "float32"), dtype),
                 "variable": relax.Var("eps", relax.TensorType((), dtype))}[eps]
    return layer_norm_graph(x, g if affine in ("gamma", "both") else None,
                            b if affine in ("beta", "both") else None, eps_value, reduce,
                            square=square, root=root, centered=centered,
                            numerator_reduce=([a % rank for a in reduce] if mean == "twice"
                                              else None),
                            reshape_variance=variance_keepdims == "reshaped",
                            widened=widened,
                            wide_dtype=WIDE_DTYPE.get((widened, dtype), "float64"))


def layer_norm_graph(x: relax.Var, gamma: relax.Var | None, beta: relax.Var | None,
                     eps: relax.Expr, reduce: Sequence[int],
                     variance_reduce: Sequence[int] | None = None, keepdims: bool = True,
                     square: str = "power", root: str = "sqrt",
                     centered: str = "reused", numerator_reduce: Sequence[int] | None = None,
                     reshape_variance: bool = False,
                     variance_shape: Sequence[int] | None = None, widened: str = "none",
                     wide_dtype: str = "float32", back_dtype: str | None = None
                     ) -> tvm.IRModule:
    """``main(x, [gamma], [beta], [eps])``: the layer norm of ``x`` written out, one binding
    per op, from the given parts (:func:`written_out` chooses them; a test may pass parts
    no knob makes, such as an ``x`` of unknown rank).

    ``reduce`` / ``variance_reduce`` are the axes of the two means (the same by default),
    ``eps`` a constant or a parameter; ``square``, ``root`` and ``centered`` as in
    :func:`written_out`.  ``numerator_reduce``: the numerator centres ``x`` with a mean of
    its own over these axes; ``reshape_variance``: the variance is taken without keepdims
    and reshaped to the mean's shape (or to ``variance_shape``); ``widened``: the
    variance (``"variance"``) or the whole normalisation (``"normalisation"``) computed
    in ``wide_dtype`` between casts, as :func:`written_out` says, cast back to
    ``back_dtype`` (default: ``x``'s dtype).
    """
    dtype = x.ty.dtype
    reduce = list(reduce)
    variance_reduce = reduce if variance_reduce is None else list(variance_reduce)
    params = [x, *(p for p in (gamma, beta) if p is not None)]
    params += [eps] if isinstance(eps, relax.Var) else []
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            mean = bb.emit(relax.op.mean(x, reduce, keepdims=keepdims))
            d = bb.emit(relax.op.subtract(x, mean))
            kept = keepdims and not reshape_variance
            if widened == "variance":  # from x cast wider, centred on its own mean
                wide = bb.emit(relax.op.astype(x, wide_dtype))
                wide_d = bb.emit(relax.op.subtract(wide, bb.emit(
                    relax.op.mean(wide, variance_reduce, keepdims=True))))
                var = bb.emit(relax.op.mean(bb.emit(_squared(wide_d, square, wide_dtype)),
                                            variance_reduce, keepdims=kept))
            elif widened == "normalisation":  # x - mean cast wider, normalised there
                d = bb.emit(relax.op.astype(d, wide_dtype))
                var = bb.emit(relax.op.mean(bb.emit(_squared(d, square, wide_dtype)),
                                            variance_reduce, keepdims=kept))
                eps = relax.const(eps.value.numpy().astype(wide_dtype), wide_dtype)
            elif square == "variance":
                var = bb.emit(relax.op.variance(x, variance_reduce, keepdims=kept))
            else:
                sq = bb.emit({"power": lambda: relax.op.power(d, relax.const(2.0, dtype)),
                              "multiply": lambda: relax.op.multiply(d, d),
                              "square": lambda: relax.op.square(d)}[square]())
                var = bb.emit(relax.op.mean(sq, variance_reduce, keepdims=kept))
            if reshape_variance:
                var = bb.emit(relax.op.reshape(var, variance_shape or mean.ty.shape))
            if widened == "variance":
                var = bb.emit(relax.op.astype(var, back_dtype or dtype))
            radicand = bb.emit(relax.op.add(var, eps))
            if numerator_reduce is not None:
                mean = bb.emit(relax.op.mean(x, list(numerator_reduce), keepdims=keepdims))
            if centered == "recomputed" or numerator_reduce is not None:
                d = bb.emit(relax.op.subtract(x, mean))
            if root == "sqrt":
                y = bb.emit(relax.op.divide(d, bb.emit(relax.op.sqrt(radicand))))
            elif root == "reciprocal":  # torch.rsqrt exported to ONNX
                one = relax.const(1.0, wide_dtype if widened == "normalisation" else dtype)
                inverse = relax.op.divide(one,
                                          bb.emit(relax.op.sqrt(radicand)))
                y = bb.emit(relax.op.multiply(d, bb.emit(inverse)))
            else:
                y = bb.emit(relax.op.multiply(d, bb.emit(relax.op.rsqrt(radicand))))
            if widened == "normalisation":
                y = bb.emit(relax.op.astype(y, back_dtype or dtype))
            if gamma is not None:
                y = bb.emit(relax.op.multiply(y, gamma))
            if beta is not None:
                y = bb.emit(relax.op.add(y, beta))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _squared(d: relax.Expr, square: str, dtype: str) -> relax.Expr:
    """``d`` squared the way ``square`` says (``power``, ``multiply`` or ``square``)."""
    if square == "multiply":
        return relax.op.multiply(d, d)
    if square == "square":
        return relax.op.square(d)
    return relax.op.power(d, relax.const(2.0, dtype))


def layer_norm_call(dtype: str = "float32", rank: int = 3, axes: int = 1,
                    symbolic: bool = False, known_rank: bool = True,
                    residual: bool = False) -> tvm.IRModule:
    """``layer_norm(x, gamma, beta)`` over the last ``axes`` axes of a rank-``rank`` ``x``
    (shaped by :func:`example_shape`); ``known_rank=False``: an ``x`` of unknown rank;
    ``residual``: the norm of ``x + r``, ``r`` of ``x``'s shape (a skip connection).
    """
    shape = example_shape(rank, symbolic)
    features = shape[rank - axes:]
    x_ty = (relax.TensorType(shape, dtype) if known_rank
            else relax.TensorType(ndim=-1, dtype=dtype))
    x = relax.Var("x", x_ty)
    r = relax.Var("r", relax.TensorType(shape, dtype))
    g, b = (relax.Var(n, relax.TensorType(features, dtype)) for n in ("gamma", "beta"))
    data = x + r if residual else x
    return from_expr(relax.op.nn.layer_norm(data, g, b, axes=list(range(-axes, 0))))
