"""The main job as Python calls: load a model, rewrite, partition, verify, report.

``patternkit run`` is a thin shell over :func:`run`; notebooks and scripts call it
directly.  The steps, each timed:

1. **load** the model: a built-in one (default ``resnet18``, see :mod:`patternkit.models`),
   a zoo model (``zoo:gpt2?batch=dynamic``, see :mod:`patternkit.models.zoo`), a Python
   file that defines an ``IRModule``, or an ``.onnx`` file;
2. **rewrite** with the library's rewrite rules (or the ones named with ``patterns=``);
3. **composites**: ``MergeComposite`` with the library's composite entries, renamed for
   ``compiler``, then ``PartitionGraph(compiler)``; or, with ``tables="cutlass"`` (TVM's
   registered tables, :meth:`patternkit.PatternTable.from_tvm`), with those tables and
   TVM's semantics instead; the offload report says which ops went to the compiler and,
   for each op left on the host, why;
4. **numeric check**: ``before`` and ``after`` (external functions inlined back) built
   for ``llvm`` and run on seeded random inputs;
5. **round trips**: ``DefuseOps(FuseOps(x)) == x`` on the model, and
   ``DefuseOps(PartitionGraph(MergeComposite(x))) == x`` on the rewritten model;
6. **write** ``before.py``, ``after.py``, ``before.svg``, ``after.svg``, ``diff.svg``,
   ``report.md`` and ``report.json`` to the output folder.
"""

from __future__ import annotations

import json
import logging
import runpy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import tvm

from ..byoc.external import inline_external, partition_graph
from ..byoc.merge import merge_composite
from ..byoc.offload import offload_report
from ..byoc.table import PatternTable
from ..engine.driver import RewriteLog, rewrite
from ..engine.ruleset import RuleSet
from ..errors import PatternkitError
from ..verification import numeric
from ..verification.roundtrip import check_roundtrip
from ..models import BUILTIN_MODELS, ZooError, zoo_model
from ..models.zoo import PREFIX as ZOO_PREFIX

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "resnet18"
DEFAULT_COMPILER = "ccompiler"


class JobError(PatternkitError):
    """Bad input to the main job: a model that cannot be loaded, an unknown pattern..."""


@dataclass
class JobReport:
    """What :func:`run` did; also written as ``report.json`` and ``report.md``."""

    model: str
    compiler: str
    patterns: list[str] = field(default_factory=list)
    rewrites: dict[str, int] = field(default_factory=dict)
    composites: dict[str, int] = field(default_factory=dict)
    offloaded_ops: int = 0
    host_ops: list[str] = field(default_factory=list)
    numeric: dict[str, Any] = field(default_factory=dict)
    roundtrip: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (bool(self.numeric.get("ok", False))
                and all(r.get("ok", False) for r in self.roundtrip.values()))


# -- loading ---------------------------------------------------------------------------------
def load_model(spec: str | Path | None = None) -> tuple[tvm.IRModule, str]:
    """``(module, description)`` for a built-in name, a zoo spec, a ``.py`` or ``.onnx`` file.

    A zoo spec's description is its canonical text (``zoo:gpt2?batch=dynamic``).
    """
    if spec is None:
        spec = DEFAULT_MODEL
    text = str(spec)
    if text in BUILTIN_MODELS:
        return BUILTIN_MODELS[text](), f"builtin:{text}"
    if text.startswith(ZOO_PREFIX):
        try:
            model = zoo_model(text)
        except ZooError as err:
            raise JobError(str(err)) from err
        return model.mod, model.name
    path = Path(text)
    if path.suffix not in (".py", ".onnx"):
        raise JobError(f"unknown model {text!r}: give a built-in name "
                       f"({', '.join(sorted(BUILTIN_MODELS))}), a zoo:NAME spec "
                       f"(patternkit list --models), a .py file or an .onnx file")
    if not path.is_file():
        raise JobError(f"model file not found: {path}")
    if path.suffix == ".py":
        return _load_python(path), str(path)
    return _load_onnx(path), str(path)


