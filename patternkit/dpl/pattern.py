"""The pattern language: Relay's dataflow-pattern API, on Relax.

Patterns are plain Python objects that describe a dataflow graph.  They keep Relay's
names and behaviour (``wildcard``, ``is_op("nn.conv2d")``, ``is_constant``,
``is_tuple(None)``, ``p.optional(f)``, ``a * b + c``) where ``tvm.relax.dpl`` lacks them,
and they compile to ``tvm.relax.dpl`` patterns with :meth:`DFPattern.to_dpl` for TVM's own
passes such as ``FuseOpsByPattern``.

Matching is done by :mod:`patternkit.dpl.matcher`, which looks through Relax bindings so
that a pattern written for Relay's nested graphs matches A-normal-form Relax code.

Identity matters: using the same pattern object twice in a pattern means "the same
expression" (a diamond), exactly as in Relay.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Callable, Protocol, Sequence, cast

import tvm
from tvm import relax

from ..errors import PatternError
from ..ir.compat import handle_or_none, var_name
from ..ir.copying import deepcopy_sharing_tvm_objects
from ..ir.opnames import get_op
from ..ir.rebuild import constant_text, expr_text

__all__ = [
    "DFPattern", "WildcardPattern", "ExprPattern", "ConstantPattern", "ScalarPattern",
    "VarPattern", "DataflowVarPattern", "GlobalVarPattern", "ExternFuncPattern",
    "CallPattern", "TuplePattern", "TupleGetItemPattern", "AltPattern", "AndPattern",
    "NotPattern", "AttrPattern", "TypePattern", "DataTypePattern", "ShapePattern",
    "DominatorPattern", "IfPattern", "TagPattern", "alt",
    "wildcard", "is_op", "is_constant", "is_const", "is_scalar", "is_var", "is_dfv", "is_gv",
    "is_extern", "is_expr", "is_tuple", "is_tuple_get_item", "has_attr", "has_dtype",
    "has_shape", "has_type", "as_pattern",
    "dominates", "is_if",
]

#: Operators whose two arguments may be swapped when matching, as in Relay.
COMMUTATIVE_OPS = frozenset({"relax.add", "relax.multiply"})

class ConstraintRecorder(Protocol):
    """What a call pattern built inside a context needs of it (a ``PatternContext``)."""

    def add_constraint(self, producer: Any, consumer: Any, index: int = -1,
                       only: bool = False) -> None:
        """Record ``producer.used_by(consumer, index)`` (``only``: ``only_used_by``)."""


#: The functions behind the pattern methods of this layer's other modules: ``p.match(...)``
#: (the matcher) and the context constraints (``p.used_by(...)``).  Those modules are built
#: on this one (they import it), so it may not import them; each plugs its function in
#: with :func:`provide_sugar` when it loads, and a method called before that loads the
#: module named in :data:`_SUGAR_PROVIDERS`.  Only modules of this layer provide sugar;
#: ``p.partition(...)`` is the engine's and is imported where it is called (see
#: :meth:`DFPattern.partition`).
_RELAY_SUGAR: dict[str, Callable[..., Any]] = {}
_SUGAR_PROVIDERS = {"match": "patternkit.dpl.matcher",
                    "used_by": "patternkit.dpl.context",
                    "only_used_by": "patternkit.dpl.context",
                    "used_by_all": "patternkit.dpl.context",
                    "dup": "patternkit.dpl.context"}

#: The :class:`~patternkit.dpl.context.PatternContext` objects entered, innermost last.
#: As in ``tvm.relax.dpl``, a call pattern built inside a context records that each of
#: its arguments is used by it (``arg.used_by(call, i)``); the context module pushes and
#: pops this stack, this module only reads it (it may not import the context module).
CONTEXT_STACK: list[ConstraintRecorder] = []


def provide_sugar(method: str, function: Callable[..., Any]) -> None:
    """Install the implementation of the pattern method ``method`` (``"match"``...)."""
    _RELAY_SUGAR[method] = function


def provided(method: str) -> Callable[..., Any]:
    """The implementation of ``method`` installed by :func:`provide_sugar` (loaded on demand)."""
    if method not in _RELAY_SUGAR:
        importlib.import_module(_SUGAR_PROVIDERS[method])  # it calls provide_sugar
    return _RELAY_SUGAR[method]




class DFPattern:
    """Base class of every pattern.

    Operators: ``p(*args)`` builds a call pattern with ``p`` as the callee; ``p | q``
    matches either, ``p & q`` both, ``~p`` anything ``p`` does not match (``tvm.relax.dpl``'s
    spellings); ``p + q``, ``p - q``, ``p * q`` and ``p / q`` build calls to
    ``relax.add`` / ``subtract`` / ``multiply`` / ``divide``.  A non-pattern operand of an
    arithmetic operator (a Relax expression or a Python number) is wrapped with
    :func:`is_expr` / a scalar constant.
    """

    # Patterns are compared by identity (a diamond reuses the same object).
    __hash__ = object.__hash__
    # TVM objects a pattern holds (is_expr's) are shared: TVM 0.27 crashes copying them.
    __deepcopy__ = deepcopy_sharing_tvm_objects

    def __call__(self, *args: Any, varg_default_wildcard: bool = False,
                 add_constraint: bool = True) -> "CallPattern":
        """A call of this pattern (an operator, usually) with ``args``; see :class:`CallPattern`."""
        if len(args) == 1 and args[0] is None:  # Relay's "any arguments": wildcard()(None)
            return CallPattern(self, None)
        return CallPattern(self, [as_pattern(a) for a in args], varg_default_wildcard,
                           add_constraint=add_constraint)

    def __or__(self, other: "DFPattern") -> "AltPattern":
        return AltPattern(self, as_pattern(other))

    def __and__(self, other: "DFPattern") -> "AndPattern":
        return AndPattern(self, as_pattern(other))

    def __invert__(self) -> "NotPattern":
        return NotPattern(self)

    def __add__(self, other: Any) -> "CallPattern":
        return _binary("add", self, other)

    def __radd__(self, other: Any) -> "CallPattern":
        return _binary("add", other, self)

    def __sub__(self, other: Any) -> "CallPattern":
        return _binary("subtract", self, other)

    def __rsub__(self, other: Any) -> "CallPattern":
        return _binary("subtract", other, self)

    def __mul__(self, other: Any) -> "CallPattern":
        return _binary("multiply", self, other)

    def __rmul__(self, other: Any) -> "CallPattern":
        return _binary("multiply", other, self)

    def __truediv__(self, other: Any) -> "CallPattern":
        return _binary("divide", self, other)

    def __rtruediv__(self, other: Any) -> "CallPattern":
        return _binary("divide", other, self)

    # -- constraints -------------------------------------------------------------------
    def has_attr(self, attrs: dict[str, Any]) -> "AttrPattern":
        """Require call (or operator, or function) attributes; string dtypes are accepted."""
        return AttrPattern(self, attrs)

    def has_type(self, ty: Any) -> "TypePattern":
        """Require a Relax type that fits ``ty`` (unknown shape, dtype or ndim match any)."""
        return TypePattern(self, ty)

    has_ty = has_type

    def has_dtype(self, dtype: str) -> "DataTypePattern":
        """Require the element type ``dtype`` (``"float16"``)."""
        return DataTypePattern(self, dtype)

    def has_shape(self, shape: Sequence[Any]) -> "ShapePattern":
        """Require the shape ``shape`` (integers or symbolic dimensions)."""
        return ShapePattern(self, shape)

    def optional(self, option_constructor: Callable[["DFPattern"], "DFPattern"]) -> "AltPattern":
        """``self | option_constructor(self)``: e.g. ``conv.optional(is_op("nn.relu"))``."""
        return self | as_pattern(option_constructor(self))

    def dominates(self, parent: "DFPattern", path: "DFPattern | None" = None
                  ) -> "DominatorPattern":
        """Relay's ``child.dominates(parent, path)``: :func:`dominates` with this as the child.

        ``path`` defaults to ``wildcard()`` (any nodes in between), as in Relay.
        """
        return DominatorPattern(parent, wildcard() if path is None else path, self)

    # -- graph constraints (inside a patternkit.PatternContext) ------------------------------
    def used_by(self, other: Any, index: int = -1) -> Any:
        """Record that this pattern's var is used by ``other``'s (as argument ``index``; -1: any).

        Recorded in the current :class:`patternkit.PatternContext`; returns the
        :class:`~patternkit.dpl.context.PatternSeq` ``[self, other]`` for chaining.
        """
        return provided("used_by")(self, other, index)

    def only_used_by(self, other: Any, index: int = -1) -> Any:
        """Like :meth:`used_by`, and no other binding of the block uses this pattern's var."""
        return provided("only_used_by")(self, other, index)

    def __xor__(self, other: Any) -> Any:
        """``p ^ q`` is ``p.used_by(q)`` (``tvm.relax.dpl``'s spelling)."""
        return self.used_by(other)

    def __rshift__(self, other: Any) -> Any:
        """``p >> q`` is ``p.only_used_by(q)`` (``tvm.relax.dpl``'s spelling)."""
        return self.only_used_by(other)

    def fork_to(self, *others: Any) -> None:
        """``self ^ other`` for each of ``others``: one producer, several consumers."""
        for other in others:
            self.used_by(other)

    def used_by_all(self, other: "DFPattern", index: int = -1, at_least: int = 1) -> None:
        """Every reader of this pattern's var that matches ``other`` (patternkit's extension).

        In a match, ``other`` stands for a tuple of Vars (binding order, at least
        ``at_least``): a rule that combines all consumers of a value, however many.
        """
        provided("used_by_all")(self, other, index, at_least)

    def dup(self) -> "DFPattern":
        """A copy of this pattern node (a distinct graph node in a PatternContext)."""
        return cast(DFPattern, provided("dup")(self))

    # -- using the pattern ---------------------------------------------------------------
    def match(self, expr: Any, func: Any = None) -> bool:
        """True if the pattern matches ``expr``; see :func:`patternkit.match`."""
        return cast(bool, provided("match")(self, expr, func))

    def partition(self, expr: Any, attrs: dict[str, Any] | None = None,
                  check: Callable[..., Any] | None = None) -> Any:
        """Wrap every match in its own function; see :func:`patternkit.partition`.

        Relay's sugar for an engine feature: the one import of this layer from the layer
        above it, made here, when it is called.  The layer contract allows exactly this
        edge (``ignore_imports`` in ``pyproject.toml``), and the architecture test reads
        the same entry.
        """
        from ..engine.partitioning import partition  # the allow-listed upward edge

        return partition(self, expr, attrs=attrs, check=check)

    def to_dpl(self, memo: dict[int, Any] | None = None) -> Any:
        """The equivalent ``tvm.relax.dpl`` pattern, for TVM passes such as FuseOpsByPattern.

        ``memo`` (converted patterns by ``id``) shares the conversion of common
        sub-patterns between several calls, as a graph of patterns needs.
        """
        return _to_dpl(self, {} if memo is None else memo)

    # -- structure -----------------------------------------------------------------------
    def children(self) -> tuple["DFPattern", ...]:
        """The patterns this one is built from, in the order the matcher visits them."""
        return ()

    def __repr__(self) -> str:
        return pattern_to_text(self)


