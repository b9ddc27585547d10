"""Merging adjacent composites of one compiler into one external function.

Relay's ``MergeCompilerRegions`` + ``PartitionGraph`` become TVM's
``relax.transform.MergeCompositeFunctions`` here, which groups the composites of one
codegen into ``Codegen`` functions without ever creating a cycle through host code.
:func:`merge_compiler_regions` runs it on a module whose composites have been lifted to
private globals (``FuseOpsByPattern``'s form,
:func:`patternkit.byoc.partition.external.partition_graph` lifts them), and works around
five things the 0.27 pass does not do:

* it only looks at a function named ``main`` (``mod.GetGlobalVar("main")``) and drops
  every function ``main`` does not reach: each function with composites is run through
  it on its own, bound to ``main`` in a module of its own, and only its new ``Codegen``
  functions and its rewritten body are kept;
* it crashes ("Check failed: (memo_.count(...)) is false") on a host binding that takes a
  symbolic variable as an argument, such as ``R.arange(0, n, 1)`` in every transformers
  model exported with a dynamic batch: since TVM 0.27 a symbolic variable *is* an
  ``ir.Var``, and the pass looks it up as a Relax variable.  Such bindings are held in a
  private function for the duration of the pass (the variable then travels in an
  ``R.shape([n])`` argument, which the pass handles) and put back afterwards;
* it raises ``TypeError: Invalid type: relax.expr.MatchCast`` on any ``match_cast``
  binding in ``main`` (it casts every binding to a ``VarBinding``): TVM's ONNX importer
  writes them, for a ``Range`` over a dynamic dimension.  They are held the same way,
  the held function standing for the cast's value, and put back as ``match_cast``;
* it raises ``InternalError: Do not have a default for relax.expr.ExternFunc`` on any
  call that passes an extern function as an argument, which ``R.call_pure_packed`` and
  ``R.call_dps_packed`` do (importers' and users' calls to registered functions): such
  calls stay on the host, held the same way while the pass runs;
* it makes ``Codegen`` functions for every compiler; those of compilers not being
  partitioned for are inlined back, so their composites stay as ``MergeComposite`` made
  them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from ...fusion import defuse
from ...fusion.symbolic import detach_symbolic_vars
from ...ir import compat as C
from ...ir.kinds import CODEGEN, COMPOSITE, GLOBAL_SYMBOL, attr
from ...ir.rebuild import make_block, rebuild_function
from ...ir.targets import rewritable_functions
from ...ir.walk import CALL, TUPLE, expr_kind, substitute

__all__ = ["merge_compiler_regions"]

#: Marks, while ``MergeCompositeFunctions`` runs, the external functions of the compilers
#: being partitioned for, so that those of other compilers can be told apart and undone.
SELECTED = "patternkit.SelectedCodegen"
#: Marks a private function holding one host binding away from ``MergeCompositeFunctions``.
HELD = "patternkit.HeldBinding"
_ENTRY = "main"


def merge_compiler_regions(mod: tvm.IRModule, selected: set[str]) -> tvm.IRModule:
    """``MergeCompositeFunctions`` on every function that calls a lifted composite.

    Parameters
    ----------
    mod : tvm.IRModule
        Composites lifted to private ``Composite`` + ``Primitive`` globals.
    selected : set of str
        The compilers being partitioned for; the ``Codegen`` functions made for others
        are inlined back.

    Returns
    -------
    tvm.IRModule
        The callers rewritten to call new ``Codegen`` functions (named as
        ``MergeCompositeFunctions`` names them, made unique per caller), the lifted
        composites gone.
    """
    composites = {gv.name_hint for gv, f in mod.functions.items()
                  if isinstance(f, relax.Function) and attr(f, COMPOSITE) is not None}
    callers = [(gv, f) for gv, f in rewritable_functions(mod)
               if any(ref.name_hint in composites for ref in relax.analysis.all_global_vars(f))]
    bb = relax.BlockBuilder(tvm.IRModule())
    rewritten = {}
    caller_names = {gv.name_hint for gv, _ in callers}
    for gv, func in callers:
        rewritten[gv.name_hint] = _merge_in_function(mod, gv, func, bb, caller_names)
    functions = {}
    for gv, func in mod.functions.items():
        if gv.name_hint in composites:
            continue  # now inside the Codegen functions
        functions[gv] = rewritten.get(gv.name_hint, func)
    functions.update(bb.get().functions.items())
    out = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
    return _inline_other_codegens(out, selected)


def _merge_in_function(mod: tvm.IRModule, gv: tvm.ir.GlobalVar, func: relax.Function,
                       bb: relax.BlockBuilder, caller_names: set[str]) -> relax.Function:
    """One caller through ``MergeCompositeFunctions``; its new functions go to ``bb``.

    The other callers of composites stay out of the module the pass sees (unless this
    one calls them): the pass groups the bindings of ``main`` alone, then rewrites every
    function of the module with those groups, so a second function that calls composites
    (a gradient module's adjoint beside its primal) makes it fail with "Variable ... could
    not be found in any group".  Each caller gets its own turn.
    """
    entry, held = _hold_host_bindings(func)
    called = {ref.name_hint for ref in relax.analysis.all_global_vars(func)}
    functions = {g: f for g, f in mod.functions.items()
                 if g.name_hint != _ENTRY
                 and (g.name_hint not in caller_names or g.name_hint in called
                      or g.same_as(gv))}
    # bound to "main", the one function the pass looks at; under its own name too, so
    # that a recursive call still resolves
    functions[tvm.ir.GlobalVar(_ENTRY)] = entry.with_attr(GLOBAL_SYMBOL, _ENTRY)
    functions.update((h.gv, h.function) for h in held.values())
    before = {g.name_hint for g in functions}
    merged = relax.transform.MergeCompositeFunctions()(
        tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos))
    renamed = {}
    for new_gv, new_func in merged.functions.items():
        if new_gv.name_hint in before or attr(new_func, CODEGEN) is None:
            continue
        name = (new_gv.name_hint if gv.name_hint == _ENTRY
                else f"{gv.name_hint}_{new_gv.name_hint}")
        renamed[new_gv.name_hint] = bb.add_func(new_func.with_attr(GLOBAL_SYMBOL, name), name)
    body = _rewrite_calls(merged[_ENTRY], renamed, held)
    symbol = attr(func, GLOBAL_SYMBOL)
    return body.without_attr(GLOBAL_SYMBOL) if symbol is None else body.with_attr(
        GLOBAL_SYMBOL, symbol)


# -- holding bindings that take symbolic variables as arguments ------------------------------
@dataclass(frozen=True)
class _HeldBinding:
    """A host binding moved into a private function while ``MergeCompositeFunctions`` runs.

    ``value`` is the binding's value as it was, ``free`` the Relax variables it reads,
    in the order the held call passes them, ``match_ty`` the type a held ``match_cast``
    casts to (``None`` for a plain binding).
    """

    gv: tvm.ir.GlobalVar
    function: relax.Function
    value: Any
    free: list
    match_ty: Any = None

    def binding(self, var: relax.Var, args: list) -> Any:
        """The binding as it was, of ``var``, reading ``args`` for :attr:`free`."""
        value = substitute(self.value, dict(zip(self.free, args)))
        if self.match_ty is not None:
            return relax.MatchCast(var, value, self.match_ty)
        return relax.VarBinding(var, value)


def _symbolic_values(expr: Any, in_shapes: bool = True) -> list:
    """The symbolic variables ``expr`` passes as values, and with ``in_shapes`` also those
    in the values of a shape or a scalar expression it passes (never those only in the
    types of its arguments).
    """
    if tvm.ir.is_prim_var(expr):
        return [expr]
    if in_shapes and (tvm.ir.is_prim_expr(expr) or isinstance(expr, relax.ShapeExpr)):
        return list(relax.analysis.free_symbolic_vars(expr))
    kind = expr_kind(expr)
    if kind is CALL:
        return [v for a in C.array_items(expr.args) for v in _symbolic_values(a, in_shapes)]
    if kind is TUPLE:
        return [v for f in C.array_items(expr.fields) for v in _symbolic_values(f, in_shapes)]
    return []


def _passes_extern(expr: Any) -> bool:
    """Whether ``expr`` passes an ``ExternFunc`` as an argument, as ``R.call_pure_packed``
    and ``R.call_dps_packed`` pass the function they call (``R.call_packed`` calls it
    directly, which the pass handles).
    """
    kind = expr_kind(expr)
    if kind is CALL:
        return any(isinstance(a, relax.ExternFunc) or _passes_extern(a)
                   for a in C.array_items(expr.args))
    if kind is TUPLE:
        return any(isinstance(f, relax.ExternFunc) or _passes_extern(f)
                   for f in C.array_items(expr.fields))
    return False


def _hold_host_bindings(func: relax.Function) -> tuple[relax.Function, dict]:
    """``func`` with each ``match_cast``, each binding that reads a symbolic variable and
    each one that passes an extern function replaced by a call to a private function
    holding it; returns ``(func, {held function name: _HeldBinding})``.

    The pass drops every binding whose variable nothing reads, and a held ``match_cast``
    is often read only through the symbolic variables it defines (``range_len_0`` of an
    ONNX ``Range``): each held binding that computes with such a variable also takes the
    cast's variable as an argument, which keeps the cast, and what it reads, alive.
    """
    held: dict = {}
    if not isinstance(func.body, relax.SeqExpr):
        return func, held
    scratch = relax.BlockBuilder()
    defined_by_cast: dict = {}  # symbolic variable -> the held match_cast's Relax variable
    blocks = []
    for block in C.array_items(func.body.blocks):
        dataflow = isinstance(block, relax.DataflowBlock)
        bindings = []
        for binding in C.array_items(block.bindings):
            casts = list(dict.fromkeys(defined_by_cast[v] for v in _symbolic_values(
                binding.value) if v in defined_by_cast))
            if type(binding) is relax.MatchCast:
                for v in relax.analysis.definable_tir_vars_in_type(binding.ty):
                    defined_by_cast.setdefault(v, binding.var)
            if (casts or type(binding) is relax.MatchCast
                    or _symbolic_values(binding.value, in_shapes=False)
                    or _passes_extern(binding.value)):
                binding = _hold(scratch, binding, dataflow, held, casts)
            bindings.append(binding)
        blocks.append(make_block(bindings, dataflow, block.span))
    if not held:
        return func, held
    return rebuild_function(func, blocks), held


def _hold(bb: relax.BlockBuilder, binding: Any, dataflow: bool, held: dict,
          keep_alive: list) -> Any:
    """A ``VarBinding`` of ``binding.var`` to a call of a new private function.

    For a ``match_cast`` the function returns the value uncast: the pass only needs a
    host call there, and the cast itself comes back in :func:`_rewrite_calls`.  The call
    also passes ``keep_alive`` (read by nothing inside).
    """
    value = binding.value
    match_ty = binding.ty if type(binding) is relax.MatchCast else None
    free = [v for v in relax.analysis.free_vars(value) if not tvm.ir.is_prim_var(v)]
    params = [relax.Var(C.var_name(v), v.ty) for v in free + keep_alive]
    out = relax.Var(C.var_name(binding.var), binding.var.ty if match_ty is None else value.ty)
    body = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(
        out, substitute(value, dict(zip(free, params))))])], out)
    # the attribute names the binding: two holders alike but for the symbolic variable
    # they read (arange(0, batch), arange(0, seq)) are equal once detached, and add_func
    # would hand back the first one's global for the second
    name = f"patternkit_held_{len(held)}"
    function = relax.Function(params, body, out.ty, dataflow).with_attr(
        HELD, f"{name}: {C.var_name(binding.var)}")
    function, extra = detach_symbolic_vars(function)
    # a private global of bb's module, so that the call below is typed against it
    gv = bb.add_func(function, name)
    held[gv.name_hint] = _HeldBinding(gv, function, value, free, match_ty)
    with C.scratch_block(bb, dataflow=dataflow):
        call = bb.normalize(relax.Call(gv, list(free) + keep_alive + extra))
    return relax.VarBinding(binding.var, call)


def _rewrite_calls(func: relax.Function, renamed: dict, held: dict) -> relax.Function:
    """Calls to ``renamed`` functions retargeted, held bindings put back as they were."""
    blocks = []
    for block in C.array_items(func.body.blocks):
        dataflow = isinstance(block, relax.DataflowBlock)
        bindings = []
        for binding in C.array_items(block.bindings):
            value = binding.value
            op: Any = value.op if expr_kind(value) is CALL else None
            name = op.name_hint if type(op) is tvm.ir.GlobalVar else None
            if name in held:
                kept = held[name]
                binding = kept.binding(binding.var, C.array_items(value.args)[:len(kept.free)])
            elif name in renamed:
                binding = relax.VarBinding(binding.var, relax.Call(
                    renamed[name], value.args, value.attrs, value.ty_args, value.span,
                    ret_ty=value.ty))
            bindings.append(binding)
        blocks.append(make_block(bindings, dataflow, block.span))
    return rebuild_function(func, blocks)


# -- other compilers ---------------------------------------------------------------------------
def _inline_other_codegens(mod: tvm.IRModule, selected: set[str]) -> tvm.IRModule:
    """Undo the external functions ``MergeCompositeFunctions`` made for other compilers.

    Their composites come back as local functions, as ``MergeComposite`` made them.
    """
    others, functions = False, {}
    for gv, func in mod.functions.items():
        codegen = attr(func, CODEGEN)
        if codegen is not None and str(codegen) in selected:
            func = func.without_attr(CODEGEN).with_attr(SELECTED, str(codegen))
        elif codegen is not None:
            others = True
        functions[gv] = func
    if not others:
        return mod
    out = defuse(C.copy_module(mod, functions), "codegen")
    functions = {}
    for gv, func in out.functions.items():
        codegen = attr(func, SELECTED)
        if codegen is not None:
            func = func.without_attr(SELECTED).with_attr(CODEGEN, str(codegen))
        functions[gv] = func
    return C.copy_module(out, functions)
