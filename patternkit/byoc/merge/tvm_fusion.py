"""TVM's ``FuseOpsByPattern`` semantics, planned in one walk over an index every entry shares.

``FuseOpsByPattern(table)`` runs one C++ pass over the whole module *per table entry*:
for each entry, ``PatternBasedPartitioner`` tries the entry's pattern at every call
binding, in program order, and groups what it accepts; ``OperatorFusor`` then rewrites
the module, so the next entry sees the earlier entries' composites as opaque calls.
This module reproduces that result without the passes:

* every function is indexed once (:class:`~patternkit.engine.index.FunctionIndex`),
  and an entry only visits the bindings that call its pattern's root operator;
* entries still take effect in priority order: a binding an earlier entry took is
  hidden from the later ones (the matcher cannot look through it), as if rewritten;
* within one entry, roots are tried in TVM's order (program order, as re-sorted by the
  earlier entries' fusions); a match that contains all of an earlier match of the same
  entry absorbs it (``relu(add(conv))`` grows over ``add(conv)``), which is TVM's
  subsumption rule;
* a match whose intermediate result is read outside it is kept, and the intermediate
  becomes an extra output of the composite (TVM's rule; Relay's skips such a match);
* a check runs as TVM runs it, on a ``PatternCheckContext``-compatible object built
  over the function as the earlier entries rewrote it (an operand they fused is a call
  to their composite: :mod:`~patternkit.byoc.merge.check_view`); so entries take effect
  across the whole module one after the other (:func:`plan_module`), and each
  composite's function is built as it is formed, under the name TVM gives it.

Where TVM's own result is wrong, the plan does what TVM intends instead:

* **Partial overlap** (rewrite-engine notes §4.3 b).  When a later match of an entry
  shares some but not all of the bindings of an earlier match, TVM's subsumption check
  looks at the shared binding's own group instead of its root group, lets the later
  match take the shared bindings, and leaves the earlier root behind as a one-op
  composite that still carries the entry's name (a bare ``add`` called
  ``"bn"``).  Here the earlier match is kept whole and the later one is skipped, which
  is what TVM's source comment says the check is for.
* **Cycles.**  When a result of a match feeds, outside the match, one of the match's own
  inputs (``m = matmul(x, w); r = relu(m); add(m, r)`` for ``add(matmul(*, *), *)``),
  fusing would make the composite depend on itself; TVM then raises "cyclic dependency"
  or emits a function that reads an undefined variable.  Such a match is skipped, with
  the reason.

The plan (:class:`FunctionPlan`) is turned into IR by :mod:`patternkit.byoc.merge.fused_functions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from tvm import relax

from ...dpl.matcher import Match, Matcher
from ...dpl.pattern import CallPattern, TupleGetItemPattern, root_op_names
from ...engine.index import FunctionIndex
from ...engine.rule import Reject, RuleMatch, judge, reject
from ...engine.skip import SkipKind
from ...ir import compat as C
from ..tables.table import CompositeEntry, PatternTable
from .check_view import RewrittenView

#: Keys of bindings ``FuseOpsByPattern`` never tries as a root (it only visits calls).
NOT_A_CALL = frozenset({"<TupleGetItem>", "<Tuple>"})


@dataclass(eq=False)
class PlannedComposite:
    """A composite the plan forms (compared by identity: it is a node of the block order).

    Attributes
    ----------
    entry : CompositeEntry
    block : int
        Index of the dataflow block it is in.
    members : list of int
        Binding indices (in the block) it takes, in block order when it was formed.
    root : int
        Binding index of its root (the binding whose match formed it).
    match : Match
        The match at the root.
    outputs : list of int
        Binding indices of the members whose results leave it, in TVM's order: the
        members that are not dataflow variables first, then those read by other
        bindings of the block, by first reader.
    created : tuple
        Sort key of TVM's creation order (entry pass, function, block, position).
    built : BuiltComposite or None
        Its function in the module's function table and how to call it, once the plan's
        ``on_formed`` has built it (:func:`~patternkit.byoc.merge.fused_functions.build_composite`).
    """

    entry: CompositeEntry
    block: int
    members: list[int]
    root: int
    match: Match
    outputs: list[int] = field(default_factory=list)
    created: tuple = ()
    built: Any = None


@dataclass(frozen=True)
class PlanSkip:
    """A match the plan did not turn into a composite.

    ``kind`` (the engine's :class:`~patternkit.engine.skip.SkipKind`): ``CHECK`` (the
    entry's check refused it), ``OVERLAP`` (a binding was taken: by a higher-priority
    entry, ``by``, or by an earlier match of the same entry that it only partly covers),
    ``CYCLE`` (fusing it would make the composite depend on itself).  ``members`` are the
    binding indices the match covered.
    """

    entry: CompositeEntry
    block: int
    root: int
    members: tuple[int, ...]
    kind: SkipKind
    reason: str
    by: str | None = None
    rejection: Reject | None = None


@dataclass
class BlockPlan:
    """The dataflow block ``block`` after the plan: units in TVM's emission order.

    ``order`` holds binding indices (bindings left as they are) and
    :class:`PlannedComposite` objects (emitted as a call, then its output projections).
    """

    block: int
    order: list
    composites: list[PlannedComposite] = field(default_factory=list)


@dataclass
class FunctionPlan:
    """The plan for one function: each dataflow block's plan, and the matches skipped."""

    func_name: str
    index: FunctionIndex
    blocks: dict[int, BlockPlan] = field(default_factory=dict)
    skipped: list[PlanSkip] = field(default_factory=list)

    @property
    def composites(self) -> list[PlannedComposite]:
        """Every composite planned, block by block."""
        return [c for b in self.blocks.values() for c in b.composites]


