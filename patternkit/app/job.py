"""The main job as Python calls: load a model, rewrite, partition, verify, report.

``patternkit run`` is a thin shell over :func:`run`; notebooks and scripts call it
directly.  The steps, each timed:

1. **load** the model (:mod:`patternkit.app.loading`): a built-in one (default
   ``resnet18``), a zoo model (``zoo:gpt2?batch=dynamic``), a Python file that defines
   an ``IRModule``, an ``.onnx`` file or a ``.pt2`` file (``torch.export.save``); choose
   its entry function (``func=``: default ``main``, else the only public function);
2. **rewrite** with the library's rewrite rules, or the rules ``patterns=`` names:
   library names, rule objects, RuleSets, rule files (:mod:`patternkit.app.rules`); each
   family's shape the rewrite left is reported with the rule that declined it and why
   (:mod:`patternkit.app.near_misses`);
3. **composites**: ``MergeComposite`` with the composite rules, renamed for
   ``compiler``, then ``PartitionGraph(compiler)``; or, with ``tables="cutlass"`` (TVM's
   registered tables, :meth:`patternkit.PatternTable.from_tvm`), with those tables and
   TVM's semantics instead; the offload report says which ops went to the compiler and,
   for each op left on the host, why;
4. **numeric check** of the entry function: ``before`` and ``after`` (external functions
   inlined back) built for ``llvm`` (as one module with the per-site checks' functions,
   :mod:`patternkit.verification.joint`: one build, not three) and run on seeded
   random inputs, integer inputs drawn inside the tables they index (or the user's
   ``input_ranges``); inputs that would read out of bounds fail the check with the
   reason, never pass.  Symbolic dimensions are checked at the example sizes and again
   at their smallest (not in a float16 model, whose one run is the float64
   arbitration's).  A float16/bfloat16 model,
   and a float32 one that misses ``rtol = atol = 1e-4``, is judged against the model
   recomputed in float64 (:mod:`patternkit.app.precision`): the rewrite may round
   differently, not worse;
5. **round trips**: ``DefuseOps(FuseOps(x)) == x`` on the model, and
   ``DefuseOps(PartitionGraph(MergeComposite(x))) == x`` on the rewritten model (the
   module step 3 partitioned: the composites are formed once), modulo the dead bindings
   fusion drops (listed in the report);
6. optionally (``train=True``) a **gradient check** (:mod:`patternkit.app.training`);
7. **write** ``before.py`` and ``after.py`` (which load again: written and read back in
   a thread from step 4 on, :func:`patternkit.app.scripts.start_writing`), ``before.svg``,
   ``after.svg``, ``diff.svg`` (drawn within a layout budget, see
   :mod:`patternkit.app.drawings`; laid out in a thread from step 4 on, while the job
   builds and checks), ``report.md`` (a per-op table first),
   ``report.html`` (the same in one page, drawings inline: :mod:`patternkit.app.report_html`)
   and ``report.json`` to the output folder.

What the steps found is a :class:`~patternkit.app.report.JobReport` of typed sections
(:mod:`patternkit.app.report`, which also writes it as Markdown).  The other commands'
jobs live beside this one: :mod:`patternkit.app.coverage` (``patternkit coverage``) and
:mod:`patternkit.app.verify` (``patternkit verify``).

The module the job loads and the output of every step are checked for well-formedness
(:func:`patternkit.engine.assert_well_formed`), so a step that emits a broken module is
named where it happened.
"""

from __future__ import annotations

import json
import logging
import math
import time
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import tvm
from tvm import relax

from ..byoc.merge import CompositeLog, merge_composite
from ..byoc.partition import inline_external, partition_graph
from ..byoc.reports.offload import explain_offload
from ..byoc.tables import PatternTable
from ..engine.driver import RewriteLog, rewrite
from ..engine.ruleset import RuleSet
from ..engine.wellformed import assert_well_formed
from ..errors import BuildError, tvm_error_line
from ..ir.compat import TVM_ERRORS
from ..verification import numeric
from ..verification.joint import build_joint
from ..verification.roundtrip import check_roundtrip
from ..verification.sites import SitePlan, SiteReport, plan_sites, validate_sites
from .loading import DEFAULT_MODEL, JobError, LoadedModel, entry_function, load, load_model
from .near_misses import near_misses_of
from .outfolder import OutputFolder
from .precision import float64_check, low_precision_dtype
from .report import (
    JobReport,
    NumericResult,
    OffloadSection,
    RoundTripEntry,
    SiteValidation,
    report_markdown,
)
from .rules import resolve_rules
from .summary import op_summary

