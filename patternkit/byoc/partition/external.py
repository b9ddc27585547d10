"""``AnnotateTarget`` and ``PartitionGraph``: hand composites to an external compiler.

Relay's BYOC flow was ``MergeComposite`` -> ``AnnotateTarget`` -> ``MergeCompilerRegions``
-> ``PartitionGraph``.  Relax 0.27 has pattern-only BYOC (``FuseOpsByPattern`` +
``MergeCompositeFunctions`` + ``RunCodegen``) and no annotation pass.  This module keeps
the Relay workflow on Relax::

    seq = tvm.transform.Sequential([
        MergeComposite([("ccompiler.conv_add_relu", conv2d_add_relu())]),
        AnnotateTarget("ccompiler", ops={"nn.max_pool2d": True}),   # optional
        PartitionGraph("ccompiler"),
    ])

:func:`AnnotateTarget` ``(compiler, ops)``
    Relay's per-op ``target.<compiler>`` predicates become a table: every call of a
    listed op that no composite took is wrapped in a single-op composite named
    ``"<compiler>.<op>"`` (``"ccompiler.nn.max_pool2d"``).  A predicate is ``True`` or a
    ``check(pre)`` returning ``True`` / ``False`` / :func:`patternkit.reject`.
:func:`PartitionGraph` ``(compiler)``
    Every composite whose name starts with ``"<compiler>."`` is lifted out of its
    function.  With ``merge=True`` (the default, Relay's ``MergeCompilerRegions`` +
    ``PartitionGraph``) adjacent composites of one compiler are merged into one external
    function with TVM's ``MergeCompositeFunctions``, which never merges two regions when
    that would create a cycle through host code; with ``merge=False`` each composite
    gets its own external function.  External functions are public, named
    ``"<compiler>_main_<i>"`` in program order (Relay's ``tvmgen_default_<compiler>_main_<i>``
    without the module-name mangling) and carry ``Codegen`` (what ``relax.transform.RunCodegen``
    reads), ``Compiler`` (Relay's name of it), ``global_symbol`` and ``Primitive``; the
    composites stay inside them as local functions, as ``MergeCompositeFunctions``
    produces them.

Composites in TVM's form (global functions, from ``MergeComposite`` with
``semantics="tvm"``, the default for a table from ``PatternTable.from_tvm``) are handed to
``MergeCompositeFunctions`` as they are, and keep its names (``fused_<ops>_<compiler>``):
the result is exactly ``MergeCompositeFunctions``'.

Building for ``llvm``: external functions need their codegen (``RunCodegen``).  To run
a partitioned module on the host instead (tests, numeric checks), inline everything back
with :func:`patternkit.DefuseOps`, which undoes ``Codegen`` and ``Composite``
functions; :func:`inline_external` does exactly that.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping

import tvm
from tvm import relax

from ...dpl.pattern import DFPattern, is_op, wildcard
from ...errors import MalformedIRError, NothingToPartition, PatternkitError
from ...fusion import defuse
from ...fusion.symbolic import detach_symbolic_vars
from ...ir import compat as C
from ...ir.kinds import CODEGEN, COMPILER, COMPOSITE, GLOBAL_SYMBOL, PRIMITIVE, attr
from ...ir.opnames import relax_op_name, relay_short_name
from ...ir.rebuild import make_block, rebuild_function
from ...ir.targets import rewritable_functions
from ..merge.composites import composite_functions, merge_composite
from ..tables.table import PatternTable, PatternTableError
from .regions import merge_compiler_regions

logger = logging.getLogger(__name__)


def _compiler_name(compiler: Any, where: str) -> str:
    if not isinstance(compiler, str) or not compiler or "." in compiler:
        raise PatternTableError(f"{where}: the compiler must be a non-empty name without "
                                f"dots (the prefix of composite names), found {compiler!r}")
    return compiler


# -- AnnotateTarget --------------------------------------------------------------------------
def annotation_table(compiler: str, ops: Mapping[str, bool | Callable]) -> PatternTable:
    """The single-op pattern table for ``AnnotateTarget(compiler, ops)``.

    Entry names are ``"<compiler>.<Relay op name>"``; an op mapped to ``False`` is left out.
    """
    compiler = _compiler_name(compiler, "AnnotateTarget")
    entries = []
    for name, predicate in ops.items():
        try:
            full = relax_op_name(name)
        except PatternkitError as err:
            raise PatternTableError(
                f"AnnotateTarget('{compiler}'): op entry {name!r}: {err}") from err
        if predicate is False:
            continue
        check = None if predicate is True else predicate
        if check is not None and not callable(check):
            raise PatternTableError(f"AnnotateTarget('{compiler}'): the predicate of op "
                                    f"{name!r} must be True, False or callable, found "
                                    f"{type(predicate).__name__}")
        entry_name = f"{compiler}.{relay_short_name(full)}"
        pattern = _single_op_pattern(full)
        entries.append((entry_name, pattern, check) if check else (entry_name, pattern))
    return PatternTable(entries, compiler)


def _single_op_pattern(full_name: str) -> DFPattern:
    """``op(w, ..., w)`` with one wildcard per input, so the inputs become parameters."""
    arity = int(tvm.ir.Op.get(full_name).num_inputs)
    arities = [arity] if arity >= 0 else range(1, 9)
    alternatives = [is_op(full_name)(*[wildcard() for _ in range(n)]) for n in arities]
    pattern: DFPattern = alternatives[0]
    for p in alternatives[1:]:
        pattern = pattern | p
    return pattern


def AnnotateTarget(compiler: str, ops: Mapping[str, bool | Callable] | None = None,  # noqa: N802
                   ) -> tvm.transform.Pass:
    """Mark single ops supported by ``compiler`` as one-op composites; see the module doc.

    Parameters
    ----------
    compiler : str
    ops : mapping of op name (Relay or Relax spelling) to ``True``/``False``/``check``
        Relay's ``@tvm.ir.register_op_attr(op, "target.<compiler>")`` table.  Ops already
        inside a composite are never annotated again.
    """
    table = annotation_table(compiler, ops or {})

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return merge_composite(mod, table) if len(table) else mod

    return C.module_pass(transform, "patternkit.AnnotateTarget")


# -- PartitionGraph --------------------------------------------------------------------------
def partition_graph(mod: tvm.IRModule, compiler: str | Iterable[str] | None = None, *,
                    merge: bool = True, strict: bool = False) -> tvm.IRModule:
    """Lift the composites of ``compiler`` into external functions; see the module doc.

    Parameters
    ----------
    mod : tvm.IRModule
        Never modified.
    compiler : str, iterable of str or None
        The codegen(s) to partition for; ``None`` takes every composite whose name has a
        ``"<compiler>."`` prefix.
    merge : bool
        Merge adjacent composites of one compiler into one function (never creating a
        cycle); otherwise one external function per composite.
    strict : bool
        Raise :class:`~patternkit.errors.NothingToPartition` when no composite carries
        ``compiler``, instead of logging a warning and returning ``mod``.

    Notes
    -----
    A module in which no composite carries the compiler is returned as it is, but never
    silently: ``PartitionGraph("ccompiler")`` on a module that ``MergeComposite`` never
    saw, or whose composites are named ``"cc.conv2d"``, is almost always a mistake, so a
    warning (logger ``patternkit.byoc.partition.external``) names the compilers the composites do
    carry.  A pipeline that may legitimately find nothing to offload can filter the
    warning; one that must offload passes ``strict=True``.

    Symbolic shapes: every external function defines its own symbolic variables (a
    module whose functions share one ``n`` is not well formed), fresh ones as
    ``FuseOpsByPattern`` makes them, and receives the caller's that it only reads in a
    trailing ``R.Shape`` argument; :func:`patternkit.DefuseOps` binds them back.
    """
    compilers = _compilers(compiler)
    if _global_composites(mod):
        return _partition_tvm_form(mod, compilers, merge)
    with C.gc_paused():
        lifted, order = _lift_composites(mod, compilers, wrap=not merge)
        if not order:
            _nothing_to_partition(mod, compilers, strict)
            return mod
        if merge:
            lifted = merge_compiler_regions(lifted, set(order))
        return _name_external_functions(lifted, mod)


def _nothing_to_partition(mod: tvm.IRModule, compilers: set[str] | None, strict: bool) -> None:
    """Report a partitioning that found no composite of ``compilers``."""
    names = [str(attr(f, COMPOSITE)) for _, f in composite_functions(mod)]
    present = sorted({name.split(".", 1)[0] for name in names if "." in name})
    undotted = sorted({name for name in names if "." not in name})
    asked = "any compiler" if compilers is None else ", ".join(repr(c) for c in sorted(compilers))
    if present:
        found = f"the composites in the module are for {', '.join(repr(c) for c in present)}"
    elif undotted:
        shown = ", ".join(repr(n) for n in undotted[:3]) + (", ..." if len(undotted) > 3 else "")
        found = f"the module's composites ({shown}) name no compiler"
    else:
        found = ("the module has no composite functions (run MergeComposite or AnnotateTarget "
                 "first)")
    message = (f"PartitionGraph: no composite carries {asked}; {found}. Composite names "
               f"must start with '<compiler>.'; the module is returned unchanged")
    if strict:
        raise NothingToPartition(message)
    logger.warning("%s", message)


def _global_composites(mod: tvm.IRModule) -> list[str]:
    """Names of the global ``Composite`` functions: ``FuseOpsByPattern``'s form."""
    return [str(attr(f, COMPOSITE)) for _, f in mod.functions.items()
            if isinstance(f, relax.Function) and attr(f, COMPOSITE) is not None]