#: ``on_error(entry, func_name, binding, err) -> Exception``: names a check that raised.
CheckError = Callable[[CompositeEntry, str, Any, Exception], Exception]


class _Block:
    """The state of one dataflow block while entries take effect."""

    def __init__(self, index: FunctionIndex, bi: int):
        self.bi = bi
        self.bindings = index.blocks[bi]
        self.keys = [key for key, _ in index.keys[bi]]
        self.live = dict(index.values[bi])  # what later entries may still look through
        self.order: list = list(range(len(self.bindings)))
        self.rank: dict = {j: j for j in self.order}
        self.taken: dict[int, PlannedComposite] = {}  # binding index -> composite
        self.plan = BlockPlan(bi, self.order)

    def unit_of(self, j: int):
        return self.taken.get(j, j)


#: ``on_formed(index, composite)``: called as each composite is formed, in TVM's creation
#: order (what builds its function, so that later entries' checks can see calls to it).
OnFormed = Callable[[FunctionIndex, PlannedComposite], None]


def plan_module(table: PatternTable, functions: list[tuple[str, relax.Function, FunctionIndex,
                                                            list[CompositeEntry]]],
                on_error: CheckError, want_log: bool, on_formed: OnFormed) -> list[FunctionPlan]:
    """The composites ``FuseOpsByPattern(table)`` forms in each of ``functions``.

    ``functions`` holds ``(name, function, index, entries that may match in it)`` in the
    module's order.  Entries take effect one after the other over the whole module, as
    TVM's passes do: every function sees entry ``k`` before any sees entry ``k + 1``, so
    the composites are formed (and ``on_formed`` called) in TVM's creation order.
    """
    planners = [(_start(name, func, index, on_error, want_log, order, on_formed),
                 {id(e) for e in entries})
                for order, (name, func, index, entries) in enumerate(functions)]
    for entry in table:
        for planner, entries in planners:
            if planner is not None and id(entry) in entries:
                planner.run_entry(entry.priority, entry)
    return [planner.finish() if planner is not None else FunctionPlan(name, index)
            for (planner, _), (name, _, index, _) in zip(planners, functions)]


def _start(func_name: str, func: relax.Function, index: FunctionIndex,
           on_error: CheckError, want_log: bool, func_order: int,
           on_formed: OnFormed) -> "_Planner | None":
    """A planner for ``func``, or ``None`` when it has no dataflow block."""
    blocks = {bi: _Block(index, bi) for bi, block in enumerate(C.array_items(func.body.blocks))
              if isinstance(block, relax.DataflowBlock)}
    if not blocks:
        return None
    return _Planner(index, func_name, blocks, FunctionPlan(func_name, index), on_error,
                    want_log, func_order, on_formed)


def candidate_keys(entry: CompositeEntry) -> frozenset[str] | None:
    """The binding keys an entry's root can have under TVM's driver (``None``: any call)."""
    keys = root_op_names(entry.pattern)
    return None if keys is None else frozenset(keys - NOT_A_CALL)


