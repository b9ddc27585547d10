"""Round-trip checks: fuse, defuse, and compare with the input.

``check_roundtrip(mod)`` applies a fusion (``FuseOps`` after ``LegalizeOps`` +
``AnnotateTIROpPattern`` by default, or any pass or callable), undoes it with
:func:`patternkit.DefuseOps`, and checks that the result is the program it started
from.  This is Relay's ``DefuseOps(FuseOps(x)) == x`` promise, made checkable for Relax.

Normalisation
-------------
Both sides -- the reference (the input, legalised and annotated in the default mode) and
the restored module -- get exactly the same three steps before they are compared:

1. ``relax.transform.CanonicalizeBindings``.  Fusion may absorb a trailing alias such as
   ``gv = lv`` into a group, so it is gone after defusion; canonicalising removes such
   trivial aliases on *both* sides, so neither side is penalised for them.  Applying it to
   one side only would make unrelated differences appear (``relay-vs-relax.md``,
   section 3, item 4).
2. Symbolic shape expressions in types are put in canonical arithmetic form
   (``tvm.sym.Analyzer.canonical_simplify``), in functions that have symbolic variables.
   ``FuseOpsByPattern`` gives the caller the composite's *simplified* return type
   (``n * 4 * 2`` becomes ``n * 8``, also in ``main``'s own return type), so the restored
   caller cannot spell the type as the input did; the two types are equal for every
   ``n``, and after this step both sides spell them the same way.
3. A canonical binding order inside every dataflow block: a post-order depth-first walk
   from the block's results (the variables used after the block, in order of first use,
   then the block's remaining outputs, then any dead bindings), visiting operands in
   argument order.  Dead bindings are taken in an order of their own, by the positions
   of the variables they read (then by structure), not by where they stood: a fusion
   that swallows a dead binding into a group puts it back elsewhere.  ``FuseOps`` emits a
   group where its last binding was, so independent bindings legitimately change places;
   a dataflow block is pure, so any topological order computes the same values.
   Ordinary (non-dataflow) blocks may have side effects and keep their order.

Nothing else is normalised: no CSE, no constant folding, since each of those could hide
a defusion bug (a duplicated or changed binding).

Dead bindings
-------------
Importers leave dead bindings behind (the ONNX importer's ``lv5 = lv3[1]``, the unused
running mean of a ``batch_norm``), and fusion passes drop them: ``MergeCompositeFunctions``
(and ``FuseOps`` where a group swallows them) only give a group the outputs somebody
reads.  Defusion cannot bring them back, and a program without them computes the same
values, so the round trip compares *modulo the dead bindings the fusion removed*:

* a binding of a dataflow block is dead when nothing live reads it, transitively (the
  function's result and every binding outside dataflow blocks are live; a
  ``match_cast`` is always live, since it checks its value at run time);
* when the restored module differs from the reference, the live parts of both are
  compared first (each function without its dead bindings); any difference there fails;
* every dead binding the restored module still has must then match a dead binding of
  the reference, value and type (operands mapped through the live comparison); one
  that matches none -- a dead binding whose value changed, or one that appeared --
  fails.  Importers compute some things twice (transformers' Gemma3 mask code builds
  the same ``arange`` chain once per mask axis, and the two chains part later), so a
  dead binding may have twins; the pairing therefore starts from the ends of the dead
  chains and pairs whole chains, operand by operand, never a binding with a twin whose
  chain ends elsewhere;
* the reference's dead bindings that nothing matched are the ones fusion dropped: the
  comparison is made without them, and they are listed in
  :attr:`RoundTripResult.dropped_dead`, so the result says what it did not compare.

No dead-code elimination runs on either side otherwise: a module whose dead code
survives is compared exactly, as before.
Variable names are not normalised because Relax structural equality already ignores the
names of local variables; global function names *are* compared, so a fused function left
behind in the restored module is reported.

Comparison is ``tvm_ffi.structural_equal`` on the two normalised modules.  When it fails,
the first differing binding of the first differing function is located (walking both
sides in lock step and mapping variables as they are defined) and printed on both sides.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax

from ..errors import PatternkitError
from ..fusion import DefuseOps
from ..ir import compat as C
from ..ir.compat import Analyzer
from ..ir.rebuild import binding_text, make_block, rebuild_function
from ..ir.walk import map_type_dims, substitute, vars_read
from . import numeric as numerics  # a module, not a name: tests replace its compare
from .legalize_once import legalize_once

__all__ = ["RoundTripError", "RoundTripResult", "DeadBinding", "check_roundtrip",
           "normalize_for_comparison", "canonical_binding_order", "canonical_symbolic_types",
           "first_difference", "compare_modulo_dead", "dead_bindings", "default_fusion"]

logger = logging.getLogger(__name__)


class RoundTripError(PatternkitError, AssertionError):
    """Fusing then defusing did not give back the input (or not the same numbers).

    Attributes
    ----------
    result : RoundTripResult
        The modules involved, for inspection in a debugger or a notebook.
    """

    def __init__(self, message: str, result: RoundTripResult | None = None):
        super().__init__(message)
        self.result = result


@dataclass
class RoundTripResult:
    """What :func:`check_roundtrip` built and compared.

    Attributes
    ----------
    reference : tvm.IRModule
        The module fusion was applied to (the input, legalised and annotated by default).
    fused : tvm.IRModule
        The fusion's output.
    restored : tvm.IRModule
        ``DefuseOps`` applied to ``fused``.
    difference : str or None
        The first structural difference after normalisation, ``None`` when equal.
    numeric : patternkit.verification.numeric.Comparison or None
        The VM comparison of ``reference`` and ``restored`` when requested.
    dropped_dead : tuple of DeadBinding
        Dead bindings of the reference that the fusion removed and the structural
        comparison therefore left out (see "Dead bindings" in the module docstring);
        empty when every binding was compared.
    fusion_ill_formed : str or None
        Why the fusion's own output is not well formed (TVM 0.27's ``FuseOps`` hoists a
        group above the ``match_cast`` defining a symbolic variable it reads), ``None``
        when it is.  The round trip then fails and its difference says so: no defusion
        can restore a module from an ill-formed one, and the fault is the fusion's.
    """

    reference: tvm.IRModule
    fused: tvm.IRModule
    restored: tvm.IRModule
    difference: str | None = None
    numeric: numerics.Comparison | None = None
    dropped_dead: tuple = field(default=())
    fusion_ill_formed: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the round trip kept the structure and, when checked, the numbers."""
        return self.difference is None and (self.numeric is None or self.numeric.ok)


