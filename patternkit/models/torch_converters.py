"""Converters handed to TVM 0.27's torch importer for torch ops it refuses or mis-imports.

Each one covers a spelling users write that ``from_exported_program`` cannot import
(``docs/tvm-bugs.md``); every other call of the same op goes through TVM's converter
unchanged, so a model TVM imports imports exactly as without them.

- ``amax`` / ``amin`` (``x - x.amax(-1, keepdim=True)``, a softmax written out): TVM has
  no converter ("Unsupported function types ['amax.default']"); they are ``R.max`` /
  ``R.min`` over the same axes.
- ``repeat`` with a symbolic count (``nn.InstanceNorm2d(affine=True)`` on a dynamic
  batch repeats its weight and bias per sample): TVM emits ``R.tile``, which takes
  integers only.  A symbolic repeat is a reshape that interleaves unit axes, a
  ``broadcast_to`` of them, and a reshape back.
- ``view`` / ``reshape`` to a shape with a symbolic extent (the same instance norm views
  its input as (1, N*C, H, W)): TVM's check for a reshape to the same shape compares the
  extents with ``==``, which raises on a symbolic one ("Cannot use and / or / not
  operator to Expr").  Here an extent is the same only when torch's and the input's are
  the same expression; the reshape is TVM's.
- ``_native_batch_norm_legit.no_stats`` (what instance norm decomposes into) on a
  symbolic channel count: TVM reads the count as an ``int``.  The default weight and bias
  are then ``ones`` / ``zeros`` of that count.
- bfloat16 ``native_layer_norm``, ``native_group_norm`` and instance norm: TVM refuses a
  bfloat16 ``group_norm``, and TVM 0.27 has no llvm kernel for a bfloat16 ``layer_norm``
  or ``instance_norm``.  They import as the float32 op between casts,
  ``astype(norm(astype(x, float32), gamma_f32, beta_f32), bfloat16)``: torch computes
  them in float32 too, and the library's norm rules collapse that form.
- bfloat16 ``pow(x, 2)`` and ``pow(x, 0.5)`` (a layer norm written out, ``(x -
  mean).pow(2)``; ``F.normalize``'s norm): TVM 0.27 cannot build a bfloat16 ``R.power``
  for llvm ("power only applies to float").  They import as ``x * x`` and ``sqrt(x)``,
  which is what torch computes for these two exponents (its ``pow`` takes ``x * x`` and
  ``sqrt`` for them): bit for bit the same on every finite bfloat16 value, in torch and
  built by TVM (each a float32 product or square root of bfloat16 operands, rounded once).
- bfloat16 ``linalg_vector_norm`` of order 2 (``F.normalize``'s norm): TVM writes it with
  ``R.power``, which does not build.  It imports as torch computes it, in float32 between
  casts: ``astype(sqrt(sum(x32 * x32)), bfloat16)`` with ``x32 = astype(x, float32)``.

- ``cumsum`` of a bool or integer tensor with no ``dtype``: torch sums it in int64, TVM
  in the input's dtype.  A bool sum does not build for llvm (every transformers decoder
  exported without an ``attention_mask`` sums bools to find packed sequences), and the ops
  after it are typed from it (``c * 2`` multiplied by a bool ``True``).  It imports as
  torch computes it, ``cumsum(x, dim, "int64")``.

- ``add``, ``sub``, ``mul``, ``div`` of an integer tensor whose torch result is a float
  (``ids * 0.5``, ``ids / 2``): TVM keeps the tensor's integer dtype and makes the
  scalar an integer constant, so ``ids * 0.5`` is all zeros and ``ids / 2`` rounds, with
  no error (``docs/tvm-bugs.md``).  They import as torch computes them: the operands cast
  to the result's dtype (read from the node's ``val``, torch's own type promotion), then
  the op.
- ``div`` with a rounding mode (``ids // 2``, ``torch.div(ids, 2, rounding_mode="floor")``)
  of a tensor by a Python scalar or by a tensor of another dtype: TVM makes ``2`` an
  int32 constant beside int64 ids and the import fails on the mixed dtypes.  It imports
  in torch's result dtype.
- ``clamp`` of an integer tensor with one bound left out (``lengths.clamp(min=1)``): TVM
  clips at infinity, which does not build for integers.  It clips at the dtype's limit.

Pass :meth:`TorchConverters.convert_map` as ``custom_convert_map`` (with the converters
of :mod:`.low_precision`, which own other ops); :meth:`TorchConverters.notes` says what
was converted.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm import relax, tirx

from ..ir import dtype_of, type_of
from .fallback_converters import Converter, FallbackConverters

#: Norms of this dtype are computed in :data:`NORM_DTYPE` between casts.
CAST_NORM_DTYPE = "bfloat16"
NORM_DTYPE = "float32"
#: ``pow`` of this dtype by these exponents imports as the op torch computes them with.
POWER_DTYPE = "bfloat16"
EXACT_POWERS: dict[float, Callable[[relax.Expr], relax.Expr]] = {
    2.0: lambda x: relax.op.multiply(x, x), 0.5: relax.op.sqrt}


class TorchConverters(FallbackConverters):
    """The ``custom_convert_map`` of one import; counts what it converted, per torch op."""

    def convert_map(self) -> dict[str, Converter]:
        """Torch op -> converter, for ``from_exported_program(custom_convert_map=...)``."""
        return {op: self._converter(op, convert) for op, (convert, _) in _CONVERTERS.items()}

    def notes(self) -> list[str]:
        """One line per converted torch op (empty when none was), in the words ``patternkit
        run`` logs.
        """
        return [f"{count} {op} {_CONVERTERS[op][1]}"
                for op, count in sorted(self.converted.items())]

    def _converter(self, op: str, convert: Callable[[Any, Any], relax.Var | None]
                   ) -> Converter:
        def converter(node: Any, importer: Any) -> relax.Var:
            result = convert(node, importer)
            if result is None:  # a call TVM imports: its own converter runs
                return self._original(importer, op)(node)
            self.converted[op] += 1
            return result

        return converter


def _reduce(op: Callable[..., relax.Expr]) -> Callable[[Any, Any], relax.Var]:
    """``amax``/``amin``: (x, dim=[], keepdim=False); an empty ``dim`` reduces every axis."""

    def convert(node: Any, importer: Any) -> relax.Var:
        x = importer.env[node.args[0]]
        dim = _argument(node, 1, "dim", [])
        keepdim = _argument(node, 2, "keepdim", False)
        axes = [dim] if isinstance(dim, int) else list(dim)
        return importer.block_builder.emit(op(x, axes or None, bool(keepdim)))

    return convert


def _repeat(node: Any, importer: Any) -> relax.Var | None:
    """``repeat(x, counts)`` with a symbolic count (None when all are integers)."""
    x = importer.env[node.args[0]]
    counts = list(importer.retrieve_args(node)[1])
    if all(isinstance(c, int) for c in counts):
        return None
    shape = [1] * (len(counts) - len(importer.shape_of(x))) + list(importer.shape_of(x))
    builder = importer.block_builder
    interleaved = [d for extent in shape for d in (1, extent)]
    spread = [d for count, extent in zip(counts, shape) for d in (count, extent)]
    out = builder.emit(relax.op.broadcast_to(relax.op.reshape(x, interleaved), spread))
    return builder.emit(relax.op.reshape(out, [c * e for c, e in zip(counts, shape)]))


def _view(node: Any, importer: Any) -> relax.Var | None:
    """``view``/``reshape``: (x, shape) where TVM's identity check raises (None when it
    does not: TVM's converter runs).
    """
    args = importer.retrieve_args(node)
    x = args[0]
    dims = list(args[1]) if isinstance(args[1], (list, tuple)) else list(args[1:])
    shape = importer.shape_of(x)
    if shape is None:
        return None
    try:
        list(shape) == dims  # noqa: B015 - TVM's check, asked whether it raises
        return None
    except ValueError:
        pass
    if len(shape) == len(dims) and all(map(_same, shape, dims)):
        return x
    return importer._emit_torch_reshape(x, dims)


def _same(extent: Any, dim: Any) -> bool:
    """Whether two extents are the same: equal integers, or the same expression."""
    if isinstance(dim, int):
        return _is_static(extent) and int(extent) == dim
    return bool(extent.same_as(dim))


def _is_static(extent: Any) -> bool:
    """Whether a shape's extent is an integer (not a symbolic expression)."""
    return isinstance(extent, (int, tirx.IntImm))