class _Planner:
    def __init__(self, index: FunctionIndex, func_name: str, blocks: dict[int, _Block],
                 plan: FunctionPlan, on_error: CheckError, want_log: bool, func_order: int,
                 on_formed: OnFormed):
        self.index = index
        self.func_name = func_name
        self.blocks = blocks
        self.plan = plan
        self.on_error = on_error
        self.want_log = want_log
        self.func_order = func_order
        self.on_formed = on_formed
        # checks see the function as the entries so far rewrote it (the composites'
        # functions, which on_formed builds, are what their calls name)
        self.view = RewrittenView(index, blocks)
        self.calls = _call_positions(index, blocks)

    def finish(self) -> FunctionPlan:
        """The plan, once every entry has run."""
        for bi, state in self.blocks.items():
            if state.plan.composites:
                state.plan.order = state.order
                self.plan.blocks[bi] = state.plan
        return self.plan

    # -- one entry ("one FuseOpsByPattern pass") ----------------------------------------
    def run_entry(self, pass_index: int, entry: CompositeEntry) -> None:
        keys = candidate_keys(entry)
        if keys is not None and not keys:
            return  # rooted at a tuple (get item): FuseOpsByPattern never tries it
        by_block: dict[int, list[int]] = {}
        if keys is None:
            for bi, positions in self.calls.items():
                by_block[bi] = list(positions)
        else:
            for key in keys:
                for bi, j in self.index.by_key.get(key, ()):
                    if bi in self.blocks:
                        by_block.setdefault(bi, []).append(j)
        for bi in sorted(by_block):
            state = self.blocks[bi]
            roots = [j for j in by_block[bi] if j not in state.taken]
            if not roots:
                continue
            roots.sort(key=state.rank.__getitem__)
            formed = self._match_roots(entry, state, roots)
            if formed:
                self._commit(pass_index, state, formed)

    def _match_roots(self, entry: CompositeEntry, state: _Block,
                     roots: list[int]) -> list[PlannedComposite]:
        index, position = self.index, self.index.position
        matcher = Matcher(call_args=index.call_args, table=state.live, call_ops=index.call_ops)
        # ``formed`` (by identity, in formation order) and ``group_of`` (member -> its
        # group) are kept up to date match by match rather than rebuilt: an entry can form
        # thousands of composites in one block (tensorrt's ``add`` on GPT-2).
        group_of: dict[int, PlannedComposite] = {}
        formed: dict[int, PlannedComposite] = {}
        last_member = -1  # the highest rank of any member of ``formed``
        for j in roots:
            binding = state.bindings[j]
            found = matcher.match(entry.pattern, binding.value)
            if found is None:
                if self.want_log:
                    self._log_hidden_overlap(entry, state, j)
                continue
            interior = _interior(found, position, state.bi)
            members = sorted({*interior, j}, key=state.rank.__getitem__)
            touched = list(dict.fromkeys(group_of[m] for m in interior if m in group_of))
            member_set = set(members)
            partial = next((g for g in touched if not member_set.issuperset(g.members)), None)
            if partial is not None:
                self._skip(entry, state, j, members, SkipKind.OVERLAP,
                           f"an earlier match of '{entry.name}' at "
                           f"'{C.var_name(state.bindings[partial.root].var)}' already took "
                           f"some of its bindings", by=entry.name)
                continue
            cycle = _cycle_through(index, state, member_set, group_of, formed.values(),
                                   last_member)
            if cycle is not None:
                self._skip(entry, state, j, members, SkipKind.CYCLE, cycle)
                continue
            refusal = self._check(entry, state, j, found)
            if refusal is not None:
                self._skip(entry, state, j, members, SkipKind.CHECK, refusal.reason,
                           rejection=refusal)
                continue
            group = PlannedComposite(entry, state.bi, members, j, found)
            for g in touched:
                del formed[id(g)]
            formed[id(group)] = group
            for m in members:
                group_of[m] = group
            last_member = max(last_member, state.rank[members[-1]])
        return list(formed.values())

    def _check(self, entry: CompositeEntry, state: _Block, j: int, found: Match) -> Reject | None:
        binding = state.bindings[j]
        if entry.tvm_check is not None:
            context = self.view.context(found, binding.var, state.bi, j, entry.roles)
            try:
                accepted = entry.tvm_check(context)
            except Exception as err:  # a TVM check that raises stops the pass, named
                raise self.on_error(entry, self.func_name, binding, err) from err
            return None if accepted else reject(f"check of {entry.name} rejected it")
        if entry.accept is None:
            return None
        try:
            refusal, _ = judge(entry.accept, RuleMatch(found, entry.roles))
        except Exception as err:
            raise self.on_error(entry, self.func_name, binding, err) from err
        return refusal

    # -- after an entry: what TVM's OperatorFusor does with its groups --------------------
    def _commit(self, pass_index: int, state: _Block, formed: list[PlannedComposite]) -> None:
        # Outputs first, while the new composites' members are still bindings of the block
        # (each is read where its binding stands, as TVM's CollectFuncBoundary reads them).
        for group in formed:
            group.outputs = _outputs(self.index, state, group)
        for group in formed:
            for m in group.members:
                state.taken[m] = group
                state.live.pop(state.keys[m], None)
        state.order = _emission_order(self.index, state, formed)
        state.rank = {unit: r for r, unit in enumerate(state.order)}
        for group in formed:
            group.created = (pass_index, self.func_order, state.bi, state.rank[group])
            state.plan.composites.append(group)
        for group in sorted(formed, key=state.rank.__getitem__):
            self.on_formed(self.index, group)

    # -- reporting ----------------------------------------------------------------------
    def _skip(self, entry, state, j, members, kind, reason, by=None, rejection=None) -> None:
        if self.want_log:
            self.plan.skipped.append(PlanSkip(entry, state.bi, j, tuple(members), kind, reason,
                                              by, rejection))

    def _log_hidden_overlap(self, entry: CompositeEntry, state: _Block, j: int) -> None:
        """Would ``entry`` have matched at ``j`` had an earlier entry not taken bindings?"""
        if not state.taken:
            return
        full = Matcher(call_args=self.index.call_args, table=self.index.values[state.bi],
                       call_ops=self.index.call_ops)
        found = full.match(entry.pattern, state.bindings[j].value)
        if found is None:
            return
        interior = _interior(found, self.index.position, state.bi)
        taken = next((m for m in interior if m in state.taken), None)
        if taken is None:
            return
        by = state.taken[taken].entry.name
        members = sorted({*interior, j})
        self._skip(entry, state, j, members, SkipKind.OVERLAP,
                   f"'{by}' (higher priority) already took "
                   f"'{C.var_name(state.bindings[taken].var)}'", by=by)


