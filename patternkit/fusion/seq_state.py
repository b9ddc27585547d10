"""What DefuseOps tracks while it walks one ``SeqExpr``: emitted bindings and their uses.

Each block of the ``SeqExpr`` is emitted through a :class:`BlockCursor`: the list the new
bindings go to, whether the block is a dataflow block (inlined bindings then bind
``DataflowVar`` s), the local functions in scope, the :class:`SeqState` shared by the
blocks, and the name of the function being walked (for error messages).

An emitted binding is the tuple ``(var, value, match_cast_type, original_binding)``:
``match_cast_type`` is ``None`` for a plain binding, and the original binding is reused
as it is when neither its Var nor its value changed.  (A tuple rather than an object:
one is made for every binding of every defused function.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm import relax

from ..ir.walk import GET_ITEM, expr_kind, substitute, vars_read

__all__ = ["BlockCursor", "InlinedTuple", "SeqState", "make_binding"]


@dataclass(frozen=True, slots=True)
class InlinedTuple:
    """A tuple literal that an inlined multi-output group returned, and where it went."""

    block: list     #: the emitted-binding list of the block that binds it
    value: Any      #: the ``relax.Tuple`` literal


class SeqState:
    """Use tracking for the bindings DefuseOps may drop or rewrite in one ``SeqExpr``.

    Only two kinds of bindings are ever removed: local functions of a selected kind once no
    call refers to them, and tuples built from an inlined multi-output group whose users
    were all ``TupleGetItem`` bindings that took over their fields.  Everything else,
    including dead code that was already there, is kept.
    """

    __slots__ = ("removable", "tuples", "used_tuples", "fresh", "renames")

    def __init__(self):
        self.removable: dict = {}    # local function Var -> referenced?
        self.tuples: dict = {}       # Var bound to an inlined tuple -> InlinedTuple
        self.used_tuples: set = set()  # those of them read other than by a projection
        self.fresh: set = set()      # Vars created by inlining
        self.renames: dict = {}      # fresh field Var -> projection Var that replaces it

    def tracking(self) -> bool:
        """Whether emitted values must be scanned for uses of droppable bindings."""
        return bool(self.removable or self.tuples)

    def note_uses(self, value: Any) -> None:
        """Mark the droppable bindings and inlined tuples that ``value`` reads as used."""
        if not self.removable and not self.tuples:
            return
        for v in vars_read(value):
            if v in self.removable:
                self.removable[v] = True
            if v in self.tuples:
                self.used_tuples.add(v)

    def take_over_field(self, var: Any, value: Any, block: list) -> bool:
        """``v = t[i]`` with ``t`` an inlined tuple: ``v`` replaces the field's own Var.

        Returns True when the projection binding is no longer needed.  Only fresh Vars
        of the same block are renamed, so no caller variable ever changes.
        """
        if expr_kind(value) is not GET_ITEM:
            return False
        inlined = self.tuples.get(value.tuple_value)
        if inlined is None or inlined.block is not block:
            return False
        field = inlined.value.fields[value.index]
        if field not in self.fresh or field in self.renames:
            return False
        self.renames[field] = var
        return True

    def collapse_renames(self) -> None:
        """Follow chains of renames to their end.

        A nested multi-output group makes chains: the inner tuple's field ``a`` is taken
        over by the outer function's projection ``p = t[0]``, and the outer function
        returns ``p`` in a tuple whose projection ``q = u[1]`` in the caller takes ``p``
        over in turn.  ``a`` must then become ``q``, not ``p``, which is no longer bound.
        """
        renames = self.renames
        for var in list(renames):
            target = renames[var]
            seen = {var}
            while target in renames and target not in seen:
                seen.add(target)
                target = renames[target]
            renames[var] = target

    def dead_vars(self) -> set:
        """The droppable Vars nothing read, and the inlined tuples read only by projection."""
        dead = {v for v, used in self.removable.items() if not used}
        dead.update(v for v in self.tuples if v not in self.used_tuples)
        return dead

    def apply_rename(self, item: tuple) -> tuple:
        """``item`` with the pending field renames applied to its Var and value."""
        var, value, ty, _original = item
        new_var = self.renames.get(var, var)
        new_value = substitute(value, self.renames)
        if new_var is var and new_value is value:
            return item
        return (new_var, new_value, ty, None)


@dataclass(frozen=True, slots=True)
class BlockCursor:
    """Where the bindings of one block are emitted (see the module docstring)."""

    out: list          #: emitted bindings, in order
    dataflow: bool     #: a dataflow block: inlined bindings bind ``DataflowVar`` s
    scope: dict        #: local function Var -> its (defused) function
    state: SeqState
    where: str         #: the function being walked, ``main/f`` for a local ``f``

    def with_scope(self, scope: dict) -> "BlockCursor":
        """The same cursor (output, state, location) over another substitution scope."""
        return BlockCursor(self.out, self.dataflow, scope, self.state, self.where)


def make_binding(item: tuple) -> Any:
    """The binding of an emitted ``(var, value, match_cast_type, original)`` tuple."""
    var, value, ty, original = item
    if original is not None and original.var.same_as(var) and original.value.same_as(value):
        return original
    if ty is not None:
        return relax.MatchCast(var, value, ty)
    return relax.VarBinding(var, value)
