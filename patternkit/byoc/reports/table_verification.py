"""``verify_table``: does each entry of a pattern table keep a model's numbers on the CPU?

TVM's own numeric tests of its backend tables need the backends' hardware.  The
composites ``FuseOpsByPattern`` forms (without ``annotate_codegen``) are ordinary private
functions, though, and run on the CPU VM after ``LegalizeOps``: so a partition can be
checked on a stock wheel.  :func:`verify_table` partitions ``mod`` with one table entry
at a time (all variants of a name together), builds what fired for ``llvm`` and compares
it with the original module on the same seeded inputs.  An entry whose partition
changes the numbers is a finding about the *partition* (an input dropped, an output
re-ordered, a wrong binding fused): the composite's body is the model's own code.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import tvm

from ...verification import numeric
from ..merge.composites import composite_counts, merge_composite
from ..tables.table import PatternTable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EntryFailure:
    """An entry whose partition of the module does not reproduce the original's outputs.

    ``max_error`` is the largest absolute difference (``inf``: the outputs differ in
    number or shape, or building / running raised, see ``error``); ``module`` is the
    partitioned module, to inspect.
    """

    entry: str
    max_error: float
    module: tvm.IRModule = field(repr=False)
    error: str | None = None

    def __str__(self) -> str:
        detail = self.error or f"max abs error {self.max_error:.3g}"
        return f"{self.entry}: {detail}"


@dataclass
class TableVerification:
    """The result of :func:`verify_table`.

    Attributes
    ----------
    fired : dict of str to int
        Entry name -> composite calls it formed on the module (entries that formed none
        are absent).
    errors : dict of str to float
        Entry name -> max abs error of its partition against the original.
    failures : list of EntryFailure
        The fired entries whose partition is outside the tolerance.
    """

    fired: dict[str, int] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    failures: list[EntryFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No entry failed."""
        return not self.failures

    def __str__(self) -> str:
        lines = [f"{len(self.fired)} entr{'y' if len(self.fired) == 1 else 'ies'} fired, "
                 f"{len(self.failures)} changed the numbers"]
        for name, n in self.fired.items():
            lines.append(f"  {name}: {n} composite(s), max abs error {self.errors[name]:.3g}")
        lines.extend(f"  FAILED {f}" for f in self.failures)
        return "\n".join(lines)


def verify_table(table: Any, mod: tvm.IRModule, *, func_name: str = "main", seed: int = 0,
                 inputs: Sequence[np.ndarray] | None = None, rtol: float = 1e-5,
                 atol: float = 1e-5, semantics: str | None = None) -> TableVerification:
    """Partition ``mod`` with each entry of ``table``, run it on ``llvm``, compare.

    Parameters
    ----------
    table : PatternTable or anything it takes (``PatternTable.from_tvm("cutlass")``)
    mod : tvm.IRModule
        The model; never modified.  Its ``func_name`` is run.
    seed : int
        Seed of the random inputs (:func:`patternkit.verification.numeric.random_inputs`).
    inputs : sequence of numpy arrays, optional
        Use these instead (token ids must stay inside a vocabulary, an attention mask be
        all ones).
    rtol, atol : float
        The tolerance.  Only the partition changes, not the arithmetic, so the default
        is tight; a composite may still let the compiler re-associate a reduction.
    semantics : {"relay", "tvm"}, optional
        Passed to :func:`patternkit.merge_composite` (default: the table's own).

    Returns
    -------
    TableVerification
        The entries that fired, their errors, and ``.failures``.
    """
    table = PatternTable(table)
    if inputs is None:
        inputs = numeric.random_inputs(mod[func_name], seed=seed)
    inputs = list(inputs)
    reference = numeric.run(mod, inputs, func_name)
    report = TableVerification()
    for name in table.names:
        single = PatternTable(table.variants_of(name), semantics=table.semantics,
                              variants=True)
        partitioned = merge_composite(mod, single, semantics=semantics)
        fired = composite_counts(partitioned).get(name, 0)
        if not fired:
            continue
        report.fired[name] = fired
        try:
            got = numeric.run(partitioned, inputs, func_name)
        except Exception as err:  # noqa: BLE001 (a build failure of a partition is a finding)
            logger.warning("verify_table: %s: the partitioned module failed: %s", name, err)
            report.errors[name] = float("inf")
            report.failures.append(EntryFailure(name, float("inf"), partitioned,
                                                f"{type(err).__name__}: {err}"))
            continue
        error, ok = _difference(reference, got, rtol, atol)
        report.errors[name] = error
        if not ok:
            report.failures.append(EntryFailure(name, error, partitioned))
    return report


def _difference(reference: list[np.ndarray], got: list[np.ndarray], rtol: float,
                atol: float) -> tuple[float, bool]:
    if len(reference) != len(got) or any(r.shape != g.shape for r, g in zip(reference, got)):
        return float("inf"), False
    error, ok = 0.0, True
    for r, g in zip(reference, got):
        r64, g64 = r.astype("float64"), g.astype("float64")
        same = (r64 == g64) | (np.isnan(r64) & np.isnan(g64))
        if r64.size:
            error = max(error, float(np.where(same, 0.0, np.abs(r64 - g64)).max()))
        ok = ok and bool(np.allclose(g64, r64, rtol=rtol, atol=atol, equal_nan=True))
    return error, ok


__all__ = ["verify_table", "TableVerification", "EntryFailure"]
