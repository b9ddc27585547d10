"""Multi-output rewriting: a graph of patterns matched and rewritten in linear time.

:func:`rewrite_bindings` is ``tvm.relax.dpl.rewrite_bindings`` for patternkit patterns:
a :class:`~patternkit.dpl.context.PatternContext` describes several bindings at once,
``rewriter(matchings, bindings)`` receives, as TVM gives them, the Var each node of the
graph matched and the block's bindings (Var -> value), and returns ``{Var: replacement}``
for the matched bindings it rewrites.  A rule whose ``context`` is a ``PatternContext``
(a multi-root rule; :class:`BindingsRewriteRule` is its old name) is the same thing on
the rule protocol: named roles read from a :class:`BindingsMatch`, a check that can
refuse with a reason, ``rewrite(match)``; :func:`patternkit.rewrite` applies it like any
other rule, through :func:`rewrite_function_bindings`.

Which match is found, and which Var each pattern takes, is TVM's ``MatchGraph``; the
graph matcher is the pattern language's (:mod:`patternkit.dpl.graph_matcher`), this
module rewrites what it finds.

What differs from TVM is the cost.  TVM rebuilds its use-def analysis (quadratic) and
rescans the block from its first Var after every match; here the block's readers are
indexed once (from the engine's :class:`~patternkit.engine.index.FunctionIndex`), each
candidate for the first root is tried once and retried only after a rewrite at it, and
a later root is only tried at the operands of the binding its consumer matched.  A block
costs one pass over its bindings plus, per candidate, one match of the graph's
patterns; :mod:`benchmarks.bench_multi` measures it.  Two consequences, both where TVM's
rescan would find a different match: a candidate that failed is not tried again after
later rewrites (an ``only_used_by`` that a rewrite made true is not noticed), and a
rewriter that returns no replacement leaves that match and matching goes on (TVM stops
looking in that block, since it would find the same match again).  A graph with several
disconnected components scans the block for each further component.

Results: TVM's ``rewrite_bindings`` also folds the block's var-to-var copies into the
binding they copy (``gv = lv9`` disappears); patternkit leaves the copies as they are,
so the two results are structurally equal after ``relax.transform.CanonicalizeBindings``
(equal as they are when the block has no copies).

The replacements are emitted by :func:`~patternkit.engine.emit.emit_function`: each
replaced binding keeps its place, the nested calls of its replacement become bindings
just before it (a call shared by several replacements is emitted once), and bindings a
replacement reads that come later in the block are moved up before it, as TVM does;
bindings left without readers are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import tvm
from tvm import relax

from ..dpl.context import PatternContext
from ..dpl.dominator import Uses
from ..dpl.graph_matcher import BlockGraph, GraphMatch, each_match, matchings
from ..dpl.matcher import Matcher
from ..dpl.pattern import DFPattern, root_op_names
from ..errors import CallbackError, PatternError
from ..ir import compat as C
from ..ir.rebuild import rebuild_function
from ..ir.targets import apply_to_target, rewritable_functions
from .emit import emit_function
from .index import FunctionIndex, describe_binding
from .rule import Reject, RewriteRule, RoleMatch, check_of, judge

__all__ = ["BindingsMatch", "BindingsPass", "BindingsRewriteRule", "BlockBindings",
           "dpl_rewriter", "rewrite_bindings", "rewrite_function_bindings"]

Rewriter = Callable[[dict[DFPattern, Any], Mapping[Any, Any]], Any]


class BlockBindings(Mapping[Any, Any]):
    """The block's bindings as the rewriter's ``bindings`` argument: Var -> bound value.

    Like TVM's, it holds the bindings not yet rewritten in this pass.  It is one view
    of the block for every match, built once, not a copy per call.
    """

    def __init__(self, graph: BlockGraph):
        self._graph = graph
        self._values = {key: b.value for key, b in graph.bound.items()}

    def __getitem__(self, var: Any) -> Any:
        key = C.handle(var) if isinstance(var, tvm.ir.Expr) else None
        if key is None or key in self._graph.removed or key not in self._values:
            raise KeyError(var)
        return self._values[key]

    def __iter__(self) -> Iterator[Any]:
        graph = self._graph
        return (graph.var[k] for k in self._values if k not in graph.removed)

    def __len__(self) -> int:
        return sum(1 for k in self._values if k not in self._graph.removed)


# -- rewriting ------------------------------------------------------------------------------------
class _FunctionRewrite:
    """The replacements of one function, checked as they come, then emitted once."""

    def __init__(self, rule_name: str, func_name: str, func: relax.Function,
                 index: FunctionIndex | None = None):
        self.rule_name = rule_name
        self.func_name = func_name
        self.func = func
        self.index = FunctionIndex.of(func) if index is None else index
        self.uses = Uses(self.index.readers, self.index.escaping)
        self.replacements: dict[int, Any] = {}

    def graphs(self, context: PatternContext) -> Iterator[BlockGraph]:
        """The graph of each block ``context`` may match in (see :func:`_may_match`)."""
        for bi in range(len(self.index.blocks)):
            if self.index.blocks[bi] and _may_match(context, self.index, bi):
                yield self._graph(bi)

    def _graph(self, bi: int) -> BlockGraph:
        index = self.index
        keys = index.keys[bi]

        def calls_of(op: str) -> list[int]:
            return [keys[j][0] for b, j in index.by_key.get(op, ()) if b == bi]

        return BlockGraph(index.blocks[bi], dict(index.values[bi]), self.uses,
                          index.call_args, index.call_ops, calls_of, [k for k, _ in keys])

    def accept(self, graph: BlockGraph, owned: set[int], result: Any) -> list[int]:
        """Check a rewriter's result and keep it; returns the handles it replaces."""
        if result is None:
            return []
        if not hasattr(result, "items"):  # a dict, or the tvm_ffi Map a TVM rewriter returns
            raise CallbackError(
                f"rule {self.rule_name}: the rewriter returned {type(result).__name__} "
                f"({result!r:.80}) where a dict {{Var: replacement}} was expected",
                self.rule_name, self.where(graph, owned))
        taken = []
        for var, value in result.items():
            key = C.handle(var) if isinstance(var, relax.Var) else None
            if key is None or key not in owned:
                raise CallbackError(
                    f"rule {self.rule_name}: the rewriter returned a replacement for "
                    f"{self._describe(graph, var, key)}, which the match does not own; a "
                    f"match may replace the bindings its patterns matched "
                    f"({', '.join(sorted(C.var_name(graph.var[k]) for k in owned))})",
                    self.rule_name, self._where(graph, var, key))
            if not isinstance(value, tvm.ir.Expr) or isinstance(value, (tvm.ir.Op,
                                                                       relax.Function)):
                raise CallbackError(
                    f"rule {self.rule_name}: the replacement for "
                    f"'{describe_binding(self.func_name, graph.binding(key))}' is "
                    f"{type(value).__name__} ({value!r:.80}), not a Relax expression",
                    self.rule_name, describe_binding(self.func_name, graph.binding(key)))
            if C.handle(value) == C.handle(graph.binding(key).value):
                continue
            self.replacements[key] = value
            taken.append(key)
        if taken:
            graph.remove(taken)
            self._drop_left_dead(graph, owned, taken)
        return taken

    def _drop_left_dead(self, graph: BlockGraph, owned: set[int], taken: list[int]) -> None:
        """Matched bindings the rewrite left without readers leave the block too.

        A rule that replaces a matmul's bias add leaves the matmul unread; were it kept,
        the next match at the same input would take it again.  A binding the
        replacements read, or that is seen outside the block, stays.
        """
        read_now = {C.handle(v) for key in taken
                    for v in C.array_items(relax.analysis.free_vars(self.replacements[key]))}
        dead = [key for key in owned
                if key not in graph.removed and key in graph.readers
                and not graph.readers[key] and key not in read_now
                and key not in self.index.escaping]
        if dead:
            graph.remove(dead)

    def _describe(self, graph: BlockGraph, var: Any, key: int | None) -> str:
        if key is not None and key in self.index.position:
            binding = self.index.binding_at(self.index.position[key])
            return f"'{describe_binding(self.func_name, binding)}'"
        if isinstance(var, relax.Var):
            return f"'{C.var_name(var)}' (not bound in this block)"
        return f"{type(var).__name__} {var!r:.60} (not a Var)"

    def _where(self, graph: BlockGraph, var: Any, key: int | None) -> str:
        if key is not None and key in self.index.position:
            return describe_binding(self.func_name, self.index.binding_at(self.index.position[key]))
        return f"{self.func_name}: {var!r:.60}"

    def where(self, graph: BlockGraph, owned: set[int]) -> str:
        """The first binding of a match, for messages."""
        key = min(owned, key=lambda k: self.index.position[k]) if owned else None
        return (describe_binding(self.func_name, graph.binding(key)) if key is not None
                else self.func_name)

    def emit(self) -> relax.Function:
        func, index = self.func, self.index
        reordered = _hoisted_blocks(index, self.replacements, self.rule_name, self.func_name)
        if reordered is not None:
            func = rebuild_function(func, reordered)
            index = FunctionIndex.build(func)
        return emit_function(func, index, self.replacements, self.rule_name, self.func_name)


