"""``from_dpl``: a ``tvm.relax.dpl`` pattern as a patternkit pattern (the inverse of ``to_dpl``).

TVM's backend pattern tables (``tvm.relax.backend.pattern_registry``) are written in
``tvm.relax.dpl``.  :func:`from_dpl` turns such a pattern into the equivalent patternkit
pattern, node for node, so that patternkit's matcher and passes can run the table:

=======================================  ==============================================
``tvm.relax.dpl``                        patternkit
=======================================  ==============================================
``wildcard()``                           :class:`WildcardPattern`
``is_op(name)`` / ``is_expr(e)``         :class:`ExprPattern`
``p(*args, varg_default_wildcard=...)``  :class:`CallPattern` (same ``varg_default_wildcard``)
``is_const()``                           :class:`ConstantPattern`
``is_var`` / ``is_dfv`` / ``is_gv``      :class:`VarPattern` / :class:`DataflowVarPattern` /
                                         :class:`GlobalVarPattern` (name as a substring)
``ExternFuncPattern``                    :class:`ExternFuncPattern` (``is_call_dps_packed``)
``is_tuple`` / ``is_tuple_get_item``     :class:`TuplePattern` / :class:`TupleGetItemPattern`
                                         (index ``-1``, "any", becomes ``None``)
``p | q`` / ``p & q`` / ``~p``           :class:`AltPattern` / :class:`AndPattern` /
                                         :class:`NotPattern`
``has_attr`` / ``has_dtype`` /           :class:`AttrPattern` / :class:`DataTypePattern` /
``has_shape`` / ``has_ty``               :class:`ShapePattern` / :class:`TypePattern`
=======================================  ==============================================

``is_call_tir`` and ``is_call_dps_packed`` are calls of ``relax.call_tir`` /
``relax.call_dps_packed`` whose callee is a GlobalVar / ExternFunc pattern; they need
nothing else.  Kinds with no patternkit counterpart (``FunctionPattern``,
``UnorderedTuplePattern``, ``PrimArrPattern``) raise :class:`FromDplError` naming the
kind.  Shared sub-patterns stay shared (a diamond stays a diamond), and one
:class:`DplConverter` converts a pattern and its annotation patterns to the same objects,
which is how a TVM table's annotations become a patternkit entry's roles.
"""

from __future__ import annotations

from typing import Any, Callable

import tvm
from tvm.relax import dpl

from ..errors import PatternError
from ..ir import compat as C
from .pattern import (
    AltPattern,
    AndPattern,
    AttrPattern,
    CallPattern,
    ConstantPattern,
    DataflowVarPattern,
    DataTypePattern,
    DFPattern,
    ExprPattern,
    ExternFuncPattern,
    GlobalVarPattern,
    NotPattern,
    ShapePattern,
    TupleGetItemPattern,
    TuplePattern,
    TypePattern,
    VarPattern,
    WildcardPattern,
)

__all__ = ["from_dpl", "DplConverter", "FromDplError", "INEXPRESSIBLE_KINDS"]

#: ``tvm.relax.dpl`` node kinds patternkit has no counterpart for, and why.
INEXPRESSIBLE_KINDS = {
    "FunctionPattern": "a pattern over a function literal (its parameters and body)",
    "UnorderedTuplePattern": "a tuple whose fields may match in any order",
    "PrimArrPattern": "a bare array of PrimExpr (is_shape); match the tensor with "
                      "has_shape instead",
}


class FromDplError(PatternError):
    """A ``tvm.relax.dpl`` pattern uses a kind patternkit cannot express.

    Attributes
    ----------
    kind : str
        The ``tvm.relax.dpl`` class name of the offending node (``"FunctionPattern"``).
    """

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


