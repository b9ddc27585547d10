"""Read the equation back out of a TIR einsum: the PrimFunc ``topi.einsum`` generates.

``from_onnx`` (TVM 0.27) imports an ONNX ``Einsum`` with ``bb.emit_te(topi.einsum,
equation, *inputs)``: the Relax graph holds ``R.call_tir(einsum, (a, b), out_ty=...)``
and the equation survives only in the PrimFunc's body, which for two operands is one
reduction block under one loop per block variable::

    for ax0, ax1, ax2, ax3, d in T.grid(...):
        with T.sblock("T_einsum"):
            v_ax0, v_ax1, v_ax2, v_ax3, v_d = T.axis.remap("SSSSR", [ax0, ax1, ax2, ax3, d])
            with T.init():
                out[v_ax0, v_ax1, v_ax2, v_ax3] = T.float32(0.0)
            out[v_ax0, v_ax1, v_ax2, v_ax3] = (out[v_ax0, v_ax1, v_ax2, v_ax3]
                                               + a[v_ax0, v_ax1, v_ax2, v_d]
                                               * b[v_ax0, v_ax1, v_ax3, v_d])

Each block variable is one label of the equation (the spatial ones the output's, the
reduction ones the summed labels), so the subscripts of each buffer access spell that
operand's labels: here ``"abce,abde->abcd"``, ``"bhqd,bhkd->bhqk"`` up to renaming.

:func:`equation_of` proves that shape and nothing looser, raising :class:`Unfit` with
the reason otherwise: anything but one block of a sum of products of the two inputs
(more operands, a cast, a bias, another initial value), a subscript that is not a plain
block variable (a broadcast axis reads index 0, a window reads ``v_i + v_k``), a label
repeated within one operand (a diagonal), a summed label neither operand reads, a
buffer whose extent is not its label's loop extent, loops that do not bind the block
variables one to one.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import tvm

from patternkit.ir import prove_equal

__all__ = ["Unfit", "TirEinsum", "equation_of"]

_LETTERS = string.ascii_lowercase
#: An element read from a buffer parameter (``.source``, ``.indices``).
_LOAD = tvm.ir.expr.TensorLoad


class Unfit(Exception):
    """Why a PrimFunc is not a two-operand einsum (the rule's refusal reason)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class TirEinsum:
    """What a TIR einsum computes: ``equation`` over its two inputs, in ``dtype``."""

    equation: str
    dtype: str


def equation_of(func: Any, name: str) -> TirEinsum:
    """The einsum ``func`` (a PrimFunc called ``name``) computes; :class:`Unfit` if none."""
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise Unfit(f"{name} is a {type(func).__name__}, not a PrimFunc")
    params = list(func.params)
    if len(params) != 3 or any(getattr(p, "shape", None) is None for p in params):
        raise Unfit(f"the PrimFunc {name} takes {len(params)} parameters, not two input "
                    f"buffers and an output: not a two-operand einsum")
    a, b, out = params
    block, loops = _the_block(func.body, name)
    labels = _labels(block, loops, name)
    store = block.body
    _is_store_to(store, out, name, "its body")
    summed = block.init is not None  # an einsum without a summed label has no init
    if summed:
        _is_store_to(block.init, out, name, "its initial value")
        if not _is_zero(block.init.value):
            raise Unfit(f"the PrimFunc {name} starts its sum at {block.init.value}, not 0")
        if not _same(block.init.indices, store.indices):
            raise Unfit(f"the PrimFunc {name} initialises another element than it sums")
    elif any(reduce for _, reduce in labels.values()):
        raise Unfit(f"the PrimFunc {name} has reduction variables but no initial value")
    out_subscripts = _subscripts(store.indices, labels, "the output", name)
    a_subs, b_subs = _product(store, out, a, b, name, summed)
    spatial = [v for v, (_, reduce) in labels.items() if not reduce]
    if sorted(out_subscripts) != sorted(labels[v][0] for v in spatial):
        raise Unfit(f"the PrimFunc {name} writes out[{_text(store.indices)}]: not each "
                    f"spatial block variable once")
    a_subscripts = _subscripts(a_subs, labels, "the first operand", name)
    b_subscripts = _subscripts(b_subs, labels, "the second operand", name)
    for v, (label, reduce) in labels.items():
        if reduce and label not in a_subscripts + b_subscripts:
            raise Unfit(f"the PrimFunc {name} sums over {v.name}, which neither operand "
                        f"reads")
    extents = {labels[v][0]: block_var.dom.extent
               for v, block_var in zip(labels, block.iter_vars)}
    for what, buffer, subs in (("first operand", a, a_subscripts),
                               ("second operand", b, b_subscripts),
                               ("output", out, out_subscripts)):
        for axis, (dim, label) in enumerate(zip(buffer.shape, subs)):
            if not prove_equal(dim, extents[label]):
                raise Unfit(f"the {what}'s axis {axis} has extent {dim}, its label's loop "
                            f"{extents[label]}: a broadcast, not an einsum of equal axes")
    dtypes = {str(buf.dtype) for buf in (a, b, out)}
    if len(dtypes) != 1:
        raise Unfit(f"the PrimFunc {name} mixes the dtypes {', '.join(sorted(dtypes))}: an "
                    f"einsum reads and writes one dtype")
    equation = (f"{''.join(a_subscripts)},{''.join(b_subscripts)}"
                f"->{''.join(out_subscripts)}")
    return TirEinsum(equation, str(out.dtype))


def _the_block(body: Any, name: str) -> tuple[Any, list[Any]]:
    """The one block under the root block's loop nest, and the loops around it."""
    root = body.block if isinstance(body, tvm.s_tir.SBlockRealize) else None
    if root is None or root.alloc_buffers or root.match_buffers:
        raise Unfit(f"the PrimFunc {name} is not one block under a root block without "
                    f"buffers of its own")
    loops = []
    stmt = root.body
    while isinstance(stmt, tvm.tirx.For):
        if stmt.kind != tvm.tirx.ForKind.SERIAL or not _is_zero(stmt.min):
            raise Unfit(f"the loop {stmt.loop_var.name} of {name} is not a plain serial "
                        f"loop from 0")
        loops.append(stmt)
        stmt = stmt.body
    if not isinstance(stmt, tvm.s_tir.SBlockRealize):
        raise Unfit(f"the PrimFunc {name} is not one block under its loops: found "
                    f"{type(stmt).__name__}")
    if not _is_true(stmt.predicate):
        raise Unfit(f"the block of {name} runs under the predicate {stmt.predicate}")
    for value, loop in zip(stmt.iter_values, loops):
        if not value.same_as(loop.loop_var):
            break
    else:
        if len(stmt.iter_values) == len(loops):
            return stmt.block, loops
    raise Unfit(f"the loops of {name} do not bind its block variables one to one, in order")


def _labels(block: Any, loops: list[Any], name: str) -> dict[Any, tuple[str, bool]]:
    """Block variable -> (its label, is it summed over); the extents checked on the way."""
    if len(block.iter_vars) > len(_LETTERS):
        raise Unfit(f"the PrimFunc {name} has {len(block.iter_vars)} block variables: more "
                    f"labels than an equation has letters")
    labels = {}
    for letter, (iv, loop) in zip(_LETTERS, zip(block.iter_vars, loops)):
        if iv.iter_type not in (iv.DataPar, iv.CommReduce):
            raise Unfit(f"the block variable {iv.var.name} of {name} is neither spatial nor "
                        f"a reduction")
        if not _is_zero(iv.dom.min) or not prove_equal(iv.dom.extent, loop.extent):
            raise Unfit(f"the block variable {iv.var.name} of {name} ranges over "
                        f"{iv.dom}, its loop over [0, {loop.extent})")
        labels[iv.var] = (letter, iv.iter_type == iv.CommReduce)
    return labels


def _is_store_to(store: Any, out: Any, name: str, what: str) -> None:
    if not isinstance(store, tvm.tirx.BufferStore) or not store.buffer.same_as(out):
        raise Unfit(f"{what} of the block of {name} is not one store to its output")


def _product(store: Any, out: Any, a: Any, b: Any, name: str,
             summed: bool) -> tuple[Any, Any]:
    """The subscripts of ``a`` and ``b`` in ``out[i] = out[i] + a[...] * b[...]`` (or
    ``out[i] = a[...] * b[...]`` when nothing is ``summed``).
    """
    term = store.value
    if summed:
        if not isinstance(term, tvm.tirx.Add):
            raise Unfit(f"the block of {name} stores {term}, not a running sum")
        acc, term = term.a, term.b
        if not (isinstance(acc, _LOAD) and acc.source.same_as(out)
                and _same(acc.indices, store.indices)):
            raise Unfit(f"the block of {name} adds {term} to {acc}, not to the element it "
                        f"stores")
    if isinstance(term, tvm.tirx.Cast) or any(isinstance(side, tvm.tirx.Cast)
                                              for side in _factors(term)):
        raise Unfit(f"the block of {name} casts inside its product ({term}): an einsum "
                    f"reads its operands as they are")
    if not isinstance(term, tvm.tirx.Mul):
        raise Unfit(f"the block of {name} computes {term}, not a product of its operands")
    if isinstance(term.a, tvm.tirx.Mul) or isinstance(term.b, tvm.tirx.Mul):
        raise Unfit(f"the block of {name} multiplies more than two operands ({term}): "
                    f"only two-operand einsums are read")
    lhs, rhs = term.a, term.b
    if not (isinstance(lhs, _LOAD) and lhs.source.same_as(a)
            and isinstance(rhs, _LOAD) and rhs.source.same_as(b)):
        raise Unfit(f"the block of {name} computes {term}: not the first input times the "
                    f"second")
    return lhs.indices, rhs.indices


def _factors(term: Any) -> list[Any]:
    return [term.a, term.b] if isinstance(term, tvm.tirx.Mul) else []


def _subscripts(indices: Any, labels: dict[Any, tuple[str, bool]], what: str,
                name: str) -> list[str]:
    """The labels of ``indices``: each must be a block variable, none repeated."""
    out: list[str] = []
    for axis, index in enumerate(indices):
        found = labels.get(index) if isinstance(index, tvm.tirx.Var) else None
        if found is None:
            raise Unfit(f"{what} of {name} is read at {index} on axis {axis}: not a plain "
                        f"loop variable (a broadcast axis, an offset or a stride)")
        if found[0] in out:
            raise Unfit(f"{what} of {name} repeats the label of {index} (a diagonal): "
                        f"not read")
        out.append(found[0])
    return out


def _same(indices: Any, others: Any) -> bool:
    """The same index expressions, by identity (``==`` on TIR expressions builds one)."""
    return len(indices) == len(others) and all(i.same_as(o) for i, o in zip(indices, others))


def _is_zero(expr: Any) -> bool:
    return isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)) and expr.value == 0


def _is_true(expr: Any) -> bool:
    return isinstance(expr, tvm.tirx.IntImm) and expr.value == 1


def _text(indices: Any) -> str:
    return ", ".join(str(i) for i in indices)
