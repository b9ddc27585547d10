"""Turn a :mod:`~patternkit.byoc.merge.tvm_fusion` plan into IR shaped as ``FuseOpsByPattern``'s.

Each planned composite becomes a private global function, built the way TVM's
``FunctionCreator`` builds it (``src/relax/transform/fuse_ops.cc``):

* parameters are the values the members read from outside, in first-read order, named
  after them (the fields of a tuple written in an argument, ``concat((x, y))``, one by
  one); a tensor constant stays inside (``bind_constants=True``, the default) or
  becomes a parameter ``param_<i>``; prim values and static shapes always stay inside;
  a tuple read only through ``tuple[i]`` becomes one parameter per field used;
* the body is one dataflow block re-binding the members; the results that leave the
  composite (:attr:`~patternkit.byoc.merge.tvm_fusion.PlannedComposite.outputs`) are its
  return value, a tuple when there are several;
* symbolic dimensions that no parameter defines are passed in one extra ``tir_vars``
  shape parameter;
* attributes ``Composite`` (the entry's name), ``Primitive`` and whatever the entry's
  ``attrs_getter`` adds; the name is ``fused_<op>_<op>...`` as TVM spells it, and
  structurally equal composites are one function, both as ``BlockBuilder.add_func``
  gives them (:mod:`~patternkit.byoc.merge.global_functions`, which does it in linear time).

The caller binds a call where the composite stands, and for a tuple result one
``tuple[i]`` per result, in member order.  With ``annotate_codegen=True`` each
composite is wrapped, as TVM's ``CompositeFunctionAnnotator`` does, in a public function
named ``<composite>_<codegen>`` carrying ``Codegen`` and ``global_symbol`` whose body
calls the composite as a local function.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from ...engine.index import FunctionIndex
from ...fusion.symbolic import detach_symbolic_vars
from ...ir import compat as C
from ...ir.kinds import CODEGEN, COMPOSITE, GLOBAL_SYMBOL, PRIMITIVE, attr
from ...ir.rebuild import make_block, rebuild_function
from ...ir.walk import substitute
from .global_functions import FunctionTable
from .tvm_fusion import FunctionPlan, PlannedComposite

_CALL_TIR = frozenset({"relax.call_tir", "relax.call_tir_inplace"})


class BuiltComposite:
    """A composite function added to the module, and how to call it."""

    __slots__ = ("gv", "arguments", "single")

    def __init__(self, gv: tvm.ir.GlobalVar, arguments: list, single: bool):
        self.gv = gv
        self.arguments = arguments  # caller-side expressions, before remapping
        self.single = single


def build_composite(table: FunctionTable, index: FunctionIndex, composite: PlannedComposite,
                    bind_constants: bool) -> None:
    """Add ``composite``'s function to ``table`` and record how to call it (``.built``).

    Called as each entry forms its composites, in TVM's creation order, so that the names
    (``fused_relax_matmul_relax_add1``) are those ``FuseOpsByPattern`` gives them by then,
    when the checks of later entries see calls to them.
    """
    func, arguments = _composite_function(index, composite, bind_constants)
    gv = table.add(func, _fused_name(index, composite))
    composite.built = BuiltComposite(gv, arguments, len(composite.outputs) == 1)


def emit_module(mod: tvm.IRModule, plans: list[tuple[tvm.ir.GlobalVar, FunctionPlan]],
                table: FunctionTable, bind_constants: bool,
                annotate_codegen: bool) -> tvm.IRModule:
    """``mod`` with every plan applied; ``mod`` itself is not modified.

    ``table`` holds the composites :func:`build_composite` added while planning; one
    not built yet is built here, in creation order.
    """
    composites = sorted(((c, plan) for _, plan in plans for c in plan.composites),
                        key=lambda item: item[0].created)
    built: dict[int, BuiltComposite] = {}
    for composite, plan in composites:
        if composite.built is None:
            build_composite(table, plan.index, composite, bind_constants)
        built[id(composite)] = composite.built
    bb = relax.BlockBuilder()  # types the new calls; the composites' GlobalVars carry theirs
    updates = {gv: _rewrite_caller(bb, mod[gv], plan, built)
               for gv, plan in plans if plan.composites}
    out = table.module(mod, updates)
    return _annotate_codegen(out) if annotate_codegen else out


# -- the composite function ------------------------------------------------------------------
def _fused_name(index: FunctionIndex, composite: PlannedComposite) -> str:
    """``fused_relax_nn_conv2d_relax_add``: TVM's name for the function (made unique after)."""
    parts = ["fused"]
    bindings = index.blocks[composite.block]
    for m in composite.members:
        value = bindings[m].value
        if not isinstance(value, relax.Call):
            continue
        op = value.op
        if isinstance(op, tvm.ir.Op):
            if op.name in _CALL_TIR:
                parts.append(C.var_name(value.args[0]))
            else:
                parts.append(op.name)
        elif isinstance(op, tvm.ir.GlobalVar):
            parts.append(op.name_hint.removeprefix("fused_"))
    return "_".join(parts).replace(".", "_")