def _may_match(context: PatternContext, index: FunctionIndex, block_index: int) -> bool:
    """Can ``context`` match in the block at all, judging by its index alone?

    A necessary condition, read off the function index without building the block's
    graph (which reads every binding again): every consumer of the first root that calls
    known operators needs a reader calling one of them, and a ``used_by_all(...,
    at_least=k)`` consumer needs ``k`` such readers of one Var.  A model without two
    matmuls reading one Var then costs ``matmul.combine_parallel`` a look at its matmuls,
    not a graph of every block.
    """
    roots = context.roots()
    if not roots:
        return False  # no first root: nothing to match (as GraphMatcher.match_at)
    keys, reads = index.keys[block_index], index.reads
    for consumer, uses in context.consumers(roots[0]):
        ops = root_op_names(consumer)
        if ops is None or any(op.startswith("<") for op in ops):
            continue
        need = max((use.at_least for use in uses if use.every), default=1)
        readers: dict[int, int] = {}  # Var handle -> bindings calling ``ops`` that read it
        for op in ops:
            for bi, j in index.by_key.get(op, ()):
                if bi == block_index:
                    for read in set(reads[keys[j][0]]):
                        readers[read] = readers.get(read, 0) + 1
        if not readers or max(readers.values()) < need:
            return False
    return True


