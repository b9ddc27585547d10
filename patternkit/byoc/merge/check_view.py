"""What a table entry's check sees under TVM's semantics: the function the earlier entries left.

``FuseOpsByPattern(table)`` runs its entries one after the other, and each rewrites the
module before the next one looks at it.  The check of a later entry therefore receives a
``PatternCheckContext`` built over the *rewritten* function:

* an operand that an earlier entry fused is bound to a call to that entry's composite
  (``fused_relax_nn_conv2d_relax_nn_relu(x, w)``), or, when the composite has several
  results, to ``results[i]`` of a variable bound to that call; ``annotated_expr`` holds
  that call or projection, not the operator it replaced;
* ``value_to_bound_var`` knows those calls and projections, and no longer knows the
  bindings the composites took;
* ``var_usages`` is the use-def chain of the rewritten block: a composite's inputs are
  used by the variable its call is bound to, and the variables it took are gone.

:class:`RewrittenView` builds that context without rewriting anything: the planner of
:mod:`~patternkit.byoc.merge.tvm_fusion` keeps, per dataflow block, which bindings each
composite took and the block's order after it; each composite's function is added to the
module's function table when it is formed (so its call names the function TVM names),
and a call standing for it is made the first time a check can see it.  Both maps are
views answering one key at a time, so a table of many entries stays linear.

Two differences remain, both in names only: the variables keep their names (TVM binds
the composite's call to a fresh ``lv``), and the variable bound to a multi-result call is
named ``<root>_results``, as the emitted module names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

from tvm import relax

from ...dpl.matcher import Match
from ...dpl.pattern import DFPattern
from ...engine.index import FunctionIndex
from ...ir import compat as C
from ..tables.check_context import BOUND_KINDS, CheckContext, CheckSite

__all__ = ["RewrittenView"]


class _Stand:
    """The bindings standing for one composite in the rewritten block.

    ``call`` is the call to its function; ``bound`` the Var it is bound to (the single
    result's own Var, or a new ``<root>_results`` Var); ``items`` maps the handle of each
    result's Var to the projection it is bound to (multi-result composites only), in
    member order.
    """

    __slots__ = ("composite", "call", "bound", "items", "value_of")

    def __init__(self, index: FunctionIndex, composite: Any):
        self.composite = composite
        bindings = index.blocks[composite.block]
        built = composite.built
        outputs = composite.outputs
        if len(outputs) == 1:
            var = bindings[outputs[0]].var
            self.call = C.new_call(var.ty, built.gv, list(built.arguments), None, [], None)
            self.bound = var
            self.items: dict[int, tuple[Any, Any]] = {}
            self.value_of = {C.handle(var): self.call}
            return
        ty = relax.TupleType([bindings[m].var.ty for m in outputs])
        self.call = C.new_call(ty, built.gv, list(built.arguments), None, [], None)
        self.bound = C.new_dataflow_var(f"{C.var_name(bindings[composite.root].var)}_results",
                                        ty, None)
        self.items = {}
        self.value_of = {}
        for m in composite.members:
            if m in outputs:
                var = bindings[m].var
                item = relax.TupleGetItem(self.bound, outputs.index(m))
                self.items[C.handle(var)] = (item, var)
                self.value_of[C.handle(var)] = item


class RewrittenView:
    """Check contexts over one function as the entries formed so far rewrote it.

    Parameters
    ----------
    index : FunctionIndex
        The function as it was given.
    blocks : dict
        Dataflow block index -> the planner's block state (``taken``: binding index ->
        composite; ``rank``: unit -> position in the block's current order).
    """

    def __init__(self, index: FunctionIndex, blocks: dict[int, Any]):
        self.index = index
        self.blocks = blocks
        self.site = CheckSite(index)
        self._stands: dict[int, _Stand] = {}  # id(composite) -> its stand-in
        self._stand_values: dict[int, tuple[_Stand, Any]] = {}  # value -> (stand, its Var)
        self._results_vars: dict[int, _Stand] = {}  # a multi-result call's Var -> its stand

    # -- the composites -------------------------------------------------------------------
    def stand(self, composite: Any) -> _Stand:
        """The stand-in of ``composite`` (made once)."""
        stand = self._stands.get(id(composite))
        if stand is None:
            stand = self._stands[id(composite)] = _Stand(self.index, composite)
            self._stand_values[C.handle(stand.call)] = (stand, stand.bound)
            for item, var in stand.items.values():
                self._stand_values[C.handle(item)] = (stand, var)
            if stand.items:
                self._results_vars[C.handle(stand.bound)] = stand
        return stand

    def taker(self, key: int) -> Any:
        """The composite that took the binding of Var ``key``, or ``None``."""
        position = self.index.position.get(key)
        if position is None:
            return None
        state = self.blocks.get(position[0])
        return None if state is None else state.taken.get(position[1])

    def value_of(self, expr: Any) -> Any:
        """What TVM's matcher records for ``expr`` in the rewritten function."""
        key = C.handle_or_none(expr)
        if key is not None and isinstance(expr, relax.Var):
            composite = self.taker(key)
            if composite is not None:
                value = self.stand(composite).value_of.get(key)
                if value is not None:
                    return value
        return self.site.value_of(expr)

    # -- the context ----------------------------------------------------------------------
    def context(self, match: Match, root_var: Any, block: int, j: int,
                roles: Mapping[str, DFPattern]) -> CheckContext:
        """The context of ``match``, rooted at binding ``j`` of dataflow block ``block``."""
        annotated = {name: self.value_of(match.captures[p]) for name, p in roles.items()
                     if p in match.captures}
        matched = {root_var: match.root}
        for p, value in match.captures.items():
            if type(p) in BOUND_KINDS and p in match.bound_vars:
                matched[match.bound_vars[p]] = value
        state = self.blocks[block]
        return CheckContext(match.root, annotated, matched, _Usages(self, state),
                            _BoundVars(self, block, state.rank[j]))


class _Usages(Mapping):
    """``var_usages``: the rewritten block's Vars -> the Vars of the bindings using them."""

    __slots__ = ("_view", "_state")

    def __init__(self, view: RewrittenView, state: Any):
        self._view = view
        self._state = state

    def _users(self, key: int) -> list | None:
        """The users of Var ``key`` in the block, ``None`` if the block has no such Var."""
        view, state = self._view, self._state
        results = view._results_vars.get(key)
        if results is not None:  # used by its projections only
            return [var for _, var in results.items.values()]
        position = view.index.position.get(key)
        owner = None
        if position is not None and position[0] == state.bi:
            owner = state.taken.get(position[1])
            if owner is not None and key not in view.stand(owner).value_of:
                return None  # taken inside a composite: gone from the block
        users: list[tuple[int, Any]] = []
        seen: set[int] = set()
        for reader in view.index.users_of(key):
            at = view.index.position[reader]
            if at[0] != state.bi:
                continue
            unit = state.taken.get(at[1])
            if unit is None:
                var = state.bindings[at[1]].var
                rank = state.rank[at[1]]
            elif unit is owner:
                continue  # read inside its own composite
            else:
                var = view.stand(unit).bound
                rank = state.rank[unit]
            if C.handle(var) not in seen:
                seen.add(C.handle(var))
                users.append((rank, var))
        if not users and (position is None or position[0] != state.bi):
            return None  # neither defined nor used in the block
        users.sort(key=lambda item: item[0])
        return [var for _, var in users]

    def __getitem__(self, var: Any) -> Any:
        key = C.handle_or_none(var)
        users = None if key is None else self._users(key)
        if users is None:
            raise KeyError(var)
        return tuple(users)

    def __contains__(self, var: object) -> bool:
        key = C.handle_or_none(var)
        return key is not None and self._users(key) is not None

    def _vars(self) -> list:
        view, state = self._view, self._state
        found: dict[int, Any] = {}
        for unit in sorted(state.rank, key=state.rank.__getitem__):
            if isinstance(unit, int):
                binding = state.bindings[unit]
                found.setdefault(C.handle(binding.var), binding.var)
                reads = view.index.reads[state.keys[unit]]
            else:
                stand = view.stand(unit)
                found.setdefault(C.handle(stand.bound), stand.bound)
                for _, var in stand.items.values():
                    found.setdefault(C.handle(var), var)
                members = {state.keys[m] for m in unit.members}
                reads = [r for m in unit.members for r in view.index.reads[state.keys[m]]
                         if r not in members]
            for read in reads:
                if read not in found:
                    found[read] = _var(view.index, read)
        return [var for key, var in found.items() if self._users(key) is not None]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._vars())

    def __len__(self) -> int:
        return len(self._vars())


