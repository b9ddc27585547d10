"""How many calls of each operator a Relax module makes.

The coverage table (``benchmarks/coverage.py``) and the spelling matrix
(``benchmarks/spellings.py``) both decide whether a family collapsed by counting its
fused op before and after the library's rewrites; one counter keeps the two documents
counting the same way.
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax

from patternkit.ir import op_name

__all__ = ["op_counts"]


def op_counts(mod: tvm.IRModule) -> Counter[str]:
    """Calls of each operator over the module's Relax functions.

    Parameters
    ----------
    mod : tvm.IRModule
        The module to count; only read.  Its TIR functions are not Relax and are skipped.

    Returns
    -------
    Counter of str
        Operator name (``"relax.nn.layer_norm"``) -> number of calls in all Relax
        functions of ``mod`` (the importer's helper functions included).
    """
    counts: Counter[str] = Counter()

    def count(expr: relax.Expr) -> None:
        name = op_name(expr)
        if name:
            counts[name] += 1

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, count)
    return counts