def _owned(state: GraphMatch, graph: BlockGraph) -> set[int]:
    """The bindings a match may replace: the Vars its patterns matched that are bound in
    the block and not rewritten yet (parameters and earlier rewrites are not).
    """
    keys = set()
    for key in state.p2r.values():
        for k in (key if isinstance(key, tuple) else (key,)):
            if k in graph.bound and k not in graph.removed:
                keys.add(k)
    return keys


def _hoisted_blocks(index: FunctionIndex, replacements: dict[int, Any], rule_name: str,
                    func_name: str) -> list[Any] | None:
    """The blocks reordered so that each replacement follows what it reads, or ``None``.

    A replacement may read a binding that comes later in the block (TVM's
    ``combine_matmul_emit_order``: the weights of the third matmul are transposed after
    the first matmul).  Each binding is then emitted after the bindings it reads, in
    program order otherwise (a depth-first topological order).  A replacement that reads
    a binding computed from the one it replaces is a cycle and an error.
    """
    late: set[int] = set()
    for key, value in replacements.items():
        bi, j = index.position[key]
        for var in C.array_items(relax.analysis.free_vars(value)):
            where = index.position.get(C.handle(var))
            if where is not None and where[0] == bi and where[1] > j:
                late.add(bi)
    if not late:
        return None
    blocks = []
    for bi, (block, bindings) in enumerate(zip(C.array_items(index.func.body.blocks),
                                               index.blocks)):
        if bi not in late:
            blocks.append(block)
            continue
        order = _dependency_order(index, bi, replacements, rule_name, func_name)
        blocks.append(relax.DataflowBlock(order) if type(block) is relax.DataflowBlock
                      else relax.BindingBlock(order))
    return blocks