def _load_python(path: Path) -> tvm.IRModule:
    try:
        namespace = runpy.run_path(str(path))
    except Exception as err:
        raise JobError(f"{path}: running the file failed: {type(err).__name__}: {err}") from err
    modules = {k: v for k, v in namespace.items() if isinstance(v, tvm.IRModule)}
    for preferred in ("mod", "Module", "module"):
        if preferred in modules:
            return modules[preferred]
    if len(modules) == 1:
        return next(iter(modules.values()))
    if not modules:
        raise JobError(f"{path} defines no tvm.IRModule (name one `mod`)")
    raise JobError(f"{path} defines several IRModules ({', '.join(sorted(modules))}); "
                   f"name the one to use `mod`")


def _load_onnx(path: Path) -> tvm.IRModule:
    try:
        import onnx
        from tvm.relax.frontend.onnx import from_onnx
    except ImportError as err:
        raise JobError("loading .onnx needs the onnx extra: pip install 'patternkit[onnx]'") from err
    try:
        model = onnx.load(str(path))
        return from_onnx(model)
    except Exception as err:
        raise JobError(f"{path}: not a loadable ONNX model: {type(err).__name__}: {err}") from err


# -- pattern selection -------------------------------------------------------------------------
def select_patterns(names: Sequence[str] | None, compiler: str) -> tuple[RuleSet, RuleSet]:
    """``(rewrite rules, composites named for compiler)`` of the library.

    ``names`` are library rule names (``"batchnorm.collapse"``, ``"byoc.conv2d_add_relu"``),
    applied in the order given; by default the whole :data:`patternkit.patterns.LIBRARY`.
    """
    from patternkit.patterns import LIBRARY

    try:
        chosen = LIBRARY.select(names) if names else LIBRARY
    except KeyError as err:
        raise JobError(err.args[0]) from None
    return chosen.rewrite_rules(), chosen.composites().for_compiler(compiler)