class WildcardPattern(DFPattern):
    """Matches any expression."""


class ExprPattern(DFPattern):
    """Matches one given Relax expression (structural equality) or one operator."""

    def __init__(self, expr: Any):
        self.expr = expr
        # Compared by handle first: cheaper than an FFI same_as per candidate.
        self.handle = handle_or_none(expr)
        self.is_operator = isinstance(expr, tvm.ir.Op)


class ConstantPattern(DFPattern):
    """Matches a tensor constant (``relax.const``) or a prim-value immediate."""


class ScalarPattern(DFPattern):
    """Matches a constant holding one number close to ``value``, in any dtype.

    A number in a pattern (``x * 0.5``, ``is_op("power")(x, 3)``) becomes this node, so
    a rule written once matches float32, float16 and bfloat16 models alike: the constant
    may be a tensor of any shape with one element, or a prim value, and its value must
    be within ``atol + rtol * |value|`` of ``value``.  By default ``rtol`` is twice the
    machine epsilon of the constant's own dtype (a float16 ``0.044715`` is stored as
    ``0.04471``), so a literal matches its rounded self and nothing noticeably different;
    integer dtypes match integral values exactly.  An infinity matches the same infinity
    in any float dtype (the ``-inf`` of a mask); NaN, equal to nothing, is refused.
    """

    def __init__(self, value: float, rtol: float | None = None, atol: float = 0.0):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PatternError(f"a scalar pattern needs a number, found {value!r}")
        if math.isnan(value):
            raise PatternError("a scalar pattern cannot match NaN: it equals no constant, "
                               "itself included")
        if (rtol is not None and rtol < 0) or atol < 0:
            raise PatternError(f"scalar tolerances must be non-negative, found rtol={rtol}, "
                               f"atol={atol}")
        self.value = float(value)
        self.rtol = rtol
        self.atol = float(atol)