@dataclass(frozen=True)
class DeadBinding:
    """A binding of the reference that nothing live reads, and that fusion removed.

    Attributes
    ----------
    function : str
        The global function holding it.
    name : str
        Its variable's name (``"lv5"``).
    text : str
        The binding as printed (``"lv5 = lv3[1]"``).
    """

    function: str
    name: str
    text: str

    def __str__(self) -> str:
        return f"{self.function}: {self.text}"


def default_fusion() -> tuple[tvm.transform.Pass, tvm.transform.Pass]:
    """``(prepare, fuse)``: ``LegalizeOps`` + ``AnnotateTIROpPattern``, then ``FuseOps``.

    Relax's ``FuseOps`` only groups ``call_tir`` calls whose PrimFunc carries an
    ``op_pattern``; on high-level Relax ops it is a no-op, so the round trip would be
    vacuous without the preparation.  The legalisation makes each distinct operator call's
    kernel once (:func:`patternkit.verification.legalize_once.legalize_once`, the same
    module as ``LegalizeOps``; a 12-layer GPT-2's 0.43 -> 0.21 s of CPU), then
    ``LegalizeOps`` legalises what that leaves to the build's dispatch passes (sort, scan,
    sampling).
    """
    prepare = tvm.transform.Sequential([legalize_once(), relax.transform.LegalizeOps(),
                                        relax.transform.AnnotateTIROpPattern()])
    return prepare, relax.transform.FuseOps()


# ---------------------------------------------------------------------- normalisation
def canonical_binding_order(mod: tvm.IRModule) -> tvm.IRModule:
    """Reorder every dataflow block's bindings into the canonical topological order.

    See the module docstring for the order and why it is sound.  Returns a new module;
    functions whose order is already canonical are kept as they are.
    """
    functions = dict(mod.functions.items())
    for gv, func in list(functions.items()):
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            new_body = _order_seq(func.body, func.params)
            if new_body is not func.body:
                functions[gv] = rebuild_function(func, new_body)
    return C.copy_module(mod, functions)


