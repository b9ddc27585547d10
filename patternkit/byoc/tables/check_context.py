"""What a TVM pattern-table check receives: a ``PatternCheckContext``-compatible object.

TVM's ``FusionPattern.check`` is called by ``FuseOpsByPattern``'s C++ driver with a
``tvm.relax.transform.PatternCheckContext`` (``PatternBasedPartitioner::
CreatePatternCheckContext`` in ``src/relax/transform/fuse_ops.cc``)::

    matched_expr        the root call that matched
    annotated_expr      annotation name -> what its sub-pattern matched
    matched_bindings    Var -> value, for the call and tuple-get-item nodes of the match
    var_usages          Var -> the Vars using it, in the dataflow block (its use-def chain)
    value_to_bound_var  value -> the Var it is bound to, for the bindings up to the root

:class:`CheckContext` offers the same five attributes with the same meaning, so that
TVM's own checks (``cutlass._check_conv2d``, ``has_leaking_intermediate_variables``,
...) run unchanged and reject what they reject under TVM.  What TVM's matcher records
is kept: an annotation that matched a bound Var maps to the Var's *value* (TVM's
matcher looks through one binding at every node), as in ``annotated_expr["lhs"]``.

This module builds the context over the function as it was given: what Relay's
semantics and the first entry of a TVM table see.  Under TVM's semantics the later
entries see the function as the earlier ones rewrote it (an operand they fused is a call
to their composite); :mod:`patternkit.byoc.merge.check_view` builds that context.

The two function-sized maps are views over patternkit's function index, built once per
function and only when a check reads them: handing every check a fresh map of the whole
function would make a table with many entries quadratic (TVM's C++ driver passes its
maps by reference).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

from tvm import relax

from ...dpl.matcher import Match
from ...dpl.pattern import CallPattern, DFPattern, TupleGetItemPattern
from ...engine.index import FunctionIndex
from ...ir import compat as C
from ...ir.walk import vars_read

__all__ = ["CheckContext", "CheckSite", "BOUND_KINDS"]


class CheckContext:
    """A ``tvm.relax.transform.PatternCheckContext`` for one match (see the module doc)."""

    __slots__ = ("matched_expr", "annotated_expr", "matched_bindings", "var_usages",
                 "value_to_bound_var")

    def __init__(self, matched_expr: Any, annotated_expr: dict, matched_bindings: dict,
                 var_usages: Mapping, value_to_bound_var: Mapping):
        self.matched_expr = matched_expr
        self.annotated_expr = annotated_expr
        self.matched_bindings = matched_bindings
        self.var_usages = var_usages
        self.value_to_bound_var = value_to_bound_var

    def __repr__(self) -> str:
        return f"<CheckContext {C.op_name(self.matched_expr) or 'expr'}: " \
               f"{', '.join(self.annotated_expr)}>"


class _ByHandle(Mapping):
    """A read-only mapping keyed by TVM objects, stored by handle.

    ``items`` maps a handle to ``(key object, value)``; ``limit`` hides the entries whose
    ``order`` (a binding position) is after it.
    """

    __slots__ = ("_items", "_order", "_limit")

    def __init__(self, items: dict[int, tuple[Any, Any]], order: dict[int, Any] | None = None,
                 limit: Any = None):
        self._items = items
        self._order: dict[int, Any] = order if order is not None else {}  # read with a limit
        self._limit = limit

    def _visible(self, key: int) -> bool:
        return self._limit is None or self._order[key] <= self._limit

    def __getitem__(self, obj: Any) -> Any:
        key = C.handle_or_none(obj)
        if key is None or key not in self._items or not self._visible(key):
            raise KeyError(obj)
        return self._items[key][1]

    def __contains__(self, obj: object) -> bool:
        key = C.handle_or_none(obj)
        return key is not None and key in self._items and self._visible(key)

    def __iter__(self) -> Iterator[Any]:
        return (obj for key, (obj, _) in self._items.items() if self._visible(key))

    def __len__(self) -> int:
        return sum(1 for key in self._items if self._visible(key))


class CheckSite:
    """The per-function facts behind :class:`CheckContext`, built on first use.

    Parameters
    ----------
    index : FunctionIndex
        The function being matched.
    """

    def __init__(self, index: FunctionIndex):
        self.index = index
        self._by_value: dict[int, tuple[Any, Any]] | None = None  # value -> (value, var)
        self._value_order: dict[int, tuple[int, int]] = {}
        self._bound: dict[int, Any] | None = None  # var -> its value, every VarBinding
        self._usages: dict[int, _ByHandle] = {}  # block -> var_usages view

    def _indexed(self) -> tuple[dict[int, tuple[Any, Any]], dict[int, Any]]:
        """``(value -> (value, var), var -> value)``, built on the first call."""
        if self._by_value is None or self._bound is None:
            return self._index_bindings()
        return self._by_value, self._bound

    def _index_bindings(self) -> tuple[dict[int, tuple[Any, Any]], dict[int, Any]]:
        by_value: dict[int, tuple[Any, Any]] = {}
        bound: dict[int, Any] = {}
        for bi, bindings in enumerate(self.index.blocks):
            for j, binding in enumerate(bindings):
                if type(binding) is not relax.VarBinding:
                    continue
                value, var = binding.value, binding.var
                key = C.handle(value)
                by_value[key] = (value, var)
                self._value_order[key] = (bi, j)
                bound[C.handle(var)] = value
        self._by_value, self._bound = by_value, bound
        return by_value, bound

    def by_value(self) -> dict[int, tuple[Any, Any]]:
        """Handle of each bound value -> ``(value, Var)``, every ``VarBinding`` of the function."""
        return self._indexed()[0]

    def value_position(self, key: int) -> tuple[int, int]:
        """The ``(block, binding)`` position of the binding of the value with handle ``key``."""
        self._indexed()
        return self._value_order[key]

    def value_of(self, expr: Any) -> Any:
        """What TVM's matcher records for ``expr``: the value of a bound Var, else ``expr``."""
        bound = self._indexed()[1]
        key = C.handle_or_none(expr)
        return bound.get(key, expr) if key is not None else expr

    def var_usages(self, block: int) -> Mapping:
        """``DataflowBlockUseDef`` of block ``block``: each Var used or defined there -> users."""
        view = self._usages.get(block)
        if view is None:
            index = self.index
            users: dict[int, tuple[Any, list]] = {}
            for binding in index.blocks[block]:
                var = binding.var
                key = C.handle(var)
                users.setdefault(key, (var, []))
                for read in index.reads[key]:
                    entry = users.get(read)
                    if entry is None:
                        entry = users[read] = (_var_read_by(index, binding, read), [])
                    if not any(u.same_as(var) for u in entry[1]):
                        entry[1].append(var)
            view = self._usages[block] = _ByHandle({k: (v, tuple(us)) for k, (v, us)
                                                    in users.items()})
        return view

    def context(self, match: Match, root_var: Any, position: tuple[int, int],
                roles: Mapping[str, DFPattern]) -> CheckContext:
        """The context of ``match`` (rooted at the binding of ``root_var`` at ``position``)."""
        by_value = self._indexed()[0]
        root = match.root
        annotated = {name: self.value_of(match.captures[p]) for name, p in roles.items()
                     if p in match.captures}
        matched = {root_var: root}
        for p, value in match.captures.items():
            if type(p) in BOUND_KINDS and p in match.bound_vars:
                matched[match.bound_vars[p]] = value
        value_to_var = _ByHandle(by_value, self._value_order, position)
        return CheckContext(root, annotated, matched, self.var_usages(position[0]),
                            value_to_var)


#: The pattern kinds whose matches TVM puts in ``matched_bindings`` (and in the composite).
BOUND_KINDS = (CallPattern, TupleGetItemPattern)


def _var_read_by(index: FunctionIndex, binding: Any, key: int) -> Any:
    """The Var object with handle ``key`` that ``binding``'s value reads."""
    for var in vars_read(binding.value):
        if C.handle(var) == key:
            return var
    return index.var_of(key)
