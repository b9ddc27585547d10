"""An index of one Relax function's bindings, built in a single linear pass.

Both the rewrite driver and ``partition`` need the same facts about a function: which
value each Var is bound to (per block, since the matcher only looks through bindings of
the block it is matching in), who uses each Var, which bindings call which operator, and
which bindings are live.  Building them once per pass, in plain Python dicts, is what
keeps the engine linear: nothing here crosses the FFI with a function-sized container.

*Dead code* is a removable binding (pure, dataflow) that nothing live reads: nobody
reads it, or only other dead code does (the ONNX importer's ``lv5 = lv3[1]`` after a
``batch_norm``).  Dead readers are not uses: they neither make a match's intermediate
escape nor keep a value alive once a rewrite stops reading it (:func:`dead_after`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import tvm
from tvm import relax

from ..dpl.pattern import DFPattern, may_occur, root_op_names
from ..errors import env_switch
from ..ir import compat as C
from ..ir.compat import handle, is_pure_value
from ..ir.rebuild import describe_binding as describe_binding  # the engine's name for it
from ..ir.snapshot import FunctionSnapshot
from ..ir.walk import CALL, GET_ITEM, KIND_OF, LEAF_KINDS, TUPLE, VAR, expr_kind, vars_read
from .index_snapshot import fill_from_snapshot, read_snapshot
from .prefilter import operator_keys, root_filter, table_filter

_array_get, _array_size = C._array_get, C._array_size  # pylint: disable=protected-access


def has_candidates(func: relax.Function, keys: Iterable[str] | None) -> bool:
    """Cheap pre-scan: does any binding of ``func`` have one of ``keys``?

    Lets a pass skip the full index for functions the pattern's root cannot occur in
    (for instance the final round of a rewrite, once every match is gone).
    """
    if keys is None:
        return True
    op_info, get, size = C.op_info, C._array_get, C._array_size  # pylint: disable=protected-access
    for block in C.array_items(func.body.blocks):
        bindings = block.bindings
        for j in range(size(bindings)):  # read one by one: the scan usually stops early
            value = get(bindings, j).value
            if type(value) is relax.Call:  # binding_key() inlined for an operator call
                op = value.op
                if type(op) is tvm.ir.Op:
                    if op_info(op)[0] in keys:
                        return True
                    continue
            if binding_key(value) in keys:
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
    dataflow : list of bool, per block: is it a ``DataflowBlock``.
    position : dict handle -> (block index, binding index)
    params : set of the handles of the function's parameters.
    values : list of dict handle -> Expr, per block, for the pure VarBindings the matcher
        may look through.
    readers : dict handle -> how many reads of the Var the function's bindings make
        (dead code's reads included; :meth:`live_readers` leaves them out).
    escaping : set of handles of Vars visible outside their block (block outputs, the
        function result); :meth:`users_of` lists who reads a Var, :meth:`var_of` turns a
        handle back into its Var.
    by_key : dict str -> list of (block index, binding index), in program order.
    reads : dict handle -> list of handles of the Vars its bound value reads.
    call_args : dict handle of a bound Call -> its argument list (read once, reused).
    call_ops : dict handle of a bound operator Call -> the handle of its operator (the
        matcher compares operators by handle without reading ``call.op`` again).
    keys : list of list of (handle, removable), per block, parallel to ``blocks``;
        ``removable`` marks pure dataflow bindings a rewrite may delete once unused.
    undefined : ``(position, handle)`` of the first read of a Var that is neither a
        parameter nor bound before the binding reading it, or ``None`` (the input is not
        well formed; :func:`patternkit.engine.wellformed.check_input` reports it).
    not_normal : ``(position, what)`` of the first binding whose value nests a call (the
        function is not in A-normal form; ``position`` is ``None`` for the function's
        result), or ``None``.
    """

    func: relax.Function
    blocks: list[list[Any]] = field(default_factory=list)
    dataflow: list[bool] = field(default_factory=list)
    position: dict[int, tuple[int, int]] = field(default_factory=dict)
    params: set[int] = field(default_factory=set)
    values: list[dict[int, Any]] = field(default_factory=list)
    readers: dict[int, int] = field(default_factory=dict)
    escaping: set[int] = field(default_factory=set)
    _users: dict[int, list[int]] | None = None
    by_key: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    reads: dict[int, list[int]] = field(default_factory=dict)
    call_args: dict[int, list[Any]] = field(default_factory=dict)
    call_ops: dict[int, int] = field(default_factory=dict)
    keys: list[list[tuple[int, bool]]] = field(default_factory=list)
    undefined: tuple[tuple[int, int] | None, int] | None = None
    not_normal: tuple[tuple[int, int] | None, str] | None = None
    _dead: frozenset[int] | None = None
    #: The snapshot the index was filled from (``None``: read field by field), where each
    #: block's first binding is, and which of its operators are pure: what
    #: :meth:`candidates_for` checks candidates against.
    snapshot: FunctionSnapshot | None = None
    block_starts: list[int] = field(default_factory=list)
    pure_ops: list[bool] = field(default_factory=list)
    #: The trie key of each operator of the snapshot's table, made on first use.
    _op_keys: list[int] | None = None
    _dead_reads: dict[int, int] = field(default_factory=dict)
    _dead_readers: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, func: relax.Function) -> "FunctionIndex":
        """The index of ``func``: the one a recent pass built for this very function, if
        it is unchanged, else a new one (:meth:`build`), kept for the next pass.

        Passes hand each other their results: the rewrite's last round indexes the
        function it emitted, and its multi-root rules, the next round and then
        ``MergeComposite`` all read that same function.  An index is a pure function of
        its (immutable) function; one that :meth:`make_opaque` changed is no longer
        handed out.  The last :data:`RECENT_INDEXES` are kept, with their functions
        (so a handle cannot be reused while it is a key); :func:`forget_indexes` drops
        them.
        """
        key = handle(func)
        index = _RECENT.get(key)
        if index is not None:
            _RECENT.move_to_end(key)
            return index
        index = cls.build(func)
        _RECENT[key] = index
        if len(_RECENT) > RECENT_INDEXES:
            _RECENT.popitem(last=False)
        return index

    @classmethod
    def build(cls, func: relax.Function) -> "FunctionIndex":
        """A new index of ``func`` (:meth:`of` reuses a recent one).

        Field by field (:meth:`build_by_fields`), or from the function's snapshot
        (:meth:`build_from_snapshot`) when :data:`SNAPSHOT_INDEX_VARIABLE` is set to
        ``1``.  Not the default yet: the matcher still reads, over the FFI, the values
        and arguments the field-by-field index read for it, so the snapshot's saving in
        the index is spent again in matching (``docs/history.md``, issue 38).
        """
        if env_switch(SNAPSHOT_INDEX_VARIABLE, default=False):
            return cls.build_from_snapshot(func)
        return cls.build_by_fields(func)

    @classmethod
    def build_from_snapshot(cls, func: relax.Function) -> "FunctionIndex":
        """A new index of ``func`` filled from its snapshot.

        :mod:`~patternkit.engine.index_snapshot`: one native call, binding objects read
        only when asked for, candidates checked over integers (:meth:`candidates_for`);
        field by field when the snapshot refuses the function (the index then records
        what is wrong, for the engine's error message).
        """
        snap = read_snapshot(func)
        if snap is None:
            return cls.build_by_fields(func)
        index = cls(func)
        fill_from_snapshot(index, snap, _add_binding)
        return index

    @classmethod
    def build_by_fields(cls, func: relax.Function) -> "FunctionIndex":
        """A new index of ``func``, reading every binding as an object (over the FFI)."""
        index = cls(func)
        seq = func.body
        index.params.update(handle(p) for p in C.array_items(func.params))
        for bi, block in enumerate(C.array_items(seq.blocks)):
            bindings = C.array_items(block.bindings)
            index.blocks.append(bindings)
            table: dict[Any, Any] = {}
            keys: list[tuple[int, bool]] = []
            is_dataflow = type(block) is relax.DataflowBlock
            index.dataflow.append(is_dataflow)
            readers = index.readers
            for j, binding in enumerate(bindings):
                for used in _add_binding(index, bi, j, binding, table, keys, is_dataflow):
                    readers[used] = readers.get(used, 0) + 1
            index.values.append(table)
            index.keys.append(keys)
        position, params = index.position, index.params
        result = seq.body
        for used in vars_read(result):
            key = handle(used)
            index.escaping.add(key)
            if key not in position and key not in params and index.undefined is None:
                index.undefined = (None, key)
        if index.not_normal is None and KIND_OF.get(type(result)) is not VAR and nests_a_call(
                result, True):
            index.not_normal = (None, "returns a call instead of a Var")
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
        """The (block, binding) position of the binding of ``var``."""
        return self.position[handle(var)]

    def candidates(self, keys: Iterable[str] | None) -> list[tuple[int, int]]:
        """Binding positions whose key is in ``keys`` (all VarBindings if ``None``)."""
        if keys is None:
            found = [pos for positions in self.by_key.values() for pos in positions]
        else:
            found = [pos for key in keys for pos in self.by_key.get(key, ())]
        found.sort()
        return found

    def candidates_for(self, pattern: DFPattern) -> list[tuple[int, int]]:
        """The positions of the bindings that may be the root of a match of ``pattern``.

        :meth:`candidates` of its root operators, less those :meth:`root_check` rejects:
        each of those the matcher would have failed.
        """
        found = self.candidates(root_op_names(pattern))
        check = self.root_check(pattern) if found else None
        return found if check is None else [at for at in found if check(at)]

    def root_check(self, pattern: DFPattern) -> Callable[[tuple[int, int]], bool] | None:
        """``accepts(position)``: may the binding at ``position`` (one of
        :meth:`candidates`) be the root of a match of ``pattern``?  ``None`` when the
        pattern's top constrains nothing the index holds.

        The pattern's top, :data:`~patternkit.engine.prefilter.DEPTH` levels of calls
        compiled once into a trie keyed by operator handle
        (:mod:`~patternkit.engine.prefilter`), evaluated over the snapshot's integers or
        over this index's call tables.  A necessary condition: a position it rejects is
        one the matcher would fail.
        """
        snap = self.snapshot
        if snap is None:
            check = table_filter(pattern, self.call_ops, self.call_args)
            if check is None:
                return None
            keys, values = self.keys, self.values
            return lambda at: check(values[at[0]], keys[at[0]][at[1]][0])
        if self._op_keys is None:  # once per snapshot, not per rule
            self._op_keys = operator_keys(snap.ops)
        accepts = root_filter(pattern, snap, self.pure_ops, self._op_keys)
        if accepts is None:
            return None
        starts = self.block_starts
        return lambda at: accepts(starts[at[0]] + at[1])

    def may_hold(self, root_keys: Iterable[str] | None,
                 required: tuple[frozenset[str], ...] = ()) -> bool:
        """Can a pattern match here: one of ``root_keys`` (``None``: any root) occurs, and
        an operator of every set of ``required`` (:func:`patternkit.dpl.required_op_names`)?

        A necessary condition only: it lets a pass skip a rule in a function without
        trying its candidates one by one.
        """
        by_key = self.by_key
        if root_keys is not None and not any(key in by_key for key in root_keys):
            return False
        return may_occur(required, by_key)

    def binding_at(self, position: tuple[int, int]) -> Any:
        """The binding at a (block, binding) position from :meth:`candidates`."""
        bi, j = position
        return self.blocks[bi][j]

    def removable(self, key: int) -> bool:
        """May the binding of ``key`` be deleted once nothing live reads it?"""
        bi, j = self.position[key]
        return self.keys[bi][j][1]

    # -- dead code ---------------------------------------------------------------------
    @property
    def dead_code(self) -> frozenset[int]:
        """Handles of the removable bindings that nothing live reads (found on first use).

        A worklist from the bindings nobody reads, so it costs one look at each binding
        plus the size of the dead code: most functions have none.
        """
        dead = self._dead
        if dead is None:
            dead = self._find_dead_code()
        return dead

    def live_readers(self, key: int) -> int:
        """How many reads of ``key`` live bindings make (dead code's reads left out)."""
        if self._dead is None:
            self._find_dead_code()
        return self.readers.get(key, 0) - self._dead_reads.get(key, 0)

    def dead_readers(self, key: int) -> list[int]:
        """Handles of the dead bindings reading ``key`` (with repeats)."""
        if self._dead is None:
            self._find_dead_code()
        return self._dead_readers.get(key, [])

    def _find_dead_code(self) -> frozenset[int]:
        readers, escaping, position, reads = self.readers, self.escaping, self.position, self.reads
        work = [key for block in self.keys for key, removable in block
                if removable and key not in readers and key not in escaping]
        dead: set[int] = set()
        dead_reads, dead_readers = self._dead_reads, self._dead_readers
        while work:
            key = work.pop()
            dead.add(key)
            for read in reads[key]:
                n = dead_reads[read] = dead_reads.get(read, 0) + 1
                dead_readers.setdefault(read, []).append(key)
                if (n == readers[read] and read in position and read not in escaping
                        and self.removable(read)):
                    work.append(read)
        self._dead = frozenset(dead)
        return self._dead

    # -- what later rules of a round may see ---------------------------------------------
    def make_opaque(self, key: int) -> None:
        """Stop the matcher from looking through the binding of ``key``.

        For a binding replaced earlier in the same round: its old value is gone, so a
        later match may read the Var but not see through it to that value.
        """
        bi, _ = self.position[key]
        self.values[bi].pop(key, None)
        if _RECENT.get(handle(self.func)) is self:  # no longer the index of self.func
            del _RECENT[handle(self.func)]