logger = logging.getLogger(__name__)

DEFAULT_COMPILER = "ccompiler"
#: Tolerances of the job's numeric check: rewrites change the arithmetic (a folded batch
#: norm rounds differently), so not exact; a wrong rewrite is off by far more.
RTOL = ATOL = 1e-4

__all__ = ["DEFAULT_COMPILER", "DEFAULT_MODEL", "JobError", "JobReport", "entry_function",
           "load_model", "run", "write_outputs"]


# -- the job ---------------------------------------------------------------------------------
def run(model: str | Path | tvm.IRModule | None = None, *, patterns: Any = None,
        compiler: str = DEFAULT_COMPILER, out_dir: str | Path | None = "patternkit-out",
        seed: int = 0, draw: bool = True, func: str | None = None,
        numeric_options: Mapping[str, Any] | None = None,
        input_ranges: Mapping[str, tuple[int, int]] | None = None,
        train: bool = False, full_drawing: bool = False,
        progress: Callable[[str], None] | None = None, tables: str | None = None) -> JobReport:
    """Run the main job; see the module docstring.  ``out_dir=None`` writes nothing.

    Parameters
    ----------
    model : str, Path or tvm.IRModule
        See :func:`patternkit.app.loading.load`; an ``IRModule`` is used as it is.
    patterns : names, rules, RuleSets or rule files, optional
        See :mod:`patternkit.app.rules`; default the whole library.
    func : str, optional
        The entry function (default ``main``, else the only public function); the numeric
        check, round trips and drawings use it.
    numeric_options : mapping, optional
        Keyword arguments of :func:`patternkit.verification.numeric.compare` (``rtol``,
        ``atol``, ``shape_vars``, ``int_ranges``...).
    input_ranges : mapping, optional
        Integer input name -> ``(low, high)`` (``low <= v < high``); over the ranges a zoo
        model declares and those derived from the tables the inputs index.  Inputs that
        would still read outside a table make the check fail, with the reason.
    train : bool
        Also differentiate the entry function (sum loss, every float parameter) and check
        the gradients against finite differences; see :mod:`patternkit.app.training`.
    full_drawing : bool
        Draw every node instead of collapsing repeated layers and composites.
    tables : str, optional
        ``"cutlass"``, ``"cutlass,tensorrt"``: partition with TVM's registered pattern
        tables instead of the library's composites (the rewrites still run first).

    Notes
    -----
    The files are written aside and moved into ``out_dir`` when the run ends
    (:mod:`patternkit.app.outfolder`): the folder holds the files of this run only, and
    a run that raises leaves a ``report.md`` saying why in place of the previous run's.
    """
    options = dict(patterns=patterns, compiler=compiler, seed=seed, draw=draw, func=func,
                   numeric_options=numeric_options, input_ranges=input_ranges, train=train,
                   full_drawing=full_drawing, progress=progress, tables=tables)
    if out_dir is None:
        return _run(model, None, None, **options)
    out = Path(out_dir)
    with _output_folder(out, model) as folder:
        return _run(model, folder.staging, out, **options)


def _output_folder(out: Path, model: str | Path | tvm.IRModule | None) -> OutputFolder:
    """The output folder, staged (:class:`~patternkit.app.outfolder.OutputFolder`), or a
    one-line :class:`JobError` when it cannot be written.
    """
    shown = ("IRModule" if isinstance(model, tvm.IRModule)
             else str(model) if model is not None else DEFAULT_MODEL)
    try:
        return OutputFolder(out, shown)
    except OSError as err:
        raise JobError(f"cannot write to the output folder {out}: {err.strerror}") from err