def _dependency_order(index: FunctionIndex, bi: int, replacements: dict[int, Any],
                      rule_name: str, func_name: str) -> list[Any]:
    bindings = index.blocks[bi]
    keys = [key for key, _ in index.keys[bi]]
    here = {key: j for j, key in enumerate(keys)}
    state: dict[int, int] = {}  # 1: being placed, 2: placed
    order: list[Any] = []

    def reads(key: int) -> list[int]:
        if key in replacements:
            return [C.handle(v) for v in C.array_items(relax.analysis.free_vars(
                replacements[key]))]
        return index.reads[key]

    for start in keys:
        if state.get(start) == 2:
            continue
        stack = [(start, iter(reads(start)))]
        state[start] = 1
        while stack:
            key, todo = stack[-1]
            for read in todo:
                if read not in here or state.get(read) == 2:
                    continue
                if state.get(read) == 1:
                    binding = bindings[here[key]]
                    where = describe_binding(func_name, binding)
                    raise CallbackError(
                        f"rule {rule_name}: the replacement for '{where}' reads "
                        f"'{C.var_name(bindings[here[read]].var)}', which is computed from "
                        f"the binding it replaces (a cycle)", rule_name, where)
                state[read] = 1
                stack.append((read, iter(reads(read))))
                break
            else:
                stack.pop()
                state[key] = 2
                order.append(bindings[here[key]])
    return order


def rewrite_bindings(context: PatternContext, rewriter: Rewriter, target: Any) -> Any:
    """``tvm.relax.dpl.rewrite_bindings`` with patternkit patterns, in linear time.

    Parameters
    ----------
    context : PatternContext
        The graph of patterns (see :mod:`patternkit.dpl.context`).
    rewriter : callable
        ``rewriter(matchings, bindings)``: ``matchings`` maps each node of the graph to
        the Var it matched (a tuple of Vars for ``used_by_all``), ``bindings`` maps each
        Var bound in the block (not rewritten yet) to its value.  Returns a dict
        ``{Var: replacement}`` for matched bindings (an empty one, or ``None``, leaves
        the match alone).
    target : relax.Function or tvm.IRModule
        Returned as the same kind, never modified; in a module every Relax function
        that is not a fused or partitioned one is rewritten.

    One pass, as in TVM: a replacement is not matched again.  Raises
    :class:`~patternkit.errors.CallbackError` (naming the binding) when the rewriter
    raises, replaces a Var its match does not own, or returns a replacement that is not
    an expression or whose type does not fit the binding; the input is left unchanged.
    The error names the rewriter (its ``__name__``, else its ``name``, else its class's).
    """
    if not isinstance(context, PatternContext):
        raise PatternError(f"rewrite_bindings needs a patternkit PatternContext, found "
                           f"{type(context).__module__}.{type(context).__name__}")
    if not callable(rewriter):
        raise PatternError(f"the rewriter must be callable, found {type(rewriter).__name__}")
    context.validate()
    name = (getattr(rewriter, "__name__", None) or getattr(rewriter, "name", None)
            or type(rewriter).__name__)

    def on_function(func_name: str, func: relax.Function) -> relax.Function | None:
        work = _FunctionRewrite(name, func_name, func)
        for graph in work.graphs(context):
            view = None

            def on_match(state: GraphMatch) -> list[int]:
                nonlocal view
                if view is None:
                    view = BlockBindings(graph)
                owned = _owned(state, graph)
                try:
                    result = rewriter(matchings(state, graph), view)
                except Exception as err:
                    where = work.where(graph, owned)
                    raise CallbackError(f"rule {name}: the rewriter raised "
                                        f"{type(err).__name__}: {err} (at '{where}')",
                                        name, where) from err
                return work.accept(graph, owned, result)

            each_match(context, graph, on_match)
        return work.emit() if work.replacements else None

    return apply_to_target(target, lambda mod: _each_function(mod, on_function))


def _each_function(mod: tvm.IRModule,
                   on_function: Callable[[str, relax.Function], relax.Function | None]
                   ) -> tvm.IRModule:
    with C.gc_paused():
        updates = {}
        for gv, func in rewritable_functions(mod):
            if not isinstance(func.body, relax.SeqExpr) or not func.body.blocks:
                continue
            new_func = on_function(gv.name_hint, func)
            if new_func is not None:
                updates[gv] = new_func
        if not updates:
            return mod
        functions = dict(mod.functions.items())
        functions.update(updates)
        return C.copy_module(mod, functions)


