"""A block's bindings and look-through values, read from TVM only when asked for.

The function index built from a snapshot (:mod:`~patternkit.engine.index_snapshot`)
knows every binding's position, operator, arguments and uses as integers, so most
bindings of a large function are never needed as objects: only the ones a matcher looks
through, a check reads, or emission copies.  These two containers stand where the index
held lists of bindings and dicts of values, and read each binding (one FFI call) and its
value (one more) the first time someone asks.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..ir import compat as C

_array_get = C._array_get  # pylint: disable=protected-access


class LazyBindings:
    """The bindings of one block as a read-only sequence, each read on first access.

    Parameters
    ----------
    array : tvm_ffi.Array
        The block's ``bindings``.
    size : int
        Its length (known from the snapshot: no FFI call).
    """

    __slots__ = ("_array", "_items")

    def __init__(self, array: Any, size: int):
        self._array = array
        self._items: list[Any] = [None] * size

    def __len__(self) -> int:
        """The number of bindings."""
        return len(self._items)

    @property
    def loaded(self) -> int:
        """How many bindings have been read from TVM so far."""
        return sum(item is not None for item in self._items)

    def __bool__(self) -> bool:
        """Does the block hold a binding."""
        return bool(self._items)

    def __getitem__(self, j: Any) -> Any:
        """Binding ``j`` (or a list, for a slice)."""
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self._items)))]
        items = self._items
        binding = items[j]
        if binding is None:
            binding = items[j] = _array_get(self._array, j if j >= 0 else j + len(items))
        return binding

    def __iter__(self) -> Iterator[Any]:
        """Every binding, in order."""
        for j in range(len(self._items)):
            yield self[j]


class LazyValues:
    """``handle -> value`` of the pure bindings of one block (what a matcher may look
    through), each value read on first access.

    The mapping the engine's matcher takes as its ``table``: ``get`` is its hot path.
    ``pop`` hides a binding (a value an earlier rule of the round replaced).

    Parameters
    ----------
    bindings : LazyBindings
        The block's bindings.
    members : dict
        Handle of each pure binding's Var -> its position in the block.
    ops : dict
        Position -> the handle of the operator the binding calls, for the operator
        calls among ``members``; each value read is entered in ``call_ops`` under its
        handle, so a matcher compares operators without reading ``call.op``.
    call_ops : dict
        The index's table of operators by call handle, filled as values are read.
    """

    __slots__ = ("_bindings", "_members", "_values", "_ops", "_call_ops")

    def __init__(self, bindings: LazyBindings, members: dict[int, int], ops: dict[int, int],
                 call_ops: dict[int, int]):
        self._bindings = bindings
        self._members = members
        self._values: dict[int, Any] = {}
        self._ops = ops
        self._call_ops = call_ops

    def add(self, key: int, j: int, value: Any) -> None:
        """Enter binding ``j`` (Var ``key``), whose ``value`` is already read."""
        self._members[key] = j
        self._values[key] = value

    def get(self, key: int, default: Any = None) -> Any:
        """The value bound to the Var ``key`` in this block, or ``default``."""
        value = self._values.get(key)
        if value is not None:
            return value
        j = self._members.get(key)
        if j is None:
            return default
        value = self._values[key] = self._bindings[j].value
        op = self._ops.get(j)
        if op is not None:
            self._call_ops[C.handle(value)] = op
        return value

    def __getitem__(self, key: int) -> Any:
        """The value bound to ``key``; ``KeyError`` when it is not a member."""
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        """Is ``key`` a pure binding of this block (not hidden)."""
        return key in self._members

    def __len__(self) -> int:
        """How many values the table holds."""
        return len(self._members)

    def __iter__(self) -> Iterator[int]:
        """The handles, in program order."""
        return iter(self._members)

    def keys(self) -> Any:
        """The handles, in program order."""
        return self._members.keys()

    def items(self) -> Iterator[tuple[int, Any]]:
        """``(handle, value)`` pairs, in program order (every value read)."""
        for key in list(self._members):
            yield key, self[key]

    def values(self) -> Iterator[Any]:
        """The values, in program order (every value read)."""
        for _, value in self.items():
            yield value

    def pop(self, key: int, default: Any = None) -> Any:
        """Hide ``key``'s value from later look-ups; returns it, or ``default``."""
        if key not in self._members:
            return default
        value = self.get(key)
        del self._members[key]
        self._values.pop(key, None)
        return value