def _call_positions(index: FunctionIndex, blocks: dict[int, _Block]) -> dict[int, list[int]]:
    """Per dataflow block, the indices of the bindings whose value is a call."""
    out: dict[int, list[int]] = {}
    for bi in blocks:
        out[bi] = [j for j, b in enumerate(index.blocks[bi])
                   if type(b) is relax.VarBinding and type(b.value) is relax.Call]
    return out


def _interior(found: Match, position: dict, bi: int) -> list[int]:
    """Binding indices of the match's call and tuple-get-item nodes, root excluded.

    Only those join a composite in TVM (``PatternBasedPartitioner``): a wildcard, a
    constant or a tuple pattern matched through a binding leaves it outside.
    """
    out = []
    for p, var in found.bound_vars.items():
        if type(p) is CallPattern or type(p) is TupleGetItemPattern:
            pos = position.get(C.handle(var))
            if pos is not None and pos[0] == bi and pos[1] not in out:
                out.append(pos[1])
    return out


def _readers(index: FunctionIndex, state: _Block, j: int) -> list[int]:
    """Binding indices, in this block, of the bindings reading the result of binding ``j``."""
    key = state.keys[j]
    out = []
    for user in index.users_of(key):
        pos = index.position[user]
        if pos[0] == state.bi:
            out.append(pos[1])
    return out


def _cycle_through(index: FunctionIndex, state: _Block, members: set[int],
                   pending: dict[int, PlannedComposite], others: Iterable[PlannedComposite],
                   last_member: int) -> str | None:
    """Why fusing ``members`` would make a composite depend on itself, or ``None``.

    Composites formed earlier (by earlier entries: ``state.taken``; by this entry so
    far: ``pending``, member -> composite, whose members reach up to rank
    ``last_member``) count as one node each.  A cycle is a path that leaves the members
    and comes back.  The block order is a topological order of everything but this
    entry's new composites, so a path can only come back below the match's last member
    through one of those that spans it; without one, readers past the match are not
    followed.  A composite of ``pending`` that the match absorbs lies inside
    ``members``, so the walk never enters it.
    """
    rank = state.rank
    top = max(rank[m] for m in members)
    # Roots are tried in block order, so the composites of this entry usually all end
    # below ``top``; only when one reaches past it can one span it.
    spanning = last_member > top and any(
        min(rank[m] for m in g.members) < top < max(rank[m] for m in g.members)
        for g in others)

    work = [(m, r) for m in members for r in _readers(index, state, m) if r not in members]
    seen: set[int] = set()
    while work:
        source, j = work.pop()
        u = state.taken.get(j)
        if u is not None:  # an earlier entry's composite: a unit of the block order
            key = -1 - id(u)
            if key in seen:
                continue
            seen.add(key)
            if not spanning and rank[u] > top:
                continue
            inside = u.members
        elif j in pending:  # this entry's composite: not placed in the block order yet
            u = pending[j]
            key = -1 - id(u)
            if key in seen:
                continue
            seen.add(key)
            inside = u.members
        else:
            if j in seen:
                continue
            seen.add(j)
            if not spanning and rank[j] > top:
                continue
            inside = [j]
        for k in inside:
            for r in _readers(index, state, k):
                if r in members:
                    return (f"'{C.var_name(state.bindings[source].var)}' is read outside the "
                            f"match by a path that leads back into it (through "
                            f"'{C.var_name(state.bindings[k].var)}'): fusing it would create "
                            f"a cycle")
                work.append((source, r))
    return None


