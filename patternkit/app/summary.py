r"""The report's per-op summary: every op of the model, how many, and where each went.

A reader of ``report.md`` first wants the shape of the result (the 20 ``conv2d``\ s went
to the compiler, the ``max_pool2d`` stayed on the host because nothing covers it) before
the per-binding list.  Each op of the entry function is followed to

* the rewrite rule that replaced it (from the rewrite log's replaced bindings),
* the composite (and so the compiler) that holds it after ``MergeComposite``, or
* the host, with the offload report's reason.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import tvm
from tvm import relax

from ..ir import compat as C, kinds as K


@dataclass
class OpSummary:
    """One op of the model: how many calls, and where they went (destination -> count)."""

    op: str
    count: int
    went: dict[str, int] = field(default_factory=dict)
    #: Calls of the op that rewrites added (an attention rewrite's mask test): counted
    #: where they went, not in ``count``, which is the model's own.
    made: int = 0

    def where(self) -> str:
        """Where the op's calls went, as the table's last column."""
        went = "; ".join(f"{dest} ({n})" for dest, n in self.went.items()) or "unchanged"
        return f"{went}; {self.made} of these made by a rewrite" if self.made else went


def _ops(func: relax.Function) -> dict[Any, str]:
    """Binding var -> op name, for the op calls directly in ``func``'s body.

    Keyed by the Var object, not its name: a rewrite's new bindings may reuse a name
    (``lv3``) of a binding it did not replace.
    """
    out = {}
    body = func.body
    if isinstance(body, relax.SeqExpr):
        for block in body.blocks:
            for binding in block.bindings:
                name = C.op_name(binding.value)
                if name is not None:
                    out[binding.var] = _short(name)
    return out


def _short(op: str) -> str:
    return op.removeprefix("relax.")


def _composite_ops(mod: tvm.IRModule, compiler: str) -> Counter:
    """(op, "composite X on compiler") -> calls inside composite functions of ``mod``."""
    found: Counter = Counter()

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Function):
            name = K.attr(expr, K.COMPOSITE)
            if name is not None:
                for op in _ops(expr).values():
                    found[(op, f"composite {name} on {compiler}")] += 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            visit(func)
            relax.analysis.post_order_visit(func.body, visit)
    return found


def op_summary(before: relax.Function, records: Iterable[Any], composites_mod: tvm.IRModule | None,
               host_ops: Iterable[Any], compiler: str) -> list[OpSummary]:
    r"""The per-op rows, most frequent op first.

    ``records`` are the rewrite log's records (``.rule``, ``.replaced_vars``); only the
    bindings of ``before`` count (a rule that rewrote another rule's output is not
    credited with ops of the model).  ``composites_mod``
    the module after ``MergeComposite`` (``None``: no composites formed), ``host_ops`` the
    offload report's :class:`~patternkit.byoc.reports.offload.HostOp`\ s.
    """
    ops = _ops(before)
    rows = {op: OpSummary(op, n) for op, n in Counter(ops.values()).most_common()}
    for record in records:
        for var in record.replaced_vars:
            op = ops.get(var)
            if op is not None:
                dest = f"rewritten by {record.rule}"
                rows[op].went[dest] = rows[op].went.get(dest, 0) + 1
    destinations: dict[str, Counter] = defaultdict(Counter)
    if composites_mod is not None:
        for (op, dest), n in _composite_ops(composites_mod, compiler).items():
            destinations[op][dest] += n
    for host in host_ops:
        destinations[_short(host.op)][f"host ({host.kind}: {host.reason})"] += 1
    for op, dests in destinations.items():
        if op not in rows:  # only in the rewritten model: a rewrite made it
            rows[op] = OpSummary(f"{op} (made by a rewrite)", 0)
            rows[op].went.update(dests)
            continue
        row = rows[op]
        replaced = sum(n for dest, n in row.went.items() if dest.startswith("rewritten by "))
        row.went.update(dests)
        # more calls after the rewrites than the model's own left: the rest are new
        row.made = max(0, sum(dests.values()) - (row.count - replaced))
    return list(rows.values())


def markdown_table(rows: list[OpSummary]) -> list[str]:
    """``report.md``'s per-op table, one line per row."""
    lines = ["| op | count | where it went |", "| --- | ---: | --- |"]
    lines += [f"| `{r.op}` | {r.count} | {r.where()} |" for r in rows]
    return lines
