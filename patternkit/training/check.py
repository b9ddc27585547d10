"""``check_gradients``: every gradient of an adjoint checked against an independent reference.

Two references:

* ``"finite_difference"``: central differences of the function recomputed in float64
  (:func:`~patternkit.training.precision.as_float64`; its fused ops written out first, as
  TVM legalises most of them for float16/32 only), along ``directions`` seeded random unit
  directions per parameter (the directional derivative ``<grad, d>``, as
  ``torch.autograd.gradcheck``'s fast mode): two runs per direction instead of two per
  element, so it scales to real weights.  The loss the adjoint returns is compared with
  the *original* function run as it is, so a wrong expansion fails the check too;
* ``"torch"``: PyTorch autograd on ``torch_fn``, a function of the same inputs (same
  order as the Relax parameters) returning the loss, compared elementwise.

Tolerances, per parameter: ``max |analytic - reference| <= atol + rtol * max |reference|``,
scaled by the gradient's largest entry rather than entry by entry: a gradient entry is a
sum of many rounded products (a convolution weight's over every pixel of the batch), so
an entry that cancels to nearly zero carries the rounding of its large terms, and an
elementwise relative bound would fail a correct gradient.  The adjoint runs in the
model's dtype; for float32 the defaults are ``rtol=1e-4, atol=1e-5`` (float32 keeps about
seven digits; a ResNet-18's worst entry is about 1e-6 of its largest).  A gradient off by
1% anywhere is far outside that.  The float64 differences are good to about 1e-9.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import tvm

from ..errors import GradientError
from ..ir.compat import to_tensor
from ..verification.numeric import build, flatten, random_inputs, run
from .differentiate import expand_for_gradient
from .precision import as_float64


@dataclass
class ParameterCheck:
    """One parameter's gradient against the reference: the worst error and where it is."""

    name: str
    max_abs_error: float
    max_reference: float
    ok: bool