def _inlinable(expr: Any) -> bool:
    """A prim value, static shape, or tuple of them: TVM keeps these inside the composite."""
    if isinstance(expr, relax.Tuple):
        return all(_inlinable(f) for f in C.array_items(expr.fields))
    if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return True
    if isinstance(expr, relax.ShapeExpr):
        return all(isinstance(v, tvm.tirx.IntImm) for v in C.array_items(expr.values))
    return False


class _Parameters:
    """``FunctionCreator``'s parameter list: the outside values a composite reads."""

    def __init__(self, lift_constants: bool):
        self.lift_constants = lift_constants
        self.arguments: list = []
        self.params: list = []
        self.position: dict[int, int] = {}
        self.defined: set[int] = set()
        self.partial_tuples: dict[int, list[int]] = {}  # tuple input -> fields read
        self._constants = 0

    def read(self, expr: Any) -> None:
        if isinstance(expr, relax.Tuple) and not _inlinable(expr):
            # an argument written as a tuple, ``concat((x, y))``: its fields are read
            for item in C.array_items(expr.fields):
                self.read(item)
            return
        key = C.handle(expr)
        if key in self.position:
            return
        is_var = isinstance(expr, relax.Var)
        if is_var and key in self.defined:
            return
        if not is_var and not self.lift_constants and C.is_constant(expr):
            return
        if is_var:
            name = C.var_name(expr)
        else:
            name = f"param_{self._constants}"
            self._constants += 1
        if not _inlinable(expr):
            self.position[key] = len(self.arguments)
            self.arguments.append(expr)
            self.params.append(relax.Var(name, C.type_of(expr)))
        if isinstance(C.type_of(expr), relax.TupleType):
            self.partial_tuples.setdefault(key, [])

    def split_partial_tuples(self) -> dict[tuple[int, int], relax.Var]:
        """Tuples read only through ``tuple[i]`` become one parameter per field read."""
        fields: dict[tuple[int, int], relax.Var] = {}
        for key, indices in sorted(self.partial_tuples.items(),
                                   key=lambda item: -self.position.get(item[0], -1)):
            if key not in self.position or not indices:
                continue
            at = self.position[key]
            expr, param = self.arguments[at], self.params[at]
            types = C.type_of(expr).fields
            new_args = [relax.TupleGetItem(expr, i) for i in indices]
            new_params = [relax.Var(f"{C.var_name(param)}_{i}", types[i]) for i in indices]
            self.arguments[at:at + 1] = new_args
            self.params[at:at + 1] = new_params
            for i, p in zip(indices, new_params):
                fields[(key, i)] = p
        return fields


