"""Shapes for rule authors: per-channel and per-feature parameters, trailing axes.

Frontends spell a per-channel parameter many ways (``(C,)``, ``(C, 1, 1)``,
``(1, C, 1, 1)``), and broadcasting right-aligns them, so ``(C,)`` against an ``NCHW``
tensor varies along ``W``, not ``C``.  A rule that folds or collapses per-channel
arithmetic must find the axis the way broadcasting does, or it changes the numbers when
a dimension merely happens to equal the channel count.

Shapes may be symbolic (``(n, c, h, w)``).  A guard then needs a proof, not a hope:
:func:`prove_equal` asks TVM's arithmetic analyzer (``tvm.sym.Analyzer``) at
``ProofStrength.SYMBOLIC_BOUND``, where the 0.27 wheel falls back to Z3, and a condition
that cannot be proved is refused with the condition in the reason (``cannot prove
c == w``).

Normalisations (layer norm, RMS norm) reduce the *trailing* axes and scale by
*per-feature* parameters whose shape is the normalised dims; their guards compare
symbolic dimensions (``n``, ``seq``), which :func:`dims_equal` decides with
``tvm.sym.Analyzer`` or reports as undecidable.
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm
from tvm.sym import Analyzer, ProofStrength


class NotPerChannel(ValueError):
    """A tensor is not a per-channel parameter of another; the message says why."""


def _prim(value: Any, like: Any) -> Any:
    """``value`` as a PrimExpr of ``like``'s dtype (shape dims are int64)."""
    if isinstance(value, int):
        dtype = str(like.ty) if isinstance(getattr(like, "ty", None), tvm.ir.PrimType) else "int64"
        return tvm.tirx.IntImm(dtype, value)
    return value


def prove_equal(a: Any, b: Any) -> bool:
    """Whether two shape dimensions (ints or PrimExprs) are equal for every binding of
    their symbolic variables; ints compare directly, the rest asks the analyzer.
    """
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    a, b = _prim(a, b), _prim(b, a)
    analyzer = Analyzer()
    return bool(analyzer.can_prove(tvm.tirx.EQ(a, b), ProofStrength.SYMBOLIC_BOUND))