def _add_binding(index: FunctionIndex, bi: int, j: int, binding: Any, table: Any,
                 keys: list[tuple[int, bool]], is_dataflow: bool) -> list[int]:
    """Index the binding at ``(bi, j)``, read as an object; returns the handles it reads.

    Enters its pure value in the block's look-up ``table``, its ``(handle, removable)``
    in ``keys``, and its position, key and call tables in ``index``; records the first
    undefined read and the first nested call.  The caller counts the reads.
    """
    var, value = binding.var, binding.value
    key = handle(var)
    at = (bi, j)
    is_dataflow_var = type(var) is relax.DataflowVar
    pure = False
    reads: list[int] | None = None
    if type(binding) is relax.VarBinding:
        op = value.op if type(value) is relax.Call else None
        if type(op) is tvm.ir.Op:
            # The common case, read once: an operator call on leaves.
            kind, pure = C.op_info(op)
            array = value.args
            size = _array_size(array)
            # Unrolled for the usual one or two arguments (a list comprehension is a
            # frame of its own).
            if size == 2:
                args = [_array_get(array, 0), _array_get(array, 1)]
            elif size == 1:
                args = [_array_get(array, 0)]
            else:
                args = [_array_get(array, i) for i in range(size)]
            value_key = handle(value)
            index.call_args[value_key] = args
            index.call_ops[value_key] = handle(op)
            reads = []
            for a in args:
                arg_kind = KIND_OF.get(type(a))
                if arg_kind is VAR:
                    reads.append(handle(a))
                elif arg_kind not in LEAF_KINDS:  # a tuple, or not seen yet
                    reads = None
                    break
        else:
            kind, pure = binding_kind(value)
        if pure:
            if type(table) is dict:
                table[key] = value
            else:
                table.add(key, j, value)
        at_key = index.by_key.get(kind)
        if at_key is None:
            index.by_key[kind] = [at]
        else:
            at_key.append(at)
    keys.append((key, pure and is_dataflow_var))
    if reads is None:
        reads = [handle(v) for v in vars_read(value)]
        if index.not_normal is None and nests_a_call(value):
            index.not_normal = ((bi, j), "nests a call in its value")
    if index.undefined is None:
        position, params = index.position, index.params
        for used in reads:
            # Reads only look backwards: the binding itself is not in position yet.
            if used not in position and used not in params \
                    and not _reads_symbolic_var(value, used):
                index.undefined = ((bi, j), used)
                break
    index.reads[key] = reads
    index.position[key] = at
    if is_dataflow and not is_dataflow_var:
        index.escaping.add(key)
    return reads


