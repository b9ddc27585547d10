"""Write ``docs/coverage.md``: what the pattern library covers on the model zoo.

For every zoo model (random weights, built offline) the table gives, per rule family:
the instances in the source model (counted from its torch modules, see
:mod:`patternkit.models.families` and, for the families issue 36 added,
:mod:`patternkit.models.long_tail_families`), the instances that are one fused op in Relax
after the library's rewrites (the importer emits some fused already: ``nn.layer_norm``
from torch), or, for the families that have no Relax op (hard-swish, hard-sigmoid,
rotary embeddings, gated MLPs), one of the library's composites once its composite table
is merged into the rewritten module, and how many of those the library itself made; then
the numeric error of the rewritten model against the imported one on the llvm VM
(float32: the goal is max abs <= 1e-4), and the share of op calls that TVM's ``cutlass``
and ``tensorrt`` pattern tables take before and after the rewrites
(:func:`patternkit.coverage`).  Every source instance that is not one fused op afterwards
is listed below the table with the reasons the family's rules gave (their skipped
matches), or "no match" when no rule of the family got as far.

Run: ``python benchmarks/coverage.py [--models gpt2 bert ...] [--out docs/coverage.md]``
(needs the torch and onnx extras; about 10 minutes on the shared 2-core machine: every
model is exported, imported and built twice for llvm).  A model that fails to build or
import gets a row saying so instead of stopping the run.  The file is generated: edit
this script, not the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

import patternkit as pk
from patternkit.byoc import CompositeLog, composite_counts, merge_composite
from patternkit.ir import op_name
from patternkit.ir.compat import to_tensor
from patternkit.models import parse_spec, zoo_model
from patternkit.models.long_tail_families import LONG_TAIL_FAMILIES, count_long_tail_families
from patternkit.models.op_counting import op_counts
from patternkit.models.zoomodel import FAMILIES
from patternkit.patterns import LIBRARY
from patternkit.training.precision import as_float64
from patternkit.verification.numeric import build, flatten

_LOG = logging.getLogger("coverage")

#: The fused Relax ops that stand for one instance of each family.
FUSED_OPS = {"layernorm": ("relax.nn.layer_norm",), "rmsnorm": ("relax.nn.rms_norm",),
             "gelu": ("relax.nn.gelu",), "gelu_tanh": ("relax.nn.gelu_tanh",),
             "silu": ("relax.nn.silu",), "softmax": ("relax.nn.softmax",),
             "attention": ("relax.nn.attention", "relax.nn.attention_bias"),
             "batchnorm": ("relax.nn.batch_norm",), "conv2d": ("relax.nn.conv2d",),
             "groupnorm": ("relax.nn.group_norm",), "instancenorm": ("relax.nn.instance_norm",)}

#: Families with no fused Relax op, only the library's composites: an instance is handled
#: when the library's composite table (``LIBRARY``'s composites, compiler ``byoc``) wraps
#: it, after the rewrites, in one of these composites.
COMPOSITE_FAMILIES = {
    "hardswish": ("byoc.hardswish",), "hardsigmoid": ("byoc.hardsigmoid",),
    "rope": ("byoc.rope", "byoc.rope_interleaved", "byoc.rope_partial",
             "byoc.rope_interleaved_partial"),
    "swiglu": ("byoc.swiglu", "byoc.swiglu_packed"),
    "geglu": ("byoc.geglu", "byoc.geglu_packed", "byoc.geglu_tanh", "byoc.geglu_tanh_packed"),
    "qdq": ("byoc.qdq_conv2d", "byoc.qdq_matmul")}

#: Every column of the table: the zoo's families, then issue 36's (``qdq``: the quantised
#: convs and matmuls of an ONNX QDQ model, counted from its ONNX graph by the zoo entry).
COLUMNS = tuple(FAMILIES) + LONG_TAIL_FAMILIES + ("qdq",)

#: The zoo as the table shows it: small but real configurations (2 layers), eager and
#: SDPA attention, ONNX at the opset that writes LayerNorm out (14) and the one that
#: does not (17), and exported with a dynamic batch and sequence (which TVM 0.27 only
#: imports after patternkit.models.onnx_fixups).
MODELS = ["gpt2", "gpt2?attention=sdpa", "bert", "bert?attention=sdpa", "llama",
          "llama?attention=sdpa", "t5", "t5?attention=sdpa", "falcon", "falcon?attention=sdpa",
          "falcon?alibi=true", "falcon?layout=40b&kv_heads=2",
          "vit", "vit?attention=sdpa",
          "resnet50",
          "mobilenet", "unet_block", "levit", "swinv2", "gptj", "phi", "qwen2",
          "onnx:gpt2?opset=14", "onnx:gpt2?opset=17", "onnx:bert?opset=14", "onnx:bert?opset=17",
          "onnx:t5?opset=14",
          "onnx:gpt2?opset=14&batch=dynamic&seq=dynamic",
          "onnx:bert?opset=14&batch=dynamic&seq=dynamic",
          "onnx:qdq"]

#: TVM's registered pattern tables whose share of op calls the table reports.
TABLES = ("cutlass", "tensorrt")

#: float32 bound on the max abs error of the rewritten model's outputs (issue 11).
FLOAT32_BOUND = 1e-4


def fused_counts(mod: tvm.IRModule) -> dict[str, int]:
    """Fused ops of each family in ``mod``."""
    counts = op_counts(mod)
    return {family: sum(counts[op] for op in ops) for family, ops in FUSED_OPS.items()}


#: Rules that take a family's instance away without leaving its fused op: a batch norm
#: folded into the conv or the matmul before it is gone, not left over (and one folded
#: into a matmul is an instance of ``batchnorm_linear`` too).
REMOVES = {"conv.fold_batchnorm": ("batchnorm",),
           "matmul.fold_batchnorm": ("batchnorm", "batchnorm_linear")}

#: The rule whose skipped matches explain a family's misses, where the family's name is
#: not the rule's prefix.
REASONS_FROM = {"batchnorm_linear": "matmul.fold_batchnorm"}

#: Families whose collapse takes in an instance of another family: an attention
#: collapse reads the ``R.nn.softmax`` between the two matmuls, which becomes part of
#: the one ``R.nn.attention``.
ABSORBS = {"attention": "softmax"}
#: The rules that make that one op (``attention.einsum_matmul`` only rewrites matmuls).
ABSORBING_RULES = frozenset({"attention.collapse", "attention.cosine"})


def family_of_rule(rule_name: str) -> str:
    """``"gelu_tanh.collapse"`` -> ``"gelu_tanh"`` (rule names start with their family)."""
    return REMOVES.get(rule_name, (rule_name.split(".", 1)[0],))[0]


#: Families the library has rewrite rules or composites for.
LIBRARY_FAMILIES = (frozenset(family_of_rule(rule.rule_name) for rule in LIBRARY.rewrite_rules())
                    | frozenset(COMPOSITE_FAMILIES) | frozenset(REASONS_FROM))

#: The library's composites under the placeholder compiler ``byoc``.
_COMPOSITE_TABLE = LIBRARY.for_compiler("byoc")


def _is_relu6_clip(call: relax.Expr, bindings: dict) -> bool:
    """``R.clip(x, 0, 6)`` of anything but ``x + 3`` (the clip inside a hard activation)."""
    if op_name(call) != "relax.clip":
        return False
    bounds = []
    for bound in call.args[1:]:  # IntImm / FloatImm, or a PrimValue holding one
        value = getattr(bound, "value", None)
        value = getattr(value, "value", value)
        if not isinstance(value, (int, float)):
            return False
        bounds.append(float(value))
    if bounds != [0.0, 6.0]:
        return False
    argument = bindings.get(call.args[0])
    if op_name(argument) != "relax.add":
        return True
    return not any(isinstance(a, tvm.ir.GenericConst) and np.all(a.value.numpy() == 3)
                   for a in argument.args)


def relu6_count(mod: tvm.IRModule) -> int:
    """``R.clip(x, 0, 6)`` calls in ``mod`` that are a ReLU6, not part of a hard activation."""
    count = 0
    for _, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        bindings = {}
        calls = []

        def visit(expr, bindings=bindings, calls=calls):
            if isinstance(expr, relax.Call):
                calls.append(expr)

        for block in getattr(func.body, "blocks", ()):
            for binding in block.bindings:
                bindings[binding.var] = binding.value
        relax.analysis.post_order_visit(func.body, visit)
        count += sum(_is_relu6_clip(call, bindings) for call in calls)
    return count


def _spelling(expr: relax.Expr, bindings: dict, depth: int) -> str:
    """``expr`` as its operators ``depth`` producers deep: ``reshape(matmul(...))``."""
    value = bindings.get(expr, expr)
    name = op_name(value)
    if name is None:
        return type(value).__name__
    short = name.removeprefix("relax.")
    if depth == 0:
        return short
    args = ", ".join(_spelling(a, bindings, depth - 1) for a in value.args
                     if isinstance(a, relax.Expr)
                     and not isinstance(a, (tvm.ir.Constant, relax.ShapeExpr)))
    return f"{short}({args})" if args else short


def leftover_spellings(mod: tvm.IRModule, op: str, depth: int = 3) -> Counter:
    """What each call of ``op`` still in ``mod`` reads: why a rule did not take it.

    A rule whose pattern does not match at all logs nothing; the input's spelling shows
    which form it met instead (LeViT's linears written as a batched ``matmul`` of
    ``broadcast_to`` operands, which ``matmul.fold_batchnorm`` does not take).
    """
    found: Counter = Counter()
    for _, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        bindings = {b.var: b.value for block in getattr(func.body, "blocks", ())
                    for b in block.bindings}
        for value in bindings.values():
            if op_name(value) == op:
                found[_spelling(value.args[0], bindings, depth)] += 1
    return found


def long_tail_counts(mod: tvm.IRModule, log: CompositeLog | None = None) -> dict[str, int]:
    """Handled instances of issue 36's families in ``mod``: relu6 clips, composites.

    ``groupnorm`` / ``instancenorm`` are :func:`fused_counts`; ``batchnorm_linear`` is
    counted from the rules that fold it (:data:`REMOVES`).
    """
    merged = composite_counts(merge_composite(mod, _COMPOSITE_TABLE, log=log))
    counts = {family: sum(merged.get(name, 0) for name in names)
              for family, names in COMPOSITE_FAMILIES.items()}
    counts["relu6"] = relu6_count(mod)
    return counts


def max_abs_error(reference: list, outputs: list) -> float:
    """The largest absolute difference over all outputs, computed in float64."""
    return max(float(np.abs(np.asarray(r, np.float64) - np.asarray(o, np.float64)).max())
               for r, o in zip(reference, outputs))


def measure(spec: str, tables: dict[str, Any] | None = None, numeric: bool = True) -> dict:
    """Everything one row of the table needs, for the zoo model ``spec``.

    Returns a dict with the family counts (``families``: in the source model, ``fused``:
    fused ops after the rewrites, ``made``: rewrites per family), ``error`` (max abs on
    the llvm VM, ``None`` without ``numeric``), ``shares`` (table -> (before, after)),
    ``reasons`` (family -> the reasons its rules skipped matches) and ``rewritten`` (the
    module after the rewrites).
    """
    model = zoo_model(spec)
    log = pk.RewriteLog()
    start = time.process_time()
    after = pk.rewrite(LIBRARY.rewrite_rules(), model.mod, log=log)
    seconds = time.process_time() - start
    families = dict(model.families)
    if hasattr(model.source, "modules"):  # a torch module (an ONNX model has no census)
        families.update(count_long_tail_families(model.source))
    made = Counter(family_of_rule(record.rule) for record in log.records)
    reasons: dict[str, Counter] = {}
    for skipped in log.skipped:
        reasons.setdefault(family_of_rule(skipped.rule), Counter())[skipped.reason] += 1
        for family, rule in REASONS_FROM.items():
            if skipped.rule == rule:
                reasons.setdefault(family, Counter())[skipped.reason] += 1
    composite_log = CompositeLog()
    after_tail = long_tail_counts(after, composite_log)
    # what the library made: every composite, and the ReLU6 clips it added
    made.update({family: after_tail[family] for family in COMPOSITE_FAMILIES})
    made["relu6"] = max(0, after_tail["relu6"] - relu6_count(model.mod))
    composite_family = {name: family for family, names in COMPOSITE_FAMILIES.items()
                        for name in names}
    for skipped in composite_log.skipped:
        if skipped.entry in composite_family and skipped.kind == "check":
            reasons.setdefault(composite_family[skipped.entry], Counter())[
                f"{skipped.entry}: {skipped.reason}"] += 1
    if "batchnorm_linear" not in reasons:  # name the form of the batch norms left over
        for spelling, n in leftover_spellings(after, "relax.nn.batch_norm").items():
            reasons.setdefault("batchnorm_linear", Counter())[
                f"left as R.nn.batch_norm of {spelling}, a form matmul.fold_batchnorm does "
                "not take"] = n
    removed: Counter = Counter()
    for record in log.records:
        for family in REMOVES.get(record.rule, ()):
            removed[family] += 1
            if family != family_of_rule(record.rule):
                made[family] += 1
        family = family_of_rule(record.rule)
        if family in ABSORBS and record.rule in ABSORBING_RULES:
            removed[ABSORBS[family]] += 1
    error = scale = source = float64 = None
    if numeric:
        args = [to_tensor(a) for a in model.arguments()]
        ref = flatten(build(model.mod)[model.entry](*args))
        got = flatten(build(after)[model.entry](*args))
        error = max_abs_error(ref, got)
        scale = max(float(np.abs(r).max()) for r in ref)
        source = _source_errors(model, ref, got)
        if error > FLOAT32_BOUND:
            float64 = _float64_errors(model, after, ref, got)
    shares, left = {}, {}
    fused_ops = {op for ops in FUSED_OPS.values() for op in ops}
    for name, table in (tables or {}).items():
        before_report = pk.byoc.coverage(model.mod, table)
        after_report = pk.byoc.coverage(after, table)
        shares[name] = (before_report.share, after_report.share)
        # the fused ops the rewrites made that this table leaves on the host
        left[name] = dict(Counter(r.op for r in after_report.ops
                                  if r.composite is None and r.op in fused_ops)
                          - Counter(r.op for r in before_report.ops
                                    if r.composite is None and r.op in fused_ops))
    return dict(spec=model.name, families=families, fused={**fused_counts(after), **after_tail},
                removed=dict(removed), made=dict(made), error=error, scale=scale,
                source_errors=source, float64_errors=float64,
                shares=shares, left_on_host=left, rewrite_seconds=seconds, rules=log.counts(),
                reasons={f: dict(c) for f, c in reasons.items()}, rewritten=after)


def _source_errors(model, imported: list, rewritten: list) -> tuple[float, float] | None:
    """Max abs error of the imported and of the rewritten model against the source model.

    Tells a rewrite that loses accuracy from one that only rounds differently: the
    rewritten model is then as close to torch / onnx as the imported one.  ``None`` when
    the source's outputs do not line up with the Relax ones.
    """
    try:
        source = model.reference()
    except Exception as err:  # the reference is a cross-check, not the measurement
        _LOG.info("%s: no source reference (%s)", model.name, err)
        return None
    if len(source) != len(imported) or any(np.shape(s) != np.shape(r)
                                            for s, r in zip(source, imported)):
        return None

    return max_abs_error(source, imported), max_abs_error(source, rewritten)


def _float64_errors(model, rewritten: tvm.IRModule, imported: list, got: list):
    """For a model over the bound: is the rewrite wrong, or is the model ill-conditioned?

    Both modules are recomputed in float64 (:func:`patternkit.training.as_float64`) on the
    same inputs.  Returns the max abs error against the imported model in float64 of the
    imported model in float32, of the rewritten one in float32, and of the rewritten one
    in float64 (what is left of the rewrite without float32 arithmetic: the rounding of
    constants it folded), or ``None`` when a module cannot be widened.
    """
    def wide(mod):
        return tvm.IRModule({model.entry: as_float64(mod[model.entry], model.entry)})

    args = [np.asarray(a) for a in model.arguments()]
    args = [to_tensor(a.astype(np.float64) if a.dtype.kind == "f" else a) for a in args]
    try:
        truth = flatten(build(wide(model.mod))[model.entry](*args))
        rewritten64 = flatten(build(wide(rewritten))[model.entry](*args))
    except Exception as err:  # a cross-check, not the measurement
        _LOG.info("%s: no float64 reference (%s)", model.name, err)
        return None

    return (max_abs_error(truth, imported), max_abs_error(truth, got),
            max_abs_error(truth, rewritten64))


def handled(row: dict, family: str) -> int:
    """Instances of ``family`` that are one fused op after the rewrites, or folded or taken in."""
    return row["fused"].get(family, 0) + row["removed"].get(family, 0)


def _cell(row: dict, family: str) -> str:
    present, fused = row["families"].get(family), handled(row, family)
    made = row["made"].get(family, 0)
    if not present and not fused:
        return "-"
    return f"{'?' if present is None else present} / {fused} ({made})"


def render(rows: list[dict], failed: dict[str, str], seconds: float, reused: int = 0) -> str:
    """The markdown of ``docs/coverage.md``; ``reused``: rows measured by an earlier run."""
    earlier = f"; {reused} rows from an earlier run, `--resume`" if reused else ""
    lines = ["# Pattern-library coverage on the model zoo", "",
             f"Generated by `benchmarks/coverage.py` on {datetime.date.today()} "
             f"(tvm {tvm.__version__}, {seconds / 60:.0f} min{earlier}); do not edit by hand.",
             "",
             "Models: `patternkit.models.zoo_model` specs, random weights, 2 layers, hidden 64, "
             "batch 2, sequence 8.  Each family cell: instances in the source model (counted "
             "from its torch modules) / fused ops after the library's rewrites (of which the "
             "library made); a batch norm folded into its conv or matmul (`conv.fold_batchnorm`, "
             "`matmul.fold_batchnorm`) and a softmax taken into an attention collapse count as "
             "collapsed.  Hardswish, hardsigmoid, rope, swiglu, geglu: instances inside the "
             "library's composite of that name after its composite table is merged into the "
             "rewritten module; relu6: `R.clip(x, 0, 6)` calls not part of a hard activation; "
             "batchnorm_linear: the `BatchNorm1d` after a `Linear`, folded by "
             "`matmul.fold_batchnorm`; qdq: the quantised Conv / MatMul nodes of an ONNX QDQ "
             "graph, taken by the `qdq_conv2d` / `qdq_matmul` composites.  `?`: not counted "
             "(the ONNX exports have no torch modules to count issue 36's families in).  `-`: the "
             "family is absent.  Error: max abs difference of "
             "the rewritten model's outputs against the imported model's on the llvm VM "
             f"(float32, bound {FLOAT32_BOUND:g}), and in brackets relative to the largest "
             "output magnitude.  Vs source: max abs error of the imported / the rewritten "
             "model against the torch (or onnx) model itself.  Tables: share of op calls TVM's "
             "pattern table takes, as imported -> after the rewrites.  Rewrite: CPU time of "
             "`pk.rewrite(LIBRARY, mod)`.", ""]
    families = [f for f in COLUMNS if any(r["families"].get(f) or r["fused"].get(f) for r in rows)]
    tables = list(dict.fromkeys(t for r in rows for t in r["shares"]))
    lines.append("| model | " + " | ".join(families) + " | max abs error | vs source | "
                 + " | ".join(tables) + " | rewrite |")
    lines.append("|---|" + "---:|" * (len(families) + 2 + len(tables)) + "---:|")
    for r in rows:
        error = "not run" if r["error"] is None else (
            f"{r['error']:.2g} ({r['error'] / max(r['scale'], 1e-30):.1g})"
            + ("" if r["error"] <= FLOAT32_BOUND else " **over bound**"))
        shares = [f"{before:.0%} -> {after:.0%}" for before, after in r["shares"].values()]
        source = r.get("source_errors")
        vs_source = "-" if source is None else f"{source[0]:.2g} / {source[1]:.2g}"
        lines.append(f"| `{r['spec']}` | " + " | ".join(_cell(r, f) for f in families)
                     + f" | {error} | {vs_source} | " + " | ".join(shares)
                     + f" | {r['rewrite_seconds'] * 1e3:.0f} ms |")
    lines += ["", "## Not collapsed", "",
              "Source instances that are not one fused op after the rewrites, with the "
              "reasons the family's rules gave for the matches they skipped:", ""]
    missing = [(r, f) for r in rows for f in families
               if r["families"].get(f, 0) > handled(r, f)]
    for r, f in missing:
        count = r["families"][f] - handled(r, f)
        why = r["reasons"].get(f)
        if why:
            text = "; ".join(f"{reason} ({n}x)" for reason, n in sorted(why.items()))
        elif f not in LIBRARY_FAMILIES:
            text = f"the library has no {f} rule"
        else:
            text = "no rule of the family matched (nothing skipped)"
        lines.append(f"- `{r['spec']}`: {count} {f} - {text}")
    if not missing:
        lines.append("- none")
    over = [r for r in rows if r["error"] is not None and r["error"] > FLOAT32_BOUND]
    if over:
        lines += ["", "## Over the float32 bound", "",
                  "Rewritten models further than the bound from the imported one, with the "
                  "rules that rewrote them and both models' distance to the source model:", ""]
        for r in over:
            rules = ", ".join(f"`{name}` x{n}" for name, n in sorted(r["rules"].items()))
            source = r.get("source_errors")
            against = "" if source is None else (
                f"; against the source model the imported one is {source[0]:.2g} off, the "
                f"rewritten one {source[1]:.2g}")
            wide = r.get("float64_errors")
            exact = "" if wide is None else (
                f"; against the model recomputed in float64, the imported model in float32 is "
                f"{wide[0]:.2g} off, the rewritten one {wide[1]:.2g}, and the rewritten one "
                f"recomputed in float64 {wide[2]:.2g} (the float32 rounding of the constants "
                f"it folded)")
            lines.append(f"- `{r['spec']}`: {r['error']:.2g} max abs ({rules}){against}{exact}")
    lost = [(r["spec"], table, ops) for r in rows for table, ops in r["left_on_host"].items()
            if ops]
    if lost:
        lines += ["", "## Fused ops a table does not take", "",
                  "Fused ops the rewrites made that the table leaves on the host (it has no "
                  "pattern for them).  Where the table took the written-out elementwise ops "
                  "one by one, its share falls after the rewrites:", ""]
        lines += [f"- `{spec}`, {table}: "
                  + ", ".join(f"`{op}` x{n}" for op, n in sorted(ops.items()))
                  for spec, table, ops in lost]
    if failed:
        lines += ["", "## Models that did not build", ""]
        lines += [f"- `{spec}`: {why}" for spec, why in failed.items()]
    return "\n".join(lines) + "\n"


def load_rows(path: Path | None) -> dict[str, dict]:
    """Rows of an earlier run (``--resume``), by their model's canonical spec."""
    if path is None or not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["spec"]: row for row in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--tables", nargs="*", default=list(TABLES))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1]
                        / "docs" / "coverage.md")
    parser.add_argument("--resume", type=Path, metavar="ROWS.jsonl",
                        help="rows measured so far, one JSON object a line: the models "
                             "found there are not measured again, new rows are appended")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tables = {name: pk.PatternTable.from_tvm(name) for name in args.tables}
    start = time.perf_counter()
    earlier = load_rows(args.resume)
    rows, failed, reused = [], {}, 0
    for spec in args.models:
        canonical = parse_spec(spec).text
        if canonical in earlier:
            rows.append(earlier[canonical])
            reused += 1
            continue
        try:
            row = measure(spec, tables)
        except Exception as err:  # one model's failure is a row of the report, not the end
            _LOG.warning("%s failed: %s: %s", spec, type(err).__name__, err)
            failed[spec] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            continue
        row.pop("rewritten")
        rows.append(row)
        _LOG.info("%s", row)
        if args.resume is not None:
            with args.resume.open("a") as out:
                out.write(json.dumps(row) + "\n")
    args.out.write_text(render(rows, failed, time.perf_counter() - start, reused))
    _LOG.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
