"""The function index filled from a snapshot: integers first, TVM objects on demand.

:meth:`FunctionIndex.build` used to read every binding field by field over the FFI
(the binding, its Var, its value, the operator, the argument array, its size and each
argument: about 7 calls, 4-5 us a binding).  A snapshot (:mod:`patternkit.ir.snapshot`)
reads the same facts for the whole function in one native call; this module turns it
into the index's tables without touching a binding object:

* positions, Var handles, operators (the table's names, purity per operator), argument
  reads, use counts, which Vars leave their block, what is removable;
* the bindings themselves and the values a matcher looks through stand behind
  :class:`~patternkit.engine.lazy_bindings.LazyBindings` and
  :class:`~patternkit.engine.lazy_bindings.LazyValues`, read when asked for.

Only the common binding takes the integer path: an operator call whose arguments are
bound Vars, parameters, constants or other leaves.  Any other binding (a tuple, a
tuple-get, a call of a function, a ``MatchCast``, an argument that is a tuple literal or
a symbolic dimension) is read as an object, exactly as the field-by-field index reads
it, so both indexes hold the same tables.  A function the snapshot refuses (not well
formed, not normalised) is left to the field-by-field index, whose findings the engine
reports.
"""

from __future__ import annotations

from collections import Counter
from itertools import chain
from typing import Any, Callable

import tvm
from tvm import relax

from ..errors import MalformedIRError
from ..ir import compat as C
from ..ir.snapshot import PARAM_BASE, FunctionSnapshot, ValueKind, snapshot
from ..ir.walk import vars_read
from .lazy_bindings import LazyBindings, LazyValues

#: Operator name -> (pure, handle of the Op), read once per process.
_OPS: dict[str, tuple[bool, int]] = {}

_OP_CALL = ValueKind.OP_CALL


def _op_facts(name: str) -> tuple[bool, int]:
    """``(pure, handle)`` of the operator named ``name``."""
    facts = _OPS.get(name)
    if facts is None:
        op = tvm.ir.Op.get(name)
        facts = _OPS[name] = (C.op_info(op)[1], C.handle(op))
    return facts


def read_snapshot(func: relax.Function) -> FunctionSnapshot | None:
    """The snapshot of ``func``, or ``None`` when it is malformed (the caller then indexes
    it field by field, which records what is wrong for the engine's error message).
    """
    if type(func.body) is not relax.SeqExpr:
        return None
    try:
        return snapshot(func)
    except MalformedIRError:
        return None


def fill_from_snapshot(index: Any, snap: FunctionSnapshot,
                       add_binding: Callable[..., list[int]]) -> None:
    """Fill the empty :class:`~patternkit.engine.index.FunctionIndex` ``index`` of
    ``index.func`` from its snapshot ``snap`` (typed ``Any``: the index module imports
    this one).

    ``add_binding(index, bi, j, binding, table, keys, is_dataflow)`` indexes one binding
    read as an object (the field-by-field path) and returns its reads.
    """
    func = index.func
    seq = func.body
    param_keys = [C.handle(p) for p in C.array_items(func.params)]
    index.params.update(param_keys)
    var, kind, op, arg_start, args = snap.var, snap.kind, snap.op, snap.arg_start, snap.args
    dataflow_var = snap.dataflow_var
    ops = [(name, *_op_facts(name)) for name in snap.ops]
    index.snapshot = snap
    index.pure_ops = [pure for _, pure, _ in ops]
    position, by_key, all_reads = index.position, index.by_key, index.reads
    call_ops, escaping = index.call_ops, index.escaping
    block_arrays = C.array_items(seq.blocks)
    block_of = snap.block
    start = 0
    n = len(var)
    for bi, block in enumerate(block_arrays):
        end = start
        while end < n and block_of[end] == bi:
            end += 1
        size = end - start
        index.block_starts.append(start)
        is_dataflow = snap.dataflow[bi]
        index.dataflow.append(is_dataflow)
        bindings = LazyBindings(block.bindings, size)
        index.blocks.append(bindings)
        members: dict[int, int] = {}
        op_of: dict[int, int] = {}
        table = LazyValues(bindings, members, op_of, call_ops)
        keys: list[tuple[int, bool]] = []
        position.update(zip(var[start:end], [(bi, j) for j in range(size)]))
        for j in range(size):
            i = start + j
            key = var[i]
            if kind[i] is _OP_CALL:
                codes = args[arg_start[i]:arg_start[i + 1]]
                reads = _simple_reads(codes, var, param_keys)
                if reads is not None:
                    name, pure, op_key = ops[op[i]]
                    if pure:
                        members[key] = j
                        op_of[j] = op_key
                    by_key.setdefault(name, []).append((bi, j))
                    keys.append((key, pure and dataflow_var[i]))
                    all_reads[key] = reads
                    if is_dataflow and not dataflow_var[i]:
                        escaping.add(key)
                    continue
            # Anything else is read as an object, as the field-by-field index does.
            all_reads[key] = add_binding(index, bi, j, bindings[j], table, keys, is_dataflow)
        index.values.append(table)
        index.keys.append(keys)
        start = end
    index.readers.update(Counter(chain.from_iterable(all_reads.values())))
    for used in vars_read(seq.body):
        index.escaping.add(C.handle(used))


def _simple_reads(codes: list[int], var: list[int], param_keys: list[int]) -> list[int] | None:
    """The Var handles an operator call's argument codes read, or ``None`` when one is a
    tuple literal or a symbolic dimension (the binding is then read as an object).
    """
    reads: list[int] = []
    for code in codes:
        if code >= 0:
            reads.append(var[code])
        elif code <= PARAM_BASE:
            reads.append(param_keys[PARAM_BASE - code])
        elif code < -2:  # ARG_TUPLE, ARG_FREE
            return None
    return reads