def dpl_rewriter(nodes: Mapping[Any, DFPattern], rewriter: Rewriter) -> Rewriter:
    """``rewriter`` (written for a patternkit context) as TVM's ``rewrite_bindings`` calls it.

    ``nodes`` is the mapping :meth:`PatternContext.to_dpl` returns; the TVM patterns in
    TVM's ``matchings`` become the patternkit patterns they stand for.
    """
    def for_tvm(matchings: Any, bindings: Any) -> Any:
        return rewriter({nodes[p]: v for p, v in matchings.items()}, bindings)

    return for_tvm


# -- the class form: a rule with several roots -------------------------------------------------
class BindingsMatch(RoleMatch):
    """One match of a multi-root rule (a rule with a ``context``), read by role.

    ``match.x`` / ``match["x"]`` is the Var the role ``x`` matched (a tuple of Vars for a
    ``used_by_all`` consumer), :meth:`value` the value bound to it, :attr:`bindings` the
    block (Var -> value), :meth:`readers` the bindings reading a Var, :attr:`plan` what
    the check returned.  :meth:`claim` lets a check add a binding that reads the match's
    own Vars (a bias add after a matched matmul) to what the rewrite may replace.
    """

    def __init__(self, state: GraphMatch, graph: BlockGraph, roles: Mapping[str, DFPattern],
                 bindings: BlockBindings, index: FunctionIndex):
        super().__init__(roles)
        self._state = state
        self._graph = graph
        self._index = index
        self._bindings = bindings
        self.owned_keys = _owned(state, graph)

    def _matched(self, pattern: DFPattern) -> Any:
        found = self._state.p2r[pattern]
        var = self._graph.var
        return tuple(var[k] for k in found) if isinstance(found, tuple) else var[found]

    def _has(self, pattern: DFPattern) -> bool:
        return pattern in self._state.p2r

    def tag(self, tag: str) -> str | None:
        """The name of the alternative of ``alt(..., tag=tag)`` that matched (``None``:
        none is part of the match); see :func:`patternkit.dpl.alt`.

        The graph match keeps the Var of each node, not its sub-patterns, so each node's
        pattern is matched again at its Var (only a rule that asks pays for it).
        """
        graph, found = self._graph, None
        for pattern, key in self._state.p2r.items():
            for k in (key if isinstance(key, tuple) else (key,)):
                matched = Matcher(call_args=graph.call_args, table=graph.table,
                                  call_ops=graph.call_ops).match(pattern, graph.var[k])
                name = None if matched is None else matched.tag(tag)
                if name is not None and found is not None and name != found:
                    raise PatternError(f"the tag {tag!r} names two alternatives that both "
                                       f"matched ({found!r} and {name!r}): give each "
                                       f"alt(...) of the pattern its own tag")
                found = found if name is None else name
        return found

    def value(self, key: str | DFPattern | Any) -> Any:
        """The value bound to a role's Var (a tuple for several), or to a Var."""
        if isinstance(key, (str, DFPattern)):
            matched = self[key]
        else:
            matched = key
        if isinstance(matched, tuple):
            return tuple(self._bindings[v] for v in matched)
        return self._bindings[matched]

    @property
    def bindings(self) -> BlockBindings:
        """The block's bindings as the match saw them (Var -> value)."""
        return self._bindings

    @property
    def matchings(self) -> dict[DFPattern, Any]:
        """Each pattern of the context and the expression it matched."""
        return matchings(self._state, self._graph)

    def readers(self, var: Any) -> list[Any]:
        """The Vars of the bindings that read ``var`` in the block, in binding order."""
        graph = self._graph
        return [graph.var[k] for k in graph.readers_of(C.handle(var))]

    def is_parameter(self, expr: Any) -> bool:
        """Is ``expr`` a parameter of the function being rewritten?"""
        return any(p.same_as(expr) for p in self._index.func.params)

    def escapes(self, var: Any) -> bool:
        """Is ``var`` seen outside its block (a block output, or the function's result)?"""
        return C.handle(var) in self._index.escaping

    def claim(self, var: Any) -> None:
        """Let the rewrite replace ``var``'s binding too; it must read a Var of the match."""
        key = C.handle(var)
        graph = self._graph
        if key not in graph.bound or key in graph.removed:
            raise PatternError(f"cannot claim '{C.var_name(var)}': it is not bound in this "
                               f"block")
        if not any(read in self.owned_keys for read in graph.operands.get(key, ())):
            raise PatternError(f"cannot claim '{C.var_name(var)}': it reads no Var of the "
                               f"match")
        self.owned_keys.add(key)

    @property
    def owned(self) -> tuple[Any, ...]:
        """The Vars whose bindings the rewrite may replace."""
        return tuple(self._graph.var[k] for k in sorted(
            self.owned_keys, key=lambda k: self._index.position[k]))

    @property
    def root(self) -> Any:
        """The first binding the match owns (where logs and errors point)."""
        owned = self.owned
        return owned[0] if owned else None