def _composite_function(index: FunctionIndex, composite: PlannedComposite,
                        bind_constants: bool) -> tuple[relax.Function, list]:
    """The composite function and the caller-side arguments of its call."""
    bindings = [index.blocks[composite.block][m] for m in composite.members]
    params = _Parameters(lift_constants=not bind_constants)
    for binding in bindings:
        value = binding.value
        if isinstance(value, relax.Call):
            if C.op_name(value) in _CALL_TIR:
                for f in C.array_items(value.args[1].fields):
                    params.read(f)
            else:
                for arg in C.array_items(value.args):
                    params.read(arg)
                    if isinstance(C.type_of(arg), relax.TupleType):
                        params.partial_tuples.pop(C.handle(arg), None)  # read whole
        elif isinstance(value, relax.TupleGetItem):
            params.read(value.tuple_value)
            indices = params.partial_tuples.get(C.handle(value.tuple_value))
            if indices is not None:
                indices.append(int(value.index))
        params.defined.add(C.handle(binding.var))
    fields = params.split_partial_tuples()
    outputs = {index.keys[composite.block][m][0] for m in composite.outputs}
    mapping: dict[int, Any] = {C.handle(a): p for a, p in zip(params.arguments, params.params)}
    out_vars: dict[int, Any] = {}
    bb = relax.BlockBuilder()
    with bb.function("composite", params.params, private=True):
        with bb.dataflow():
            for binding in bindings:
                key, value = C.handle(binding.var), binding.value
                if isinstance(value, relax.TupleGetItem):
                    field = fields.get((C.handle(value.tuple_value), int(value.index)))
                    if field is not None:
                        mapping[key] = field
                        out_vars[key] = field
                        continue
                new_value = substitute(value, mapping, by_handle=True)
                new_var = bb.emit_output(new_value) if key in outputs else bb.emit(new_value)
                mapping[key] = out_vars[key] = new_var
        results = [out_vars[index.keys[composite.block][m][0]] for m in composite.outputs]
        bb.emit_func_output(results[0] if len(results) == 1 else relax.Tuple(results))
    # its own symbolic variables, and the caller's it only reads as a trailing shape
    func, extra = detach_symbolic_vars(bb.get()["composite"])
    arguments = [*params.arguments, *extra]
    if extra:
        func = relax.BlockBuilder().normalize(func)
    func = func.with_attr(COMPOSITE, composite.entry.name).with_attr(PRIMITIVE, True)
    getter = composite.entry.attrs_getter
    if getter is not None:
        annotated = {name: composite.match.captures[p]
                     for name, p in composite.entry.roles.items() if p in composite.match.captures}
        for key, value in dict(getter(annotated)).items():
            func = func.with_attr(str(key), value)
    return func, arguments


# -- the caller -------------------------------------------------------------------------------
def _rewrite_caller(bb: relax.BlockBuilder, func: relax.Function, plan: FunctionPlan,
                    built: dict[int, BuiltComposite]) -> relax.Function:
    index = plan.index
    remap: dict[int, Any] = {}
    blocks = []
    for bi, block in enumerate(C.array_items(func.body.blocks)):
        bindings = index.blocks[bi]
        block_plan = plan.blocks.get(bi)
        dataflow = isinstance(block, relax.DataflowBlock)
        if block_plan is None and not remap:
            blocks.append(block)
            continue
        with C.scratch_block(bb, dataflow=dataflow) as emitted:
            units = block_plan.order if block_plan is not None else range(len(bindings))
            for unit in units:
                if isinstance(unit, int):
                    _reemit(bb, bindings[unit], remap)
                else:
                    _emit_call(bb, index, unit, built[id(unit)], remap)
        if emitted:
            blocks.append(make_block(emitted, dataflow, block.span))
    body = substitute(func.body.body, remap, by_handle=True) if remap else func.body.body
    return rebuild_function(func, relax.SeqExpr(blocks, body, func.body.span))


def _reemit(bb: relax.BlockBuilder, binding: Any, remap: dict[int, Any]) -> None:
    if remap and type(binding) is relax.VarBinding:
        value = substitute(binding.value, remap, by_handle=True)
        if not value.same_as(binding.value):
            binding = relax.VarBinding(binding.var, value)
    elif remap and type(binding) is relax.MatchCast:
        value = substitute(binding.value, remap, by_handle=True)
        if not value.same_as(binding.value):
            binding = relax.MatchCast(binding.var, value, binding.ty)
    bb.emit_normalized(binding)