def _order_seq(seq, params=()):
    blocks = list(seq.blocks)
    # position of every variable defined before the block being ordered: what dead
    # bindings are ordered by
    rank: dict = {p: i for i, p in enumerate(params)}
    # first use of each var outside the block that defines it (one forward scan)
    def_block: dict = {}
    later_use: dict = {}

    def note(value, block_index):
        for v in vars_read(value):
            if v in def_block and def_block[v] != block_index and v not in later_use:
                later_use[v] = len(later_use)

    for index, block in enumerate(blocks):
        for binding in block.bindings:
            note(binding.value, index)
            def_block[binding.var] = index
    note(seq.body, -1)
    new_blocks = []
    changed = False
    for index, block in enumerate(blocks):
        if not isinstance(block, relax.DataflowBlock):
            new_blocks.append(block)
            rank.update((b.var, len(rank)) for b in block.bindings)
            continue
        bindings = list(block.bindings)
        used_later = sorted((later_use[b.var], i) for i, b in enumerate(bindings)
                            if b.var in later_use)
        ordered = _order_block(bindings, [bindings[i].var for _, i in used_later], rank)
        rank.update((b.var, len(rank)) for b in ordered)
        if all(a.same_as(b) for a, b in zip(ordered, bindings)):
            new_blocks.append(block)
        else:
            changed = True
            new_blocks.append(relax.DataflowBlock(ordered, block.span))
    if not changed:
        return seq
    return relax.SeqExpr(new_blocks, seq.body, seq.span)


def _order_block(bindings: list, later_uses: list, outer_rank: dict) -> list:
    by_var = {b.var: b for b in bindings}
    roots = [v for v in later_uses if v in by_var]
    roots += [b.var for b in bindings if not isinstance(b.var, relax.DataflowVar)]
    done: set = set()
    order: list = []
    _post_order(roots, by_var, done, order)
    if len(order) < len(bindings):  # dead bindings: ordered by what they read
        rank = dict(outer_rank)
        rank.update((b.var, len(outer_rank) + i) for i, b in enumerate(order))
        dead = [(i, b) for i, b in enumerate(bindings) if b.var not in done]
        dead.sort(key=lambda item: _dead_key(item[1], rank, item[0]))
        _post_order([b.var for _, b in dead], by_var, done, order)
    return order


def _dead_key(binding, rank: dict, index: int) -> tuple:
    """Sort key of a dead binding: the positions of its operands (an operand that is
    itself dead sorts last), its structure, and, for exact twins, where it stood.
    """
    operands = tuple(rank.get(v, len(rank)) for v in vars_read(binding.value))
    return operands, C.structural_hash(binding.value, map_free_vars=True), index


def _post_order(roots: list, by_var: dict, done: set, order: list) -> None:
    """Append the bindings of ``roots`` and their operands in ``by_var`` to ``order``."""
    for root in roots:
        if root in done:
            continue
        # iterative post-order DFS: chains of thousands of bindings are common
        stack = [(root, False)]
        while stack:
            var, expanded = stack.pop()
            if var in done:
                continue
            if expanded:
                done.add(var)
                order.append(by_var[var])
                continue
            stack.append((var, True))
            for operand in reversed(vars_read(by_var[var].value)):
                if operand in by_var and operand not in done:
                    stack.append((operand, False))


def canonical_symbolic_types(mod: tvm.IRModule) -> tvm.IRModule:
    """Put every symbolic shape expression in types into canonical arithmetic form.

    Only functions with symbolic variables are rebuilt; static ones are returned as they
    are.  Covers parameter, binding-variable, call and return types, call type arguments
    (``call_tir``'s ``out_ty``) and shape literals in top-level bindings.
    """
    functions = dict(mod.functions.items())
    for gv, func in list(functions.items()):
        if (isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr)
                and relax.analysis.defined_symbolic_vars(func)):
            functions[gv] = _SymbolicCanon().function(func)
    return C.copy_module(mod, functions)


