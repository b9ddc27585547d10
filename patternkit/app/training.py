"""``patternkit run --train``: differentiate the model and check its gradients.

The job's training check is the Relay-era test flow on the user's model: a sum loss on
the entry function's output (:func:`~patternkit.training.with_loss`), its gradient with
respect to every floating-point parameter (:func:`~patternkit.training.gradient`), and
each gradient checked against float64 central finite differences
(:func:`~patternkit.training.check_gradients`).  Models whose entry function takes no
floating-point parameter (weights bound as constants, integer inputs only) have nothing
to differentiate; the report says so rather than pass silently.
"""

from __future__ import annotations

from typing import Any, Mapping

import tvm

from ..ir import compat as C
from ..training import GradientReport, check_gradients, gradient, with_loss


def train_check(mod: tvm.IRModule, func: str, *, seed: int = 0,
                int_ranges: Mapping[str, tuple[int, int]] | None = None
                ) -> tuple[dict[str, Any], tvm.IRModule | None]:
    """``(the report's "training" section, the module with the adjoint or None)``."""
    wrt = [C.var_name(p) for p in mod[func].params
           if (C.dtype_of(p.ty) or "").startswith("float")]
    if not wrt:
        return {"ok": False, "reason": f"{func} has no floating-point parameter to "
                                       f"differentiate with respect to"}, None
    loss_name = func + "_loss"
    lossy = with_loss(mod, func, reduce="sum", name=loss_name)
    made = GradientReport()
    grads = gradient(lossy, loss_name, wrt, report=made)
    checked = check_gradients(lossy, grads, loss_name, seed=seed, positive=("var",),
                              int_ranges=dict(int_ranges or {}))
    section = {
        "ok": checked.ok, "loss": "sum", "wrt": wrt, "reference": checked.reference,
        "rtol": checked.rtol, "atol": checked.atol, "loss_error": checked.loss_error,
        "expanded": dict(made.expanded),
        "parameters": [{"name": p.name, "max_abs_error": p.max_abs_error,
                        "max_reference": p.max_reference, "ok": p.ok}
                       for p in checked.parameters],
        "adjoint": loss_name + "_adjoint",
    }
    return section, grads


def training_markdown(section: Mapping[str, Any]) -> list[str]:
    lines = ["## Gradient check (`--train`)", ""]
    if "reason" in section:
        return lines + [f"not checked: {section['reason']}"]
    lines += [f"{'ok' if section['ok'] else 'FAILED'}: `{section['adjoint']}` of the "
              f"{section['loss']} loss w.r.t. {len(section['wrt'])} parameter(s), against "
              f"{section['reference'].replace('_', ' ')}s (rtol {section['rtol']}, atol "
              f"{section['atol']}; loss error {section['loss_error']:.3g})", "",
              "| parameter | max abs error | max gradient | ok |", "| --- | ---: | ---: | --- |"]
    lines += [f"| `{p['name']}` | {p['max_abs_error']:.3g} | {p['max_reference']:.3g} | "
              f"{'yes' if p['ok'] else 'NO'} |" for p in section["parameters"]]
    return lines
