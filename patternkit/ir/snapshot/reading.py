"""What a reader hands back, and the checks and text conversions both readers share.

The two readers (:mod:`.python_reader`, :mod:`.native`) only collect integers and the
few objects that need Python to name them (operators, dtypes, unbound Vars); turning
those into a :class:`~.model.FunctionSnapshot`, and refusing a function that is not
well formed or not normalised, happens once, here, so both paths fail the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from ...errors import MalformedIRError
from ..compat import array_items, op_info, var_name
from ..rebuild import describe_binding
from .model import FunctionSnapshot, as_snapshot

#: Advice for input that is not in A-normal form (as the engine gives it).
_NORMALIZE = "run relax.transform.Normalize() on the module first"


@dataclass
class RawRead:
    """A reader's output before the shared checks.

    Attributes
    ----------
    fields : dict
        The integer fields of :class:`~.model.FunctionSnapshot` (kinds as ints).
    ops, dtypes : list
        The operator and dtype objects, in order of first use.
    free : list of (int, Var)
        Reads of a Var neither bound before nor a parameter: the reading binding's index
        (``-1``: the function's result) and the Var.
    not_normal : int
        The first binding whose value nests a call, or ``-1``.
    result_not_normal : bool
        Does the function's result hold a call.
    """

    fields: dict[str, Any]
    ops: list[Any]
    dtypes: list[Any]
    free: list[tuple[int, Any]]
    not_normal: int
    result_not_normal: bool


def finish(raw: RawRead | None, func: relax.Function, func_name: str) -> FunctionSnapshot:
    """The snapshot of ``raw``, or the :class:`MalformedIRError` the function deserves."""
    where = f"snapshot: function '{func_name}'"
    if raw is None:
        raise MalformedIRError(f"{where} is not normalised: its body is a "
                               f"{type(func.body).__name__}, not a SeqExpr; {_NORMALIZE}")
    for at, var in raw.free:
        if tvm.ir.is_prim_var(var):  # a symbolic dimension, defined by the parameters' shapes
            continue
        if at < 0:
            raise MalformedIRError(f"{where} is not well formed: its result reads "
                                   f"'{var_name(var)}', which is not defined in it")
        raise MalformedIRError(
            f"{where} is not well formed: binding "
            f"'{describe_binding(func_name, _binding(func, at))}' reads '{var_name(var)}', "
            f"which is neither a parameter nor bound before it")
    if raw.not_normal >= 0:
        raise MalformedIRError(
            f"{where} is not normalised: binding "
            f"'{describe_binding(func_name, _binding(func, raw.not_normal))}' nests a call "
            f"in its value; {_NORMALIZE}")
    if raw.result_not_normal:
        raise MalformedIRError(f"{where} is not normalised: it returns a call instead "
                               f"of a Var; {_NORMALIZE}")
    fields = dict(raw.fields)
    fields["ops"] = [op_info(op)[0] for op in raw.ops]
    fields["dtypes"] = [str(prim) for prim in raw.dtypes]
    return as_snapshot(fields)


def _binding(func: relax.Function, at: int) -> Any:
    """The ``at``-th binding of ``func``, blocks flattened in order."""
    for blk in array_items(func.body.blocks):
        bindings = array_items(blk.bindings)
        if at < len(bindings):
            return bindings[at]
        at -= len(bindings)
    raise IndexError(at)