class _SymbolicCanon:
    """Rebuilds one function with ``Analyzer.canonical_simplify`` applied to its shapes."""

    def __init__(self):
        self.analyzer = Analyzer()
        self.vars: dict = {}

    def dim(self, expr):
        if isinstance(expr, tvm.tirx.IntImm) or tvm.ir.is_prim_var(expr):
            return expr
        return self.analyzer.canonical_simplify(expr)

    def ty(self, ty):
        return map_type_dims(ty, self.dim)

    def var(self, var):
        cls = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
        new = cls(var.name, self.ty(var.ty))
        self.vars[var] = new
        return new

    def expr(self, expr):
        return substitute(expr, self.vars, map_dim=self.dim)

    def function(self, func):
        params = [self.var(p) for p in func.params]
        blocks = []
        for block in func.body.blocks:
            bindings = []
            for b in block.bindings:
                value = self.expr(b.value)
                if isinstance(b, relax.MatchCast):
                    bindings.append(relax.MatchCast(self.var(b.var), value, self.ty(b.ty)))
                else:
                    bindings.append(relax.VarBinding(self.var(b.var), value))
            blocks.append(make_block(bindings, isinstance(block, relax.DataflowBlock),
                                     block.span))
        body = relax.SeqExpr(blocks, self.expr(func.body.body), func.body.span)
        return rebuild_function(func, body, params=params, ret_ty=self.ty(func.ret_ty))


def normalize_for_comparison(mod: tvm.IRModule) -> tvm.IRModule:
    """The normalisation both sides of a round trip get (see the module docstring)."""
    mod = relax.transform.CanonicalizeBindings()(mod)
    return canonical_binding_order(canonical_symbolic_types(mod))


# ---------------------------------------------------------------------- comparison
def _flat_bindings(func):
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [(i, b) for i, block in enumerate(body.blocks) for b in block.bindings]


def _show(binding) -> str:
    if binding is None:
        return "(nothing)"
    return binding_text(binding.var, binding.value, limit=None, with_type=True)


def first_difference(expected: tvm.IRModule, actual: tvm.IRModule) -> str | None:
    """A readable description of the first difference between two modules, or ``None``.

    Both modules should already be normalised (:func:`normalize_for_comparison`).
    """
    if C.structural_equal(expected, actual):
        return None
    exp_funcs = {gv.name_hint: f for gv, f in expected.functions.items()}
    act_funcs = {gv.name_hint: f for gv, f in actual.functions.items()}
    missing = sorted(set(exp_funcs) - set(act_funcs))
    extra = sorted(set(act_funcs) - set(exp_funcs))
    if missing or extra:
        return (f"the modules hold different functions: missing after the round trip "
                f"{missing}, left over {extra}")
    for name in sorted(exp_funcs):
        exp_f, act_f = exp_funcs[name], act_funcs[name]
        if C.structural_equal(exp_f, act_f):
            continue
        if not (isinstance(exp_f, relax.Function) and isinstance(act_f, relax.Function)):
            return f"function '{name}' differs (not a Relax function; compare it directly)"
        return _function_difference(name, exp_f, act_f)
    return "the modules differ in their attributes or global infos"


def _function_difference(name, exp_f, act_f) -> str:
    mapping: dict[Any, Any] = {}
    if len(exp_f.params) == len(act_f.params):
        mapping.update(zip(exp_f.params, act_f.params))
    exp_b, act_b = _flat_bindings(exp_f), _flat_bindings(act_f)
    for position in range(max(len(exp_b), len(act_b))):
        e = exp_b[position] if position < len(exp_b) else None
        a = act_b[position] if position < len(act_b) else None
        if e is None or a is None:
            return (f"function '{name}': binding #{position} exists on one side only\n"
                    f"  expected: {_show(e and e[1])}\n  restored: {_show(a and a[1])}")
        (eb_index, eb), (ab_index, ab) = e, a
        try:
            renamed = substitute(eb.value, mapping)
        except PatternkitError:
            renamed = eb.value
        same = (eb_index == ab_index and type(eb) is type(ab)
                and type(eb.var) is type(ab.var)
                and C.structural_equal(renamed, ab.value, map_free_vars=False)
                and C.structural_equal(eb.var.ty, ab.var.ty))
        if not same:
            return (f"function '{name}': binding #{position} (block {eb_index} vs "
                    f"{ab_index}) differs\n  expected: {_show(eb)}\n  restored: {_show(ab)}")
        mapping[eb.var] = ab.var
    try:
        tvm.ir.assert_structural_equal(exp_f, act_f)
        detail = ""
    except ValueError as err:  # its message carries the access path of the mismatch
        lines = [line for line in str(err).splitlines() if "path" in line.lower()]
        detail = "\n  " + "\n  ".join(lines[:4])
    return (f"function '{name}': all bindings match but the signature, attributes, types "
            f"or result differ{detail}\n  expected: {exp_f.ret_ty} "
            f"{dict(exp_f.attrs or {})}\n  restored: {act_f.ret_ty} {dict(act_f.attrs or {})}")