class VarPattern(DFPattern):
    """Matches a free variable (a function parameter), optionally by name.

    Relay's graphs had no variables for intermediate results; Relax binds every
    intermediate to a Var.  To keep Relay's meaning, a ``VarPattern`` never matches a Var
    that is bound to a value the matcher can look through.
    """

    def __init__(self, name: str = ""):
        self.name = name or ""


class DataflowVarPattern(VarPattern):
    """A :class:`VarPattern` that only matches a ``relax.DataflowVar``."""


class GlobalVarPattern(DFPattern):
    """Matches a ``GlobalVar`` whose name *contains* ``name`` (any GlobalVar if empty).

    The substring rule is ``tvm.relax.dpl``'s: ``is_call_tir("rms_norm")`` matches a
    ``call_tir`` of ``rms_norm1`` or ``fused_rms_norm`` too.  It is what call_tir
    patterns (``R.call_tir(gv, args)``) use for the callee.
    """

    def __init__(self, name: str = ""):
        self.name = name or ""


class ExternFuncPattern(DFPattern):
    """Matches an ``ExternFunc`` (the callee of ``call_dps_packed``), optionally by symbol."""

    def __init__(self, global_symbol: str = ""):
        self.global_symbol = global_symbol or ""


class CallPattern(DFPattern):
    """A call of ``op`` (usually an operator pattern) with argument patterns.

    ``args=None`` matches any number of arguments (Relay's ``p(None)``); with
    ``varg_default_wildcard=True`` the given args are a prefix and the rest is free.
    Built inside a :class:`patternkit.PatternContext`, it records that each argument is
    used by it, as ``tvm.relax.dpl`` does (``add_constraint=False`` opts out).
    """

    def __init__(self, op: DFPattern, args: list[DFPattern] | None,
                 varg_default_wildcard: bool = False, *, add_constraint: bool = True):
        self.op = op
        self.args = args
        self.varg_default_wildcard = varg_default_wildcard
        if add_constraint and CONTEXT_STACK and args:
            for i, arg in enumerate(args):  # tvm.relax.dpl: arg.used_by(call, i)
                CONTEXT_STACK[-1].add_constraint(arg, self, index=i)

    def children(self) -> tuple["DFPattern", ...]:
        """The patterns this one is built from, in matching order."""
        return (self.op, *(self.args or ()))


class TuplePattern(DFPattern):
    """A tuple of patterns; ``fields=None`` matches a tuple of any arity."""

    def __init__(self, fields: Sequence[DFPattern] | None):
        self.fields = None if fields is None else [as_pattern(f) for f in fields]

    def children(self) -> tuple["DFPattern", ...]:
        """The patterns this one is built from, in matching order."""
        return tuple(self.fields or ())