def _float32_norm(importer: Any, norm: Callable[..., relax.Expr], x: relax.Expr,
                  gamma: relax.Expr, beta: relax.Expr, **attrs: Any) -> relax.Var:
    """``norm`` of ``x`` (bfloat16) computed in float32 between casts."""
    builder = importer.block_builder
    widened = [relax.op.astype(t, NORM_DTYPE) if dtype_of(type_of(t)) != NORM_DTYPE else t
               for t in (x, gamma, beta)]
    out = builder.emit(norm(*widened, **attrs))
    return builder.emit(relax.op.astype(out, dtype_of(type_of(x))))


def _argument(node: Any, at: int, name: str, default: Any = None) -> Any:
    """The FX node's argument at position ``at``, else its keyword ``name``, else
    ``default``: torch.export passes an aten argument either way.
    """
    return node.args[at] if len(node.args) > at else node.kwargs.get(name, default)


def _param(importer: Any, node: Any, at: int) -> relax.Expr | None:
    arg = node.args[at] if len(node.args) > at else None
    return importer.env.get(arg) if arg is not None else None


def _is_cast_norm(x: relax.Expr) -> bool:
    return dtype_of(type_of(x)) == CAST_NORM_DTYPE


def _layer_norm(node: Any, importer: Any) -> relax.Var | None:
    """``native_layer_norm``: (x, normalized_shape, weight, bias, eps), bfloat16 only."""
    x = importer.env[node.args[0]]
    if not _is_cast_norm(x):
        return None
    normalized = [int(d) for d in node.args[1]]
    gamma = _param(importer, node, 2)
    beta = _param(importer, node, 3)
    gamma = relax.const(np.ones(normalized, NORM_DTYPE)) if gamma is None else gamma
    beta = relax.const(np.zeros(normalized, NORM_DTYPE)) if beta is None else beta
    eps = _argument(node, 4, "eps", 1e-5)
    return _float32_norm(importer, relax.op.nn.layer_norm, x, gamma, beta,
                         axes=list(range(-len(normalized), 0)), epsilon=eps)