def _partition_tvm_form(mod: tvm.IRModule, compilers: set[str] | None,
                        merge: bool) -> tvm.IRModule:
    """``MergeCompositeFunctions`` on composites in TVM's form, with TVM's names.

    They come from ``MergeComposite(semantics="tvm")`` (or from ``FuseOpsByPattern``);
    the result is exactly what ``MergeCompositeFunctions`` gives, so a TVM flow can
    swap either pass for patternkit's.
    """
    names = _global_composites(mod)
    prefixes = {n.split(".", 1)[0] for n in names}
    if not merge:
        raise PatternTableError("PartitionGraph(merge=False): the composites are global "
                                "functions (TVM's semantics); wrap each one for its compiler "
                                "with MergeComposite(table, annotate_codegen=True) instead")
    if compilers is not None and not prefixes <= compilers:
        raise PatternTableError(
            f"PartitionGraph({', '.join(sorted(compilers))}): with TVM's semantics every "
            f"composite is partitioned, as MergeCompositeFunctions does; this module also "
            f"has composites of {', '.join(sorted(prefixes - compilers))}")
    # MergeCompositeFunctions caller by caller, bindings that pass a symbolic variable
    # held out of its way (it crashes on them: a dynamic-batch GPT-2)
    return merge_compiler_regions(mod, prefixes)


