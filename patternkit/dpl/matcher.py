"""Matching patterns against Relax expressions, looking through bindings.

Relay matched nested graphs; Relax code is in A-normal form, where every intermediate
result is bound to a Var.  The matcher therefore *looks through* a Var to the value bound
to it whenever a pattern needs structure (a call, a tuple, a constant), and records the
Vars it looked through: those are the match's internal bindings, which the rewrite driver
and ``partition`` replace.  Wildcards never look through: they capture the Var itself,
which is the match's input.

Semantics follow Relay's ``DFPatternMatcher``:

* the same pattern object must match the same expression (diamonds);
* ``relax.add`` and ``relax.multiply`` match with their arguments swapped;
* ``divide(multiply(a, b), c)`` also matches ``multiply(a, divide(b, c))`` and the other
  associated forms, and ``multiply(a, divide(b, c))`` matches ``divide(multiply(a, b), c)``;
* a failed alternative leaves no trace (the memo is rolled back).

The matcher is pure Python and touches only the bindings a pattern reaches, so matching
costs O(pattern size) per candidate whatever the size of the function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import tvm
from tvm import relax

from ..errors import PatternError
from ..ir import compat as C
from .pattern import (
    COMMUTATIVE_OPS, AltPattern, AttrPattern, CallPattern, ConstantPattern, DataTypePattern,
    DFPattern, ExprPattern, ShapePattern, TupleGetItemPattern, TuplePattern, TypePattern,
    VarPattern, WildcardPattern, as_pattern, provide_sugar,
)

Lookup = Callable[[Any], Any]
_VAR_TYPES = C.VAR_TYPES


@dataclass
class Match:
    """One successful match.

    Attributes
    ----------
    root : Expr
        The expression the pattern's root matched (for a binding, its value).
    captures : dict
        Pattern -> the expression it matched.  Leaf patterns (wildcards, variables,
        constants) map to the argument as written (a Var or a constant); structural
        patterns (calls, tuples) map to the *value*, e.g. the ``relax.Call``.
    bound_vars : dict
        Pattern -> the Var through which the matcher reached its value, for structural
        patterns matched through a binding.
    internal : list
        Vars looked through, in first-visit order: the match's interior bindings.
    inputs : list
        Expressions captured by wildcards and variable patterns, de-duplicated, in
        pattern order: the match's inputs.
    internal_keys : list
        Handles of ``internal`` (:func:`patternkit.ir.compat.handle`), same order.
    """

    root: Any
    captures: dict = field(default_factory=dict)
    bound_vars: dict = field(default_factory=dict)
    internal: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    internal_keys: list = field(default_factory=list)


class Matcher:
    """Match patterns against expressions.

    Parameters
    ----------
    lookup : callable, optional
        ``lookup(var)`` returns the value bound to ``var`` if the matcher may look through
        it, else ``None``.  Without it the matcher sees only the expression given.
    """

    def __init__(self, lookup: Lookup | None = None, call_args: dict[int, list] | None = None,
                 table: dict[int, Any] | None = None):
        if table is not None:  # handle -> value: the fast path used by the rewrite driver
            get = table.get
            self._lookup_key = lambda var, key: get(key)
        else:
            lookup = lookup or (lambda var: None)
            self._lookup_key = lambda var, key: lookup(var)
        self._call_args = call_args if call_args is not None else {}

    def _args_of(self, call: relax.Call) -> list:
        key = C.handle(call)
        args = self._call_args.get(key)
        if args is None:
            args = self._call_args[key] = C.array_items(call.args)
        return args

    def match(self, pattern: DFPattern, expr: Any) -> Match | None:
        pattern = as_pattern(pattern)
        self._memo: dict[DFPattern, Any] = {}
        self._via: dict[DFPattern, Any] = {}
        self._internal: dict[int, Any] = {}  # handle -> Var, in first-visit order
        self._inputs: dict[int, Any] = {}  # handle -> expression, in pattern order
        self._trail: list[tuple[str, Any]] = []
        if not self._visit(pattern, expr):
            return None
        captures = dict(self._memo)
        return Match(root=expr, captures=captures, bound_vars=dict(self._via),
                     internal=list(self._internal.values()), inputs=list(self._inputs.values()),
                     internal_keys=list(self._internal))

    # -- bookkeeping ---------------------------------------------------------------------
    def _mark(self) -> int:
        return len(self._trail)

    def _rollback(self, mark: int) -> None:
        while len(self._trail) > mark:
            kind, key = self._trail.pop()
            if kind == "memo":
                self._memo.pop(key, None)
                self._via.pop(key, None)
            elif kind == "internal":
                self._internal.pop(key, None)
            else:
                self._inputs.pop(key, None)

    def _lookup(self, var: Any) -> Any:
        return self._lookup_key(var, var.__chandle__())

    def _resolve(self, expr: Any) -> tuple[Any, Any]:
        """Follow bindings from a Var to its value; returns (value, last var looked through)."""
        via = None
        while type(expr) in _VAR_TYPES:
            key = expr.__chandle__()
            value = self._lookup_key(expr, key)
            if value is None:
                break
            if key not in self._internal:
                self._internal[key] = expr
                self._trail.append(("internal", key))
            via, expr = expr, value
        return expr, via

    def _same(self, a: Any, b: Any) -> bool:
        if a.same_as(b):
            return True
        mark = self._mark()
        ra, _ = self._resolve(a)
        rb, _ = self._resolve(b)
        self._rollback(mark)
        return ra.same_as(rb)

    # -- dispatch ------------------------------------------------------------------------
    def _visit(self, pattern: DFPattern, expr: Any) -> bool:
        # The hot path of every rewrite: kept flat on purpose (no helper calls for the
        # memo, the trail mark or the dispatch).
        memo = self._memo
        if pattern in memo:
            return self._same(memo[pattern], expr)
        trail = self._trail
        mark = len(trail)
        handler = _HANDLERS.get(type(pattern))
        if handler is None:
            matched, value, via = self._dispatch(pattern, expr)
        else:
            matched, value, via = handler(self, pattern, expr)
        if not matched:
            if len(trail) > mark:
                self._rollback(mark)
            return False
        memo[pattern] = value
        if via is not None:
            self._via[pattern] = via
        trail.append(("memo", pattern))
        return True

    def _dispatch(self, pattern: DFPattern, expr: Any) -> tuple[bool, Any, Any]:
        handler = _HANDLERS.get(type(pattern))
        if handler is None:  # a user subclass of a pattern class
            handler = next((h for cls, h in _HANDLERS.items() if isinstance(pattern, cls)), None)
            if handler is None:
                raise PatternError(f"unsupported pattern node {type(pattern).__name__}")
        return handler(self, pattern, expr)

    def _on_wildcard(self, pattern: WildcardPattern, expr: Any):
        self._add_input(expr)
        return True, expr, None

    def _on_var(self, pattern: VarPattern, expr: Any):
        ok = (isinstance(expr, relax.Var) and self._lookup(expr) is None
              and (not pattern.name or C.var_name(expr) == pattern.name))
        if ok:
            self._add_input(expr)
        return ok, expr, None

    def _on_constant(self, pattern: ConstantPattern, expr: Any):
        value, via = self._resolve(expr)
        return C.is_constant(value), (expr if via is None else value), via

    def _on_call(self, pattern: CallPattern, expr: Any):
        value, via = self._resolve(expr)
        return self._match_call(pattern, value), value, via

    def _on_tuple(self, pattern: TuplePattern, expr: Any):
        value, via = self._resolve(expr)
        return self._match_tuple(pattern, value), value, via

    def _on_tuple_get_item(self, pattern: TupleGetItemPattern, expr: Any):
        value, via = self._resolve(expr)
        return self._match_tuple_get_item(pattern, value), value, via

    def _on_alt(self, pattern: AltPattern, expr: Any):
        mark = self._mark()
        if self._visit(pattern.left, expr):
            return True, self._memo[pattern.left], self._via.get(pattern.left)
        self._rollback(mark)
        ok = self._visit(pattern.right, expr)
        return ok, (self._memo.get(pattern.right) if ok else None), self._via.get(pattern.right)

    def _on_constraint(self, pattern: DFPattern, expr: Any):
        if not self._visit(pattern.pattern, expr):
            return False, None, None
        inner = self._memo[pattern.pattern]
        return self._check_constraint(pattern, inner), inner, self._via.get(pattern.pattern)

    def _add_input(self, expr: Any) -> None:
        if type(expr) is tvm.ir.Op:
            return
        key = C.handle(expr)
        if key in self._inputs:
            return
        self._inputs[key] = expr
        self._trail.append(("input", key))

    # -- node kinds ----------------------------------------------------------------------
    def _match_expr(self, pattern: ExprPattern, expr: Any) -> tuple[bool, Any, Any]:
        target = pattern.expr
        if expr.__chandle__() == pattern.handle:
            return True, expr, None
        if isinstance(target, tvm.ir.Op) or isinstance(expr, tvm.ir.Op):
            return False, None, None
        value, via = self._resolve(expr)
        if value.same_as(target):
            return True, value, via
        if isinstance(value, relax.Var) or isinstance(target, relax.Var):
            return False, None, None
        return C.structural_equal(value, target), value, via

    def _match_call(self, pattern: CallPattern, call: Any) -> bool:
        if type(call) is not relax.Call:
            return False
        trail = self._trail
        mark = len(trail)
        if self._match_call_exact(pattern, call):
            return True
        if len(trail) > mark:
            self._rollback(mark)
        return self._match_associated(pattern, call)

    def _match_call_exact(self, pattern: CallPattern, call: relax.Call) -> bool:
        """The call's operator and arguments match as written (or with swapped operands)."""
        op_pattern = pattern.op
        if (type(op_pattern) is ExprPattern and op_pattern.is_operator
                and op_pattern not in self._memo):
            # The usual is_op(...) callee: compare handles, no generic dispatch.
            op = call.op
            if op.__chandle__() != op_pattern.handle:
                return False
            self._memo[op_pattern] = op
            self._trail.append(("memo", op_pattern))
        elif not self._visit(op_pattern, call.op):
            return False
        if pattern.args is None:
            return True
        args = self._args_of(call)
        pargs = pattern.args
        if pattern.varg_default_wildcard:
            if len(args) < len(pargs):
                return False
            args = args[:len(pargs)]
        elif len(args) != len(pargs):
            return False
        mark = self._mark()
        if self._match_args(pargs, args):
            return True
        self._rollback(mark)
        if len(args) == 2 and C.op_name(call) in COMMUTATIVE_OPS:
            if self._match_args(pargs, args[::-1]):
                return True
            self._rollback(mark)
        return False

    def _match_args(self, patterns: list[DFPattern], args: list[Any]) -> bool:
        visit, memo, trail, inputs = self._visit, self._memo, self._trail, self._inputs
        for p, a in zip(patterns, args):
            if type(p) is WildcardPattern and p not in memo:
                # Inlined _visit + _on_wildcard: most pattern leaves are fresh wildcards.
                memo[p] = a
                if type(a) is not tvm.ir.Op:
                    key = a.__chandle__()
                    if key not in inputs:
                        inputs[key] = a
                        trail.append(("input", key))
                trail.append(("memo", p))
            elif not visit(p, a):
                return False
        return True

    def _match_associated(self, pattern: CallPattern, call: relax.Call) -> bool:
        """Relay's divide/multiply re-association (see the module docstring)."""
        pop = _op_of(pattern)
        eop = C.op_name(call)
        if pop == "relax.divide" and eop == "relax.multiply" and pattern.args is not None:
            inner = pattern.args[0]
            if (isinstance(inner, CallPattern) and _op_of(inner) == "relax.multiply"
                    and inner.args is not None and len(inner.args) == 2
                    and any(_is_call_of(self._peek(a), "relax.divide")
                            for a in self._args_of(call))):
                for k in range(2):
                    div = CallPattern(pattern.op, [inner.args[k], pattern.args[1]])
                    mul = CallPattern(inner.op, [inner.args[1 - k], div])
                    mark = self._mark()
                    if self._match_call(mul, call):
                        return True
                    self._rollback(mark)
        if pop == "relax.multiply" and eop == "relax.divide" and pattern.args is not None:
            if _is_call_of(self._peek(self._args_of(call)[0]), "relax.multiply"):
                for k in range(2):
                    inner = pattern.args[k]
                    if isinstance(inner, CallPattern) and _op_of(inner) == "relax.divide" \
                            and inner.args is not None and len(inner.args) == 2:
                        mul = CallPattern(pattern.op, [inner.args[0], pattern.args[1 - k]])
                        div = CallPattern(inner.op, [mul, inner.args[1]])
                        mark = self._mark()
                        if self._match_call(div, call):
                            return True
                        self._rollback(mark)
        return False

    def _peek(self, expr: Any) -> Any:
        """The value behind ``expr`` without recording the look-through."""
        seen = 0
        while isinstance(expr, relax.Var) and seen < 64:
            value = self._lookup(expr)
            if value is None:
                break
            expr, seen = value, seen + 1
        return expr

    def _match_tuple(self, pattern: TuplePattern, value: Any) -> bool:
        if not isinstance(value, relax.Tuple):
            return False
        if pattern.fields is None:
            return True
        fields = list(C.array_items(value.fields))
        return len(fields) == len(pattern.fields) and self._match_args(pattern.fields, fields)

    def _match_tuple_get_item(self, pattern: TupleGetItemPattern, value: Any) -> bool:
        if not isinstance(value, relax.TupleGetItem):
            return False
        if pattern.index is not None:
            index = pattern.index
            if index < 0:
                ty = C.type_of(value.tuple_value)
                if not isinstance(ty, relax.TupleType):
                    return False
                index += len(ty.fields)
            if int(value.index) != index:
                return False
        return self._visit(pattern.tuple, value.tuple_value)

    # -- constraints ---------------------------------------------------------------------
    def _check_constraint(self, pattern: DFPattern, expr: Any) -> bool:
        if isinstance(pattern, AttrPattern):
            return attrs_match(expr, pattern.attrs)
        ty = C.type_of(expr)
        if isinstance(pattern, DataTypePattern):
            return C.dtype_of(ty) == pattern.dtype
        if isinstance(pattern, ShapePattern):
            return shape_matches(C.static_shape(ty), pattern.shape)
        if isinstance(pattern, TypePattern):
            return type_matches(ty, pattern.ty)
        return False


