"""Relay's re-association of ``divide`` and ``multiply`` in call patterns.

Relay's matcher let ``divide(multiply(a, b), c)`` match ``multiply(a, divide(b, c))``
(and the form with the multiply's operands swapped), and ``multiply(a, divide(b, c))``
match ``divide(multiply(a, b), c)``: a batch-norm written ``gamma * (x - mean) / s`` is
then found whichever way the frontend associated it.  This module only produces the
equivalent patterns; the matcher tries them in order, after the pattern as written
failed.  The forms are built while matching, so they record no graph constraint even
inside a ``PatternContext``.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, TypeGuard

from ..ir import compat as C
from .pattern import CallPattern, DFPattern, ExprPattern

__all__ = ["reassociations"]

_DIVIDE = "relax.divide"
_MULTIPLY = "relax.multiply"


def reassociations(pattern: CallPattern, call: Any, args_of: Callable[[Any], list[Any]],
                   peek: Callable[[Any], Any]) -> list[CallPattern]:
    """The re-associated forms of ``pattern`` worth trying against ``call``, in order.

    Parameters
    ----------
    pattern : CallPattern
        The pattern that did not match ``call`` as written.
    call : relax.Call
    args_of : callable
        ``args_of(call)``: the call's arguments (the matcher's cached read).
    peek : callable
        ``peek(expr)``: the value behind a Var, looked through without recording it;
        a form is only proposed when the graph has the nested operator it needs.

    Returns
    -------
    list of CallPattern
        Usually empty: this runs whenever a call pattern fails, so the common case
        (neither a divide nor a multiply) returns before building anything.
    """
    if pattern.args is None:
        return []
    pattern_op = _op_name(pattern)
    if pattern_op != _DIVIDE and pattern_op != _MULTIPLY:
        return []
    call_op = C.op_name(call)
    forms = []
    if pattern_op == _DIVIDE and call_op == _MULTIPLY:
        inner = pattern.args[0]
        if (_is_binary(inner, _MULTIPLY)
                and any(C.op_name(peek(a)) == _DIVIDE for a in args_of(call))):
            for k in range(2):
                div = CallPattern(pattern.op, [inner.args[k], pattern.args[1]],
                                  add_constraint=False)
                forms.append(CallPattern(inner.op, [inner.args[1 - k], div],
                                         add_constraint=False))
    elif pattern_op == _MULTIPLY and call_op == _DIVIDE:
        if C.op_name(peek(args_of(call)[0])) == _MULTIPLY:
            for k in range(2):
                inner = pattern.args[k]
                if _is_binary(inner, _DIVIDE):
                    mul = CallPattern(pattern.op, [inner.args[0], pattern.args[1 - k]],
                                      add_constraint=False)
                    forms.append(CallPattern(inner.op, [mul, inner.args[1]],
                                             add_constraint=False))
    return forms


def _op_name(pattern: CallPattern) -> str | None:
    """``"relax.divide"`` for ``is_op("divide")(...)``; ``None`` for any other callee."""
    op = pattern.op
    if isinstance(op, ExprPattern) and op.is_operator:
        name: str = op.expr.name
        return name
    return None


class _BinaryCall(Protocol):
    """What :func:`_is_binary` proves of a pattern: a call pattern with two arguments."""

    op: DFPattern
    args: list[DFPattern]


def _is_binary(pattern: Any, op_name: str) -> TypeGuard[_BinaryCall]:
    return (isinstance(pattern, CallPattern) and _op_name(pattern) == op_name
            and pattern.args is not None and len(pattern.args) == 2)
