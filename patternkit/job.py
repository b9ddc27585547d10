"""The main job as a Python call: rewrite, partition and verify a model.

Until the full model zoo lands, the built-in model is the seed notes' example: two
chained elementwise batch norms over ``x: (2, 3, 8, 8)``.  The job collapses them with
the pattern library (``batchnorm.collapse``), partitions the original graph with the
same pattern (Relay's ``pattern.partition``), builds all three modules for ``llvm`` and
compares their outputs on seeded random inputs.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tvm
from tvm import relax

from . import numeric
from .exprs import from_expr
from .partition import partition
from .rewrite import RewriteLog, rewrite

logger = logging.getLogger(__name__)


@dataclass
class JobReport:
    """What :func:`run` did; also written as ``report.json``."""

    model: str
    matches: dict[str, int] = field(default_factory=dict)
    partitions: int = 0
    checks: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    ok: bool = True


def builtin_model() -> tvm.IRModule:
    """Two chained elementwise batch norms, as in the seed notes (shape (2, 3, 8, 8))."""
    x = relax.Var("x", relax.TensorType((2, 3, 8, 8), "float32"))
    gamma, beta, mean, var = (relax.Var(n, relax.TensorType((3, 1, 1), "float32"))
                              for n in ("gamma", "beta", "mean", "var"))
    eps = relax.const(1e-5, "float32")

    def bn(inp):
        return gamma * (inp - mean) / relax.op.sqrt(var + eps) + beta

    return from_expr(bn(bn(x)))


def run(out_dir: str | Path = "patternkit-out", seed: int = 0, quiet: bool = False) -> JobReport:
    """Run the main job on the built-in model and write ``out_dir``."""
    from patternkit.patterns import all_rules

    say = (lambda *a: None) if quiet else print
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = JobReport(model="builtin:seed-double-batchnorm")
    timer = time.perf_counter

    start = timer()
    before = builtin_model()
    report.seconds["load"] = timer() - start

    say("rewriting with the pattern library ...")
    start = timer()
    log = RewriteLog()
    rules = [cls() for cls in all_rules()]
    after = rewrite(rules, before, log=log)
    report.matches = log.counts()
    report.seconds["rewrite"] = timer() - start

    start = timer()
    partitioned = partition(rules[0].pattern, before)
    report.partitions = sum(1 for b in partitioned["main"].body.blocks[0].bindings
                            if isinstance(b.value, relax.Function))
    report.seconds["partition"] = timer() - start

    for name, module in (("rewrite", after), ("partition", partitioned)):
        say(f"building and comparing '{name}' on llvm ...")
        start = timer()
        result = numeric.compare(before, module, seed=seed, positive=("var",))
        report.seconds[f"check_{name}"] = timer() - start
        report.checks[name] = str(result)
        report.ok = report.ok and result.ok

    (out / "before.py").write_text(before.script())
    (out / "after.py").write_text(after.script())
    (out / "partitioned.py").write_text(partitioned.script())
    (out / "report.json").write_text(json.dumps(asdict(report), indent=2))
    say(f"matches: {report.matches}; partitions: {report.partitions}")
    for name, text in report.checks.items():
        say(f"numeric check ({name}): {text}")
    say(f"wrote {out}/")
    return report