# -- the job ---------------------------------------------------------------------------------
def run(model: str | Path | tvm.IRModule | None = None, *, patterns: Sequence[str] | None = None,
        compiler: str = DEFAULT_COMPILER, out_dir: str | Path | None = "patternkit-out",
        seed: int = 0, draw: bool = True,
        progress: Callable[[str], None] | None = None, tables: str | None = None) -> JobReport:
    """Run the main job; see the module docstring.  ``out_dir=None`` writes nothing.

    ``tables`` (``"cutlass"``, ``"cutlass,tensorrt"``) partitions with TVM's registered
    pattern tables instead of the library's composites (the rewrites still run first).
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
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe = out / ".patternkit-write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as err:
            raise JobError(f"cannot write to the output folder {out}: {err.strerror}") from err

    say("loading the model ...")
    if isinstance(model, tvm.IRModule):
        before, description = model, "IRModule"
    else:
        before, description = step("load", load_model, model)
    rules, composites = select_patterns(patterns, compiler)
    table: Any = composites
    if tables:
        table, compiler = PatternTable.from_tvm(tables), None
    report = JobReport(model=description, compiler=tables or compiler,
                       patterns=[r.rule_name for r in rules] + list(dict.fromkeys(
                           c.name for c in table)))

    rewritten = before
    if rules:
        say(f"rewriting with {', '.join(r.rule_name for r in rules)} ...")
        log = RewriteLog()
        rewritten = step("rewrite", rewrite, rules, before, log=log)
        report.rewrites = log.counts()

    after = rewritten
    if table:
        say(f"forming composites for {tables or compiler} ...")
        offload = step("composites", offload_report, rewritten, table, compiler=compiler)
        report.composites = offload.composites
        report.offloaded_ops = offload.offloaded_ops
        report.host_ops = [str(h) for h in offload.host_ops]
        after = step("partition", partition_graph, offload.module, compiler)

    say("building before and after for llvm and comparing ...")
    comparison = step("numeric_check", numeric.compare, before, inline_external(after),
                      seed=seed, rtol=1e-4, atol=1e-4, positive=("var",))
    report.numeric = {"ok": comparison.ok, "max_abs_error": comparison.max_abs_error,
                      "max_rel_error": comparison.max_rel_error, "rtol": 1e-4, "atol": 1e-4,
                      "seed": seed}

    say("checking the fuse/defuse round trips ...")
    fused = step("roundtrip_fuseops", check_roundtrip, before, raise_on_failure=False)
    report.roundtrip["FuseOps"] = {"ok": fused.ok, "difference": fused.difference}
    if table:
        def byoc(mod):
            return partition_graph(merge_composite(mod, table), compiler)

        partitioned = step("roundtrip_composites", check_roundtrip, rewritten, byoc,
                           raise_on_failure=False)
        report.roundtrip["MergeComposite+PartitionGraph"] = {
            "ok": partitioned.ok, "difference": partitioned.difference}

    report.seconds = seconds
    if out is not None:
        say(f"writing {out}/ ...")
        write_outputs(out, before, after, report, draw=draw, changes=None)
    return report


def write_outputs(out: Path, before: tvm.IRModule, after: tvm.IRModule, report: JobReport,
                  draw: bool = True, changes: Any = None) -> None:
    """TVMScript, drawings and the two reports."""
    from ..viz import viz_diff, viz_expr  # drawing is optional (draw=False): load it late
    from ..viz.display import DotUnavailable

    start = time.perf_counter()
    (out / "before.py").write_text(before.script())
    (out / "after.py").write_text(after.script())
    files = ["before.py", "after.py"]
    if draw:
        drawings = {"before": lambda: viz_expr(before), "after": lambda: viz_expr(after),
                    "diff": lambda: viz_diff(before, after, changes=changes)}
        for name, make in drawings.items():
            try:
                make().render(out / name, format="svg")
                files.append(f"{name}.svg")
            except DotUnavailable as err:
                logger.warning("not drawing %s.svg: %s", name, err)
    report.seconds["write"] = round(time.perf_counter() - start, 3)
    report.outputs = files + ["report.md", "report.json"]
    (out / "report.json").write_text(json.dumps(asdict(report) | {"ok": report.ok}, indent=2))
    (out / "report.md").write_text(report_markdown(report))


def report_markdown(report: JobReport) -> str:
    verdict = "PASS" if report.ok else "FAIL"
    lines = [f"# patternkit run: {verdict}", "",
             f"* model: `{report.model}`", f"* compiler: `{report.compiler}`",
             f"* patterns: {', '.join(f'`{p}`' for p in report.patterns) or 'none'}", "",
             "## Rewrites", ""]
    lines += [f"* `{k}`: {v}" for k, v in report.rewrites.items()] or ["* none"]
    lines += ["", "## Offload", "",
              f"{report.offloaded_ops} op call(s) in {sum(report.composites.values())} "
              f"composite(s); {len(report.host_ops)} left on the host.", ""]
    lines += [f"* `{k}`: {v}" for k, v in sorted(report.composites.items())]
    if report.host_ops:
        lines += ["", "Left on the host, and why:", ""]
        lines += [f"* {h}" for h in report.host_ops]
    n = report.numeric
    lines += ["", "## Numeric check (llvm VM, seeded random inputs)", "",
              f"{'match' if n.get('ok') else 'MISMATCH'}: max abs error "
              f"{n.get('max_abs_error', float('nan')):.3g}, max rel error "
              f"{n.get('max_rel_error', float('nan')):.3g} (rtol {n.get('rtol')}, "
              f"atol {n.get('atol')}, seed {n.get('seed')})", "", "## Round trips", ""]
    for name, r in report.roundtrip.items():
        lines.append(f"* {name}: {'ok' if r['ok'] else 'FAILED: ' + str(r['difference'])}")
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
    from ..testing.fuzz import verify_rules

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

    from ..byoc.table_coverage import coverage

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
                             "host": report.host_reasons(),
                             "report": json.loads(report.to_json())})
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "coverage.json").write_text(json.dumps(rows, indent=1))
        lines = ["# Coverage of TVM's pattern tables", "",
                 "| model | table | stage | op calls | offloaded | regions | largest | "
                 "left on the host |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            host = ", ".join(f"{k} {n}" for k, n in sorted(r["host"].items())) or "none"
            lines.append(f"| {r['model']} | {r['table']} | {r['stage']} | {r['op_calls']} | "
                         f"{r['share']:.0%} | {r['regions']} | {r['largest_region']} | {host} |")
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
