"""LegalizeOps with each distinct call legalised once: the checks' builds share kernels.

``relax.build`` starts by legalising every operator call into a ``call_tir`` of a TIR
kernel, in Python, one call at a time: 2,428 calls for the joint build of a 12-layer GPT-2,
most of them the same reshape, matmul or layer norm on the same shapes, layer after layer.
The block builder already keeps one kernel per distinct kernel; the work of making it
(TE compute, then ``create_prim_func``) is still done per call, 1.0 s of CPU.

:func:`pipeline` legalises the first call of each kind as TVM does, and gives each later
call of the same kind the first call's result with its own arguments.  "The same kind" is
decided by structural equality of the call with its variables renamed in order of
appearance: operator, attributes, non-variable arguments (constants by value, shapes) and
every type.  Only where that is all the legaliser can see is the result reused:

* every variable argument is a tensor with a static shape (a tuple or shape variable is
  looked through to its binding by some legalisers: those calls are legalised one by one);
* no type holds a symbolic dimension;
* the result is one ``call_tir`` whose arguments are the call's own variables or
  constants (a legaliser that emitted bindings of its own is not reused).

The module built is structurally equal to the one TVM's ``LegalizeOps`` gives
(``tests/patternkit/verification/test_legalize_once.py``); the sort, scan and sampling
operators are left to the pipeline's dispatch passes, as before.
"""

from __future__ import annotations

from typing import Any, Callable

import tvm
import tvm_ffi
from tvm import relax

from ..ir import compat as C

#: Operators the default pipeline dispatches before legalising (``DispatchSortScan``,
#: ``DispatchSampling``): left in place for them.
DISPATCHED = ("relax.bucketize", "relax.sort", "relax.argsort", "relax.topk",
              "relax.cumprod", "relax.cumsum", "relax.multinomial_from_uniform")

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def pipeline() -> tvm.transform.Pass:
    """TVM's default build pipeline with the legalisation done once per distinct call."""
    return tvm.transform.Sequential([legalize_once(), relax.get_pipeline("default")])


def legalize_once(counts: Reuse | None = None) -> tvm.transform.Pass:
    """A pass: ``LegalizeOps`` reusing each distinct call's legalisation (see the module).

    ``counts``, when given, is the table used (its ``made`` and ``reused`` counts).
    """

    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        table = Reuse() if counts is None else counts
        legalizers = {name: table.wrap(found) for name in _operators(mod)
                      if name not in DISPATCHED
                      and (found := tvm.ir.Op.get(name).get_attr("FLegalize")) is not None}
        return relax.transform.LegalizeOps(customize_legalize_map=legalizers,
                                           skip_ops=list(DISPATCHED))(mod)

    return C.module_pass(run, "LegalizeOpsOnce")


class Reuse:
    """The legalisations made so far in one module, by the call's structure.

    ``made`` counts the calls legalised by TVM's legaliser, ``reused`` the calls given an
    earlier result.
    """

    def __init__(self) -> None:
        self.table: dict[int, list[tuple[relax.Call, relax.Call]]] = {}
        self.made = 0
        self.reused = 0

    def wrap(self, legalize: Callable) -> Callable:
        """``legalize`` (a ``FLegalize`` function) answering repeated calls from the table."""

        def legalize_or_reuse(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
            variables = _tensor_variables(call)
            if variables is None:
                self.made += 1
                return legalize(bb, call)
            shape = _renamed(bb, call, variables)
            key = tvm_ffi.structural_hash(shape, map_free_vars=True)
            for earlier, result in self.table.get(key, ()):
                if tvm_ffi.structural_equal(earlier, shape, map_free_vars=True):
                    self.reused += 1
                    return _with_arguments(result, list(zip(earlier.args, call.args)))
            self.made += 1
            result = legalize(bb, call)
            if _reusable(result, variables):
                mapping = list(zip(call.args, shape.args))
                self.table.setdefault(key, []).append((shape, _with_arguments(result, mapping)))
            return result

        return legalize_or_reuse


def _operators(mod: tvm.IRModule) -> set[str]:
    names: set[str] = set()

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            names.add(expr.op.name)

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return names


def _tensor_variables(call: relax.Call) -> list | None:
    """The call's variable arguments, each once, or ``None`` when the call's result may
    depend on more than the types and values it shows (see the module docstring).
    """
    found: list = []
    for arg in call.args:
        if isinstance(arg, relax.Var):
            if not isinstance(arg.ty, relax.TensorType) or relax.analysis.tir_vars_in_type(arg.ty):
                return None
            if not any(arg.same_as(seen) for seen in found):
                found.append(arg)
        elif isinstance(arg, relax.ShapeExpr):
            if not all(isinstance(d, tvm.tirx.IntImm) for d in arg.values):
                return None
        elif not isinstance(arg, tvm.ir.GenericConst):
            return None
    if any(relax.analysis.tir_vars_in_type(t) for t in call.ty_args):
        return None
    if call.ty is None or relax.analysis.tir_vars_in_type(call.ty):
        return None
    return found


def _renamed(bb: relax.BlockBuilder, call: relax.Call, variables: list) -> relax.Call:
    """``call`` with each variable argument replaced by a fresh one of its type, in order
    (one argument per position: ``add(x, x)`` stays two uses of one variable).
    """
    fresh = [relax.Var(f"arg{i}", var.ty) for i, var in enumerate(variables)]

    def renamed(arg: Any) -> Any:
        for var, new in zip(variables, fresh):
            if arg.same_as(var):
                return new
        return arg

    return bb.normalize(relax.Call(call.op, [renamed(a) for a in call.args], call.attrs,
                                   call.ty_args))


def _reusable(result: Any, variables: list) -> bool:
    """Whether ``result`` is one ``call_tir`` reading only ``variables`` and constants."""
    if not (isinstance(result, relax.Call) and result.op.same_as(_CALL_TIR)
            and isinstance(result.args[1], relax.Tuple)):
        return False
    for arg in result.args[1].fields:
        if isinstance(arg, relax.Var):
            if not any(arg.same_as(var) for var in variables):
                return False
        elif not isinstance(arg, tvm.ir.GenericConst):
            return False
    return not any(relax.analysis.free_vars(extra) for extra in result.args[2:])


def _with_arguments(result: relax.Call, mapping: list[tuple[Any, Any]]) -> relax.Call:
    """``result`` (a :func:`_reusable` ``call_tir``) reading ``new`` for each of its
    variable arguments ``old`` of the ``(old, new)`` pairs in ``mapping``.
    """

    def moved(arg: Any) -> Any:
        if isinstance(arg, relax.Var):
            for old, new in mapping:
                if arg.same_as(old):
                    return new
        return arg

    fields = relax.Tuple([moved(a) for a in result.args[1].fields])
    return relax.Call(result.op, [result.args[0], fields, *result.args[2:]], result.attrs,
                      result.ty_args)
