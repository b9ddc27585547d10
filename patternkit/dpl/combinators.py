"""Pattern combinators every rule author needs: plumbing, casts, and common spellings.

Frontends wrap the interesting ops in plumbing.  The torch importer reshapes and
``broadcast_to``-s both operands of every batched matmul, ONNX and torch insert
``expand_dims`` for broadcasting, and Llama-style models compute a norm in float32
between two ``astype`` casts.  A rule that spells out each wrapping explodes into
variants; these combinators say "this, possibly wrapped" once.

Alternatives are ordered so that the wrapped forms are tried first: a wildcard would
otherwise capture the wrapper itself and the look-through would never happen.

Frontends also spell one computation several ways: ``x ** 2`` arrives as ``power(x,
2)``, ``x * x`` or ``square(x)``, and a normalisation divides by ``sqrt(v)`` or
multiplies by ``rsqrt(v)``.  :func:`square` and :func:`divide_by_sqrt` say each once,
and :func:`products` writes a product of several factors in every grouping.
"""

from __future__ import annotations

from itertools import combinations, product
from typing import Any, Sequence

from ..errors import PatternError
from .pattern import DFPattern, as_pattern, is_op, is_scalar

__all__ = ["PLUMBING_OPS", "through", "up_to_cast", "square", "divide_by_sqrt", "products"]

#: Operators that change how a tensor is laid out or broadcast, not its values.
PLUMBING_OPS = ("reshape", "broadcast_to", "expand_dims")


def through(pattern: Any, ops: Sequence[str] = PLUMBING_OPS, depth: int = 2) -> DFPattern:
    """``pattern`` itself, or ``pattern`` under a chain of up to ``depth`` of ``ops``.

    ``through(k, ("reshape", "broadcast_to"))`` matches ``k``, ``reshape(k, *)``,
    ``broadcast_to(k, *)`` and ``reshape(broadcast_to(k, *), *)`` (and the other order):
    each wrapper's other arguments (the target shape, the axes) are free.  The value
    captured by a wildcard inside ``pattern`` is the unwrapped one.

    Parameters
    ----------
    pattern : pattern or Relax expression
    ops : operator names (Relay or Relax spelling), each taking the tensor first
    depth : the longest chain of wrappers looked through (``0``: just ``pattern``)
    """
    if depth < 0:
        raise PatternError(f"through(): depth must be at least 0, found {depth}")
    if isinstance(ops, str):
        ops = (ops,)
    if not ops:
        raise PatternError("through(): name at least one operator to look through")
    inner = as_pattern(pattern)
    operators = [is_op(name) for name in ops]  # validated once, shared by the chains
    alternatives = []
    for length in range(depth, 0, -1):  # longest chain first
        for chain in product(operators, repeat=length):
            wrapped: DFPattern = inner
            for op in reversed(chain):  # chain[0] is the outermost wrapper
                wrapped = op(wrapped, varg_default_wildcard=True)
            alternatives.append(wrapped)
    alternatives.append(inner)
    return _alternatives(alternatives)


def _alternatives(patterns: Sequence[DFPattern]) -> DFPattern:
    """``patterns[0] | patterns[1] | ...``: the first that matches, in order."""
    out = patterns[0]
    for pattern in patterns[1:]:
        out = out | pattern
    return out


def up_to_cast(pattern: Any) -> DFPattern:
    """``pattern`` or ``astype(pattern)``: the same value, possibly cast to another dtype.

    The cast's dtype is free; constrain it with ``.has_dtype`` on the result if it matters
    (a rule that collapses ``astype(astype(x, f32) ..., f16)`` checks the round trip).
    """
    inner = as_pattern(pattern)
    return is_op("astype")(inner) | inner


def square(pattern: Any) -> DFPattern:
    """``pattern`` squared: ``power(p, 2)``, ``p * p`` or ``square(p)``.

    The exponent is a scalar pattern, so a ``2`` of any float dtype matches (an fp16
    model's ``R.const(2, "float16")`` too), but exactly: ``power(p, 2 + 1 ulp)`` is NaN
    wherever ``p`` is negative, so it is not a square.  In ``p * p`` both operands must be
    the same value (one pattern object used twice).
    """
    inner = as_pattern(pattern)
    return (is_op("power")(inner, is_scalar(2.0, rtol=0.0)) | is_op("multiply")(inner, inner)
            | is_op("square")(inner))


def divide_by_sqrt(numerator: Any, radicand: Any) -> DFPattern:
    """``numerator * rsqrt(radicand)``, ``numerator / sqrt(radicand)`` or
    ``numerator * (1 / sqrt(radicand))``.

    The ways a normalisation scales by the inverse standard deviation: torch's
    ``torch.rsqrt`` (Llama's RMS norm), ONNX's ``Sqrt`` + ``Div`` (layer norm below
    opset 17), and ``torch.rsqrt`` exported to ONNX (``Sqrt`` + ``Reciprocal``, which
    TVM imports as ``divide(1, sqrt)``).  The multiplies match with their operands
    either way round.
    """
    top, inside = as_pattern(numerator), as_pattern(radicand)
    root = is_op("sqrt")(inside)
    return (top * is_op("rsqrt")(inside) | top / root
            | top * is_op("divide")(is_scalar(1.0), root))


def products(*factors: Any) -> DFPattern:
    """The product of ``factors`` in every grouping: ``a * b * c`` as ``(a * b) * c``,
    ``(a * c) * b`` or ``a * (b * c)``.

    The matcher already swaps the two operands of a ``multiply``, so one pattern per
    grouping (per split into two sub-products, recursively) covers every order.  A
    factor given twice (the same pattern object, e.g. ``x`` in ``x * x * x``) is the
    same expression wherever it occurs, and groupings that only swap equal factors are
    generated once.  A number is a scalar pattern (:func:`as_pattern`).
    """
    pats = tuple(as_pattern(f) for f in factors)
    if not pats:
        raise ValueError("products() needs at least one factor")
    return _alternatives(_groupings(pats))


def _groupings(factors: tuple[DFPattern, ...]) -> list[DFPattern]:
    if len(factors) == 1:
        return [factors[0]]
    first, rest = factors[0], factors[1:]
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    out: list[DFPattern] = []
    # Each unordered split into two sub-products once: the side holding factors[0]
    # takes any proper subset of the rest.
    for size in range(len(rest)):
        for chosen in combinations(range(len(rest)), size):
            left = (first, *(rest[i] for i in chosen))
            right = tuple(r for i, r in enumerate(rest) if i not in chosen)
            key = (_multiset(left), _multiset(right))
            if key in seen:
                continue
            seen.add(key)
            for lhs in _groupings(left):
                for rhs in _groupings(right):
                    out.append(lhs * rhs)
    return out


def _multiset(factors: tuple[DFPattern, ...]) -> tuple[int, ...]:
    return tuple(sorted(id(f) for f in factors))
