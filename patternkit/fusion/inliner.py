"""The DefuseOps walk: every binding visited once, selected calls replaced by their callee.

See :mod:`patternkit.fusion.defuser` for the algorithm.  :class:`Inliner` holds what one
run over one module shares (the selected kinds, the per-callee caches, the inlining
stack); the per-``SeqExpr`` and per-block state is in :mod:`patternkit.fusion.seq_state`.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..errors import MalformedIRError
from ..ir import compat as C
from ..ir.compat import array_items, new_dataflow_var
from ..ir.kinds import function_kinds
from ..ir.rebuild import binding_text, make_block, rebuild_function
from ..ir.walk import CALL, FUNCTION, GLOBAL_VAR, IF, TUPLE, VAR, expr_kind
from .seq_state import BlockCursor, InlinedTuple, SeqState, make_binding
from .symbolic import SymbolicBinder
from .templates import CalleeTemplate

__all__ = ["Inliner"]


class Inliner:
    """One DefuseOps run over one module.

    Parameters
    ----------
    mod : tvm.IRModule
        The module; it is only read.
    kinds : frozenset of str
        The function kinds to inline (:data:`patternkit.fusion.DEFUSE_KINDS`).
    check_well_formed : bool
        Check each global callee before its first inlining.
    max_depth : int
        Deepest nesting of inlined calls inside inlined functions.
    """

    def __init__(self, mod: tvm.IRModule, kinds: frozenset, check_well_formed: bool,
                 max_depth: int):
        self.kinds = kinds
        self.check_wf = check_well_formed
        self.max_depth = max_depth
        self.by_name = {gv.name_hint: func for gv, func in mod.functions.items()}
        self.inlined_globals: set[str] = set()
        self.calls_inlined = 0
        self._checked: set[str] = set()
        self._selected: dict[str, bool] = {}
        self._templates: dict = {}  # id(func) -> (func, template); func keeps the id valid
        self._symbolic = SymbolicBinder()
        self._stack: list[str] = []

    # ----------------------------------------------------------------- walking
    def visit_function(self, func: relax.Function, scope: dict, where: str) -> relax.Function:
        """Return the defused function, or ``func`` itself when nothing changed."""
        body = func.body
        if not isinstance(body, relax.SeqExpr):
            return func
        new_body = self.visit_seq(body, scope, where)
        if new_body is body:
            return func
        # everything below already has its type; one normalisation types the SeqExprs
        return rebuild_function(func, new_body)

    def visit_seq(self, seq: relax.SeqExpr, scope: dict, where: str) -> relax.SeqExpr:
        """Return the defused SeqExpr, or ``seq`` itself when nothing changed."""
        scope = dict(scope)
        state = SeqState()
        emitted = []
        for block in array_items(seq.blocks):
            cursor = BlockCursor([], isinstance(block, relax.DataflowBlock), scope, state, where)
            for binding in array_items(block.bindings):
                self._visit_binding(binding.var, binding.value, binding, cursor)
            emitted.append((block, cursor))
        body = seq.body
        new_body = body
        if expr_kind(body) is CALL and self._callee(body, scope, where, None) is not None:
            # a non-ANF body (possible in hand-built IR): bind it so it can be spliced
            new_body = relax.Var("defused", body.ty)
            cursor = BlockCursor([], False, scope, state, where)
            self._visit_binding(new_body, body, None, cursor)
            emitted.append((None, cursor))
        state.note_uses(new_body)
        dead = state.dead_vars()
        if state.renames:
            state.collapse_renames()
        changed = new_body is not body
        blocks = []
        for block, cursor in emitted:
            out = cursor.out
            if dead:
                out = [item for item in out if item[0] not in dead]
            if state.renames:
                out = [state.apply_rename(item) for item in out]
            bindings = [make_binding(item) for item in out]
            if block is not None and len(bindings) == len(block.bindings) and all(
                    n.same_as(o) for n, o in zip(bindings, block.bindings)):
                blocks.append(block)
                continue
            changed = True
            if bindings:
                blocks.append(make_block(bindings, cursor.dataflow,
                                         block.span if block is not None else None))
        if not changed:
            return seq
        return relax.SeqExpr(blocks, new_body, seq.span)

    def _visit_binding(self, var, value, original, cursor: BlockCursor, match_ty=None) -> None:
        """Emit one binding through ``cursor``: inlined when it calls a selected function.

        ``original`` is the binding as it stands in the input (``None`` for one made by
        inlining); it is reused when nothing about it changes.
        """
        if original is not None and type(original) is relax.MatchCast:
            match_ty = original.ty
        callee = None if match_ty is not None else self._callee(value, cursor.scope,
                                                                 cursor.where, var)
        if callee is not None:
            self._inline(var, value, callee, cursor)
            return
        kind = expr_kind(value)
        if kind is FUNCTION:
            value = self.visit_function(value, cursor.scope, f"{cursor.where}/{C.var_name(var)}")
            cursor.scope[var] = value
            if function_kinds(value) & self.kinds:
                cursor.state.removable[var] = False
        elif kind is IF:
            value = self._visit_if(value, cursor.scope, cursor.where)
        state = cursor.state
        if state.take_over_field(var, value, cursor.out):
            return
        state.note_uses(value)
        cursor.out.append((var, value, match_ty, original))

    def _visit_if(self, value: relax.If, scope: dict, where: str) -> relax.If:
        true_b = value.true_branch
        false_b = value.false_branch
        new_t, new_f = true_b, false_b
        if isinstance(true_b, relax.SeqExpr):
            new_t = self.visit_seq(true_b, scope, where)
        if isinstance(false_b, relax.SeqExpr):
            new_f = self.visit_seq(false_b, scope, where)
        if new_t is true_b and new_f is false_b:
            return value
        return relax.If(value.cond, new_t, new_f, value.span)

    # ----------------------------------------------------------------- inlining
    def _inline(self, var, call, callee: relax.Function, cursor: BlockCursor) -> None:
        """Emit ``callee``'s bindings in place of ``var = call``."""
        op = call.op
        name = C.var_name(op)
        where = cursor.where
        args = array_items(call.args)
        if len(args) != len(callee.params):
            raise MalformedIRError(
                f"DefuseOps: {where}: '{name}' takes {len(callee.params)} argument(s) but is "
                f"called with {len(args)} (call site: {binding_text(var, call)})")
        if len(self._stack) >= self.max_depth or name in self._stack:
            raise MalformedIRError(
                f"DefuseOps: {where}: '{name}' is (mutually) recursive or nested deeper than "
                f"{self.max_depth} levels (inlining stack {self._stack + [name]})")
        if type(op) is tvm.ir.GlobalVar:
            self.inlined_globals.add(name)
        self.calls_inlined += 1
        func = self._symbolic.bind(callee, args, where, var, call)
        tpl = self._template(func, name, where, var, call)
        mapping = dict(zip(tpl.params, args))
        make_var = new_dataflow_var if cursor.dataflow else relax.Var
        state = cursor.state
        out = cursor.out
        inner = cursor
        # fresh vars only matter when a returned tuple's fields may be taken over
        fresh = state.fresh if tpl.returns_tuple else None
        self._stack.append(name)
        try:
            for b in tpl.bindings:
                if b.is_result:
                    new_var = var
                else:
                    new_var = make_var(b.name, b.ty, None)
                    if fresh is not None:
                        fresh.add(new_var)
                new_value = b.value.instantiate(mapping)
                mapping[b.var] = new_var
                if inner is cursor and b.binds_function:
                    inner = cursor.with_scope(dict(cursor.scope))
                if b.may_call or b.match_ty is not None or state.tracking():
                    self._visit_binding(new_var, new_value, None, inner, match_ty=b.match_ty)
                else:
                    out.append((new_var, new_value, None, None))
        finally:
            self._stack.pop()
        if not tpl.result_is_bound:
            new_result = tpl.result.instantiate(mapping)
            state.note_uses(new_result)
            out.append((var, new_result, None, None))
            if expr_kind(new_result) is TUPLE:
                state.tuples[var] = InlinedTuple(out, new_result)

    def _template(self, func, name, where, var, call) -> CalleeTemplate:
        key = id(func)
        entry = self._templates.get(key)
        if entry is None:
            if not isinstance(func.body, relax.SeqExpr):
                raise MalformedIRError(
                    f"DefuseOps: {where}: the body of '{name}' is not a SeqExpr; normalise "
                    f"the module first (call site: {binding_text(var, call)})")
            entry = self._templates[key] = (func, CalleeTemplate(func, len(call.args)))
        return entry[1]

    # ----------------------------------------------------------------- callees
    def _callee(self, value, scope: dict, where: str, var) -> relax.Function | None:
        """The function a call inlines to, or ``None`` when the call stays."""
        if expr_kind(value) is not CALL:
            return None
        op = value.op
        op_kind = expr_kind(op)
        if op_kind is GLOBAL_VAR:
            return self._global_callee(op, where, var, value)
        if op_kind is VAR and op in scope:
            func = scope[op]
            if function_kinds(func) & self.kinds:
                return func
        return None

    def _global_callee(self, gvar, where: str, var, value) -> relax.Function | None:
        name = gvar.name_hint
        func = self.by_name.get(name)
        if func is None:
            raise MalformedIRError(
                f"DefuseOps: {where}: call to the global '{name}', which is not in the module "
                f"(call site: {binding_text(var, value)})")
        selected = self._selected.get(name)
        if selected is None:
            selected = self._selected[name] = (isinstance(func, relax.Function)
                                               and bool(function_kinds(func) & self.kinds))
        if not selected:
            return None
        if self.check_wf and name not in self._checked:
            self._check_well_formed(gvar, func, where, var, value)
            self._checked.add(name)
        return func

    def _check_well_formed(self, gvar, func, where: str, var, value) -> None:
        """Check one callee in a module holding it and the globals it refers to."""
        functions = {gvar: func}
        for ref in relax.analysis.all_global_vars(func):
            target = self.by_name.get(ref.name_hint)
            if target is None:
                raise MalformedIRError(
                    f"DefuseOps: function '{gvar.name_hint}' (called from {where}: "
                    f"{binding_text(var, value)}) refers to the global '{ref.name_hint}', "
                    f"which is not in the module")
            functions[ref] = target
        try:
            relax.analysis.well_formed(tvm.IRModule(functions))
        except Exception as err:  # the C++ checker raises a plain TVM error
            raise MalformedIRError(
                f"DefuseOps: function '{gvar.name_hint}' (called from {where}: "
                f"{binding_text(var, value)}) is not well formed: {err}") from err
