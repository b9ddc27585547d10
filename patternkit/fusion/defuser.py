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
caller is only walked in Python, and no caller-sized container crosses the FFI (one
function-sized ``Map`` per call site would turn linear into quadratic), so the pass is
linear in the module size.  Each callee is read
into a Python template once; a call site then costs a handful of FFI constructor calls
per callee binding.  See ``benchmarks/README.md`` for measurements.

The walk is :class:`~patternkit.fusion.inliner.Inliner`; callee templates are in
:mod:`~patternkit.fusion.templates`, symbolic-variable binding in
:mod:`~patternkit.fusion.symbolic`, the per-``SeqExpr`` state in
:mod:`~patternkit.fusion.seq_state`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import tvm
from tvm import relax

from ..ir import compat as C
from ..ir.kinds import FunctionKind, function_kinds as _attr_kinds
from .inliner import Inliner

__all__ = ["DEFUSE_KINDS", "DefuseOps", "defuse", "function_kinds"]

logger = logging.getLogger(__name__)

#: The kinds of functions :func:`defuse` can inline, in the order they are documented.
DEFUSE_KINDS = tuple(kind.value for kind in FunctionKind)


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
    defuser = Inliner(mod, selected, check_well_formed, max_depth)
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

    return C.module_pass(transform, "DefuseOps")
