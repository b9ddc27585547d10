"""Coverage: how much of a model a pattern table offloads, and why the rest stays on the host.

``coverage(mod, table)`` is :func:`~patternkit.byoc.reports.offload.offload_report` counted per
operator call, plus what ``PartitionGraph`` makes of the composites:

* ``.share``: the fraction of op calls that land in a composite;
* ``.ops``: one :class:`OpRecord` per op call (op, function, binding, and either the
  composite that took it or the reason it did not: no entry covers the op, an entry's
  check rejected it (with the check's reason), it lost an overlap to another entry, an
  intermediate escaped (Relay's semantics), fusing would have made a cycle);
* ``.regions`` / ``.largest_region``: the external functions after ``PartitionGraph``
  (merged regions, as ``MergeCompositeFunctions`` forms them) and the op calls of the
  largest; each offloaded op's record names its region;
* ``.split``: the offloaded op calls that region merging split off from the region they
  read from to avoid a cycle (:mod:`patternkit.byoc.partition.region_splits`), each with the path
  that forced it (``OpRecord.split``).

Region merging never splits a composite and never sends one back to the host: what it
keeps apart to avoid a cycle becomes a region of its own, so such an op is offloaded
(``composite`` set) and carries the reason in ``split``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import tvm
from tvm import relax

from ...ir import compat as C
from ...ir.kinds import CODEGEN, attr
from ...ir.targets import rewritable_functions
from ..partition.external import partition_graph
from ..partition.region_splits import Site, assign_regions, find_splits, mark_sites
from ..tables.table import PatternTable
from .offload import offload_report


@dataclass(frozen=True)
class OpRecord:
    """One operator call of the model: where it went (``composite``) or why not (``reason``).

    An offloaded call also names its ``region`` (the external function) and, when region
    merging kept its composite out of the region it reads from, why (``split``).
    """

    op: str
    function: str
    binding: str
    composite: str | None = None
    kind: str | None = None
    reason: str | None = None
    region: str | None = None
    split: str | None = None


@dataclass
class CoverageReport:
    """The result of :func:`coverage` (see the module doc)."""

    ops: list[OpRecord] = field(default_factory=list)
    regions: int = 0
    largest_region: int = 0
    composites: dict[str, int] = field(default_factory=dict)

    @property
    def share(self) -> float:
        """Fraction of op calls in a composite (``0.0`` for a model without op calls)."""
        return sum(r.composite is not None for r in self.ops) / len(self.ops) if self.ops else 0.0

    @property
    def split(self) -> int:
        """Offloaded op calls that region merging split off to avoid a cycle."""
        return sum(r.split is not None for r in self.ops)

    def host_reasons(self) -> dict[str, int]:
        """``{kind: op calls}`` for the ops left on the host."""
        out: dict[str, int] = {}
        for r in self.ops:
            if r.composite is None and r.kind is not None:  # a host record has a kind
                out[r.kind] = out.get(r.kind, 0) + 1
        return out

    def to_json(self) -> str:
        """The report as JSON: share, regions, composites, host reasons, split."""
        return json.dumps({"share": self.share, "regions": self.regions,
                           "largest_region": self.largest_region,
                           "composites": self.composites, "host": self.host_reasons(),
                           "split": self.split,
                           "ops": [asdict(r) for r in self.ops]}, indent=1)

    def __str__(self) -> str:
        on_host = ", ".join(f"{k} {n}" for k, n in sorted(self.host_reasons().items()))
        split = f"; split off to avoid a cycle: {self.split}" if self.split else ""
        return (f"{self.share:.0%} of {len(self.ops)} op calls offloaded, {self.regions} "
                f"region(s), largest {self.largest_region} op(s); on the host: "
                f"{on_host or 'none'}{split}")


def coverage(mod: tvm.IRModule, table: Any) -> CoverageReport:
    """Partition ``mod`` with ``table`` and account for every op call; ``mod`` is unchanged."""
    table = PatternTable(table)
    offload = offload_report(mod, table)
    regions: dict[tuple[str, str], tuple[str | None, str | None]] = {}
    report = CoverageReport(composites=dict(offload.composites))
    if offload.formed:
        marked, sites = mark_sites(offload.module)
        partitioned = partition_graph(marked)
        sizes = _region_sizes(partitioned)
        report.regions, report.largest_region = len(sizes), max(sizes, default=0)
        assign_regions(partitioned, sites)
        find_splits(marked, sites)
        regions = _regions_of_ops(offload.formed, sites)
    taken: dict[tuple[str, str], str] = {}
    for formed in offload.formed:
        for var in formed.vars:
            taken[(formed.function, var)] = formed.entry
    host = {(h.function, h.var): h for h in offload.host_ops}
    for gv, func in rewritable_functions(mod):
        for block in C.array_items(func.body.blocks):
            for binding in C.array_items(block.bindings):
                op = C.op_name(binding.value)
                if op is None:
                    continue
                key = (gv.name_hint, C.var_name(binding.var))
                if key in taken:
                    region, split = regions.get(key, (None, None))
                    report.ops.append(OpRecord(op, *key, composite=taken[key], region=region,
                                               split=split))
                else:
                    h = host.get(key)
                    report.ops.append(OpRecord(op, *key, kind=h.kind if h else "uncovered",
                                               reason=h.reason if h else None))
    return report


def _regions_of_ops(formed: list, sites: list[Site]) -> dict[tuple[str, str], tuple]:
    """``(function, binding) -> (region, split)`` for the ops of every composite call.

    A call site binds the name of one of its composite's members (its single result),
    or ``<root>_results`` (a tuple of several).
    """
    by_name: dict[tuple[str, str], Any] = {}
    for f in formed:
        for var in f.vars:
            by_name[(f.function, var)] = f
        by_name[(f.function, f"{f.root}_results")] = f
    out: dict[tuple[str, str], tuple] = {}
    for site in sites:
        f = by_name.get((site.function, C.var_name(site.var)))
        if f is not None:
            for var in f.vars:
                out[(f.function, var)] = (site.region, site.split)
    return out


def _region_sizes(mod: tvm.IRModule) -> list[int]:
    """Op calls each external (``Codegen``) function executes, through its composites.

    A composite used twice is one function bound once: it is counted per call.
    """
    sizes = []
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and attr(func, CODEGEN) is not None:
            sizes.append(_ops_executed(func))
    return sizes


def _ops_executed(func: relax.Function) -> int:
    local: dict[int, int] = {}
    total = 0
    for block in C.array_items(func.body.blocks):
        for binding in C.array_items(block.bindings):
            value = binding.value
            if isinstance(value, relax.Function):
                local[C.handle(binding.var)] = _ops_executed(value)
            elif isinstance(value, relax.Call):
                if isinstance(value.op, tvm.ir.Op):
                    total += 1
                elif isinstance(value.op, relax.Var):
                    total += local.get(C.handle(value.op), 0)
    return total


__all__ = ["coverage", "CoverageReport", "OpRecord"]