def _run(model: str | Path | tvm.IRModule | None, staging: Path | None, out: Path | None, *,
         patterns: Any, compiler: str, seed: int, draw: bool, func: str | None,
         numeric_options: Mapping[str, Any] | None,
         input_ranges: Mapping[str, tuple[int, int]] | None, train: bool, full_drawing: bool,
         progress: Callable[[str], None] | None, tables: str | None) -> JobReport:
    """:func:`run`'s steps; the files go to ``staging`` (``None``: none), ``out`` is where
    the user will find them.
    """
    say = progress or (lambda message: None)
    timer = time.perf_counter
    seconds: dict[str, float] = {}

    def step(name: str, fn: Callable, *args, **kwargs):
        start = timer()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name] = round(timer() - start, 3)

    say("loading the model ...")
    if isinstance(model, tvm.IRModule):
        loaded = LoadedModel(model, "IRModule")
    else:
        loaded = step("load", load, model)
    before = _well_formed(loaded.mod, f"the job's input ({loaded.description})", "input")
    entry = entry_function(before, func)
    chosen = resolve_rules(patterns)
    rules, composites = chosen.rewrite_rules(), chosen.composites().for_compiler(compiler)
    table: Any = composites
    names = list(chosen.names)
    table_compiler: str | None = compiler  # None: each entry's name says its compiler
    if tables:
        table, table_compiler = PatternTable.from_tvm(tables), None
        names = list(rules.names) + list(dict.fromkeys(c.name for c in table))
    target = tables or compiler
    report = JobReport(model=loaded.description, compiler=target, func=entry, patterns=names,
                       import_fixups=list(loaded.import_fixups))

    rewritten = before
    log = RewriteLog()
    if rules:
        say(f"rewriting with {', '.join(r.rule_name for r in rules)} ...")
        rewritten = step("rewrite", rewrite, rules, before, log=log)
        _well_formed(rewritten, "rewrite", rules=log.counts())
        report.rewrites = log.counts()
    report.near_misses = step("near_misses", near_misses_of, log, chosen, rewritten)

    after = rewritten
    merged = None
    host_ops: list = []
    if table:
        say(f"forming composites for {target} ...")
        table = PatternTable(table, table_compiler)
        merge_log = CompositeLog()
        merged = _well_formed(step("composites", merge_composite, rewritten, table,
                                   log=merge_log), "MergeComposite")
        offload = explain_offload(merged, merge_log, table)
        host_ops = offload.host_ops
        report.offload = OffloadSection(offload.composites, offload.offloaded_ops,
                                        [str(h) for h in host_ops])
        # nothing to offload is a finding of the report ("0 composite(s)"), not a mistake
        # of the user's: PartitionGraph's warning for a module without composites (run
        # MergeComposite first) would only tell them to do what the job did
        after = merged if not offload.composites else _well_formed(
            step("partition", partition_graph, merged, table_compiler), "PartitionGraph")
    report.ops = op_summary(before[entry], log.records, merged, host_ops, target)

    scripts = None
    if staging is not None:  # before.py and after.py written and read back alongside
        from .scripts import start_writing

        scripts = start_writing(staging, {"before": before, "after": after})
    drawing = None
    if staging is not None and draw:
        # laid out by ``dot`` while the job builds and checks (see start_drawing)
        from .drawings import start_drawing  # drawing is optional (draw=False): load it late

        drawing = start_drawing(staging, {"before": before, "after": after}, before, after,
                                changes=log, func=entry, full=full_drawing)
    try:
        say("building before and after for llvm and comparing ...")
        options = _numeric_options(loaded, entry, seed, numeric_options, input_ranges)
        restored = _well_formed(inline_external(after), "inlining the external functions")
        first_sizes = _sizes_of(before[entry], options)
        plan = _site_plan(before, log, entry)
        joint = step("build", build_joint, before, restored, entry,
                     plan.functions() if plan is not None else None)
        inputs = None
        try:
            report.numeric, inputs = _numeric_check(
                before, restored, loaded, entry, options, first_sizes, step, say,
                joint.comparison() if joint is not None else None)
        except BuildError as err:
            # nothing to compare: a model TVM imported unbuildable, or a pass that broke it
            report.numeric = NumericResult.not_built_by(err.side, str(err), options["seed"])
        if log.records:
            say(f"validating {log.count()} rewrite site(s) on the model's own values and "
                f"adversarial draws ...")
            report.sites = step("sites", _validate_sites, before, rewritten, log, rules, entry,
                                inputs, seed, plan, joint.vm if joint is not None else None)

        say("checking the fuse/defuse round trips ...")
        report.roundtrip["FuseOps"] = step("roundtrip_fuseops", _round_trip, before, None,
                                           entry)
        if table:
            def partitioned_above(mod: tvm.IRModule) -> tvm.IRModule:
                # the module the composites step partitioned: the round trip undoes what the
                # job ran, not a second run of MergeComposite + PartitionGraph
                assert mod is rewritten
                return after

            report.roundtrip["MergeComposite+PartitionGraph"] = step(
                "roundtrip_composites", _round_trip, rewritten, partitioned_above, entry)

        adjoint = None
        if train and report.numeric.not_built == "before":
            report.training = {"status": "not_run",
                               "reason": "the model as imported does not build for llvm "
                                         "(see the numeric check)"}
        elif train:
            from .training import train_check  # the training package loads only when asked

            say("differentiating the model and checking the gradients ...")
            zoo = loaded.zoo
            report.training, adjoint = step(
                "train", train_check, before, entry, seed=seed, int_ranges=options["int_ranges"],
                inputs=zoo.arguments() if zoo is not None and zoo.params else None,
                sizes=first_sizes)
            if "reason" in report.training and zoo is not None and not zoo.params:
                report.training["reason"] += (" (a zoo model keeps its weights as constants "
                                              "unless keep_params=true)")
            elif (report.training.get("status") == "not_run"
                  and loaded.description.endswith(".pt2")):
                report.training["reason"] += (" (a .pt2 file's weights are constants unless "
                                              "--keep-params / ?keep_params=true)")

        report.seconds = seconds
        if staging is not None:
            say(f"writing {out}/ ...")
            write_outputs(staging, before, after, report, draw=draw, changes=log, func=entry,
                          full_drawing=full_drawing, adjoint=adjoint, drawing=drawing,
                          scripts=scripts)
        return report
    finally:
        started: list[futures.Future] = [f for f in (drawing, scripts) if f is not None]
        futures.wait(started)  # never leave them writing into a folder being removed


