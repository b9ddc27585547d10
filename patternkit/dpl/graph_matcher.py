"""The multi-root matcher: a graph of patterns (a ``PatternContext``) matched in one block.

:class:`~patternkit.dpl.context.PatternContext` describes several bindings at once; this
module finds them, as ``tvm.relax.dpl``'s ``MatchGraph`` does (TVM keeps it beside its
``PatternContext`` too), so that ``ctx.match_dfb(block)`` is a pattern-language
function and the rewrite engine only adds the rewriting
(:mod:`patternkit.engine.multi`).

Which match is found, and which Var each pattern takes, is TVM's ``MatchGraph``:

* the first root of the graph (a producer that consumes nothing, in the order the
  constraints were written) is tried at each Var the block reads, in the order the
  block first reads them (parameters included);
* from a matched Var, each consumer pattern takes the *first* reader of that Var, in
  binding order, that satisfies the edge's constraints and whose own consumers match in
  turn: symmetric patterns (three matmuls of one input) take the readers in binding
  order;
* the other roots are then matched, backtracking over candidates when a later root
  fails; each Var is matched by at most one pattern;
* after each rewrite the replaced bindings leave the block (:meth:`BlockGraph.remove`):
  they are no longer readers, nor looked through; matched Vars that were not replaced
  (the shared input) remain available to the next match.

The block is indexed once (:class:`BlockGraph`): its readers, operands and look-up
table; each candidate for the first root is tried once and retried only after a rewrite
at it (:func:`each_match`), and a later root is only tried at the operands of the
binding its consumer matched.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, Sequence

import tvm
from tvm import relax

from ..errors import PatternError
from ..ir import compat as C
from ..ir.walk import vars_read
from .dominator import Uses, uses_of_function
from .matcher import Matcher
from .pattern import DFPattern, root_op_names

__all__ = ["BlockGraph", "GraphMatch", "GraphMatcher", "PatternGraph", "each_match",
           "match_dfb", "matchings"]


class PatternGraph(Protocol):
    """What the matcher reads of a :class:`~patternkit.dpl.context.PatternContext`."""

    @property
    def patterns(self) -> Any:
        """Every node of the graph."""

    def validate(self) -> None:
        """Raise :class:`~patternkit.errors.PatternError` if the graph cannot be matched."""

    def roots(self) -> list[DFPattern]:
        """The nodes that consume nothing, where the search starts."""

    def consumers(self, pattern: DFPattern) -> list[Any]:
        """``(consumer, constraints)`` of each edge leaving ``pattern``."""


# -- the block, indexed for graph matching ----------------------------------------------------
class BlockGraph:
    """One block's readers, operands and look-up table, updated as rewrites remove bindings.

    ``order``: handles of the Vars the block reads, in first-read order (TVM's candidate
    order); ``readers``: handle -> the bindings reading it (handles, binding order, each
    once); ``operands``: binding handle -> the Vars its value reads (with repeats, TVM's
    ``caller2callees``); ``table``: what the matcher may look through.  Reads by
    ``match_cast`` bindings do not count, as in TVM.

    Parameters
    ----------
    bindings : sequence of relax.Binding
        The block's bindings.
    table : dict
        Var handle -> value of the bindings the matcher may look through (pure values);
        it is updated in place as bindings leave the block.
    uses : Uses
        How often each Var is read, and which are seen outside the block.
    call_args, call_ops : dict, optional
        The argument lists and operator handles of the block's operator calls, by the
        call's handle, when the caller has them (the rewrite engine's index does).
    calls_of : callable, optional
        ``calls_of(op_name)``: the handles of the bindings calling ``op_name``; by
        default found by a walk of the block on first use.
    keys : sequence of int, optional
        The handles of the bindings' Vars, in order, when the caller has them (reading
        them again costs a call into TVM per binding).
    """

    def __init__(self, bindings: Sequence[Any], table: dict[int, Any], uses: Uses,
                 call_args: dict[int, list[Any]] | None = None,
                 call_ops: dict[int, int] | None = None,
                 calls_of: Callable[[str], Iterable[int]] | None = None,
                 keys: Sequence[int] | None = None):
        self.table = table
        self.uses = uses
        self.call_args = {} if call_args is None else call_args
        self.call_ops = {} if call_ops is None else call_ops
        self._calls_of = calls_of
        self.var: dict[int, Any] = {}
        self.order: list[int] = []
        self.readers: dict[int, dict[int, None]] = {}
        self.operands: dict[int, list[int]] = {}
        self.bound: dict[int, Any] = {}  # handle -> its binding
        self.removed: set[int] = set()
        for i, binding in enumerate(bindings):
            var = binding.var
            key = C.handle(var) if keys is None else keys[i]
            self.var[key] = var
            self.bound[key] = binding
            if type(binding) is not relax.VarBinding:
                continue
            value = binding.value
            args = self.call_args.get(C.handle(value)) if type(value) is relax.Call else None
            read_vars = ([a for a in args if type(a) in C.VAR_TYPES]
                         if args is not None and type(value.op) is tvm.ir.Op
                         else vars_read(value))
            reads = [C.handle(v) for v in read_vars]
            self.operands[key] = reads
            for read_var, read in zip(read_vars, reads):
                readers = self.readers.get(read)
                if readers is None:
                    readers = self.readers[read] = {}
                    self.order.append(read)
                    self.var.setdefault(read, read_var)
                readers[key] = None

    @classmethod
    def of_block(cls, block: Any) -> "BlockGraph":
        """The graph of a block on its own (``PatternContext.match_dfb``)."""
        if not isinstance(block, relax.BindingBlock):
            raise PatternError(f"match_dfb expects a (dataflow) binding block, found "
                               f"{type(block).__name__}")
        body = relax.SeqExpr([block], relax.Tuple([]))
        func = relax.Function([], body, ret_ty=relax.TupleType([]), is_pure=False)
        bindings = C.array_items(block.bindings)
        table = {C.handle(b.var): b.value for b in bindings
                 if type(b) is relax.VarBinding and C.is_pure_value(b.value)}
        return cls(bindings, table, uses_of_function(func))

    def calls_of(self, op: str) -> Iterable[int]:
        """The handles of the bindings whose value calls the operator ``op``."""
        if self._calls_of is None:
            by_op: dict[str, list[int]] = {}
            for key, binding in self.bound.items():
                value = binding.value
                if type(binding) is relax.VarBinding and type(value) is relax.Call \
                        and type(value.op) is tvm.ir.Op:
                    by_op.setdefault(C.op_info(value.op)[0], []).append(key)
            self._calls_of = lambda name: by_op.get(name, ())
        return self._calls_of(op)

    def readers_of(self, key: int) -> dict[int, None]:
        """The bindings reading the Var with handle ``key``, in binding order (a key set)."""
        return self.readers.get(key, {})

    def remove(self, keys: Sequence[int]) -> None:
        """The bindings ``keys`` were rewritten: they leave the block (TVM's ``remaining``)."""
        for key in keys:
            self.removed.add(key)
            self.table.pop(key, None)
            for read in self.operands.pop(key, ()):
                self.readers.get(read, {}).pop(key, None)

    def binding(self, key: int) -> Any:
        """The binding whose Var has handle ``key``."""
        return self.bound[key]


# -- matching a graph of patterns ---------------------------------------------------------------
class GraphMatch:
    """One match of a graph: pattern -> Var handle (a tuple for ``used_by_all``), and back."""

    __slots__ = ("p2r", "r2p")

    def __init__(self, p2r: dict[DFPattern, Any] | None = None,
                 r2p: dict[int, DFPattern] | None = None):
        self.p2r: dict[DFPattern, Any] = {} if p2r is None else p2r
        self.r2p: dict[int, DFPattern] = {} if r2p is None else r2p

    def copy(self) -> "GraphMatch":
        """An independent copy, for a branch of the search to extend."""
        return GraphMatch(dict(self.p2r), dict(self.r2p))

    def add(self, pattern: DFPattern, key: Any) -> None:
        """Map ``pattern`` to ``key`` (a handle, or a tuple of them) and each handle back."""
        self.p2r[pattern] = key
        for k in (key if isinstance(key, tuple) else (key,)):
            self.r2p[k] = pattern

    def merge(self, other: "GraphMatch") -> None:
        """Add ``other``'s pairs whose pattern this match does not map yet."""
        for pattern, key in other.p2r.items():
            if pattern not in self.p2r:
                self.add(pattern, key)


class GraphMatcher:
    """TVM's ``MatchGraph`` (``TryMatch`` / ``MatchTree``) on one :class:`BlockGraph`."""

    def __init__(self, context: PatternGraph, graph: BlockGraph):
        context.validate()
        self.graph = graph
        self.roots = context.roots()
        self.consumers = {p: context.consumers(p) for p in context.patterns}
        self.matcher = Matcher(call_args=graph.call_args, table=graph.table, uses=graph.uses,
                               call_ops=graph.call_ops)
        self.first_read = {key: i for i, key in enumerate(graph.order)}

    def match_at(self, key: int) -> GraphMatch | None:
        """The match whose first root takes the Var ``key``, or ``None``."""
        if not self.roots:
            return None
        state = self._try(self.roots[0], key, GraphMatch())
        if state is None:
            return None
        return self._tree(state, 1)

    def first_candidates(self) -> list[int]:
        """The Vars the first root may take, in first-read order.

        Every consumer of a matched pattern must match one of its Var's readers (at least
        one), so when a consumer of the first root calls known operators only the
        operands of bindings calling them can be the first root: a wildcard root with a
        ``matmul`` consumer is tried at the matmuls' operands, not at every Var.
        """
        if not self.roots:
            return []
        graph = self.graph
        for consumer, _ in self.consumers[self.roots[0]]:
            ops = root_op_names(consumer)
            if ops is None or any(op.startswith("<") for op in ops):
                continue
            found: set[int] = set()
            for op in ops:
                for key in graph.calls_of(op):
                    found.update(graph.operands.get(key, ()))
            return sorted(found, key=self.first_read.__getitem__)
        return list(graph.order)

    def _matches(self, pattern: DFPattern, key: int) -> bool:
        return self.matcher.match(pattern, self.graph.var[key]) is not None

    def _try(self, pattern: DFPattern, key: int, current: GraphMatch) -> GraphMatch | None:
        if key not in self.graph.var or not self._matches(pattern, key):
            return None
        found = GraphMatch()
        found.add(pattern, key)
        graph = self.graph
        readers = graph.readers_of(key)
        for consumer, uses in self.consumers[pattern]:
            if uses[0].every:
                if len(readers) < uses[0].at_least:
                    return None
                taken = tuple(r for r in readers if r not in found.r2p and r not in current.r2p
                              and _operand_ok(graph, r, key, uses[0].index)
                              and self._matches(consumer, r))
                if len(taken) < uses[0].at_least:
                    return None
                found.add(consumer, taken)
                continue
            satisfiable = False
            for reader in readers:
                if reader in found.r2p:
                    continue
                already = current.p2r.get(consumer)
                if already is not None and already != reader:
                    continue
                if not all((not use.only or len(readers) == 1)
                           and _operand_ok(graph, reader, key, use.index) for use in uses):
                    continue
                if consumer in found.p2r:
                    continue
                satisfiable = True
                below = self._try(consumer, reader, current)
                if below is not None:
                    found.add(consumer, reader)
                    found.merge(below)
            if consumer not in found.p2r or not satisfiable:
                return None
        return found

    def _tree(self, current: GraphMatch, root_index: int) -> GraphMatch | None:
        root = next((r for r in self.roots[root_index:] if r not in current.p2r), None)
        if root is None:
            return current
        for key in self._candidates(root, current):
            if key in current.r2p:
                continue
            found = self._try(root, key, current)
            if found is None:
                continue
            state = current.copy()
            state.merge(found)
            done = self._tree(state, root_index + 1)
            if done is not None:
                return done
        return None

    def _candidates(self, root: DFPattern, current: GraphMatch) -> list[int]:
        """Where ``root`` can match: the operands of a consumer matched already (in TVM's
        first-read order), else every Var the block reads.
        """
        for consumer, _ in self.consumers[root]:
            key = current.p2r.get(consumer)
            if key is not None and not isinstance(key, tuple):
                operands = set(self.graph.operands.get(key, ()))
                return sorted(operands, key=self.first_read.__getitem__)
        return list(self.graph.order)


def _operand_ok(graph: BlockGraph, reader: int, key: int, index: int) -> bool:
    if index == -1:
        return True
    operands = graph.operands.get(reader, ())
    return index < len(operands) and operands[index] == key


def each_match(context: PatternGraph, graph: BlockGraph,
               on_match: Callable[[GraphMatch], Sequence[int] | None]) -> None:
    """Call ``on_match`` for every match in the block; it returns the handles it rewrote.

    Each Var the block reads is a candidate for the first root once, and again after a
    rewrite at it (its readers changed): a candidate that failed is not tried again
    after later rewrites, and a match ``on_match`` leaves alone does not stop the walk.
    """
    matcher = GraphMatcher(context, graph)
    for key in matcher.first_candidates():
        while True:
            state = matcher.match_at(key)
            if state is None:
                break
            rewritten = on_match(state)
            if not rewritten:
                break
            graph.remove(rewritten)


def matchings(state: GraphMatch, graph: BlockGraph) -> dict[DFPattern, Any]:
    """What a match took, as TVM gives it: pattern -> Var (a tuple of Vars for several)."""
    return {p: (tuple(graph.var[k] for k in key) if isinstance(key, tuple) else graph.var[key])
            for p, key in state.p2r.items()}


def match_dfb(context: PatternGraph, block: Any) -> dict[DFPattern, Any] | None:
    """``PatternContext.match_dfb``: the first match in ``block``, node -> Var (or ``None``)."""
    graph = BlockGraph.of_block(block)
    matcher = GraphMatcher(context, graph)
    for key in graph.order:
        state = matcher.match_at(key)
        if state is not None:
            return matchings(state, graph)
    return None