@dataclass
class GradientCheck:
    """The result of :func:`check_gradients`; true when every gradient is within tolerance."""

    reference: str
    rtol: float
    atol: float
    loss_error: float
    loss_ok: bool
    parameters: list[ParameterCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the loss and every parameter's gradient agree within tolerance."""
        return self.loss_ok and all(p.ok for p in self.parameters)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        lines = [f"gradient check against {self.reference} (rtol={self.rtol}, atol={self.atol}): "
                 f"{'PASS' if self.ok else 'FAIL'}; loss error {self.loss_error:.3g}"]
        for p in self.parameters:
            lines.append(f"  {'ok  ' if p.ok else 'FAIL'} d/d{p.name}: max abs error "
                         f"{p.max_abs_error:.3g} (largest reference value {p.max_reference:.3g})")
        return "\n".join(lines)


def check_gradients(mod: tvm.IRModule, grad_mod: tvm.IRModule, func: str = "main", *,
                    reference: str = "finite_difference", torch_fn: Callable | None = None,
                    inputs: Sequence[np.ndarray] | None = None, seed: int = 0,
                    rtol: float = 1e-4, atol: float = 1e-5, directions: int = 3,
                    step: float = 1e-6, **input_options: Any) -> GradientCheck:
    """Compare the gradients ``grad_mod[func + "_adjoint"]`` computes with ``reference``.

    Parameters
    ----------
    mod, grad_mod : tvm.IRModule
        The module before differentiation (its ``func`` returns the loss) and
        :func:`~patternkit.training.gradient`'s result.
    reference : ``"finite_difference"`` or ``"torch"``
        See the module docstring; ``"torch"`` needs ``torch_fn``.
    inputs : sequence of numpy arrays, optional
        One per parameter of ``func``; default: :func:`random_inputs` with ``seed`` and
        ``input_options`` (e.g. ``positive=("var",)``).
    """
    target = mod[func]
    adjoint_name = func + "_adjoint"
    if adjoint_name not in {gv.name_hint for gv in grad_mod.get_global_vars()}:
        raise GradientError(f"check_gradients: the gradient module has no {adjoint_name}")
    arrays = list(inputs) if inputs is not None else random_inputs(target, seed, **input_options)
    if len(arrays) != len(target.params):
        raise GradientError(f"check_gradients: {func} takes {len(target.params)} inputs, "
                            f"{len(arrays)} given")
    names = [p.name for p in target.params]
    loss, grads = _run_adjoint(grad_mod, adjoint_name, arrays)
    wrt = _wrt_names(grad_mod[adjoint_name], names, len(grads))

    if reference == "finite_difference":
        # the loss as the user's own function computes it, fused ops and all
        ref_loss = float(run(mod, arrays, func)[0])
        ref_grad = _finite_differences(target, func, arrays, names, seed, directions, step)
    elif reference == "torch":
        if torch_fn is None:
            raise GradientError("check_gradients(reference='torch') needs torch_fn")
        ref_loss, ref_grad = _torch_reference(torch_fn, arrays, wrt, names)
    else:
        raise GradientError(f"check_gradients: reference must be 'finite_difference' or 'torch', "
                            f"found {reference!r}")
    loss_ok = abs(loss - ref_loss) <= atol + rtol * abs(ref_loss)  # one number: relative
    result = GradientCheck(reference, rtol, atol, float(abs(loss - ref_loss)), loss_ok)
    for name, grad in zip(wrt, grads):
        got, want = ref_grad(name, grad)
        err = float(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
                    .max(initial=0.0))
        largest = float(np.abs(np.asarray(want, np.float64)).max(initial=0.0))
        result.parameters.append(ParameterCheck(name, err, largest,
                                                err <= atol + rtol * largest))
    return result


def _run_adjoint(grad_mod: tvm.IRModule, name: str, arrays: list) -> tuple[float, list]:
    """The adjoint's ``(loss, (grad, ...))``, flattened: the loss, then the gradients."""
    loss, *grads = run(grad_mod, arrays, name)
    return float(loss), grads


def _wrt_names(adjoint: Any, names: list[str], count: int) -> list[str]:
    """The parameters the gradients are for, in order (recorded by ``gradient``)."""
    recorded = adjoint.attrs.get("patternkit.wrt") if adjoint.attrs is not None else None
    if recorded is not None:
        return [str(n) for n in recorded]
    if count == len(names):
        return names
    raise GradientError("check_gradients: cannot tell which parameters the gradients are for; "
                        "differentiate with patternkit.training.gradient")


def _finite_differences(target: Any, func: str, arrays: list, names: list[str], seed: int,
                        directions: int, step: float):
    wide = tvm.IRModule({func: as_float64(expand_for_gradient(target, func), func)})
    vm = build(wide)
    wide_inputs = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]

    def loss_at(values: list) -> float:
        return float(flatten(vm[func](*[to_tensor(v) for v in values]))[0])

    rng = np.random.default_rng(seed + 1)

    def compare(name: str, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        index = names.index(name)
        got, want = [], []
        for _ in range(directions):
            d = rng.standard_normal(wide_inputs[index].shape)
            d /= np.linalg.norm(d) or 1.0
            plus, minus = list(wide_inputs), list(wide_inputs)
            plus[index] = wide_inputs[index] + step * d
            minus[index] = wide_inputs[index] - step * d
            want.append((loss_at(plus) - loss_at(minus)) / (2 * step))
            got.append(float(np.sum(grad.astype(np.float64) * d)))
        return np.array(got), np.array(want)

    return compare


def _torch_reference(torch_fn: Callable, arrays: list, wrt: list[str], names: list[str]):
    import torch  # noqa: PLC0415  (optional extra)

    tensors = [torch.tensor(a, requires_grad=(n in wrt and a.dtype.kind == "f"))
               for n, a in zip(names, arrays)]
    loss = torch_fn(*tensors)
    loss.backward()
    by_name = dict(zip(names, tensors))

    def compare(name: str, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        want = by_name[name].grad
        if want is None:
            want = torch.zeros_like(by_name[name])
        return grad, want.detach().numpy()

    return float(loss.detach()), compare