def _site_plan(before: tvm.IRModule, log: RewriteLog, entry: str) -> SitePlan | None:
    """The rewrite sites cut out for their validation, to build beside the model; ``None``
    when nothing was rewritten or they cannot be cut out (the validation then says why).
    """
    if not log.records:
        return None
    try:
        return plan_sites(before, log, entry)
    except Exception:  # noqa: BLE001 - validate_sites meets it again and reports it
        return None


def _validate_sites(before: tvm.IRModule, rewritten: tvm.IRModule, log: RewriteLog,
                    rules: RuleSet, entry: str, inputs: list | None, seed: int,
                    plan: SitePlan | None = None, vm: Any = None) -> SiteValidation:
    """The report's ``sites`` section: every rewrite validated on its own
    (:func:`~patternkit.verification.sites.validate_sites`), each held to its rule's
    tolerance, a miss arbitrated against the site in float64.  Never raises: a
    validation that cannot run is NOT RUN with the reason.  ``plan`` and ``vm``: the
    sites already cut out and built with the model (the joint build).
    """
    from ..training.precision import as_float64  # loads only when a site needs it

    try:
        report: SiteReport = validate_sites(before, rewritten, log, inputs=inputs, seed=seed,
                                            func_name=entry, rules=rules,
                                            widen=lambda func: as_float64(func, "site"),
                                            plan=plan if vm is not None else None, vm=vm)
    except Exception as err:  # noqa: BLE001 - a check that cannot run says so
        return SiteValidation(not_run=f"{type(err).__name__}: {tvm_error_line(err)}")
    return SiteValidation(report)


def _round_trip(mod: tvm.IRModule, fuse: Callable | None, entry: str) -> RoundTripEntry:
    """:func:`check_roundtrip` of ``mod`` as the report holds it; NOT RUN, with TVM's one
    line, when TVM cannot legalise or fuse the model (a dynamic-shape ``strided_slice``
    TVM's legalisation refuses): a fault of TVM's passes, not of a rewrite, which stopped
    the whole job with a traceback.
    """
    try:
        return RoundTripEntry.of(check_roundtrip(mod, fuse, func_name=entry,
                                                 raise_on_failure=False))
    except TVM_ERRORS as err:
        return RoundTripEntry.could_not_run(f"TVM could not prepare or fuse the model: "
                                            f"{tvm_error_line(err, 300)}")


