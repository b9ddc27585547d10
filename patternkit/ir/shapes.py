"""Shapes for rule authors: along which axis a per-channel parameter broadcasts.

Frontends spell a per-channel parameter many ways (``(C,)``, ``(C, 1, 1)``,
``(1, C, 1, 1)``), and broadcasting right-aligns them, so ``(C,)`` against an ``NCHW``
tensor varies along ``W``, not ``C``.  A rule that folds or collapses per-channel
arithmetic must find the axis the way broadcasting does, or it changes the numbers when
a dimension merely happens to equal the channel count.
"""

from __future__ import annotations

from typing import Any, Sequence


class NotPerChannel(ValueError):
    """A tensor is not a per-channel parameter of another; the message says why."""


def per_channel_axis(param_shape: Sequence[Any] | None, x_shape: Sequence[Any], *,
                     name: str = "the parameter", of: str = "x") -> int:
    """The axis of ``x`` along which a tensor of ``param_shape`` varies once broadcast.

    Parameters
    ----------
    param_shape : sequence of int, or None
        The parameter's static shape (``None`` or a symbolic dimension: not static).
    x_shape : sequence of int or PrimExpr
        The shape of the tensor the parameter broadcasts against.
    name, of : str
        How the reason names the parameter and the tensor (``"gamma"``, ``"x"``).

    Returns
    -------
    int
        The one axis of ``x`` where the right-aligned parameter has a non-unit
        dimension, which equals ``x``'s size there.

    Raises
    ------
    NotPerChannel
        The parameter has no static shape, more dimensions than ``x``, no or several
        non-unit dimensions, or a size that differs from ``x``'s on its axis.  The
        message is the reason, ready for :func:`patternkit.reject`.
    """
    if param_shape is None or any(not isinstance(d, int) for d in param_shape):
        raise NotPerChannel(f"{name} has no static shape")
    shape, n = tuple(param_shape), len(x_shape)
    if len(shape) > n:
        raise NotPerChannel(f"{name} has more dimensions ({len(shape)}) than {of} ({n})")
    padded = (1,) * (n - len(shape)) + shape
    varying = [i for i, d in enumerate(padded) if d != 1]
    if len(varying) != 1:
        raise NotPerChannel(f"{name} has shape {shape}: a per-channel parameter varies along "
                            f"exactly one axis of {of} {tuple(x_shape)}")
    axis = varying[0]
    size = x_shape[axis]
    if not isinstance(size, int):
        raise NotPerChannel(f"{name} varies along axis {axis}, where {of} has the symbolic "
                            f"size {size}")
    if padded[axis] != size:
        raise NotPerChannel(f"{name} has {padded[axis]} channels on axis {axis}, {of} has "
                            f"{size}")
    return axis