def _compilers(compiler) -> set[str] | None:
    if compiler is None:
        return None
    if isinstance(compiler, str) or not isinstance(compiler, Iterable):
        return {_compiler_name(compiler, "PartitionGraph")}
    return {_compiler_name(c, "PartitionGraph") for c in compiler}


def PartitionGraph(compiler: str | Iterable[str] | None = None, *,  # noqa: N802 (TVM style)
                   merge: bool = True, strict: bool = False) -> tvm.transform.Pass:
    """:func:`partition_graph` as a module pass (Relay's ``PartitionGraph``)."""
    _compilers(compiler)

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return partition_graph(mod, compiler, merge=merge, strict=strict)

    return C.module_pass(transform, "patternkit.PartitionGraph")


def _codegen_of(func: relax.Function, compilers: set[str] | None) -> str | None:
    name = attr(func, COMPOSITE)
    if name is None or "." not in str(name):
        return None
    prefix = str(name).split(".", 1)[0]
    return prefix if compilers is None or prefix in compilers else None


def _lift_composites(mod: tvm.IRModule, compilers: set[str] | None, wrap: bool):
    """Move selected local composites to globals; returns (module, codegens in order).

    ``wrap=False``: FuseOpsByPattern's form (private ``Composite`` + ``Primitive``
    globals), ready for ``MergeCompositeFunctions``.  ``wrap=True``: each call site gets
    a public ``Codegen`` function holding the composite as a local function, the form of
    ``FuseOpsByPattern(annotate_codegen=True)``.
    """
    bb = relax.BlockBuilder(C.copy_module(mod))
    order: list[str] = []
    updates = {}
    for gv, func in rewritable_functions(mod):
        new_func = _lift_in_function(bb, gv.name_hint, func, compilers, wrap, order)
        if new_func is not None:
            updates[gv] = new_func
    for gv, func in updates.items():
        bb.update_func(gv, func)
    return bb.get(), order


