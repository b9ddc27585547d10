"""Mutation score of the job's oracle: wrong rewrites, and whether ``run`` catches them.

Run ``python benchmarks/mutants.py`` (``--rules batchnorm.collapse ...``, ``--mutants
scale_1.5 ...``, ``--all-models``, ``--with-library``, ``--markdown``; a few minutes on the
shared 2-core machine).

Issue 32 asks for verdicts that cannot lie.  This script tries to make them lie: for every
rewrite rule of :data:`patternkit.patterns.LIBRARY` it builds *mutants*, rules with the
library rule's pattern, check and name (so the job's site report names it) whose rewrite
returns the library's replacement made wrong in one place:

========================  ===========================================================
``scale_1.01``            the result multiplied by 1.01 (a 1 % error)
``scale_1.5``             the result multiplied by 1.5
``epsilon_x100``          the ``epsilon`` attribute of a norm call times 100
``operands_swapped``      two operands of a call swapped (same types, so it still types)
``axis_moved``            an ``axis`` / ``axes`` attribute moved to another dimension
``bias_dropped``          an ``add`` of a constant or parameter dropped, or a norm's
                          beta operand made zeros
``transpose_added``       the last two dimensions of an operand or of the result
                          swapped, only where they are equal (square)
``scale_inverted``        a multiply by a constant ``c`` made a multiply by ``1 / c``,
                          or a ``scale`` attribute inverted
========================  ===========================================================

The mutations are generic: a small rewriter over the replacement expression (calls,
tuples and tuple projections) that rebuilds the one node it changes with
``relax.Call(op, args, attrs)`` (attributes rebuilt with ``tvm.ir.make_node``) and lets
normalisation re-infer the types.  A candidate whose result no longer types, or types
differently from the library's replacement, is not taken; a mutation with no candidate in
a rule's replacement is reported **not applicable** and not run.

Each mutant (and the unmutated library rule, as the control) runs through
:func:`patternkit.app.job.run` with ``patterns=[mutant]`` alone: the site report then has
exactly the rule under test and each run stays cheap.  ``--with-library`` appends the rest
of the library after the mutant (the issue's "a user rule applied with the library").

Models, for each rule:

* **zoo**: the first model of :data:`MODELS` the rule fires on (``--all-models``: every
  one), tiny configurations (one layer, hidden 32), random weights, nothing downloaded;
* **example**: the rule's own ``example()`` module;
* **x1e-4** and **x0**: that example with its output multiplied by ``1e-4`` and by zero
  after the rewritten region, so the whole-model comparison is tiny or no evidence at all
  and the verdict must rest on the rewrite sites.

Verdicts: **caught** (``report.ok`` is false and a failed site names the rule; the
evidence is the site's binding, the draw that failed and its error), **caught (whole
model only)** (the run failed on the whole-model comparison but no site named the
rule), **not judged (run fails)** (the run failed, but only because the rule's sites were
NOT RUN and the whole-model comparison was no evidence), **MISSED** (the run passed
although the mutant changes numbers), **equivalent** (the run passed and the mutant
changes no number: the reason is either structural, e.g. an operand swap of a commutative
op, or measured: the library's replacement and the mutant's, built side by side, agree to
1e-6 of their scale on draws of magnitude 1e-3, 1 and 1e3), **not applicable**.  For the
control: **pass**, **not judged (run fails)** or **FALSE ALARM**.

Each run prints one JSON line; ``--markdown`` prints the table of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

#: Zoo and built-in models tried, in order; a rule runs on the first it fires on.
MODELS = ["resnet18", "zoo:gpt2?layers=1&hidden=32&heads=2",
          "zoo:llama?layers=1&hidden=32&heads=4&kv_heads=2&intermediate=64",
          "zoo:onnx:gpt2?layers=1&hidden=32&heads=2&opset=14",
          "zoo:onnx:bert?layers=1&hidden=32&heads=2&opset=14",
          "zoo:resnet18?width=8"]

MUTATIONS = ("scale_1.01", "scale_1.5", "epsilon_x100", "operands_swapped", "axis_moved",
             "bias_dropped", "transpose_added", "scale_inverted")

#: The control: the library rule itself, wrapped like a mutant.
UNMUTATED = "unmutated"

#: Binary ops whose operands commute: swapping them is an equivalent mutant, taken only
#: when a rule's replacement offers nothing else.
COMMUTATIVE = frozenset({"relax.add", "relax.multiply", "relax.maximum", "relax.minimum",
                         "relax.equal", "relax.not_equal", "relax.logical_and",
                         "relax.logical_or"})

#: Relative difference below which the library's and the mutant's replacement count as
#: computing the same numbers (float32 rounding of reordered arithmetic stays below it).
EQUIVALENCE_BOUND = 1e-6

_LOG = logging.getLogger("mutants")


# -- the expression rewriter -------------------------------------------------------------
@dataclass
class Mutation:
    """One mutation applied to one replacement: the new expression and what changed.

    ``equivalent`` is the structural reason the change computes the same numbers (an
    operand swap of a commutative op, a zero bias), empty when it should not.
    """

    expr: Any
    change: str
    equivalent: str = ""


def _type(expr: Any) -> Any:
    """The Relax type of ``expr`` (a bare nested expression is typed in a scratch block:
    normalising it outside a function binds its nested calls), ``None`` if it does not
    type.
    """
    from patternkit.ir.compat import type_of

    return type_of(expr)


def _nodes(expr: Any) -> list:
    """The calls, tuples and projections of ``expr``, outermost first (pre-order)."""
    found: list = []

    def visit(node: Any) -> None:
        if isinstance(node, (relax.Call, relax.Tuple, relax.TupleGetItem)):
            found.append(node)
            for child in _children(node):
                visit(child)

    visit(expr)
    return found


def _children(node: Any) -> list:
    if isinstance(node, relax.Call):
        return list(node.args)
    if isinstance(node, relax.Tuple):
        return list(node.fields)
    if isinstance(node, relax.TupleGetItem):
        return [node.tuple_value]
    return []


def _replace(expr: Any, target: Any, new: Any) -> Any:
    """``expr`` with the node ``target`` (by identity) replaced by ``new``; the calls on
    the way are rebuilt untyped, for normalisation to type them again.
    """
    if expr.same_as(target):
        return new
    if isinstance(expr, relax.Call):
        args = [_replace(a, target, new) for a in expr.args]
        if all(a.same_as(b) for a, b in zip(args, expr.args)):
            return expr
        return relax.Call(expr.op, args, expr.attrs, expr.ty_args)
    if isinstance(expr, relax.Tuple):
        fields = [_replace(f, target, new) for f in expr.fields]
        if all(a.same_as(b) for a, b in zip(fields, expr.fields)):
            return expr
        return relax.Tuple(fields)
    if isinstance(expr, relax.TupleGetItem):
        inner = _replace(expr.tuple_value, target, new)
        return expr if inner.same_as(expr.tuple_value) else relax.TupleGetItem(inner, expr.index)
    return expr


def _with_attrs(call: Any, **changes: Any) -> Any:
    """``call`` with some attribute fields changed (the attrs node built anew)."""
    from patternkit.ir.compat import attr_field_names

    attrs = call.attrs
    fields = {name: getattr(attrs, name) for name in attr_field_names(attrs)}
    fields.update(changes)
    node = tvm.ir.make_node(type(attrs).__tvm_ffi_type_info__.type_key, **fields)
    return relax.Call(call.op, list(call.args), node, call.ty_args)


def _op(node: Any) -> str:
    return node.op.name if isinstance(node, relax.Call) and isinstance(node.op, tvm.ir.Op) else ""


def _fields(node: Any) -> tuple[str, ...]:
    from patternkit.ir.compat import attr_field_names

    attrs = getattr(node, "attrs", None) if isinstance(node, relax.Call) else None
    return attr_field_names(attrs) if attrs is not None else ()


def _dims(ty: Any) -> list | None:
    shape = getattr(ty, "shape", None) if isinstance(ty, relax.TensorType) else None
    return None if shape is None else list(shape)


def _dim(dim: Any) -> str:
    """A shape dimension as text: ``16``, not ``T.int64(16)``."""
    return str(int(dim)) if isinstance(dim, tvm.tirx.IntImm) else str(dim)


def _float_dtype(ty: Any) -> str | None:
    dtype = str(ty.dtype) if isinstance(ty, relax.TensorType) and ty.dtype is not None else ""
    return dtype if dtype.startswith(("float", "bfloat")) else None


def _constant(node: Any) -> np.ndarray | None:
    from patternkit.ir.compat import const_to_numpy, is_tensor_constant

    return const_to_numpy(node) if is_tensor_constant(node) else None


def _candidates(kind: str, expr: Any) -> list[tuple[Any, Any, str, str]]:
    """``(node, new node, what changed, equivalence reason)`` for mutation ``kind``."""
    out: list[tuple[Any, Any, str, str]] = []
    nodes = _nodes(expr)
    if kind.startswith("scale_") and kind != "scale_inverted":
        dtype = _float_dtype(_type(expr))
        factor = float(kind.split("_", 1)[1])
        if dtype:
            out.append((expr, relax.op.multiply(expr, relax.const(factor, dtype)),
                        f"result x{factor:g}", ""))
    elif kind == "epsilon_x100":
        for node in nodes:
            if "epsilon" in _fields(node):
                eps = float(node.attrs.epsilon)
                out.append((node, _with_attrs(node, epsilon=eps * 100),
                            f"{_op(node)} epsilon {eps:.3g} -> {eps * 100:.3g}", ""))
    elif kind == "operands_swapped":
        plain, commuting = [], []
        for node in nodes:
            if not isinstance(node, relax.Call) or len(node.args) < 2:
                continue
            args = list(node.args)
            for i in range(len(args)):
                for j in range(i + 1, len(args)):
                    if args[i].same_as(args[j]) or not isinstance(
                            _type(args[i]), relax.TensorType):
                        continue
                    swapped = list(args)
                    swapped[i], swapped[j] = args[j], args[i]
                    new = relax.Call(node.op, swapped, node.attrs, node.ty_args)
                    change = f"{_op(node)} operands {i} and {j} swapped"
                    if _op(node) in COMMUTATIVE and (i, j) == (0, 1):
                        commuting.append((node, new, change, f"{_op(node)} is commutative"))
                    else:
                        plain.append((node, new, change, ""))
        out = plain + commuting
    elif kind == "axis_moved":
        for node in nodes:
            names = _fields(node)
            if not isinstance(node, relax.Call) or not node.args:
                continue
            dims = _dims(_type(node.args[0]))
            if dims is None:
                continue
            rank = len(dims)
            if "axis" in names and node.attrs.axis is not None:
                axis = int(node.attrs.axis) % rank
                for moved in range(rank):
                    if moved != axis:
                        out.append((node, _with_attrs(node, axis=moved - rank),
                                    f"{_op(node)} axis {axis - rank} -> {moved - rank}", ""))
            elif "axes" in names and node.attrs.axes is not None:
                axes = [int(a) % rank for a in node.attrs.axes]
                for moved in range(rank):
                    if moved in axes:
                        continue
                    new_axes = [moved - rank] + [a - rank for a in axes[1:]]
                    out.append((node, _with_attrs(node, axes=new_axes),
                                f"{_op(node)} axes {[a - rank for a in axes]} -> {new_axes}",
                                ""))
    elif kind == "bias_dropped":
        for node in nodes:
            if _op(node) == "relax.add":
                for keep, bias in ((0, 1), (1, 0)):
                    leaf = node.args[bias]
                    if isinstance(leaf, (relax.Call, relax.Tuple, relax.TupleGetItem)):
                        continue
                    value = _constant(leaf)
                    reason = ("the bias is all zero" if value is not None
                              and not np.any(value) else "")
                    out.append((node, node.args[keep], "add of a constant/parameter "
                                f"{'constant' if value is not None else leaf} dropped",
                                reason))
            elif "center" in _fields(node) and len(node.args) > 2:
                # The beta operand (third in layer, group and batch norm) made zeros:
                # ``center=False`` would say the same, but TVM's legalisation ignores it.
                args = list(node.args)
                args[2] = relax.op.zeros_like(args[2])
                out.append((node, relax.Call(node.op, args, node.attrs, node.ty_args),
                            f"{_op(node)} beta made zeros", ""))
    elif kind == "transpose_added":
        for node in [expr] + [a for n in nodes if isinstance(n, relax.Call) for a in n.args]:
            dims = _dims(_type(node))
            if dims is None or len(dims) < 2:
                continue
            if not tvm_ffi.structural_equal(dims[-1], dims[-2]):
                continue
            rank = len(dims)
            axes = list(range(rank - 2)) + [rank - 1, rank - 2]
            value = _constant(node)
            reason = ("the operand is symmetric" if value is not None
                      and np.array_equal(value, np.swapaxes(value, -1, -2)) else "")
            what = "the result" if node.same_as(expr) else (
                f"operand {node.name}" if isinstance(node, relax.Var) else f"an operand "
                f"of shape [{', '.join(_dim(d) for d in dims)}]")
            out.append((node, relax.op.permute_dims(node, axes),
                        f"{what} transposed (last two dims, {_dim(dims[-2])} x {_dim(dims[-1])})",
                        reason))
    elif kind == "scale_inverted":
        for node in nodes:
            if _op(node) in ("relax.multiply", "relax.divide"):
                for position in (1, 0) if _op(node) == "relax.multiply" else (1,):
                    value = _constant(node.args[position])
                    if value is None or not np.all(value) or value.dtype.kind != "f":
                        continue
                    args = list(node.args)
                    args[position] = relax.const((1.0 / value).astype(value.dtype))
                    reason = ("the constant is +-1" if np.all(np.abs(value) == 1) else "")
                    out.append((node, relax.Call(node.op, args, node.attrs, node.ty_args),
                                f"{_op(node)} constant c -> 1/c", reason))
            elif "scale" in _fields(node) and isinstance(node.attrs.scale, tvm.tirx.FloatImm):
                scale = float(node.attrs.scale.value)
                if scale:
                    inverted = tvm.tirx.FloatImm(str(node.attrs.scale.ty.dtype), 1.0 / scale)
                    out.append((node, _with_attrs(node, scale=inverted),
                                f"{_op(node)} scale {scale:.3g} -> {1 / scale:.3g}",
                                "the scale is +-1" if abs(scale) == 1 else ""))
    return out


def mutate(expr: Any, kind: str) -> Mutation | None:
    """``expr`` (a replacement) mutated by ``kind``, or ``None`` when it does not apply.

    The first candidate (outermost first; for an operand swap, non-commutative ops first)
    whose result types as the library's replacement did is taken: a mutant that would not
    type is not a wrong rewrite but a broken one, which the job's well-formedness checks
    reject before any oracle is asked.
    """
    expected = _type(expr)
    for node, new, change, reason in _candidates(kind, expr):
        mutated = _replace(expr, node, new)
        ty = _type(mutated)
        if ty is not None and tvm_ffi.structural_equal(ty, expected):
            return Mutation(mutated, change, reason)
    return None


# -- mutant rules ------------------------------------------------------------------------
@dataclass
class Journal:
    """What a mutant did at each site it rewrote: ``(library replacement, mutated)``."""

    pairs: list = field(default_factory=list)
    changes: list = field(default_factory=list)
    equivalent: list = field(default_factory=list)
    not_applicable: int = 0


def make_mutant(rule: Any, kind: str, journal: Journal) -> Any:
    """A rule with ``rule``'s pattern, check and name whose rewrite is mutated by ``kind``.

    A shallow copy of the library rule whose class is a subclass overriding
    ``rewrite``: everything else the engine reads (roles, check, ``rewrite_once``, tolerance) stays
    the library rule's, so the job treats the mutant exactly as it would the rule.  A site
    where the mutation does not apply gets the library's replacement unchanged.
    """
    base = type(rule)

    def rewrite(self: Any, match: Any) -> Any:
        """The library rule's replacement, mutated; recorded in the journal."""
        result = base.rewrite(self, match)
        if kind == UNMUTATED or result is None:
            return result
        roots = result if isinstance(result, dict) else {None: result}
        changed = {}
        for root, expr in roots.items():
            mutation = mutate(expr, kind)
            if mutation is None:
                journal.not_applicable += 1
                changed[root] = expr
                continue
            journal.pairs.append((expr, mutation.expr))
            journal.changes.append(mutation.change)
            journal.equivalent.append(mutation.equivalent)
            changed[root] = mutation.expr
        return changed if isinstance(result, dict) else changed[None]

    mutant_class = type(f"{base.__name__}_{kind.replace('.', '_')}", (base,),
                        {"rewrite": rewrite,
                         "__doc__": f"{rule.rule_name} with its rewrite mutated: {kind}."})
    mutant = object.__new__(mutant_class)
    mutant.__dict__.update(rule.__dict__)
    return mutant


