"""Shapes for rule authors: along which axis a per-channel parameter broadcasts.

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
    their symbolic variables; ints compare directly, the rest asks the analyzer."""
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