# ---------------------------------------------------------------------- dead bindings
def dead_bindings(func: relax.Function) -> list:
    """The dead bindings of ``func``'s blocks, in program order.

    A binding of a dataflow block is dead when nothing live reads its variable,
    transitively; the function's result, every binding outside a dataflow block (it may
    have effects) and every ``match_cast`` (it checks its value at run time) are live.
    """
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return []
    live = set(vars_read(body.body))
    dead = []
    for block in reversed(list(body.blocks)):
        dataflow = isinstance(block, relax.DataflowBlock)
        for binding in reversed(list(block.bindings)):
            if dataflow and type(binding) is relax.VarBinding and binding.var not in live:
                dead.append(binding)
                continue
            live.update(vars_read(binding.value))
    dead.reverse()
    return dead


def _without(func: relax.Function, bindings: list) -> relax.Function:
    """``func`` without ``bindings``, its dataflow blocks in canonical order again."""
    doomed = {b.var for b in bindings}
    blocks = []
    for block in func.body.blocks:
        kept = [b for b in block.bindings if b.var not in doomed]
        if kept:
            blocks.append(make_block(kept, isinstance(block, relax.DataflowBlock), block.span))
    pruned = rebuild_function(func, relax.SeqExpr(blocks, func.body.body, func.body.span))
    return canonical_binding_order(tvm.IRModule({"f": pruned}))["f"]


def _live_mapping(ref_live: relax.Function, res_live: relax.Function) -> dict:
    """Reference Var -> restored Var, for two structurally equal functions."""
    mapping = dict(zip(ref_live.params, res_live.params))
    for (_, eb), (_, ab) in zip(_flat_bindings(ref_live), _flat_bindings(res_live)):
        mapping[eb.var] = ab.var
    return mapping


def _same_binding(ref_binding, res_binding, mapping: dict) -> bool:
    if type(ref_binding.var) is not type(res_binding.var):
        return False
    try:
        renamed = substitute(ref_binding.value, mapping)
    except PatternkitError:  # a value that captures variables: compare it as it is
        renamed = ref_binding.value
    return (C.structural_equal(renamed, res_binding.value, map_free_vars=False)
            and C.structural_equal(ref_binding.var.ty, res_binding.var.ty))


def _dead_keys(dead: list, live_index: dict, mapping: dict) -> dict:
    """Dead binding -> a key equal for two dead bindings that compute the same thing.

    The key is the binding's value up to its variables (structure hashed with free
    variables numbered), its type, and, for each variable it reads in order, the live
    variable it stands for (a reference variable through ``mapping``) or the key of the
    dead binding defining it: the whole dead computation behind the binding, so twins
    (the same ``arange`` computed twice) have equal keys.  ``dead`` is in program order,
    operands first.
    """
    defining = {b.var: b for b in dead}
    keys: dict = {}
    for binding in dead:
        operands = []
        for var in vars_read(binding.value):
            if var in defining:
                operands.append(("dead", keys[defining[var]]))
            else:
                operands.append(("live", live_index.get(mapping.get(var, var), C.var_name(var))))
        keys[binding] = (type(binding.var).__name__,
                         C.structural_hash(binding.value, map_free_vars=True),
                         C.structural_hash(binding.var.ty), tuple(operands))
    return keys


def _pair_dead(ref_dead: list, res_dead: list, ref_keys: dict, res_keys: dict) -> dict:
    """Restored dead binding -> the reference's it stands for; a restored binding without
    a consistent counterpart is left out.

    Twins have equal keys but may be read by different bindings further on (Gemma3's mask
    code: two equal ``arange`` chains that end in different ``expand_dims``), so a
    binding cannot be paired by its own key alone.  The restored bindings are paired from
    the last to the first: the bindings nothing dead reads (the ends of the chains)
    choose among their twins, and each pair then pairs the dead operands of both sides,
    position by position, so a chain is paired with one chain of the reference.  A
    candidate whose operands are already paired otherwise is skipped.
    """
    ref_defining = {b.var: b for b in ref_dead}
    res_defining = {b.var: b for b in res_dead}
    by_key: dict = {}
    for binding in ref_dead:
        by_key.setdefault(ref_keys[binding], []).append(binding)
    pairs: dict = {}      # restored binding -> reference binding
    taken: dict = {}      # reference binding -> restored binding

    def extend(res_binding, ref_binding) -> dict | None:
        """The pairs ``(res_binding, ref_binding)`` implies that are not made yet, or
        ``None`` when they contradict the pairs made.
        """
        new: dict = {}
        stack = [(res_binding, ref_binding)]
        while stack:
            res_b, ref_b = stack.pop()
            made = pairs.get(res_b, new.get(res_b))
            if made is not None:
                if made is not ref_b:
                    return None
                continue
            if ref_b in taken or ref_b in new.values() or res_keys[res_b] != ref_keys[ref_b]:
                return None
            new[res_b] = ref_b
            for res_v, ref_v in zip(vars_read(res_b.value), vars_read(ref_b.value)):
                if res_v in res_defining:  # equal keys: ref_v is then dead too
                    stack.append((res_defining[res_v], ref_defining[ref_v]))
        return new

    for res_binding in reversed(res_dead):
        if res_binding in pairs:
            continue
        for candidate in by_key.get(res_keys[res_binding], ()):
            if candidate in taken:
                continue
            new = extend(res_binding, candidate)
            if new is not None:
                pairs.update(new)
                taken.update((ref_b, res_b) for res_b, ref_b in new.items())
                break
    return pairs