# -- models ------------------------------------------------------------------------------
def attenuated(mod: tvm.IRModule, factor: float, func: str = "main") -> tvm.IRModule | None:
    """``mod`` with ``func``'s tensor output multiplied by ``factor`` after everything else:
    the whole-model comparison then sees outputs that are tiny (``1e-4``) or all zero
    (``0``), while the rewritten region inside still computes real values.
    """
    old = mod[func]
    seq = old.body
    ty = seq.body.ty
    dtype = _float_dtype(ty)
    if dtype is None:
        return None
    out = relax.Var("attenuated", ty)
    value = relax.op.multiply(seq.body, relax.const(factor, dtype))
    block = relax.BindingBlock([relax.VarBinding(out, value)])
    body = relax.SeqExpr(list(seq.blocks) + [block], out)
    new = relax.Function(list(old.params), body, old.ret_ty, old.is_pure, old.attrs)
    result = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != func})
    result[func] = new
    return relax.transform.Normalize()(result)


def fires(rule: Any, model: Any) -> int:
    """How many sites ``rule`` rewrites in ``model`` (a spec or an IRModule)."""
    import patternkit as pk
    from patternkit.app.loading import load

    mod = model if isinstance(model, tvm.IRModule) else load(model).mod
    log = pk.RewriteLog()
    pk.rewrite([rule], mod, log=log)
    return log.count()


