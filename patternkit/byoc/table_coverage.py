"""Coverage: how much of a model a pattern table offloads, and why the rest stays on the host.

``coverage(mod, table)`` is :func:`~patternkit.byoc.offload.offload_report` counted per
operator call, plus what ``PartitionGraph`` makes of the composites:

* ``.share``: the fraction of op calls that land in a composite;
* ``.ops``: one :class:`OpRecord` per op call (op, function, binding, and either the
  composite that took it or the reason it did not: no entry covers the op, an entry's
  check rejected it (with the check's reason), it lost an overlap to another entry, an
  intermediate escaped (Relay's semantics), fusing would have made a cycle);
* ``.regions`` / ``.largest_region``: the external functions after ``PartitionGraph``
  (merged regions, as ``MergeCompositeFunctions`` forms them) and the op calls of the
  largest.

Region merging never splits a composite: what ``MergeCompositeFunctions`` keeps apart to
avoid a cycle stays in two regions, which shows as a larger region count, not as an op
on the host.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import tvm
from tvm import relax

from ..ir import compat as C
from ..ir.kinds import CODEGEN, attr
from ..ir.targets import rewritable_functions
from .external import partition_graph
from .offload import offload_report
from .table import PatternTable


@dataclass(frozen=True)
class OpRecord:
    """One operator call of the model: where it went (``composite``) or why not (``reason``)."""

    op: str
    function: str
    binding: str
    composite: str | None = None
    kind: str | None = None
    reason: str | None = None


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

    def host_reasons(self) -> dict[str, int]:
        """``{kind: op calls}`` for the ops left on the host."""
        out: dict[str, int] = {}
        for r in self.ops:
            if r.composite is None:
                out[r.kind] = out.get(r.kind, 0) + 1
        return out

    def to_json(self) -> str:
        return json.dumps({"share": self.share, "regions": self.regions,
                           "largest_region": self.largest_region,
                           "composites": self.composites, "host": self.host_reasons(),
                           "ops": [asdict(r) for r in self.ops]}, indent=1)

    def __str__(self) -> str:
        on_host = ", ".join(f"{k} {n}" for k, n in sorted(self.host_reasons().items()))
        return (f"{self.share:.0%} of {len(self.ops)} op calls offloaded, {self.regions} "
                f"region(s), largest {self.largest_region} op(s); on the host: "
                f"{on_host or 'none'}")


def coverage(mod: tvm.IRModule, table: Any) -> CoverageReport:
    """Partition ``mod`` with ``table`` and account for every op call; ``mod`` is unchanged."""
    table = PatternTable(table)
    offload = offload_report(mod, table)
    taken: dict[tuple[str, str], str] = {}
    for formed in offload.formed:
        for var in formed.vars:
            taken[(formed.function, var)] = formed.entry
    host = {(h.function, h.var): h for h in offload.host_ops}
    report = CoverageReport(composites=dict(offload.composites))
    for gv, func in rewritable_functions(mod):
        for block in C.array_items(func.body.blocks):
            for binding in C.array_items(block.bindings):
                op = C.op_name(binding.value)
                if op is None:
                    continue
                key = (gv.name_hint, C.var_name(binding.var))
                if key in taken:
                    report.ops.append(OpRecord(op, *key, composite=taken[key]))
                else:
                    h = host.get(key)
                    report.ops.append(OpRecord(op, *key, kind=h.kind if h else "uncovered",
                                               reason=h.reason if h else None))
    if offload.formed:
        sizes = _region_sizes(partition_graph(offload.module))
        report.regions, report.largest_region = len(sizes), max(sizes, default=0)
    return report


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