def _outputs(index: FunctionIndex, state: _Block, group: PlannedComposite) -> list[int]:
    """The members whose results leave ``group``, in TVM's order (see PlannedComposite)."""
    members = set(group.members)
    outputs = [m for m in group.members
               if type(state.bindings[m].var) is not relax.DataflowVar]
    first_use: dict[int, tuple] = {}
    rank = state.rank
    for m in group.members:
        key = state.keys[m]
        for r in _readers(index, state, m):
            if r in members:
                continue
            unit = state.taken.get(r)
            if unit is None:  # a binding of the block (or of another new composite)
                at = (rank[r], index.reads[state.keys[r]].index(key))
            else:  # an earlier composite: its call reads its inputs in order
                at = (rank[unit], _inputs_of(index, state, unit).index(key))
            if m not in first_use or at < first_use[m]:
                first_use[m] = at
    for m in sorted(first_use, key=first_use.__getitem__):
        if m not in outputs:
            outputs.append(m)
    if not outputs:  # nothing reads the root: keep it as the result all the same
        outputs.append(group.root)
    return outputs


def _inputs_of(index: FunctionIndex, state: _Block, group: PlannedComposite) -> list[int]:
    """Handles of the Vars ``group`` reads from outside, in first-read order (its call's)."""
    inside = {state.keys[m] for m in group.members}
    out: list[int] = []
    for m in group.members:
        for read in index.reads[state.keys[m]]:
            if read not in inside and read not in out:
                out.append(read)
    return out


def _emission_order(index: FunctionIndex, state: _Block, formed: list) -> list:
    """The block's units after ``OperatorFusor`` (``TopoSortByGroupDep``).

    Each new composite becomes one unit, emitted once everything it reads is; the rest
    keeps its order.  A composite whose members are contiguous simply takes the place of
    its first member, the common case, without the graph walk.
    """
    taken = state.taken

    def unit(j: int):
        return taken.get(j, j)

    contiguous = all(max(state.rank[m] for m in g.members) - min(state.rank[m] for m in g.members)
                     == len(g.members) - 1 for g in formed)
    if contiguous:
        formed_set = {id(g) for g in formed}
        out, placed = [], set()
        for u in state.order:
            if isinstance(u, int):
                g = taken.get(u)
                if g is not None and id(g) in formed_set:
                    if id(g) not in placed:
                        placed.add(id(g))
                        out.append(g)
                    continue
            out.append(u)
        return out

    def deps(u) -> list:
        found = []
        for j in ([u] if isinstance(u, int) else u.members):
            for read in index.reads[state.keys[j]]:
                pos = index.position.get(read)
                if pos is not None and pos[0] == state.bi:
                    d = unit(pos[1])
                    if d is not u:
                        found.append(d)
        return found

    out, visited = [], set()
    for start in state.order:
        start = unit(start) if isinstance(start, int) else start
        key = start if isinstance(start, int) else id(start)
        if key in visited:
            continue
        stack = [(start, iter(deps(start)))]
        visited.add(key)
        while stack:
            node, it = stack[-1]
            child = next(it, None)
            if child is None:
                stack.pop()
                out.append(node)
                continue
            ckey = child if isinstance(child, int) else id(child)
            if ckey not in visited:
                visited.add(ckey)
                stack.append((child, iter(deps(child))))
    return out


__all__ = ["PlannedComposite", "PlanSkip", "BlockPlan", "FunctionPlan", "plan_module",
           "candidate_keys", "NOT_A_CALL", "OnFormed"]