class TupleGetItemPattern(DFPattern):
    """``tuple[index]``; ``index=None`` matches any index."""

    def __init__(self, tuple_value: DFPattern, index: int | None = None):
        self.tuple = as_pattern(tuple_value)
        self.index = index

    def children(self) -> tuple["DFPattern", ...]:
        """The patterns this one is built from, in matching order."""
        return (self.tuple,)


class AltPattern(DFPattern):
    """Either ``left`` or ``right`` (left is tried first)."""

    def __init__(self, left: DFPattern, right: DFPattern):
        self.left = left
        self.right = right

    def children(self) -> tuple["DFPattern", ...]:
        """The two alternatives, in matching order."""
        return (self.left, self.right)


class AndPattern(DFPattern):
    """Both ``left`` and ``right`` match the same expression (``tvm.relax.dpl``'s ``p & q``)."""

    def __init__(self, left: DFPattern, right: DFPattern):
        self.left = left
        self.right = right

    def children(self) -> tuple["DFPattern", ...]:
        """The two patterns, in matching order."""
        return (self.left, self.right)


class NotPattern(DFPattern):
    """Matches any expression ``reject`` does not match; records nothing of ``reject``."""

    def __init__(self, reject: DFPattern):
        self.reject = as_pattern(reject)

    def children(self) -> tuple["DFPattern", ...]:
        """The patterns this one is built from, in matching order."""
        return (self.reject,)


class _Constraint(DFPattern):
    def __init__(self, pattern: DFPattern):
        self.pattern = as_pattern(pattern)

    def children(self) -> tuple["DFPattern", ...]:
        """The patterns this one is built from, in matching order."""
        return (self.pattern,)


class AttrPattern(_Constraint):
    """``pattern`` whose call/operator/function attributes include ``attrs``."""

    def __init__(self, pattern: DFPattern, attrs: dict[str, Any]):
        super().__init__(pattern)
        if not isinstance(attrs, dict):
            raise PatternError(f"has_attr expects a dict of attributes, got {type(attrs).__name__}")
        self.attrs = dict(attrs)


class TypePattern(_Constraint):
    """``pattern`` whose Relax type fits ``ty`` (unknown shape/dtype/ndim in ``ty`` match all)."""

    def __init__(self, pattern: DFPattern, ty: Any):
        super().__init__(pattern)
        self.ty = ty


class DataTypePattern(_Constraint):
    """``pattern`` whose element type is ``dtype``."""

    def __init__(self, pattern: DFPattern, dtype: Any):
        super().__init__(pattern)
        self.dtype = str(dtype)


class ShapePattern(_Constraint):
    """``pattern`` of shape ``shape``: same rank, ints by value, symbolic dims by their text."""

    def __init__(self, pattern: DFPattern, shape: Sequence[Any]):
        super().__init__(pattern)
        self.shape = list(shape)


class TagPattern(_Constraint):
    """One named alternative of :func:`alt`: matches what ``pattern`` matches, and the
    match records that the alternative ``name`` of the tag ``tag`` is the one that did.

    It constrains nothing: the walks that look through ``has_attr`` and the like (the
    operators a pattern needs, the matcher's flattened ``|``) look through it too.
    """

    def __init__(self, pattern: DFPattern, tag: str, name: str):
        super().__init__(pattern)
        self.tag = tag
        self.name = name


def alt(*alternatives: Any, tag: str, **named: Any) -> DFPattern:
    """Alternatives with names: which one matched is ``match.tag(tag)``.

    ``alt(p, q, tag="key_form")`` names them by position (``"0"``, ``"1"``, ...);
    ``alt(tag="key_form", transposed=p, direct=q)`` by keyword.  They are tried in the
    order given (positional ones first), as ``p | q`` tries them, and a failed
    alternative leaves no tag behind.  A rule reads the form that matched by name
    (``if match.tag("key_form") == "transposed"``) instead of testing which role patterns
    took part.

    Parameters
    ----------
    *alternatives, **named : DFPattern or expression
        The alternatives (converted with :func:`as_pattern`).
    tag : str
        The name the match answers to; two ``alt`` of one pattern need two tags.

    Returns
    -------
    DFPattern
        The ``|`` of the named alternatives (the alternative itself when there is one).
    """
    if not isinstance(tag, str) or not tag:
        raise PatternError(f"alt(..., tag=...) expects a non-empty string tag, got {tag!r}")
    options = [(str(i), p) for i, p in enumerate(alternatives)] + list(named.items())
    if not options:
        raise PatternError(f"alt(tag={tag!r}) has no alternative: give at least one pattern")
    tagged = [TagPattern(as_pattern(p), tag, name) for name, p in options]
    pattern: DFPattern = tagged[-1]
    for option in reversed(tagged[:-1]):  # p | (q | r): tried left to right
        pattern = AltPattern(option, pattern)
    return pattern