def _dropped_dead(name: str, ref_f: relax.Function,
                  res_f: relax.Function) -> tuple[list, str | None]:
    """The reference's dead bindings without a counterpart in ``res_f``.

    Returns ``(dropped, difference)``.  ``difference`` describes a live difference (the
    functions differ even without their dead bindings) or a dead binding of ``res_f``
    that matches none of the reference's; ``dropped`` is then empty.
    """
    ref_dead = dead_bindings(ref_f)
    if not ref_dead:
        return [], None
    res_dead = dead_bindings(res_f)
    ref_live, res_live = _without(ref_f, ref_dead), _without(res_f, res_dead)
    if not C.structural_equal(ref_live, res_live):
        return [], _function_difference(name, ref_live, res_live) + \
            "\n  (compared without the dead bindings of either side)"
    mapping = _live_mapping(ref_live, res_live)
    live_index = {var: i for i, var in enumerate(
        [*res_live.params, *(b.var for _, b in _flat_bindings(res_live))])}
    pairs = _pair_dead(ref_dead, res_dead, _dead_keys(ref_dead, live_index, mapping),
                       _dead_keys(res_dead, live_index, {}))
    mapping.update((ref_b.var, res_b.var) for res_b, ref_b in pairs.items())
    # the keys only hash: each pair is confirmed structurally, and a binding left
    # unpaired is named with its value
    for res_binding in res_dead:
        match = pairs.get(res_binding)
        if match is None or not _same_binding(match, res_binding, mapping):
            return [], (f"function '{name}': the restored dead binding "
                        f"{_show(res_binding)} matches no dead binding of the reference "
                        f"(a dead binding changed or appeared)")
    paired = set(pairs.values())
    return [b for b in ref_dead if b not in paired], None


def compare_modulo_dead(reference: tvm.IRModule,
                        restored: tvm.IRModule) -> tuple[str | None, tuple]:
    """``(difference, dropped)`` of two normalised modules, modulo dropped dead bindings.

    See "Dead bindings" in the module docstring.  ``difference`` is ``None`` when
    ``restored`` equals ``reference`` without the dead bindings listed in ``dropped``.
    """
    difference = first_difference(reference, restored)
    if difference is None:
        return None, ()
    restored_funcs = {gv.name_hint: f for gv, f in restored.functions.items()}
    functions = dict(reference.functions.items())
    dropped: list[DeadBinding] = []
    for gv, ref_f in reference.functions.items():
        res_f = restored_funcs.get(gv.name_hint)
        if not (isinstance(ref_f, relax.Function) and isinstance(res_f, relax.Function)
                and isinstance(ref_f.body, relax.SeqExpr)
                and isinstance(res_f.body, relax.SeqExpr)) or C.structural_equal(ref_f, res_f):
            continue
        gone, live_difference = _dropped_dead(gv.name_hint, ref_f, res_f)
        if live_difference is not None:
            return live_difference, ()
        if gone:
            functions[gv] = _without(ref_f, gone)
            dropped.extend(DeadBinding(gv.name_hint, C.var_name(b.var),
                                       binding_text(b.var, b.value)) for b in gone)
    if not dropped:
        return difference, ()
    # the plain comparison of the pruned reference: what was not compared is `dropped`
    return first_difference(C.copy_module(reference, functions), restored), tuple(dropped)


