"""The main job as Python calls: load a model, rewrite, partition, verify, report.

``patternkit run`` is a thin shell over :func:`run`; notebooks and scripts call it
directly.  The steps, each timed:

1. **load** the model (:mod:`patternkit.app.loading`): a built-in one (default
   ``resnet18``), a zoo model (``zoo:gpt2?batch=dynamic``), a Python file that defines
   an ``IRModule``, an ``.onnx`` file or a ``.pt2`` file (``torch.export.save``); choose its entry function (``func=``: default
   ``main``, else the only public function);
2. **rewrite** with the library's rewrite rules, or the rules ``patterns=`` names:
   library names, rule objects, RuleSets, rule files (:mod:`patternkit.app.rules`);
3. **composites**: ``MergeComposite`` with the composite rules, renamed for
   ``compiler``, then ``PartitionGraph(compiler)``; or, with ``tables="cutlass"`` (TVM's
   registered tables, :meth:`patternkit.PatternTable.from_tvm`), with those tables and
   TVM's semantics instead; the offload report says which ops went to the compiler and,
   for each op left on the host, why;
4. **numeric check** of the entry function: ``before`` and ``after`` (external functions
   inlined back) built for ``llvm`` and run on seeded random inputs, integer inputs drawn
   inside the tables they index (or the user's ``input_ranges``); inputs that would read
   out of bounds fail the check with the reason, never pass.  Symbolic dimensions are
   checked at the example sizes and again at their smallest (not in a float16 model,
   whose one run is the float64 arbitration's).  A float16/bfloat16 model,
   and a float32 one that misses ``rtol = atol = 1e-4``, is judged against the model
   recomputed in float64 (:mod:`patternkit.app.precision`): the rewrite may round
   differently, not worse;
5. **round trips**: ``DefuseOps(FuseOps(x)) == x`` on the model, and
   ``DefuseOps(PartitionGraph(MergeComposite(x))) == x`` on the rewritten model, modulo
   the dead bindings fusion drops (listed in the report);
6. optionally (``train=True``) a **gradient check** (:mod:`patternkit.app.training`);
7. **write** ``before.py`` and ``after.py`` (which load again), ``before.svg``,
   ``after.svg``, ``diff.svg`` (drawn within a layout budget, see
   :mod:`patternkit.app.drawings`), ``report.md`` (a per-op table first) and
   ``report.json`` to the output folder.

The module the job loads and the output of every step are checked for well-formedness
(:func:`patternkit.engine.assert_well_formed`), so a step that emits a broken module is
named where it happened.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import tvm
from tvm import relax

from ..byoc.partition.external import inline_external, partition_graph
from ..byoc.merge import merge_composite
from ..byoc.reports.offload import offload_report
from ..byoc.tables.table import PatternTable
from ..engine.driver import RewriteLog, rewrite
from ..engine.ruleset import RuleSet
from ..engine.wellformed import assert_well_formed
from ..errors import BuildError
from ..verification import numeric
from ..verification.roundtrip import check_roundtrip
from ..verification.sites import SiteReport, validate_sites
from .loading import DEFAULT_MODEL, JobError, LoadedModel, entry_function, load, load_model
from .precision import float64_check, low_precision_dtype
from .rules import resolve_rules
from .summary import OpSummary, markdown_table, op_summary

logger = logging.getLogger(__name__)

DEFAULT_COMPILER = "ccompiler"
#: Tolerances of the job's numeric check: rewrites change the arithmetic (a folded batch
#: norm rounds differently), so not exact; a wrong rewrite is off by far more.
RTOL = ATOL = 1e-4

__all__ = ["DEFAULT_COMPILER", "DEFAULT_MODEL", "JobError", "JobReport", "entry_function",
           "load_model", "run", "select_patterns", "verify", "write_outputs"]


@dataclass
class JobReport:
    """What :func:`run` did; also written as ``report.json`` and ``report.md``."""

    model: str
    compiler: str
    func: str = "main"
    import_fixups: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)
    rewrites: dict[str, int] = field(default_factory=dict)
    composites: dict[str, int] = field(default_factory=dict)
    offloaded_ops: int = 0
    host_ops: list[str] = field(default_factory=list)
    ops: list[dict[str, Any]] = field(default_factory=list)
    numeric: dict[str, Any] = field(default_factory=dict)
    #: Per-site validation (:func:`patternkit.verification.sites.validate_sites`):
    #: ``SiteReport.to_dict()``, or ``{"not_run": reason}``; empty when nothing was rewritten.
    sites: dict[str, Any] = field(default_factory=dict)
    roundtrip: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    drawings: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.numeric_ok and self.sites.get("ok", True)
                and all(r.get("ok", False) for r in self.roundtrip.values())
                and self.training.get("ok", True))

    @property
    def numeric_ok(self) -> bool:
        """The whole-model comparison passed, or it was no evidence (outputs all zero,
        constant or tiny) and every rewrite site was validated instead."""
        if self.numeric.get("ok", False):
            return True
        if self.numeric.get("status") != numeric.INCONCLUSIVE:
            return False
        rows = self.sites.get("by_rule", {}).values()
        return bool(rows) and all(r["not_run"] == 0 and r["failed"] == 0 for r in rows)

    @property
    def evidence(self) -> str:
        """What the verdict rests on, in one line."""
        rows = list(self.sites.get("by_rule", {}).values())
        total = sum(r["sites"] for r in rows)
        validated = sum(r["validated"] for r in rows)
        failed = sum(r["failed"] for r in rows)
        sites = (f"{validated} of {total} rewrite site(s) validated"
                 + (f", {failed} FAILED" if failed else "") if total else
                 "no rewrite site to validate")
        if self.sites.get("not_run"):
            sites = f"rewrite sites NOT RUN ({self.sites['not_run']})"
        status = self.numeric.get("status", "pass" if self.numeric.get("ok") else "fail")
        if self.numeric.get("not_built") == "before":
            whole = "whole-model comparison NOT RUN (the imported model does not build)"
        elif status == numeric.INCONCLUSIVE:
            whole = ("whole-model comparison INCONCLUSIVE (no evidence: the verdict rests on "
                     "the sites)")
        elif self.numeric.get("float64"):
            whole = f"whole-model comparison against float64 ({status})"
        else:
            whole = f"whole-model comparison ({status})"
        return f"{whole}; {sites}"


# -- pattern selection -------------------------------------------------------------------------
def select_patterns(names: Any, compiler: str) -> tuple[RuleSet, RuleSet]:
    """``(rewrite rules, composites named for compiler)`` of what ``names`` selects.

    ``names``: library names, rules, RuleSets, ``file.py[:NAME]`` (see
    :mod:`patternkit.app.rules`), applied in the order given; default the whole library.
    """
    chosen = resolve_rules(names)
    return chosen.rewrite_rules(), chosen.composites().for_compiler(compiler)


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

    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        _require_writable(out)

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
    if tables:
        table, compiler = PatternTable.from_tvm(tables), None
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

    after = rewritten
    merged = None
    host_ops: list = []
    if table:
        say(f"forming composites for {target} ...")
        offload = step("composites", offload_report, rewritten, table, compiler=compiler)
        merged = _well_formed(offload.module, "MergeComposite")
        report.composites = offload.composites
        report.offloaded_ops = offload.offloaded_ops
        host_ops = offload.host_ops
        report.host_ops = [str(h) for h in host_ops]
        after = _well_formed(step("partition", partition_graph, merged, compiler),
                             "PartitionGraph")
    report.ops = [asdict(row) for row in op_summary(before[entry], log.records, merged,
                                                    host_ops, target)]

    say("building before and after for llvm and comparing ...")
    options = _numeric_options(loaded, entry, seed, numeric_options, input_ranges)
    restored = _well_formed(inline_external(after), "inlining the external functions")
    first_sizes = _sizes_of(before[entry], options)
    inputs = None
    try:
        report.numeric, inputs = _numeric_check(before, restored, loaded, entry, options,
                                                first_sizes, step, say)
    except BuildError as err:
        # nothing to compare: a model TVM imported unbuildable, or a pass that broke it
        report.numeric = {"ok": False, "not_built": err.side, "build_error": str(err),
                          "seed": options["seed"]}
    if log.records:
        say(f"validating {log.count()} rewrite site(s) on the model's own values and "
            f"adversarial draws ...")
        report.sites = step("sites", _validate_sites, before, rewritten, log, rules, entry,
                            inputs, seed)

    say("checking the fuse/defuse round trips ...")
    fused = step("roundtrip_fuseops", check_roundtrip, before, func_name=entry,
                 raise_on_failure=False)
    report.roundtrip["FuseOps"] = _roundtrip_entry(fused)
    if table:
        def byoc(mod):
            return partition_graph(merge_composite(mod, table), compiler)

        partitioned = step("roundtrip_composites", check_roundtrip, rewritten, byoc,
                           func_name=entry, raise_on_failure=False)
        report.roundtrip["MergeComposite+PartitionGraph"] = _roundtrip_entry(partitioned)

    adjoint = None
    if train and report.numeric.get("not_built") == "before":
        report.training = {"status": "not_run", "reason": "the model as imported does not "
                                                          "build for llvm (see the numeric check)"}
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
    if out is not None:
        say(f"writing {out}/ ...")
        write_outputs(out, before, after, report, draw=draw, changes=log, func=entry,
                      full_drawing=full_drawing, adjoint=adjoint)
    return report


def _validate_sites(before: tvm.IRModule, rewritten: tvm.IRModule, log: RewriteLog,
                    rules: RuleSet, entry: str, inputs: list | None, seed: int
                    ) -> dict[str, Any]:
    """The report's ``sites`` section: every rewrite validated on its own
    (:func:`~patternkit.verification.sites.validate_sites`), each held to its rule's
    tolerance, a miss arbitrated against the site in float64.  Never raises: a
    validation that cannot run is NOT RUN with the reason."""
    from ..training.precision import as_float64  # loads only when a site needs it

    try:
        report: SiteReport = validate_sites(before, rewritten, log, inputs=inputs, seed=seed,
                                            func_name=entry, rules=rules,
                                            widen=lambda func: as_float64(func, "site"))
    except Exception as err:  # noqa: BLE001 - a check that cannot run says so
        return {"ok": True, "not_run": f"{type(err).__name__}: {numeric._first_line(err)}"}
    return report.to_dict()


def _numeric_check(before: tvm.IRModule, restored: tvm.IRModule, loaded: LoadedModel,
                   entry: str, options: Mapping[str, Any], first_sizes: Mapping[str, int],
                   step: Callable, say: Callable[[str], None]
                   ) -> tuple[dict[str, Any], list | None]:
    """``(the report's numeric section, the inputs of the first comparison)``: before
    against the rewritten and partitioned module (its external functions inlined), at the
    first sizes and again at the smallest the model declares, and against float64 where
    float rounding can explain a difference.  ``status`` is the comparisons' verdict
    (``"pass"``, ``"fail"``, ``"inconclusive"``: outputs that are no evidence, or
    ``"refused"``), then the float64 arbitration's where it ran.

    Raises :class:`BuildError` when either module does not build for llvm.
    """
    low_precision = low_precision_dtype(before[entry])
    comparison = step("numeric_check", numeric.compare, before, restored, keep_runs=True,
                      **options)
    result = {"ok": comparison.ok, "max_abs_error": comparison.max_abs_error,
              "max_rel_error": comparison.max_rel_error, "rtol": options["rtol"],
              "atol": options["atol"], "seed": options["seed"],
              "int_ranges": {k: list(v) for k, v in options["int_ranges"].items()},
              "refused": list(comparison.refused), "identical": comparison.identical,
              "status": comparison.status, "reason": comparison.reason,
              "magnitude": comparison.magnitude, "norm_error": comparison.norm_error,
              "norm_bound": comparison.norm_bound}
    comparisons = [comparison]
    roles = ({var: role for role, var in loaded.zoo.symbolic_dims.items()}
             if loaded.zoo is not None else {})
    smallest = _smallest_sizes(loaded, first_sizes, roles)
    if smallest and not low_precision and not comparison.refused and not comparison.identical:
        say(f"comparing again at {', '.join(f'{k}={v}' for k, v in smallest.items())} ...")
        again = step("numeric_check_smallest", numeric.compare, before, restored,
                     keep_runs=True,
                     **{**options, "shape_vars": {**options.get("shape_vars", {}), **smallest}})
        comparisons.append(again)
        result.update(
            ok=comparison.ok and again.ok,
            max_abs_error=max(comparison.max_abs_error, again.max_abs_error),
            max_rel_error=max(comparison.max_rel_error, again.max_rel_error),
            sizes=[first_sizes, {**first_sizes, **smallest}], roles=roles,
            refused=list(again.refused), **_combined_status(comparisons))
    if low_precision and not comparison.refused and not comparison.identical:
        say(f"{low_precision} model: measuring both against it recomputed in float64 ...")
        check = step("numeric_float64", float64_check, before, entry, *comparison.runs,
                     options["atol"], rtol=options["rtol"])
        result.update(ok=check["ok"], dtype=low_precision, float64=check)
        if check.get("status") != "not_run":
            result.update(status=check["status"], reason=check.get("reason", ""))
    elif (missed := [c for c in comparisons if c.status == numeric.FAIL
                     and math.isfinite(c.max_abs_error)]):
        say("the comparison missed its tolerance: measuring both against the model "
            "recomputed in float64 ...")
        checks = [step("numeric_float64", float64_check, before, entry, *c.runs,
                       options["atol"], rtol=options["rtol"]) for c in missed]
        worst = min(checks, key=lambda c: _STATUS_RANK.get(c.get("status"), 0))
        dtype = next((str(o.dtype) for o in comparison.runs[1] if o.dtype.kind == "f"),
                     "float32")
        result.update(ok=all(c["ok"] for c in checks), dtype=dtype, float64=worst,
                      float64_after_miss=True)
        if all(c.get("status") != "not_run" for c in checks):
            result.update(status=numeric.PASS if result["ok"] else worst["status"],
                          reason="" if result["ok"] else worst.get("reason", ""))
    inputs = comparison.runs[0] if comparison.runs is not None else None
    return result, inputs


#: Float64 checks from worst to best: the report shows the worst.
_STATUS_RANK = {numeric.FAIL: 0, numeric.INCONCLUSIVE: 1, "not_run": 2, numeric.PASS: 3}


def _combined_status(comparisons: Sequence[numeric.Comparison]) -> dict[str, Any]:
    """The verdict of comparisons made at several sizes: a failure anywhere fails, weak
    evidence anywhere cannot pass."""
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


def _roundtrip_entry(result) -> dict[str, Any]:
    """A round trip for the report: the verdict, the difference, and the dead bindings the
    fusion dropped (not compared: nothing reads them), so that nothing is hidden."""
    return {"ok": result.ok, "difference": result.difference,
            "fusion_ill_formed": result.fusion_ill_formed,
            "dropped_dead": [str(d) for d in result.dropped_dead]}


def _require_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".patternkit-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise JobError(f"cannot write to the output folder {out}: {err.strerror}") from err


def _smallest_sizes(loaded: LoadedModel, first: Mapping[str, int],
                    roles: Mapping[str, str]) -> dict[str, int]:
    """The entry's symbolic dimensions at their smallest sizes (a zoo model's lower bound,
    else 1), where that differs from the first check's: a rewrite that is only right
    when a dimension is not 1 (a broadcast it took for an identity) shows there."""
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
                  full_drawing: bool = False, adjoint: tvm.IRModule | None = None) -> None:
    """TVMScript, drawings and the two reports."""
    from .scripts import write_script

    start = time.perf_counter()
    files = [write_script(out / "before.py", before), write_script(out / "after.py", after)]
    if draw:
        from .drawings import draw_job  # drawing is optional (draw=False): load it late

        pictures = {"before": before, "after": after}
        drawn = draw_job(out, pictures, before, after, changes=changes, func=func,
                         full=full_drawing, adjoint=adjoint)
        report.drawings = {name: how for name, how in drawn.items()}
        files += [f"{name}.svg" for name, how in drawn.items() if not how.startswith("not drawn")]
    report.seconds["write"] = round(time.perf_counter() - start, 3)
    report.outputs = files + ["report.md", "report.json"]
    (out / "report.json").write_text(json.dumps(asdict(report) | {"ok": report.ok}, indent=2))
    (out / "report.md").write_text(report_markdown(report))


def _dimension_label(var: str, roles: Mapping[str, str]) -> str:
    """``batch``, or ``batch (`s43`)`` where torch named the variable for it."""
    role = roles.get(var)
    return f"`{var}`" if role in (None, var) else f"{role} (`{var}`)"


#: Sites listed one by one in report.md beyond the failures (report.json has them all).
_LISTED_SITES = 12


def _sites_markdown(sites: Mapping[str, Any]) -> list[str]:
    """The report's per-site section: a line per rule, then every failure (rule,
    function, binding, error) and the sites that could not run, with the reason."""
    if not sites:
        return []
    lines = ["", "## Rewrite sites (each rewrite run on its own: the model's values and "
                 "adversarial draws)", ""]
    if sites.get("not_run"):
        return lines + [f"NOT RUN: {sites['not_run']}"]
    for rule, row in sites.get("by_rule", {}).items():
        lines.append(f"* `{rule}`: {row['sites']} site(s), {row['validated']} validated, "
                     f"{row['failed']} failed"
                     + (f", {row['not_run']} not run" if row["not_run"] else ""))
    failed = [s for s in sites.get("sites", []) if s["status"] == "fail"]
    if failed:
        lines += ["", "Failed:", ""]
        lines += [f"* FAIL `{s['rule']}` in `{s['function']}` at `{s['binding']}`: "
                  f"{s['reason']} (tolerance {s['tolerance']})" for s in failed]
    skipped = [s for s in sites.get("sites", []) if s["status"] == "not_run"]
    if skipped:
        lines += ["", "Not run:", ""]
        lines += [f"* `{s['rule']}` in `{s['function']}` at `{s['binding']}`: {s['reason']}"
                  for s in skipped[:_LISTED_SITES]]
        if len(skipped) > _LISTED_SITES:
            lines.append(f"* ... and {len(skipped) - _LISTED_SITES} more (report.json)")
    lines += ["", f"({sites.get('builds', 0)} build(s); identical sites are validated "
                  f"once, on every duplicate's values)"]
    return lines


def report_markdown(report: JobReport) -> str:
    verdict = "PASS" if report.ok else "FAIL"
    lines = [f"# patternkit run: {verdict}", "",
             f"* evidence: {report.evidence}",
             f"* model: `{report.model}` (entry function `{report.func}`)",
             *([f"* rewritten before TVM imported it (TVM importer bugs, docs/tvm-bugs.md): "
                f"{'; '.join(report.import_fixups)}"] if report.import_fixups else []),
             f"* compiler: `{report.compiler}`",
             f"* patterns: {', '.join(f'`{p}`' for p in report.patterns) or 'none'}", "",
             "## Ops", ""]
    lines += markdown_table([OpSummary(**row) for row in report.ops])
    lines += ["", "## Rewrites", ""]
    lines += [f"* `{k}`: {v}" for k, v in report.rewrites.items()] or ["* none"]
    lines += ["", "## Offload", "",
              f"{report.offloaded_ops} op call(s) in {sum(report.composites.values())} "
              f"composite(s); {len(report.host_ops)} left on the host.", ""]
    lines += [f"* `{k}`: {v}" for k, v in sorted(report.composites.items())]
    if report.host_ops:
        lines += ["", "Left on the host, and why:", ""]
        lines += [f"* {h}" for h in report.host_ops]
    n = report.numeric
    lines += ["", "## Numeric check (llvm VM, seeded random inputs)", ""]
    if n.get("not_built") == "before":
        lines += ["NOT RUN: the model as imported does not build for llvm, so nothing could "
                  "be compared (no rewrite is involved; docs/tvm-bugs.md lists importer bugs "
                  "that do this):", "", f"* {n['build_error']}"]
    elif n.get("not_built"):
        lines += ["FAILED TO BUILD: the imported model builds, the rewritten one does not "
                  "(a bug in a rewrite or in a TVM pass; `patternkit bisect` finds the "
                  "rewrite):", "", f"* {n['build_error']}"]
    elif n.get("refused"):
        lines += ["REFUSED: the inputs would read outside a table, so nothing was compared:", ""]
        lines += [f"* {reason}" for reason in n["refused"]]
    elif n.get("status") == numeric.INCONCLUSIVE:
        lines += [f"INCONCLUSIVE: {n.get('reason', '')}: the outputs cannot tell a right "
                  f"rewrite from a wrong one, so the verdict rests on the rewrite sites "
                  f"(below) (max abs error {n.get('max_abs_error', float('nan')):.3g}, rtol "
                  f"{n.get('rtol')}, atol {n.get('atol')}, seed {n.get('seed')})"]
    else:
        lines.append(f"{'match' if n.get('ok') else 'MISMATCH'}: max abs error "
                     f"{n.get('max_abs_error', float('nan')):.3g}, max rel error "
                     f"{n.get('max_rel_error', float('nan')):.3g}, relative error as a whole "
                     f"{n.get('norm_error', float('nan')):.3g} (bound "
                     f"{n.get('norm_bound', float('nan')):.3g}; rtol {n.get('rtol')}, "
                     f"atol {n.get('atol')}, seed {n.get('seed')})"
                     + (f": {n['reason']}" if n.get("reason") and not n.get("ok") else ""))
        if n.get("sizes"):
            roles = n.get("roles", {})
            lines += ["", "Symbolic dimensions checked at " + " and at ".join(
                ", ".join(f"{_dimension_label(k, roles)} = {v}" for k, v in sizes.items())
                for sizes in n["sizes"])
                + " (the errors above are the larger of the two)."]
        if n.get("float64", {}).get("status") == "not_run":
            lines += ["", f"Float64 arbitration NOT RUN: {n['float64'].get('reason', '')} "
                          f"(the verdict is the {n.get('dtype', 'float32')} comparison's)."]
        elif n.get("float64"):
            wide = n["float64"]
            why = (f"The {n['dtype']} comparison missed its tolerance, which rounding at other "
                   f"points can do on a deep model (a batch norm folded into a conv), so the "
                   f"verdict compares both"
                   if n.get("float64_after_miss") else
                   f"A {n['dtype']} model rounds differently after any rewrite, so the "
                   f"verdict compares both")
            lines += ["", f"{why} with the imported model recomputed in "
                          f"float64: the imported model is {wide['imported']:.3g} from it "
                          f"({wide.get('imported_rel', float('nan')):.3g} as a whole), the "
                          f"rewritten one {wide['rewritten']:.3g} "
                          f"({wide.get('rewritten_rel', float('nan')):.3g}): "
                          f"{str(wide.get('status', 'pass')).upper()}"
                          + (f" ({wide['reason']})" if wide.get("reason") else
                             f" (within {wide['slack']:g}x + atol)") + "."]
    if n.get("identical"):
        lines += ["", "(after is structurally identical to before: built and run once)"]
    if n.get("int_ranges"):
        lines += ["", "Integer inputs drawn in: " + ", ".join(
            f"`{k}` [{lo}, {hi})" for k, (lo, hi) in sorted(n["int_ranges"].items()))]
    lines += _sites_markdown(report.sites)
    lines += ["", "## Round trips", ""]
    for name, r in report.roundtrip.items():
        lines.append(f"* {name}: {'ok' if r['ok'] else 'FAILED: ' + str(r['difference'])}")
        if r.get("dropped_dead"):
            lines.append(f"  (not compared: {len(r['dropped_dead'])} dead binding(s) the "
                         f"fusion dropped: {', '.join(r['dropped_dead'][:5])}"
                         f"{', ...' if len(r['dropped_dead']) > 5 else ''})")
    if report.training:
        from .training import training_markdown

        lines += [""] + training_markdown(report.training)
    if report.drawings:
        lines += ["", "## Drawings", ""]
        lines += [f"* `{name}.svg`: {how}" for name, how in report.drawings.items()]
    lines += ["", "## Time per step (s)", ""]
    lines += [f"* {k}: {v:.2f}" for k, v in report.seconds.items()]
    return "\n".join(lines) + "\n"


def verify(rules: Any = None, *, budget: int | None = None, seed: int = 0, jobs: int = 1,
           shard: tuple[int, int] | None = None, progress: Callable[[str], None] | None = None,
           **options: Any) -> Any:
    """Fuzz the guard of every library rule (or of ``rules``); a ``CampaignReport``.

    Each rule is checked on its own example and on instances drawn from its
    ``example_space()``: see :func:`patternkit.testing.fuzz.verify_rules` for the
    parameters.
    Rewrites are held to ``rule.tolerance(dtype)``; composites, which only wrap bindings
    in functions, must give bit-identical results.
    """
    from functools import partial

    from ..testing.fuzz import verify_rules
    from ..training.precision import as_float64

    # a float16 site that misses is measured against itself in float64 (picklable: jobs)
    options.setdefault("widen", partial(as_float64, name="site"))
    return verify_rules(rules, budget=budget, seed=seed, jobs=jobs, shard=shard,
                       progress=progress, **options)


def table_coverage(models: Sequence[str], tables: Sequence[str],
                   out_dir: str | Path | None = None,
                   progress: Callable[[str], None] | None = None) -> list[dict]:
    """How much of each model each of TVM's tables offloads, before and after the rewrites.

    For every model (as :func:`load_model` takes it) and table prefix
    (:meth:`patternkit.PatternTable.from_tvm`), :func:`patternkit.coverage` on the model
    as loaded and after the library's rewrite rules (which collapse decomposed ops into
    the fused ops the tables expect).  Writes ``coverage.json`` (every op record) and
    ``coverage.md`` (one row per model and table) and one bar chart per model
    (``coverage_<i>.svg``: a pair of bars per table, as loaded and after the rewrites) to
    ``out_dir`` when given.
    """
    from patternkit.patterns import LIBRARY

    from ..byoc.reports.table_coverage import coverage

    say = progress or (lambda message: None)
    tables_ = {prefix: PatternTable.from_tvm(prefix) for prefix in tables}
    rules = LIBRARY.rewrite_rules()
    rows: list[dict] = []
    for spec in models:
        mod, description = load_model(spec)
        rewritten = rewrite(rules, mod)
        for prefix, table in tables_.items():
            say(f"{description}: {prefix} ...")
            for stage, module in (("as loaded", mod), ("after rewrites", rewritten)):
                report = coverage(module, table)
                rows.append({"model": description, "table": prefix, "stage": stage,
                             "share": report.share, "op_calls": len(report.ops),
                             "regions": report.regions, "largest_region": report.largest_region,
                             "host": report.host_reasons(), "split": report.split,
                             "report": json.loads(report.to_json())})
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "coverage.json").write_text(json.dumps(rows, indent=1))
        lines = ["# Coverage of TVM's pattern tables", "",
                 "| model | table | stage | op calls | offloaded | regions | largest | "
                 "left on the host | split off to avoid a cycle |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            host = ", ".join(f"{k} {n}" for k, n in sorted(r["host"].items())) or "none"
            lines.append(f"| {r['model']} | {r['table']} | {r['stage']} | {r['op_calls']} | "
                         f"{r['share']:.0%} | {r['regions']} | {r['largest_region']} | {host} | "
                         f"{r['split']} |")
        models_seen = list(dict.fromkeys(r["model"] for r in rows))
        lines.append("")
        for i, model in enumerate(models_seen):
            (out / f"coverage_{i}.svg").write_text(
                _coverage_chart(model, [r for r in rows if r["model"] == model]))
            lines.append(f"![{model}](coverage_{i}.svg)")
        (out / "coverage.md").write_text("\n".join(lines) + "\n")
    return rows


def _coverage_chart(model: str, rows: list[dict]) -> str:
    """A horizontal bar per (table, stage): the share of op calls offloaded."""
    from html import escape

    bar, label, width = 18, 190, 300
    height = 40 + bar * len(rows) + 6 * len(rows)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label + width + 60}" '
             f'height="{height}" font-family="sans-serif" font-size="12">',
             f'<text x="4" y="18" font-weight="bold">{escape(model)}: share of op calls '
             f'offloaded</text>']
    for k, r in enumerate(rows):
        y = 32 + k * (bar + 6)
        colour = "#4e79a7" if r["stage"] == "as loaded" else "#f28e2b"
        parts.append(f'<text x="4" y="{y + 13}">{escape(r["table"])} ({escape(r["stage"])})'
                     f'</text>')
        parts.append(f'<rect x="{label}" y="{y}" width="{width * r["share"]:.1f}" '
                     f'height="{bar}" fill="{colour}"/>')
        parts.append(f'<text x="{label + width * r["share"] + 4:.1f}" y="{y + 13}">'
                     f'{r["share"]:.0%}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
