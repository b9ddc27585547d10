"""Pattern tables and ``MergeComposite``: mark the subgraphs an external compiler takes.

Relay's external-compiler flow started with ``relay.transform.MergeComposite(table)``: a
list of ``(name, pattern[, check])`` entries, earlier entries winning, each match
wrapped in a function tagged ``Composite=<name>`` and ``PartitionedFromPattern=<ops>``.
This module brings that pass to Relax:

* :class:`~patternkit.byoc.tables.table.PatternTable` validates a table once;
* :func:`merge_composite` / :func:`MergeComposite` (a ``tvm.transform.Pass``) wrap every
  accepted match in a *local* function bound where the match was, exactly as
  :func:`patternkit.partition` does, with ``Composite`` and ``PartitionedFromPattern``
  (``"nn.conv2d_add_nn.relu_"``, ``"nn.conv2d_add_"`` when an optional relu is absent);
* :class:`CompositeLog` records what was formed and, for every match left alone, why.

Algorithm
---------
Each function is indexed once.  Entries are then tried in table order; entry ``k`` finds
its non-overlapping matches with Relay's grouping rules (roots from the result back to
the inputs, a match may not reuse a binding claimed by the same entry, and a match whose
intermediate result is read outside it is skipped).  A match that would take a binding
already claimed by an earlier (higher-priority) entry is vetoed before it can claim
anything, which is what running Relay's ``partition`` entry after entry gives: the
earlier entry's ops are hidden inside its composite.  Then the entry's ``check`` runs.
Finally the function is emitted once with every accepted match replaced by a call to its
composite.  Cost: one index plus one linear grouping walk per entry, one emission.

Two semantics
-------------
``semantics="relay"`` (the default for patternkit's own tables) is the above: composites
are local functions (one per match, never shared), a wildcard-matched constant becomes a
parameter (Relay's rule), and a match with an escaping intermediate is left alone.
``relax.build`` needs them lifted or inlined: :func:`patternkit.verification.numeric.build`
lifts them, :func:`patternkit.DefuseOps` inlines them back, and
:func:`patternkit.PartitionGraph` turns them into external functions.

``semantics="tvm"`` (the default for a table from :meth:`PatternTable.from_tvm`) forms
what ``relax.transform.FuseOpsByPattern(table)`` forms, structurally equal: private
global ``Composite`` + ``Primitive`` functions named ``fused_<ops>``, identical ones
shared; roots tried in program order, a later match of an entry growing over an earlier
one it contains; an intermediate read outside its match exported as an extra output
(the composite returns a tuple); only calls as roots, only dataflow blocks; TVM's checks
run on a ``PatternCheckContext``-compatible object; ``bind_constants`` and
``annotate_codegen`` as TVM's.  It does so with one index per function for all entries
(TVM runs one pass over the module per entry), and where TVM's result is wrong it does
what TVM intends instead (:mod:`patternkit.byoc.merge.tvm_fusion`: a partial overlap keeps the
earlier match whole; a match that would depend on itself is skipped).  Both matchers
treat ``add``/``multiply`` as commutative and re-associate ``divide``/``multiply``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import tvm
from tvm import relax

from ...dpl.pattern import required_op_names, root_op_names
from ...engine.emit import emit_rewrites
from ...engine.index import FunctionIndex, has_candidates
from ...engine.module_scope import module_in_scope
from ...engine.outline import build_group_function, lifted_inputs, uses_symbolic_vars
from ...engine.proposal import Group, Skipped, find_groups, group_check
from ...engine.rule import Reject, judge, reject
from ...engine.skip import SkipKind
from ...engine.wellformed import check_input, check_shape, checked
from ...errors import CallbackError
from ...fusion.symbolic import detach_symbolic_vars
from ...ir import compat as C
from ...ir.kinds import COMPOSITE, PARTITIONED_FROM_PATTERN, attr
from ...ir.opnames import relay_short_name
from ...ir.rebuild import describe_binding, make_block
from ...ir.targets import apply_to_target, rewritable_functions
from ...ir.walk import substitute
from ..tables.check_context import CheckSite
from ..tables.table import CompositeEntry, PatternTable, PatternTableError
from .fused_functions import build_composite, emit_module
from .global_functions import FunctionTable
from .tvm_fusion import FunctionPlan, PlannedComposite, candidate_keys, plan_module

logger = logging.getLogger(__name__)


# -- the log -------------------------------------------------------------------------------
@dataclass(frozen=True)
class FormedComposite:
    """A composite that was formed: its entry, the function it is in, the ops it took."""

    entry: str
    function: str
    root: str
    vars: tuple[str, ...]
    partitioned_from: str


@dataclass(frozen=True)
class SkippedComposite:
    """A match that did not become a composite.

    ``kind`` is the engine's :class:`~patternkit.engine.skip.SkipKind` (a ``str`` enum:
    ``kind == "check"`` holds): ``CHECK`` (the entry's check vetoed it, ``rejection`` is
    its :class:`~patternkit.engine.rule.Reject`), ``OVERLAP`` (a binding was already
    taken, ``by`` names the entry that took it), ``ESCAPE`` (an intermediate result is
    read outside the match; Relay's semantics only) or ``CYCLE`` (fusing it would make
    the composite depend on itself; TVM's semantics only).  ``bound`` holds
    the Vars named in ``vars``: names need not be unique (a rewrite's new bindings may
    reuse ``lv8``), the Vars are.
    """

    entry: str
    function: str
    root: str
    vars: tuple[str, ...]
    kind: SkipKind
    reason: str
    by: str | None = None
    rejection: Reject | None = field(default=None, compare=False, repr=False)
    bound: tuple = field(default=(), compare=False, repr=False)


@dataclass
class CompositeLog:
    """What :func:`merge_composite` did; pass one in to collect it."""

    formed: list[FormedComposite] = field(default_factory=list)
    skipped: list[SkippedComposite] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Composites formed, per pattern table entry."""
        out: dict[str, int] = {}
        for f in self.formed:
            out[f.entry] = out.get(f.entry, 0) + 1
        return out


# -- the pass ------------------------------------------------------------------------------
def merge_composite(mod: Any, table: Any, *, compiler: str | None = None,
                    log: CompositeLog | None = None, semantics: str | None = None,
                    bind_constants: bool = True, annotate_codegen: bool = False) -> Any:
    """Wrap every accepted match of every table entry in a ``Composite`` function.

    Parameters
    ----------
    mod : tvm.IRModule, relax.Function or expression
        Never modified; the same kind is returned.
    table : PatternTable, list of entries or RuleSet
        Earlier entries have higher priority (Relay's rule); of a
        :class:`patternkit.RuleSet`, the composite rules are the table.
    compiler : str, optional
        Require every entry name to start with ``"<compiler>."``.
    log : CompositeLog, optional
        Receives the composites formed and the matches skipped, with reasons.
    semantics : {"relay", "tvm"}, optional
        Relay's ``MergeComposite`` or TVM's ``FuseOpsByPattern`` (see the module doc);
        by default the table's own (``"tvm"`` for :meth:`PatternTable.from_tvm`).
    bind_constants : bool
        TVM's semantics: keep tensor constants inside the composites (``True``, TVM's
        default) or pass them in as parameters.
    annotate_codegen : bool
        TVM's semantics: wrap each composite in a public ``Codegen`` function, as
        ``FuseOpsByPattern(annotate_codegen=True)`` does for flows without
        ``MergeCompositeFunctions``.

    Raises
    ------
    PatternTableError
        The table is malformed, or ``bind_constants`` / ``annotate_codegen`` are given
        with Relay's semantics (they are TVM's options).
    CallbackError
        A check raised; the message names the entry and the binding.
    """
    table = PatternTable.of(table, compiler)
    semantics = _semantics(table, semantics, bind_constants, annotate_codegen)
    if semantics == "tvm":
        return apply_to_target(mod, lambda module: _fuse_by_pattern(
            module, table, bind_constants, annotate_codegen, log))

    def transform(module: tvm.IRModule) -> tvm.IRModule:
        with C.gc_paused(), module_in_scope(module):  # for checks reading the function
            functions = dict(module.functions.items())
            changed = False
            for gv, func in rewritable_functions(module):
                new_func = _merge_function(table, gv.name_hint, func, log)
                if new_func is not func:
                    functions[gv] = new_func
                    changed = True
            return C.copy_module(module, functions) if changed else module

    return apply_to_target(mod, checked("MergeComposite", transform))


def MergeComposite(table: Any, *, compiler: str | None = None,  # noqa: N802 (TVM pass style)
                   log: CompositeLog | None = None, semantics: str | None = None,
                   bind_constants: bool = True,
                   annotate_codegen: bool = False) -> tvm.transform.Pass:
    """:func:`merge_composite` as a module pass, like ``relay.transform.MergeComposite``.

    ``table`` is anything :class:`~patternkit.byoc.tables.table.PatternTable` takes: entries,
    composite rules, a :class:`patternkit.RuleSet` (its composites, in order), or
    ``PatternTable.from_tvm("cutlass")``; the keywords are :func:`merge_composite`'s.

    The table is validated when the pass is created, so a bad table fails before any
    pipeline runs.

    Examples
    --------
    >>> table = [("ccompiler.conv_add_relu", conv2d_add_relu())]          # doctest: +SKIP
    >>> seq = tvm.transform.Sequential([MergeComposite(table), PartitionGraph("ccompiler")])
    >>> fused = MergeComposite(PatternTable.from_tvm("cutlass"))(mod)     # doctest: +SKIP
    """
    table = PatternTable(table, compiler)
    semantics = _semantics(table, semantics, bind_constants, annotate_codegen)

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return merge_composite(mod, table, log=log, semantics=semantics,
                               bind_constants=bind_constants, annotate_codegen=annotate_codegen)

    return C.module_pass(transform, "patternkit.MergeComposite")


def _semantics(table: PatternTable, semantics: str | None, bind_constants: bool,
               annotate_codegen: bool) -> str:
    semantics = table.semantics if semantics is None else semantics
    if semantics not in ("relay", "tvm"):
        raise PatternTableError(f"MergeComposite: semantics must be 'relay' or 'tvm', found "
                                f"{semantics!r}")
    if semantics == "relay" and (not bind_constants or annotate_codegen):
        raise PatternTableError("MergeComposite: bind_constants and annotate_codegen are "
                                "FuseOpsByPattern's options and need semantics='tvm' (with "
                                "Relay's semantics, PartitionGraph(merge=False) wraps each "
                                "composite for its compiler)")
    if semantics == "relay" and table.variants and len(table.names) < len(table):
        raise PatternTableError("MergeComposite: a table with variants (repeated names) needs "
                                "semantics='tvm'")
    return semantics


# -- TVM's semantics -------------------------------------------------------------------------
def _fuse_by_pattern(module: tvm.IRModule, table: PatternTable, bind_constants: bool,
                     annotate_codegen: bool, log: CompositeLog | None) -> tvm.IRModule:
    """FuseOpsByPattern's result: plan every function, then emit once."""
    keys = [(entry, candidate_keys(entry)) for entry in table]
    functions: list[tuple[str, relax.Function, FunctionIndex, list[CompositeEntry]]] = []
    gvs: list[tvm.ir.GlobalVar] = []
    functions_table = FunctionTable(module, COMPOSITE)

    def build(index: FunctionIndex, composite: PlannedComposite) -> None:
        build_composite(functions_table, index, composite, bind_constants)

    with C.gc_paused(), module_in_scope(module):  # for checks reading the function
        for gv, func in rewritable_functions(module):
            if not isinstance(func.body, relax.SeqExpr) or not func.body.blocks:
                continue
            index = FunctionIndex.of(func)
            live = [e for e, k in keys if index.may_hold(k)]
            if not live:
                continue
            functions.append((gv.name_hint, func, index, live))
            gvs.append(gv)
        plans = list(zip(gvs, plan_module(table, functions, _tvm_check_error, log is not None,
                                          build)))
        out = module
        if any(plan.composites for _, plan in plans):
            out = emit_module(module, plans, functions_table, bind_constants, annotate_codegen)
        if log is not None:
            for _, plan in plans:
                _log_plan(plan, log)
    return out


def _tvm_check_error(entry: CompositeEntry, func_name: str, binding: Any,
                     err: Exception) -> CallbackError:
    where = describe_binding(func_name, binding)
    return CallbackError(f"MergeComposite: the check of pattern table entry '{entry.name}' "
                         f"raised {type(err).__name__}: {err} (while checking binding "
                         f"'{where}')", entry.name, where)


def _log_plan(plan: FunctionPlan, log: CompositeLog) -> None:
    index = plan.index
    for composite in plan.composites:
        bindings = index.blocks[composite.block]
        names = tuple(C.var_name(bindings[m].var) for m in composite.members)
        ops = "".join(relay_short_name(C.op_name(bindings[m].value) or "Call") + "_"
                      for m in composite.members)
        log.formed.append(FormedComposite(composite.entry.name, plan.func_name,
                                          C.var_name(bindings[composite.root].var), names, ops))
    for skip in plan.skipped:
        bindings = index.blocks[skip.block]
        log.skipped.append(SkippedComposite(
            skip.entry.name, plan.func_name, C.var_name(bindings[skip.root].var),
            tuple(C.var_name(bindings[m].var) for m in skip.members), skip.kind, skip.reason,
            skip.by, skip.rejection))


def _names(vars_: Iterable[Any]) -> tuple[str, ...]:
    return tuple(C.var_name(v) for v in vars_)


def _merge_function(table: PatternTable, func_name: str, func: relax.Function,
                    log: CompositeLog | None) -> relax.Function:
    check_shape(func, "MergeComposite", func_name)
    if not func.body.blocks:
        return func
    if len(table) == 1:  # a cheap scan spares the index of a function with no candidate
        live_entries = [e for e in table if has_candidates(func, root_op_names(e.pattern))]
        if not live_entries:
            return func
    index = FunctionIndex.of(func)
    check_input(index, "MergeComposite", func_name)
    if len(table) > 1:  # one index for every entry, not one scan of the function each
        live_entries = [e for e in table if index.may_hold(root_op_names(e.pattern),
                                                           required_op_names(e.pattern))]
    site = CheckSite(index)
    # handle of a Var -> (entry that took it, root of that match).  Without a log, roots
    # taken already are not even matched (find_groups' ``taken``): the veto would refuse
    # the match, and nobody asks why.
    claimed: dict[int, tuple[str, Any]] = {}
    accepted: list[tuple[CompositeEntry, Group]] = []
    for entry in live_entries:
        vetoes: list[SkippedComposite] = []
        def on_error(group: Group, err: Exception,
                     entry: CompositeEntry = entry) -> CallbackError:
            return _check_error(entry, func_name, group, err)

        if entry.tvm_check is not None:
            entry_check = _tvm_group_check(entry, entry.tvm_check, site, on_error)
        else:
            entry_check = None if entry.accept is None else group_check(
                entry.accept, entry.roles, on_error)

        def veto(group: Group, entry=entry, entry_check=entry_check, vetoes=vetoes):
            taken = next((v for v in group.interior if C.handle(v) in claimed), None)
            if taken is not None:
                by = claimed[C.handle(taken)][0]
                reason = (f"'{by}' (higher priority) already took '{C.var_name(taken)}'")
                if log is not None:  # names cross the FFI: only for a log that shows them
                    vetoes.append(SkippedComposite(
                        entry.name, func_name, C.var_name(group.root_var),
                        _names(group.interior), SkipKind.OVERLAP, reason, by,
                        bound=tuple(group.interior)))
                return reject(reason)
            if entry_check is None:
                return True
            refusal, _ = judge(entry_check, group)
            if refusal is None:
                return True
            if log is not None:
                vetoes.append(SkippedComposite(
                    entry.name, func_name, C.var_name(group.root_var), _names(group.interior),
                    SkipKind.CHECK, refusal.reason, rejection=refusal,
                    bound=tuple(group.interior)))
            return refusal

        groups, skips = find_groups(index, entry.pattern, veto, report_claimed=log is not None,
                                    taken=claimed if log is None else None)
        for group in groups:
            for v in group.interior:
                claimed[C.handle(v)] = (entry.name, group.root_var)
            accepted.append((entry, group))
        if log is not None:
            log.skipped.extend(vetoes)
            vetoed_roots = {C.handle(s.bound[-1]) for s in vetoes}
            for s in skips:
                if s.covered and C.handle(s.covered[-1]) in vetoed_roots:
                    continue
                log.skipped.append(_classify_skip(entry, func_name, s))
    if not accepted:
        return func
    replacements = {}
    reads: dict[int, list[int]] = {}  # what each call reads: its arguments' Relax Vars
    built: dict[int, _Built] = {}  # the bindings replacing a root, typed already
    symbolic = uses_symbolic_vars(func)  # if not, no composite needs a shape argument
    for entry, group in accepted:
        inputs = lifted_inputs(group, symbolic)
        # typed without a normalisation (build_group_function's normalize=False)
        local, args = _closed(build_group_function(index, group, {COMPOSITE: entry.name},
                                                   inputs, normalize=False),
                              inputs, index, group)
        # a composite reading a symbolic variable its inputs do not define (its input is
        # ``(n * 7, 768)``, its output ``(n, 7, 768)``) receives it in a trailing
        # R.Shape argument, as FuseOpsByPattern passes it: otherwise the call's type
        # loses the variable (``ndim=3``) and the composite cannot replace the binding
        local, extra_args = detach_symbolic_vars(local, rename=False) if symbolic \
            else (local, [])
        key = C.handle(group.root_var)
        if not symbolic and index.dataflow[group.position[0]]:
            built[key] = (group.position, local, args, group.root_var)  # typed, below
        else:
            # built by the FFI constructor, untyped (``relax.Call``'s Python __init__
            # costs more than the rest of the call's bookkeeping here): emission
            # normalises it
            replacements[key] = C.new_call(C.MISSING_TYPE, local, args + extra_args, None, [],
                                           None)
        # the composite is closed (``_closed``), so the call reads only its arguments; this
        # spares emission a free-variable walk of each composite's body
        reads[key] = list(dict.fromkeys(C.handle(a) for a in args
                                        if isinstance(a, relax.Var) and not tvm.ir.is_prim_var(a)))
        if log is not None:
            log.formed.append(FormedComposite(entry.name, func_name, C.var_name(group.root_var),
                                              _names(group.interior),
                                              str(local.attrs[PARTITIONED_FROM_PATTERN])))
    logger.debug("MergeComposite: %d composite(s) in %s", len(accepted), func_name)
    normalized = _composite_bindings(built)
    replacements.update((key, bindings[-1].value) for key, bindings in normalized.items())
    return emit_rewrites(func, index, replacements, func_name, pass_name="MergeComposite",
                         new_reads=reads, normalized=normalized).function


#: ``(position, local, args, root_var)``: a composite call :func:`_composite_bindings` types.
_Built = tuple[tuple[int, int], Any, list[Any], Any]


def _composite_bindings(built: dict[int, _Built]) -> dict[int, list]:
    """Root handle -> ``lvN = local; root_var = lvN(*args)``: what normalising the calls
    to the composites of a dataflow block gives, built typed.

    ``built`` holds ``(position, local, args, root_var)`` per root.  Each ``local`` is
    typed throughout (:func:`build_group_function`), and without symbolic variables the
    call's type is the root's own; the normalisation and the type check of each
    composite call were a fifth of ``MergeComposite``'s cost.  The function Vars are
    named as the normaliser names them, ``lv``, ``lv1``, ... in program order per block.
    """
    out: dict[int, list] = {}
    count: dict[int, int] = {}  # block -> composites named so far
    for key, (position, local, args, root_var) in sorted(built.items(),
                                                         key=lambda item: item[1][0]):
        n = count.get(position[0], 0)
        count[position[0]] = n + 1
        func_var = C.new_dataflow_var(f"lv{n}" if n else "lv", C.type_of(local), None)
        call = C.new_call(root_var.ty, func_var, args, None, [], None)
        out[key] = [C.new_var_binding(func_var, local, None),
                    C.new_var_binding(root_var, call, None)]
    return out


def _closed(local: relax.Function, args: list, index: FunctionIndex,
            group: Group) -> tuple[relax.Function, list]:
    """``local`` reading only its parameters, and the arguments to call it with.

    A wildcard that matches an inline tuple (``R.concat((x, y))``, as importers write
    it) leaves ``x`` and ``y`` in the composite's body, read from the caller: harmless
    in a local function, but an external compiler receives only the parameters, and the
    function lifted to a global (``PartitionGraph``) would read undefined variables.
    Such variables become trailing parameters, after the lifted inputs.

    When the index says the match's bindings read only its inputs and each other (the
    common case), ``local`` is closed without asking TVM for its free variables.
    """
    members = (*group.match.internal_keys, C.handle(group.root_var))
    known = {C.handle(a) for a in args}.union(members)
    if all(read in known for key in members for read in index.reads[key]):
        return local, args
    free = [v for v in relax.analysis.free_vars(local) if not tvm.ir.is_prim_var(v)]
    if not free:
        return local, args
    params = [relax.Var(C.var_name(v), v.ty) for v in free]
    mapping = {C.handle(v): p for v, p in zip(free, params)}
    seq = local.body
    blocks = [make_block([relax.VarBinding(b.var, substitute(b.value, mapping, by_handle=True,
                                                             keep_types=False))
                          for b in C.array_items(block.bindings)],
                         isinstance(block, relax.DataflowBlock), block.span)
              for block in C.array_items(seq.blocks)]
    body = relax.SeqExpr(blocks, substitute(seq.body, mapping, by_handle=True), seq.span)
    closed = relax.Function(list(local.params) + params, body, local.ret_ty, local.is_pure,
                            local.attrs, local.span)
    return relax.BlockBuilder().normalize(closed), list(args) + free


def _tvm_group_check(entry: CompositeEntry, tvm_check: Callable[[Any], Any], site: CheckSite,
                     on_error: Any) -> Any:
    """A TVM entry's check (``tvm_check``), on a group of Relay's grouping (its
    PatternCheckContext).
    """
    def run(group: Group) -> Any:
        context = site.context(group.match, group.root_var, group.position, entry.roles)
        try:
            accepted = tvm_check(context)
        except Exception as err:
            raise on_error(group, err) from err
        return True if accepted else reject(f"check of {entry.name} rejected it")

    return run


def _check_error(entry: CompositeEntry, func_name: str, group: Group,
                 err: Exception) -> CallbackError:
    where = describe_binding(func_name, group.binding)
    return CallbackError(f"MergeComposite: the check of pattern table entry '{entry.name}' "
                         f"raised {type(err).__name__}: {err} (while checking binding "
                         f"'{where}')", entry.name, where)


def _classify_skip(entry: CompositeEntry, func_name: str, skipped: Skipped) -> SkippedComposite:
    """A grouping skip (escape or same-entry overlap) with the bindings it covered."""
    by = entry.name if skipped.kind is SkipKind.OVERLAP else None
    return SkippedComposite(entry.name, func_name, skipped.root, _names(skipped.covered),
                            skipped.kind, skipped.reason, by, bound=skipped.covered)


def composite_functions(mod: tvm.IRModule) -> list[tuple[str, relax.Function]]:
    """Every function carrying ``Composite`` in ``mod``, global or local, with its name.

    Local composites nested in ``Codegen`` functions (``MergeCompositeFunctions`` output)
    are included, so the list describes a module at any stage of the BYOC flow.
    """
    found: list[tuple[str, relax.Function]] = []
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        if attr(func, COMPOSITE) is not None:
            found.append((gv.name_hint, func))
            continue

        def visit(expr, owner=gv.name_hint):
            if isinstance(expr, relax.Function) and attr(expr, COMPOSITE) is not None:
                found.append((owner, expr))

        relax.analysis.post_order_visit(func.body, visit)
    return found


def composite_counts(mod: tvm.IRModule) -> dict[str, int]:
    """``{composite name: number of composite calls executed}`` in ``mod``.

    Works at any stage of the BYOC flow.  Calls are counted through the call graph from
    every ordinary function, because ``FuseOpsByPattern`` and ``MergeCompositeFunctions``
    share one function between identical matches (an external function called twice
    counts its composites twice).
    """
    globals_ = {gv.name_hint: f for gv, f in mod.functions.items()}
    memo: dict[str, dict[str, int]] = {}

    def composite_of(func) -> str | None:
        name = attr(func, COMPOSITE)
        return None if name is None else str(name)

    def add(into: dict, other: dict) -> None:
        for k, n in other.items():
            into[k] = into.get(k, 0) + n

    def of_global(name: str) -> dict[str, int]:
        if name not in memo:
            memo[name] = {}  # a recursive call counts nothing more
            func = globals_.get(name)
            memo[name] = walk(func) if isinstance(func, relax.Function) else {}
        return memo[name]

    def walk(func: relax.Function) -> dict[str, int]:
        out: dict[str, int] = {}
        if not isinstance(func.body, relax.SeqExpr):
            return out
        local: dict[int, Any] = {}
        for block in C.array_items(func.body.blocks):
            for binding in C.array_items(block.bindings):
                value = binding.value
                if isinstance(value, relax.Function):
                    local[C.handle(binding.var)] = value
                elif isinstance(value, relax.Call):
                    op = value.op
                    if isinstance(op, relax.Var) and C.handle(op) in local:
                        callee = local[C.handle(op)]
                        name = composite_of(callee)
                        add(out, {name: 1} if name is not None else walk(callee))
                    elif isinstance(op, tvm.ir.GlobalVar):
                        callee = globals_.get(op.name_hint)
                        name = composite_of(callee)
                        add(out, {name: 1} if name is not None else of_global(op.name_hint))
        return out

    total: dict[str, int] = {}
    called = {gv.name_hint for f in globals_.values() if isinstance(f, relax.Function)
              for gv in relax.analysis.all_global_vars(f)}
    for name, func in globals_.items():
        if (isinstance(func, relax.Function) and composite_of(func) is None
                and name not in called):
            add(total, of_global(name))
    return total


__all__ = ["CompositeLog", "FormedComposite", "SkippedComposite", "merge_composite",
           "MergeComposite", "composite_functions", "composite_counts"]