class BindingsRewriteRule(RewriteRule):
    """A :class:`~patternkit.engine.rule.RewriteRule` with several roots, by its old name.

    Any rule whose ``__init__`` sets ``self.context`` (a :class:`PatternContext`) instead
    of ``self.pattern`` is multi-root; this class only says so up front, so that a
    subclass that forgets its context is told about the context, not the pattern.  Its
    ``check`` and ``rewrite`` are the protocol's: they receive a :class:`BindingsMatch`,
    and ``rewrite`` returns ``{Var: replacement}`` for the bindings of the match
    (``match.owned``).
    """

    @property
    def multi_root(self) -> bool:
        """Always ``True``: the driver matches a context's roots together."""
        return True


@dataclass
class BindingsPass:
    """What one pass of a :class:`BindingsRewriteRule` over a function did.

    ``last`` is ``(function name, binding)`` of the last rewrite (``None``: nothing
    changed); ``rewritten`` holds ``(first owned Var, replaced Vars)`` per rewritten
    match and ``refused`` ``(first owned Var's name, reason, Reject)`` per refusal, both
    only when asked for (the driver asks when it keeps a log).  ``offered`` counts the
    matches the rule's rewrite was called on, ``returned_none`` those it answered with
    ``None`` (see :mod:`~patternkit.engine.declines`).
    """

    function: relax.Function
    last: tuple[str, Any] | None = None
    offered: int = 0
    returned_none: int = 0
    rewritten: list[tuple[Any, tuple[Any, ...]]] = field(default_factory=list)
    refused: list[tuple[str, str, Reject]] = field(default_factory=list)


def rewrite_function_bindings(rule: RewriteRule, roles: Mapping[str, DFPattern],
                              func_name: str, func: relax.Function,
                              collect: bool = False,
                              index: FunctionIndex | None = None) -> BindingsPass:
    """One pass of a multi-root rule over one function: the driver's multi-root strategy.

    ``index``: the function's index if the caller has one (the driver's round shares
    its own), else it is built here; it is only read.
    """
    done = BindingsPass(func)
    if not isinstance(func.body, relax.SeqExpr) or not func.body.blocks:
        return done
    context = rule.context
    assert context is not None, "rewrite_function_bindings takes multi-root rules"
    work = _FunctionRewrite(rule.name, func_name, func, index)
    checker = check_of(rule)
    for graph in work.graphs(context):
        view: BlockBindings | None = None

        def on_match(state: GraphMatch) -> list[int]:
            nonlocal view
            if view is None:
                view = BlockBindings(graph)
            match = BindingsMatch(state, graph, roles, view, work.index)
            where = work.where(graph, match.owned_keys)
            try:
                refusal = None
                if checker is not None:
                    refusal, match.plan = judge(checker, match)
                result = None if refusal is not None else rule.rewrite(match)
            except Reject as raised:  # a rewrite may refuse too
                refusal, result = raised, None
            except Exception as err:
                raise CallbackError(f"rule {rule.name}: {type(err).__name__} in the rule: "
                                    f"{err} (while rewriting binding '{where}')",
                                    rule.name, where) from err
            if refusal is not None:
                if collect:
                    done.refused.append((C.var_name(match.root), refusal.reason, refusal))
                return []
            done.offered += 1
            if result is None:
                done.returned_none += 1
            taken = work.accept(graph, match.owned_keys, result)
            if taken:
                done.last = (func_name, graph.binding(taken[-1]))
                if collect:
                    done.rewritten.append((match.root, tuple(graph.var[k] for k in taken)))
            return taken

        each_match(context, graph, on_match)
    if work.replacements:
        done.function = work.emit()
    return done

