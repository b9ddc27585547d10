"""Symbolic shape variables across a function boundary, in both directions.

Relax requires every function of a module to define its own symbolic variables: two
global functions that share one ``n`` are not well formed ("Var n is defined in both
function f and function main").  So moving code across a function boundary means
renaming symbolic variables.

Inlining (:class:`SymbolicBinder`)
    A fused function with symbolic shapes (``x: R.Tensor(("n", 8))``) defines its own
    ``n``.  Inlined into a caller where the argument has type ``R.Tensor((m * 2, 8))``,
    every ``n`` in the callee's body must become ``m * 2``, or the caller is left with an
    undefined symbolic variable (what ``InlinePrivateFunctions`` does).  The values are
    read off the argument types; the callee is then rewritten once per distinct binding,
    with one callee-sized ``bind_symbolic_vars`` call, and cached.
Outlining (:func:`detach_symbolic_vars`)
    A local function lifted to a global one (``PartitionGraph`` lifting composites) gets
    what ``FuseOps``/``FuseOpsByPattern`` give every function they create: a trailing
    ``tir_vars: R.Shape([...])`` parameter for the symbolic variables it uses but its
    parameters do not define, and fresh symbolic variables throughout.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from ..errors import MalformedIRError
from ..ir import compat as C
from ..ir.rebuild import binding_text

__all__ = ["SymbolicBinder", "bind_symbolic_vars", "detach_symbolic_vars", "match_symbolic",
           "signature_symbolic_vars"]


class SymbolicBinder:
    """Rewrites callees for call sites, with per-callee caches for one DefuseOps run."""

    def __init__(self):
        self._symvars: dict = {}  # id(func) -> (func, its symbolic vars); func keeps id valid
        self._bound: dict = {}    # (id(func), values) -> func with the values bound

    def bind(self, func: relax.Function, args: list, where: str, var: Any,
             call: Any) -> relax.Function:
        """``func`` with its symbolic variables replaced by what the call's ``args`` imply.

        ``where`` (the calling function), ``var`` and ``call`` name the call site in the
        error raised when a variable cannot be inferred.
        """
        key = id(func)
        entry = self._symvars.get(key)
        if entry is None:
            entry = self._symvars[key] = (func, signature_symbolic_vars(func))
        symvars = entry[1]
        if not symvars:
            return func
        smap: dict = {}
        for param, arg in zip(func.params, args):
            if tvm.ir.is_prim_var(param):
                # a scalar symbolic parameter (FuseOps' lifted ``tir_vars``): the argument
                # is the caller's PrimExpr itself
                smap.setdefault(param, arg)
            else:
                match_symbolic(param.ty, C.type_of(arg), smap)
        missing = [v.name for v in symvars if v not in smap]
        if missing:
            raise MalformedIRError(
                f"DefuseOps: {where}: cannot infer the symbolic variable(s) {missing} of the "
                f"callee from the arguments of {binding_text(var, call)}")
        smap = {v: smap[v] for v in symvars}
        if all(v.same_as(e) for v, e in smap.items()):
            return func
        values = tuple(_cache_key(e) for e in smap.values())
        cache_key = (key, values) if all(k is not None for k in values) else None
        if cache_key is not None and cache_key in self._bound:
            return self._bound[cache_key]
        bound = bind_symbolic_vars(func, smap)
        if cache_key is not None:
            self._bound[cache_key] = bound
        return bound


def signature_symbolic_vars(func: relax.Function) -> list:
    """The symbolic variables ``func``'s parameters define, in order of first appearance.

    These, and only these, a call site must supply.  A variable that the body defines
    itself is left alone: one that a nested local function's parameters define (the
    composites ``MergeCompositeFunctions`` nests in a ``Codegen`` function, each with its
    own fresh ``n``) is bound when that nested call is inlined in turn, and one that a
    ``match_cast`` defines is defined again by the inlined ``match_cast``.
    ``relax.analysis.defined_symbolic_vars`` counts all three, so asking the arguments for
    all of them fails on every ``MergeCompositeFunctions`` output with a symbolic shape.
    """
    found: list = []
    seen: set = set()
    for param in func.params:
        if tvm.ir.is_prim_var(param):
            defined = [param]
        else:
            defined = relax.analysis.definable_tir_vars_in_type(param.ty)
        for var in defined:
            if var not in seen:
                seen.add(var)
                found.append(var)
    return found


def _dims(shape: Any) -> list | None:
    if shape is None:
        return None
    values = getattr(shape, "values", None)
    return list(values) if values is not None else None


def match_symbolic(param_ty: Any, arg_ty: Any, smap: dict) -> None:
    """Record ``callee symbolic var -> caller PrimExpr`` from a parameter and argument type."""
    if isinstance(param_ty, relax.TensorType):
        pdims = _dims(param_ty.shape)
        adims = _dims(arg_ty.shape) if isinstance(arg_ty, relax.TensorType) else None
    elif isinstance(param_ty, relax.ShapeType):
        pdims = _dims(param_ty)
        adims = _dims(arg_ty) if isinstance(arg_ty, relax.ShapeType) else None
    elif isinstance(param_ty, relax.TupleType):
        if isinstance(arg_ty, relax.TupleType):
            for p, a in zip(param_ty.fields, arg_ty.fields):
                match_symbolic(p, a, smap)
        return
    else:
        value = getattr(param_ty, "value", None)
        if value is not None and tvm.ir.is_prim_var(value) and value not in smap:
            arg_value = getattr(arg_ty, "value", None)
            if arg_value is not None:
                smap[value] = arg_value
        return
    if pdims is None or adims is None or len(pdims) != len(adims):
        return
    for p, a in zip(pdims, adims):
        if tvm.ir.is_prim_var(p) and p not in smap:
            smap[p] = a


def bind_symbolic_vars(func: relax.Function, smap: dict) -> relax.Function:
    """``func.bind_symbolic_vars(smap)``, also when the new expressions use caller vars the
    callee cannot define (a scalar ``T.int64`` parameter bound to the caller's ``m``).

    The C++ binder insists the result defines every symbolic var it uses.  A trailing
    ``R.Shape([caller vars])`` parameter defines them; it is dropped again by
    :class:`~patternkit.fusion.templates.CalleeTemplate`, which only reads the parameters
    the call passes.
    """
    caller_vars = []
    seen = set()
    for expr in smap.values():
        found = [expr] if tvm.ir.is_prim_var(expr) else list(
            tvm.tirx.analysis.undefined_vars(expr))
        for v in found:
            if v not in seen:
                seen.add(v)
                caller_vars.append(v)
    if not caller_vars:
        return func.bind_symbolic_vars(smap)
    holder = relax.Var("defuse_symbolic_defs", relax.ShapeType(caller_vars))
    wrapped = relax.Function(list(func.params) + [holder], func.body, func.ret_ty,
                             func.is_pure, func.attrs, func.span)
    return wrapped.bind_symbolic_vars(smap)


def _cache_key(value: Any) -> Any:
    """A hashable stand-in for a bound value: the var itself or an int's (dtype, value);
    ``None`` for an expression (such a binding is not cached).
    """
    if tvm.ir.is_prim_var(value):
        return value
    if isinstance(value, tvm.tirx.IntImm):
        return (str(value.dtype), int(value))
    return None


def detach_symbolic_vars(func: relax.Function, *,
                         rename: bool = True) -> tuple[relax.Function, list]:
    """``func`` made fit to be a global function of the module it was local to.

    Returns ``(function, extra_arguments)``: the function with a trailing ``tir_vars:
    R.Shape([...])`` parameter when it uses symbolic variables its parameters do not
    define (a composite whose input is ``(n * 4,)`` and whose output is ``(n, 4)``), and
    fresh symbolic variables throughout; and the arguments each call site must append
    (``[R.shape([n])]``, or nothing).  This is what ``FuseOps`` and ``FuseOpsByPattern``
    do to the functions they create (``tir_vars`` and ``SymbolicVarRenewMutator`` in
    TVM's ``fuse_ops.cc``), so :func:`patternkit.fusion.defuse` inverts it the same way.

    With ``rename=False`` the symbolic variables keep their identity: for a function
    that stays local, which may share them with the function it is nested in (renaming
    also re-simplifies every type, ``n * 2 * 16`` becoming ``n * 32``, which a caller
    comparing types structurally would take for a different type).
    """
    free = list(relax.analysis.free_symbolic_vars(func))
    extra: list = []
    if free:
        holder = relax.Var("tir_vars", relax.ShapeType(free))
        func = relax.Function(list(func.params) + [holder], func.body, func.ret_ty,
                              func.is_pure, func.attrs, func.span)
        extra.append(relax.ShapeExpr(free))
    defined = relax.analysis.defined_symbolic_vars(func) if rename else []
    if not defined:
        return func, extra
    fresh = {var: tvm.tirx.Var(var.name, var.ty) for var in defined}
    return func.bind_symbolic_vars(fresh), extra