def _numeric_check(before: tvm.IRModule, restored: tvm.IRModule, loaded: LoadedModel,
                   entry: str, options: Mapping[str, Any], first_sizes: dict[str, int],
                   step: Callable, say: Callable[[str], None],
                   built: numeric.Built | None = None) -> tuple[NumericResult, list | None]:
    """``(the report's numeric section, the inputs of the first comparison)``: before
    against the rewritten and partitioned module (its external functions inlined), at the
    first sizes and again at the smallest the model declares, and against float64 where
    float rounding can explain a difference.  ``status`` is the comparisons' verdict
    (``"pass"``, ``"fail"``, ``"inconclusive"``: outputs that are no evidence, or
    ``"refused"``), then the float64 arbitration's where it ran.

    Raises :class:`BuildError` when either module does not build for llvm.  ``built``:
    both modules' builds (the joint build), used at every size.
    """
    low_precision = low_precision_dtype(before[entry])
    comparison = step("numeric_check", numeric.compare, before, restored, keep_runs=True,
                      built=built, **options)
    result = NumericResult(
        ok=comparison.ok, max_abs_error=comparison.max_abs_error,
        max_rel_error=comparison.max_rel_error, rtol=options["rtol"], atol=options["atol"],
        seed=options["seed"],
        int_ranges={k: list(v) for k, v in options["int_ranges"].items()},
        refused=list(comparison.refused), identical=comparison.identical,
        status=comparison.status, reason=comparison.reason, magnitude=comparison.magnitude,
        norm_error=comparison.norm_error, norm_bound=comparison.norm_bound)
    comparisons = [comparison]
    roles = ({var: role for role, var in loaded.zoo.symbolic_dims.items()}
             if loaded.zoo is not None else {})
    smallest = _smallest_sizes(loaded, first_sizes, roles)
    if smallest and not low_precision and not comparison.refused and not comparison.identical:
        say(f"comparing again at {', '.join(f'{k}={v}' for k, v in smallest.items())} ...")
        again = step("numeric_check_smallest", numeric.compare, before, restored,
                     keep_runs=True, built=built,
                     **{**options, "shape_vars": {**options.get("shape_vars", {}), **smallest}})
        comparisons.append(again)
        result = replace(
            result, ok=comparison.ok and again.ok,
            max_abs_error=max(comparison.max_abs_error, again.max_abs_error),
            max_rel_error=max(comparison.max_rel_error, again.max_rel_error),
            sizes=[first_sizes, {**first_sizes, **smallest}], roles=roles,
            refused=list(again.refused), **_combined_status(comparisons))
    if low_precision and not comparison.refused and not comparison.identical:
        say(f"{low_precision} model: measuring both against it recomputed in float64 ...")
        check = step("numeric_float64", float64_check, before, entry, *comparison.runs,
                     options["atol"], rtol=options["rtol"])
        result = replace(result, ok=check["ok"], dtype=low_precision, float64=check)
        if check.get("status") != "not_run":
            result = replace(result, status=check["status"], reason=check.get("reason", ""))
    elif (missed := [c for c in comparisons if c.status == numeric.FAIL
                     and math.isfinite(c.max_abs_error)]):
        say("the comparison missed its tolerance: measuring both against the model "
            "recomputed in float64 ...")
        checks = [step("numeric_float64", float64_check, before, entry, *c.runs,
                       options["atol"], rtol=options["rtol"]) for c in missed]
        worst = min(checks, key=lambda c: _STATUS_RANK.get(c.get("status"), 0))
        dtype = next((str(o.dtype) for o in comparison.runs[1] if o.dtype.kind == "f"),
                     "float32")
        result = replace(result, ok=all(c["ok"] for c in checks), dtype=dtype, float64=worst,
                         float64_after_miss=True)
        if all(c.get("status") != "not_run" for c in checks):
            result = replace(result, status=numeric.PASS if result.ok else worst["status"],
                             reason="" if result.ok else worst.get("reason", ""))
    inputs = comparison.runs[0] if comparison.runs is not None else None
    return result, inputs


#: Float64 checks from worst to best: the report shows the worst.
_STATUS_RANK = {numeric.FAIL: 0, numeric.INCONCLUSIVE: 1, "not_run": 2, numeric.PASS: 3}


def _combined_status(comparisons: Sequence[numeric.Comparison]) -> dict[str, Any]:
    """The verdict of comparisons made at several sizes: a failure anywhere fails, weak
    evidence anywhere cannot pass.
    """
    for status in (numeric.FAIL, numeric.REFUSED, numeric.INCONCLUSIVE):
        found = [c for c in comparisons if c.status == status]
        if found:
            return {"status": status, "reason": found[0].reason,
                    "magnitude": min(c.magnitude for c in comparisons)}
    return {"status": numeric.PASS, "reason": "",
            "magnitude": min(c.magnitude for c in comparisons)}