class DominatorPattern(DFPattern):
    """Relay's dominator: ``child`` at the root, ``path`` on every way back to ``parent``.

    Matches when ``child`` matches the root, and walking back from the root through
    nodes that match ``path`` reaches one node matching ``parent`` on every way, and
    everything the parent and the path nodes compute flows into the root (the root
    post-dominates the parent: a diamond).  :mod:`patternkit.dpl.dominator` spells the
    rules out, with what a root costs.
    """

    def __init__(self, parent: Any, path: Any, child: Any):
        self.parent = as_pattern(parent)
        self.path = as_pattern(path)
        self.child = as_pattern(child)

    def children(self) -> tuple["DFPattern", ...]:
        """The patterns this one is built from, in matching order."""
        return (self.parent, self.path, self.child)


class IfPattern(DFPattern):
    """A Relax ``If``: a condition and the value of each branch.

    Branches are matched against each branch's result, looking through the bindings of
    the branch, so ``is_if(c, is_op("nn.relu")(x), x)`` matches
    ``if c: lv = R.nn.relu(x); lv  else: x``.  An ``If`` is bound in an ordinary (not
    dataflow) block, and is never looked through: it is matched where it is bound.
    """

    def __init__(self, cond: Any, true_branch: Any, false_branch: Any):
        self.cond = as_pattern(cond)
        self.true_branch = as_pattern(true_branch)
        self.false_branch = as_pattern(false_branch)

    def children(self) -> tuple["DFPattern", ...]:
        """The patterns this one is built from, in matching order."""
        return (self.cond, self.true_branch, self.false_branch)


# -- constructors (Relay's names) -------------------------------------------------------
def dominates(parent: Any, path: Any, child: Any) -> DominatorPattern:
    """Relay's ``dominates(parent, path, child)``; see :class:`DominatorPattern`.

    >>> diamond = dominates(is_op("nn.conv2d")(wildcard(), wildcard()),  # doctest: +SKIP
    ...                     wildcard().has_attr({"TOpPattern": K_ELEMWISE})(wildcard()),
    ...                     is_op("add")(wildcard(), wildcard()))
    """
    return DominatorPattern(parent, path, child)


def is_if(cond: Any, true_branch: Any, false_branch: Any) -> IfPattern:
    """Relay's ``is_if(cond, true_branch, false_branch)``; see :class:`IfPattern`."""
    return IfPattern(cond, true_branch, false_branch)


def wildcard() -> WildcardPattern:
    """A pattern that matches any expression."""
    return WildcardPattern()


def is_op(name: str) -> ExprPattern:
    """An operator, by Relay name (``"nn.conv2d"``, ``"add"``) or Relax name."""
    return ExprPattern(get_op(name))


def is_constant() -> ConstantPattern:
    """A pattern that matches any constant; see :class:`ConstantPattern`."""
    return ConstantPattern()


def is_scalar(value: float, rtol: float | None = None, atol: float = 0.0) -> ScalarPattern:
    """A one-element constant close to ``value`` in any dtype; see :class:`ScalarPattern`."""
    return ScalarPattern(value, rtol, atol)


is_const = is_constant


def is_var(name: str = "") -> VarPattern:
    """A free variable (a function parameter), optionally by name."""
    return VarPattern(name)


def is_dfv(name: str = "") -> DataflowVarPattern:
    """A dataflow variable, optionally by name (``tvm.relax.dpl.is_dfv``)."""
    return DataflowVarPattern(name)


def is_gv(name: str = "") -> GlobalVarPattern:
    """A GlobalVar whose name contains ``name`` (``tvm.relax.dpl.is_gv``)."""
    return GlobalVarPattern(name)


def is_extern(global_symbol: str = "") -> ExternFuncPattern:
    """An ``ExternFunc``, optionally by symbol (the callee of ``call_dps_packed``)."""
    return ExternFuncPattern(global_symbol)


def is_expr(expr: Any) -> ExprPattern:
    """A pattern that matches ``expr`` itself (structurally equal)."""
    return ExprPattern(expr)


def is_tuple(fields: Sequence[Any] | None) -> TuplePattern:
    """A tuple of ``fields`` (any arity if ``None``)."""
    return TuplePattern(fields)


def is_tuple_get_item(tuple_value: Any, index: int | None = None) -> TupleGetItemPattern:
    """Item ``index`` of ``tuple_value`` (any index if ``None``)."""
    return TupleGetItemPattern(tuple_value, index)


def has_attr(attrs: dict[str, Any], pattern: DFPattern | None = None) -> AttrPattern:
    """``pattern`` (a wildcard if ``None``) with the attributes ``attrs``."""
    return AttrPattern(pattern if pattern is not None else wildcard(), attrs)


def has_dtype(dtype: Any, pattern: DFPattern | None = None) -> DataTypePattern:
    """``pattern`` (a wildcard if ``None``) of element type ``dtype``."""
    return DataTypePattern(pattern if pattern is not None else wildcard(), dtype)


def has_shape(shape: Sequence[Any], pattern: DFPattern | None = None) -> ShapePattern:
    """``pattern`` (a wildcard if ``None``) of shape ``shape``."""
    return ShapePattern(pattern if pattern is not None else wildcard(), shape)


def has_type(ty: Any, pattern: DFPattern | None = None) -> TypePattern:
    """``pattern`` (a wildcard if ``None``) whose type fits ``ty``."""
    return TypePattern(pattern if pattern is not None else wildcard(), ty)


