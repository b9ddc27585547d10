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
  associated forms, and ``multiply(a, divide(b, c))`` matches ``divide(multiply(a, b), c)``,
  on floats only (an integer division truncates, so an integer nest matches as written).
  A rewrite and a pattern table try a pattern only at bindings that call its root
  operator, so there the root is as written: ``match`` of ``(x * y) / z`` accepts the
  binding ``a * (b / c)``, a rewrite never tries it (a batch norm's input gradient
  ``dy * gamma / std`` must not take a forward ``(x - m) / std * gamma``);
* a failed alternative leaves no trace (the memo is rolled back);
* ``dominates(parent, path, child)`` walks the diamond back from the root
  (:mod:`patternkit.dpl.dominator`: the rules, and what a root costs);
* ``is_if(cond, then, else)`` matches each branch's result through the branch's own
  bindings, which are not interior bindings of the match (they live in the branch).

The matcher is pure Python and touches only the bindings a pattern reaches, so matching
costs O(pattern size) per candidate whatever the size of the function.  The tests of the
constraint patterns (``has_attr``, ``has_type`` ...) are in
:mod:`patternkit.dpl.constraints`, the re-associated forms in
:mod:`patternkit.dpl.association`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import tvm
from tvm import relax

from ..errors import PatternError
from ..ir import compat as C
from ..ir.compat import VAR_TYPES, handle
from .association import reassociations
from .constraints import check_constraint, scalar_matches
from .dominator import (
    DiamondTests,
    Uses,
    is_anything,
    uses_of_expression,
    uses_of_function,
    uses_of_table,
    walk_diamond,
)
from .pattern import (
    COMMUTATIVE_OPS,
    AltPattern,
    AndPattern,
    AttrPattern,
    CallPattern,
    ConstantPattern,
    DataflowVarPattern,
    DataTypePattern,
    DFPattern,
    DominatorPattern,
    ExprPattern,
    ExternFuncPattern,
    GlobalVarPattern,
    IfPattern,
    NotPattern,
    ScalarPattern,
    ShapePattern,
    TagPattern,
    TupleGetItemPattern,
    TuplePattern,
    TypePattern,
    VarPattern,
    WildcardPattern,
    as_pattern,
    pattern_to_text,
    provide_sugar,
)