#: Environment variable that makes :meth:`FunctionIndex.build` read the function's
#: snapshot (``1``) instead of every binding field by field.
SNAPSHOT_INDEX_VARIABLE = "PATTERNKIT_SNAPSHOT_INDEX"

#: How many indexes :meth:`FunctionIndex.of` keeps for the passes that follow.
RECENT_INDEXES = 8
_RECENT: OrderedDict[int, FunctionIndex] = OrderedDict()  # handle of a function -> index


def forget_index(func: relax.Function) -> None:
    """Drop the index :meth:`FunctionIndex.of` keeps for ``func``, if any.

    For a function a pass has just replaced by its rewrite: nothing downstream reads the
    old function, and a kept index is a few Python objects per binding that the cyclic
    collector would traverse at its next collections (the collector is paused during a
    pass, not after it: see :func:`patternkit.ir.compat.gc_paused`).
    """
    _RECENT.pop(handle(func), None)


def forget_indexes() -> None:
    """Drop the indexes kept by :meth:`FunctionIndex.of` (and the functions they hold).

    A benchmark timing a pass on the same input again and again calls it, so that each
    run indexes its input as a first run would.
    """
    _RECENT.clear()


def nests_a_call(value: Any, top: bool = False) -> bool:
    """Does ``value`` hold a call below its top level (it is not in A-normal form)?

    ``top``: ``value`` is a function's or a block's result, where a call is itself not
    normal.  Tuples of leaves and Vars are normal anywhere.
    """
    kind = KIND_OF.get(type(value)) or expr_kind(value)
    if kind is CALL:
        return top or any(nests_a_call(a, True) for a in C.array_items(value.args)
                          if (KIND_OF.get(type(a)) or expr_kind(a)) in (CALL, TUPLE))
    if kind is TUPLE:
        return any(nests_a_call(f, True) for f in C.array_items(value.fields)
                   if (KIND_OF.get(type(f)) or expr_kind(f)) in (CALL, TUPLE))
    if kind is GET_ITEM:
        return nests_a_call(value.tuple_value, True) if (
            KIND_OF.get(type(value.tuple_value)) or expr_kind(value.tuple_value)) is CALL else False
    return False