def _group_norm(node: Any, importer: Any) -> relax.Var | None:
    """``native_group_norm``: (x, weight, bias, N, C, HxW, groups, eps), bfloat16 only."""
    x = importer.env[node.args[0]]
    if not _is_cast_norm(x):
        return None
    rank = len(importer.shape_of(x))
    channels = int(node.args[4])
    gamma = _param(importer, node, 1)
    beta = _param(importer, node, 2)
    gamma = relax.const(np.ones(channels, NORM_DTYPE)) if gamma is None else gamma
    beta = relax.const(np.zeros(channels, NORM_DTYPE)) if beta is None else beta
    return _float32_norm(importer, relax.op.nn.group_norm, x, gamma, beta,
                         num_groups=int(node.args[6]), channel_axis=1,
                         axes=list(range(2, rank)), epsilon=node.args[7])


def _instance_norm(node: Any, importer: Any) -> relax.Var | None:
    """``_native_batch_norm_legit.no_stats``: (x, weight, bias, training, momentum, eps),
    what ``InstanceNorm`` decomposes into (``x`` viewed as (1, N*C, ...), the weight
    repeated N times): a symbolic channel count, or bfloat16.
    """
    x = importer.env[node.args[0]]
    shape = importer.shape_of(x)
    if _is_static(shape[1]) and not _is_cast_norm(x):
        return None
    dtype = NORM_DTYPE if _is_cast_norm(x) else dtype_of(type_of(x))
    gamma = _param(importer, node, 1)
    beta = _param(importer, node, 2)
    gamma = relax.op.ones([shape[1]], dtype) if gamma is None else gamma
    beta = relax.op.zeros([shape[1]], dtype) if beta is None else beta
    eps = _argument(node, 5, "eps", 1e-5)
    attrs = dict(channel_axis=1, axes=[0, *range(2, len(shape))], epsilon=eps)
    if _is_cast_norm(x):
        return _float32_norm(importer, relax.op.nn.instance_norm, x, gamma, beta, **attrs)
    return importer.block_builder.emit(relax.op.nn.instance_norm(x, gamma, beta, **attrs))