Lookup = Callable[[Any], Any]
#: What a node handler of :class:`Matcher` returns: ``(matched, value, Var looked through)``.
_Outcome = tuple[bool, Any, Any]
#: A call's look-ahead (:func:`_look_ahead`): its operator's handle, and for each argument
#: position with requirements the handles of the operators that argument may call.
_LookAhead = tuple[int, tuple[tuple[int, frozenset[int]], ...]]


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
    repeated : dict
        Pattern -> every expression it matched, for patterns that match many nodes
        (a dominator's ``path``: its path nodes, in visit order), as Relay's node map
        listed them.
    """

    root: Any
    captures: dict[DFPattern, Any] = field(default_factory=dict)
    bound_vars: dict[DFPattern, Any] = field(default_factory=dict)
    internal: list[Any] = field(default_factory=list)
    inputs: list[Any] = field(default_factory=list)
    internal_keys: list[int] = field(default_factory=list)
    repeated: dict[DFPattern, list[Any]] = field(default_factory=dict)
    #: tag -> the name of its alternative that matched, or the pair of names that
    #: contradict each other: built by :meth:`tag` on first use (a check asks several
    #: tags of one match) for ``_tags_of`` captures; a match that grows is indexed again.
    _tags: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)
    _tags_of: int = field(default=-1, init=False, repr=False, compare=False)

    def tag(self, tag: str) -> str | None:
        """The name of the alternative of :func:`~patternkit.dpl.pattern.alt` ``tag`` that
        matched, or ``None`` when no alternative of that tag is part of the match.

        Raises
        ------
        PatternError
            Two ``alt`` nodes with the tag ``tag`` matched different alternatives: the
            tag does not say which form matched (give each ``alt`` its own tag).
        """
        tags = self._tags
        if tags is None or self._tags_of != len(self.captures):
            tags = self._tags = _tag_index(self.captures)
            self._tags_of = len(self.captures)
        found = tags.get(tag)
        if type(found) is tuple:
            raise PatternError(f"the tag {tag!r} names two alternatives that both "
                               f"matched ({found[0]!r} and {found[1]!r}): give "
                               f"each alt(...) of the pattern its own tag")
        return found


def _tag_index(captures: dict[DFPattern, Any]) -> dict[str, Any]:
    """Tag -> the name of the alternative that matched, or the first two names that
    contradict each other (in capture order), over every tagged alternative captured.
    """
    tags: dict[str, Any] = {}
    for pattern in captures:
        if type(pattern) is TagPattern:
            found = tags.get(pattern.tag)
            if found is None:
                tags[pattern.tag] = pattern.name
            elif type(found) is not tuple and found != pattern.name:
                tags[pattern.tag] = (found, pattern.name)
    return tags


class _MatchRecord:
    """What a match in progress has recorded, and how to take it back.

    ``_memo`` (pattern -> what it matched), ``_via`` (pattern -> the Var looked through
    to reach it), ``_internal`` (handle -> Var looked through, in first-visit order) and
    ``_inputs`` (handle -> captured input, in pattern order) only grow; every addition is
    logged on ``_trail``, so that a failed alternative is undone by :meth:`_rollback` to
    the trail's length before it (:meth:`_mark`).  Dominators also record
    ``_repeated`` (pattern -> the nodes it matched) and ``_excluded`` (handles of inputs
    that turned out to be interior nodes), both created on first use.
    """

    def __init__(self, lookup: Lookup | None = None, call_args: dict[int, list[Any]] | None = None,
                 table: dict[int, Any] | None = None,
                 uses: Uses | Callable[[], Uses] | None = None,
                 call_ops: dict[int, int] | None = None):
        #: ``(var, handle) -> value`` or ``None``: the look-up the matcher reads through.
        self._lookup_key: Callable[[Any, int], Any]
        if table is not None:  # handle -> value: the fast path used by the rewrite driver
            get = table.get
            self._lookup_key = lambda var, key: get(key)
        else:
            lookup = lookup or (lambda var: None)
            self._lookup_key = lambda var, key: lookup(var)
        #: ``table.get`` while the look-up is the table's, else ``None``: ``_resolve``
        #: reads it directly, without the ``_lookup_key`` frame.
        self._table_get: Callable[[int], Any] | None = None if table is None else table.get
        self._call_args = call_args if call_args is not None else {}
        self._call_ops = call_ops if call_ops is not None else {}
        self._table = table
        self._lookup_fn = lookup
        self._uses = uses
        self._top: Any = None  # the expression being matched (a bare one is its own graph)
        self._top_uses: tuple[Any, Uses] | None = None

    def _start(self) -> None:
        """Forget the previous match: one matcher serves many candidates."""
        self._memo: dict[DFPattern, Any] = {}
        self._via: dict[DFPattern, Any] = {}
        self._internal: dict[int, Any] = {}
        self._inputs: dict[int, Any] = {}
        self._trail: list[tuple[str, Any]] = []
        self._repeated: dict[DFPattern, list[Any]] | None = None
        self._excluded: dict[int, bool] | None = None

    def _recorded(self, root: Any) -> Match:
        inputs = self._inputs
        if self._excluded:
            excluded = self._excluded
            inputs = {k: v for k, v in inputs.items() if k not in excluded}
        # The Match takes the dicts over, uncopied: the next match starts new ones (_start).
        return Match(root=root, captures=self._memo, bound_vars=self._via,
                     internal=list(self._internal.values()), inputs=list(inputs.values()),
                     internal_keys=list(self._internal), repeated=self._repeated or {})

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
            elif kind == "input":
                self._inputs.pop(key, None)
            elif kind == "repeated":
                if self._repeated is not None:  # logged once _on_dominator created it
                    self._repeated.pop(key, None)
            elif self._excluded is not None:  # "excluded", logged the same way
                self._excluded.pop(key, None)

    def _add_input(self, expr: Any) -> None:
        if type(expr) is tvm.ir.Op:
            return
        key = handle(expr)
        if key in self._inputs:
            return
        self._inputs[key] = expr
        self._trail.append(("input", key))

    def _args_of(self, call: relax.Call) -> list[Any]:
        key = handle(call)
        args = self._call_args.get(key)
        if args is None:
            args = self._call_args[key] = C.array_items(call.args)
        return args

    def _lookup(self, var: Any) -> Any:
        return self._lookup_key(var, handle(var))

    def _resolve(self, expr: Any) -> tuple[Any, Any]:
        """Follow bindings from a Var to its value; returns (value, last var looked through)."""
        via = None
        get = self._table_get
        while type(expr) in VAR_TYPES:
            key = handle(expr)
            value = get(key) if get is not None else self._lookup_key(expr, key)
            if value is None:
                break
            if key not in self._internal:
                self._internal[key] = expr
                self._trail.append(("internal", key))
            via, expr = expr, value
        return expr, via

    def _peek(self, expr: Any) -> Any:
        """The value behind ``expr`` without recording the look-through."""
        seen = 0
        while isinstance(expr, relax.Var) and seen < 64:
            value = self._lookup(expr)
            if value is None:
                break
            expr, seen = value, seen + 1
        return expr

    def _same(self, a: Any, b: Any) -> bool:
        if a is b or (type(b) in VAR_TYPES and type(a) in VAR_TYPES and handle(a) == handle(b)):
            return True  # the usual diamond: one Var read twice (no FFI call)
        if a.same_as(b):
            return True
        mark = self._mark()
        ra, _ = self._resolve(a)
        rb, _ = self._resolve(b)
        self._rollback(mark)
        same: bool = ra.same_as(rb)
        return same


class Matcher(_MatchRecord):
    """Match patterns against expressions.

    Parameters
    ----------
    lookup : callable, optional
        ``lookup(var)`` returns the value bound to ``var`` if the matcher may look through
        it, else ``None``.  Without it the matcher sees only the expression given.
    call_args : dict, optional
        Handle of a call -> its argument list, read once and shared with the caller.
    table : dict, optional
        Handle of a Var -> its value: the rewrite engine's index, used instead of
        ``lookup`` (no Python wrapper of the Var needs hashing).
    call_ops : dict, optional
        Handle of a call -> the handle of its operator, from the same index (a call it
        does not hold has its operator read).

    Every pattern node is matched by :meth:`visit`; a subclass that overrides it sees
    each step (:func:`patternkit.explain` records the deepest failure that way).
    """

    def match(self, pattern: DFPattern, expr: Any) -> Match | None:
        """The :class:`Match` of ``pattern`` at ``expr``, or ``None``."""
        self._start()
        self._top = expr
        if not self.visit(as_pattern(pattern), expr):
            return None
        return self._recorded(expr)

    # -- dispatch ------------------------------------------------------------------------
    def visit(self, pattern: DFPattern, expr: Any) -> bool:
        """Match one pattern node against ``expr``, recording what it matched.

        A failed match leaves no trace (everything recorded since is rolled back).
        """
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

    def _on_wildcard(self, pattern: WildcardPattern, expr: Any) -> _Outcome:
        self._add_input(expr)
        return True, expr, None

    def _on_var(self, pattern: VarPattern, expr: Any) -> _Outcome:
        ok = (isinstance(expr, relax.Var) and self._lookup(expr) is None
              and (not pattern.name or C.var_name(expr) == pattern.name))
        if ok:
            self._add_input(expr)
        return ok, expr, None

    def _on_dataflow_var(self, pattern: DataflowVarPattern, expr: Any) -> _Outcome:
        if not isinstance(expr, relax.DataflowVar):
            return False, None, None
        return self._on_var(pattern, expr)

    def _on_global_var(self, pattern: GlobalVarPattern, expr: Any) -> _Outcome:
        return (type(expr) is tvm.ir.GlobalVar and pattern.name in expr.name_hint), expr, None

    def _on_extern_func(self, pattern: ExternFuncPattern, expr: Any) -> _Outcome:
        value, via = self._resolve(expr)
        ok = isinstance(value, relax.ExternFunc) and (
            not pattern.global_symbol or str(value.global_symbol) == pattern.global_symbol)
        return ok, value, via

    def _on_constant(self, pattern: ConstantPattern, expr: Any) -> _Outcome:
        value, via = self._resolve(expr)
        return C.is_constant(value), (expr if via is None else value), via

    def _on_scalar(self, pattern: ScalarPattern, expr: Any) -> _Outcome:
        value, via = self._resolve(expr)
        return scalar_matches(pattern, value), (expr if via is None else value), via

    def _on_call(self, pattern: CallPattern, expr: Any) -> _Outcome:
        # _resolve, inlined for the engine's table: a call pattern is most of a rule's
        # nodes, and most of them look through one Var
        get = self._table_get
        if get is None:
            value, via = self._resolve(expr)
        else:
            value, via = expr, None
            internal = self._internal
            while type(value) in VAR_TYPES:
                key = handle(value)
                found = get(key)
                if found is None:
                    break
                if key not in internal:
                    internal[key] = value
                    self._trail.append(("internal", key))
                via, value = value, found
        if type(value) is not relax.Call:
            return False, None, None
        # _match_call, inlined: a call pattern is most of a rule's nodes.
        trail = self._trail
        mark = len(trail)
        if self._match_call_exact(pattern, value):
            return True, value, via
        if len(trail) > mark:
            self._rollback(mark)
        if not self._may_reassociate(pattern, value):
            return False, None, None
        return self._match_associated(pattern, value), value, via

    def _on_tuple(self, pattern: TuplePattern, expr: Any) -> _Outcome:
        value, via = self._resolve(expr)
        return self._match_tuple(pattern, value), value, via

    def _on_tuple_get_item(self, pattern: TupleGetItemPattern, expr: Any) -> _Outcome:
        value, via = self._resolve(expr)
        return self._match_tuple_get_item(pattern, value), value, via

    def _on_alt(self, pattern: AltPattern, expr: Any) -> _Outcome:
        trail = self._trail
        mark = len(trail)
        if self._table_get is not None:  # the engine's index: alternatives flattened (_Flat)
            # _Flat.of's look-up, without its frame: every | of every match comes here
            flat = pattern.__dict__.get("_flat_alternatives") or _Flat.of(pattern)
            if self._memo.keys().isdisjoint(flat.nested):
                return self._on_flat_alt(flat, expr, mark)
        if self.visit(pattern.left, expr):
            return True, self._memo[pattern.left], self._via.get(pattern.left)
        if len(trail) > mark:
            self._rollback(mark)
        ok = self.visit(pattern.right, expr)
        return ok, (self._memo.get(pattern.right) if ok else None), self._via.get(pattern.right)

    def _on_flat_alt(self, flat: "_Flat", expr: Any, mark: int) -> _Outcome:
        """:meth:`_on_alt` over the flattened alternatives of a nest of ``|``.

        The outcome is the recursive one's: alternatives are tried in the same order,
        one that cannot match the operator ``expr``'s value calls, or whose arguments'
        values call other operators than its argument patterns need (one level down),
        is skipped (visited, it would fail leaving no trace), and the nested
        ``AltPattern`` nodes on the way to the alternative that matched are recorded as
        the recursion records them (a rule may name one as a role).
        """
        get, call_ops = self._table_get, self._call_ops
        assert get is not None  # _on_alt flattens over the engine's table only
        value, op_key = _value_and_op(expr, get, call_ops)
        visit, memo, via_of, trail = self.visit, self._memo, self._via, self._trail
        args = None
        for alternative, required, path, ahead, swap in flat.alternatives:
            if required is not None:
                if op_key not in required:
                    continue
                if ahead is not None and op_key == ahead[0]:
                    if args is None:
                        args = self._args_of(value)
                    needs = ahead[1]
                    if not (_args_may_match(needs, args, get, call_ops)
                            or (swap and _args_may_match(needs, args[::-1], get, call_ops))):
                        continue
            if visit(alternative, expr):
                matched, via = memo[alternative], via_of.get(alternative)
                for node in path:  # innermost first, as the recursion returns
                    memo[node] = matched
                    if via is not None:
                        via_of[node] = via
                    trail.append(("memo", node))
                return True, matched, via
            if len(trail) > mark:
                self._rollback(mark)
        return False, None, None

    def _on_tag(self, pattern: TagPattern, expr: Any) -> _Outcome:
        # the alternative itself: its node in the memo is what Match.tag finds
        if not self.visit(pattern.pattern, expr):
            return False, None, None
        return True, self._memo[pattern.pattern], self._via.get(pattern.pattern)

    def _on_and(self, pattern: AndPattern, expr: Any) -> _Outcome:
        if not (self.visit(pattern.left, expr) and self.visit(pattern.right, expr)):
            return False, None, None
        return True, self._memo[pattern.left], self._via.get(pattern.left)

    def _on_not(self, pattern: NotPattern, expr: Any) -> _Outcome:
        # Whatever ``reject`` matched on the way is forgotten: a Not captures nothing.
        mark = self._mark()
        rejected = self.visit(pattern.reject, expr)
        self._rollback(mark)
        return not rejected, expr, None

    def _on_constraint(self, pattern: AttrPattern | TypePattern | DataTypePattern | ShapePattern,
                       expr: Any) -> _Outcome:
        if not self.visit(pattern.pattern, expr):
            return False, None, None
        inner = self._memo[pattern.pattern]
        return check_constraint(pattern, inner), inner, self._via.get(pattern.pattern)

    def _on_dominator(self, pattern: DominatorPattern, expr: Any) -> _Outcome:
        if not self.visit(pattern.child, expr):
            return False, None, None
        root = self._memo[pattern.child]
        via = self._via.get(pattern.child)
        tests = DiamondTests(
            resolve=self._node_of,
            is_parent=lambda e: self.visit(pattern.parent, e),
            is_path=lambda e: self._alone(pattern.path, e),
            is_parent_kind=lambda e: self._alone(pattern.parent, e),
            is_child=lambda e: self._alone(pattern.child, e),
            path_is_anything=is_anything(pattern.path))
        root_key = handle(via if via is not None else root)
        diamond = walk_diamond(root_key, root, tests, self._use_counts(),
                               pattern_to_text(pattern))
        if diamond is None:
            return False, None, None
        trail = self._trail
        if self._repeated is None:
            self._repeated = {}
        if self._excluded is None:
            self._excluded = {}
        for node, key, _ in diamond.path:
            if type(node) in VAR_TYPES and key not in self._internal:
                self._internal[key] = node
                trail.append(("internal", key))
        for key in (handle(diamond.parent), *(k for _, k, _ in diamond.path)):
            if key not in self._excluded:  # a child's wildcard took it as an input
                self._excluded[key] = True
                trail.append(("excluded", key))
        if pattern.path not in self._repeated:
            self._repeated[pattern.path] = [value for _, _, value in diamond.path]
            trail.append(("repeated", pattern.path))
        for free in diamond.free:
            self._add_input(free)
        return True, root, via

    def _node_of(self, expr: Any) -> tuple[int, Any]:
        """``(handle, value)`` of a dataflow node: a bound Var's value, or the expression."""
        key = handle(expr)
        if type(expr) in VAR_TYPES:
            return key, self._lookup_key(expr, key)
        return key, expr

    def _alone(self, pattern: DFPattern, expr: Any) -> bool:
        """Does ``pattern`` match ``expr`` on its own (a fresh match, leaving no trace)?"""
        scratch = Matcher(self._lookup_fn, self._call_args, self._table, self._use_counts(),
                          self._call_ops)
        scratch._lookup_key = self._lookup_key  # the same view (an If branch's too)
        scratch._table_get = self._table_get
        return scratch.match(pattern, expr) is not None

    def _use_counts(self) -> Uses:
        uses = self._uses
        if callable(uses):
            uses = self._uses = uses()
        if uses is not None:
            return uses
        if self._table is not None:  # no engine index: the values this matcher sees
            uses = self._uses = uses_of_table(self._table)
            return uses
        cached = self._top_uses  # a bare expression: its own graph
        if cached is None or cached[0] is not self._top:
            cached = self._top_uses = (self._top, uses_of_expression(self._top))
        return cached[1]

    def _on_if(self, pattern: IfPattern, expr: Any) -> _Outcome:
        value, via = self._resolve(expr)
        if type(value) is not relax.If:
            return False, None, None
        ok = (self.visit(pattern.cond, value.cond)
              and self._match_branch(pattern.true_branch, value.true_branch)
              and self._match_branch(pattern.false_branch, value.false_branch))
        return ok, value, via

    def _match_branch(self, pattern: DFPattern, branch: Any) -> bool:
        """Match a branch's result, looking through the branch's own bindings.

        Those bindings live inside the ``If``: nothing looked through there is an
        interior binding of the match, and no branch Var is an input of it.
        """
        if type(branch) is not relax.SeqExpr:
            return self.visit(pattern, branch)
        local = {handle(b.var): b.value for block in C.array_items(branch.blocks)
                 for b in C.array_items(block.bindings)
                 if type(b) is relax.VarBinding and C.is_pure_value(b.value)}
        local.update((handle(b.var), None) for block in C.array_items(branch.blocks)
                     for b in C.array_items(block.bindings) if handle(b.var) not in local)
        outer, outer_get = self._lookup_key, self._table_get
        self._lookup_key = lambda var, key: local[key] if key in local else outer(var, key)
        self._table_get = None  # the branch's own bindings come first
        mark = self._mark()
        try:
            ok = self.visit(pattern, branch.body)
        finally:
            self._lookup_key, self._table_get = outer, outer_get
        if ok:
            self._forget_branch_locals(mark, local)
        return ok

    def _forget_branch_locals(self, mark: int, local: dict[int, Any]) -> None:
        """Drop the branch's Vars from the interior bindings and the inputs recorded since
        ``mark`` (a later rollback past ``mark`` still finds a consistent trail).
        """
        kept = self._trail[:mark]
        for kind, key in self._trail[mark:]:
            if kind == "internal" and key in local:
                self._internal.pop(key, None)
                continue
            if kind == "input" and key in local:
                self._inputs.pop(key, None)
                continue
            kept.append((kind, key))
        self._trail[:] = kept

    # -- node kinds ----------------------------------------------------------------------
    def _match_expr(self, pattern: ExprPattern, expr: Any) -> tuple[bool, Any, Any]:
        target = pattern.expr
        if handle(expr) == pattern.handle:
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
        if not self._may_reassociate(pattern, call):
            return False
        return self._match_associated(pattern, call)

    def _may_reassociate(self, pattern: CallPattern, call: relax.Call) -> bool:
        """Can :func:`reassociations` propose a form of ``pattern`` for ``call``: is one a
        divide and the other a multiply, on floats?  Asked on every failed call pattern,
        so it compares handles first.

        Only floats: ``(a * b) / c`` is ``a * (b / c)`` up to rounding, but an integer
        division truncates (``(3 * 4) / 2`` is 6, ``3 * (4 / 2)`` too, ``(3 * 5) / 2`` is
        7 and ``3 * (5 / 2)`` 6), so an integer nest is matched as written.
        """
        op = pattern.op
        if (pattern.args is None or not isinstance(op, ExprPattern) or not op.is_operator
                or op.handle not in _REASSOCIATED_OPS):
            return False
        call_op_key = handle(call.op)
        if call_op_key not in _REASSOCIATED_OPS or call_op_key == op.handle:
            return False
        dtype = C.dtype_of(C.type_of(call))
        return dtype is not None and "float" in dtype

    def _match_call_exact(self, pattern: CallPattern, call: relax.Call) -> bool:
        """The call's operator and arguments match as written (or with swapped operands)."""
        op_pattern = pattern.op
        key = handle(call)
        op = None
        if (type(op_pattern) is ExprPattern and op_pattern.is_operator
                and op_pattern not in self._memo):
            # The usual is_op(...) callee: compare handles, no generic dispatch.
            op_key = self._call_ops.get(key)  # the index's, else read
            if (handle(call.op) if op_key is None else op_key) != op_pattern.handle:
                return False
            op = op_pattern.expr  # the same operator node
            self._memo[op_pattern] = op
            self._trail.append(("memo", op_pattern))
        elif not self.visit(op_pattern, call.op):
            return False
        if pattern.args is None:
            return True
        args = self._call_args.get(key)
        if args is None:
            args = self._call_args[key] = C.array_items(call.args)
        pargs = pattern.args
        if pattern.varg_default_wildcard:
            if len(args) < len(pargs):
                return False
            args = args[:len(pargs)]
        elif len(args) != len(pargs):
            return False
        trail = self._trail
        mark = len(trail)
        if self._match_args(pargs, args):
            return True
        if len(trail) > mark:
            self._rollback(mark)
        if len(args) == 2 and (C.op_name(call) if op is None else C.op_info(op)[0]
                               ) in COMMUTATIVE_OPS:
            if self._match_args(pargs, args[::-1]):
                return True
            self._rollback(mark)
        return False

    def _match_args(self, patterns: list[DFPattern], args: list[Any]) -> bool:
        visit, memo, trail, inputs = self.visit, self._memo, self._trail, self._inputs
        for p, a in zip(patterns, args):
            if type(p) is WildcardPattern and p not in memo:
                # Inlined visit + _on_wildcard: most pattern leaves are fresh wildcards.
                memo[p] = a
                if type(a) is not tvm.ir.Op:
                    key = handle(a)
                    if key not in inputs:
                        inputs[key] = a
                        trail.append(("input", key))
                trail.append(("memo", p))
            elif not visit(p, a):
                return False
        return True

    def _match_associated(self, pattern: CallPattern, call: relax.Call) -> bool:
        """Relay's divide/multiply re-association (:mod:`patternkit.dpl.association`)."""
        for form in reassociations(pattern, call, self._args_of, self._peek):
            mark = self._mark()
            if self._match_call(form, call):
                return True
            self._rollback(mark)
        return False

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
        return self.visit(pattern.tuple, value.tuple_value)


#: Handles of the operators :mod:`patternkit.dpl.association` re-associates (operators
#: are registered once and live as long as TVM).
_REASSOCIATED_OPS = frozenset(handle(tvm.ir.Op.get(name))
                              for name in ("relax.divide", "relax.multiply"))


def _unconstrained(pattern: DFPattern) -> DFPattern:
    """``pattern`` under its ``has_attr`` / ``has_type`` / ... constraints and tags."""
    while isinstance(pattern, (AttrPattern, TypePattern, DataTypePattern, ShapePattern,
                               TagPattern)):
        pattern = pattern.pattern
    return pattern


def _call_op(pattern: DFPattern) -> int | None:
    """Handle of the operator a call pattern names (``is_op``), else ``None``."""
    pattern = _unconstrained(pattern)
    if type(pattern) is not CallPattern:
        return None
    op = pattern.op
    return op.handle if type(op) is ExprPattern and op.is_operator else None


def _required_ops(pattern: DFPattern) -> frozenset[int] | None:
    """Handles of the operators of which every expression ``pattern`` matches calls one
    (``None``: any expression may match).

    A call pattern's operator (``divide`` and ``multiply`` each stand for both, as they
    re-associate), or those of every alternative of a ``|``.
    """
    pattern = _unconstrained(pattern)
    if type(pattern) is CallPattern:
        op = pattern.op
        if type(op) is not ExprPattern or not op.is_operator or op.handle is None:
            return None
        return _REASSOCIATED_OPS if op.handle in _REASSOCIATED_OPS else frozenset((op.handle,))
    if type(pattern) is not AltPattern:
        return None
    found: set[int] = set()
    for _, required, _, _, _ in _Flat.of(pattern).alternatives:
        if required is None:
            return None
        found |= required
    return frozenset(found)


def _value_and_op(expr: Any, get: Callable[[int], Any], call_ops: dict[int, int]
                  ) -> tuple[Any, int | None]:
    """The value behind ``expr`` through the index's table (nothing recorded), and the
    handle of the operator it calls (``None`` for anything but a call).

    :meth:`_MatchRecord._peek` for the table, with the operator: the flattened
    alternatives ask it once per ``|`` and once per argument they look ahead.
    """
    while type(expr) in VAR_TYPES:
        value = get(handle(expr))
        if value is None:
            break
        expr = value
    if type(expr) is not relax.Call:
        return expr, None
    key = handle(expr)
    op_key = call_ops.get(key)
    return expr, (handle(expr.op) if op_key is None else op_key)


def _args_may_match(needs: tuple[tuple[int, frozenset[int]], ...], args: list[Any],
                    get: Callable[[int], Any], call_ops: dict[int, int]) -> bool:
    """Does each argument named in ``needs`` hold (through the table) a call of one of its
    operators?  ``True`` where the argument list is too short to tell (the call's own
    match decides).
    """
    for i, ops in needs:
        if i >= len(args):
            return True
        if _value_and_op(args[i], get, call_ops)[1] not in ops:
            return False
    return True


def _look_ahead(pattern: DFPattern) -> tuple[_LookAhead | None, bool]:
    """What the arguments of a call matching ``pattern`` must call, one level down, and
    whether its operands may be swapped (``add``, ``multiply``).

    The first is ``(operator, ((argument position, operator handles), ...))`` or
    ``None``: it holds for a call of the pattern's own operator only (a ``divide``
    pattern re-associates against a ``multiply`` call, whose arguments are others).
    """
    pattern = _unconstrained(pattern)
    op = _call_op(pattern)
    if op is None or type(pattern) is not CallPattern or pattern.args is None:
        return None, False
    needs = tuple((i, ops) for i, arg in enumerate(pattern.args)
                  if (ops := _required_ops(arg)) is not None)
    # (the callee is an ExprPattern, as _call_op found: the test narrows it for the types)
    swap = (len(pattern.args) == 2 and type(pattern.op) is ExprPattern
            and C.op_info(pattern.op.expr)[0] in COMMUTATIVE_OPS)
    return ((op, needs) if needs else None), swap


class _Flat:
    """The alternatives of a nest of ``|`` in the order the matcher tries them.

    ``through(x, ops, depth=2)`` is seven alternatives nested six deep; matched
    recursively, each failed one costs a visit, a dispatch and a rollback per level.
    ``alternatives`` holds ``(alternative, required operators or None, path, look-ahead,
    swap)``: the operators of :func:`_required_ops`, ``path`` the nested ``AltPattern``
    and ``TagPattern`` nodes between the nest's top and the alternative (innermost first),
    look-ahead and swap :func:`_look_ahead`'s; ``nested`` holds all the nested nodes.  A
    tag (:func:`~patternkit.dpl.pattern.alt`) is looked through like a nested ``|``: its
    alternative is tried directly, and the tag recorded on its path when it matches.  Built once per
    pattern (patterns are not changed once built) and kept on it (:meth:`of`).
    """

    __slots__ = ("alternatives", "nested")

    def __init__(self, top: AltPattern):
        alternatives: list[tuple[DFPattern, frozenset[int] | None, tuple[DFPattern, ...],
                                 _LookAhead | None, bool]] = []
        nested: list[DFPattern] = []

        def flatten(node: DFPattern, path: tuple[DFPattern, ...]) -> None:
            if type(node) is AltPattern:
                if path or node is not top:
                    nested.append(node)
                inner = (node, *path) if node is not top else path
                flatten(node.left, inner)
                flatten(node.right, inner)
            elif type(node) is TagPattern:
                nested.append(node)
                flatten(node.pattern, (node, *path))
            else:
                alternatives.append((node, _required_ops(node), path, *_look_ahead(node)))

        flatten(top, ())
        self.alternatives = tuple(alternatives)
        self.nested = tuple(nested)

    @classmethod
    def of(cls, pattern: AltPattern) -> "_Flat":
        """The flattening of ``pattern``, built on first use."""
        flat = pattern.__dict__.get("_flat_alternatives")
        if flat is None:
            flat = pattern.__dict__["_flat_alternatives"] = cls(pattern)
        return flat


_HANDLERS: dict[type[DFPattern], Callable[[Matcher, Any, Any], _Outcome]] = {
    WildcardPattern: Matcher._on_wildcard,
    VarPattern: Matcher._on_var,
    DataflowVarPattern: Matcher._on_dataflow_var,
    GlobalVarPattern: Matcher._on_global_var,
    ExternFuncPattern: Matcher._on_extern_func,
    ExprPattern: Matcher._match_expr,
    ConstantPattern: Matcher._on_constant,
    ScalarPattern: Matcher._on_scalar,
    CallPattern: Matcher._on_call,
    TuplePattern: Matcher._on_tuple,
    TupleGetItemPattern: Matcher._on_tuple_get_item,
    AltPattern: Matcher._on_alt,
    AndPattern: Matcher._on_and,
    TagPattern: Matcher._on_tag,
    NotPattern: Matcher._on_not,
    AttrPattern: Matcher._on_constraint,
    TypePattern: Matcher._on_constraint,
    DataTypePattern: Matcher._on_constraint,
    ShapePattern: Matcher._on_constraint,
    DominatorPattern: Matcher._on_dominator,
    IfPattern: Matcher._on_if,
}


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
    if func is None:
        return Matcher().match(as_pattern(pattern), expr)
    return Matcher(function_lookup(func), uses=lambda: uses_of_function(func)).match(
        as_pattern(pattern), expr)


provide_sugar("match", match)