_HANDLERS = {
    WildcardPattern: Matcher._on_wildcard,
    VarPattern: Matcher._on_var,
    ExprPattern: Matcher._match_expr,
    ConstantPattern: Matcher._on_constant,
    CallPattern: Matcher._on_call,
    TuplePattern: Matcher._on_tuple,
    TupleGetItemPattern: Matcher._on_tuple_get_item,
    AltPattern: Matcher._on_alt,
    AttrPattern: Matcher._on_constraint,
    TypePattern: Matcher._on_constraint,
    DataTypePattern: Matcher._on_constraint,
    ShapePattern: Matcher._on_constraint,
}


def _op_of(pattern: CallPattern) -> str | None:
    op = pattern.op
    if isinstance(op, ExprPattern) and isinstance(op.expr, tvm.ir.Op):
        return op.expr.name
    return None


def _is_call_of(expr: Any, name: str) -> bool:
    return C.op_name(expr) == name


# -- attribute, shape and type comparison ------------------------------------------------
def to_python(value: Any) -> Any:
    """Normalise a TVM attribute value (Array, IntImm, DataType, String) to plain Python."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, tvm.DataType):
        return str(value)
    if isinstance(value, (tvm.tirx.IntImm,)):
        return int(value.value)
    if isinstance(value, (tvm.tirx.FloatImm,)):
        return float(value.value)
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__") and hasattr(value, "__getitem__"):
        try:
            return [to_python(v) for v in value]
        except TypeError:
            pass
    return str(value)


def _lookup_attr(expr: Any, key: str) -> tuple[bool, Any]:
    if isinstance(expr, tvm.ir.Op):
        try:
            return True, expr.get_attr(key)
        except (tvm.error.TVMError, AttributeError, ValueError):
            return False, None
    if isinstance(expr, relax.Call):
        attrs = expr.attrs
    else:
        attrs = getattr(expr, "attrs", None)
    if attrs is None:
        return False, None
    try:
        if key in attrs:
            return True, attrs[key]
    except TypeError:
        pass
    if hasattr(attrs, key):
        return True, getattr(attrs, key)
    return False, None


def attrs_match(expr: Any, expected: dict[str, Any]) -> bool:
    for key, want in expected.items():
        found, have = _lookup_attr(expr, key)
        if not found:
            return False
        have, want = to_python(have), to_python(want)
        if isinstance(have, bool) or isinstance(want, bool):
            if bool(have) != bool(want):
                return False
        elif have != want:
            return False
    return True


def shape_matches(actual: tuple | None, expected: list) -> bool:
    if actual is None or len(actual) != len(expected):
        return False
    for have, want in zip(actual, expected):
        if isinstance(want, int) and isinstance(have, int):
            if have != want:
                return False
        elif str(have) != str(want):
            return False
    return True


def type_matches(actual: Any, expected: Any) -> bool:
    """``actual`` fits ``expected``; unknown fields of ``expected`` match anything."""
    if isinstance(expected, type):
        return isinstance(actual, expected)
    if isinstance(expected, relax.TensorType):
        if not isinstance(actual, relax.TensorType):
            return False
        want_dtype = C.dtype_of(expected)
        if want_dtype and C.dtype_of(actual) != want_dtype:
            return False
        if expected.ndim != -1 and actual.ndim != expected.ndim:
            return False
        want_shape = C.static_shape(expected)
        if want_shape is not None:
            return shape_matches(C.static_shape(actual), list(want_shape))
        return True
    if isinstance(expected, relax.TupleType):
        return (isinstance(actual, relax.TupleType) and len(actual.fields) == len(expected.fields)
                and all(type_matches(a, e) for a, e in zip(actual.fields, expected.fields)))
    return C.structural_equal(actual, expected)


# -- public helpers --------------------------------------------------------------------
def function_lookup(func: relax.Function) -> Lookup:
    """A look-up over every binding of ``func`` (dataflow or not) that holds a pure value."""
    table: dict[Any, Any] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding) and C.is_pure_value(binding.value):
                table[binding.var] = binding.value
    return table.get


def match(pattern: DFPattern, expr: Any, func: relax.Function | None = None) -> bool:
    """Does ``pattern`` match ``expr``?

    ``expr`` may be a bare (nested) Relax expression, a value bound in ``func``, or a Var
    bound in ``func``; with ``func`` the matcher looks through its bindings, as Relay's
    matcher looked at nested calls.
    """
    return find_match(pattern, expr, func) is not None


def find_match(pattern: DFPattern, expr: Any, func: relax.Function | None = None) -> Match | None:
    """Like :func:`match` but returns the :class:`Match` (captures, internals, inputs)."""
    lookup = function_lookup(func) if func is not None else None
    return Matcher(lookup).match(as_pattern(pattern), expr)


provide_sugar("match", match)
