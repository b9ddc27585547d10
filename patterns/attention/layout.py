"""The permutation and view algebra of attention's operands, pure (no match, no refusal).

``R.nn.attention`` takes BSNH tensors (batch, sequence, heads, head size); the models
compute in BNSH with ``permute_dims`` and, through the torch importer, with batch and heads
merged into one axis around 3-D matmuls.  These helpers compose those permutations and
tell whether a shape is a view of another (the same elements in the same order).
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm_ffi

from patternkit.ir import int_list, prove_equal

#: The head split and the attention's layout: BNSH <-> BSNH (its own inverse).
HEADS_FIRST = (0, 2, 1, 3)
#: The identity permutation of a 4-D tensor.
IDENTITY = (0, 1, 2, 3)
#: ``k^T`` (BNHS) back to the attention's BSNH key: the inverse of ``(0, 2, 3, 1)``.
KEY_FROM_TRANSPOSED = (0, 3, 1, 2)
#: The key's transpose in the ONNX form, BSNH to BNHS (written out by ``attention.expand``).
KEY_TRANSPOSED = (0, 2, 3, 1)
#: The plumbing the torch importer wraps around a batched matmul's operands.
OPERAND_PLUMBING = ("broadcast_to", "reshape")


def compose(inner: Sequence[int], outer: Sequence[int]) -> tuple[int, ...]:
    """Axes of ``permute_dims(permute_dims(x, inner), outer)`` as one ``permute_dims`` of x."""
    if len(outer) == 4:  # attention's operands: indexed directly (a check composes ~8)
        return (inner[outer[0]], inner[outer[1]], inner[outer[2]], inner[outer[3]])
    return tuple(inner[i] for i in outer)


def axes_of(call: Any, rank: int) -> tuple[int, ...]:
    """The axes of a ``permute_dims`` call (``None`` there means reversing them)."""
    axes = int_list(call.attrs.axes)
    return tuple(reversed(range(rank))) if axes is None else tuple(axes)


def shape_text(shape: Sequence[Any] | None) -> str:
    """``(2, 8, batch)``, or ``unknown``: a shape as the refusals quote it."""
    return "unknown" if shape is None else f"({', '.join(str(d) for d in shape)})"


def permuted(shape: Sequence[Any], axes: Sequence[int]) -> tuple:
    """``shape`` after ``permute_dims(., axes)``."""
    return compose(shape, axes)


def is_view(shape: Sequence[Any] | None, view: tuple, merged: bool = True) -> bool:
    """``shape`` is ``view`` or (``merged``) ``view`` with its first two axes merged."""
    if shape is None:
        return False
    if len(shape) == 4:
        for a, b in zip(shape, view):  # static dims (the usual case) compared as ints
            if not (a == b if type(a) is int and type(b) is int else prove_equal(a, b)):
                return False
        return True
    return (merged and len(shape) == 3 and prove_equal(shape[0], view[0] * view[1])
            and prove_equal(shape[1], view[2]) and prove_equal(shape[2], view[3]))


def spelled_alike(a: Any, b: Any) -> bool:
    """The same dimension written the same way (``batch`` and ``batch * 2 // 2`` are not)."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return bool(tvm_ffi.structural_equal(a, b))
