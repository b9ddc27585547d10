"""Reject candidate roots over integers or handles, before the matcher reads a TVM object.

A rule's candidates are the bindings calling its root operator; most of them do not
match (``attention.collapse``: 358 candidates on GPT-2, 12 matches).  The matcher finds
that out by reading the binding, its value, the argument array and each argument's
value over the FFI.  The index already holds those facts without the objects: each
bound call's operator and arguments, and which binding each argument is.  So the top of
a pattern, :data:`DEPTH` levels of calls, is compiled once per rule and checked first,
and a candidate that fails it is dropped without a read.

One compiler, two evaluators.  :func:`_trie_of` compiles a pattern's top into a
:data:`Trie` keyed by operator handle (one dictionary look-up per level, alternatives
calling one operator merged).  It is evaluated over whichever facts the index holds:

* :func:`root_filter`, over the snapshot's integer arrays, for an index filled from a
  snapshot (``PATTERNKIT_SNAPSHOT_INDEX=1``); the snapshot's operator table is mapped to
  trie keys once per index (:func:`operator_keys`);
* :func:`table_filter`, over the field-by-field index's call tables and each block's
  Var -> value table, at about 1.3 us a root, a quarter of a failed match (GPT-2's 358
  attention roots: about 0.5 ms to drop 310).

The check is a necessary condition only: it never rejects what the matcher would
accept.  It follows the matcher's own freedoms: a commutative operator's operands in
either order, the divide/multiply re-association, an argument seen through a Var
binding, ``varg_default_wildcard``'s prefix, alternatives (``|``, merged per operator)
and conjunctions (``&``, checked on one side).

Re-association moves the operands of a nest of ``divide`` and ``multiply`` calls
between its levels (``(a * b) / c`` is matched as ``a * (b / c)``) but never changes
which operands the nest has.  So below such a node the check takes the nest as a
:class:`_Cluster`: each operand pattern of the pattern's nest must pass on some operand
of the expression's nest, at any level.  That is what drops the additions a norm's
``gamma * normalised + beta`` pattern tries on a model without that norm: their
multiply's operands call other operators (GPT-2: 24 of 112 additions reached the
matcher before, none now).  A dropped
candidate is one the matcher would have failed silently, so no refusal is lost from a
rewrite's log.  :meth:`~patternkit.engine.index.FunctionIndex.root_check` picks the
evaluator of the index's path; :func:`~patternkit.engine.proposal.find_groups` applies it.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from tvm.ir import Op

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
from ..ir.compat import TVM_ERRORS, VAR_TYPES, handle
from ..ir.snapshot import FunctionSnapshot, ValueKind

#: How many levels of call patterns the check looks at: the fourth level is where
#: attention's candidates part (GPT-2: 358 roots, 146 left at two levels, 48 at four).
#: Deeper levels would repeat the matcher's work on every match that holds.
DEPTH = 4

#: Operators between which the matcher re-associates (``a * (1 / b)`` is ``a / b``).
_REASSOCIATED = frozenset({"relax.divide", "relax.multiply"})

_OP_CALL = ValueKind.OP_CALL
_VAR = ValueKind.VAR

#: Trie keys of the operators of a re-associated nest (operators live as long as TVM).
_NEST_KEYS = frozenset(handle(Op.get(name)) for name in _REASSOCIATED)

_TRIE_ATTRIBUTE = "_patternkit_trie"

#: A pattern's compiled top: ``None`` accepts anything; otherwise operator handle ->
#: ``(argument checks or None, prefix, commutative)``, one entry per operator the
#: expression may call.  Alternatives calling one operator share its entry (their
#: argument checks are merged position by position), so a check costs one dictionary
#: look-up per level however many alternatives a rule spells.
Trie = dict[int, tuple["tuple[Any, ...] | _Cluster | None", bool, bool]] | None

#: The trie key of an operator name that is no registered operator: no trie has it.
NO_OPERATOR = -1

#: How many operands of an expression's divide/multiply nest a check gathers before it
#: gives up and accepts (a long product is no candidate worth a long walk).
NEST_LIMIT = 32


class _Cluster:
    """The argument check of a ``divide``/``multiply`` entry: the nest's operands.

    ``options`` holds, per alternative merged into the entry, the checks of its nest's
    operands (:meth:`_TrieBuilder._nest_operands`); the expression passes when, for one
    option, each check passes on some operand of the expression's nest.
    """

    __slots__ = ("options",)

    def __init__(self, options: tuple[tuple[Any, ...], ...]):
        self.options = options

    def passes(self, operands: list[tuple[Any, int]], passes: Callable[[Any, Any], bool]
               ) -> bool:
        """Does one option find each of its checks passed on an operand?

        ``operands`` holds ``(operand, operator key)`` of the nest's operands that are
        operator calls the matcher may look into (no other operand passes a check); a
        check is a trie keyed by operator, so only an operand whose operator it holds is
        tested in full (``passes(check, operand)``).
        """
        for checks in self.options:
            for check in checks:
                for operand, op_key in operands:
                    if op_key in check and passes(check, operand):
                        break
                else:
                    break
            else:
                return True
        return False


#: Operator name -> its trie key, read once per process (operators are never freed).
_OPERATOR_KEYS: dict[str, int] = {}


def _trie_of(pattern: DFPattern) -> Trie:
    """The :data:`Trie` of ``pattern`` to :data:`DEPTH` levels; built once and kept on
    the pattern, for both evaluators.
    """
    cache = pattern.__dict__
    if _TRIE_ATTRIBUTE not in cache:
        cache[_TRIE_ATTRIBUTE] = _TrieBuilder().trie(pattern, DEPTH)
    trie: Trie = cache[_TRIE_ATTRIBUTE]
    return trie


class _TrieBuilder:
    """Builds a pattern's :data:`Trie`, each (sub-pattern, depth) and each union once.

    A pattern is a DAG whose roles and ``through`` alternatives are shared many times
    over: expanded as a tree, six levels of GPT-2's attention pattern are tens of
    thousands of nodes (three seconds at eight levels).  Memoised, the trie's size is
    that of the operator paths it tells apart.
    """

    def __init__(self) -> None:
        self._tries: dict[tuple[int, int], Trie] = {}
        self._unions: dict[tuple[int, int], Trie] = {}
        self._kept: list[Any] = []  # what the memos' ids refer to, alive while building

    def trie(self, pattern: Any, depth: int) -> Trie:
        """The check of ``pattern`` down to ``depth`` levels of calls (``None``: none)."""
        if depth <= 0 or not isinstance(pattern, DFPattern):
            return None
        key = (id(pattern), depth)
        if key in self._tries:
            return self._tries[key]
        self._kept.append(pattern)
        found = self._tries[key] = self._build(pattern, depth)
        return found

    def _build(self, pattern: DFPattern, depth: int) -> Trie:
        if isinstance(pattern, CallPattern):
            names = op_names_of(pattern.op)
            if names is None:
                return None
            args: Any = None
            if not names.isdisjoint(_REASSOCIATED):  # the nest's operands, in any place
                names = names | _REASSOCIATED
                operands = self._nest_operands(pattern, depth)
                args = _Cluster((operands,)) if operands else None
            elif pattern.args is not None:
                args = tuple(self.trie(a, depth - 1) for a in pattern.args)
            entry = (args, bool(pattern.varg_default_wildcard),
                     not names.isdisjoint(COMMUTATIVE_OPS))
            return {handle(Op.get(name)): entry for name in names}
        if isinstance(pattern, (TagPattern, AttrPattern, TypePattern, DataTypePattern,
                                ShapePattern)):
            return self.trie(pattern.pattern, depth)
        if isinstance(pattern, AltPattern):
            return self.union(self.trie(pattern.left, depth), self.trie(pattern.right, depth))
        if isinstance(pattern, AndPattern):  # either side alone is a necessary condition
            left = self.trie(pattern.left, depth)
            return self.trie(pattern.right, depth) if left is None else left
        return None

    def union(self, a: Trie, b: Trie) -> Trie:
        """A check that accepts what ``a`` or ``b`` accepts (and perhaps more)."""
        if a is None or b is None:
            return None
        if a is b:
            return a
        key = (id(a), id(b))
        if key in self._unions:
            return self._unions[key]
        merged = dict(a)
        for op, entry in b.items():
            mine = merged.get(op)
            merged[op] = entry if mine is None else self._union_entry(mine, entry)
        self._kept.append(merged)
        self._unions[key] = merged
        return merged

    def _nest_operands(self, pattern: CallPattern, depth: int) -> tuple[Any, ...]:
        """The checks of the operands of the divide/multiply nest ``pattern`` tops, each
        at its own depth: a ``divide``/``multiply`` call pattern among the arguments (as
        written, which is what the matcher re-associates) is looked into, any other
        argument is an operand.  Operands that constrain nothing are left out.
        """
        found: list[Any] = []
        pending = [(pattern, depth)]
        while pending:
            node, level = pending.pop()
            for arg in node.args or ():
                if type(arg) is CallPattern:
                    names = op_names_of(arg.op)
                    if names is not None and names <= _REASSOCIATED:
                        if level > 2:  # below that, its operands would check nothing
                            pending.append((arg, level - 1))
                        continue
                check = self.trie(arg, level - 1)
                if check is not None and all(check is not seen for seen in found):
                    found.append(check)
        return tuple(found)

    def _union_entry(self, a: tuple[Any, bool, bool], b: tuple[Any, bool, bool]
                     ) -> tuple[Any, bool, bool]:
        (args_a, prefix_a, swap_a), (args_b, prefix_b, swap_b) = a, b
        swap = swap_a or swap_b
        if type(args_a) is _Cluster and type(args_b) is _Cluster:  # either nest may be there
            return (_Cluster(args_a.options + args_b.options), prefix_a or prefix_b, swap)
        if type(args_a) is _Cluster or type(args_b) is _Cluster:
            return (None, prefix_a or prefix_b, swap)  # the operator alone
        if args_a is None or args_b is None or prefix_a != prefix_b or len(args_a) != len(args_b):
            return (None, prefix_a or prefix_b, swap)  # the operator alone
        return (tuple(self.union(x, y) for x, y in zip(args_a, args_b)), prefix_a, swap)


# -- over a snapshot's integers ---------------------------------------------------------

def operator_keys(names: list[str]) -> list[int]:
    """The trie key of each operator of a snapshot's table (``snap.ops``), in order.

    A snapshot names its operators; a :data:`Trie` is keyed by their handles, as the
    field-by-field index's ``call_ops`` are.  The snapshot's readers only name registered
    operators, but a name that is not one gets :data:`NO_OPERATOR`, which no trie holds:
    the matcher, comparing operators by identity, would fail such a call too.
    """
    return [_operator_key(name) for name in names]


def _operator_key(name: str) -> int:
    key = _OPERATOR_KEYS.get(name)
    if key is None:
        try:
            key = handle(Op.get(name))
        except (*TVM_ERRORS, AttributeError):  # 0.27: "Operator ... is not registered"
            key = NO_OPERATOR
        _OPERATOR_KEYS[name] = key
    return key


def root_filter(pattern: DFPattern, snap: FunctionSnapshot, pure_ops: list[bool],
                op_keys: list[int]) -> Callable[[int], bool] | None:
    """``accepts(i)``: may binding ``i`` of ``snap`` be the root of a match of
    ``pattern``?  ``None`` when the pattern's top constrains nothing the snapshot holds.

    ``pure_ops[k]``: is operator ``k`` of ``snap.ops`` pure (only pure bindings are seen
    through by the matcher); ``op_keys``: :func:`operator_keys` of ``snap.ops``, which
    the caller keeps for every rule it checks over the same snapshot.
    """
    trie = _trie_of(pattern)
    if trie is None:
        return None
    return partial(_RootCheck(snap, pure_ops, op_keys).accepts, trie)


class _RootCheck:
    """A pattern's :data:`Trie` evaluated over one snapshot's arrays.

    Follows the matcher where it fails, as :class:`_TableCheck` does over handles: an
    argument that is no binding of the root's block (a parameter, a constant, an outer
    binding) is no call to the matcher, a Var binding is looked through by the matcher
    (so not tested here), an impure call is not looked through, and a commutative
    operator's two operands are also tried swapped.  Methods rather than nested closures:
    two closures calling each other would form a reference cycle per rule and function,
    left for the collector after every pass.
    """

    __slots__ = ("kind", "op", "op_keys", "arg_start", "args", "block", "pure_ops")

    def __init__(self, snap: FunctionSnapshot, pure_ops: list[bool], op_keys: list[int]):
        self.kind, self.op, self.op_keys = snap.kind, snap.op, op_keys
        self.arg_start, self.args, self.block = snap.arg_start, snap.args, snap.block
        self.pure_ops = pure_ops

    def accepts(self, trie: dict[int, Any], i: int) -> bool:
        """May binding ``i``'s value pass ``trie``?  The hot loop: loops, no generators."""
        if self.kind[i] is not _OP_CALL:
            return False
        entry = trie.get(self.op_keys[self.op[i]])
        if entry is None:
            return False
        checks, prefix, swap = entry
        if checks is None:
            return True
        if type(checks) is _Cluster:
            return self.nest(checks, i)
        start = self.arg_start[i]
        n, count = len(checks), self.arg_start[i + 1] - start
        if count != n and not (prefix and count > n):
            return False
        args, here, argument = self.args, self.block[i], self.argument
        for k in range(n):
            check = checks[k]
            if check is not None and not argument(check, args[start + k], here):
                break
        else:
            return True
        if not swap or n != 2:
            return False
        first, second = checks
        return ((first is None or argument(first, args[start + 1], here))
                and (second is None or argument(second, args[start], here)))

    def nest(self, cluster: _Cluster, i: int) -> bool:
        """May the divide/multiply nest topped by binding ``i`` pass ``cluster``?  Its
        operands are the arguments of its calls, looked into through the divide and
        multiply calls of its block; a Var copy among them, which the matcher would
        follow, ends the test (accepted), as does a nest of more than
        :data:`NEST_LIMIT` operands.
        """
        here, kind, op, op_keys = self.block[i], self.kind, self.op, self.op_keys
        arg_start, args, pure_ops, block = self.arg_start, self.args, self.pure_ops, self.block
        operands: list[tuple[int, int]] = []  # (binding, operator key) of the calls
        count = 0
        pending = [i]
        while pending:
            j = pending.pop()
            for code in args[arg_start[j]:arg_start[j + 1]]:
                count += 1
                if count > NEST_LIMIT:
                    return True
                if code < 0 or block[code] != here:
                    continue  # no binding the matcher looks into: passes no check
                k = kind[code]
                if k is _VAR:
                    return True
                if k is _OP_CALL and pure_ops[op[code]]:
                    op_key = op_keys[op[code]]
                    operands.append((code, op_key))
                    if op_key in _NEST_KEYS:
                        pending.append(code)
        accepts = self.accepts
        return cluster.passes(operands, accepts)

    def argument(self, trie: dict[int, Any], code: int, here: int) -> bool:
        """May the argument ``code`` of a binding in block ``here`` pass ``trie``?"""
        if code < 0 or self.block[code] != here:  # not a binding the matcher looks into
            return False
        k = self.kind[code]
        if k is _VAR:  # a Var copied: the matcher follows it; no test
            return True
        if k is _OP_CALL and not self.pure_ops[self.op[code]]:
            return False  # impure: not looked through, so never a call to the matcher
        return self.accepts(trie, code)