def _vector_norm(node: Any, importer: Any) -> relax.Var | None:
    """``linalg_vector_norm``: (x, ord=2, dim=None, keepdim=False), a bfloat16 ``x`` of
    order 2 (None otherwise: TVM's converter runs).
    """
    x = importer.env[node.args[0]]
    order = _argument(node, 1, "ord", 2)
    if (dtype_of(type_of(x)) != POWER_DTYPE or isinstance(order, bool)
            or not isinstance(order, (int, float)) or float(order) != 2.0):
        return None
    dim = _argument(node, 2, "dim")
    keepdim = _argument(node, 3, "keepdim", False)
    axes = None if dim is None else [dim] if isinstance(dim, int) else list(dim)
    wide = relax.op.astype(x, NORM_DTYPE)
    total = relax.op.sum(relax.op.multiply(wide, wide), axes, bool(keepdim))
    return importer.block_builder.emit(relax.op.astype(relax.op.sqrt(total), POWER_DTYPE))


def _power(node: Any, importer: Any) -> relax.Var | None:
    """``pow.Tensor_Scalar``: (x, exponent), a bfloat16 ``x`` squared or square-rooted
    (None otherwise: TVM's converter runs).
    """
    x = importer.env[node.args[0]]
    exponent = _argument(node, 1, "exponent")
    if (dtype_of(type_of(x)) != POWER_DTYPE or isinstance(exponent, bool)
            or not isinstance(exponent, (int, float)) or float(exponent) not in EXACT_POWERS):
        return None
    return importer.block_builder.emit(EXACT_POWERS[float(exponent)](x))


#: Bool and integer dtypes: torch sums them in int64 and promotes them to a float operand's
#: dtype, where TVM's importer keeps them.
_INTEGERS = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                       "uint64"})
#: Those a ``cumsum`` that names no dtype changes (int64 is summed in int64 already).
_SUMMED_IN_INT64 = _INTEGERS - {"int64"}


def _cumsum(node: Any, importer: Any) -> relax.Var | None:
    """``cumsum``: (x, dim, dtype=None) of a bool or integer ``x`` with no dtype, summed
    in int64 as torch sums it (None otherwise: TVM's converter runs).
    """
    x = importer.env[node.args[0]]
    if "dtype" in node.kwargs or "out" in node.kwargs \
            or dtype_of(type_of(x)) not in _SUMMED_IN_INT64:
        return None
    dim = _argument(node, 1, "dim")
    return importer.block_builder.emit(relax.op.cumsum(x, dim, "int64"))


