"""Which integer inputs index a table, and how big the table is.

Random integer inputs are only meaningful inside the tables they index: an embedding's
token ids below its vocabulary size, BERT's token-type ids below 2.  An index out of
range is not an error TVM reports: ``take`` on the CPU reads whatever memory is there
(TVM warns it may segfault), so a comparison on such inputs proves nothing.  This
module follows each integer parameter through the bindings that keep its values
(casts, reshapes, broadcasts) to every ``take`` that uses it as indices, and gives

* :func:`index_tables`: parameter name -> the sizes of the axes it indexes, and
* :func:`out_of_bounds`: for concrete inputs, the reads that would leave a table.

Only values that reach ``take`` unchanged are followed; an index computed from an input
(``ids + offset``) is not, and its parameter keeps the caller's range.  One computed
index is followed: the wrap of negative indices that TVM's ONNX importer puts before
every ``Gather`` (``where(less(ids, 0), ids + n, ids)``), which is ``ids`` itself on the
non-negative values drawn here (a negative value is reported out of bounds all the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from tvm import relax

from ..ir import compat as C

# Ops whose result holds the same integer values as their first argument.
_VALUE_PRESERVING = frozenset({
    "relax.astype", "relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten",
    "relax.broadcast_to", "relax.permute_dims", "relax.wrap_param",
})


@dataclass(frozen=True)
class IndexedTable:
    """One ``take`` that reads a table with a parameter's values as indices."""

    param: str
    binding: str
    size: int | None  # the indexed axis' length; None when it is symbolic

    def __str__(self) -> str:
        return f"{self.param} indexes an axis of size {self.size} at {self.binding}"


def index_tables(func: relax.Function) -> dict[str, list[IndexedTable]]:
    """Integer parameter name -> every ``take`` reading a table with its values."""
    source: dict[object, str] = {}  # var -> the parameter whose values it holds
    for param in func.params:
        dtype = C.dtype_of(param.ty) or ""
        if dtype.startswith(("int", "uint")):
            source[param] = C.var_name(param)
    found: dict[str, list[IndexedTable]] = {}
    negative: dict[object, str] = {}  # var -> the parameter whose values it tests for < 0
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return found
    for block in body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                continue
            value = binding.value
            if isinstance(value, relax.Var) and value in source:
                source[binding.var] = source[value]
                continue
            name = C.op_name(value)
            if name is None or not value.args:
                continue
            if name in _VALUE_PRESERVING and value.args[0] in source:
                source[binding.var] = source[value.args[0]]
            elif name == "relax.less" and value.args[0] in source and _is_zero(value.args[1]):
                negative[binding.var] = source[value.args[0]]
            elif (name == "relax.where" and len(value.args) == 3 and value.args[2] in source
                  and negative.get(value.args[0]) == source[value.args[2]]):
                source[binding.var] = source[value.args[2]]  # the wrap of negative indices
            elif name == "relax.take" and len(value.args) > 1 and value.args[1] in source:
                param = source[value.args[1]]
                found.setdefault(param, []).append(
                    IndexedTable(param, C.var_name(binding.var), _axis_size(value)))
    return found


def _is_zero(expr) -> bool:
    """Is ``expr`` a scalar constant 0?"""
    if not C.is_constant(expr):
        return False
    value = C.const_to_numpy(expr)
    return value.size == 1 and value.reshape(()) == 0


def _axis_size(call) -> int | None:
    shape = C.static_shape(C.type_of(call.args[0]))
    if shape is None:
        return None
    axis = call.attrs.axis
    axis = len(shape) - 1 if axis is None else int(axis)
    size = shape[axis if axis >= 0 else axis + len(shape)]
    return size if isinstance(size, int) else None


def index_ranges(func: relax.Function) -> dict[str, tuple[int, int]]:
    """Parameter name -> ``(0, n)``, ``n`` the smallest static table size it indexes."""
    ranges = {}
    for param, tables in index_tables(func).items():
        sizes = [t.size for t in tables if t.size is not None]
        if sizes:
            ranges[param] = (0, min(sizes))
    return ranges


def out_of_bounds(func: relax.Function, inputs: Sequence[np.ndarray]) -> list[str]:
    """Why ``inputs`` would read outside a table, one line per offending ``take``; [] if none."""
    arrays: Mapping[str, np.ndarray] = {C.var_name(p): a for p, a in zip(func.params, inputs)}
    problems = []
    for param, tables in index_tables(func).items():
        values = np.asarray(arrays[param])
        if values.size == 0:
            continue
        low, high = int(values.min()), int(values.max())
        for table in tables:
            if table.size is not None and (low < 0 or high >= table.size):
                problems.append(f"input {param!r} holds values in [{low}, {high}] but indexes "
                                f"an axis of size {table.size} at {table.binding}")
    return problems
