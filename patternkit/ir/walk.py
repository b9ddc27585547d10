"""Walking Relax expressions: what kind a node is, which Vars it reads, substitution.

Every layer of patternkit walks the values of bindings: the rewrite engine indexes who
reads which Var, DefuseOps renames an inlined callee's Vars, the round-trip check orders
bindings by their operands, the visualiser draws them.  They share three tools:

* :func:`expr_kind` classifies a node by its exact Python type, once per type.  TVM's
  classes use ``ABCMeta``, so ``isinstance`` against them costs a few hundred
  nanoseconds; on a 24,000-binding function it dominated a naive walk.
* :func:`vars_read` lists the Vars a value reads, in argument order, with repeats.
* :func:`substitute` replaces leaves (Vars, and constants captured as parameters) in an
  A-normal-form value, keeping types unless told otherwise.

Only the shapes that bindings take in normalised Relax are walked in Python (calls,
tuples, tuple projections and their leaves); anything else (a local function, an
``If``, a ``SeqExpr``) is rare, and TVM's own analyses know its scoping rules.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Callable

import tvm
from tvm import relax

from ..errors import MalformedIRError
from .compat import array_items, handle


class ExprKind(IntEnum):
    """What a Relax node is, as far as a walk over bindings cares.

    The leaf kinds (:data:`LEAF_KINDS`: ``OP`` to ``LEAF``) read no Relax variable.
    """

    VAR = 1          #: ``relax.Var`` or ``relax.DataflowVar``
    CALL = 2
    TUPLE = 3
    GET_ITEM = 4     #: ``relax.TupleGetItem``
    OP = 5           #: an operator (``tvm.ir.Op``)
    GLOBAL_VAR = 6
    CONSTANT = 7     #: a tensor constant (``relax.const``)
    LEAF = 8         #: prim values, shapes, strings, extern functions
    FUNCTION = 9     #: a local function
    IF = 10
    OTHER = 11       #: ``SeqExpr`` and anything this module does not know


VAR, CALL, TUPLE, GET_ITEM = ExprKind.VAR, ExprKind.CALL, ExprKind.TUPLE, ExprKind.GET_ITEM
OP, GLOBAL_VAR, CONSTANT, LEAF = ExprKind.OP, ExprKind.GLOBAL_VAR, ExprKind.CONSTANT, ExprKind.LEAF
FUNCTION, IF, OTHER = ExprKind.FUNCTION, ExprKind.IF, ExprKind.OTHER

#: Kinds that read no Relax variable.
LEAF_KINDS = frozenset({OP, GLOBAL_VAR, CONSTANT, LEAF})

# Leaves that are none of the more specific kinds (prim values are tirx IntImm/FloatImm,
# i.e. Constants, in 0.27).
_OTHER_LEAVES = (tvm.ir.Constant, relax.ShapeExpr, relax.ExternFunc, tvm.ir.StringImm)

# Checked in this order: a subclass must come before its base (GenericConst is a Constant).
_CLASSES = ((relax.Var, VAR), (relax.Call, CALL), (relax.Tuple, TUPLE),
            (relax.TupleGetItem, GET_ITEM), (tvm.ir.Op, OP), (tvm.ir.GlobalVar, GLOBAL_VAR),
            (tvm.ir.GenericConst, CONSTANT), (_OTHER_LEAVES, LEAF), (relax.Function, FUNCTION),
            (relax.If, IF))

#: Exact Python type -> kind; filled on first sight of each type.  Hot loops read it
#: directly (``KIND_OF.get(type(x))``) and call :func:`expr_kind` only on a miss.
KIND_OF: dict[type, ExprKind] = {}


def expr_kind(obj: Any) -> ExprKind:
    """The :class:`ExprKind` of ``obj``, cached per exact Python type."""
    cls = type(obj)
    kind = KIND_OF.get(cls)
    if kind is None:
        kind = next((k for base, k in _CLASSES if issubclass(cls, base)), OTHER)
        KIND_OF[cls] = kind
    return kind


def vars_read(expr: Any) -> list[Any]:
    """The Relax Vars ``expr`` reads, in argument order, with repeats.

    A call's callee comes before its arguments.  Bindings are not followed: a Var is a
    leaf.  Local functions, ``If`` and ``SeqExpr`` contribute their free variables.
    """
    found: list[Any] = []
    stack = [expr]
    kind_of = KIND_OF.get
    while stack:
        node = stack.pop()
        kind = kind_of(type(node))
        if kind is None:
            kind = expr_kind(node)
        if kind is VAR:
            found.append(node)
        elif kind is CALL:
            args = array_items(node.args)
            args.reverse()
            stack.extend(args)
            stack.append(node.op)
        elif kind is TUPLE:
            fields = array_items(node.fields)
            fields.reverse()
            stack.extend(fields)
        elif kind is GET_ITEM:
            stack.append(node.tuple_value)
        elif kind not in LEAF_KINDS:  # rare: let TVM apply the scoping rules
            found.extend(relax.analysis.free_vars(node))
    return found


def substitute(expr: Any, mapping: dict[Any, Any], *, by_handle: bool = False,
               keep_types: bool = True, copy_functions: bool = False,
               map_dim: Callable[[Any], Any] | None = None) -> Any:
    """``expr`` with the Vars found in ``mapping`` replaced (by handle: any leaf).

    Parameters
    ----------
    expr : relax.Expr
        A value in A-normal form: calls, tuples and tuple projections over leaves.
    mapping : dict
        Old Var -> new expression; with ``by_handle``, the
        :func:`~patternkit.ir.compat.handle` of any leaf -> new expression.  Handles let a
        caller map captured constants too, and avoid the slow FFI ``__eq__`` that a dict
        hit on a second Python wrapper of the same node costs.
    keep_types : bool
        Rebuilt calls keep the original's type, so nothing needs re-normalising (the
        default).  Without it every call, tuple and projection is rebuilt untyped, as
        ``relax.op.*`` builds them: structural equality compares types, and a bare
        nested expression (:func:`patternkit.ir.to_expr`) must equal one built by hand.
    copy_functions : bool
        Give a local function fresh variables, as each inlined copy must bind its own.
    map_dim : callable, optional
        Applied to every symbolic dimension in the types of rebuilt calls and in shape
        literals (``R.shape([n * 2])``), e.g. to put them in canonical form.  Every
        call and shape literal is then rebuilt.

    Returns
    -------
    relax.Expr
        ``expr`` itself when nothing in it changed (and types are kept).

    Raises
    ------
    MalformedIRError
        A local function, ``If`` or ``SeqExpr`` that captures a mapped Var: substituting
        inside it would need TVM's scoping rules, and bindings never hold one in the
        IR patternkit produces.
    """
    kind = KIND_OF.get(type(expr))
    if kind is None:
        kind = expr_kind(expr)
    if kind is VAR:
        new = mapping.get(handle(expr) if by_handle else expr)
        return expr if new is None else new
    if kind in LEAF_KINDS:
        # Only handles are looked up for other leaves: a tirx immediate's ``__eq__``
        # builds an expression instead of comparing.
        new = mapping.get(handle(expr)) if by_handle else None
        if new is not None:
            return new
        if map_dim is not None and type(expr) is relax.ShapeExpr:
            return relax.ShapeExpr([map_dim(d) for d in expr.values], expr.span)
        return expr
    if kind is CALL:
        op = expr.op
        new_op = substitute(op, mapping, by_handle=by_handle, map_dim=map_dim)
        changed = new_op is not op or map_dim is not None or not keep_types
        new_args = []
        for arg in array_items(expr.args):
            new = substitute(arg, mapping, by_handle=by_handle, keep_types=keep_types,
                             copy_functions=copy_functions, map_dim=map_dim)
            changed = changed or new is not arg
            new_args.append(new)
        if not changed:
            return expr
        ty_args = expr.ty_args
        if not keep_types:
            return relax.Call(new_op, new_args, expr.attrs, ty_args, expr.span)
        ty = expr.ty
        if map_dim is not None:
            ty_args = [map_type_dims(t, map_dim) for t in ty_args]
            ty = map_type_dims(ty, map_dim)
        return relax.Call(new_op, new_args, expr.attrs, ty_args, expr.span, ret_ty=ty)
    if kind is TUPLE:
        changed = False
        fields = []
        for field in array_items(expr.fields):
            new = substitute(field, mapping, by_handle=by_handle, keep_types=keep_types,
                             copy_functions=copy_functions, map_dim=map_dim)
            changed = changed or new is not field
            fields.append(new)
        return relax.Tuple(fields, expr.span) if changed or not keep_types else expr
    if kind is GET_ITEM:
        value = substitute(expr.tuple_value, mapping, by_handle=by_handle,
                           keep_types=keep_types, copy_functions=copy_functions, map_dim=map_dim)
        if value is expr.tuple_value and keep_types:
            return expr
        return relax.TupleGetItem(value, expr.index, expr.span)
    free = relax.analysis.free_vars(expr)
    if any((handle(v) if by_handle else v) in mapping for v in free):
        raise MalformedIRError(
            f"cannot substitute variables inside a {type(expr).__name__} that captures them; "
            f"only A-normal-form values are supported")
    if copy_functions and kind is FUNCTION:
        return relax.utils.copy_with_new_vars(expr)
    return expr


def map_type_dims(ty: Any, map_dim: Callable[[Any], Any]) -> Any:
    """``ty`` with ``map_dim`` applied to every dimension of its tensor and shape types."""
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        values = getattr(ty.shape, "values", None)
        if values is None:  # a shape held in a Var: nothing to map
            return ty
        return relax.TensorType([map_dim(d) for d in values], ty.dtype)
    if isinstance(ty, relax.ShapeType) and ty.values is not None:
        return relax.ShapeType([map_dim(d) for d in ty.values])
    if isinstance(ty, relax.TupleType):
        return relax.TupleType([map_type_dims(f, map_dim) for f in ty.fields])
    return ty
