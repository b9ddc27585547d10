"""The pure-Python reader behind :func:`~patternkit.ir.snapshot.snapshot`.

Always available: it is what runs without a C++ compiler, with ``PATTERNKIT_NATIVE=0``,
or on an expression type the native walk does not know.  It walks the function once,
reading the same fields in the same order as ``walker.cc``, so both readers give the
same record; the tests compare them on zoo models and on random programs.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from ..compat import array_items, handle
from ..walk import CALL, CONSTANT, GET_ITEM, GLOBAL_VAR, KIND_OF, OP, TUPLE, VAR, expr_kind
from .model import (
    ARG_CONSTANT,
    ARG_FREE,
    ARG_LEAF,
    ARG_TUPLE,
    NOT_TENSOR,
    SYMBOLIC,
    ValueKind,
    param_code,
)
from .reading import RawRead

_TENSOR_TYPE = relax.TensorType
_VAR_BINDING = relax.VarBinding
_MATCH_CAST = relax.MatchCast
_DATAFLOW_BLOCK = relax.DataflowBlock
_DATAFLOW_VAR = relax.DataflowVar
_SHAPE_EXPR = relax.ShapeExpr
_INT_IMM = tvm.tirx.IntImm


def _kind(node: Any) -> int:
    return KIND_OF.get(type(node)) or expr_kind(node)


class _Walk:
    def __init__(self, params: list[Any]) -> None:
        self.bound: dict[int, int] = {handle(p): param_code(i) for i, p in enumerate(params)}
        self.uses: list[int] = []
        self.param_uses = [0] * len(params)
        self.free: list[tuple[int, Any]] = []

    def arg(self, node: Any, at: int, nested: list[bool]) -> int:
        kind = _kind(node)
        if kind is VAR:
            code = self.bound.get(handle(node))
            if code is None:
                self.free.append((at, node))
                return ARG_FREE
            if code >= 0:
                self.uses[code] += 1
            else:
                self.param_uses[param_code(0) - code] += 1
            return code
        if kind is CONSTANT:
            return ARG_CONSTANT
        if kind is TUPLE:
            for field in array_items(node.fields):
                self.arg(field, at, nested)
            return ARG_TUPLE
        if kind is CALL:
            nested[0] = True
        return ARG_LEAF


def read(func: relax.Function) -> RawRead | None:
    """The raw record of ``func`` (``None`` if its body is not a ``SeqExpr``)."""
    seq = func.body
    if type(seq) is not relax.SeqExpr:
        return None
    w = _Walk(array_items(func.params))
    var: list[int] = []
    dataflow_var: list[bool] = []
    block: list[int] = []
    dataflow: list[bool] = []
    kind: list[int] = []
    op: list[int] = []
    item: list[int] = []
    arg_start = [0]
    args: list[int] = []
    dtype: list[int] = []
    rank: list[int] = []
    dims_start = [0]
    dims: list[int] = []
    op_ids: dict[int, int] = {}
    ops: list[Any] = []
    dtype_ids: dict[int, int] = {}
    dtypes: list[Any] = []
    not_normal = -1
    index = 0
    for bi, blk in enumerate(array_items(seq.blocks)):
        dataflow.append(type(blk) is _DATAFLOW_BLOCK)
        for binding in array_items(blk.bindings):
            v = binding.var
            var.append(handle(v))
            dataflow_var.append(type(v) is _DATAFLOW_VAR)
            block.append(bi)
            w.uses.append(0)
            value_kind, op_id, item_index = ValueKind.OTHER, -1, -1
            nested = [False]
            if type(binding) is _VAR_BINDING:
                value = binding.value
                k = _kind(value)
                if k is CALL:
                    callee = value.op
                    ck = _kind(callee)
                    if ck is OP or ck is GLOBAL_VAR:
                        value_kind = ValueKind.OP_CALL if ck is OP else ValueKind.GLOBAL_CALL
                        if ck is OP:
                            key = handle(callee)
                            op_id = op_ids.get(key, -1)
                            if op_id < 0:
                                op_id = op_ids[key] = len(ops)
                                ops.append(callee)
                        for a in array_items(value.args):
                            args.append(w.arg(a, index, nested))
                elif k is TUPLE:
                    value_kind = ValueKind.TUPLE
                    for a in array_items(value.fields):
                        args.append(w.arg(a, index, nested))
                elif k is GET_ITEM:
                    value_kind = ValueKind.GET_ITEM
                    item_index = int(value.index)
                    args.append(w.arg(value.tuple_value, index, nested))
                elif k is CONSTANT:
                    value_kind = ValueKind.CONSTANT
                elif k is VAR:
                    value_kind = ValueKind.VAR
                    args.append(w.arg(value, index, nested))
            elif type(binding) is _MATCH_CAST:
                args.append(w.arg(binding.value, index, nested))
            if nested[0] and not_normal < 0:
                not_normal = index
            kind.append(value_kind)
            op.append(op_id)
            item.append(item_index)
            arg_start.append(len(args))
            ty = v.ty
            if type(ty) is _TENSOR_TYPE:
                prim = ty.dtype
                dtype_id = -1
                if prim is not None:
                    key = handle(prim)
                    dtype_id = dtype_ids.get(key, -1)
                    if dtype_id < 0:
                        dtype_id = dtype_ids[key] = len(dtypes)
                        dtypes.append(prim)
                dtype.append(dtype_id)
                ndim = int(ty.ndim)
                rank.append(ndim)
                shape = ty.shape
                if type(shape) is _SHAPE_EXPR:
                    for d in array_items(shape.values):
                        dims.append(d.value if type(d) is _INT_IMM else SYMBOLIC)
                else:
                    dims.extend([SYMBOLIC] * max(ndim, 0))
            else:
                dtype.append(-1)
                rank.append(NOT_TENSOR)
            dims_start.append(len(dims))
            w.bound[handle(v)] = index
            index += 1
    nested = [False]
    result = seq.body
    result_code = w.arg(result, -1, nested)
    return RawRead(
        fields=dict(var=var, block=block, dataflow=dataflow, kind=kind, op=op, item=item,
                    arg_start=arg_start, args=args, uses=w.uses, param_uses=w.param_uses,
                    dtype=dtype, rank=rank, dims_start=dims_start, dims=dims,
                    result=result_code, dataflow_var=dataflow_var),
        ops=ops, dtypes=dtypes, free=w.free, not_normal=not_normal,
        result_not_normal=nested[0] or _kind(result) is CALL)

