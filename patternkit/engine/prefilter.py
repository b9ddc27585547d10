"""Reject candidate roots over integers, before the matcher reads any TVM object.

A rule's candidates are the bindings calling its root operator; most of them do not
match (``attention.einsum_matmul`` roots on every ``reshape`` of GPT-2).  The matcher
finds that out by reading the binding, its value, the argument array and each
argument's value over the FFI.  The function's snapshot already holds, as integers,
each binding's operator, its arguments and their bindings, so the top of a pattern is
compiled once per rule into a check over those integers (the root's operator and arity,
and the operators its arguments' bindings call), and a candidate that fails it is
dropped without a read.

The check is a necessary condition only: it never rejects what the matcher would
accept.  It follows the matcher's own freedoms: a commutative operator's operands in
either order, the divide/multiply re-association (no test below such a node), an
argument seen through a Var binding (not tested), ``varg_default_wildcard``'s prefix,
alternatives (``|``) and conjunctions (``&``).  A dropped candidate is one the matcher
would have failed silently, so no refusal is lost from a rewrite's log.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from ..dpl.pattern import (
    COMMUTATIVE_OPS,
    AltPattern,
    AndPattern,
    AttrPattern,
    CallPattern,
    DataTypePattern,
    DFPattern,
    ShapePattern,
    TagPattern,
    TypePattern,
    op_names_of,
)
from ..ir.snapshot import FunctionSnapshot, ValueKind

#: How many levels of call patterns the check looks at: the root and its arguments'
#: producers.  Deeper levels would repeat the matcher's work on every match that holds.
DEPTH = 2

#: Operators between which the matcher re-associates (``a * (1 / b)`` is ``a / b``).
_REASSOCIATED = frozenset({"relax.divide", "relax.multiply"})

_OP_CALL = ValueKind.OP_CALL
_VAR = ValueKind.VAR

# A compiled node: ``None`` accepts anything; otherwise one of
#   ("call", names, args or None, prefix, commutative, reassociated)
#   ("any", left, right)   an alternative
#   ("all", left, right)   a conjunction
Node = tuple[Any, ...] | None

_CACHE_ATTRIBUTE = "_patternkit_integer_check"


def compiled(pattern: DFPattern) -> Node:
    """The integer check of ``pattern``, compiled on first use and kept on the pattern."""
    cache = pattern.__dict__
    if _CACHE_ATTRIBUTE not in cache:
        cache[_CACHE_ATTRIBUTE] = compile_pattern(pattern, DEPTH)
    node: Node = cache[_CACHE_ATTRIBUTE]
    return node


def compile_pattern(pattern: Any, depth: int) -> Node:
    """The check of ``pattern`` down to ``depth`` levels of calls (``None``: no check)."""
    if depth <= 0 or not isinstance(pattern, DFPattern):
        return None
    if isinstance(pattern, CallPattern):
        names = op_names_of(pattern.op)
        if names is None:
            return None
        reassociated = not names.isdisjoint(_REASSOCIATED)
        args = None
        if pattern.args is not None and not reassociated:
            args = tuple(compile_pattern(a, depth - 1) for a in pattern.args)
        return ("call", names | (_REASSOCIATED if reassociated else frozenset()), args,
                bool(pattern.varg_default_wildcard), not names.isdisjoint(COMMUTATIVE_OPS),
                reassociated)
    if isinstance(pattern, (TagPattern, AttrPattern, TypePattern, DataTypePattern,
                            ShapePattern)):
        return compile_pattern(pattern.pattern, depth)
    if isinstance(pattern, AltPattern):
        left, right = compile_pattern(pattern.left, depth), compile_pattern(pattern.right, depth)
        return None if left is None or right is None else ("any", left, right)
    if isinstance(pattern, AndPattern):
        left, right = compile_pattern(pattern.left, depth), compile_pattern(pattern.right, depth)
        if left is None or right is None:
            return right if left is None else left
        return ("all", left, right)
    return None


def root_filter(pattern: DFPattern, snap: FunctionSnapshot,
                pure_ops: list[bool]) -> Callable[[int], bool] | None:
    """``accepts(i)``: may binding ``i`` of ``snap`` be the root of a match of
    ``pattern``?  ``None`` when the pattern's top constrains nothing the snapshot holds.

    ``pure_ops[k]``: is operator ``k`` of ``snap.ops`` pure (only pure bindings are seen
    through by the matcher).
    """
    node = compiled(pattern)
    if node is None:
        return None
    return partial(_RootCheck(snap, pure_ops).accepts, node)


class _RootCheck:
    """The compiled checks evaluated over one snapshot's arrays.

    Methods rather than nested closures: two closures calling each other would form a
    reference cycle per rule and function, left for the collector after every pass.
    """

    __slots__ = ("kind", "op", "names", "arg_start", "args", "block", "pure_ops")

    def __init__(self, snap: FunctionSnapshot, pure_ops: list[bool]):
        self.kind, self.op, self.names = snap.kind, snap.op, snap.ops
        self.arg_start, self.args, self.block = snap.arg_start, snap.args, snap.block
        self.pure_ops = pure_ops

    def accepts(self, n: Node, i: int) -> bool:
        """May binding ``i``'s value match the compiled node ``n``?"""
        assert n is not None
        tag = n[0]
        if tag == "any":
            return self.accepts(n[1], i) or self.accepts(n[2], i)
        if tag == "all":
            return self.accepts(n[1], i) and self.accepts(n[2], i)
        if self.kind[i] is not _OP_CALL or self.names[self.op[i]] not in n[1]:
            return False
        patterns = n[2]
        if patterns is None:
            return True
        codes = self.args[self.arg_start[i]:self.arg_start[i + 1]]
        if n[3]:  # varg_default_wildcard: the patterns are a prefix
            if len(codes) < len(patterns):
                return False
            codes = codes[:len(patterns)]
        elif len(codes) != len(patterns):
            return False
        here = self.block[i]
        argument = self.argument
        if all(argument(p, c, here) for p, c in zip(patterns, codes)):
            return True
        return bool(n[4]) and len(codes) == 2 and all(
            argument(p, c, here) for p, c in zip(patterns, codes[::-1]))

    def argument(self, n: Node, code: int, here: int) -> bool:
        """May the argument ``code`` of a binding in block ``here`` match ``n``?"""
        if n is None:
            return True
        if code < 0 or self.block[code] != here:  # not a binding the matcher looks into
            return False
        k = self.kind[code]
        if k is _VAR:  # a Var copied: the matcher follows it; no test
            return True
        if k is _OP_CALL and not self.pure_ops[self.op[code]]:
            return False  # impure: not looked through, so never a call to the matcher
        return self.accepts(n, code)