def _well_formed(mod: tvm.IRModule, pass_name: str, stage: str = "output",
                 rules: Any = ()) -> tvm.IRModule:
    """``mod``, after the engine's full well-formedness check at one of the job's boundaries.

    The job checks what it loads and what each step hands on, whatever the debug mode,
    so that a step that emits a module TVM would reject fails there, by name, rather than
    inside ``relax.build`` three steps on.
    """
    assert_well_formed(mod, pass_name, stage, rules)
    return mod


def _smallest_sizes(loaded: LoadedModel, first: Mapping[str, int],
                    roles: Mapping[str, str]) -> dict[str, int]:
    """The entry's symbolic dimensions at their smallest sizes (a zoo model's lower bound,
    else 1), where that differs from the first check's: a rewrite that is only right
    when a dimension is not 1 (a broadcast it took for an identity) shows there.
    """
    bounds = loaded.zoo.dim_bounds if loaded.zoo is not None else {}
    smallest = {var: int(bounds.get(roles.get(var), (1, None))[0]) for var in first}
    return {var: size for var, size in smallest.items() if size != first[var]}


def _sizes_of(func: relax.Function, options: Mapping[str, Any]) -> dict[str, int]:
    """Symbolic dimension name -> the size the numeric check gives it."""
    given = options.get("shape_vars") or {}
    names = {v.name for p in func.params for v in relax.analysis.tir_vars_in_type(p.ty)}
    return {name: int(given.get(name, numeric.DEFAULT_DIM)) for name in sorted(names)}


def _numeric_options(loaded: LoadedModel, entry: str, seed: int,
                     user: Mapping[str, Any] | None,
                     input_ranges: Mapping[str, tuple[int, int]] | None) -> dict[str, Any]:
    """``compare``'s options: the job's defaults, then the model's facts, then the user's."""
    options: dict[str, Any] = {"func_name": entry, "seed": seed, "rtol": RTOL, "atol": ATOL,
                               "positive": ("var",)}
    ranges: dict[str, tuple[int, int]] = {}
    if loaded.zoo is not None:
        ranges.update(loaded.zoo.input_ranges)
        options["shape_vars"] = loaded.zoo.shape_vars()
    options.update(user or {})
    ranges.update(options.pop("int_ranges", None) or {})
    ranges.update(input_ranges or {})
    options["int_ranges"] = {k: (int(lo), int(hi)) for k, (lo, hi) in ranges.items()}
    return options


def write_outputs(out: Path, before: tvm.IRModule, after: tvm.IRModule, report: JobReport,
                  draw: bool = True, changes: Any = None, func: str = "main",
                  full_drawing: bool = False, adjoint: tvm.IRModule | None = None,
                  drawing: futures.Future | None = None,
                  scripts: futures.Future | None = None) -> None:
    """TVMScript, drawings and the three reports (``report.html`` shows the drawings).

    ``drawing``: the drawings of ``before``, ``after`` and their diff, started earlier
    (:func:`patternkit.app.drawings.start_drawing`); only the adjoint is drawn here then.
    ``scripts``: ``before.py`` and ``after.py``, started earlier
    (:func:`patternkit.app.scripts.start_writing`).
    """
    from .report_html import write_report_html
    from .scripts import write_script

    start = time.perf_counter()
    files = (list(scripts.result()) if scripts is not None else
             [write_script(out / "before.py", before), write_script(out / "after.py", after)])
    if draw:
        from .drawings import draw_adjoint, draw_job  # optional (draw=False): load it late

        if drawing is None:
            pictures = {"before": before, "after": after}
            drawn = draw_job(out, pictures, before, after, changes=changes, func=func,
                             full=full_drawing, adjoint=adjoint)
        else:
            drawn = dict(drawing.result())
            if adjoint is not None:
                drawn["adjoint"] = draw_adjoint(out, adjoint, func, full_drawing)
        report.drawings = {name: how for name, how in drawn.items()}
        files += [f"{name}.svg" for name, how in drawn.items() if not how.startswith("not drawn")]
    write_report_html(out, report)  # the drawings inline: after they are drawn
    report.seconds["write"] = round(time.perf_counter() - start, 3)
    report.outputs = files + ["report.md", "report.html", "report.json"]
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2))
    (out / "report.md").write_text(report_markdown(report))
