"""``patternkit run --train``: differentiate the model and check its gradients.

The job's training check is the Relay-era test flow on the user's model: a sum loss on
the entry function's output (:func:`~patternkit.training.with_loss`), its gradient with
respect to every floating-point parameter (:func:`~patternkit.training.gradient`), and
each gradient checked against float64 central finite differences
(:func:`~patternkit.training.check_gradients`).  A zoo model is checked at its own
weights and example inputs: at uniform random weights in [-1, 1] a transformer's logits
are so large that the central differences do not settle (GPT-2's early layers were 80 %
off while TVM's gradients there matched torch autograd).  Symbolic dimensions are bound
to the sizes the check runs at first: TVM 0.27's ``Gradient`` fails ("key is not in
Map") on a function whose shapes compute with one (docs/tvm-bugs.md).  Models whose entry
function takes no floating-point parameter (weights bound as constants, integer inputs
only: a token model loaded from a ``.pt2`` without ``keep_params``) have nothing to
differentiate.  The
check is then NOT RUN, with the reason: not passed, since nothing was checked, and not
failed, since nothing is wrong with the model.  Its section carries ``"status":
"not_run"`` and no ``"ok"``, which the job's verdict reads as "does not decide".
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import tvm

from ..ir import compat as C
from ..training import GradientReport, check_gradients, gradient, with_loss


def train_check(mod: tvm.IRModule, func: str, *, seed: int = 0,
                int_ranges: Mapping[str, tuple[int, int]] | None = None,
                inputs: Sequence[np.ndarray] | None = None,
                sizes: Mapping[str, int] | None = None
                ) -> tuple[dict[str, Any], tvm.IRModule | None]:
    """``(the report's "training" section, the module with the adjoint or None)``.

    ``inputs``: one array per parameter of ``func`` to check the gradients at (a zoo
    model's own); default seeded random ones.  ``sizes``: symbolic dimension name ->
    the size it is bound to before differentiating (those of ``inputs``).
    """
    wrt = [C.var_name(p) for p in mod[func].params
           if (C.dtype_of(p.ty) or "").startswith("float")]
    if not wrt:
        return {"status": "not_run",
                "reason": f"{func} has no floating-point parameter to differentiate with "
                          f"respect to"}, None
    if sizes:
        mod = C.copy_module(mod, {**dict(mod.functions.items()),
                                  mod.get_global_var(func): mod[func].bind_symbolic_vars(
                                      dict(sizes))})
    loss_name = func + "_loss"
    lossy = with_loss(mod, func, reduce="sum", name=loss_name)
    made = GradientReport()
    grads = gradient(lossy, loss_name, wrt, report=made)
    checked = check_gradients(lossy, grads, loss_name, seed=seed, positive=("var",),
                              int_ranges=dict(int_ranges or {}), inputs=inputs)
    section = {
        "ok": checked.ok, "status": "pass" if checked.ok else "fail", "loss": "sum", "wrt": wrt,
        "reference": checked.reference,
        "at": ("the model's own weights" if inputs is not None else f"random inputs (seed {seed})")
        + (f", {', '.join(f'{k} = {v}' for k, v in sizes.items())}" if sizes else ""),
        "rtol": checked.rtol, "atol": checked.atol, "loss_error": checked.loss_error,
        "expanded": dict(made.expanded),
        "parameters": [{"name": p.name, "max_abs_error": p.max_abs_error,
                        "max_reference": p.max_reference, "ok": p.ok}
                       for p in checked.parameters],
        "adjoint": loss_name + "_adjoint",
    }
    return section, grads


def training_markdown(section: Mapping[str, Any]) -> list[str]:
    """The report's gradient-check section; a check that did not run says NOT RUN and why
    (whatever else decides the verdict), never "ok" or "FAILED".
    """
    lines = ["## Gradient check (`--train`)", ""]
    if "reason" in section:
        return lines + [f"NOT RUN: {section['reason']}"]
    lines += [f"{'ok' if section['ok'] else 'FAILED'}: `{section['adjoint']}` of the "
              f"{section['loss']} loss w.r.t. {len(section['wrt'])} parameter(s), against "
              f"{section['reference'].replace('_', ' ')}s at {section.get('at', 'random inputs')} "
              f"(rtol {section['rtol']}, atol "
              f"{section['atol']}; loss error {section['loss_error']:.3g})", "",
              "| parameter | max abs error | max gradient | ok |", "| --- | ---: | ---: | --- |"]
    lines += [f"| `{p['name']}` | {p['max_abs_error']:.3g} | {p['max_reference']:.3g} | "
              f"{'yes' if p['ok'] else 'NO'} |" for p in section["parameters"]]
    return lines
