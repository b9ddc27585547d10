"""The numeric check of a float16 or bfloat16 model: against float64, not against itself.

The job compares the rewritten model with the imported one at ``rtol = atol = 1e-4``,
which float32 arithmetic meets and float16 cannot: its epsilon is 9.8e-4, and two
float16 programs that round at different points differ by more than that on any model
(a 2-layer Llama differs by 3e-3 after collapsing its RMS norms, which are exact in real
arithmetic).  Comparing the two float16 runs with each other cannot tell that rounding
from a wrong rewrite; comparing each with the model recomputed in float64 can.  The check
passes when the rewritten model is at most :data:`SLACK` times as far from the float64
recomputation as the imported model is, plus the job's ``atol``: the rewrite may round
differently, not worse; a wrong rewrite is off by the size of the values.  Distances are
measured twice: the largest absolute one, and each output's relative distance as a whole,
since an absolute ``atol`` lets anything through on small outputs.

The float64 recomputation is float64 throughout (constants and ``astype`` targets of a
bfloat16 model included), with the norms TVM cannot build in float64 written out
(:func:`~patternkit.training.precision.as_float64`).  When it still cannot be built or run,
the check says NOT RUN with the reason and never raises: the job's verdict is then the
float32 comparison's.

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

from ..errors import tvm_error_line
from ..ir import dtype_of, type_of
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
                  atol: float, rtol: float | None = None) -> dict[str, Any]:
    """Both runs' distance to ``before`` recomputed in float64, and the verdict.

    ``imported`` and ``rewritten`` are the outputs of the job's comparison on ``inputs``
    (:attr:`~patternkit.verification.numeric.Comparison.runs`): only the float64 module
    is built here.  ``rtol`` is the comparison's (default ``atol``, as the job's).

    Returns a dict:

    ``status``
        ``"pass"``, ``"fail"``, ``"inconclusive"`` (the float64 outputs are no evidence:
        all zero, constant, non-finite or within ``atol``, see
        :func:`~patternkit.verification.numeric.compare_outputs`) or ``"not_run"`` (the
        float64 reference could not be built or run).
    ``ok``
        Passed on real evidence; for ``"not_run"``, the float32 comparison's verdict
        (``imported`` against ``rewritten`` at ``rtol``/``atol``), since nothing else
        was measured.
    ``reason``
        One line, "" when it passed.
    ``imported``, ``rewritten``
        Max abs distance of each run to the float64 outputs (NaN when not run).
    ``imported_rel``, ``rewritten_rel``
        The largest ``norm(run - truth) / norm(truth)`` over the outputs (NaN when not
        run): the distances at the outputs' own scale.
    ``slack``, ``magnitude``
        :data:`SLACK`, and the smallest root mean square of a float64 output.

    It passes when ``rewritten <= SLACK * imported + atol`` *and* ``rewritten_rel <=
    SLACK * imported_rel + rtol``: the first alone passes anything on outputs smaller
    than ``atol``.  It never raises: a check that cannot run says so.
    """
    rtol = atol if rtol is None else rtol
    try:
        truth = _float64_outputs(before, func_name, inputs)
    except Exception as err:  # noqa: BLE001 - whatever stops the reference, it is reported
        return _not_run(f"the float64 reference could not be computed: "
                        f"{type(err).__name__}: {tvm_error_line(err)}",
                        imported, rewritten, rtol, atol)
    result: dict[str, Any] = {"slack": SLACK}
    result["imported"], result["imported_rel"] = _distance(imported, truth)
    result["rewritten"], result["rewritten_rel"] = _distance(rewritten, truth)
    evidence = numeric.compare_outputs(truth, truth, rtol=rtol, atol=atol)
    result["magnitude"] = evidence.magnitude
    if evidence.inconclusive:
        return {**result, "status": numeric.INCONCLUSIVE, "ok": False,
                "reason": f"float64 reference {evidence.reason}"}
    failures = []
    if not result["rewritten"] <= SLACK * result["imported"] + atol:
        failures.append(f"max abs distance to float64 {result['rewritten']:.3g} > {SLACK:g} x "
                        f"{result['imported']:.3g} (the imported model's) + atol {atol:.3g}")
    if not result["rewritten_rel"] <= SLACK * result["imported_rel"] + rtol:
        failures.append(f"relative distance to float64 {result['rewritten_rel']:.3g} > "
                        f"{SLACK:g} x {result['imported_rel']:.3g} (the imported model's) + "
                        f"rtol {rtol:.3g}")
    return {**result, "status": numeric.FAIL if failures else numeric.PASS,
            "ok": not failures, "reason": "; ".join(failures)}


def _float64_outputs(before: tvm.IRModule, func_name: str,
                     inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``before``'s ``func_name`` recomputed in float64 on ``inputs`` (floating inputs
    widened, float16 and bfloat16 included; see
    :func:`~patternkit.training.precision.as_float64` for what it writes out).
    """
    from ..training.precision import as_float64  # the training package loads when needed

    wide = tvm.IRModule({func_name: as_float64(before[func_name], func_name)})
    wide_inputs = [a.astype(np.float64) if a.dtype.kind == "f" or str(a.dtype) == "bfloat16"
                   else a for a in inputs]
    return numeric.run(wide, wide_inputs, func_name)


def _not_run(reason: str, imported: list[np.ndarray], rewritten: list[np.ndarray],
             rtol: float, atol: float) -> dict[str, Any]:
    """The result of an arbitration that could not run: NOT RUN with the reason, and the
    float32 comparison's verdict as ``ok`` (the caller's verdict stands).
    """
    fallback = numeric.compare_outputs(imported, rewritten, rtol=rtol, atol=atol)
    nan = float("nan")
    return {"status": "not_run", "reason": reason, "ok": fallback.ok, "slack": SLACK,
            "imported": nan, "rewritten": nan, "imported_rel": nan, "rewritten_rel": nan,
            "magnitude": nan, "float32": fallback.status}


def _distance(got: list[np.ndarray], truth: list[np.ndarray]) -> tuple[float, float]:
    """Max abs distance, and the largest relative distance of an output as a whole
    (``norm(got - truth) / norm(truth)`` over the truth's finite elements).
    """
    if len(got) != len(truth) or any(g.shape != t.shape for g, t in zip(got, truth)):
        return float("inf"), float("inf")
    worst = relative = 0.0
    for g, t in zip(got, truth):
        if not g.size:
            continue
        g64 = g.astype(np.float64)
        same = (g64 == t) | (np.isnan(g64) & np.isnan(t))
        diff = np.where(same, 0.0, np.abs(g64 - t))
        diff = np.where(np.isnan(diff), np.inf, diff)
        worst = max(worst, float(diff.max()))
        finite = np.isfinite(t)
        scale, off = float(np.linalg.norm(t[finite])), float(np.linalg.norm(diff[finite]))
        relative = max(relative, off / scale if scale > 0 else 0.0 if off == 0 else float("inf"))
    return worst, relative