def _lift_in_function(bb, func_name, func, compilers, wrap, order):
    if not isinstance(func.body, relax.SeqExpr):
        return None
    locals_: dict[int, tuple[relax.Function, str]] = {}
    changed = False
    blocks = []
    for block in C.array_items(func.body.blocks):
        kept = []
        for binding in C.array_items(block.bindings):
            value = binding.value
            if isinstance(value, relax.Function):
                codegen = _codegen_of(value, compilers)
                if codegen is not None:
                    locals_[C.handle(binding.var)] = (value, codegen)
                    changed = True
                    continue
                if not wrap and attr(value, COMPOSITE) is not None:
                    # MergeCompositeFunctions cannot walk local functions, so the other
                    # compilers' composites go global too; they are inlined back after.
                    locals_[C.handle(binding.var)] = (value, None)
                    changed = True
                    continue
                if not wrap:
                    raise MalformedIRError(
                        f"PartitionGraph: function '{func_name}' binds a local function "
                        f"'{C.var_name(binding.var)}' that is not a composite; lift it "
                        f"(relax.transform.LambdaLift) or inline it (DefuseOps) first")
            if (isinstance(value, relax.Call) and isinstance(value.op, relax.Var)
                    and C.handle(value.op) in locals_):
                composite, codegen = locals_[C.handle(value.op)]
                # a global must define its own symbolic variables: fresh ones, and the
                # caller's that the composite only reads arrive as an R.Shape argument
                composite, extra_args = detach_symbolic_vars(composite)
                if codegen is None:
                    gv = bb.add_func(composite.with_attr(PRIMITIVE, True),
                                     f"{func_name}_{C.var_name(binding.var)}_other")
                else:
                    gv = (_wrap_external(bb, composite, codegen, func_name, len(order)) if wrap
                          else bb.add_func(composite.with_attr(PRIMITIVE, True),
                                           f"{func_name}_{C.var_name(binding.var)}_composite"))
                    order.append(codegen)
                call = _normalized_call(bb, gv, list(C.array_items(value.args)) + extra_args,
                                        isinstance(block, relax.DataflowBlock))
                kept.append(relax.VarBinding(binding.var, call))
                continue
            kept.append(binding)
        if kept:
            blocks.append(make_block(kept, isinstance(block, relax.DataflowBlock)))
    if not changed:
        return None
    return rebuild_function(func, blocks)


def _normalized_call(bb: relax.BlockBuilder, gv, args: list, dataflow: bool):
    with C.scratch_block(bb, dataflow=dataflow):
        return bb.normalize(relax.Call(gv, args))


