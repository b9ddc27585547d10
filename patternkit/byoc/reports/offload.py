"""Offload report: what an external compiler gets, and why the rest stays on the host.

:func:`explain_offload` reads a merge that already ran (the module
:func:`patternkit.merge_composite` returned and its :class:`~patternkit.CompositeLog`), so
a caller that goes on to partition the module merges once; ``offload_report(mod, table)``
runs the merge itself (and, with ``ops``, the single-op annotation of
:func:`patternkit.AnnotateTarget`) and explains it.  Both report

* the composites formed, counted per table entry;
* every operator call left on the host, with the reason:

  ``"uncovered"``  no table entry matches an expression containing it;
  ``"vetoed"``     an entry matched, and its check rejected the match (the check's reason);
  ``"overlap"``    an entry matched, but a higher-priority entry (or an earlier match of
                   the same entry) had already taken one of the match's ops;
  ``"escape"``     an entry matched, but an intermediate result of the match is also
                   used outside it (Relay's rule: such a match is not partitioned);
  ``"cycle"``      an entry matched, but fusing it would make the composite depend on
                   itself (TVM's semantics, :mod:`patternkit.byoc.merge.tvm_fusion`).

When several matches covered an op, the reason of the highest-priority entry is given
and the others are kept in :attr:`HostOp.others`.  The partitioned module itself is in
:attr:`OffloadReport.module`, ready for :func:`patternkit.PartitionGraph`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import tvm

from ...engine.skip import SkipKind
from ...ir import compat as C
from ...ir.targets import rewritable_functions
from ..merge.composites import CompositeLog, composite_counts, merge_composite
from ..partition.external import annotation_table
from ..tables.table import PatternTable

_KIND_ORDER = {"vetoed": 0, "overlap": 1, "escape": 2, "cycle": 3}
#: A merge's skip kind -> the host-op kind the report gives it (a vetoed op, not a "check").
_LOG_KIND = {SkipKind.CHECK: "vetoed", SkipKind.OVERLAP: "overlap", SkipKind.ESCAPE: "escape",
             SkipKind.CYCLE: "cycle"}


@dataclass(frozen=True)
class HostOp:
    """An operator call that no composite took."""

    function: str
    var: str
    op: str
    kind: str
    reason: str
    entry: str | None = None
    others: tuple = ()

    def __str__(self) -> str:
        where = f"{self.function}:{self.var} = {self.op}"
        by = f" [{self.entry}]" if self.entry else ""
        return f"{where}: {self.kind}{by}: {self.reason}"


@dataclass
class OffloadReport:
    """The result of :func:`offload_report`."""

    module: tvm.IRModule
    composites: dict[str, int] = field(default_factory=dict)
    host_ops: list[HostOp] = field(default_factory=list)
    offloaded_ops: int = 0
    formed: list = field(default_factory=list)  # the FormedComposite records, per match

    def host_ops_of_kind(self, kind: str) -> list[HostOp]:
        """The op calls left on the host for reasons of ``kind`` (``"vetoed"``, ...)."""
        return [h for h in self.host_ops if h.kind == kind]

    def __str__(self) -> str:
        total = self.offloaded_ops + len(self.host_ops)
        lines = [f"offloaded {self.offloaded_ops} of {total} op call(s) in "
                 f"{sum(self.composites.values())} composite(s)"]
        for name, n in sorted(self.composites.items()):
            lines.append(f"  {name}: {n}")
        if self.host_ops:
            lines.append(f"left on the host ({len(self.host_ops)}):")
            lines.extend(f"  {h}" for h in self.host_ops)
        return "\n".join(lines)


def offload_report(mod: tvm.IRModule, table: Any, *, compiler: str | None = None,
                   ops: Mapping[str, Any] | None = None) -> OffloadReport:
    """Partition ``mod`` with ``table`` (and ``ops``) and explain the result.

    Parameters
    ----------
    mod : tvm.IRModule
        The module before ``MergeComposite``; never modified.
    table : PatternTable, list of entries, or RuleSet (its composites)
    compiler : str, optional
        Require table names to start with ``"<compiler>."``; needed with ``ops``.
    ops : mapping, optional
        Single-op predicates as for :func:`patternkit.AnnotateTarget`.
    """
    table = PatternTable(table, compiler)
    log = CompositeLog()
    out = merge_composite(mod, table, log=log)
    if ops:
        if compiler is None:
            raise ValueError("offload_report: ops=... needs compiler=...")
        out = merge_composite(out, annotation_table(compiler, ops), log=log)
    return explain_offload(out, log, table)


def explain_offload(merged: tvm.IRModule, log: CompositeLog, table: Any) -> OffloadReport:
    """What a merge that already ran offloaded, and why every other op call stayed.

    Parameters
    ----------
    merged : tvm.IRModule
        What :func:`patternkit.merge_composite` returned; never modified.
    log : CompositeLog
        The log that merge filled (``merge_composite(mod, table, log=log)``).
    table : PatternTable, list of entries, or RuleSet
        The table the merge used: its order ranks the reasons of an op several entries
        refused.
    """
    table = table if isinstance(table, PatternTable) else PatternTable(table)
    # Keyed by the Var where the log has it: names repeat (a rewrite's new bindings may
    # reuse 'lv8'), and a name key would pin one binding's skip on another.
    reasons: dict[tuple[str, Any], list] = {}
    for s in log.skipped:
        why = (_LOG_KIND[SkipKind(s.kind)], s.reason, s.entry, _priority(table, s.entry))
        keys = [C.handle(v) for v in s.bound] if s.bound else s.vars
        for key in keys:
            reasons.setdefault((s.function, key), []).append(why)
    host: list[HostOp] = []
    for gv, func in rewritable_functions(merged):
        for block in C.array_items(func.body.blocks):
            for binding in C.array_items(block.bindings):
                name = C.op_name(binding.value)
                if name is None:
                    continue
                var = C.var_name(binding.var)
                found = sorted((*reasons.get((gv.name_hint, C.handle(binding.var)), ()),
                                *reasons.get((gv.name_hint, var), ())),
                               key=lambda r: (r[3], _KIND_ORDER[r[0]]))
                if not found:
                    host.append(HostOp(gv.name_hint, var, name, "uncovered",
                                       f"no pattern table entry covers {name}"))
                    continue
                kind, reason, entry, _ = found[0]
                host.append(HostOp(gv.name_hint, var, name, kind, reason, entry,
                                   tuple((k, r, e) for k, r, e, _ in found[1:])))
    offloaded = sum(len(f.vars) for f in log.formed)
    return OffloadReport(merged, composite_counts(merged), host, offloaded, list(log.formed))


def _priority(table: PatternTable, entry: str) -> int:
    try:
        return table.entry(entry).priority
    except KeyError:  # an AnnotateTarget single-op entry: after every table entry
        return len(table)


__all__ = ["offload_report", "explain_offload", "OffloadReport", "HostOp"]