def as_pattern(obj: Any) -> DFPattern:
    """Coerce ``obj`` to a pattern.

    Relax expressions become :class:`ExprPattern`; Python numbers become
    :class:`ScalarPattern` (a constant of that value in whatever dtype the model uses).
    """
    if isinstance(obj, DFPattern):
        return obj
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return ScalarPattern(obj)
    if isinstance(obj, (tvm.ir.Expr, tvm.ir.Op)):
        return ExprPattern(obj)
    if isinstance(obj, relax.dpl.DFPattern):
        raise PatternError(
            "a tvm.relax.dpl pattern was given where a patternkit pattern is expected; build "
            "it with patternkit's constructors (wildcard, is_op, ...) instead")
    raise PatternError(f"expected a pattern, found {type(obj).__name__}: {obj!r}")


def _binary(op_name: str, lhs: Any, rhs: Any) -> CallPattern:
    return CallPattern(is_op(op_name), [as_pattern(lhs), as_pattern(rhs)])


# -- walking ---------------------------------------------------------------------------
def root_op_names(pattern: DFPattern) -> frozenset[str] | None:
    """Names of the operators a match's root can call, or ``None`` if it can be anything.

    The rewrite driver indexes bindings by operator, so only bindings that can possibly
    match are handed to the matcher.  Kept on the pattern (patterns are not changed once
    built): the driver, the index and the tables ask it of every rule on every call.
    """
    cached = pattern.__dict__.get("_root_op_names", _NOT_CACHED)
    if cached is _NOT_CACHED:
        cached = pattern.__dict__["_root_op_names"] = _root_op_names(pattern)
    names: frozenset[str] | None = cached
    return names


_NOT_CACHED = object()


def _root_op_names(pattern: DFPattern) -> frozenset[str] | None:
    if isinstance(pattern, CallPattern):
        return op_names_of(pattern.op)
    if isinstance(pattern, AltPattern):
        left, right = root_op_names(pattern.left), root_op_names(pattern.right)
        if left is None or right is None:
            return None
        return left | right
    if isinstance(pattern, AndPattern):  # both sides match the root: either side narrows it
        left, right = root_op_names(pattern.left), root_op_names(pattern.right)
        if left is None or right is None:
            return right if left is None else left
        return left & right
    if isinstance(pattern, _Constraint):
        return root_op_names(pattern.pattern)
    if isinstance(pattern, TupleGetItemPattern):
        return frozenset({"<TupleGetItem>"})
    if isinstance(pattern, TuplePattern):
        return frozenset({"<Tuple>"})
    if isinstance(pattern, DominatorPattern):
        return root_op_names(pattern.child)
    if isinstance(pattern, IfPattern):
        return frozenset({"<If>"})
    return None


#: Operators the matcher may match for one another: ``divide`` / ``multiply`` re-associate
#: (:mod:`patternkit.dpl.association`), so a requirement naming one names both.
_INTERCHANGEABLE = (frozenset({"relax.divide", "relax.multiply"}),)

#: Most requirement sets kept per pattern node (alternatives multiply them).
_MAX_REQUIREMENTS = 32


def required_op_names(pattern: DFPattern) -> tuple[frozenset[str], ...]:
    """Sets of operator names of which every match calls at least one, each.

    A necessary condition, never a sufficient one: a function whose bindings call no
    operator of one of the sets cannot hold a match, so the engine skips the pattern
    there without trying its candidate roots one by one (a GELU rule on a model without
    ``erf``).  Optional parts (alternatives with a wildcard, ``through``, ``up_to_cast``),
    negations and operator kinds require nothing; an empty tuple requires nothing.
    """
    cached: tuple[frozenset[str], ...] | None = pattern.__dict__.get("_required_op_names")
    if cached is not None:  # patterns are not changed once built; tables ask every call
        return cached
    memo: dict[int, tuple[frozenset[str], ...]] = {}

    def visit(p: DFPattern) -> tuple[frozenset[str], ...]:
        key = id(p)
        if key not in memo:
            memo[key] = ()  # a pattern reached again while it is visited requires nothing more
            memo[key] = _minimal(_requirements(p, visit))
        return memo[key]

    pattern.__dict__["_required_op_names"] = found = visit(pattern)
    return found


def _requirements(p: DFPattern, visit: Callable[[DFPattern], tuple[frozenset[str], ...]]
                  ) -> list[frozenset[str]]:
    if isinstance(p, CallPattern):
        names = op_names_of(p.op)
        found = [] if names is None else [_widened(names)]
        for arg in p.args or ():
            found.extend(visit(arg))
        return found
    if isinstance(p, AltPattern):  # one side matches: a set of each side, joined
        left, right = visit(p.left), visit(p.right)
        return [a | b for a in left for b in right]  # cut by _minimal, smallest first
    if isinstance(p, AndPattern):
        return [*visit(p.left), *visit(p.right)]
    if isinstance(p, _Constraint):
        return list(visit(p.pattern))
    if isinstance(p, TupleGetItemPattern):
        return list(visit(p.tuple))
    if isinstance(p, TuplePattern):
        return [r for f in p.fields or () for r in visit(f)]
    if isinstance(p, DominatorPattern):  # the path may repeat zero times
        return [*visit(p.parent), *visit(p.child)]
    return []


def _widened(names: frozenset[str]) -> frozenset[str]:
    for group in _INTERCHANGEABLE:
        if names & group:
            names = names | group
    return names