def models_for(rule: Any, candidates: Sequence[str], all_models: bool) -> list[tuple[str, Any]]:
    """``(label, model)`` pairs ``rule`` is tried on; see the module docstring."""
    chosen: list[tuple[str, Any]] = []
    for spec in candidates:
        try:
            if fires(rule, spec):
                chosen.append((spec, spec))
                if not all_models:
                    break
        except Exception as err:  # noqa: BLE001 - a model that does not load is skipped
            _LOG.warning("%s does not load: %s", spec, err)
    example = rule.example()
    if isinstance(example, tvm.IRModule):
        chosen.append(("example", example))
        for label, factor in (("example x1e-4", 1e-4), ("example x0", 0.0)):
            weak = attenuated(example, factor)
            if weak is not None:
                chosen.append((label, weak))
    return chosen


# -- equivalence -------------------------------------------------------------------------
def numbers_changed(pairs: Sequence[tuple[Any, Any]], seed: int = 0) -> float | None:
    """The largest relative difference between library and mutated replacements.

    Both expressions of each pair become outputs of one function of their free variables,
    built for llvm and run on draws of magnitude 1e-3, 1 and 1e3 (signed and positive);
    ``None`` when no pair could be built (symbolic shapes, non-tensor inputs).
    """
    from patternkit.verification.numeric import build

    rng = np.random.default_rng(seed)
    worst = None
    for original, mutated in pairs[:3]:
        params = list(relax.analysis.free_vars(relax.Tuple([original, mutated])))
        fresh = [relax.Var(p.name, p.ty) for p in params]
        shapes = [_dims(p.ty) for p in params]
        if any(s is None or not all(isinstance(d, tvm.tirx.IntImm) for d in s)
               for s in shapes):
            continue
        from patternkit.ir.walk import substitute

        mapping = dict(zip(params, fresh))
        bb = relax.BlockBuilder()
        with bb.function("probe", fresh):
            a = bb.emit(substitute(original, mapping))
            b = bb.emit(substitute(mutated, mapping))
            bb.emit_func_output(relax.Tuple([a, b]))
        try:
            vm = build(bb.get())
        except Exception as err:  # noqa: BLE001 - what cannot be built is not measured
            _LOG.warning("equivalence probe does not build: %s", err)
            continue
        for magnitude in (1e-3, 1.0, 1e3):
            for low in (-1.0, 0.5):
                args = []
                for p, shape in zip(params, shapes):
                    dims = [int(d) for d in shape]
                    dtype = str(p.ty.dtype)
                    if dtype.startswith("float"):
                        draw = rng.uniform(low, low + (2.0 if low < 0 else 1.0), dims)
                        args.append((draw * magnitude).astype(dtype))
                    else:
                        args.append(np.zeros(dims, dtype))
                out = vm["probe"](*[tvm.runtime.tensor(a) for a in args])
                ref, got = out[0].numpy().astype("float64"), out[1].numpy().astype("float64")
                finite = np.isfinite(ref) & np.isfinite(got)
                scale = float(np.sqrt(np.mean(ref[finite] ** 2))) if finite.any() else 0.0
                diff = float(np.abs(ref - got)[finite].max()) if finite.any() else 0.0
                if (np.isfinite(ref) != np.isfinite(got)).any():
                    diff, scale = math.inf, 1.0
                relative = diff / scale if scale else (0.0 if diff == 0 else math.inf)
                worst = relative if worst is None else max(worst, relative)
    return worst