class _BoundVars(Mapping):
    """``value_to_bound_var``: values bound up to the root, in the rewritten function."""

    __slots__ = ("_view", "_block", "_rank")

    def __init__(self, view: RewrittenView, block: int, rank: int):
        self._view = view
        self._block = block
        self._rank = rank

    def _before(self, block: int, unit: Any) -> bool:
        if block != self._block:
            return block < self._block
        return self._view.blocks[block].rank[unit] <= self._rank

    def _lookup(self, key: int) -> Any:
        view = self._view
        stand = view._stand_values.get(key)
        if stand is not None:
            composite = stand[0].composite
            return stand[1] if self._before(composite.block, composite) else None
        by_value = view.site.by_value()
        found = by_value.get(key)
        if found is None:
            return None
        block, j = view.site.value_position(key)
        state = view.blocks.get(block)
        if state is not None and j in state.taken:
            return None
        if state is None:
            return found[1] if block < self._block else None
        return found[1] if self._before(block, j) else None

    def __getitem__(self, value: Any) -> Any:
        key = C.handle_or_none(value)
        var = None if key is None else self._lookup(key)
        if var is None:
            raise KeyError(value)
        return var

    def __contains__(self, value: object) -> bool:
        key = C.handle_or_none(value)
        return key is not None and self._lookup(key) is not None

    def _items(self) -> list[tuple[Any, Any]]:
        view = self._view
        for block, state in view.blocks.items():
            if block <= self._block:
                for composite in {id(c): c for c in state.taken.values()}.values():
                    view.stand(composite)
        out = []
        for key, (value, _) in view.site.by_value().items():
            var = self._lookup(key)
            if var is not None:
                out.append((value, var))
        for key, (stand, _) in list(view._stand_values.items()):
            var = self._lookup(key)
            if var is not None:
                value = stand.call if var is stand.bound else stand.items[C.handle(var)][0]
                out.append((value, var))
        return out

    def __iter__(self) -> Iterator[Any]:
        return (value for value, _ in self._items())

    def __len__(self) -> int:
        return len(self._items())


def _var(index: FunctionIndex, key: int) -> Any:
    """The Var with handle ``key``: bound in the function, or one of its parameters."""
    if key in index.position:
        return index.var_of(key)
    for param in C.array_items(index.func.params):
        if C.handle(param) == key:
            return param
    raise KeyError(key)
