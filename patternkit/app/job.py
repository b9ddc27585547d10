"""The main job as Python calls: load a model, rewrite, partition, verify, report.

``patternkit run`` is a thin shell over :func:`run`; notebooks and scripts call it
directly.  The steps, each timed:

1. **load** the model: a built-in one (default ``resnet18``, see :mod:`patternkit.models`),
   a zoo model (``zoo:gpt2?batch=dynamic``, see :mod:`patternkit.models.zoo`), a Python
   file that defines an ``IRModule``, or an ``.onnx`` file;
2. **rewrite** with the library's rewrite rules (or the ones named with ``patterns=``);
3. **composites**: ``MergeComposite`` with the library's composite entries, renamed for
   ``compiler``, then ``PartitionGraph(compiler)``; the offload report says which ops
   went to the compiler and, for each op left on the host, why;
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
from ..byoc.merge import CompositeLog, merge_composite
from ..byoc.offload import offload_report
from ..engine.driver import RewriteLog, rewrite
from ..engine.rule import CompositeRule
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
        progress: Callable[[str], None] | None = None) -> JobReport:
    """Run the main job; see the module docstring.  ``out_dir=None`` writes nothing."""
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
    report = JobReport(model=description, compiler=compiler,
                       patterns=[r.rule_name for r in rules] + [c.name for c in composites])

    rewritten = before
    if rules:
        say(f"rewriting with {', '.join(r.rule_name for r in rules)} ...")
        log = RewriteLog()
        rewritten = step("rewrite", rewrite, rules, before, log=log)
        report.rewrites = log.counts()

    table = composites
    after = rewritten
    if table:
        say(f"forming composites for {compiler} ...")
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


def verify(progress: Callable[[str], None] | None = None) -> list[tuple[str, bool, str]]:
    """Build every library rule's own example before and after; ``(name, ok, detail)``.

    Rewrites are compared within 1e-4 (they change arithmetic); composites, which only
    wrap bindings in functions, must give bit-identical results.
    """
    from patternkit.patterns import LIBRARY

    say = progress or (lambda message: None)
    results = []
    for rule in LIBRARY:
        before = rule.example()
        if before is None:
            results.append((rule.rule_name, False, "no example() to verify"))
            continue
        say(f"verifying {rule.rule_name} ...")
        if isinstance(rule, CompositeRule):
            log = CompositeLog()
            after = inline_external(partition_graph(
                merge_composite(before, [rule.for_compiler(DEFAULT_COMPILER)], log=log),
                DEFAULT_COMPILER))
            fired, tolerance = bool(log.formed), 0.0
        else:
            rewrite_log = RewriteLog()
            after = rewrite(rule, before, log=rewrite_log)
            fired, tolerance = rewrite_log.count() > 0, 1e-4
        comparison = numeric.compare(before, after, rtol=tolerance, atol=tolerance,
                                     positive=("var",))
        ok = fired and comparison.ok
        detail = str(comparison) if fired else "the rule did not fire on its own example"
        results.append((rule.rule_name, ok, detail))
    return results