# -- one run -----------------------------------------------------------------------------
def run_one(rule: Any, kind: str, label: str, model: Any, *, with_library: bool = False,
            seed: int = 0) -> dict:
    """Run ``rule`` mutated by ``kind`` through the job on ``model``; the row's verdict."""
    from patternkit.app import job
    from patternkit.patterns import LIBRARY

    journal = Journal()
    mutant = make_mutant(rule, kind, journal)
    row: dict[str, Any] = {"rule": rule.rule_name, "mutant": kind, "model": label}
    if kind != UNMUTATED:  # applicability first: a rewrite alone, no build
        import patternkit as pk

        probe = Journal()
        mod = model if isinstance(model, tvm.IRModule) else None
        if mod is None:
            from patternkit.app.loading import load

            mod = load(model).mod
        try:
            pk.rewrite([make_mutant(rule, kind, probe)], mod)
        except Exception as err:  # noqa: BLE001 - a mutator bug is a row, not a crash
            row.update(verdict="ERROR", evidence=f"mutation failed: {err}"[:300])
            return row
        if not probe.pairs:
            row.update(verdict="not applicable", evidence="no candidate in the replacement")
            return row
    patterns = [mutant] + ([r for r in LIBRARY.rewrite_rules() if r.rule_name != rule.rule_name]
                           if with_library else [])
    start = time.perf_counter()
    try:
        report = job.run(model, patterns=patterns, out_dir=None, draw=False, seed=seed)
    except Exception as err:  # noqa: BLE001 - a crash is a finding, reported in the row
        row.update(verdict="ERROR", evidence=f"{type(err).__name__}: {err}"[:300],
                   seconds=round(time.perf_counter() - start, 2))
        return row
    row["seconds"] = round(time.perf_counter() - start, 2)
    row["change"] = journal.changes[0] if journal.changes else ""
    row["sites"] = len(journal.pairs)
    failing = [s for s in _sites(report) if s.status == "fail" and s.rule == rule.rule_name]
    numeric = report.numeric
    max_abs = numeric.max_abs_error if numeric.max_abs_error is not None else float("nan")
    whole = f"whole model {numeric.status}, max abs {max_abs:.2g}"
    # A run that fails with no site failed and no whole-model miss judged nothing: its
    # sites were NOT RUN and the whole-model comparison was no evidence.  That is the
    # oracle refusing to pass, not catching anything, and the table says so.
    unjudged = [s.reason for s in _sites(report)
                if s.status == "not_run" and s.rule == rule.rule_name]
    refused = (not report.ok and not failing and numeric.status != "fail"
               and bool(unjudged))
    if kind == UNMUTATED:
        row["verdict"] = ("pass" if report.ok else "not judged (run fails)" if refused
                          else "FALSE ALARM")
        row["evidence"] = (report.evidence if report.ok else
                           f"sites NOT RUN: {unjudged[0]}; {whole}" if refused else
                           _failure(report, failing, whole))
        return row
    if refused:
        row.update(verdict="not judged (run fails)",
                   evidence=f"sites NOT RUN: {unjudged[0]}; {whole}")
        return row
    if not report.ok:
        row["verdict"] = "caught" if failing else "caught (whole model only)"
        row["evidence"] = _failure(report, failing, whole)
        return row
    reasons = [r for r in journal.equivalent if r]
    if reasons and len(reasons) == len(journal.equivalent):
        row.update(verdict="equivalent", evidence=reasons[0])
        return row
    changed = numbers_changed(journal.pairs, seed)
    if changed is not None and changed <= EQUIVALENCE_BOUND:
        row.update(verdict="equivalent",
                   evidence=f"no number changed by more than {changed:.1g} of its scale on "
                            f"draws of magnitude 1e-3..1e3")
    else:
        row.update(verdict="MISSED",
                   evidence=(f"the replacement changes by {changed:.2g} of its scale; "
                             if changed is not None else "") + report.evidence)
    return row