def _reads_symbolic_var(value: Any, key: int) -> bool:
    """Whether the read ``key`` of ``value`` is a symbolic dimension (``R.arange(0, n)``).

    In 0.27 a TIR variable is an ``ir.Var`` like a Relax one, and appears bare among a
    call's arguments; it is defined by the parameters' shapes, not by a binding.  Asked
    only for a read that is neither a parameter nor bound earlier, which is rare.
    """
    return any(handle(var) == key and tvm.ir.is_prim_var(var) for var in vars_read(value))


def reads_of_value(value: Any) -> list[int]:
    """Handles of the distinct Relax Vars a new value reads (free Vars: one C++ call).

    Symbolic dimensions are left out: in 0.27 ``free_vars`` also lists a TIR variable
    read bare as an argument (``R.reshape(x, [n, d])``), which the parameters' shapes
    define, not a binding.  The usual replacement, an operator call on Relax Vars and
    constants, is read off its arguments instead (the same Vars, in the same order).
    """
    if type(value) is relax.Call and type(value.op) is tvm.ir.Op:
        reads: list[int] = []
        for arg in C.array_items(value.args):
            kind = type(arg)
            if kind in C.VAR_TYPES:
                key = handle(arg)
                # A DataflowVar is never a symbolic dimension (only a plain Var may be).
                if key not in reads and (kind is relax.DataflowVar
                                         or not tvm.ir.is_prim_var(arg)):
                    reads.append(key)
            elif KIND_OF.get(kind) not in LEAF_KINDS:  # nested, symbolic: ask TVM
                break
        else:
            return reads
    return [handle(var) for var in C.array_items(relax.analysis.free_vars(value))
            if not tvm.ir.is_prim_var(var)]


