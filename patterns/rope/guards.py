"""The rope composites' guards: the slices and the concat really are a rotation of ``x``.

A backend's rotary kernel rotates lane pairs of ``x`` by the angles whose cosines and
sines it is given: ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)``.  The written-out
graph says which lanes pair up only through its ``strided_slice``s and ``concat``: the
guards read them and refuse, with the reason, slices that do not cut ``x``'s rotated
lanes in two halves (or into even and odd lanes), a concat that puts the halves back
otherwise than ``(-second, first)``, ``cos`` / ``sin`` tables that do not broadcast
against ``x`` alike, and constant tables that are no cosine and sine of one angle.

Shapes are read with :func:`.lengths.refined_type`: ``from_onnx`` gives the tables of a
dynamic sequence a length of their own (``range_len_0``) and the rotation an unknown
shape; where the function proves that length is the sequence, the guards see the shapes
TVM infers with it, and where it does not, the refusal names the length.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import tvm

from patternkit.engine import RoleMatch, reject
from patternkit.ir import prove_equal, same_shape, static_shape

from .lengths import refined_type

#: ``Slice.end`` of a slice that runs to the last lane (the last lane's index + 1 or more).
_END = -1


class Slice(NamedTuple):
    """One ``strided_slice`` of one axis: ``begin:end:stride`` of ``axis``."""

    axis: int
    begin: int
    end: int
    stride: int


def read_slice(call: Any) -> Slice | None:
    """The slice ``call`` takes, or ``None`` when it slices several axes or unknown bounds."""
    try:
        axes, begin, end, strides = ([int(e.value) for e in arg.fields] for arg in call.args[1:5])
    except (AttributeError, TypeError, ValueError):
        return None
    if not (len(axes) == len(begin) == len(end) == len(strides) == 1):
        return None
    return Slice(axes[0], begin[0], end[0], strides[0])


def shape_of(expr: Any) -> tuple[Any, ...] | None:
    """``expr``'s shape, with the lengths the function proves substituted (``None``:
    unknown).
    """
    return static_shape(refined_type(expr))


def rank_of(expr: Any) -> int | None:
    """``expr``'s rank, known even where its shape is not (``None``: unknown)."""
    ndim = getattr(refined_type(expr), "ndim", -1)
    return None if ndim is None or int(ndim) < 0 else int(ndim)


def _lanes(x: Any) -> tuple[int, int] | None:
    """``(rank, last dimension)`` of ``x`` when the last dimension is static."""
    shape = shape_of(x)
    if not shape or not isinstance(shape[-1], int):
        return None
    return len(shape), shape[-1]


def halves_refusal(match: RoleMatch, interleaved: bool) -> Any:
    """``None`` when ``negated`` and ``kept`` are the second and first halves of ``x``'s
    last axis (even and odd lanes, interleaved: ``-odd`` and ``even``), else the refusal.
    """
    lanes = _lanes(match.var_of("x"))
    if lanes is None:
        return reject("the rotated tensor's last dimension is not static: the rotation's "
                      "halves cannot be checked", at=match.x)
    rank, width = lanes
    negated, kept = read_slice(match.negated), read_slice(match.kept)
    if interleaved:
        want_negated, want_kept = Slice(rank - 1, 1, _END, 2), Slice(rank - 1, 0, _END, 2)
        what = "the odd lanes negated and the even lanes kept, stride 2"
    else:
        half = width // 2
        want_negated, want_kept = Slice(rank - 1, half, _END, 1), Slice(rank - 1, 0, half, 1)
        what = f"lanes [{half}, {width}) negated and lanes [0, {half}) kept"
    if (width % 2 == 0 and _same(negated, want_negated, rank, width)
            and _same(kept, want_kept, rank, width)):
        return None
    return reject(f"the concat puts back {_describe(negated)} negated and {_describe(kept)} "
                  f"of the rotated tensor's {width} lanes: rotate_half is {what}",
                  at=match.rotated)


def _same(got: Slice | None, want: Slice, rank: int, width: int) -> bool:
    """``got`` is ``want``; a ``want.end`` of :data:`_END` is any end at or past ``width``."""
    if got is None or got.axis % rank != want.axis or got.stride != want.stride:
        return False
    end_ok = got.end >= width if want.end == _END else got.end == want.end
    return got.begin == want.begin and end_ok


def _describe(got: Slice | None) -> str:
    if got is None:
        return "a slice of several axes or unknown bounds"
    return f"axis {got.axis} [{got.begin}:{got.end}:{got.stride}]"


