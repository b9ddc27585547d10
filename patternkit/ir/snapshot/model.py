"""The flat, integer-coded record of one Relax function that :func:`snapshot` returns.

A pass over a function mostly asks integer questions (which operator, how many
arguments, which binding an argument is, how often a value is read, what dtype and
shape it has).  Answering them from Python lists instead of TVM objects costs no FFI
call per question, and the whole record is read in one native call
(:mod:`~patternkit.ir.snapshot.native`) or one Python walk
(:mod:`~patternkit.ir.snapshot.python_reader`), which give identical records.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class ValueKind(IntEnum):
    """What a binding's value is."""

    OP_CALL = 0       #: a call of an operator (``R.add(x, y)``)
    GLOBAL_CALL = 1   #: a call of a function of the module
    TUPLE = 2
    GET_ITEM = 3      #: ``t[i]``
    CONSTANT = 4      #: a tensor constant
    VAR = 5           #: another Var (``y = x``)
    #: anything else: a MatchCast (its one argument is the value it casts), a local
    #: function, an ``If``, a shape... (no arguments recorded)
    OTHER = 6


#: Argument codes below zero; ``>= 0`` is the index of a binding.
ARG_CONSTANT = -1   #: a tensor constant
ARG_LEAF = -2       #: an operand that reads no Var (a prim value, a shape, a string...)
ARG_TUPLE = -3      #: a tuple literal (``R.concat((a, b))``); its Vars count as uses
ARG_FREE = -4       #: a Var neither bound before nor a parameter (a symbolic dimension)
PARAM_BASE = -5     #: parameter ``p`` is ``PARAM_BASE - p``

#: :attr:`FunctionSnapshot.rank` of a value that is not a tensor.
NOT_TENSOR = -2
#: A dimension (in :attr:`FunctionSnapshot.dims`) that is not a static integer.
SYMBOLIC = -1


def param_code(p: int) -> int:
    """The argument code of parameter ``p``."""
    return PARAM_BASE - p


def param_of(code: int) -> int | None:
    """The parameter index an argument code names, or ``None``."""
    return PARAM_BASE - code if code <= PARAM_BASE else None


@dataclass(frozen=True)
class FunctionSnapshot:
    """The bindings of one function (blocks flattened in order) as parallel lists.

    Attributes
    ----------
    var : list of int
        Per binding, the handle of its Var (:func:`patternkit.ir.compat.handle`).
    block : list of int
        Per binding, the index of its block.
    dataflow : list of bool
        Per block, is it a dataflow block.
    dataflow_var : list of bool
        Per binding, is its Var a ``DataflowVar`` (one a dataflow block keeps to itself).
    kind : list of ValueKind
        Per binding, what its value is.
    op : list of int
        Per binding, its operator as an index into :attr:`ops` (``-1``: not an operator
        call).
    item : list of int
        Per binding, the index a tuple-get reads (``-1`` otherwise).
    arg_start, args : list of int
        The argument codes of binding ``i`` are ``args[arg_start[i]:arg_start[i + 1]]``:
        a call's arguments, a tuple's fields, the tuple a tuple-get reads, the Var a Var
        binding copies, the value a MatchCast casts.  A code ``>= 0`` is a binding
        index; below zero see :data:`ARG_CONSTANT`, :data:`ARG_LEAF`, :data:`ARG_TUPLE`,
        :data:`ARG_FREE` and :func:`param_code`.
    uses, param_uses : list of int
        How many reads of each binding's Var (of each parameter) the bindings and the
        function's result make, tuple literals' fields included.
    dtype : list of int
        Per binding, the dtype of its tensor value as an index into :attr:`dtypes`
        (``-1``: not a tensor, or no dtype).
    rank : list of int
        Per binding, the rank of its tensor value (``-1``: unknown,
        :data:`NOT_TENSOR`: not a tensor).
    dims_start, dims : list of int
        Binding ``i``'s dims are ``dims[dims_start[i]:dims_start[i + 1]]``, with
        :data:`SYMBOLIC` for a dim that is not a static integer.
    ops : list of str
        The operator table, in order of first use.
    dtypes : list of str
        The dtype table, in order of first use.
    result : int
        The argument code of the function's result.
    """

    var: list[int]
    block: list[int]
    dataflow: list[bool]
    kind: list[ValueKind]
    op: list[int]
    item: list[int]
    arg_start: list[int]
    args: list[int]
    uses: list[int]
    param_uses: list[int]
    dtype: list[int]
    rank: list[int]
    dims_start: list[int]
    dims: list[int]
    ops: list[str]
    dtypes: list[str]
    result: int
    dataflow_var: list[bool]

    def __len__(self) -> int:
        """The number of bindings."""
        return len(self.var)

    def args_of(self, i: int) -> list[int]:
        """The argument codes of binding ``i``."""
        return self.args[self.arg_start[i]:self.arg_start[i + 1]]

    def op_name(self, i: int) -> str | None:
        """The operator binding ``i`` calls (``"relax.add"``), or ``None``."""
        op = self.op[i]
        return self.ops[op] if op >= 0 else None

    def shape(self, i: int) -> tuple[int, ...] | None:
        """The dims of binding ``i``'s tensor (:data:`SYMBOLIC` where not static), or
        ``None`` when it is not a tensor or its rank is unknown.
        """
        if self.rank[i] < 0:
            return None
        return tuple(self.dims[self.dims_start[i]:self.dims_start[i + 1]])

    def dtype_name(self, i: int) -> str | None:
        """The dtype text of binding ``i``'s tensor (``"float32"``), or ``None``."""
        d = self.dtype[i]
        return self.dtypes[d] if d >= 0 else None


def as_snapshot(raw: dict[str, Any]) -> FunctionSnapshot:
    """A :class:`FunctionSnapshot` from a reader's fields (the kinds made enums)."""
    kinds = list(ValueKind)
    raw["kind"] = [kinds[k] for k in raw["kind"]]
    return FunctionSnapshot(**raw)
