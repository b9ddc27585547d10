"""Multi-output patterns: ``tvm.relax.dpl``'s ``PatternContext``, with patternkit's patterns.

A single-root pattern describes one binding and what it reads.  A *graph* of patterns
describes several bindings at once: three matmuls reading one input (a q/k/v
projection), a value and two of its consumers.  As in ``tvm.relax.dpl``::

    with pk.PatternContext() as ctx:
        x = pk.wildcard()
        q = pk.is_op("matmul")(x, pk.wildcard())   # inside a context, a call pattern
        k = pk.is_op("matmul")(x, pk.wildcard())   # records that it uses its arguments
    pk.engine.rewrite_bindings(ctx, rewriter, mod)        # rewriter(matchings, bindings)

Every pattern that takes part in a constraint is a *node* of the graph, and a match maps
each node to one Var of the block (a bound Var or a parameter), distinct nodes to
distinct Vars.  The constraints are edges:

* ``p.used_by(q, index)`` (``p ^ q``): ``p``'s Var is read by ``q``'s binding, as its
  ``index``-th Var operand (``-1``: anywhere);
* ``p.only_used_by(q, index)`` (``p >> q``): the same, and no other binding of the block
  reads ``p``'s Var;
* a call pattern built inside a context adds ``arg.used_by(call, i)`` for each argument
  (``add_constraint=False`` opts out), exactly as ``tvm.relax.dpl`` does.  So every
  argument pattern is a node that needs a Var of its own: ``mm ^ relu(wildcard())``
  never matches (the wildcard and ``mm`` would claim the same Var); write the consumer
  as ``is_op("nn.relu")(mm)``, or without arguments (``varg_default_wildcard=True``).

A node is matched to a Var, never to a constant: a weight that is a constant is a
sub-pattern of its call, built with ``add_constraint=False`` and joined by an explicit
``x.used_by(mm, 0)``, exactly as with ``tvm.relax.dpl``.

One extension for rules that take *all* consumers of a value, whatever their number:
``p.used_by_all(q, index, at_least)`` maps ``q`` to every reader of ``p``'s Var that
matches ``q`` (a tuple of Vars in binding order, at least ``at_least`` of them).  Such
a ``q`` may not be a node of any other constraint.

The graph matcher is :mod:`patternkit.dpl.graph_matcher` (``ctx.match_dfb(block)``), as
TVM keeps it beside its ``PatternContext``; the rewriting is the engine's
(:func:`patternkit.rewrite_bindings`, :mod:`patternkit.engine.multi`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterator, Sequence, cast

from tvm import relax

from ..errors import PatternError
from .graph_matcher import match_dfb
from .pattern import CONTEXT_STACK, DFPattern, as_pattern, pattern_to_text, provide_sugar

__all__ = ["PatternContext", "PatternSeq", "Use", "duplicate", "only_used_by", "used_by",
           "used_by_all"]


@dataclass(frozen=True)
class Use:
    """One constraint on an edge producer -> consumer (TVM's ``PairCons``).

    ``only``: the producer's Var has no other reader in the block; ``index``: it is the
    consumer's ``index``-th Var operand (``-1``: any); ``every``: the consumer stands
    for every reader that matches it (:func:`used_by_all`), at least ``at_least``.
    """

    only: bool = False
    index: int = -1
    every: bool = False
    at_least: int = 1


class PatternContext:
    """A graph of patterns joined by use constraints; a drop-in for ``tvm.relax.dpl``'s.

    Parameters
    ----------
    incremental : bool
        Start from the constraints of the context that is current when this one is
        entered (``tvm.relax.dpl``'s incremental solving).

    Use it as a context manager: call patterns built inside it, and the
    ``used_by``/``only_used_by`` constraints written inside it, are recorded in it.
    """

    def __init__(self, incremental: bool = False):
        self.incremental = incremental
        self._consumers: dict[DFPattern, list[tuple[DFPattern, list[Use]]]] = {}
        self._producers: dict[DFPattern, list[DFPattern]] = {}
        self._nodes: dict[DFPattern, None] = {}  # every node, in first-seen order

    # -- the context stack -------------------------------------------------------------------
    def __enter__(self) -> "PatternContext":
        outer = PatternContext.current()
        if self.incremental and outer is not None:
            self._copy_from(outer)
        CONTEXT_STACK.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not CONTEXT_STACK or CONTEXT_STACK[-1] is not self:
            raise PatternError("PatternContext exited out of order (contexts nest like "
                               "with-blocks)")
        CONTEXT_STACK.pop()

    @staticmethod
    def current() -> "PatternContext | None":
        """The innermost context entered, or ``None``."""
        # Only PatternContext.__enter__ pushes onto the stack (typed by what pattern.py reads).
        return cast(PatternContext, CONTEXT_STACK[-1]) if CONTEXT_STACK else None

    def _copy_from(self, other: "PatternContext") -> None:
        for producer, edges in other._consumers.items():
            for consumer, uses in edges:
                for use in uses:
                    self._add(producer, consumer, use)

    # -- constraints -------------------------------------------------------------------------
    def add_constraint(self, producer: Any, consumer: Any, index: int = -1,
                       only: bool = False) -> None:
        """Record ``producer.used_by(consumer, index)`` (``only``: ``only_used_by``)."""
        self._add(as_pattern(producer), as_pattern(consumer), Use(only=only, index=index))

    def add_every(self, producer: Any, consumer: Any, index: int = -1,
                  at_least: int = 1) -> None:
        """Record ``producer.used_by_all(consumer, index, at_least)``."""
        if at_least < 1:
            raise PatternError(f"used_by_all needs at_least >= 1, found {at_least}")
        self._add(as_pattern(producer), as_pattern(consumer),
                  Use(index=index, every=True, at_least=at_least))

    def _add(self, producer: DFPattern, consumer: DFPattern, use: Use) -> None:
        if producer is consumer:
            raise PatternError(f"{pattern_to_text(producer)} cannot be used by itself")
        edges = self._consumers.setdefault(producer, [])
        for other, uses in edges:
            if other is consumer:
                if use in uses:
                    return  # tvm.relax.dpl refuses a repeated constraint; it adds nothing
                uses.append(use)
                break
        else:
            edges.append((consumer, [use]))
            self._producers.setdefault(consumer, []).append(producer)
        self._nodes.setdefault(producer)
        self._nodes.setdefault(consumer)

    def validate(self) -> None:
        """Raise :class:`PatternError` if the graph cannot be matched as written.

        A ``used_by_all`` consumer stands for several Vars, so it may not be a node of
        any other constraint; an empty context has nothing to match.
        """
        if not self._nodes:
            raise PatternError("the PatternContext holds no constraint: build the patterns "
                               "inside `with pk.PatternContext() as ctx:`")
        for producer, edges in self._consumers.items():
            for consumer, uses in edges:
                if any(u.every for u in uses) and (len(uses) > 1
                                                   or len(self._producers[consumer]) > 1
                                                   or consumer in self._consumers):
                    raise PatternError(
                        f"{pattern_to_text(consumer)} stands for every reader of "
                        f"{pattern_to_text(producer)} (used_by_all), so it cannot take part "
                        f"in other constraints; build it with add_constraint=False")

    # -- the graph ---------------------------------------------------------------------------
    @property
    def patterns(self) -> list[DFPattern]:
        """Every node of the graph, in the order it first appeared in a constraint."""
        return list(self._nodes)

    def consumers(self, producer: DFPattern) -> list[tuple[DFPattern, tuple[Use, ...]]]:
        """``(consumer, constraints)`` of each edge leaving ``producer``, in order."""
        return [(c, tuple(u)) for c, u in self._consumers.get(producer, ())]

    def producers(self, consumer: DFPattern) -> list[DFPattern]:
        """The nodes with an edge into ``consumer``, in the order they were joined."""
        return list(self._producers.get(consumer, ()))

    def roots(self) -> list[DFPattern]:
        """Producers that consume nothing, in the order they first produced (TVM's order)."""
        return [p for p in self._consumers if p not in self._producers]

    def __iter__(self) -> Iterator[DFPattern]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        edges = ", ".join(f"{pattern_to_text(p)} -> {pattern_to_text(c)}"
                          for p, cs in self._consumers.items() for c, _ in cs)
        return f"PatternContext({edges})"

    # -- using it ----------------------------------------------------------------------------
    def match_dfb(self, block: Any) -> dict[DFPattern, Any] | None:
        """The first match of the graph in a binding block: node -> Var, or ``None``."""
        return match_dfb(self, block)

    def to_dpl(self) -> tuple[Any, dict[Any, DFPattern]]:
        """The same graph as a ``tvm.relax.dpl.PatternContext``, and the node mapping.

        Returns ``(context, nodes)`` where ``nodes`` maps each ``tvm.relax.dpl`` pattern
        of the graph to the patternkit pattern it stands for: TVM's
        ``rewrite_bindings(context, rewriter, func)`` can then run a rewriter written
        for this context (see :func:`patternkit.engine.multi.dpl_rewriter`).
        """
        if any(u.every for edges in self._consumers.values() for _, uses in edges
               for u in uses):
            raise PatternError("used_by_all has no tvm.relax.dpl equivalent")
        memo: dict[int, Any] = {}
        converted = {p: p.to_dpl(memo) for p in self._nodes}
        tvm_ctx = relax.dpl.PatternContext()
        with tvm_ctx:
            for producer, edges in self._consumers.items():
                for consumer, uses in edges:
                    for use in uses:
                        method = (converted[producer].only_used_by if use.only
                                  else converted[producer].used_by)
                        method(converted[consumer], use.index)
        return tvm_ctx, {converted[p]: p for p in self._nodes}


class PatternSeq:
    """A chain of patterns joined by use constraints (``a >> b >> c``), for chaining.

    ``seq[i]`` is its ``i``-th pattern; ``seq.used_by(other)`` / ``^`` and
    ``seq.only_used_by(other)`` / ``>>`` join its last pattern to ``other``'s first.
    """

    def __init__(self, patterns: Sequence[DFPattern], links: Sequence[Use] = ()):
        self.patterns = list(patterns)
        self.links = list(links)  # links[i] joins patterns[i] -> patterns[i + 1]

    def __getitem__(self, index: int) -> DFPattern:
        return self.patterns[index]

    def __len__(self) -> int:
        return len(self.patterns)

    def used_by(self, other: Any, index: int = -1) -> "PatternSeq":
        """The chain joined to ``other`` (``^``): the last pattern is read by its first."""
        return _chain(self, other, Use(index=index))

    def only_used_by(self, other: Any, index: int = -1) -> "PatternSeq":
        """The chain joined to ``other`` (``>>``): as :meth:`used_by`, and read by nothing else."""
        return _chain(self, other, Use(only=True, index=index))

    def __xor__(self, other: Any) -> "PatternSeq":
        return self.used_by(other)

    def __rshift__(self, other: Any) -> "PatternSeq":
        return self.only_used_by(other)

    def fork_to(self, *others: Any) -> None:
        """Join the chain's last pattern to each of ``others`` (``used_by``), a fan-out."""
        for other in others:
            self.used_by(other)

    def dup(self) -> "PatternSeq":
        """A copy of the chain: new patterns, joined again in the current context."""
        patterns = [duplicate(p) for p in self.patterns]
        context = _current("dup")
        for (a, b), link in zip(zip(patterns, patterns[1:]), self.links):
            context._add(a, b, link)
        return PatternSeq(patterns, self.links)

    def __repr__(self) -> str:
        return "PatternSeq(" + ", ".join(pattern_to_text(p) for p in self.patterns) + ")"


def _as_seq(obj: Any) -> PatternSeq:
    return obj if isinstance(obj, PatternSeq) else PatternSeq([as_pattern(obj)])


def _current(what: str) -> PatternContext:
    context = PatternContext.current()
    if context is None:
        raise PatternError(f"{what} records a constraint in a PatternContext; call it inside "
                           f"`with pk.PatternContext() as ctx:`")
    return context


def _chain(lhs: Any, rhs: Any, use: Use) -> PatternSeq:
    left, right = _as_seq(lhs), _as_seq(rhs)
    _current("used_by" if not use.only else "only_used_by")._add(left[-1], right[0], use)
    return PatternSeq(left.patterns + right.patterns, left.links + [use] + right.links)


def used_by(producer: Any, consumer: Any, index: int = -1) -> PatternSeq:
    """``producer.used_by(consumer, index)``: see the module docstring."""
    return _chain(producer, consumer, Use(index=index))


def only_used_by(producer: Any, consumer: Any, index: int = -1) -> PatternSeq:
    """``producer.only_used_by(consumer, index)``: see the module docstring."""
    return _chain(producer, consumer, Use(only=True, index=index))


def used_by_all(producer: Any, consumer: Any, index: int = -1, at_least: int = 1) -> None:
    """Every reader of ``producer``'s Var that matches ``consumer`` (at least ``at_least``)."""
    _current("used_by_all").add_every(producer, consumer, index, at_least)


def duplicate(pattern: DFPattern) -> DFPattern:
    """A deep copy of ``pattern``'s nodes (sharing kept), recording no constraint.

    ``tvm.relax.dpl``'s ``dup``: the copy is a different graph node, as are the copies of
    its sub-patterns, so ``cbr0.dup()`` describes another conv-bias-relu.
    """
    memo: dict[int, DFPattern] = {}

    def copy_node(node: Any) -> Any:
        if not isinstance(node, DFPattern):
            if isinstance(node, list):
                return [copy_node(n) for n in node]
            return node
        if id(node) in memo:
            return memo[id(node)]
        new = copy.copy(node)
        memo[id(node)] = new
        for name, value in vars(node).items():
            setattr(new, name, copy_node(value))
        return new

    copied: DFPattern = copy_node(pattern)
    return copied


provide_sugar("used_by", used_by)
provide_sugar("only_used_by", only_used_by)
provide_sugar("used_by_all", used_by_all)
provide_sugar("dup", duplicate)