def concat_refusal(match: RoleMatch, interleaved: bool) -> Any:
    """``None`` when the concat joins along ``x``'s last axis (the new last axis of the
    lane pairs, interleaved).
    """
    axis = int(match.concat.attrs.axis)
    x_rank = rank_of(match.var_of("x"))
    if x_rank is None:
        return reject(f"the concat joins along axis {axis} of a tensor of unknown rank: "
                      f"rotate_half concatenates along the last axis", at=match.concat)
    rank = x_rank + int(interleaved)
    if axis % rank == rank - 1:
        return None
    return reject(f"the concat joins along axis {axis} of a rank-{rank} tensor: rotate_half "
                  f"concatenates along the last axis", at=match.concat)


def tables_refusal(match: RoleMatch) -> Any:
    """``None`` when ``cos`` and ``sin`` have one shape and broadcast to ``x``'s shape
    without widening it (the sum then has ``x``'s shape too).
    """
    x_shape = shape_of(match.var_of("x"))
    cos, sin = (shape_of(match[role]) for role in ("cos", "sin"))
    if same_shape(cos, sin) and _broadcasts_to(cos, x_shape):
        return _pair_refusal(match)
    return reject(f"cos of shape {cos} and sin of shape {sin} do not both broadcast to the "
                  f"rotated tensor's shape {x_shape}: a rotary table has one angle per lane"
                  f"{_unproven(x_shape, cos, sin)}", at=match.add)


def _broadcasts_to(table: Any, x_shape: Any) -> bool:
    """A tensor of shape ``table`` broadcasts to ``x_shape`` and leaves it as it is: each
    of its dimensions, aligned on the right, is 1 or provably ``x``'s.
    """
    if table is None or x_shape is None or len(table) > len(x_shape):
        return False
    return all(prove_equal(t, 1) or prove_equal(t, x)
               for t, x in zip(reversed(table), reversed(x_shape)))


def _unproven(x_shape: Any, *tables: Any) -> str:
    """The tables' symbolic lengths that are none of ``x``'s, as a clause (or ``""``)."""
    known = {getattr(d, "name", None) for d in x_shape or ()}
    names = sorted({d.name for table in tables for d in table or ()
                    if tvm.ir.is_prim_var(d) and d.name not in known})
    if not names:
        return ""
    return (f" ({', '.join(names)}: a length the function computes and does not prove "
            f"equal to a dimension of the rotated tensor)")


def _pair_refusal(match: RoleMatch) -> Any:
    """``None`` unless ``cos`` and ``sin`` are constants with ``cos^2 + sin^2`` away from 1."""
    cos, sin = match.cos, match.sin
    if not (isinstance(cos, tvm.ir.Constant) and isinstance(sin, tvm.ir.Constant)):
        return None  # given as inputs or computed: their values are not known here
    c, s = (np.asarray(t.value.numpy(), dtype="float64") for t in (cos, sin))
    norm = c * c + s * s
    tolerance = 4 * float(np.finfo(str(cos.value.dtype)).eps)
    worst = float(np.abs(norm - 1).max(initial=0.0))
    if worst <= tolerance:
        return None
    return reject(f"the constant tables are not the cosine and sine of one angle: cos^2 + "
                  f"sin^2 differs from 1 by up to {worst:.3g}", at=cos)


def partial_refusal(match: RoleMatch) -> Any:
    """``None`` when the rotated lanes are ``full[..., :r]`` and the passed-through lanes
    ``full[..., r:]``, joined back along the last axis in that order.
    """
    lanes = _lanes(match.var_of("full"))
    rotated, passed = read_slice(match.x), read_slice(match.passed)
    if lanes is None:
        return reject("the partially rotated tensor's last dimension is not static: the "
                      "rotated and the passed lanes cannot be checked", at=match.joined)
    if rotated is not None:
        rank, width = lanes
        r = rotated.end
        if (_same(rotated, Slice(rank - 1, 0, r, 1), rank, width) and 0 < r < width
                and _same(passed, Slice(rank - 1, r, _END, 1), rank, width)
                and int(match.joined.attrs.axis) % rank == rank - 1):
            return None
    return reject(f"the partial rotation rotates {_describe(rotated)} and passes "
                  f"{_describe(passed)} through, joined along axis "
                  f"{int(match.joined.attrs.axis)}: a partial rotary embedding rotates lanes "
                  f"[0, r) of the last axis and concatenates lanes [r, end) after them",
                  at=match.joined)