class DplConverter:
    """Converts ``tvm.relax.dpl`` patterns, keeping one patternkit node per TVM node.

    Convert a table entry's pattern first and then its annotation patterns with the same
    converter: an annotation that is a sub-pattern of the pattern maps to the very node
    inside the converted pattern.
    """

    def __init__(self) -> None:
        self._memo: dict[int, DFPattern] = {}

    def convert(self, pattern: Any) -> DFPattern:
        """The patternkit pattern equivalent to ``pattern``; raises :class:`FromDplError`."""
        if not isinstance(pattern, dpl.DFPattern):
            raise PatternError(f"from_dpl expects a tvm.relax.dpl pattern, found "
                               f"{type(pattern).__name__}: {pattern!r:.80}")
        key = C.handle(pattern)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._convert_node(pattern)
        return found

    def _convert_node(self, pattern: Any) -> DFPattern:
        kind = type(pattern).__name__
        handler = _HANDLERS.get(type(pattern))
        if handler is None:
            reason = INEXPRESSIBLE_KINDS.get(kind, "a pattern kind patternkit does not know")
            raise FromDplError(f"tvm.relax.dpl.{kind} ({reason}) cannot be expressed as a "
                               f"patternkit pattern: {_short(pattern)}", kind)
        return handler(self, pattern)

    # -- node kinds ----------------------------------------------------------------------
    def _call(self, p: Any) -> CallPattern:
        args = [self.convert(a) for a in C.array_items(p.args)]
        return CallPattern(self.convert(p.op), args, C.dpl_call_has_varargs(p))

    def _tuple(self, p: Any) -> TuplePattern:
        return TuplePattern([self.convert(f) for f in C.array_items(p.fields)])

    def _tuple_get_item(self, p: Any) -> TupleGetItemPattern:
        index = int(p.index)
        return TupleGetItemPattern(self.convert(p.tuple), None if index == -1 else index)

    def _attr(self, p: Any) -> AttrPattern:
        attrs = p.attrs
        return AttrPattern(self.convert(p.pattern), {str(k): attrs[k] for k in attrs.keys()})

    def _shape(self, p: Any) -> ShapePattern:
        dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in C.array_items(p.shape)]
        return ShapePattern(self.convert(p.pattern), dims)


def _short(pattern: Any) -> str:
    text = str(pattern)
    return text if len(text) <= 120 else text[:117] + "..."


_HANDLERS: dict[type, Callable[[DplConverter, Any], DFPattern]] = {
    dpl.WildcardPattern: lambda c, p: WildcardPattern(),
    dpl.ExprPattern: lambda c, p: ExprPattern(p.expr),
    dpl.ConstantPattern: lambda c, p: ConstantPattern(),
    dpl.VarPattern: lambda c, p: VarPattern(str(p.name)),
    dpl.DataflowVarPattern: lambda c, p: DataflowVarPattern(str(p.name)),
    dpl.GlobalVarPattern: lambda c, p: GlobalVarPattern(C.dpl_global_var_name(p)),
    dpl.ExternFuncPattern: lambda c, p: ExternFuncPattern(str(p.global_symbol)),
    dpl.CallPattern: DplConverter._call,
    dpl.TuplePattern: DplConverter._tuple,
    dpl.TupleGetItemPattern: DplConverter._tuple_get_item,
    dpl.OrPattern: lambda c, p: AltPattern(c.convert(p.left), c.convert(p.right)),
    dpl.AndPattern: lambda c, p: AndPattern(c.convert(p.left), c.convert(p.right)),
    dpl.NotPattern: lambda c, p: NotPattern(c.convert(p.reject)),
    dpl.AttrPattern: DplConverter._attr,
    dpl.DataTypePattern: lambda c, p: DataTypePattern(c.convert(p.pattern), str(p.dtype)),
    dpl.ShapePattern: DplConverter._shape,
    dpl.TypePattern: lambda c, p: TypePattern(c.convert(p.pattern), p.ty),
}


def from_dpl(pattern: Any) -> DFPattern:
    """The patternkit pattern equivalent to the ``tvm.relax.dpl`` pattern ``pattern``.

    ``from_dpl(p).to_dpl()`` is equivalent to ``p`` (it matches the same expressions).

    Raises
    ------
    FromDplError
        ``pattern`` uses a kind patternkit cannot express (the message names it).
    PatternError
        ``pattern`` is not a ``tvm.relax.dpl`` pattern.

    Examples
    --------
    >>> from tvm.relax.dpl import is_op, wildcard                          # doctest: +SKIP
    >>> p = from_dpl(is_op("relax.nn.conv2d")(wildcard(), wildcard()))    # doctest: +SKIP
    >>> str(p)
    'nn.conv2d(*, *)'
    """
    return DplConverter().convert(pattern)
