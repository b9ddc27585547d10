"""Outline a match into a function of its own: the common step of partition and composites.

A match (:class:`~patternkit.engine.proposal.Group`) becomes a local function whose
parameters are the match's inputs and whose body re-binds the match's interior bindings,
tagged with Relay's ``PartitionedFromPattern`` string.  :func:`patternkit.partition` and
``MergeComposite`` call the function in place of the match.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from ..ir import compat as C
from ..ir.kinds import PARTITIONED_FROM_PATTERN
from ..ir.opnames import relay_short_name
from ..ir.outline import outline as native_outline
from ..ir.walk import CALL, GET_ITEM, KIND_OF, TUPLE, VAR, expr_kind, substitute
from .index import FunctionIndex
from .proposal import Group


def lifted_inputs(group: Group, symbolic: bool = True) -> list[Any]:
    """Inputs that become parameters: Vars, constants captured by wildcards, and the
    symbolic dimensions the match uses but its inputs do not define.

    A ``reshape(x, (batch, seq, 16))`` of an ``x`` shaped ``(batch * seq, 16)`` uses
    ``batch`` and ``seq``, which no parameter of type ``(batch * seq, 16)`` defines; they
    are passed in as one ``R.Shape([batch, seq])`` argument (a Relax function's shape
    parameter defines its symbolic variables), so the function keeps its result type.
    ``symbolic=False`` (the caller knows its function has no symbolic variable, see
    :func:`uses_symbolic_vars`) skips reading the bindings' types for them.
    """
    inputs = [e for e in group.match.inputs
              if isinstance(e, relax.Var) or isinstance(e, tvm.ir.GenericConst)]
    if not symbolic:
        return inputs
    missing = _undefined_symbolic_vars(group, inputs)
    if missing:
        inputs.append(relax.ShapeExpr(missing))
    return inputs


def uses_symbolic_vars(func: relax.Function) -> bool:
    """Does ``func`` use a symbolic variable anywhere (defined by a parameter or not)?

    Two C++ walks of the function: when it uses none, no group outlined from it needs
    a shape argument, and a pass can skip asking for each group.
    """
    return bool(relax.analysis.defined_symbolic_vars(func)
                or relax.analysis.free_symbolic_vars(func))


def _undefined_symbolic_vars(group: Group, inputs: list[Any]) -> list[Any]:
    """Symbolic variables in the types of the match's bindings that no input type defines.

    The inputs' types are read only when the bindings use a symbolic variable at all:
    in a graph of static shapes that is one FFI call per binding, not one per input too.
    """
    used: dict[int, Any] = {}
    for var in group.interior:
        for v in relax.analysis.tir_vars_in_type(var.ty):
            used.setdefault(C.handle(v), v)
    if not used:
        return []
    defined = {C.handle(v) for e in inputs
               for v in relax.analysis.definable_tir_vars_in_type(C.type_of(e))}
    missing = [v for key, v in used.items() if key not in defined]
    return sorted(missing, key=lambda v: v.name)


def build_group_function(index: FunctionIndex, group: Group, attrs: dict[str, Any],
                         inputs: list[Any] | None = None, *,
                         normalize: bool = True) -> relax.Function:
    """The local function computing ``group``, tagged ``PartitionedFromPattern``.

    Parameters are named ``FunctionVar_<group>_<i>`` after the group's number
    (:attr:`Group.gid`), as Relay named them; one per ``inputs`` (default
    :func:`lifted_inputs`, which a caller that also passes them as the call's arguments
    computes once and hands in).

    ``normalize=False`` skips the normalisation when every binding copied is an
    operator call: the copies are typed, and so is the body, given the root's type (a
    ``BlockBuilder`` and a normalisation per composite were a third of
    ``MergeComposite``'s cost).  Other bindings (tuples, projections) are copied
    untyped, and the function is normalised.  Either way the function is typed
    throughout.

    Every copied call keeps the type of the call it copies: the parameters have the
    types of the inputs they stand for, so inference would find the same types again.
    A match of operator calls over leaves is copied in one native call
    (:mod:`patternkit.ir.outline`); any other, or without native code, through one FFI
    constructor per Var, call, binding, block, body and function (a composite is built
    per match, and the Python wrappers' argument conversion was most of its cost).  Both
    give the same function.
    """
    group_id = group.gid
    inputs = lifted_inputs(group) if inputs is None else inputs
    position = index.position
    members = sorted((position[key], key)
                     for key in (*group.match.internal_keys, C.handle(group.root_var)))
    built = native_outline(inputs, [C.type_of(e) for e in inputs],
                           [index.binding_at(at) for at, _ in members],
                           f"FunctionVar_{group_id}_", _attrs_callback(attrs), not normalize)
    if built is not None:
        return relax.BlockBuilder().normalize(built) if normalize else built
    return _built_in_python(index, group, attrs, inputs, members, normalize)


def _built_in_python(index: FunctionIndex, group: Group, attrs: dict[str, Any],
                     inputs: list[Any], members: list[tuple[tuple[int, int], int]],
                     normalize: bool) -> relax.Function:
    """:func:`build_group_function` through the FFI constructors, one call each: for any
    match (tuples, projections), when the native outliner is off or does not take it.
    """
    group_id = group.gid
    mapping: dict[Any, Any] = {}
    params = []
    for i, expr in enumerate(inputs):
        param = C.new_var(f"FunctionVar_{group_id}_{i}", C.type_of(expr), None)
        params.append(param)
        mapping[C.handle(expr)] = param
    root_key = C.handle(group.root_var)
    bindings = []
    values: dict[int, Any] = {}  # handle of an interior Var -> its value, for the name
    typed = True
    for at, key in members:
        binding = index.binding_at(at)
        var, value = binding.var, binding.value
        values[key] = value
        make_var = C.new_var if key == root_key else C.new_dataflow_var
        new_var = make_var(var.name, var.ty, None)
        args = index.call_args.get(C.handle(value))
        if args is not None and type(op := value.op) is tvm.ir.Op:
            new_value = _copied_call(value, op, args, mapping)
        else:
            typed = False
            new_value = substitute(value, mapping, by_handle=True)
        bindings.append(C.new_var_binding(new_var, new_value, None))
        mapping[key] = new_var
    body = C.new_seq_expr([C.new_dataflow_block(bindings, None)], mapping[root_key], None)
    if typed and not normalize:
        C.update_type(body, group.root_var.ty)  # its result's type: the root's
    attributes = _function_attrs(_partition_name(index, group, values), attrs)
    local = C.new_function(params, body, group.root_var.ty, True, attributes, None)
    return relax.BlockBuilder().normalize(local) if normalize or not typed else local


#: ``DictAttrs`` already built, by their items: the composites of one entry share their
#: attributes (``Composite`` and, mostly, ``PartitionedFromPattern``), and building one
#: from a Python dict costs about 2 us.  Attributes are immutable, so sharing is safe.
_ATTRS: dict[tuple[tuple[str, str], ...], Any] = {}
_ATTRS_KEPT = 256


def _function_attrs(partition: str, attrs: dict[str, Any]) -> Any:
    """The ``DictAttrs`` of an outlined function: ``PartitionedFromPattern`` and ``attrs``."""
    items = {PARTITIONED_FROM_PATTERN: partition, **attrs}
    if not all(type(v) is str for v in attrs.values()):  # only plain strings are keyed
        return tvm.ir.DictAttrs(items)
    key = tuple(items.items())
    found = _ATTRS.get(key)
    if found is None:
        if len(_ATTRS) >= _ATTRS_KEPT:
            _ATTRS.clear()
        found = _ATTRS[key] = tvm.ir.DictAttrs(items)
    return found


#: ``attrs_of(names)`` callbacks of the native outliner, by the attributes they add: the
#: composites of one entry share one (converting a Python callable for the FFI costs
#: about 2 us).
_CALLBACKS: dict[tuple[tuple[str, str], ...], Any] = {}


def _attrs_callback(attrs: dict[str, Any]) -> Any:
    """The FFI callable giving an outlined function's attributes from its operator names
    (:func:`patternkit.ir.outline.outline`'s ``attrs_of``).
    """
    def attrs_of(names: str) -> Any:
        return _function_attrs(_partition_of_names(names), attrs)

    if not all(type(v) is str for v in attrs.values()):
        return tvm_ffi.convert(attrs_of)
    key = tuple(attrs.items())
    found = _CALLBACKS.get(key)
    if found is None:
        if len(_CALLBACKS) >= _ATTRS_KEPT:
            _CALLBACKS.clear()
        found = _CALLBACKS[key] = tvm_ffi.convert(attrs_of)
    return found


@lru_cache(maxsize=1024)
def _partition_of_names(names: str) -> str:
    """Relay's ``PartitionedFromPattern`` from Relax operator names in post-order, each
    followed by a space: ``"relax.matmul relax.add "`` -> ``"matmul_add_"``.
    """
    return "".join(relay_short_name(name) + "_" for name in names.split())


def _copied_call(value: Any, op: Any, args: list[Any], mapping: dict[int, Any]) -> Any:
    """The call of operator ``op`` ``value``, reading the outlined Vars of ``mapping``,
    with its type.

    ``args`` are its arguments as the index read them once; the call is built by its FFI
    constructor.
    """
    new_args = [substitute(arg, mapping, by_handle=True) for arg in args]
    return C.new_call(value.ty, op, new_args, value.attrs, value.ty_args, value.span)


def partition_name(index: FunctionIndex, group: Group) -> str:
    """Relay's ``PartitionedFromPattern`` string: op names in post-order, each + ``_``.

    ``add(divide(multiply(g, subtract(x, m)), sqrt(add(v, eps))), b)`` gives
    ``"subtract_multiply_add_sqrt_divide_add_"``.
    """
    values = {key: index.binding_at(index.position[key]).value
              for key in (*group.match.internal_keys, C.handle(group.root_var))}
    return _partition_name(index, group, values)


def _partition_name(index: FunctionIndex, group: Group, values: dict[int, Any]) -> str:
    """:func:`partition_name`, given the value of every interior Var by handle."""
    parts: list[str] = []
    _post_order_names(index, group.binding.value, values, set(), parts)
    return "".join(p + "_" for p in parts)


def _post_order_names(index: FunctionIndex, expr: Any, values: dict[int, Any], seen: set[int],
                      parts: list[str]) -> None:
    """Append the op names of ``expr`` to ``parts``, looking through interior Vars.

    ``values`` maps the handle of each interior Var to its bound value.  A call's
    arguments come from the index where it has them (no FFI array per call).

    A module-level function, not a closure: a closure that calls itself is a reference
    cycle, which kept each group's match and the whole FunctionIndex alive past the pass
    until the garbage collector swept them (180 ms at 24k bindings; see ``gc_paused``).
    """
    kind = KIND_OF.get(type(expr)) or expr_kind(expr)
    if kind is VAR:
        key = C.handle(expr)
        if key in values and key not in seen:
            seen.add(key)
            _post_order_names(index, values[key], values, seen, parts)
        return
    if kind is CALL:
        args = index.call_args.get(C.handle(expr))
        for arg in C.array_items(expr.args) if args is None else args:
            _post_order_names(index, arg, values, seen, parts)
        name = C.op_name(expr)
        parts.append(relay_short_name(name) if name else "Call")
    elif kind is TUPLE:
        for f in C.array_items(expr.fields):
            _post_order_names(index, f, values, seen, parts)
        parts.append("Tuple")
    elif kind is GET_ITEM:
        _post_order_names(index, expr.tuple_value, values, seen, parts)
        parts.append(f"TupleGetItem{int(expr.index)}")
