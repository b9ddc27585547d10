"""The numeric check of a float16 or bfloat16 model: against float64, not against itself.

The job compares the rewritten model with the imported one at ``rtol = atol = 1e-4``,
which float32 arithmetic meets and float16 cannot: its epsilon is 9.8e-4, and two
float16 programs that round at different points differ by more than that on any model
(a 2-layer Llama differs by 3e-3 after collapsing its RMS norms, which are exact in real
arithmetic).  Comparing the two float16 runs with each other cannot tell that rounding
from a wrong rewrite; comparing each with the model recomputed in float64 can.  The check
passes when the rewritten model is at most :data:`SLACK` times as far from the float64
recomputation as the imported model is, plus the job's ``atol``: the rewrite may round
differently, not worse; a wrong rewrite is off by the size of the values.

A float32 model gets the same arbitration when its own comparison misses the tolerance:
a deep network rounds differently after a fold (on the job's inputs, ResNet-50 after
``conv.fold_batchnorm`` is 2e-4 from the imported model, and each is about 1.2e-4 from
the float64 recomputation), and a rewrite that removes a cancellation is more exact than
the model it rewrote.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..ir import dtype_of, op_name, type_of
from ..verification import numeric

#: Floating dtypes checked against float64 instead of against the imported model.
LOW_PRECISION = ("float16", "bfloat16")

#: How many times further from the float64 recomputation the rewritten model may be.
SLACK = 2.0


def low_precision_dtype(func: Any) -> str | None:
    """The low-precision dtype of ``func``'s inputs or results, or ``None``.

    A model that keeps its weights as constants takes only token ids: its results say
    what it computes in.
    """
    types = [type_of(p) for p in func.params] + [type_of(func.body)]
    while types:
        ty = types.pop(0)
        if isinstance(ty, relax.TupleType):
            types.extend(ty.fields)
        elif dtype_of(ty) in LOW_PRECISION:
            return dtype_of(ty)
    return None


def float64_check(before: tvm.IRModule, func_name: str, inputs: list[np.ndarray],
                  imported: list[np.ndarray], rewritten: list[np.ndarray],
                  atol: float) -> dict[str, Any]:
    """Both runs' max abs distance to ``before`` recomputed in float64, and the verdict.

    ``imported`` and ``rewritten`` are the outputs of the job's comparison on ``inputs``
    (:attr:`~patternkit.verification.numeric.Comparison.runs`): only the float64 module
    is built here.  Returns ``{"imported": e, "rewritten": e', "slack": SLACK, "ok": e'
    <= SLACK * e + atol}``.
    """
    from ..training.precision import as_float64  # the training package loads when needed

    wide = tvm.IRModule({func_name: as_float64(_written_out(before[func_name]), func_name)})
    wide_inputs = [a.astype(np.float64) if a.dtype.kind == "f" or str(a.dtype) == "bfloat16"
                   else a for a in inputs]
    truth = numeric.run(wide, wide_inputs, func_name)
    e_imported, e_rewritten = _distance(imported, truth), _distance(rewritten, truth)
    return {"imported": e_imported, "rewritten": e_rewritten, "slack": SLACK,
            "ok": bool(e_rewritten <= SLACK * e_imported + atol)}


def _written_out(func: relax.Function) -> relax.Function:
    """``func`` with its layer norms written out: TVM 0.27 has no float64 ``layer_norm``
    kernel ("only support float32 and float16"), and every transformer has layer norms.
    ``layernorm.expand`` writes a float16 norm out in float32 between casts, which the
    widening turns into float64.  Group and instance norms have no expand rule and no
    float64 kernel either: :func:`~patternkit.training.precision.as_float64` refuses them
    by name."""
    from ..engine import rewrite
    from ..patterns import EXPANSIONS

    if not any(op_name(e) == "relax.nn.layer_norm" for e in _calls(func)):
        return func
    return rewrite(EXPANSIONS.by_prefix("layernorm."), func, max_growth=None)


def _calls(func: relax.Function) -> list[Any]:
    found: list[Any] = []
    relax.analysis.post_order_visit(
        func, lambda e: found.append(e) if isinstance(e, relax.Call) else None)
    return found


def _distance(got: list[np.ndarray], truth: list[np.ndarray]) -> float:
    if len(got) != len(truth):
        return float("inf")
    return max((float(np.max(np.abs(g.astype(np.float64) - t))) for g, t in zip(got, truth)
                if g.size), default=0.0)