def _emit_call(bb: relax.BlockBuilder, index: FunctionIndex, composite: PlannedComposite,
               built: BuiltComposite, remap: dict[int, Any]) -> None:
    bindings = index.blocks[composite.block]
    args = [substitute(a, remap, by_handle=True) if remap else a for a in built.arguments]
    call = bb.normalize(relax.Call(built.gv, args))
    root = bindings[composite.root].var
    if built.single:
        (only,) = composite.outputs
        var = bindings[only].var
        new_var = _like(var, C.var_name(var), C.type_of(call))
        bb.emit_normalized(relax.VarBinding(new_var, call))
        remap[C.handle(var)] = new_var
        return
    tuple_var = relax.DataflowVar(f"{C.var_name(root)}_results", C.type_of(call))
    bb.emit_normalized(relax.VarBinding(tuple_var, call))
    for m in composite.members:
        if m not in composite.outputs:
            continue
        var = bindings[m].var
        item = bb.normalize(relax.TupleGetItem(tuple_var, composite.outputs.index(m)))
        new_var = _like(var, C.var_name(var), C.type_of(item))
        bb.emit_normalized(relax.VarBinding(new_var, item))
        remap[C.handle(var)] = new_var


def _like(var: Any, name: str, ty: Any) -> Any:
    """A new Var of ``var``'s kind: dataflow variables stay inside their block."""
    if isinstance(var, relax.DataflowVar):
        return relax.DataflowVar(name, ty)
    return relax.Var(name, ty)


# -- annotate_codegen ------------------------------------------------------------------------
def _annotate_codegen(mod: tvm.IRModule) -> tvm.IRModule:
    """Wrap every composite in a ``Codegen`` function, as ``CompositeFunctionAnnotator``."""
    bb = relax.BlockBuilder()
    table = FunctionTable(mod, CODEGEN)
    wrappers: dict[str, tvm.ir.GlobalVar] = {}
    updates = {}
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function) or attr(func, COMPOSITE) is not None \
                or attr(func, CODEGEN) is not None:
            continue
        changed = False
        blocks = []
        for block in C.array_items(func.body.blocks):
            kept = []
            for binding in C.array_items(block.bindings):
                value = binding.value
                if (type(binding) is relax.VarBinding and isinstance(value, relax.Call)
                        and isinstance(value.op, tvm.ir.GlobalVar)
                        and attr(mod[value.op], COMPOSITE) is not None):
                    name = value.op.name_hint
                    if name not in wrappers:
                        wrappers[name] = _add_wrapper(table, value.op, mod[value.op])
                    value = relax.Call(wrappers[name], value.args)
                    binding = relax.VarBinding(binding.var, bb.normalize(value))
                    changed = True
                kept.append(binding)
            blocks.append(make_block(kept, isinstance(block, relax.DataflowBlock), block.span))
        if changed:
            updates[gv] = rebuild_function(func, blocks)
    out = table.module(mod, updates)
    # The wrapped composites now live inside their wrappers only (TVM removes them).
    functions = {gv: f for gv, f in out.functions.items() if gv.name_hint not in wrappers}
    return C.copy_module(out, functions)


def _add_wrapper(table: FunctionTable, gv: tvm.ir.GlobalVar,
                 composite: relax.Function) -> tvm.ir.GlobalVar:
    codegen = str(composite.attrs[COMPOSITE]).split(".", 1)[0]
    inner = composite.without_attr(PRIMITIVE)
    params = [relax.Var(C.var_name(p), p.ty) for p in composite.params]
    local = relax.Var("local_func", inner.ty)
    output = relax.Var("output", composite.ret_ty)
    bindings = [relax.VarBinding(local, inner),
                relax.VarBinding(output, relax.Call(local, params))]
    body = relax.SeqExpr([relax.BindingBlock(bindings)], output)
    symbol = f"{gv.name_hint}_{codegen}"
    wrapper = relax.Function(params, body, composite.ret_ty, inner.is_pure)
    wrapper = wrapper.with_attr(CODEGEN, codegen).with_attr(GLOBAL_SYMBOL, symbol)
    return table.add(relax.BlockBuilder().normalize(wrapper), symbol)


__all__ = ["emit_module", "build_composite"]