# -- over the field-by-field index's tables ---------------------------------------------

def table_filter(pattern: DFPattern, call_ops: dict[int, int], call_args: dict[int, list[Any]]
                 ) -> Callable[[dict[int, Any], int], bool] | None:
    """``accepts(table, key)``: may the binding of the Var ``key``, looked up in its
    block's ``table`` (handle -> pure value, the matcher's own), be the root of a match
    of ``pattern``?  ``None`` when the pattern's top constrains nothing.

    The index's ``call_ops`` (handle of a bound call -> handle of its operator) and
    ``call_args`` (-> its argument list) are what the matcher itself reads; an impure
    root (not in ``table``) is accepted untested.
    """
    trie = _trie_of(pattern)
    if trie is None:
        return None
    return _TableCheck(call_ops, call_args).root(trie)


class _TableCheck:
    """A pattern's :data:`Trie` evaluated over one index's call tables.

    Follows the matcher where it fails: a Var is looked through in the block's table (a
    Var not there, a parameter or an impure or outer binding, is no call to the
    matcher), a call's operator is compared by handle, its arguments counted and checked
    in order or, for a commutative operator, swapped.
    """

    __slots__ = ("call_ops", "call_args")

    def __init__(self, call_ops: dict[int, int], call_args: dict[int, list[Any]]):
        self.call_ops, self.call_args = call_ops, call_args

    def root(self, trie: Trie) -> Callable[[dict[int, Any], int], bool]:
        """``accepts(table, key)`` for ``trie``."""
        value_matches = self.value_matches

        def accepts(table: dict[int, Any], key: int) -> bool:
            value = table.get(key)
            return value is None or value_matches(trie, value, table)

        return accepts

    def value_matches(self, trie: Trie, value: Any, table: dict[int, Any]) -> bool:
        """May ``value`` (an expression of the block of ``table``) pass ``trie``?

        The hot loop of the check: loops instead of generators.
        """
        if trie is None:
            return True
        while type(value) in VAR_TYPES:
            value = table.get(handle(value))
            if value is None:
                return False
        key = handle(value)  # every argument of a Relax call is a TVM object
        entry = trie.get(self.call_ops.get(key, -1))
        if entry is None:
            return False
        checks, prefix, swap = entry
        if checks is None:
            return True
        if isinstance(checks, _Cluster):
            return self.nest(checks, key, table)
        args = self.call_args[key]
        n = len(checks)
        if len(args) != n and not (prefix and len(args) > n):
            return False
        value_matches = self.value_matches
        for i in range(n):
            check = checks[i]
            if check is not None and not value_matches(check, args[i], table):
                break
        else:
            return True
        if not swap or n != 2:
            return False
        first, second = checks
        return ((first is None or value_matches(first, args[1], table))
                and (second is None or value_matches(second, args[0], table)))

    def nest(self, cluster: _Cluster, key: int, table: dict[int, Any]) -> bool:
        """May the divide/multiply nest topped by the call ``key`` pass ``cluster``?  Its
        operands are the arguments of its calls, looked into (through the block's
        ``table``) where they are divide and multiply calls; a nest of more than
        :data:`NEST_LIMIT` operands is accepted untested.
        """
        call_ops, call_args = self.call_ops, self.call_args
        operands: list[tuple[Any, int]] = []  # (value, operator key) of the calls
        count = 0
        pending = [key]
        while pending:
            for arg in call_args[pending.pop()]:
                count += 1
                if count > NEST_LIMIT:
                    return True
                value = arg
                while type(value) in VAR_TYPES:
                    value = table.get(handle(value))
                if value is None:
                    continue  # not looked into by the matcher: passes no check
                inner = handle(value)
                op_key = call_ops.get(inner)
                if op_key is None:
                    continue  # no operator call: passes no check
                operands.append((value, op_key))
                if op_key in _NEST_KEYS:
                    pending.append(inner)
        value_matches = self.value_matches
        return cluster.passes(operands, lambda check, value: value_matches(check, value, table))