def dead_after(index: "FunctionIndex", replaced: dict[int, Any],
               new_reads: dict[int, list[int]] | None = None) -> set[int]:
    """Handles of the bindings that ``replaced`` leaves dead, to be dropped.

    A worklist from the replaced bindings only: each one stops reading some Vars (its
    old reads; its new value's reads count instead); a removable binding whose last live
    reader went away is dead, and stops reading its own Vars in turn (a replaced one,
    those of its new value).  Dead code reading a binding that goes goes with it: dead
    readers never keep a value alive.  Dead code that reads nothing removed stays.  Cost
    is proportional to the bindings the rewrite touched, not to the function.

    ``new_reads`` maps each replaced handle to :func:`reads_of_value` of its new value,
    when the caller has them already.
    """
    if new_reads is None:
        new_reads = {key: reads_of_value(value) for key, value in replaced.items()}
    readers, escaping, position = index.readers, index.escaping, index.position
    dead_code = index.dead_code
    dead_reads = index._dead_reads
    remaining: dict[int, int] = {}  # handle -> live readers left, on first use
    revived: set[int] = set()  # dead code that a new value reads, now live
    work: list[int] = []

    def reads_of(key: int) -> list[int]:
        return new_reads[key] if key in new_reads else index.reads[key]

    for key, reads in new_reads.items():
        if key in dead_code:  # a dead binding keeps nothing alive, new value or old
            continue
        # The new value's reads count as readers first: each distinct Var once, which
        # can only keep a Var alive longer, never remove one that is still read.
        revive = list(reads)
        while revive:
            read = revive.pop()
            if read not in remaining:
                remaining[read] = readers.get(read, 0) - dead_reads.get(read, 0)
            remaining[read] += 1
            if read in dead_code and read not in revived:
                revived.add(read)
                revive.extend(reads_of(read))
        work.extend(index.reads[key])  # then the old value stops reading its Vars
    released: set[int] = set()
    keys, old_reads = index.keys, index.reads
    while work:  # the hot loop of emission: removable() and reads_of() inlined
        key = work.pop()
        left = remaining.get(key)
        if left is None:
            left = readers.get(key, 0) - dead_reads.get(key, 0)
        remaining[key] = left = left - 1
        if left or key in released or key in escaping:
            continue
        where = position.get(key)
        if where is None or not keys[where[0]][where[1]][1]:  # a parameter, or not removable
            continue
        if key in revived:  # dead before, dead again: plain dead code once more
            revived.discard(key)
        else:
            released.add(key)
        work.extend(new_reads[key] if key in new_reads else old_reads[key])
    if not dead_code or not released:
        return released
    return released | _dead_code_reading(index, released, dead_code - revived, new_reads)


def _dead_code_reading(index: FunctionIndex, removed: set[int], dead_code: frozenset[int],
                       new_reads: dict[int, list[int]]) -> set[int]:
    """The dead code that reads a ``removed`` binding, directly or through other dead code."""
    extra: dict[int, list[int]] = {}  # replaced dead code reads its new value's Vars
    for key in dead_code & new_reads.keys():
        for read in new_reads[key]:
            extra.setdefault(read, []).append(key)
    gone: set[int] = set()
    stack = list(removed)
    while stack:
        key = stack.pop()
        for reader in (*index.dead_readers(key), *extra.get(key, ())):
            if reader in gone or reader not in dead_code:
                continue
            if reader in new_reads and key not in new_reads[reader]:
                continue  # it read ``key`` only in the value it no longer has
            gone.add(reader)
            stack.append(reader)
    return gone
