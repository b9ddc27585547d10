"""An index of one Relax function's bindings, built in a single linear pass.

Both the rewrite driver and ``partition`` need the same facts about a function: which
value each Var is bound to (per block, since the matcher only looks through bindings of
the block it is matching in), who uses each Var, which bindings call which operator, and
which bindings are live.  Building them once per pass, in plain Python dicts, is what
keeps the engine linear: nothing here crosses the FFI with a function-sized container.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import tvm
from tvm import relax

from ..ir import compat as C
from ..ir.compat import handle, is_pure_value
from ..ir.rebuild import describe_binding  # noqa: F401  (the engine names it from here)
from ..ir.walk import KIND_OF, LEAF_KINDS, VAR, vars_read


def has_candidates(func: relax.Function, keys: Iterable[str] | None) -> bool:
    """Cheap pre-scan: does any binding of ``func`` have one of ``keys``?

    Lets a pass skip the full index for functions the pattern's root cannot occur in
    (for instance the final round of a rewrite, once every match is gone).
    """
    if keys is None:
        return True
    for block in C.array_items(func.body.blocks):
        for binding in C.array_items(block.bindings):
            if binding_key(binding.value) in keys:
                return True
    return False


def binding_kind(value: Any) -> tuple[str, bool]:
    """``(binding_key(value), is_pure_value(value))``, reading a call's operator once."""
    if type(value) is relax.Call:
        op = value.op
        if type(op) is tvm.ir.Op:
            return C.op_info(op)
    return binding_key(value), is_pure_value(value)


def binding_key(value: Any) -> str:
    """Key under which a binding is indexed: the operator name, or the node kind."""
    name = C.op_name(value)
    if name is not None:
        return name
    if isinstance(value, relax.TupleGetItem):
        return "<TupleGetItem>"
    if isinstance(value, relax.Tuple):
        return "<Tuple>"
    return "<" + type(value).__name__ + ">"


