"""Undo fusion and partitioning: inline the functions that fusion passes create.

Relay had ``relay.transform.DefuseOps`` with the promise ``DefuseOps(FuseOps(x)) == x``.
Relax 0.27 has no such pass, and its general-purpose inliners
(``relax.transform.InlinePrivateFunctions``, ``Function.inline_functions``) leave undefined
symbolic variables behind when a fused function has symbolic shapes, and scale with an
exponent of about 1.7 in the number of call sites.  This module inlines, in one linear
pass, the calls to the functions that these passes create:

``"primitive"``
    private global functions with ``{"Primitive": True}`` from ``relax.transform.FuseOps``
    (``call_tir`` bodies after ``LegalizeOps`` + ``AnnotateTIROpPattern``), including
    groups that return tuples, partially used tuple parameters (``lv_0``, ``lv_1``),
    constants lifted to parameters, and symbolic variables a group needs beyond its tensor
    shapes (the extra ``tir_vars: R.Shape([n])`` parameter, or a scalar ``T.int64`` one);
``"composite"``
    functions with a ``Composite`` attribute: the private globals of
    ``FuseOpsByPattern`` and the local composite functions that
    ``FuseOpsByPattern(annotate_codegen=True)`` and ``MergeCompositeFunctions`` nest inside
    a ``Codegen`` function;
``"codegen"``
    public functions with a ``Codegen`` attribute (``annotate_codegen=True`` and
    ``MergeCompositeFunctions`` output);
``"partition"``
    local functions carrying ``PartitionedFromPattern``, bound inside a block and called
    through their variable, as :func:`patternkit.partition` produces them.

Algorithm
---------
Every Relax function of the module is walked once, block by block.  A binding
``v = f(a1, ..., ak)`` whose callee is of a selected kind is replaced by the callee's
bindings, with the parameters replaced by the arguments, every variable the callee binds
replaced by a fresh one (a ``DataflowVar`` inside a dataflow block, a ``Var`` elsewhere)
and the callee's result variable replaced by ``v`` itself, so that no alias binding is
left behind.  Symbolic variables of the callee are first bound to the caller's shape
expressions, inferred from the argument types (this is the step that ``InlinePrivateFunctions``
misses).  Spliced bindings go through the same walk, so nested fused calls (a ``Codegen``
function holding ``Composite`` local functions) are undone in the same pass.  A tuple
returned by a multi-output group is not materialised when its only users are
``TupleGetItem`` bindings: each such binding takes over the definition of its field.
Local functions and globals of a selected kind are deleted once their calls have been
inlined and nothing refers to them any more; a fused function that had no caller to
begin with is left alone, since this pass did not orphan it.

Every per-call-site step costs time proportional to the callee, never to the caller: the
caller is only walked in Python, and no caller-sized container crosses the FFI (the
rewrite-engine notes, section 3.4, show how a function-sized ``Map`` per call site turns
linear into quadratic), so the pass is linear in the module size.  Each callee is read
into a Python template once; a call site then costs a handful of FFI constructor calls
per callee binding.  See ``benchmarks/README.md`` for measurements.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import tvm
from tvm import relax

from ..errors import MalformedIRError
from ..ir import compat as C
from ..ir.kinds import FunctionKind
from ..ir.kinds import function_kinds as _attr_kinds

__all__ = ["DEFUSE_KINDS", "DefuseOps", "defuse", "function_kinds"]

logger = logging.getLogger(__name__)

#: The kinds of functions :func:`defuse` can inline, in the order they are documented.
DEFUSE_KINDS = tuple(kind.value for kind in FunctionKind)

# Values that never contain a Relax variable (prim values are tirx IntImm/FloatImm, i.e.
# Constants, in 0.27; DataTypeImm/StringImm moved around between releases).
_LEAF_TYPES = tuple(t for t in (
    tvm.ir.Constant, relax.ShapeExpr, tvm.ir.GlobalVar, tvm.ir.Op, relax.ExternFunc,
    getattr(tvm.ir, "StringImm", None), getattr(relax, "DataTypeImm", None),
    getattr(relax, "PrimValue", None)) if isinstance(t, type))


def function_kinds(func) -> frozenset:
    """The defuse kinds a function belongs to (empty for an ordinary function).

    See :func:`patternkit.ir.kinds.function_kinds`; the kinds compare equal to their
    names (``"primitive"``, ``"composite"``, ``"codegen"``, ``"partition"``).
    """
    if not isinstance(func, relax.Function):
        return frozenset()
    return _attr_kinds(func)


def _normalize_kinds(kinds) -> frozenset:
    if kinds is None or kinds == "all":
        return frozenset(DEFUSE_KINDS)
    if isinstance(kinds, str):
        kinds = (kinds,)
    selected = frozenset(k.lower() for k in kinds)
    unknown = selected - set(DEFUSE_KINDS)
    if unknown:
        raise ValueError(f"DefuseOps: unknown kind(s) {sorted(unknown)}; "
                         f"expected a subset of {DEFUSE_KINDS}")
    return selected


def _binding_text(var, value) -> str:
    """``"lv = fused_add(x, y)"``, on one line, for error messages."""
    try:
        text = str(value)
    except Exception:  # printing must never hide the real error
        text = type(value).__name__
    text = " ".join(text.split())
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{C.var_name(var)} = {text}"


_GLOBAL_VAR = tvm.ir.GlobalVar
_MATCH_CAST = relax.MatchCast
_VAR, _CALL, _TUPLE, _GETITEM, _LEAF, _FUNCTION, _IF, _OTHER = range(8)
_KIND_CACHE: dict = {}


def _kind(expr) -> int:
    """Classify an expression by its exact type, caching ``isinstance`` (TVM classes are
    ABCs, and ABC instance checks dominate a naive walk over a large module)."""
    cls = type(expr)
    kind = _KIND_CACHE.get(cls)
    if kind is None:
        if isinstance(expr, relax.Var):
            kind = _VAR
        elif isinstance(expr, relax.Call):
            kind = _CALL
        elif isinstance(expr, relax.Tuple):
            kind = _TUPLE
        elif isinstance(expr, relax.TupleGetItem):
            kind = _GETITEM
        elif isinstance(expr, _LEAF_TYPES):
            kind = _LEAF
        elif isinstance(expr, relax.Function):
            kind = _FUNCTION
        elif isinstance(expr, relax.If):
            kind = _IF
        else:
            kind = _OTHER
        _KIND_CACHE[cls] = kind
    return kind


def _leaf_vars(expr, out: list) -> None:
    """Append the Relax variables an expression reads (deep only where it must be)."""
    kind = _kind(expr)
    if kind == _VAR:
        out.append(expr)
    elif kind == _CALL:
        op = expr.op
        if _kind(op) == _VAR:
            out.append(op)
        for arg in expr.args:
            _leaf_vars(arg, out)
    elif kind == _TUPLE:
        for field in expr.fields:
            _leaf_vars(field, out)
    elif kind == _GETITEM:
        _leaf_vars(expr.tuple_value, out)
    elif kind != _LEAF:  # Function, If, SeqExpr: rare, and C++ knows their scoping rules
        out.extend(relax.analysis.free_vars(expr))


def _substitute(expr, mapping: dict, copy_functions: bool = False):
    """Replace Relax variables in an A-normal-form value, keeping types.

    Only the shapes that bindings take in normalised Relax are walked (calls whose
    arguments are leaves or tuples of leaves, tuples, tuple projections); the result keeps
    the original ``ty`` so nothing has to be re-normalised.  With ``copy_functions`` a
    local function gets fresh variables, since each inlined copy must bind its own.
    """
    kind = _kind(expr)
    if kind == _VAR:
        return mapping.get(expr, expr)
    if kind == _LEAF:
        return expr
    if kind == _CALL:
        op = expr.op
        new_op = mapping.get(op, op) if _kind(op) == _VAR else op
        changed = new_op is not op
        new_args = []
        for arg in expr.args:
            new = _substitute(arg, mapping, copy_functions)
            changed = changed or new is not arg
            new_args.append(new)
        if not changed:
            return expr
        return relax.Call(new_op, new_args, expr.attrs, expr.ty_args, expr.span, ret_ty=expr.ty)
    if kind == _TUPLE:
        changed = False
        fields = []
        for field in expr.fields:
            new = _substitute(field, mapping, copy_functions)
            changed = changed or new is not field
            fields.append(new)
        return relax.Tuple(fields, expr.span) if changed else expr
    if kind == _GETITEM:
        value = _substitute(expr.tuple_value, mapping, copy_functions)
        if value is expr.tuple_value:
            return expr
        return relax.TupleGetItem(value, expr.index, expr.span)
    free = relax.analysis.free_vars(expr)
    if any(v in mapping for v in free):
        raise MalformedIRError(
            f"DefuseOps: cannot inline a {type(expr).__name__} that captures variables of the "
            f"function being inlined; only A-normal-form bodies are supported")
    if copy_functions and kind == _FUNCTION:
        return relax.utils.copy_with_new_vars(expr)
    return expr


def _dims(shape):
    if shape is None:
        return None
    values = getattr(shape, "values", None)
    return list(values) if values is not None else None


def _match_symbolic(param_ty, arg_ty, smap: dict) -> None:
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
                _match_symbolic(p, a, smap)
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


def _bind_symbolic_vars(func, smap: dict):
    """``func.bind_symbolic_vars(smap)``, also when the new expressions use caller vars the
    callee cannot define (a scalar ``T.int64`` parameter bound to the caller's ``m``).

    The C++ binder insists the result defines every symbolic var it uses.  A trailing
    ``R.Shape([caller vars])`` parameter defines them; it is dropped again by
    :class:`_Template`, which only reads the first ``len(original params)`` parameters.
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


def _cache_key(value):
    if tvm.ir.is_prim_var(value):
        return value
    if isinstance(value, tvm.tirx.IntImm):
        return (str(value.dtype), int(value))
    return None


class _Defuser:
    """One defuse run over one module; holds the per-callee caches."""

    def __init__(self, mod: tvm.IRModule, kinds: frozenset, check_well_formed: bool,
                 max_depth: int):
        self.mod = mod
        self.kinds = kinds
        self.check_wf = check_well_formed
        self.max_depth = max_depth
        self.by_name = {gv.name_hint: func for gv, func in mod.functions.items()}
        self.inlined_globals: set[str] = set()
        self._checked: set[str] = set()
        self._symvars: dict = {}
        self._bound_cache: dict = {}
        self._templates: dict = {}
        self._selected: dict = {}
        self.stack: list[str] = []
        self.calls_inlined = 0

    # ----------------------------------------------------------------- callees
    def _global_callee(self, gvar, where: str, var, value):
        name = gvar.name_hint
        func = self.by_name.get(name)
        if func is None:
            raise MalformedIRError(
                f"DefuseOps: {where}: call to the global '{name}', which is not in the module "
                f"(call site: {_binding_text(var, value)})")
        selected = self._selected.get(name)
        if selected is None:
            selected = self._selected[name] = bool(function_kinds(func) & self.kinds)
        if not selected:
            return None
        if self.check_wf and name not in self._checked:
            self._check_well_formed(gvar, func, where, var, value)
            self._checked.add(name)
        return func

    def _check_well_formed(self, gvar, func, where, var, value) -> None:
        """Check one callee in a module holding it and the globals it refers to."""
        functions = {gvar: func}
        for ref in relax.analysis.all_global_vars(func):
            target = self.by_name.get(ref.name_hint)
            if target is None:
                raise MalformedIRError(
                    f"DefuseOps: function '{gvar.name_hint}' (called from {where}: "
                    f"{_binding_text(var, value)}) refers to the global '{ref.name_hint}', "
                    f"which is not in the module")
            functions[ref] = target
        try:
            relax.analysis.well_formed(tvm.IRModule(functions))
        except Exception as err:  # the C++ checker raises a plain TVM error
            raise MalformedIRError(
                f"DefuseOps: function '{gvar.name_hint}' (called from {where}: "
                f"{_binding_text(var, value)}) is not well formed: {err}") from err

    def _bind_symbolic(self, func, args, where, var, value):
        """Rename the callee's symbolic variables to the caller's shape expressions."""
        key = id(func)
        symvars = self._symvars.get(key)
        if symvars is None:
            symvars = list(relax.analysis.defined_symbolic_vars(func))
            self._symvars[key] = (func, symvars)
        else:
            symvars = symvars[1]
        if not symvars:
            return func
        smap: dict = {}
        for param, arg in zip(func.params, args):
            if tvm.ir.is_prim_var(param):
                # a scalar symbolic parameter (FuseOps' lifted ``tir_vars``): the argument
                # is the caller's PrimExpr itself
                smap.setdefault(param, arg)
            else:
                _match_symbolic(param.ty, C.type_of(arg), smap)
        missing = [v.name for v in symvars if v not in smap]
        if missing:
            raise MalformedIRError(
                f"DefuseOps: {where}: cannot infer the symbolic variable(s) {missing} of the "
                f"callee from the arguments of {_binding_text(var, value)}")
        smap = {v: smap[v] for v in symvars}
        if all(v.same_as(e) for v, e in smap.items()):
            return func
        keys = tuple(_cache_key(e) for e in smap.values())
        cache_key = (key, keys) if all(k is not None for k in keys) else None
        if cache_key is not None and cache_key in self._bound_cache:
            return self._bound_cache[cache_key]
        bound = _bind_symbolic_vars(func, smap)
        if cache_key is not None:
            self._bound_cache[cache_key] = bound
        return bound

    # ----------------------------------------------------------------- walking
    def visit_function(self, func, scope: dict, where: str):
        """Return the defused function, or ``func`` itself when nothing changed."""
        body = func.body
        if not isinstance(body, relax.SeqExpr):
            return func
        new_body = self.visit_seq(body, scope, where)
        if new_body is body:
            return func
        new_func = relax.Function(func.params, new_body, func.ret_ty, func.is_pure,
                                  func.attrs, func.span)
        # SeqExpr/If built from Python carry no type yet; one C++ normalisation per
        # rewritten function fills them in (everything below already has its type)
        return relax.BlockBuilder().normalize(new_func)

    def visit_seq(self, seq, scope: dict, where: str):
        """Return the defused SeqExpr, or ``seq`` itself when nothing changed."""
        scope = dict(scope)
        state = _SeqState()
        emitted = []
        for block in seq.blocks:
            is_df = isinstance(block, relax.DataflowBlock)
            out: list = []
            for binding in block.bindings:
                self._visit_binding(binding.var, binding.value, binding, out, is_df, scope,
                                    state, where)
            emitted.append((block, is_df, out))
        body = seq.body
        new_body = body
        if isinstance(body, relax.Call) and self._callee(body, scope, where, None) is not None:
            # a non-ANF body (possible in hand-built IR): bind it so it can be spliced
            tmp = relax.Var("defused", body.ty)
            out = []
            self._visit_binding(tmp, body, None, out, False, scope, state, where)
            emitted.append((None, False, out))
            new_body = tmp
        state.note_uses(new_body)
        dead = state.dead_vars()
        changed = new_body is not body
        blocks = []
        for block, is_df, out in emitted:
            if dead:
                out = [item for item in out if item[0] not in dead]
            if state.renames:
                out = [state.apply_rename(item) for item in out]
            bindings = [_make_binding(item) for item in out]
            if block is not None and len(bindings) == len(block.bindings) and all(
                    n.same_as(o) for n, o in zip(bindings, block.bindings)):
                blocks.append(block)
                continue
            changed = True
            if bindings:
                cls = relax.DataflowBlock if is_df else relax.BindingBlock
                blocks.append(cls(bindings, block.span if block is not None else None))
        if not changed:
            return seq
        return relax.SeqExpr(blocks, new_body, seq.span)

    def _callee(self, value, scope, where, var):
        """The function a call inlines to, or ``None`` when the call stays."""
        if _kind(value) != _CALL:
            return None
        op = value.op
        op_kind = _kind(op)
        if op_kind == _LEAF and type(op) is _GLOBAL_VAR:
            return self._global_callee(op, where, var, value)
        if op_kind == _VAR and op in scope:
            func = scope[op]
            if function_kinds(func) & self.kinds:
                return func
        return None

    def _visit_binding(self, var, value, original, out, is_df, scope, state, where,
                       match_ty=None):
        """Emit one binding into ``out``: inlined when its value calls a selected function.

        ``out`` collects ``(var, value, match_cast_type, original_binding)`` tuples; the
        original binding is reused when nothing about it changed.
        """
        if original is not None and type(original) is _MATCH_CAST:
            match_ty = original.ty
        callee = None if match_ty is not None else self._callee(value, scope, where, var)
        if callee is not None:
            self._inline(var, value, callee, out, is_df, scope, state, where)
            return
        kind = _kind(value)
        if kind == _FUNCTION:
            value = self.visit_function(value, scope, f"{where}/{C.var_name(var)}")
            scope[var] = value
            if function_kinds(value) & self.kinds:
                state.removable[var] = False
        elif kind == _IF:
            value = self._visit_if(value, scope, where)
        if state.take_over_field(var, value, out):
            return
        state.note_uses(value)
        out.append((var, value, match_ty, original))

    def _visit_if(self, value, scope, where):
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

    def _template(self, func, name, where, var, call) -> _Template:
        key = id(func)
        entry = self._templates.get(key)
        if entry is None:
            body = func.body
            if not isinstance(body, relax.SeqExpr):
                raise MalformedIRError(
                    f"DefuseOps: {where}: the body of '{name}' is not a SeqExpr; normalise "
                    f"the module first (call site: {_binding_text(var, call)})")
            entry = (func, _Template(func, len(call.args)))  # keep func alive: key is its id
            self._templates[key] = entry
        return entry[1]

    def _inline(self, var, call, callee, out, is_df, scope, state, where):
        op = call.op
        name = C.var_name(op)
        args = list(call.args)
        if len(args) != len(callee.params):
            raise MalformedIRError(
                f"DefuseOps: {where}: '{name}' takes {len(callee.params)} argument(s) but is "
                f"called with {len(args)} (call site: {_binding_text(var, call)})")
        if len(self.stack) >= self.max_depth or name in self.stack:
            raise MalformedIRError(
                f"DefuseOps: {where}: '{name}' is (mutually) recursive or nested deeper than "
                f"{self.max_depth} levels (inlining stack {self.stack + [name]})")
        if type(op) is _GLOBAL_VAR:
            self.inlined_globals.add(name)
        self.calls_inlined += 1
        func = self._bind_symbolic(callee, args, where, var, call)
        tpl = self._template(func, name, where, var, call)
        mapping = dict(zip(tpl.params, args))
        make_var = _make_dataflow_var if is_df else _make_var
        inner_scope = scope
        # fresh vars only matter when a returned tuple's fields may be taken over
        fresh = state.fresh if tpl.returns_tuple else None
        self.stack.append(name)
        try:
            for old, var_name, ty, value_tpl, match_ty, is_result, may_call in tpl.bindings:
                if is_result:
                    new_var = var
                else:
                    new_var = make_var(var_name, ty, None)
                    if fresh is not None:
                        fresh.add(new_var)
                new_value = _instantiate(value_tpl, mapping)
                mapping[old] = new_var
                if value_tpl[0] == "f" and inner_scope is scope:
                    inner_scope = dict(scope)
                if may_call or match_ty is not None or state.tracking():
                    self._visit_binding(new_var, new_value, None, out, is_df, inner_scope,
                                        state, where, match_ty=match_ty)
                else:
                    out.append((new_var, new_value, None, None))
        finally:
            self.stack.pop()
        if tpl.result_index is None:
            new_result = _instantiate(tpl.result, mapping)
            state.note_uses(new_result)
            out.append((var, new_result, None, None))
            if _kind(new_result) == _TUPLE:
                state.tuples[var] = [out, new_result, False]


_FFI_CALL = getattr(tvm.ir._ffi_api, "Call", None)  # pylint: disable=protected-access
_FFI_TUPLE = getattr(tvm.ir._ffi_api, "Tuple", None)  # pylint: disable=protected-access
_FFI_DATAFLOW_VAR = getattr(relax._ffi_api, "DataflowVar", None)  # pylint: disable=protected-access
_FFI_VAR = getattr(tvm.ir._ffi_api, "Var", None)  # pylint: disable=protected-access


def _make_dataflow_var(name, ty, span):
    if _FFI_DATAFLOW_VAR is not None:
        return _FFI_DATAFLOW_VAR(name, ty, span)
    return relax.DataflowVar(name, ty, span)


def _make_var(name, ty, span):
    return relax.Var(name, ty, span)


def _compile(expr):
    """A Python-side template of an A-normal-form value, so each call site rebuilds it
    without going back through the FFI to read the callee."""
    kind = _kind(expr)
    if kind == _VAR:
        return ("v", expr)
    if kind == _LEAF:
        return ("l", expr)
    if kind == _CALL:
        op = expr.op
        op_tpl = ("v", op) if _kind(op) == _VAR else ("l", op)
        return ("c", op_tpl, [_compile(a) for a in expr.args], expr.attrs, expr.ty_args,
                expr.span, expr.ty)
    if kind == _TUPLE:
        return ("t", [_compile(f) for f in expr.fields], expr.span)
    if kind == _GETITEM:
        return ("g", _compile(expr.tuple_value), expr.index, expr.span)
    if kind == _FUNCTION:
        return ("f", expr)
    return ("x", expr)


def _instantiate(tpl, mapping):
    tag = tpl[0]
    if tag == "v":
        return mapping.get(tpl[1], tpl[1])
    if tag == "l":
        return tpl[1]
    if tag == "c":
        _, op_tpl, args, attrs, ty_args, span, ty = tpl
        op = _instantiate(op_tpl, mapping)
        new_args = [_instantiate(a, mapping) for a in args]
        if _FFI_CALL is not None:
            return _FFI_CALL(ty, op, new_args, attrs, ty_args, span)
        return relax.Call(op, new_args, attrs, ty_args, span, ret_ty=ty)
    if tag == "t":
        fields = [_instantiate(f, mapping) for f in tpl[1]]
        if _FFI_TUPLE is not None:
            return _FFI_TUPLE(fields, tpl[2])
        return relax.Tuple(fields, tpl[2])
    if tag == "g":
        return relax.TupleGetItem(_instantiate(tpl[1], mapping), tpl[2], tpl[3])
    return _substitute(tpl[1], mapping, copy_functions=True)


class _Template:
    """A callee read once into Python: parameters, bindings and result as templates."""

    def __init__(self, func, num_params: int):
        body = func.body
        self.params = list(func.params)[:num_params]
        result = body.body
        blocks = list(body.blocks)
        result_var = None
        if _kind(result) == _VAR and blocks:
            last = blocks[-1].bindings
            if len(last) and last[-1].var.same_as(result):
                result_var = result
        self.bindings = []
        old_vars = {}
        for block in blocks:
            for b in block.bindings:
                old = b.var
                value = b.value
                tpl = _compile(value)
                is_result = result_var is not None and old.same_as(result_var)
                # only calls (and local function values) can need inlining themselves
                may_call = tpl[0] == "c" and (tpl[1][0] == "v" or type(value.op) is _GLOBAL_VAR)
                may_call = may_call or tpl[0] == "f"
                match_ty = b.ty if type(b) is _MATCH_CAST else None
                old_vars[old] = True
                self.bindings.append((old, old.name, old.ty, tpl, match_ty, is_result, may_call))
        # templates must refer to the very Python objects used as mapping keys
        canon = {v: v for v in self.params}
        canon.update((b[0], b[0]) for b in self.bindings)
        self.bindings = [(old, n, ty, _canon(tpl, canon), m, r, c)
                         for old, n, ty, tpl, m, r, c in self.bindings]
        self.result_index = None if result_var is None else len(self.bindings) - 1
        self.result = _canon(_compile(result), canon)
        self.returns_tuple = self.result_index is None and self.result[0] == "t"


def _canon(tpl, canon):
    """Point every var in a template at the canonical Python wrapper of that var, so that
    dict lookups hit by identity instead of falling back to the slow ``__eq__``."""
    tag = tpl[0]
    if tag == "v":
        return ("v", canon.get(tpl[1], tpl[1]))
    if tag == "c":
        return ("c", _canon(tpl[1], canon), [_canon(a, canon) for a in tpl[2]]) + tpl[3:]
    if tag == "t":
        return ("t", [_canon(f, canon) for f in tpl[1]], tpl[2])
    if tag == "g":
        return ("g", _canon(tpl[1], canon), tpl[2], tpl[3])
    return tpl


def _make_binding(item):
    var, value, ty, original = item
    if original is not None and original.var.same_as(var) and original.value.same_as(value):
        return original
    if ty is not None:
        return relax.MatchCast(var, value, ty)
    return relax.VarBinding(var, value)


class _SeqState:
    """Use tracking for the bindings :class:`_Defuser` may drop or rewrite in one SeqExpr.

    Only two kinds of bindings are ever removed: local functions of a selected kind once no
    call refers to them, and tuples built from an inlined multi-output group whose users
    were all ``TupleGetItem`` bindings that took over their fields.  Everything else,
    including dead code that was already there, is kept.
    """

    def __init__(self):
        self.removable: dict = {}   # local function var -> referenced?
        self.tuples: dict = {}      # inlined tuple var -> [block list, Tuple literal, used?]
        self.fresh: set = set()     # vars created by inlining
        self.renames: dict = {}     # fresh field var -> projection var that replaces it

    def tracking(self) -> bool:
        """Whether emitted values must be scanned for uses of droppable bindings."""
        return bool(self.removable or self.tuples)

    def note_uses(self, value) -> None:
        if not self.removable and not self.tuples:
            return
        leaves: list = []
        _leaf_vars(value, leaves)
        for v in leaves:
            if v in self.removable:
                self.removable[v] = True
            info = self.tuples.get(v)
            if info is not None:
                info[2] = True

    def take_over_field(self, var, value, out) -> bool:
        """``v = t[i]`` with ``t`` an inlined tuple: ``v`` replaces the field's own var.

        Returns True when the projection binding is no longer needed.  Only fresh vars
        of the same block are renamed, so no caller variable ever changes.
        """
        if _kind(value) != _GETITEM:
            return False
        info = self.tuples.get(value.tuple_value)
        if info is None or info[0] is not out:
            return False
        field = info[1].fields[value.index]
        if field not in self.fresh or field in self.renames:
            return False
        self.renames[field] = var
        return True

    def dead_vars(self) -> set:
        dead = {v for v, used in self.removable.items() if not used}
        dead.update(v for v, info in self.tuples.items() if not info[2])
        return dead

    def apply_rename(self, item):
        var, value, ty, original = item
        new_var = self.renames.get(var, var)
        new_value = _substitute(value, self.renames)
        if new_var is var and new_value is value:
            return item
        return (new_var, new_value, ty, None)


def defuse(mod: tvm.IRModule, kinds: Iterable[str] | str | None = None, *,
           check_well_formed: bool = True, max_depth: int = 64) -> tvm.IRModule:
    """Inline calls to fused / partitioned functions and delete them once unused.

    Parameters
    ----------
    mod : tvm.IRModule
        The module to defuse.  It is never modified; a new module is returned.
    kinds : iterable of str, str or None
        Which functions to undo, a subset of :data:`DEFUSE_KINDS`
        (``"primitive"``, ``"composite"``, ``"codegen"``, ``"partition"``).  ``None`` (the
        default) or ``"all"`` selects every kind.
    check_well_formed : bool
        Check every global callee with ``relax.analysis.well_formed`` before inlining it
        (callee-sized work, once per callee).  A broken callee would otherwise spread its
        defect into every caller.
    max_depth : int
        Largest nesting of inlined calls inside inlined functions; deeper (or recursive)
        nesting raises :class:`~patternkit.errors.MalformedIRError`.

    Returns
    -------
    tvm.IRModule
        A new module; structurally equal to ``mod`` when nothing was selected to defuse.

    Raises
    ------
    MalformedIRError
        A call with the wrong number of arguments, a call to a global that is not in the
        module, a callee that is not well formed, or symbolic variables that cannot be
        inferred from the call's arguments.  The message names the calling function and
        the call site.
    """
    selected = _normalize_kinds(kinds)
    # The walk allocates many short-lived FFI wrappers; generational GC sweeps over the
    # growing set of live ones made the pass visibly superlinear, so pause it.
    with C.gc_paused():
        return _defuse(mod, selected, check_well_formed, max_depth)


def _defuse(mod, selected, check_well_formed, max_depth):
    defuser = _Defuser(mod, selected, check_well_formed, max_depth)
    functions = dict(mod.functions.items())
    updated = {}
    for gv, func in functions.items():
        if not isinstance(func, relax.Function):
            continue
        if function_kinds(func) & selected:
            continue  # inlined at its call sites; deleted below once nothing calls it
        new_func = defuser.visit_function(func, {}, gv.name_hint)
        if new_func is not func:
            updated[gv] = new_func
    functions.update(updated)
    _remove_unreferenced(functions, defuser.inlined_globals)
    logger.debug("DefuseOps: inlined %d call(s), %d function(s) rewritten",
                 defuser.calls_inlined, len(updated))
    return C.copy_module(mod, functions)


def _remove_unreferenced(functions: dict, candidates: set) -> None:
    """Delete inlined globals that no remaining function refers to.

    References are collected once per function (one C++ walk each); the fixpoint over the
    small candidate set then runs on Python sets.
    """
    if not candidates:
        return
    refs = {}
    for gv, func in functions.items():
        if isinstance(func, relax.Function):
            refs[gv.name_hint] = {ref.name_hint for ref in relax.analysis.all_global_vars(func)
                                  if ref.name_hint != gv.name_hint}
    alive = {gv.name_hint for gv in functions}
    while True:
        referenced = set()
        for name in alive:
            referenced |= refs.get(name, set())
        doomed = {name for name in alive if name in candidates and name not in referenced}
        if not doomed:
            break
        alive -= doomed
    for gv in [gv for gv in functions if gv.name_hint not in alive]:
        del functions[gv]


def DefuseOps(kinds: Iterable[str] | str | None = None, *, check_well_formed: bool = True,
              max_depth: int = 64) -> tvm.transform.Pass:  # noqa: N802 (TVM pass-factory style)
    """A module pass that undoes fusion and partitioning; see :func:`defuse`.

    Usable in ``tvm.transform.Sequential``; the pass returns a new module and leaves its
    input untouched.

    Examples
    --------
    >>> fused = relax.transform.FuseOps()(annotated)                   # doctest: +SKIP
    >>> restored = DefuseOps()(fused)                                    # doctest: +SKIP
    >>> only_composites = DefuseOps(kinds=("composite",))(byoc_module)   # doctest: +SKIP
    """
    selected = _normalize_kinds(kinds)

    def transform(mod, _ctx):
        return defuse(mod, selected, check_well_formed=check_well_formed, max_depth=max_depth)

    return tvm.transform.module_pass(transform, opt_level=0, name="DefuseOps")
