"""Guards of the normalisation rules: the shape, axes, epsilon and parameters of a norm.

Each guard returns what it found or raises :func:`~patternkit.engine.reject` with the
reason and the expression it is about.  ``layernorm.collapse`` and the RMS norm's rules
(``patterns/rmsnorm.py``) share them.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm import relax

from patternkit.engine import reject
from patternkit.ir import (
    NotPerFeature,
    NotTrailing,
    const_value,
    dims_equal,
    dtype_of,
    int_list,
    is_constant,
    per_feature_shape,
    static_shape,
    trailing_axes,
    type_of,
    var_name,
)

#: The dtypes TVM 0.27's ``layer_norm`` legalises (its TOPI kernel checks them).
LAYER_NORM_DTYPES = ("float32", "float16")

#: The dtypes whose norms the collapse rules compute in float32 between casts, since TVM
#: 0.27's ``layer_norm`` and ``instance_norm`` kernels refuse them and ``group_norm``
#: refuses to be built on them: ``astype(norm(astype(x, float32), ...), bfloat16)`` is the
#: float32 norm rounded once, bit for bit (checked against a float32 numpy norm on llvm),
#: and a model written in bfloat16 rounds each of its steps to bfloat16.
NORM_IN_FLOAT32 = ("bfloat16",)

#: Every dtype a norm collapse takes: TVM's kernels' and those run in float32.
NORM_DTYPES = LAYER_NORM_DTYPES + NORM_IN_FLOAT32


def norm_compute_dtype(dtype: str) -> str:
    """The dtype a fused norm of ``dtype`` data runs in: float32 for :data:`NORM_IN_FLOAT32`."""
    return "float32" if dtype in NORM_IN_FLOAT32 else dtype


def widened(value: Any, dtype: str) -> Any:
    """``value`` cast to ``dtype`` (a wider float: exact), a constant folded; as is when it
    has that dtype already.
    """
    if dtype_of(type_of(value)) == dtype:
        return value
    if is_constant(value):
        return relax.const(const_value(value).astype("float32"), dtype)
    return relax.op.astype(value, dtype)


def log_float32_norm(logger: logging.Logger, rule: str, op: str, at: Any, dtype: str,
                     compute: str = "float32") -> None:
    """Say in the log that the ``op`` replacing the ``dtype`` norm at ``at`` runs in
    ``compute`` between casts, and why.
    """
    why = (f"TVM's {op} has no {dtype} kernel" if dtype in NORM_IN_FLOAT32
           else "as the model computes it")
    logger.info("%s: the %s norm at %s is computed in %s between casts (%s) and rounded once "
                "to %s, within %s rounding of the written-out form", rule, dtype,
                var_name(at) if isinstance(at, relax.Var) else "its result", compute, why,
                dtype, dtype)


#: The dtypes a float16 norm's statistics may be computed in between casts: TVM's
#: float16 ``layer_norm`` accumulates its mean and variance in float32 and rounds once,
#: so a model that asked for float32 or float64 statistics gets float16 results within
#: float16 rounding of its own; a bfloat16 norm is computed in float32 between casts
#: (:data:`NORM_IN_FLOAT32`).  A float32 norm widened to float64 is refused: the fused
#: op would compute in float32, a precision the model did not ask for.
WIDENED_STATISTICS = {"float16": ("float32", "float64"),
                      "bfloat16": ("float32", "float64")}


def widened_dtype(widening: Any, narrowing: Any, what: str) -> str:
    """The dtype ``what`` runs in between the cast ``widening`` (to it) and ``narrowing``
    (back to the dtype it started in); refused outside :data:`WIDENED_STATISTICS`.
    """
    narrow = dtype_of(type_of(widening.args[0]))
    wide, back = str(widening.attrs.dtype), str(narrowing.attrs.dtype)
    if back != narrow:
        raise reject(f"{what} runs in {wide} from {narrow} and is cast to {back}, not back "
                     f"to {narrow}", at=narrowing)
    if wide not in WIDENED_STATISTICS.get(narrow or "", ()):
        raise reject(f"{what} runs in {wide} between casts of {narrow} x: TVM's layer_norm "
                     f"computes {narrow} norms in float32, a precision the model did not "
                     f"ask for (float16 and bfloat16 widened to float32 or float64 only)",
                     at=widening)
    return wide


def shape_and_dtype(x: Any) -> tuple[tuple[Any, ...], str | None]:
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


def reduced_trailing_axes(call: Any, ndim: int, what: str, reshaped: bool = False) -> int:
    """How many trailing axes the reduction ``call`` reduces, with ``keepdims=True``, or
    with ``keepdims=False`` where the result is ``reshaped`` back (checked by
    :func:`same_as_mean`).
    """
    attrs = call.attrs
    found = int_list(attrs.axis)
    if not bool(attrs.keepdims) and not reshaped:
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
    assert shape is not None  # per_feature_shape refused an unknown shape
    return len(shape) != k


def as_feature_tensor(value: Any, features: tuple, reshape: bool) -> Any:
    """``value``, reshaped to ``features`` (the fused op's parameter shape) if ``reshape``."""
    if not reshape:
        return value
    if is_constant(value):
        return relax.const(const_value(value).reshape([int(d) for d in features]))
    return relax.op.reshape(value, features)


def same_shape(a: tuple | None, b: tuple | None) -> bool:
    """Two shapes proved equal (an undecidable symbolic comparison is not)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(dims_equal(p, q) is True for p, q in zip(a, b))


def same_as_mean(reshape: Any, mean: Any, what: str) -> None:
    """Refuse unless ``reshape`` (a reduction reshaped back) has the shape of ``mean`` (the
    same reduction with ``keepdims=True``): then it broadcasts against x as the mean does.
    """
    found, wanted = static_shape(type_of(reshape)), static_shape(type_of(mean))
    if not same_shape(found, wanted):
        raise reject(f"{what} is reshaped to {_dims(found)}, not to the mean's shape "
                     f"{_dims(wanted)}: it does not broadcast against x as the mean does",
                     at=reshape)


def _dims(shape: tuple | None) -> str:
    return "an unknown shape" if shape is None else f"({', '.join(str(d) for d in shape)})"