def _wrap_external(bb, composite: relax.Function, codegen: str, func_name: str, i: int):
    # the wrapper shares the composite's symbolic variables, as the one of
    # FuseOpsByPattern(annotate_codegen=True) does: they are defined once, by its
    # parameters, and the nested composite's parameters only read them
    params = [relax.Var(f"param_{k}", p.ty) for k, p in enumerate(composite.params)]
    name = f"{func_name}_{codegen}_external_{i}"
    with bb.function(name, params, private=False):
        inner = bb.emit(composite)
        out = bb.emit(relax.Call(inner, params))
        gv = bb.emit_func_output(out)
    func = bb.get()[gv]
    bb.update_func(gv, func.with_attr(CODEGEN, codegen))
    return gv


def _name_external_functions(mod: tvm.IRModule, original: tvm.IRModule) -> tvm.IRModule:
    """Rename new ``Codegen`` functions ``<compiler>_main_<i>`` and add Relay's attrs."""
    existing = {gv.name_hint for gv in original.get_global_vars()}
    callers = [(gv, f) for gv, f in rewritable_functions(mod)]
    # Program order of first call, so that names read top to bottom like Relay's.
    first_call: dict[str, int] = {}
    for _, func in callers:
        for block in C.array_items(func.body.blocks):
            for binding in C.array_items(block.bindings):
                value = binding.value
                if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
                    first_call.setdefault(value.op.name_hint, len(first_call))
    externals = [gv for gv, f in mod.functions.items()
                 if isinstance(f, relax.Function) and attr(f, CODEGEN) is not None
                 and gv.name_hint not in existing]
    externals.sort(key=lambda gv: (first_call.get(gv.name_hint, len(first_call)), gv.name_hint))
    counters: dict[str, int] = {}
    renamed = {}
    for gv in externals:
        func = mod[gv]
        codegen = str(func.attrs[CODEGEN])
        k = counters.get(codegen, 0)
        counters[codegen] = k + 1
        name = f"{codegen}_main_{k}"
        while name in existing:
            name = "_" + name
        func = (func.with_attr(GLOBAL_SYMBOL, name).with_attr(COMPILER, codegen)
                .with_attr(PRIMITIVE, True))
        renamed[gv.name_hint] = (name, func)
    new_bb = relax.BlockBuilder(tvm.IRModule())
    new_gvs = {old: new_bb.add_func(func, name) for old, (name, func) in renamed.items()}
    functions = dict(new_bb.get().functions.items())
    caller_names = {g.name_hint for g, _ in callers}
    for gv, func in mod.functions.items():
        if gv.name_hint in renamed:
            continue
        if gv.name_hint in caller_names:
            func = _retarget_calls(func, new_gvs)
        functions[gv] = func
    return tvm.IRModule(functions, attrs=original.attrs, global_infos=original.global_infos)


def _retarget_calls(func: relax.Function, new_gvs: dict) -> relax.Function:
    bb = relax.BlockBuilder()
    blocks = []
    for block in C.array_items(func.body.blocks):
        kept = []
        for binding in C.array_items(block.bindings):
            value = binding.value
            if (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)
                    and value.op.name_hint in new_gvs):
                call = _normalized_call(bb, new_gvs[value.op.name_hint],
                                        list(C.array_items(value.args)),
                                        isinstance(block, relax.DataflowBlock))
                binding = relax.VarBinding(binding.var, call)
            kept.append(binding)
        blocks.append(make_block(kept, isinstance(block, relax.DataflowBlock)))
    return rebuild_function(func, blocks)


def external_functions(mod: tvm.IRModule, compiler: str | None = None) -> dict[str, relax.Function]:
    """``{name: function}`` of the functions carrying ``Codegen`` (optionally of one compiler)."""
    return {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, relax.Function) and attr(f, CODEGEN) is not None
            and (compiler is None or str(f.attrs[CODEGEN]) == compiler)}


def inline_external(mod: tvm.IRModule) -> tvm.IRModule:
    """Inline external functions and composites back, so that ``mod`` builds for llvm."""
    return defuse(mod, ("codegen", "composite", "partition"))


__all__ = ["AnnotateTarget", "PartitionGraph", "annotation_table", "partition_graph",
           "external_functions", "inline_external"]
