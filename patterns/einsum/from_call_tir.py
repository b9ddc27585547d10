"""``einsum.from_call_tir``: ``from_onnx``'s ``call_tir`` of ``topi.einsum``, back to ``R.einsum``.

An ONNX ``Einsum`` reaches Relax as ``R.call_tir(einsum, (a, b), out_ty=...)``: the
equation is gone into a PrimFunc, which no pattern reads, so attention written with
``torch.einsum`` and exported to ONNX stays a ``call_tir``, a softmax and a
``call_tir``.  This rule reads the PrimFunc the call names (from the module the
rewrite runs on, :func:`patternkit.engine.current_module`), proves it is the one
reduction block ``topi.einsum`` generates for two operands, recovers the equation from
its subscripts (:mod:`.tir`) and writes the call as the operator it was::

    R.call_tir(einsum, (q, k), out_ty=R.Tensor((b, h, s, s)))
        ->  R.einsum((q, k), "abce,abde->abcd")          # "bhqd,bhkd->bhqk"

Bit-exact: ``R.einsum`` legalises to the same ``topi.einsum``.  Refused with the reason
(at the ``call_tir``): a callee the module does not define (a rewrite of a lone
function), a PrimFunc that is not a two-operand einsum (see :mod:`.tir`: more operands,
a cast inside, a subscript that is not a plain loop variable, a broadcast axis, a
diagonal), operands whose shapes or dtype are not the PrimFunc's, an ``R.einsum`` whose
result type would not be the call's.  Only callees named as ``emit_te`` names
``topi.einsum`` (``einsum``, ``einsum1``, ...) are looked at.
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm
from tvm import relax

from patternkit.dpl import DFPattern, is_gv, is_op, wildcard
from patternkit.engine import EXACT, RewriteRule, RoleMatch, Tolerance, current_module, reject
from patternkit.ir import call_args, prove_equal, same_shape, static_shape, type_of

from .examples import onnx_einsum
from .tir import TirEinsum, Unfit, equation_of


class EinsumFromCallTir(RewriteRule):
    """Lift ``from_onnx``'s ``call_tir`` of ``topi.einsum`` back into ``R.einsum``."""

    name = "einsum.from_call_tir"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.callee = is_gv("einsum")
        self.operands = wildcard()
        self.pattern: DFPattern = is_op("call_tir")(self.callee, self.operands)

    def check(self, match: RoleMatch) -> Any:
        """The :class:`~.tir.TirEinsum` the callee computes, or the reason it is none."""
        try:
            return self._einsum(match)
        except Unfit as unfit:
            return reject(unfit.reason, at=match.root)

    def _einsum(self, match: RoleMatch) -> TirEinsum:
        gv = match.callee
        mod = current_module()
        if mod is None or gv not in mod.functions:
            raise Unfit(f"the module being rewritten does not define {gv.name_hint} (a lone "
                        f"function was given): its body cannot be read")
        operands = match.operands
        if not isinstance(operands, relax.Tuple) or len(operands.fields) != 2:
            count = len(operands.fields) if isinstance(operands, relax.Tuple) else "unknown"
            raise Unfit(f"the call_tir passes {count} operands to {gv.name_hint}: only "
                        f"two-operand einsums are read")
        found = equation_of(mod[gv], gv.name_hint)
        bound: list[tuple[Any, Any]] = []
        for operand, param in zip(operands.fields, mod[gv].params):
            if not _binds(type_of(operand), param, bound):
                raise Unfit(f"the operand {operand} is a {type_of(operand)}: not the "
                            f"PrimFunc's {param.dtype} buffer of shape {list(param.shape)}")
        lifted = relax.BlockBuilder().normalize(self._lifted(operands, found))
        call_ty = type_of(match.root)
        if str(type_of(lifted).dtype) != str(call_ty.dtype) or not same_shape(
                static_shape(type_of(lifted)), static_shape(call_ty)):
            raise Unfit(f"R.einsum({found.equation!r}) gives a {type_of(lifted)}, the "
                        f"call_tir a {call_ty}")
        return found

    @staticmethod
    def _lifted(operands: Any, found: TirEinsum) -> Any:
        return relax.op.einsum(relax.Tuple(list(operands.fields)), found.equation)

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.einsum((a, b), equation)``."""
        return self._lifted(call_args(match.root)[1], match.plan)

    def tolerance(self, dtype: str | None) -> Tolerance:
        """Exact: ``R.einsum`` legalises to the same ``topi.einsum`` PrimFunc."""
        return EXACT

    def example(self, **knobs: Any) -> tvm.IRModule:
        """:func:`~.examples.onnx_einsum` with ``knobs``."""
        return onnx_einsum(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Attention's two einsums and other two-operand ones, both dtypes, symbolic
        batch and sequence; broadcast and non-einsum bodies (refused).
        """
        return {"equation": ("bhsd,bhkd->bhsk", "bhsk,bhkd->bhsd", "bshd,bkhd->bhsk",
                             "bij,bjk->bik", "ij,jk->ik", "bi,bj->bij", "bsd,d->bs"),
                "dtype": ("float32", "float16"), "shape": ("static", "symbolic"),
                "broadcast": (False, True)}


def _binds(ty: Any, param: Any, bound: list[tuple[Any, Any]]) -> bool:
    """Does an operand of type ``ty`` fill the buffer ``param``?  Its symbolic extents
    (the PrimFunc's own variables) are bound in ``bound`` (variable, extent) on the way.
    """
    shape = static_shape(ty)
    if str(ty.dtype) != str(param.dtype) or shape is None or len(shape) != len(param.shape):
        return False
    for dim, extent in zip(param.shape, shape):
        if tvm.ir.is_prim_var(dim):  # a PrimFunc variable: bound by the first operand
            known = next((v for var, v in bound if var.same_as(dim)), None)
            if known is None:
                bound.append((dim, extent))
            elif not prove_equal(known, extent):
                return False
        elif not prove_equal(dim, extent):  # a constant, or an expression left unbound
            return False
    return True