def _minimal(sets: list[frozenset[str]]) -> tuple[frozenset[str], ...]:
    """``sets`` without repeats and without supersets of another (they say nothing more),
    at most :data:`_MAX_REQUIREMENTS` of them: the smallest, which tell most functions
    apart, in an order that does not depend on string hashing (an order that did made a
    rule's requirements, and whether a model's run tried it at all, differ from process
    to process).
    """
    unique = sorted(set(sets), key=lambda s: (len(s), sorted(s)))
    kept: list[frozenset[str]] = []
    for s in unique:
        if not any(k <= s for k in kept):
            kept.append(s)
    return tuple(kept[:_MAX_REQUIREMENTS])


def may_occur(requirements: tuple[frozenset[str], ...], present: Any) -> bool:
    """Can a pattern with these :func:`required_op_names` match where ``present`` ops occur?"""
    return all(any(name in present for name in names) for names in requirements)


def op_names_of(op_pattern: DFPattern) -> frozenset[str] | None:
    """The operator names a call pattern's callee ``op_pattern`` accepts (``None``: any)."""
    if isinstance(op_pattern, ExprPattern) and isinstance(op_pattern.expr, tvm.ir.Op):
        return frozenset({op_pattern.expr.name})
    if isinstance(op_pattern, AltPattern):
        left, right = op_names_of(op_pattern.left), op_names_of(op_pattern.right)
        return None if left is None or right is None else left | right
    if isinstance(op_pattern, _Constraint):
        return op_names_of(op_pattern.pattern)
    return None


def _type_text(ty: Any) -> str:
    """A type as a reader says it: ``rank-4 tensor`` for a tensor type that fixes only its
    rank (TVM prints ``R.Tensor(dtype="void", ndim=4)``), else TVM's text.
    """
    if isinstance(ty, relax.TensorType) and ty.shape is None:
        dtype = str(ty.dtype)
        rank = f"rank-{ty.ndim} " if ty.ndim >= 0 else ""
        return f"{rank}{dtype + ' ' if dtype and dtype != 'void' else ''}tensor"
    return expr_text(ty, 80)


def pattern_to_text(pattern: DFPattern, max_depth: int | None = None) -> str:
    """A compact, readable rendering: ``add(divide(multiply(*, subtract(*, *)), ...), *)``.

    ``max_depth`` cuts the rendering that many levels below ``pattern`` (``…`` stands for
    what is cut).  A pattern is a DAG and its text a tree: one that shares sub-patterns
    (a role used several times, ``through`` alternatives) can print to megabytes, so
    messages that quote a pattern bound it.
    """
    if max_depth is not None and max_depth < 0:
        return "…"
    below = None if max_depth is None else max_depth - 1

    def text(sub: DFPattern) -> str:
        return pattern_to_text(sub, below)

    if isinstance(pattern, WildcardPattern):
        return "*"
    if isinstance(pattern, ExprPattern):
        return _expr_pattern_text(pattern.expr)
    if isinstance(pattern, ConstantPattern):
        return "const"
    if isinstance(pattern, ScalarPattern):
        return f"const({pattern.value:g})"
    if isinstance(pattern, VarPattern):
        kind = "dfv" if isinstance(pattern, DataflowVarPattern) else "var"
        return f"{kind}({pattern.name})" if pattern.name else kind
    if isinstance(pattern, GlobalVarPattern):
        return f"gv({pattern.name})" if pattern.name else "gv"
    if isinstance(pattern, ExternFuncPattern):
        return f"extern({pattern.global_symbol})" if pattern.global_symbol else "extern"
    if isinstance(pattern, CallPattern):
        if pattern.args is None:
            args = "..."
        else:
            args = ", ".join(text(a) for a in pattern.args)
            if pattern.varg_default_wildcard:
                args += ", ..."
        op = (_expr_pattern_text(pattern.op.expr) if isinstance(pattern.op, ExprPattern)
              else text(pattern.op))  # the operator's name costs no depth
        return f"{op}({args})"
    if isinstance(pattern, TuplePattern):
        return "(...)" if pattern.fields is None else \
            "(" + ", ".join(text(f) for f in pattern.fields) + ")"
    if isinstance(pattern, TupleGetItemPattern):
        return f"{text(pattern.tuple)}[{'*' if pattern.index is None else pattern.index}]"
    if isinstance(pattern, AltPattern):
        return f"({text(pattern.left)} | {text(pattern.right)})"
    if isinstance(pattern, AndPattern):
        return f"({text(pattern.left)} & {text(pattern.right)})"
    if isinstance(pattern, NotPattern):
        return f"~{text(pattern.reject)}"
    if isinstance(pattern, TagPattern):  # the tag costs no depth, as an operator's name
        return f"{pattern.tag}={pattern.name}: {pattern_to_text(pattern.pattern, max_depth)}"
    if isinstance(pattern, AttrPattern):
        return f"{text(pattern.pattern)}.has_attr({pattern.attrs})"
    if isinstance(pattern, TypePattern):
        return f"{text(pattern.pattern)}.has_type({_type_text(pattern.ty)})"
    if isinstance(pattern, DataTypePattern):
        return f"{text(pattern.pattern)}.has_dtype({pattern.dtype!r})"
    if isinstance(pattern, ShapePattern):
        return f"{text(pattern.pattern)}.has_shape({pattern.shape})"
    if isinstance(pattern, DominatorPattern):
        return (f"dominates({text(pattern.parent)}, {text(pattern.path)}, "
                f"{text(pattern.child)})")
    if isinstance(pattern, IfPattern):
        return (f"if({text(pattern.cond)}, {text(pattern.true_branch)}, "
                f"{text(pattern.false_branch)})")
    return type(pattern).__name__