def _promoted(op: Callable[..., relax.Expr]) -> Callable[[Any, Any], relax.Var | None]:
    """``add``/``sub``/``mul``/``div``: (a, b) with an integer or bool tensor and a float
    result in torch, computed in that float dtype (None otherwise: TVM's converter runs).
    """

    def convert(node: Any, importer: Any) -> relax.Var | None:
        dtype = _result_dtype(node)
        if (len(node.args) != 2 or set(node.kwargs) - {"alpha"} or node.kwargs.get("alpha", 1) != 1
                or dtype not in _FLOATS):
            return None
        operands = _operands(node, importer, 2)
        if not any(isinstance(o, relax.Expr) and dtype_of(type_of(o)) in _INTEGERS
                   for o in operands):
            return None  # float operands: TVM's converter types them (not this bug)
        return importer.block_builder.emit(op(*(_in_dtype(o, dtype) for o in operands)))

    return convert


def _result_dtype(node: Any) -> str:
    """The dtype torch gives the FX node's result (its ``val``), ``""`` when unknown."""
    return str(getattr(node.meta.get("val"), "dtype", "")).replace("torch.", "")


def _operands(node: Any, importer: Any, count: int) -> list[Any]:
    """The node's first ``count`` arguments: Relax values for FX nodes, Python scalars
    as they are.
    """
    return [importer.env[a] if a in importer.env else a for a in node.args[:count]]


def _in_dtype(operand: Any, dtype: str) -> relax.Expr:
    """``operand`` (a Relax tensor or a Python scalar) as a value of ``dtype``."""
    if not isinstance(operand, relax.Expr):
        return relax.const(operand, dtype)
    return operand if dtype_of(type_of(operand)) == dtype else relax.op.astype(operand, dtype)


def _rounded_divide(mode_at: int | None) -> Callable[[Any, Any], relax.Var | None]:
    """``div.Tensor_mode`` (a, b, rounding_mode) and ``floor_divide`` (a, b), with a
    Python scalar or a tensor of another dtype than torch's result, computed in that
    dtype (None otherwise: TVM's converter runs).

    TVM's converter makes a scalar a constant of its own dtype (``2`` int32, ``2.0``
    float32), so ``ids // 2`` of int64 ids (position ids, packed sequences) and
    ``x // 2.0`` of a float16 ``x`` fail to import ("Binary operators must have the same
    datatype").  ``mode_at``: the rounding mode's argument position (``None``: floor).
    """

    def convert(node: Any, importer: Any) -> relax.Var | None:
        dtype = _result_dtype(node)
        mode = "floor" if mode_at is None else _argument(node, mode_at, "rounding_mode")
        if len(node.args) < 2 or dtype not in _INTEGERS | _FLOATS or mode not in _ROUNDINGS:
            return None
        operands = _operands(node, importer, 2)
        if all(isinstance(o, relax.Expr) and dtype_of(type_of(o)) == dtype for o in operands):
            return None  # one dtype already: TVM's converter imports it
        a, b = (_in_dtype(o, dtype) for o in operands)
        return importer.block_builder.emit(_ROUNDINGS[mode](a, b, dtype in _INTEGERS))

    return convert


def _truncated(a: relax.Expr, b: relax.Expr, integer: bool) -> relax.Expr:
    """``a / b`` rounded toward zero: an integer ``divide`` truncates already (TIR's
    division of integers is C's), a float one is truncated after it.
    """
    quotient = relax.op.divide(a, b)
    return quotient if integer else relax.op.trunc(quotient)


def _integer_clamp(min_at: int | None, max_at: int | None
                   ) -> Callable[[Any, Any], relax.Var | None]:
    """``clamp`` (x, min, max), ``clamp_min`` (x, min), ``clamp_max`` (x, max) of an
    integer tensor by integer bounds, one of them absent (None otherwise: TVM's
    converter runs).

    TVM's converter stands an absent bound in as an infinity, and a ``clip`` of an
    integer tensor by an infinity does not build ("Cannot convert infinity to BigInt"):
    ``lengths.clamp(min=1)``.  The absent bound is the dtype's own limit.
    """

    def convert(node: Any, importer: Any) -> relax.Var | None:
        x = importer.env[node.args[0]]
        dtype = dtype_of(type_of(x))
        if dtype not in _INTEGERS - {"bool"}:
            return None
        bounds = [None if at is None else _argument(node, at, name)
                  for at, name in ((min_at, "min"), (max_at, "max"))]
        if None not in bounds or not all(b is None or type(b) is int for b in bounds):
            return None
        limits = np.iinfo(dtype)
        low = int(limits.min) if bounds[0] is None else bounds[0]
        high = int(limits.max) if bounds[1] is None else bounds[1]
        return importer.block_builder.emit(relax.op.clip(x, low, high))

    return convert