@dataclass
class FunctionIndex:
    """Bindings of one function, indexed.

    Attributes
    ----------
    All per-Var tables are keyed by :func:`patternkit.ir.compat.handle`.

    blocks : list of list of Binding
    position : dict handle -> (block index, binding index)
    values : list of dict handle -> Expr, per block, for the pure VarBindings the matcher
        may look through.
    readers : dict handle -> how many reads of the Var the function's bindings make.
    escaping : set of handles of Vars visible outside their block (block outputs, the
        function result); :meth:`users_of` lists who reads a Var, :meth:`var_of` turns a
        handle back into its Var.
    by_key : dict str -> list of (block index, binding index), in program order.
    reads : dict handle -> list of handles of the Vars its bound value reads.
    call_args : dict handle of a bound Call -> its argument list (read once, reused).
    keys : list of list of (handle, removable), per block, parallel to ``blocks``;
        ``removable`` marks pure dataflow bindings a rewrite may delete once unused.
    """

    func: relax.Function
    blocks: list = field(default_factory=list)
    position: dict = field(default_factory=dict)
    values: list = field(default_factory=list)
    readers: dict = field(default_factory=dict)
    escaping: set = field(default_factory=set)
    _users: dict | None = None
    by_key: dict = field(default_factory=dict)
    reads: dict = field(default_factory=dict)
    call_args: dict = field(default_factory=dict)
    keys: list = field(default_factory=list)

    @classmethod
    def build(cls, func: relax.Function) -> "FunctionIndex":
        index = cls(func)
        seq = func.body
        kind_of = KIND_OF.get
        for bi, block in enumerate(C.array_items(seq.blocks)):
            bindings = list(C.array_items(block.bindings))
            index.blocks.append(bindings)
            table: dict[Any, Any] = {}
            keys = []
            is_dataflow = type(block) is relax.DataflowBlock
            for j, binding in enumerate(bindings):
                var, value = binding.var, binding.value
                key = handle(var)
                index.position[key] = (bi, j)
                pure = False
                reads = None
                if type(binding) is relax.VarBinding:
                    if type(value) is relax.Call and type(value.op) is tvm.ir.Op:
                        # The common case, read once: an operator call on leaves.
                        kind, pure = C.op_info(value.op)
                        args = C.array_items(value.args)
                        index.call_args[handle(value)] = args
                        reads = []
                        for a in args:
                            arg_kind = kind_of(type(a))
                            if arg_kind is VAR:
                                reads.append(handle(a))
                            elif arg_kind not in LEAF_KINDS:  # a tuple, or not seen yet
                                reads = None
                                break
                    else:
                        kind, pure = binding_kind(value)
                    if pure:
                        table[key] = value
                    index.by_key.setdefault(kind, []).append((bi, j))
                keys.append((key, pure and type(var) is relax.DataflowVar))
                if reads is None:
                    reads = [handle(v) for v in vars_read(value)]
                index.reads[key] = reads
                readers = index.readers
                for used in reads:
                    readers[used] = readers.get(used, 0) + 1
                if is_dataflow and type(var) is not relax.DataflowVar:
                    index.escaping.add(key)
            index.values.append(table)
            index.keys.append(keys)
        for used in vars_read(seq.body):
            index.escaping.add(handle(used))
        return index

    def users_of(self, key: int) -> list[int]:
        """Handles of the bindings that read the Var ``key`` (built on first use).

        Only error messages need the readers themselves; the hot paths use counts.
        """
        if self._users is None:
            self._users = {}
            for reader, reads in self.reads.items():
                for read in reads:
                    self._users.setdefault(read, []).append(reader)
        return self._users.get(key, [])

    def var_of(self, key: int) -> Any:
        """The bound Var whose handle is ``key``."""
        bi, j = self.position[key]
        return self.blocks[bi][j].var

    def position_of(self, var: Any) -> tuple[int, int]:
        return self.position[handle(var)]

    def candidates(self, keys: Iterable[str] | None) -> list[tuple[int, int]]:
        """Binding positions whose key is in ``keys`` (all VarBindings if ``None``)."""
        if keys is None:
            found = [pos for positions in self.by_key.values() for pos in positions]
        else:
            found = [pos for key in keys for pos in self.by_key.get(key, ())]
        found.sort()
        return found

    def binding_at(self, position: tuple[int, int]):
        bi, j = position
        return self.blocks[bi][j]


def dead_after(index: "FunctionIndex", replaced: dict[int, Any]) -> set[int]:
    """Handles of the bindings that ``replaced`` leaves without readers.

    A worklist from the replaced bindings only: each one stops reading some Vars (its
    old reads minus the Vars its new value reads); a removable binding whose last reader
    went away is dead, and stops reading its own Vars in turn.  Cost is proportional to
    the bindings the rewrite touched, not to the function.  Removable means a pure
    dataflow binding that had readers: dead code that was already there stays.
    """
    readers, escaping = index.readers, index.escaping
    remaining: dict[int, int] = {}  # handle -> readers left, from index.readers on first use
    dead: set[int] = set()
    work: list[int] = []
    for key, value in replaced.items():
        # The new value's reads count as readers first.  Each distinct Var counts once
        # (one C++ call instead of a Python walk); that can only keep a Var alive
        # longer, never remove one that is still read, since it is read at least once.
        for var in C.array_items(relax.analysis.free_vars(value)):
            read = handle(var)
            if read not in remaining:
                remaining[read] = readers.get(read, 0)
            remaining[read] += 1
        work.extend(index.reads[key])  # then the old value stops reading its Vars
    position, keys = index.position, index.keys
    while work:
        key = work.pop()
        if key not in remaining:
            remaining[key] = readers.get(key, 0)
        remaining[key] -= 1
        if remaining[key] == 0 and key in position and key not in dead and key not in escaping:
            bi, j = position[key]
            if not keys[bi][j][1]:  # not removable
                continue
            dead.add(key)
            if key not in replaced:
                work.extend(index.reads[key])
    return dead
