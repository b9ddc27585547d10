"""Callee templates: a fused function read into Python once, instantiated per call site.

Inlining one call site means rebuilding every binding of the callee with the parameters
replaced by the call's arguments and every bound Var replaced by a fresh one.  Reading
the callee through the FFI at each call site would cost a dozen FFI calls per binding;
a :class:`CalleeTemplate` reads it once, and instantiating it costs the handful of FFI
constructor calls that build the new nodes (each with its type already known, so
nothing is re-inferred).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from ..errors import MalformedIRError
from ..ir.compat import array_items, new_call, new_tuple
from ..ir.walk import CALL, FUNCTION, GET_ITEM, LEAF_KINDS, TUPLE, VAR, expr_kind, substitute

__all__ = ["BindingTemplate", "CallTemplate", "CalleeTemplate", "GetItemTemplate", "LeafTemplate",
           "OpaqueTemplate", "TupleTemplate", "VarTemplate", "compile_value"]


@dataclass(frozen=True, slots=True)
class VarTemplate:
    """A Var of the callee: the parameter's argument or the binding's fresh Var."""

    var: Any

    def instantiate(self, mapping: dict) -> Any:
        """The Var this one maps to, or the Var itself when unmapped."""
        return mapping.get(self.var, self.var)


@dataclass(frozen=True, slots=True)
class LeafTemplate:
    """A constant, operator, global or shape literal: shared by every copy."""

    expr: Any

    def instantiate(self, mapping: dict) -> Any:
        """The leaf itself: constants and globals need no substitution."""
        return self.expr


@dataclass(frozen=True, slots=True)
class CallTemplate:
    """A call, rebuilt with its original type (``ty``) and attributes."""

    op: VarTemplate | LeafTemplate
    args: tuple
    attrs: Any
    ty_args: Any
    span: Any
    ty: Any

    def instantiate(self, mapping: dict) -> Any:
        """The call rebuilt over the instantiated callee and arguments."""
        args = [a.instantiate(mapping) for a in self.args]
        return new_call(self.ty, self.op.instantiate(mapping), args, self.attrs, self.ty_args,
                        self.span)


@dataclass(frozen=True, slots=True)
class TupleTemplate:
    """A tuple of templates, rebuilt field by field."""

    fields: tuple
    span: Any

    def instantiate(self, mapping: dict) -> Any:
        """The tuple rebuilt over its instantiated fields."""
        return new_tuple([f.instantiate(mapping) for f in self.fields], self.span)


@dataclass(frozen=True, slots=True)
class GetItemTemplate:
    """``t[index]``."""

    value: Any
    index: int
    span: Any

    def instantiate(self, mapping: dict) -> Any:
        """The projection rebuilt over its instantiated tuple."""
        return relax.TupleGetItem(self.value.instantiate(mapping), self.index, self.span)


@dataclass(frozen=True, slots=True)
class OpaqueTemplate:
    """A value not in A-normal form (a local function, an ``If``): substituted as a whole,
    a local function with fresh variables for each copy.
    """

    expr: Any
    is_function: bool

    def instantiate(self, mapping: dict) -> Any:
        """The expression with ``mapping`` substituted (functions copied)."""
        try:
            return substitute(self.expr, mapping, copy_functions=True)
        except MalformedIRError as err:
            raise MalformedIRError(
                f"DefuseOps: cannot inline a {type(self.expr).__name__} that captures "
                f"variables of the function being inlined; only A-normal-form bodies are "
                f"supported") from err


def compile_value(expr: Any, canon: dict) -> Any:
    """The template of an A-normal-form value.

    ``canon`` maps each Var already defined (parameters, earlier bindings) to the one
    Python wrapper of it that instantiation uses as a mapping key, so that those dict
    lookups hit by identity instead of falling back to the slow FFI ``__eq__``.
    """
    kind = expr_kind(expr)
    if kind is VAR:
        return VarTemplate(canon.get(expr, expr))
    if kind in LEAF_KINDS:
        return LeafTemplate(expr)
    if kind is CALL:
        op = expr.op
        op_tpl = VarTemplate(canon.get(op, op)) if expr_kind(op) is VAR else LeafTemplate(op)
        args = tuple(compile_value(a, canon) for a in array_items(expr.args))
        return CallTemplate(op_tpl, args, expr.attrs, expr.ty_args, expr.span, expr.ty)
    if kind is TUPLE:
        return TupleTemplate(tuple(compile_value(f, canon) for f in array_items(expr.fields)),
                             expr.span)
    if kind is GET_ITEM:
        return GetItemTemplate(compile_value(expr.tuple_value, canon), expr.index, expr.span)
    return OpaqueTemplate(expr, kind is FUNCTION)


@dataclass(frozen=True, slots=True)
class BindingTemplate:
    """One binding of the callee.

    Attributes
    ----------
    var : relax.Var
        The callee's Var (the mapping key its uses refer to).
    name, ty :
        Name and type of the fresh Var each copy binds.
    value : template
        The bound value.
    match_ty : relax type or None
        The type of a ``match_cast`` binding; ``None`` for a plain binding.
    is_result : bool
        The callee returns this Var: the copy binds the call site's own Var instead of
        a fresh one, so that no alias binding is left behind.
    may_call : bool
        The value may call a function that needs inlining too (a call through a Var or
        a global, or a local function whose calls may).
    """

    var: Any
    name: str
    ty: Any
    value: Any
    match_ty: Any
    is_result: bool
    may_call: bool

    @property
    def binds_function(self) -> bool:
        """Whether the binding's value is a local function (inlined, then dropped)."""
        return type(self.value) is OpaqueTemplate and self.value.is_function


class CalleeTemplate:
    """A callee read once: its parameters, bindings and result as templates.

    Parameters
    ----------
    func : relax.Function
        The callee, with a ``SeqExpr`` body.
    num_params : int
        How many leading parameters the call sites pass; a trailing parameter added to
        define symbolic variables (:func:`patternkit.fusion.symbolic.bind_symbolic_vars`)
        is not one of them.
    """

    __slots__ = ("params", "bindings", "result_is_bound", "result", "returns_tuple")

    def __init__(self, func: relax.Function, num_params: int):
        body = func.body
        self.params = list(func.params)[:num_params]
        result = body.body
        blocks = array_items(body.blocks)
        result_var = None
        if expr_kind(result) is VAR and blocks:
            last = array_items(blocks[-1].bindings)
            if last and last[-1].var.same_as(result):
                result_var = result
        canon = {v: v for v in self.params}
        bindings = []
        for block in blocks:
            for b in array_items(block.bindings):
                old = b.var
                value = compile_value(b.value, canon)
                canon[old] = old
                # only calls through a Var or a global, and local functions (whose
                # bodies may hold such calls), can need inlining themselves
                may_call = (type(value) is CallTemplate
                            and (type(value.op) is VarTemplate
                                 or (isinstance(value.op, LeafTemplate)
                                     and type(value.op.expr) is tvm.ir.GlobalVar)))
                bindings.append(BindingTemplate(
                    old, old.name, old.ty, value, b.ty if type(b) is relax.MatchCast else None,
                    result_var is not None and old.same_as(result_var),
                    may_call or (type(value) is OpaqueTemplate and value.is_function)))
        self.bindings = tuple(bindings)
        #: The callee returns the Var of its last binding (instead of a literal tuple).
        self.result_is_bound = result_var is not None
        self.result = compile_value(result, canon)
        self.returns_tuple = not self.result_is_bound and type(self.result) is TupleTemplate