# ---------------------------------------------------------------------- entry point
def _ill_formed(mod: tvm.IRModule, what: str = "the restored module") -> str | None:
    """Why ``mod`` is not well formed (an undefined symbolic variable, say), or ``None``."""
    try:
        relax.analysis.well_formed(mod)
    except Exception as err:  # the C++ checker raises a plain TVM error
        return f"{what} is not well formed: {err}"
    return None


def check_roundtrip(mod: tvm.IRModule, fuse: tvm.transform.Pass | Callable | None = None, *,
                    kinds=None, numeric: bool = False, rtol: float = 1e-5, atol: float = 1e-5,
                    seed: int = 0, func_name: str = "main", numeric_options: dict | None = None,
                    raise_on_failure: bool = True) -> RoundTripResult:
    """Fuse ``mod``, defuse it again, and check the result is what fusion started from.

    Parameters
    ----------
    mod : tvm.IRModule
        The input module (not modified).
    fuse : tvm.transform.Pass, callable or None
        The fusion to undo.  ``None`` means ``LegalizeOps`` + ``AnnotateTIROpPattern``
        followed by ``FuseOps``; the reference is then the legalised, annotated module
        (``DefuseOps(FuseOps(x)) == x`` with ``x`` the input ``FuseOps`` really sees).
        Otherwise the reference is ``mod`` itself and ``fuse(mod)`` must return a module.
    kinds : iterable of str, optional
        Forwarded to :func:`patternkit.DefuseOps`.
    numeric : bool
        Also build the reference and the restored module for ``llvm`` and compare them on
        the VM with seeded random inputs (:func:`patternkit.compare`).
    rtol, atol : float
        Tolerances of the numeric comparison.  Defusion must not change the arithmetic,
        so the defaults are tight.
    seed : int
        Seed for the numeric inputs.
    func_name : str
        The function to run in the numeric comparison.
    numeric_options : dict, optional
        Extra keyword arguments for :func:`patternkit.verification.numeric.random_inputs`
        (``shape_vars``, ``positive`` ...).
    raise_on_failure : bool
        Raise :class:`RoundTripError` on failure (default); otherwise return the result.

    Returns
    -------
    RoundTripResult
        ``difference`` is ``None`` when the restored module is well formed and equals the
        reference after normalisation, modulo the dead bindings the fusion removed
        (listed in ``dropped_dead``; see the module docstring).
    """
    if fuse is None:
        prepare, fusion = default_fusion()
        reference = prepare(mod)
    else:
        reference, fusion = mod, fuse
    fused = fusion(reference)
    if not isinstance(fused, tvm.IRModule):
        raise TypeError(f"check_roundtrip: the fusion returned {type(fused).__name__}, "
                        f"expected an IRModule")
    restored = DefuseOps(kinds)(fused)
    result = RoundTripResult(reference, fused, restored)
    result.fusion_ill_formed = _ill_formed(fused, "the fusion's output (not DefuseOps')")
    result.difference, result.dropped_dead = compare_modulo_dead(
        normalize_for_comparison(reference), normalize_for_comparison(restored))
    if result.difference is None:
        # after the comparison, whose message is the more precise for a module that
        # differs; an equal one may still be ill formed (a symbolic variable defined in
        # two functions, which normalisation renames away), and then the fault may be the
        # fusion's: defusion only inlines, so it keeps a misplaced group misplaced
        restored_ill_formed = _ill_formed(restored)
        if restored_ill_formed is not None:
            result.difference = result.fusion_ill_formed or restored_ill_formed
    elif result.fusion_ill_formed is not None:
        result.difference += f"; and {result.fusion_ill_formed}"
    if result.dropped_dead:
        logger.info("round trip: %d dead binding(s) of the input were removed by the fusion "
                    "and not compared: %s", len(result.dropped_dead),
                    "; ".join(str(d) for d in result.dropped_dead))
    if result.difference is not None:
        logger.debug("round trip failed: %s", result.difference)
        if raise_on_failure:
            raise RoundTripError("DefuseOps(fuse(x)) != x after normalisation: "
                                 + result.difference, result)
        return result
    if numeric:

        result.numeric = numerics.compare(reference, restored, func_name=func_name, seed=seed,
                                 rtol=rtol, atol=atol, **(numeric_options or {}))
        if not result.numeric.ok and raise_on_failure:
            raise RoundTripError(f"the restored module computes different values: "
                                 f"{result.numeric}", result)
    return result