def _expr_pattern_text(expr: Any) -> str:
    """An operator by name; any other expression as ``expr(...)`` with what it holds."""
    if isinstance(expr, tvm.ir.Op):
        name: str = expr.name
        return name.removeprefix("relax.")
    if isinstance(expr, relax.Var):
        return f"expr({var_name(expr)})"
    constant = constant_text(expr)
    return f"expr({constant if constant is not None else expr_text(expr, 40)})"


# -- conversion to tvm.relax.dpl ----------------------------------------------------------
def _to_dpl(pattern: DFPattern, memo: dict[int, Any]) -> Any:
    if id(pattern) in memo:
        return memo[id(pattern)]
    dpl = relax.dpl
    if isinstance(pattern, WildcardPattern):
        out = dpl.wildcard()
    elif isinstance(pattern, ExprPattern):
        out = dpl.ExprPattern(pattern.expr)
    elif isinstance(pattern, ConstantPattern):
        out = dpl.is_const()
    elif isinstance(pattern, ScalarPattern):
        # tvm.relax.dpl has no value test: any constant.  Checks of tables handed to
        # FuseOpsByPattern re-match with patternkit's matcher, which tests the value.
        out = dpl.is_const()
    elif isinstance(pattern, DataflowVarPattern):
        out = dpl.DataflowVarPattern(pattern.name)
    elif isinstance(pattern, VarPattern):
        out = dpl.is_var(pattern.name)
    elif isinstance(pattern, GlobalVarPattern):
        out = dpl.GlobalVarPattern(pattern.name)
    elif isinstance(pattern, ExternFuncPattern):
        out = dpl.ExternFuncPattern(pattern.global_symbol)
    elif isinstance(pattern, CallPattern):
        op = _to_dpl(pattern.op, memo)
        if pattern.args is None:
            out = dpl.CallPattern(op, [], varg_default_wildcard=True)
        else:
            out = dpl.CallPattern(op, [_to_dpl(a, memo) for a in pattern.args],
                                  varg_default_wildcard=pattern.varg_default_wildcard)
    elif isinstance(pattern, TuplePattern):
        if pattern.fields is None:
            raise PatternError("is_tuple(None) (a tuple of any arity) has no tvm.relax.dpl "
                               "equivalent; list the fields")
        out = dpl.TuplePattern([_to_dpl(f, memo) for f in pattern.fields])
    elif isinstance(pattern, TupleGetItemPattern):
        if pattern.index is not None and pattern.index < 0:
            raise PatternError(f"is_tuple_get_item(..., {pattern.index}) counts from the end; "
                               f"tvm.relax.dpl reads a negative index as 'any index', so it "
                               f"has no equivalent; give the index from the start")
        out = dpl.TupleGetItemPattern(_to_dpl(pattern.tuple, memo),
                                      -1 if pattern.index is None else pattern.index)
    elif isinstance(pattern, AltPattern):
        out = dpl.OrPattern(_to_dpl(pattern.left, memo), _to_dpl(pattern.right, memo))
    elif isinstance(pattern, AndPattern):
        out = dpl.AndPattern(_to_dpl(pattern.left, memo), _to_dpl(pattern.right, memo))
    elif isinstance(pattern, NotPattern):
        out = dpl.NotPattern(_to_dpl(pattern.reject, memo))
    elif isinstance(pattern, TagPattern):
        # tvm.relax.dpl has no names for alternatives: the alternative itself (TVM's
        # matcher then cannot tell which one matched; patternkit's match.tag can)
        out = _to_dpl(pattern.pattern, memo)
    elif isinstance(pattern, AttrPattern):
        if "TOpPattern" in pattern.attrs:
            raise PatternError(
                f"{pattern_to_text(pattern)}: no Relax operator registers TOpPattern, so "
                f"tvm.relax.dpl cannot match operator kinds; list the operators "
                f"(is_op(a) | is_op(b)) or match with patternkit")
        attrs = {k: (tvm.DataType(v) if k.endswith("dtype") and isinstance(v, str) else v)
                 for k, v in pattern.attrs.items()}
        out = _to_dpl(pattern.pattern, memo).has_attr(attrs)
    elif isinstance(pattern, TypePattern):
        out = _to_dpl(pattern.pattern, memo).has_ty(pattern.ty)
    elif isinstance(pattern, DataTypePattern):
        out = _to_dpl(pattern.pattern, memo).has_dtype(pattern.dtype)
    elif isinstance(pattern, ShapePattern):
        out = _to_dpl(pattern.pattern, memo).has_shape(pattern.shape)
    elif isinstance(pattern, (DominatorPattern, IfPattern)):
        raise PatternError(f"{type(pattern).__name__} has no tvm.relax.dpl equivalent: match, "
                           f"rewrite and form composites with patternkit (pk.MergeComposite)")
    else:
        raise PatternError(f"cannot convert {type(pattern).__name__} to tvm.relax.dpl")
    memo[id(pattern)] = out
    return out
