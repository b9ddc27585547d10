"""Einsums as ``from_onnx`` writes them (``call_tir`` of ``topi.einsum``) and as ``R.einsum``.

``from_onnx`` (TVM 0.27) converts ``Einsum`` with ``bb.emit_te(topi.einsum, equation,
*inputs)``; these builders do exactly that, so the PrimFuncs are the importer's (checked
against ``torch.onnx.export`` of ``torch.einsum`` attention through both exporters and
``from_onnx``: the same TIR, symbolic batch and sequence kept).  The negatives build the
PrimFuncs no einsum makes (a cast inside, another body) under the name ``einsum``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax, te, topi

#: Labels -> extents of the examples (``b``/``s`` symbolic with ``shape="symbolic"``).
_EXTENTS = {"b": 2, "h": 2, "q": 8, "k": 8, "d": 16, "i": 4, "j": 6, "l": 5, "s": 8}


def _symbolic() -> dict[str, Any]:
    """Fresh symbolic batch and sequence, shared by every tensor of one example."""
    return {"b": tvm.tirx.Var("batch", "int64"), "s": tvm.tirx.Var("seq", "int64")}


def _dims(labels: str, shape: str, symbolic: dict[str, Any]) -> tuple:
    return tuple(symbolic[c] if shape == "symbolic" and c in symbolic else _EXTENTS[c]
                 for c in labels)


def _operands(equation: str, dtype: str, shape: str, broadcast: bool) -> list[relax.Var]:
    """One parameter per operand of ``equation``; ``broadcast``: the first's axis 0 is 1."""
    inputs = equation.split("->")[0].split(",")
    symbolic = _symbolic()
    found = []
    for number, labels in enumerate(inputs):
        dims = _dims(labels, shape, symbolic)
        if broadcast and number == 0:
            dims = (1, *dims[1:])
        found.append(relax.Var("abcdefg"[number], relax.TensorType(dims, dtype)))
    return found


def onnx_einsum(equation: str = "bhqd,bhkd->bhqk", dtype: str = "float32",
                shape: str = "static", body: str = "einsum",
                broadcast: bool = False) -> tvm.IRModule:
    """``main(a, b)`` returning ``call_tir(einsum, (a, b))`` as ``from_onnx`` writes Einsum.

    Labels ``b`` and ``s`` are the symbolic batch and sequence with ``shape="symbolic"``.
    ``body``: ``"einsum"`` (``topi.einsum``, the importer's), ``"cast"`` (the product
    accumulated in float32 from casts of the operands), ``"add"`` (``topi.add`` named
    ``einsum``: no reduction).  ``broadcast``: the first operand's axis 0 has extent 1
    (``topi.einsum`` then reads it at index 0).
    """
    params = _operands(equation, dtype, shape, broadcast)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            if body == "einsum":
                out = bb.emit_te(topi.einsum, equation, *params)
            elif body == "cast":
                out = bb.emit_te(_widening_matmul, *params, primfunc_name_hint="einsum")
            else:
                out = bb.emit_te(topi.add, *params, primfunc_name_hint="einsum")
            result = bb.emit_output(out)
        bb.emit_func_output(result)
    return bb.get()


def _widening_matmul(a: te.Tensor, b: te.Tensor) -> te.Tensor:
    """``ij,jk->ik`` summed in float32 from casts of the operands (no einsum)."""
    k = te.reduce_axis((0, a.shape[1]), name="k")
    return te.compute((a.shape[0], b.shape[1]),
                      lambda i, j: te.sum(a[i, k].astype("float32") * b[k, j].astype("float32"),
                                          axis=k), name="T_einsum")


def onnx_einsum_attention(dtype: str = "float32", shape: str = "static",
                          layout: str = "bhqd") -> tvm.IRModule:
    """Attention ``einsum -> * scale -> softmax -> einsum`` as ``from_onnx`` imports
    ``torch.einsum`` attention exported to ONNX (``layout="bqhd"``: q, k, v BSNH).
    """
    first, second = {"bhqd": ("bhsd,bhkd->bhsk", "bhsk,bhkd->bhsd"),
                     "bqhd": ("bshd,bkhd->bhsk", "bhsk,bkhd->bshd")}[layout]
    dims = _dims(layout.replace("q", "s"), shape, _symbolic())
    q, k, v = (relax.Var(n, relax.TensorType(dims, dtype)) for n in "qkv")
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            scores = bb.emit_te(topi.einsum, first, q, k)
            scaled = bb.emit(relax.op.multiply(scores, relax.const(np.array(0.25, dtype))))
            p = bb.emit(relax.op.nn.softmax(scaled, axis=-1))
            out = bb.emit_output(bb.emit_te(topi.einsum, second, p, v))
        bb.emit_func_output(out)
    return bb.get()


def relax_einsum(equation: str = "bhqd,bhkd->bhqk", dtype: str = "float32",
                 shape: str = "static", broadcast: bool = False) -> tvm.IRModule:
    """``main(a, b)`` returning ``R.einsum((a, b), equation)``."""
    params = _operands(equation, dtype, shape, broadcast)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out: Any = bb.emit(relax.op.einsum(relax.Tuple(params), equation))
            result = bb.emit_output(out)
        bb.emit_func_output(result)
    return bb.get()