def _sites(report: Any) -> list:
    """The job report's validated sites (:class:`patternkit.verification.sites.Site`)."""
    found = report.sites.report
    return found.sites if found is not None else []


def _failure(report: Any, failing: list, whole: str) -> str:
    """The evidence a failing run gives: the first failed site's draw, or the whole model."""
    if failing:
        site = failing[0]
        draws = [d for d in site.inputs if ": fail" in d]
        draw = draws[0].split(":")[0] if draws else site.reason[:80]
        return f"site {site.binding} ({draw}), max rel {site.max_rel_error:.2g}; {whole}"
    failed = [s for s in _sites(report) if s.status == "fail"]
    if failed:
        return f"site of {failed[0].rule} failed; {whole}"
    bad = [k for k, v in report.roundtrip.items() if not v.ok]
    return whole + (f"; round trip {', '.join(bad)} failed" if bad else "")


# -- the table ---------------------------------------------------------------------------
def markdown(rows: Sequence[dict]) -> str:
    """One row per rule and mutant; one column per model kind (zoo, example, x1e-4, x0).

    Mutants not applicable to a rule on any model are listed below the table, one line
    per rule, rather than as rows of empty verdicts.
    """
    kinds = ["zoo", "example", "example x1e-4", "example x0"]
    grouped: dict[tuple[str, str], dict[str, dict]] = {}
    for row in rows:
        kind = row["model"] if row["model"].startswith("example") else "zoo"
        grouped.setdefault((row["rule"], row["mutant"]), {})[kind] = row
    lines = ["| rule | mutant | change | zoo model | " + " | ".join(kinds) + " | evidence |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in kinds) + " | --- |"]
    not_applicable: dict[str, list[str]] = {}
    for (rule, mutant), by_kind in grouped.items():
        if all(r["verdict"] == "not applicable" for r in by_kind.values()):
            not_applicable.setdefault(rule, []).append(mutant)
            continue
        cells = []
        for kind in kinds:
            row = by_kind.get(kind)
            verdict = row["verdict"] if row else ""
            cells.append(f"**{verdict}**" if verdict in ("MISSED", "FALSE ALARM", "ERROR")
                         else verdict)
        zoo = by_kind.get("zoo")
        judged = [r for r in ([zoo] if zoo else []) + list(by_kind.values())
                  if r["verdict"] != "not applicable"]
        first = judged[0]
        change = next((r.get("change") for r in by_kind.values() if r.get("change")), "")
        lines.append(f"| `{rule}` | {mutant} | {change} | "
                     f"{_model_label(zoo['model']) if zoo else '-'} | "
                     + " | ".join(cells) + f" | {first.get('evidence', '')} |")
    lines += ["", "Not applicable (no candidate in the rule's replacement, on any model):", ""]
    lines += [f"* `{rule}`: {', '.join(kinds_)}" for rule, kinds_ in not_applicable.items()]
    return "\n".join(lines)


def _model_label(spec: str) -> str:
    """``zoo:gpt2?layers=1&...`` -> ```zoo:gpt2```; a built-in name is marked as one (the
    built-in ``resnet18`` writes its batch norms out, the zoo's does not).
    """
    name = spec.split("?", 1)[0]
    return f"`{name}`" if name.startswith("zoo:") else f"`{name}` (built-in)"


def score(rows: Sequence[dict]) -> dict:
    """Counts of each verdict, over the mutant runs and over the controls."""
    mutants: dict[str, int] = {}
    controls: dict[str, int] = {}
    for row in rows:
        target = controls if row["mutant"] == UNMUTATED else mutants
        target[row["verdict"]] = target.get(row["verdict"], 0) + 1
    return {"mutants": mutants, "controls": controls}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rules", nargs="*", help="rule names (default: every rewrite rule)")
    parser.add_argument("--mutants", nargs="*", default=list(MUTATIONS), choices=MUTATIONS)
    parser.add_argument("--models", nargs="*", default=MODELS,
                        help="zoo/built-in specs tried for each rule, in order")
    parser.add_argument("--all-models", action="store_true",
                        help="every model of --models the rule fires on, not the first")
    parser.add_argument("--with-library", action="store_true",
                        help="apply the rest of the library after the mutant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true", help="print the README table")
    parser.add_argument("--from-json", metavar="FILE",
                        help="print the table of a saved run's JSON lines, running nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as saved:
            rows = [json.loads(line) for line in saved if line.startswith('{"rule"')]
        print(json.dumps({"score": score(rows)}))
        print(markdown(rows))
        return

    from patternkit.patterns import LIBRARY

    rules = [r for r in LIBRARY.rewrite_rules() if not args.rules or r.rule_name in args.rules]
    start = time.perf_counter()
    rows = []
    for rule in rules:
        for label, model in models_for(rule, args.models, args.all_models):
            for kind in [UNMUTATED] + list(args.mutants):
                row = run_one(rule, kind, label, model, with_library=args.with_library,
                              seed=args.seed)
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {"score": score(rows), "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(summary), flush=True)
    if args.markdown:
        print(markdown(rows))


if __name__ == "__main__":
    main()