def same_shape(a: Sequence[Any] | None, b: Sequence[Any] | None) -> bool:
    """Two shapes are provably equal (same rank, every dimension :func:`prove_equal`)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(prove_equal(x, y) for x, y in zip(a, b))


def is_one(dim: Any) -> bool:
    """The dimension is provably 1 (a symbolic one that might be 1 is not)."""
    return prove_equal(dim, 1)


def per_channel_axis(param_shape: Sequence[Any] | None, x_shape: Sequence[Any], *,
                     name: str = "the parameter", of: str = "x") -> int:
    """The axis of ``x`` along which a tensor of ``param_shape`` varies once broadcast.

    Parameters
    ----------
    param_shape : sequence of int or PrimExpr, or None
        The parameter's shape (``None``: unknown).
    x_shape : sequence of int or PrimExpr
        The shape of the tensor the parameter broadcasts against.
    name, of : str
        How the reason names the parameter and the tensor (``"gamma"``, ``"x"``).

    Returns
    -------
    int
        The one axis of ``x`` where the right-aligned parameter has a dimension that is
        not provably 1, and whose size provably equals ``x``'s there.

    Raises
    ------
    NotPerChannel
        The parameter has no known shape, more dimensions than ``x``, no or several
        dimensions that are not provably 1, or a size that is not provably ``x``'s on
        its axis (the unproved condition is in the message).  The message is the
        reason, ready for :func:`patternkit.reject`.
    """
    if param_shape is None:
        raise NotPerChannel(f"{name} has no known shape")
    shape, n = tuple(param_shape), len(x_shape)
    if len(shape) > n:
        raise NotPerChannel(f"{name} has more dimensions ({len(shape)}) than {of} ({n})")
    padded = (1,) * (n - len(shape)) + shape
    varying = [i for i, d in enumerate(padded) if not is_one(d)]
    if len(varying) != 1:
        raise NotPerChannel(f"{name} has shape {_text(shape)}: a per-channel parameter "
                            f"varies along exactly one axis of {of} {_text(x_shape)}")
    axis = varying[0]
    size, channels = x_shape[axis], padded[axis]
    if not prove_equal(channels, size):
        if isinstance(channels, int) and isinstance(size, int):
            raise NotPerChannel(f"{name} has {channels} channels on axis {axis}, {of} has "
                                f"{size}")
        where = (f"has size {size}" if isinstance(size, int)
                 else f"has the symbolic size {size}")
        raise NotPerChannel(f"{name} varies along axis {axis}, where {of} {where}: "
                            f"cannot prove {channels} == {size}")
    return axis


def _text(shape: Sequence[Any]) -> str:
    """A shape as the user reads it: ``(2, n, 4)``, not ``(2, T.int64(n), 4)``."""
    items = [str(d) for d in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


# -- normalisations: trailing axes and per-feature parameters ----------------------------------
class NotTrailing(ValueError):
    """A reduction does not reduce the trailing axes of its input; the message says why."""


class NotPerFeature(ValueError):
    """A tensor is not a per-feature parameter of a normalisation; the message says why.

    Raised both when the shapes are shown to differ and when a symbolic comparison
    cannot be decided: a guard that cannot be decided must not fire either way.
    """


def dims_equal(a: Any, b: Any) -> bool | None:
    """Are two dimensions equal?  ``True`` or ``False`` when decided, ``None`` when not.

    Integers compare directly.  A symbolic dimension (a ``tvm.tirx`` expression) is
    compared with ``tvm.sym.Analyzer``: ``n`` equals ``n`` and ``n * 2`` equals
    ``n + n``, ``n + 1`` differs from ``n``, but ``n`` against ``16`` or against another
    variable ``m`` cannot be decided (``None``): the model may run with ``n == 16``.
    """
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    analyzer = Analyzer()
    a, b = _prim(a, b), _prim(b, a)
    if analyzer.can_prove_equal(a, b):
        return True
    if analyzer.can_prove(tvm.tirx.NE(a, b)):
        return False
    return None


def trailing_axes(axes: Sequence[Any] | None, ndim: int, *, what: str = "the reduction",
                  of: str = "x") -> int:
    """How many trailing axes of a rank-``ndim`` tensor ``axes`` names.

    ``axes`` is a reduction's ``axis`` attribute (negative axes count from the end,
    ``None`` reduces every axis).  The answer ``k`` means the reduction is over the last
    ``k`` axes exactly, as a layer norm or an RMS norm normalises.

    Raises
    ------
    NotTrailing
        An axis is out of range or repeated, or the axes are not the last ones (the
        message names them, ready for :func:`patternkit.reject`).
    """
    if axes is None:
        return ndim
    found = [int(a) for a in axes]
    known = _TRAILING.get((ndim, *found))
    if known is not None:
        return known
    normalised = []
    for axis in found:
        if not -ndim <= axis < ndim:
            raise NotTrailing(f"{what} reduces axis {axis}, which a rank-{ndim} {of} does "
                              f"not have")
        normalised.append(axis % ndim)
    k = len(set(normalised))
    if k != len(normalised) or not k:
        raise NotTrailing(f"{what} reduces the axes {found} of a rank-{ndim} {of}: "
                          f"expected distinct axes")
    if sorted(normalised) != list(range(ndim - k, ndim)):
        raise NotTrailing(f"{what} reduces the axes {found} of a rank-{ndim} {of}, not its "
                          f"last {k}")
    if len(_TRAILING) < 4096:
        _TRAILING[(ndim, *found)] = k
    return k


#: ``(ndim, *axes) -> k`` for the reductions :func:`trailing_axes` accepted: the
#: normalisation rules ask it twice per match, almost always for ``axis=[-1]``.  Only
#: answers are kept (a refusal's message names its caller's ``what``).
_TRAILING: dict[tuple[int, ...], int] = {}


def per_feature_shape(param_shape: Sequence[Any] | None, x_shape: Sequence[Any], k: int, *,
                      name: str = "the parameter", of: str = "x") -> tuple[Any, ...]:
    """Check that a parameter varies exactly along the last ``k`` dimensions of ``x``.

    A layer norm's ``gamma`` and ``beta`` (an RMS norm's weight) broadcast against ``x``
    right-aligned; they are per-feature when their shape, after any leading unit
    dimensions, *is* ``x.shape[-k:]``, the normalised dims.  A ``(1,)`` gamma (one
    value), a ``(5, 16)`` gamma that also varies along the sequence, or a ``(16,)``
    gamma for a norm over the last two axes are not: collapsing them into
    ``layer_norm`` (which takes the normalised shape) would change the numbers or fail
    to type-check.  onnxruntime's ``LayerNormFusion`` skipped this check
    (microsoft/onnxruntime#25855).

    Returns
    -------
    tuple
        The parameter's shape without its leading unit dimensions (``k`` long): the
        shape ``layer_norm`` needs.

    Raises
    ------
    NotPerFeature
        Unknown shape, more dimensions than ``x`` or fewer than ``k``, a leading
        dimension other than one, a dimension shown to differ, or one whose equality
        cannot be decided.
    """
    features = tuple(x_shape[len(x_shape) - k:])
    if param_shape is None:
        raise NotPerFeature(f"{name} has no known shape")
    shape = tuple(param_shape)
    if len(shape) > len(x_shape):
        raise NotPerFeature(f"{name} has more dimensions ({len(shape)}) than {of} "
                            f"({len(x_shape)})")
    if len(shape) < k:
        raise NotPerFeature(f"{name} has shape {shape}: it must cover the normalised dims "
                            f"{features}")
    for extra in shape[:len(shape) - k]:
        unit = dims_equal(extra, 1)
        if unit is None:
            raise NotPerFeature(f"{name} has shape {shape}: cannot decide whether its "
                                f"leading dim {extra} is 1")
        if not unit:
            raise NotPerFeature(f"{name} has shape {shape}: it varies along more than "
                                f"the normalised dims {features}")
    for have, want in zip(shape[len(shape) - k:], features):
        same = dims_equal(have, want)
        if same is None:
            raise NotPerFeature(f"{name} has shape {shape}: cannot decide whether its dim "
                                f"{have} equals the normalised dim {want}")
        if not same:
            raise NotPerFeature(f"{name} has shape {shape}: it must equal the "
                                f"normalised dims {features}")
    return shape[len(shape) - k:]
