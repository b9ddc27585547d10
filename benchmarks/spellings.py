"""Write ``docs/spellings.md``: which spellings of each family the library collapses.

Rows are the spellings of :mod:`patternkit.models.spelling_sources` (one torch block per
family and spelling: ``nn.LayerNorm`` and a layer norm written out, hard-swish as a
module, a function and by hand, attention eager / SDPA / einsum / ``baddbmm``...), each
model :data:`~patternkit.models.spelling_sources.COPIES` blocks long.  Columns are the
front doors users import through (``torch.export`` + ``from_exported_program``; the
TorchScript ONNX exporter at opsets 14 and 17 and the dynamo ONNX exporter at its
default opset, each + ``from_onnx``), times the dtype (float32, float16, bfloat16) and
the shape (static, or a symbolic batch and sequence).

A cell is ``collapsed / instances`` (instances counted from the torch modules), with the
reason the family's rules gave for the rest (from the rewrite log's and the composite
log's skipped matches, and, where no rule matched and so none refused, from the family's
near-miss detector: the rule that came closest to the skeleton left in the rewritten
module and where its pattern failed), or the front door's error (one line).  A float32 static cell's
rewritten module is built for llvm and checked against the imported one on the same
inputs (not the other cells: two builds a cell would double the run; the library's rules
are checked in every dtype by their own tests).

Run: ``python benchmarks/spellings.py [--rows 'layernorm/*'] [--columns '*/float32/static']
[--jobs 2] [--out docs/spellings.md] [--json cells.json]``; ``--from-json a.json b.json``
renders the cells of earlier runs (the grid measured in parts) without measuring, a later
file's cell replacing an earlier one's; ``--from-table docs/spellings.md`` starts from the
cells of a committed table (read back by :func:`read_table`), so a generation that
re-measures only some rows keeps the others, and the header says which came from where.  The
rows of a column go through the front door as one model, each row's graph cut out of
the import afterwards (:class:`SideBySide`): exporting and importing cost mostly a fixed
time per model.  Imported modules (and front-door errors) are cached under the text of
the sources and of the import code and torch's and TVM's versions (``--cache``, default
``~/.cache/patternkit/spellings``; ``--cache ''`` for none).  The file is
generated: edit this script, not the table.

The matrix is also a recorded campaign (:mod:`patternkit.testing.campaign`), a unit per
column (seed 0): ``--out DIR`` records each column's cells as one JSON line as it ends
(and writes ``DIR/spellings.md``), ``--resume DIR`` skips the columns recorded there,
``--shard K/N`` measures the columns the campaign's stable hash gives shard K, and
``--from-records DIR...`` renders shards' folders into the table an unsharded run
writes (``--table`` names where a table goes; ``--out X.md`` is still the table).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import functools
import hashlib
import inspect
import json
import logging
import os
import re
import time
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import tvm
from tvm import relax

import patternkit as pk
from patternkit.byoc.merge.composites import CompositeLog, merge_composite
from patternkit.engine import NearMissDetector
from patternkit.errors import first_line
from patternkit.ir.compat import to_tensor
from patternkit.models import spelling_sources
from patternkit.models.op_counting import op_counts
from patternkit.models.spelling_sources import SPELLINGS, Spelling, count_instances, spelling_model
from patternkit.models.zoomodel import ZooImportError
from patternkit.patterns import LIBRARY
from patternkit.patterns.near_misses import NEAR_MISSES
from patternkit.testing.campaign import CampaignMismatch
from patternkit.verification.numeric import build, flatten

_LOG = logging.getLogger("spellings")

#: Front doors: how a torch model becomes Relax.
FRONT_DOORS = ("torch.export", "onnx14", "onnx17", "onnx-dynamo")
DTYPES = ("float32", "float16", "bfloat16")
SHAPES = ("static", "dynamic")
#: Example sizes of the symbolic roles (>= 2: torch.export specialises 0 and 1).
SIZES = {"batch": 2, "seq": 8}
#: Bound on the rewritten module's distance to the imported one (float32 cells).
FLOAT32_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
#: Front door -> what it is, for the document.
DOOR_TEXT = {"torch.export": "`torch.export.export` + `from_exported_program`",
             "onnx14": "`torch.onnx.export(dynamo=False, opset_version=14)` + `from_onnx`",
             "onnx17": "`torch.onnx.export(dynamo=False, opset_version=17)` + `from_onnx`",
             "onnx-dynamo": "`torch.onnx.export(dynamo=True)` (opset 18, its default) + "
                            "`from_onnx`"}


@dataclass(frozen=True)
class Column:
    """One front door, dtype and shape; ``str`` is its filter name."""

    door: str
    dtype: str
    shape: str

    def __str__(self) -> str:
        return f"{self.door}/{self.dtype}/{self.shape}"


COLUMNS = tuple(Column(d, t, s) for t in DTYPES for s in SHAPES for d in FRONT_DOORS)


#: A silent cell's note: not collapsed, and neither a rule, a near-miss detector nor the
#: front door said why.
SILENT = "SILENT: no rule of the family matched and none gave a reason"


@dataclass
class Cell:
    """What one spelling became through one column.

    ``collapsed`` of ``instances``; ``by_import``: the import already had them fused (or
    the batch norms gone) before any rule ran; ``reasons``: rule -> skip reasons of the
    family's rules (rule ``""``: a reason read back from a table, already joined);
    ``error``: the front door's one-line error (``collapsed`` is then ``None``);
    ``numeric``: ``"ok"``, ``"NOT RUN"`` or the mismatch; ``source``: when and where the
    cell was measured (``""``: by this run).
    """

    row: str
    column: str
    instances: int
    collapsed: int | None = None
    by_import: bool = False
    reasons: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None
    numeric: str = "NOT RUN"
    seconds: float = 0.0
    source: str = ""

    @property
    def complete(self) -> bool:
        """Every instance collapsed."""
        return self.collapsed is not None and self.collapsed >= self.instances

    @property
    def silent(self) -> bool:
        """Not complete, and neither a rule nor the front door said why."""
        return self.error is None and not self.complete and not self.reasons

    def why(self) -> str:
        """Why a cell is not complete ("" when it is): the error, the rules' reasons, or
        that no rule of the family matched (a silent miss, the issue's goal to remove).
        """
        if self.error is not None:
            return self.error
        if self.complete:
            return ""
        if self.silent:
            return SILENT
        return "; ".join(f"{rule}: {reason}" if rule else reason
                         for rule, reasons in self.reasons.items()
                         for reason in dict.fromkeys(reasons))


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {first_line(err, 240) if str(err).strip() else ''}"


# -- importing ---------------------------------------------------------------------------------
def _example(spelling: Spelling, dtype):
    import torch

    generator = torch.Generator().manual_seed(1)
    shape = [SIZES[d] if isinstance(d, str) else d for d in spelling.shape]
    return torch.randn(shape, generator=generator).to(dtype)


def _dynamic_axes(spelling: Spelling, column: Column) -> dict[int, str]:
    if column.shape == "static":
        return {}
    return {axis: d for axis, d in enumerate(spelling.shape) if isinstance(d, str)}


#: The code an import depends on besides the sources: a change to any of them (or to
#: torch's or TVM's version) is a new cache key.
_IMPORT_CODE = ("importing", "torch_fixups", "low_precision", "torch_converters",
                "fallback_converters", "onnx_fixups", "onnx_models")


#: Bumped when what the cache holds changes.
_CACHE_FORMAT = "4"


@functools.lru_cache(maxsize=1)
def _code_text() -> str:
    import importlib

    import torch

    texts = [_CACHE_FORMAT, inspect.getsource(spelling_sources), torch.__version__,
             tvm.__version__]
    texts += [inspect.getsource(importlib.import_module(f"patternkit.models.{name}"))
              for name in _IMPORT_CODE]
    return "\0".join(texts)


def _cache_key(spelling: Spelling, column: Column) -> str:
    text = "\0".join((_code_text(), str(column), spelling.key))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached_imports(spellings: list[Spelling], column: Column, models: list, examples: list,
                   cache: Path | None = None) -> dict[str, tvm.IRModule | ZooImportError]:
    """Each spelling's module (weights bound, as a plain import has them) or its error.

    The spellings not in ``cache`` are imported together (:func:`import_side_by_side`).
    TVM 0.27 cannot serialise Relax IR with tensor constants (``save_json`` crashes), so
    a cached module is its text with the weights as parameters, plus the weights, bound
    again when read (:func:`bind_weights`); a module whose text still holds tensor
    constants is not cached.
    """
    found: dict[str, tvm.IRModule | ZooImportError] = {}
    missing = []
    for i, spelling in enumerate(spellings):
        key = _cache_key(spelling, column)
        parsed = _parse_cached(cache / f"{key}.py") if cache is not None else None
        if parsed is not None:
            with np.load(cache / f"{key}.npz") as saved:
                weights = [_bfloat16_again(saved[f"w{j}"]) for j in range(len(saved.files))]
            found[spelling.key] = bind_weights(parsed, weights)
        elif cache is not None and (cache / f"{key}.error").exists():
            found[spelling.key] = ZooImportError((cache / f"{key}.error").read_text())
        else:
            missing.append(i)
    if not missing:
        return found
    imported = import_side_by_side([spellings[i] for i in missing], column,
                                   [models[i] for i in missing], [examples[i] for i in missing])
    for i in missing:
        spelling = spellings[i]
        key = _cache_key(spelling, column)
        result = imported[spelling.key]
        if isinstance(result, ZooImportError):
            found[spelling.key] = result
            if cache is not None:
                cache.mkdir(parents=True, exist_ok=True)
                (cache / f"{key}.error").write_text(str(result))
            continue
        mod, weights = result
        text = mod.script()
        if cache is not None and "metadata[" not in text and _parses(text):
            cache.mkdir(parents=True, exist_ok=True)
            np.savez(cache / f"{key}.npz", **{f"w{j}": w for j, w in enumerate(weights)})
            (cache / f"{key}.py").write_text(text)
        found[spelling.key] = bind_weights(mod, weights)
    return found


def _bfloat16_again(array: np.ndarray) -> np.ndarray:
    """A bfloat16 array numpy saved as 2-byte voids (``|V2``), as bfloat16 again."""
    if array.dtype.kind == "V" and array.dtype.itemsize == 2:
        import ml_dtypes

        return array.view(ml_dtypes.bfloat16)
    return array


def _parses(text: str) -> bool:
    """Whether TVMScript ``text`` parses back (0.27 prints ``R.const("-inf", ...)``, which
    its parser refuses).
    """
    try:
        tvm.script.from_source(text)
    except Exception:  # the parser's refusal: the module is just not cached
        return False
    return True


def _parse_cached(path: Path) -> tvm.IRModule | None:
    if not path.exists():
        return None
    try:
        return tvm.script.from_source(path.read_text())
    except Exception:  # written by an older version of this script: import again
        return None


def bind_weights(mod: tvm.IRModule, weights: list[np.ndarray]) -> tvm.IRModule:
    """``mod`` with its last parameters (the weights, in order) bound to constants, as an
    import without ``keep_params`` has them (the printer renames ``blocks.0.weight``, so
    they are bound by position).
    """
    if not weights:
        return mod
    params = mod["main"].params[len(mod["main"].params) - len(weights):]
    return relax.transform.BindParams("main", dict(zip(params, weights)))(mod)


def build_torchlib_table_once() -> bool:
    """Make the dynamo exporter build onnxscript's table of torch ops once a process.

    ``torch.onnx.export(dynamo=True)`` re-reads the source of ~500 onnxscript functions on
    every export (about half of a small model's export time, profiled); the table does
    not change within a process, and the exported bytes are the same with the table
    reused (checked in ``tests/benchmarks/test_spellings.py``).  A speed-up of this
    script only; returns whether it applied (``False`` when torch's internals moved).
    """
    import importlib

    try:
        from torch.onnx._internal._lazy_import import onnxscript_apis

        build = onnxscript_apis.get_torchlib_ops
        home = importlib.import_module(build.__module__)
    except (ImportError, AttributeError):
        return False
    if not hasattr(build, "cache_info"):
        cached = functools.lru_cache(maxsize=None)(build)
        for module in {id(home): home, id(onnxscript_apis): onnxscript_apis}.values():
            setattr(module, "get_torchlib_ops", cached)
    return True


class SideBySide(torch.nn.Module):
    """Several spelling models as one torch module: input ``i`` -> model ``i`` -> output ``i``.

    Exporting and importing have a large fixed cost (torch.export's decompositions, the
    dynamo exporter's op table): the rows of a column go through the front door together
    and each row's graph is then cut out of the import (:func:`branch`).  The models do
    not share a tensor, so each output's graph is exactly its model's.
    """

    def __init__(self, models: list):
        super().__init__()
        self.models = torch.nn.ModuleList(models)

    def forward(self, *xs):
        """Each model on its own input."""
        return tuple(m(x) for m, x in zip(self.models, xs))


def side_by_side(models: list) -> torch.nn.Module:
    """:class:`SideBySide` of ``models`` whose ``forward`` takes one named input per model
    (``x0, x1, ...``): the exporters pair dynamic shapes and input names with named
    parameters, not with the items of ``*xs``.
    """
    names = ", ".join(f"x{i}" for i in range(len(models)))
    forward = eval(f"lambda self, {names}: SideBySide.forward(self, {names})",
                   {"SideBySide": SideBySide})
    cls = type("SideBySideNamed", (SideBySide,), {"forward": forward})
    return cls(models).eval()


def import_side_by_side(spellings: list[Spelling], column: Column, models: list,
                        examples: list) -> dict[str, tuple | ZooImportError]:
    """Spelling -> (its module with the weights as parameters, the weights) or its error.

    All rows are imported as one model; when that fails, each half is tried alone, down
    to the rows that fail by themselves (their error is then their own, one line).
    """
    try:
        mod, named = _import_all(spellings, column, models, examples)
    except ZooImportError as err:
        if len(spellings) == 1:
            return {spellings[0].key: err}
        half = len(spellings) // 2
        return {**import_side_by_side(spellings[:half], column, models[:half], examples[:half]),
                **import_side_by_side(spellings[half:], column, models[half:], examples[half:])}
    return {s.key: branch(mod, named, i, len(spellings)) for i, s in enumerate(spellings)}


def _import_all(spellings: list[Spelling], column: Column, models: list, examples: list
                ) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    import torch

    from patternkit.models.importing import from_onnx_model, from_torch
    from patternkit.models.onnx_fixups import prepare_for_tvm
    from patternkit.models.onnx_models import export_to_onnx

    text = (spellings[0].key if len(spellings) == 1 else f"{len(spellings)} rows") + \
        f" via {column.door}"
    model = side_by_side(models)
    axes = [_dynamic_axes(s, column) for s in spellings]
    if column.door == "torch.export":
        dims = {role: torch.export.Dim(role, min=2) for a in axes for role in a.values()}
        shapes = tuple({a: dims[r] for a, r in axis.items()} or None for axis in axes)
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                program = torch.export.export(model, tuple(examples),
                                              dynamic_shapes=shapes if dims else None)
        except Exception as err:
            raise ZooImportError(f"{text}: torch.export failed: {_first_line(err)}") from err
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod, weights, _ = from_torch(program, True, "main", text, {})
        return mod, weights
    import onnx

    exporter = "dynamo" if column.door == "onnx-dynamo" else "torchscript"
    if exporter == "dynamo":
        build_torchlib_table_once()
    names = [f"x{i}" for i in range(len(spellings))]
    data = export_to_onnx(model, tuple(examples), names,
                          opset=None if exporter == "dynamo" else int(column.door[4:]),
                          exporter=exporter, dynamic_axes=dict(zip(names, axes)),
                          output_names=[f"y{i}" for i in range(len(spellings))], text=text)
    proto = onnx.load_from_string(data)
    try:
        prepare_for_tvm(proto)
    except Exception as err:
        raise ZooImportError(f"{text}: the ONNX fix-ups failed: {_first_line(err)}") from err
    return from_onnx_model(proto, True, "main", text, {})


def branch(mod: tvm.IRModule, named: dict[str, np.ndarray], index: int, count: int
           ) -> tuple[tvm.IRModule, list[np.ndarray]]:
    """Output ``index`` of ``count`` of ``mod``'s ``main`` with only the bindings and
    parameters it reads, as a module of its own, and its weights (its last parameters).
    """
    from patternkit.ir import var_name
    from patternkit.ir.walk import vars_read

    func = mod["main"]
    value_of = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    result = func.body.body
    if count > 1:
        fields = (result if isinstance(result, relax.Tuple) else value_of[result]).fields
        result = fields[index]
    needed: set = set()
    stack = [result]
    while stack:
        var = stack.pop()
        if var in value_of and var not in needed:
            needed.add(var)
            stack.extend(vars_read(value_of[var]))
    _keep_length_casts(func, value_of, needed)
    read = {v for var in needed for v in vars_read(value_of[var])} | {result}
    params = [p for p in func.params if p in read]
    blocks = []
    out = result
    for block in func.body.blocks:
        kept = [b for b in block.bindings if b.var in needed]
        if isinstance(block, relax.DataflowBlock) and result in {b.var for b in kept} \
                and isinstance(result, relax.DataflowVar):
            out = relax.Var("y", result.ty)
            kept.append(relax.VarBinding(out, result))
        if kept:
            blocks.append(type(block)(kept))
    new = relax.Function(params, relax.SeqExpr(blocks, out), ret_ty=out.ty, is_pure=True)
    new = new.with_attr("global_symbol", "main")
    weights = [named[var_name(p)] for p in params if var_name(p) in named]
    # the importer's helper functions (from_onnx's ``maximum``, ``einsum``) stay, shared
    others = {gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"}
    return tvm.IRModule({**others, tvm.ir.GlobalVar("main"): new}), weights


def _keep_length_casts(func: relax.Function, value_of: dict, needed: set) -> None:
    """Add to ``needed`` the match casts that define a symbolic length a needed binding
    uses, and what they read.

    ``from_onnx`` gives ``arange(seq)`` a length of its own (``range_len_0``, matched from a
    count computed at run time): no Var reads that match cast, only the values after it, so
    keeping the bindings reached through Vars alone left the length undefined and the
    branch not well formed.
    """
    from patternkit.ir.walk import vars_read

    casts = [b for block in func.body.blocks for b in block.bindings
             if isinstance(b, relax.MatchCast)]
    while True:
        used = {v.name for var in needed
                for v in relax.analysis.free_symbolic_vars(value_of[var])}
        defining = [cast.var for cast in casts if cast.var not in needed and used & {
            v.name for v in relax.analysis.definable_tir_vars_in_type(cast.ty)}]
        if not defining:
            return
        stack = defining
        while stack:
            var = stack.pop()
            if var in value_of and var not in needed:
                needed.add(var)
                stack.extend(vars_read(value_of[var]))


# -- measuring ---------------------------------------------------------------------------------
def _family_reasons(spelling: Spelling, log, composite_log) -> dict[str, list[str]]:
    reasons: dict[str, list[str]] = {}
    # a match another match already claimed is bookkeeping, not a reason
    skipped = [(s.rule, s.reason) for s in log.skipped if s.kind != "overlap"]
    skipped += [(s.entry, s.reason) for s in composite_log.skipped if s.kind != "overlap"]
    for rule, reason in skipped:
        if rule.startswith(spelling.rules):
            reasons.setdefault(rule, []).append(reason)
    return reasons


def family_detectors(spelling: Spelling) -> list[NearMissDetector]:
    """The library's near-miss detectors narrowed to the row's rules (its prefixes).

    A detector none of whose rules is the row's is left out: a row's cell names what its
    own family's rules did, not what another family's skeleton happens to find there.
    """
    found = []
    for detector in NEAR_MISSES:
        narrowed = detector.only(rule.name for rule in detector.rules
                                 if rule.name.startswith(spelling.rules))
        if narrowed is not None:
            found.append(narrowed)
    return found


def near_miss_reasons(spelling: Spelling, log: pk.RewriteLog) -> dict[str, list[str]]:
    """Rule -> why it declined, for each skeleton of the row's family the rewrite left.

    The family's detectors (:data:`~patternkit.patterns.near_misses.NEAR_MISSES`) look at
    the rewritten module: where no rule matched, nothing is in the rewrite log, but the
    detector still names the rule that came closest and where its pattern failed.  A
    site no rule has a pattern for is keyed by the detector's family and skeleton.
    """
    reasons: dict[str, list[str]] = {}
    for miss in log.near_misses(family_detectors(spelling)):
        key = miss.rule or f"{miss.family} near miss ({miss.shape})"
        reasons.setdefault(key, []).append(site_free(miss.reason))
    return reasons


#: Where a near miss's reason names its site: the cell is the site in the matrix.
_SITE_PREFIX = re.compile(r"^at '[^']*': ")
#: The printer's note after a module constant, in a reason that prints a binding.
_PRINTER_NOTE = re.compile(
    r"\s*# Metadata omitted\.(?: Use show_meta=True in script\(\)(?: method to show it\.)?)?")
#: The importer's numbered binding names (``lv96``).
_BINDING = re.compile(r"\blv\d+\b")


def site_free(reason: str) -> str:
    """``reason`` without the names of its site's bindings, so that the chained copies of
    a spelling (and its dtypes) that miss for one reason share one note.
    """
    reason = _PRINTER_NOTE.sub("", _SITE_PREFIX.sub("", reason))
    return _BINDING.sub("lv…", reason)


def _merge_reasons(first: dict[str, list[str]], then: dict[str, list[str]]
                   ) -> dict[str, list[str]]:
    """``first``'s reasons, then those of ``then`` that ``first`` does not already give."""
    merged = {rule: list(reasons) for rule, reasons in first.items()}
    for rule, reasons in then.items():
        known = merged.setdefault(rule, [])
        known += [reason for reason in reasons if reason not in known]
    return merged


def _missing_rule_reason(spelling: Spelling) -> str | None:
    """"the library has no ... rule" when no rule of the library carries the row's prefixes."""
    names = [rule.rule_name for rule in LIBRARY]
    if any(name.startswith(spelling.rules) for name in names):
        return None
    return f"the library has no {spelling.family} rule or composite"


def measure(spelling: Spelling, column: Column, cache: Path | None = None,
            numeric: bool = True) -> Cell:
    """One cell: ``spelling`` through ``column``, the library applied, the result counted."""
    return measure_column([spelling], column, cache, numeric)[0]


def measure_column(spellings: list[Spelling], column: Column, cache: Path | None = None,
                   numeric: bool = True) -> list[Cell]:
    """The cells of ``spellings`` in ``column`` (imported together, measured one by one)."""
    import torch

    start = time.perf_counter()
    dtype = getattr(torch, column.dtype)
    models = [spelling_model(s, dtype) for s in spellings]
    examples = [_example(s, dtype) for s in spellings]
    imports = cached_imports(spellings, column, models, examples, cache)
    per_row = (time.perf_counter() - start) / len(spellings)
    return [_measure_cell(s, column, m, x, imports[s.key], numeric, per_row)
            for s, m, x in zip(spellings, models, examples)]


def _measure_cell(spelling: Spelling, column: Column, model, example,
                  mod: tvm.IRModule | ZooImportError, numeric: bool, seconds: float) -> Cell:
    start = time.perf_counter()
    cell = Cell(spelling.key, str(column), count_instances(model, spelling))
    if isinstance(mod, ZooImportError):
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(mod))  # torch's coloured messages
        cell.error = text.split(": ", 1)[-1].splitlines()[0]
        cell.seconds = seconds
        return cell
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY.rewrite_rules(), mod, log=log)
    composite_log = CompositeLog()
    merge_composite(after, LIBRARY.composites(), log=composite_log)
    target = spelling.target
    if target.kind == "composite":
        formed = composite_log.counts()
        cell.collapsed = sum(formed.get(name, 0) for name in target.names)
    else:
        imported, rewritten = op_counts(mod), op_counts(after)
        found = sum(rewritten[name] for name in target.names)
        before = sum(imported[name] for name in target.names)
        if target.kind == "op":
            cell.collapsed, cell.by_import = found, before >= cell.instances
        else:  # "gone": what is left of them
            cell.collapsed = max(cell.instances - found, 0)
            cell.by_import = before == 0
    cell.reasons = _family_reasons(spelling, log, composite_log)
    if not cell.complete:
        # no rule may have matched (nothing logged), but the family's skeleton is left
        cell.reasons = _merge_reasons(cell.reasons, near_miss_reasons(spelling, log))
    missing = _missing_rule_reason(spelling)
    if not cell.complete and not cell.reasons and missing:
        cell.reasons = {"library": [missing]}
    if numeric and column.dtype == "float32" and column.shape == "static" and log.records:
        cell.numeric = _numeric_check(mod, after, example)
    elif numeric and not log.records:
        cell.numeric = "nothing rewritten"
    cell.seconds = seconds + time.perf_counter() - start
    return cell


def _numeric_check(imported: tvm.IRModule, rewritten: tvm.IRModule, example) -> str:
    """The rewritten module against the imported one on llvm, on the example input."""
    args = [to_tensor(np.asarray(example.numpy()))]
    try:
        expected = flatten(build(imported)["main"](*args))
        got = flatten(build(rewritten)["main"](*args))
    except Exception as err:  # a build failure is the cell's finding, not the run's end
        return f"NOT RUN ({_first_line(err)})"
    for e, g in zip(expected, got):
        if not np.allclose(g, e, **FLOAT32_TOLERANCE):
            return f"max abs {float(np.abs(np.asarray(g) - np.asarray(e)).max()):.2g}"
    return "ok"


def _measure_column(args: tuple[list[str], str, str | None, bool]) -> list[Cell]:
    keys, column, cache, numeric = args
    by_name = {str(c): c for c in COLUMNS}
    rows = [next(s for s in SPELLINGS if s.key == key) for key in keys]
    # the rules' refusals are the cells' content, not log lines; the level is put back so
    # a caller in the same process (the test suite) keeps patternkit's warnings
    ours = logging.getLogger("patternkit")
    level = ours.level
    ours.setLevel(logging.ERROR)
    try:
        return measure_column(rows, by_name[column], Path(cache) if cache else None, numeric)
    finally:
        ours.setLevel(level)


def run(rows: list[Spelling], columns: list[Column], cache: Path | None = None,
        jobs: int = 1, numeric: bool = True) -> list[Cell]:
    """Every cell of ``rows`` x ``columns``, column by column (``jobs`` worker processes)."""
    work = [([s.key for s in rows], str(c), str(cache) if cache else None, numeric)
            for c in columns]
    if jobs <= 1:
        return [cell for item in work for cell in _measure_column(item)]
    import multiprocessing

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return [cell for cells in pool.map(_measure_column, work) for cell in cells]


# -- the matrix as a recorded campaign ---------------------------------------------------------
#: The campaign's name in a record folder's header.
CAMPAIGN = "spellings"


@dataclass(frozen=True)
class SpellingCheck:
    """A unit of the matrix campaign: one column (its rows imported as one model, seed 0).

    Plain data, so it pickles to ``--jobs`` workers; the record is the campaign module's
    (:func:`~patternkit.testing.campaign_checks.record_of`), with the column's cells in
    ``cells``, so ``--resume``, ``--shard`` and ``patternkit merge`` treat it as any unit.
    """

    rows: tuple[str, ...]
    cache: str | None = None
    numeric: bool = True

    def __call__(self, unit) -> dict:
        """Measure ``unit``'s column; its record."""
        from patternkit.testing.campaign_checks import record_of
        from patternkit.verification.report import Failure, TargetReport

        start = time.perf_counter()
        report = TargetReport(unit.subject, tried=len(self.rows))
        cells: list[Cell] = []
        try:
            cells = _measure_column((list(self.rows), unit.subject, self.cache, self.numeric))
        except Exception as err:  # a bug of the measurement: the unit's failure, one line
            report.failures.append(Failure(unit.subject, "raised", _first_line(err), None))
        report.fired = sum(c.complete for c in cells)
        return record_of(unit.subject, unit.instance, 0, report,
                         "failed" if report.failures else "measured", start,
                         cells=[dataclasses.asdict(c) for c in cells])


def matrix_campaign(rows: list[Spelling], columns: list[Column], numeric: bool):
    """The campaign of ``rows`` x ``columns``: one unit per column, the rows in its identity."""
    from patternkit.testing.campaign import Campaign

    return Campaign(CAMPAIGN, tuple(str(c) for c in columns), 1, 0,
                    (("numeric", numeric), ("rows", [s.key for s in rows])))


def run_recorded(rows: list[Spelling], columns: list[Column], folder: Path, *,
                 cache: Path | None = None, jobs: int = 1, numeric: bool = True,
                 shard: tuple[int, int] | None = None, resume: bool = False
                 ) -> tuple[list[Cell], float]:
    """Measure the columns of ``shard`` not yet recorded in ``folder``, one record each.

    Returns the cells of every column of the shard recorded in ``folder`` (measured now or
    before) and their seconds; raises ``CampaignMismatch`` before any work when ``folder``
    holds another campaign (or, with ``resume``, none).
    """
    from patternkit.testing.campaign import local_executor, process_executor, run_campaign

    campaign = matrix_campaign(rows, columns, numeric)
    check = SpellingCheck(tuple(s.key for s in rows), str(cache) if cache else None, numeric)

    def tick(done: int, total: int, column: str) -> None:
        _LOG.info("%d/%d %s", done, total, column)

    run_campaign(campaign, check, folder, shard=shard, resume=resume, tick=tick,
                 executor=process_executor(jobs) if jobs > 1 else local_executor)
    return recorded_cells([folder])


def recorded_cells(folders: list[Path]) -> tuple[list[Cell], float]:
    """The cells recorded in ``folders`` (one campaign's shards), in the campaign's order.

    Raises ``CampaignMismatch`` when a folder holds no campaign, another one than the
    first folder, or not the matrix.
    """
    from patternkit.testing.campaign import read_header, read_records

    header = read_header(Path(folders[0])) if folders else None
    if header is None or header.get("what") != CAMPAIGN:
        raise CampaignMismatch(f"{folders[0] if folders else 'no folder'}: "
                               f"no spelling-matrix campaign recorded there")
    by_column: dict[str, dict] = {}
    for folder in folders:
        if read_header(Path(folder)) != header:
            raise CampaignMismatch(f"{folder} holds another campaign than {folders[0]}")
        for record in read_records(Path(folder)):
            by_column.setdefault(record["subject"], record)
    found = [by_column[c] for c in header["subjects"] if c in by_column]
    cells = [Cell(**c) for record in found for c in record.get("cells", [])]
    return cells, sum(record["seconds"] for record in found)


def missing_columns(folders: list[Path]) -> list[str]:
    """The campaign's columns no folder recorded (a lost shard)."""
    from patternkit.testing.campaign import read_header, read_records

    header = read_header(Path(folders[0])) or {}
    recorded = {r["subject"] for folder in folders for r in read_records(Path(folder))}
    return [c for c in header.get("subjects", []) if c not in recorded]


def select(patterns: list[str] | None, names: list[str]) -> list[int]:
    """Indices of ``names`` matching any of the glob ``patterns`` (all without patterns)."""
    if not patterns:
        return list(range(len(names)))
    return [i for i, n in enumerate(names) if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


# -- the document ------------------------------------------------------------------------------
def _cell_text(cell: Cell, notes: dict[str, int]) -> str:
    if cell.error is not None:
        text = "error"
    else:
        text = f"{cell.collapsed}/{cell.instances}"
        if cell.complete and cell.by_import:
            text += " (import)"
    why = cell.why()
    if why:
        number = notes.setdefault(why, len(notes) + 1)
        text += f" [{number}]"
    if cell.numeric not in ("ok", "NOT RUN", "nothing rewritten"):
        text += f" **{cell.numeric}**"
    return text


def totals(cells: list[Cell]) -> dict[str, int]:
    """Cells complete / with a named reason / failing at the front door / without a reason."""
    out = Counter()
    for c in cells:
        out["cells"] += 1
        if c.error is not None:
            out["front door error"] += 1
        elif c.complete:
            out["collapsed"] += 1
        elif c.silent:
            out["no reason"] += 1
        else:
            out["reason given"] += 1
        out["instances"] += c.instances
        out["instances collapsed"] += c.collapsed or 0
    return dict(out)


def provenance(cells: list[Cell]) -> list[str]:
    """Which rows (and columns) each source measured, when the cells come from several
    runs or tables; nothing when one run measured them all.
    """
    sources = list(dict.fromkeys(c.source for c in cells))
    if len(sources) < 2:
        return []
    sources.sort(key=_when)  # oldest first, as the measurements were layered
    every = set(c.column for c in cells)
    lines = ["This table joins several measurements (a later one's cells replace an earlier "
             "one's); the totals count the table as shown:", ""]
    for source in sources:
        columns_of: dict[str, set[str]] = {}
        for c in cells:
            if c.source == source:
                columns_of.setdefault(c.row, set()).add(c.column)
        by_columns: dict[frozenset[str], list[str]] = {}
        for row, columns in columns_of.items():
            by_columns.setdefault(frozenset(columns), []).append(row)
        for columns, rows in by_columns.items():
            where = "every column" if columns >= every else "columns " + _columns_text(columns)
            lines.append(f"* {source or 'this run'}: {len(rows)} row(s) in {where}: "
                         + ", ".join(f"`{row}`" for row in rows))
    return lines + [""]


def _when(source: str) -> str:
    """The date and time a source names (``""`` for this run, which is the latest)."""
    found = re.search(r"\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2})?", source)
    return found.group(0) if found else ("9" if not source else "")


def _columns_text(columns: set[str]) -> str:
    """``columns`` as the globs ``--columns`` takes: ``*/float32/static`` for a dtype and
    shape measured through every front door, the column's own name otherwise.
    """
    parts = []
    for dtype in DTYPES:
        for shape in SHAPES:
            group = {f"{door}/{dtype}/{shape}" for door in FRONT_DOORS}
            if group <= columns:
                parts.append(f"*/{dtype}/{shape}")
            else:
                parts += sorted(group & columns, key=_column_order)
    parts += sorted(c for c in columns if c not in {str(col) for col in COLUMNS})
    return ", ".join(f"`{part}`" for part in parts)


def _column_order(column: str) -> int:
    names = [str(c) for c in COLUMNS]
    return names.index(column) if column in names else len(names)


def render(cells: list[Cell], seconds: float) -> str:
    """The whole grid as markdown: one table per dtype and shape, notes below."""
    rows = list(dict.fromkeys(c.row for c in cells))
    by = {(c.row, c.column): c for c in cells}
    count = totals(cells)
    lines = ["# Spelling matrix", "",
             f"Generated by `benchmarks/spellings.py` on {datetime.date.today()} "
             f"(tvm {tvm.__version__}, {seconds / 60:.1f} min"
             f"{' measuring the cells measured again' if provenance(cells) else ''}); "
             "do not edit by hand.", "",
             "Each row is one family spelled one way (`patternkit.models.spelling_sources`: "
             f"a torch block, {spelling_sources.COPIES} chained per model, width "
             f"{spelling_sources.WIDTH}, batch {SIZES['batch']}, sequence {SIZES['seq']}).  "
             "Each cell: instances collapsed / instances in the source (counted from the "
             "torch modules) after `pk.rewrite(LIBRARY)` and the library's composites; "
             "`(import)`: the importer already emitted the fused op (or no batch norm); "
             "`[n]`: the note below saying why the rest did not collapse: a family rule's "
             "logged refusal, what the family's near-miss detector "
             "(`patternkit.patterns.near_misses`) found where its skeleton was left, or the "
             "front door's error (`SILENT` where none of them said anything).  A batch "
             "norm counts as collapsed when it is gone (folded), a "
             "family without a Relax op (hard-swish, mish, RoPE, gated MLPs) when the "
             "library's composite took it.  float32 static cells are checked numerically: "
             "the rewritten module against the imported one on llvm "
             f"(rtol {FLOAT32_TOLERANCE['rtol']:g}, atol {FLOAT32_TOLERANCE['atol']:g}); "
             "a mismatch is printed in bold.  torch's SDPA is the attention family's `SDPA` "
             "row.", "",
             "Front doors: " + "; ".join(f"{k}: {v}" for k, v in DOOR_TEXT.items()) + ".", "",
             *provenance(cells),
             f"Totals: {count.get('cells', 0)} cells, {count.get('collapsed', 0)} collapsed, "
             f"{count.get('reason given', 0)} with a named reason, "
             f"{count.get('front door error', 0)} front-door errors, "
             f"{count.get('no reason', 0)} without a reason; "
             f"{count.get('instances collapsed', 0)} of {count.get('instances', 0)} instances "
             "collapsed.", ""]
    notes: dict[str, int] = {}
    columns = list(dict.fromkeys(c.column for c in cells))
    groups = list(dict.fromkeys(col.split("/", 1)[1] for col in columns))
    for group in groups:
        cols = [c for c in columns if c.endswith("/" + group)]
        lines += [f"## {group.replace('/', ', ')}", "",
                  "| family | spelling | " + " | ".join(c.split("/")[0] for c in cols) + " |",
                  "|---|---|" + "---|" * len(cols)]
        for row in rows:
            family, source = row.split("/", 1)
            lines.append(f"| {family} | {source} | " + " | ".join(
                _cell_text(by[(row, c)], notes) if (row, c) in by else "-" for c in cols)
                + " |")
        lines.append("")
    unmeasured = [str(c) for c in COLUMNS if str(c) not in columns]
    if unmeasured:
        lines += ["## Columns not measured in this generation", "",
                  ", ".join(f"`{c}`" for c in unmeasured), ""]
    lines += ["## Notes", ""]
    lines += [f"{n}. {text}" for text, n in notes.items()] or ["none"]
    return "\n".join(lines) + "\n"


# -- reading a table back ----------------------------------------------------------------------
#: A cell as :func:`_cell_text` writes it: ``error [n]`` or ``1/2 (import) [n] **mismatch**``.
_CELL_TEXT = re.compile(r"^(?:error|(?P<collapsed>\d+)/(?P<instances>\d+)"
                        r"(?P<by_import> \(import\))?)"
                        r"(?: \[(?P<note>\d+)\])?(?: \*\*(?P<numeric>.*)\*\*)?$")
#: The header line that dates a table.
_GENERATED = re.compile(r"^Generated by `benchmarks/spellings\.py` on (\S+) ")


def read_table(text: str, source: str | None = None) -> list[Cell]:
    """The cells of a table :func:`render` wrote, as :class:`Cell` s again.

    A generation that cannot measure the whole grid in time keeps the rows it did not
    measure again from the committed document (``--from-table``).  What a table does not
    show is not invented: a cell's reasons come back as its note's text (under rule
    ``""``), its numeric check as ``"NOT RUN"`` unless the table printed a mismatch, an
    error cell's instances as its row's.  ``source`` (default: "the table generated on
    <its date>") says where the cells came from.
    """
    lines = text.splitlines()
    if source is None:
        dated = next((m.group(1) for m in map(_GENERATED.match, lines) if m), "an unknown date")
        source = f"the table generated on {dated}"
    notes = {}
    in_notes = False
    for line in lines:
        if line.startswith("## "):
            in_notes = line == "## Notes"
        elif in_notes and re.match(r"^\d+\. ", line):
            number, note = line.split(". ", 1)
            notes[number] = note
    cells: list[Cell] = []
    group, doors = None, []
    for line in lines:
        if line.startswith("## "):
            title = line[3:].split(", ")
            group = "/".join(title) if len(title) == 2 and title[0] in DTYPES else None
        elif group and line.startswith("| family | spelling | "):
            doors = line.strip("| ").split(" | ")[2:]
        elif group and line.startswith("| ") and not line.startswith("|---"):
            family, spelling, *texts = line.strip()[2:-2].split(" | ")
            for door, text in zip(doors, texts):
                if text != "-":
                    cells.append(_read_cell(f"{family}/{spelling}", f"{door}/{group}", text,
                                            notes, source))
    instances = {c.row: c.instances for c in cells if c.error is None}
    for c in cells:
        if c.error is not None:
            c.instances = instances.get(c.row, spelling_sources.COPIES)
    return cells


def _read_cell(row: str, column: str, text: str, notes: dict[str, str], source: str) -> Cell:
    match = _CELL_TEXT.match(text)
    if match is None:
        raise ValueError(f"{row} in {column}: cannot read the cell {text!r}")
    note = notes.get(match["note"] or "", "")
    if match["note"] and not note:
        raise ValueError(f"{row} in {column}: the table has no note {match['note']}")
    cell = Cell(row, column, int(match["instances"] or 0), source=source,
                numeric=match["numeric"] or "NOT RUN")
    if match["collapsed"] is None:
        cell.error = note
        return cell
    cell.collapsed = int(match["collapsed"])
    cell.by_import = match["by_import"] is not None
    if note and note != SILENT:
        cell.reasons = {"": [note]}
    return cell


def merge_cells(layers: list[list[Cell]]) -> list[Cell]:
    """The cells of ``layers``, a later layer's cell replacing an earlier one's (the same
    row and column measured again), in the order the rows and columns first appear.
    """
    merged: dict[tuple[str, str], Cell] = {}
    for layer in layers:
        for cell in layer:
            merged[(cell.row, cell.column)] = cell
    return list(merged.values())


def _json_cells(path: Path) -> tuple[list[Cell], float]:
    """A ``--json`` file's cells, each with its source (when the run wrote the file)."""
    run = json.loads(path.read_text())
    if run.get("generated"):
        when = f"measured by a run started {run['generated']}"
    else:  # written before runs dated themselves: the file's time is the run's end
        when = "measured by a run ended " + datetime.datetime.fromtimestamp(
            path.stat().st_mtime, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cells = [Cell(**c) for c in run["cells"]]
    for cell in cells:
        cell.source = cell.source or when
    return cells, run["seconds"]


#: Where the table goes by default.
_DEFAULT_TABLE = Path(__file__).resolve().parents[1] / "docs" / "spellings.md"


def cache_of(args: argparse.Namespace) -> Path | None:
    """``--cache`` as a folder (``None``: no cache)."""
    return Path(args.cache) if args.cache else None


def _shard_option(parser: argparse.ArgumentParser, args: argparse.Namespace,
                  folder: Path | None) -> tuple[int, int] | None:
    """``--shard K/N`` checked: a bad spec, or a shard without a record folder, is a
    one-line error before any work.
    """
    from patternkit.testing.fuzz import parse_shard

    if args.out is not None and args.resume is not None:
        parser.exit(2, f"{parser.prog}: error: give --out DIR or --resume DIR, not both\n")
    if args.shard is None:
        return None
    try:
        shard = parse_shard(args.shard)
    except ValueError as err:
        text = str(err) if str(err).startswith("--shard") else f"--shard {args.shard}: {err}"
        parser.exit(2, f"{parser.prog}: error: {text}\n")
    if folder is None:
        parser.exit(2, f"{parser.prog}: error: --shard {args.shard} records its columns: "
                       f"give --out DIR (or --resume DIR) too\n")
    return shard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", help="glob patterns over family/spelling")
    parser.add_argument("--columns", nargs="*", help="glob patterns over door/dtype/shape")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--no-numeric", action="store_true", help="skip the llvm checks")
    parser.add_argument("--cache", default=str(Path(os.environ.get(
        "XDG_CACHE_HOME", Path.home() / ".cache")) / "patternkit" / "spellings"))
    parser.add_argument("--table", type=Path, default=None,
                        help="write the table here (default: docs/spellings.md; with "
                             "--out/--resume DIR: DIR/spellings.md)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="record one JSON line per column in DIR (a path ending in .md "
                             "is the table, as before)")
    parser.add_argument("--resume", type=Path, metavar="DIR",
                        help="go on with the campaign recorded in DIR, skipping its columns")
    parser.add_argument("--shard", metavar="K/N",
                        help="measure only the columns of shard K of N (stable hash)")
    parser.add_argument("--from-records", type=Path, nargs="+", metavar="DIR", default=[],
                        help="render the columns recorded in DIR... (one campaign's shards) "
                             "instead of measuring")
    parser.add_argument("--json", type=Path, help="also write the cells here")
    parser.add_argument("--from-json", type=Path, nargs="+", metavar="JSON", default=[],
                        help="render the cells of earlier runs (--json) instead of measuring; "
                             "a later file's cell replaces an earlier one's")
    parser.add_argument("--from-table", type=Path, metavar="MD",
                        help="with --from-json: start from the cells of this table (a "
                             "committed docs/spellings.md), the runs' cells replacing them")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.out is not None and args.out.suffix == ".md":
        args.table, args.out = args.out, None
    folder = args.resume or args.out
    shard = _shard_option(parser, args, folder)
    if args.from_records:
        table = args.table or _DEFAULT_TABLE
        try:
            cells, seconds = recorded_cells(args.from_records)
        except CampaignMismatch as err:
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        table.write_text(render(cells, seconds))
        _LOG.info("wrote %s: %s", table, totals(cells))
        lost = missing_columns(args.from_records)
        if lost:
            parser.exit(1, f"{parser.prog}: incomplete: {len(lost)} column(s) recorded in "
                           f"none of the folders: {', '.join(lost)}\n")
        return
    args.table = args.table or (folder / "spellings.md" if folder else _DEFAULT_TABLE)
    if args.from_json or args.from_table:
        layers = [read_table(args.from_table.read_text())] if args.from_table else []
        seconds = 0.0
        for path in args.from_json:
            cells, took = _json_cells(path)
            layers.append(cells)
            seconds += took
        cells = merge_cells(layers)
        args.table.write_text(render(cells, seconds))
        _LOG.info("wrote %s: %s", args.table, totals(cells))
        return
    rows = [SPELLINGS[i] for i in select(args.rows, [s.key for s in SPELLINGS])]
    columns = [COLUMNS[i] for i in select(args.columns, [str(c) for c in COLUMNS])]
    if not rows or not columns:
        parser.error("the filters leave no row or no column")
    if folder is not None:
        try:
            cells, seconds = run_recorded(rows, columns, folder, cache=cache_of(args),
                                          jobs=args.jobs, numeric=not args.no_numeric,
                                          shard=shard, resume=args.resume is not None)
        except CampaignMismatch as err:  # before any column is measured
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        args.table.write_text(render(cells, seconds))
        _LOG.info("wrote %s: %s", args.table, totals(cells))
        return
    start = time.perf_counter()
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cache = cache_of(args)
    cells: list[Cell] = []
    # column by column, the cells so far written after each: a run stopped by a timeout
    # keeps the columns it finished
    for group in ([columns] if args.jobs > 1 else [[c] for c in columns]):
        cells += run(rows, group, cache, args.jobs, not args.no_numeric)
        seconds = time.perf_counter() - start
        if args.json:
            args.json.write_text(json.dumps({"seconds": seconds, "generated": generated,
                                             "cells": [dataclasses.asdict(c) for c in cells]}))
    args.table.write_text(render(cells, seconds))
    _LOG.info("wrote %s: %s (%.0f s)", args.table, totals(cells), seconds)


if __name__ == "__main__":
    main()