#: Torch's rounding modes of a division that rounds, as Relax computes them.
_ROUNDINGS: dict[str, Callable[[relax.Expr, relax.Expr, bool], relax.Expr]] = {
    "floor": lambda a, b, integer: relax.op.floor_divide(a, b), "trunc": _truncated}
_ROUNDED = ("with a scalar or an operand of another dtype computed in torch's result dtype "
            "(TVM's importer makes 2 an int32 constant: int64 ids // 2 does not import)")

_CLAMPED = ("of an integer tensor with one bound clipped at its dtype's limit (TVM's "
            "importer clips at infinity, which does not build for integers)")

#: The float dtypes torch may promote an integer operand to.
_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
_PROMOTED = ("of an integer tensor with a float result computed in that float dtype, as "
             "torch does (TVM's importer keeps the integer dtype: ids * 0.5 is 0)")

_CAST = f"computed in {NORM_DTYPE} between casts ({CAST_NORM_DTYPE}: no TVM kernel)"
#: Torch op -> (converter, what the notes say of a converted call).
_CONVERTERS: dict[str, tuple[Callable[[Any, Any], relax.Var | None], str]] = {
    "amax.default": (_reduce(relax.op.max), "imported as max (TVM's importer has none)"),
    "amin.default": (_reduce(relax.op.min), "imported as min (TVM's importer has none)"),
    "repeat.default": (_repeat, "with a symbolic count imported as broadcast_to (TVM's "
                                "tile takes integers)"),
    "view.default": (_view, "to a symbolic shape imported without TVM's identity check "
                            "(it compares symbolic extents with ==)"),
    "reshape.default": (_view, "to a symbolic shape imported without TVM's identity check "
                               "(it compares symbolic extents with ==)"),
    "native_layer_norm.default": (_layer_norm, _CAST),
    "native_group_norm.default": (_group_norm, _CAST),
    "_native_batch_norm_legit.no_stats": (_instance_norm, "(instance norm) on a symbolic "
                                          "channel count or in bfloat16 imported by hand"),
    "linalg_vector_norm.default": (_vector_norm, f"({POWER_DTYPE}, order 2) {_CAST}"),
    "add.Tensor": (_promoted(relax.op.add), _PROMOTED),
    "sub.Tensor": (_promoted(relax.op.subtract), _PROMOTED),
    "mul.Tensor": (_promoted(relax.op.multiply), _PROMOTED),
    "div.Tensor": (_promoted(relax.op.divide), _PROMOTED),
    "div.Tensor_mode": (_rounded_divide(2), _ROUNDED),
    "clamp.default": (_integer_clamp(1, 2), _CLAMPED),
    "clamp_min.default": (_integer_clamp(1, None), _CLAMPED),
    "clamp_max.default": (_integer_clamp(None, 1), _CLAMPED),
    "floor_divide.default": (_rounded_divide(None), _ROUNDED),
    "cumsum.default": (_cumsum, "of a bool or integer tensor summed in int64, as torch does "
                                "(TVM's importer sums it in the input's dtype; bool does not "
                                "build)"),
    "pow.Tensor_Scalar": (_power, f"({POWER_DTYPE}, exponent 2 or 0.5) imported as x * x or "
                                  f"sqrt(x), as torch computes it (no TVM kernel for "
                                  f"{POWER_DTYPE} power)"),
}
