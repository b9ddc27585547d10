"""Numeric checks: build a module for ``llvm``, run it on the Relax VM, compare.

Every rewrite patternkit ships is checked this way; users get the same helpers to check
their own passes.  Inputs are drawn from a seeded generator so a failure reproduces.

Integer inputs that index a table (token ids into an embedding) are drawn inside it
(:mod:`patternkit.verification.indices`), or in the range the caller gives; a comparison
whose inputs would read outside a table is refused, never reported as a match, since
TVM's ``take`` does not check its indices on the CPU.

Building is the slow part, and a pass is usually compared against the same "before"
many times: :func:`compare` keeps the last few built reference modules, keyed by the
module object *and* its structural hash (so a module edited in place is rebuilt), and
the last ``after`` the same way (a job checks one rewrite at two sizes).  An
``after`` structurally equal to ``before`` (a pass that changed nothing) is not built
again: the result says ``identical``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np
import tvm_ffi
import tvm
from tvm import relax

from ..errors import BuildError
from ..ir import compat as C
from .indices import index_ranges, out_of_bounds

#: Integers for inputs that index nothing known: small, so valid in small tensors.
DEFAULT_INT_RANGE = (0, 8)


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing two modules on the same random inputs."""

    max_abs_error: float
    max_rel_error: float
    outputs: int
    ok: bool
    #: Why the inputs could not be compared (reads outside a table); empty when they ran.
    refused: tuple[str, ...] = ()
    #: ``after`` is structurally identical to ``before``: built and run once, not twice.
    identical: bool = False
    #: ``(inputs, before's outputs, after's outputs)`` when :func:`compare` was asked to
    #: keep them (``keep_runs=True``), for a caller that measures the runs further.
    runs: tuple | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        if self.refused:
            return "REFUSED: " + "; ".join(self.refused)
        verdict = "match" if self.ok else "MISMATCH"
        if self.identical:
            return f"{verdict}: identical modules ({self.outputs} output(s))"
        return (f"{verdict}: {self.outputs} output(s), max abs error {self.max_abs_error:.3g}, "
                f"max rel error {self.max_rel_error:.3g}")


def _needs_lambda_lift(mod: tvm.IRModule) -> bool:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Function):
            found.append(expr)

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
            if found:
                return True
    return False


def build(mod: tvm.IRModule, target: str = "llvm") -> relax.VirtualMachine:
    """Build for ``target`` and return a VM on the CPU.

    Local functions (as produced by :func:`patternkit.partition`) are lifted first with
    ``LambdaLift``, since the VM lowering rejects them.
    """
    if _needs_lambda_lift(mod):
        mod = relax.transform.LambdaLift()(mod)
    return relax.VirtualMachine(relax.build(mod, target=target), tvm.cpu())


def _concrete_shape(ty, shape_vars: dict[str, int], default_dim: int) -> tuple[int, ...]:
    shape = C.static_shape(ty)
    if shape is None:
        raise ValueError(f"cannot draw a random input for a parameter of type {ty}")
    dims = []
    for d in shape:
        if isinstance(d, int):
            dims.append(d)
        elif tvm.ir.is_prim_var(d):
            dims.append(int(shape_vars.get(d.name, default_dim)))
        else:
            raise ValueError(f"cannot pick a concrete value for the dimension {d}")
    return tuple(dims)


#: The size a symbolic dimension gets when the caller names none.
DEFAULT_DIM = 3


def random_inputs(func: relax.Function, seed: int = 0, shape_vars: dict[str, int] | None = None,
                  default_dim: int = DEFAULT_DIM, low: float = -1.0, high: float = 1.0,
                  positive: tuple[str, ...] = (),
                  int_ranges: Mapping[str, tuple[int, int]] | None = None) -> list[np.ndarray]:
    """Seeded random arrays for every parameter of ``func``.

    Floating parameters are uniform in ``[low, high)``; names listed in ``positive``
    (variances, say) are drawn from ``[0.5, 1.5)`` so that ``sqrt`` stays defined.
    Integer parameters are uniform in ``[lo, hi)`` of ``int_ranges[name]``, else of the
    smallest table they index (:func:`~patternkit.verification.indices.index_ranges`),
    else of :data:`DEFAULT_INT_RANGE`.
    Symbolic dimensions take their value from ``shape_vars`` or ``default_dim``.
    """
    rng = np.random.default_rng(seed)
    shape_vars = shape_vars or {}
    ranges = {**index_ranges(func), **(int_ranges or {})}
    arrays = []
    for param in func.params:
        ty = param.ty
        shape = _concrete_shape(ty, shape_vars, default_dim)
        dtype = C.dtype_of(ty) or "float32"
        if dtype.startswith("float"):
            if any(tag in C.var_name(param) for tag in positive):
                arr = rng.uniform(0.5, 1.5, size=shape)
            else:
                arr = rng.uniform(low, high, size=shape)
        elif dtype == "bool":
            arr = rng.integers(0, 2, size=shape)
        else:
            lo, hi = ranges.get(C.var_name(param), DEFAULT_INT_RANGE)
            arr = rng.integers(lo, hi, size=shape)
        arrays.append(np.asarray(arr).astype(dtype))
    return arrays


def flatten(result) -> list[np.ndarray]:
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    out = []
    for item in result:
        out.extend(flatten(item))
    return out


def run(mod: tvm.IRModule, inputs: list[np.ndarray], func_name: str = "main",
        vm: relax.VirtualMachine | None = None) -> list[np.ndarray]:
    """Build ``mod`` for llvm (unless ``vm`` is its build), call ``func_name`` with ``inputs``.

    Outputs are flattened to numpy.
    """
    vm = vm if vm is not None else build(mod)
    return flatten(vm[func_name](*[C.to_tensor(a) for a in inputs]))


class _BuildCache:
    """The last few reference builds: ``id(mod)`` -> ``(mod, structural hash, vm)``.

    The module is held, so its ``id`` cannot be reused while the entry lives; the hash
    catches a module changed in place (``mod["main"] = ...``) since it was built.
    """

    def __init__(self, size: int = 4):
        self.size = size
        self._entries: OrderedDict[int, tuple] = OrderedDict()

    def vm(self, mod: tvm.IRModule) -> relax.VirtualMachine:
        digest = tvm_ffi.structural_hash(mod)
        entry = self._entries.get(id(mod))
        if entry is not None and entry[0] is mod and entry[1] == digest:
            self._entries.move_to_end(id(mod))
            return entry[2]
        vm = build(mod)
        self._entries[id(mod)] = (mod, digest, vm)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return vm

    def clear(self) -> None:
        self._entries.clear()


REFERENCE_BUILDS = _BuildCache()
#: The last build of a compared module: checking one rewrite at a second size (a
#: model's symbolic dimensions) runs the same build again.
CANDIDATE_BUILDS = _BuildCache(size=1)


def compare(before: tvm.IRModule, after: tvm.IRModule, func_name: str = "main", seed: int = 0,
            rtol: float = 1e-5, atol: float = 1e-5, inputs: list[np.ndarray] | None = None,
            keep_runs: bool = False, **input_options) -> Comparison:
    """Run both modules on the same seeded inputs and compare every output.

    ``before``'s build is reused across calls (see the module docstring), and so is
    ``after``'s by the next call, for the same module at other sizes.  Inputs that
    would index outside a table give a refused, failed :class:`Comparison` (nothing is
    run).  ``input_options`` go to :func:`random_inputs` (``int_ranges=``, ``positive=``).
    ``keep_runs``: the result also holds the inputs and both runs' outputs
    (:attr:`Comparison.runs`), so that nothing needs building or running again.
    A module that does not build raises :class:`~patternkit.errors.BuildError`, whose
    ``side`` says which.
    """
    if inputs is None:
        inputs = random_inputs(before[func_name], seed=seed, **input_options)
    refused = tuple(out_of_bounds(before[func_name], inputs))
    if refused:
        return Comparison(float("nan"), float("nan"), 0, False, refused)
    ref = run(before, inputs, func_name, vm=_built(REFERENCE_BUILDS, before, "before"))
    if after is before or tvm_ffi.structural_equal(after, before):
        # the same program: its build would run the same kernels on the same inputs
        return Comparison(0.0, 0.0, len(ref), True, identical=True,
                          runs=(inputs, ref, ref) if keep_runs else None)
    got = run(after, inputs, func_name, vm=_built(CANDIDATE_BUILDS, after, "after"))
    result = compare_outputs(ref, got, rtol=rtol, atol=atol)
    return replace(result, runs=(inputs, ref, got)) if keep_runs else result


def _built(cache: _BuildCache, mod: tvm.IRModule, side: str) -> relax.VirtualMachine:
    """``cache.vm(mod)``; a module that does not build raises :class:`BuildError` naming
    the side, so a caller can tell a model TVM imported unbuildable from a broken pass."""
    try:
        return cache.vm(mod)
    except Exception as err:  # relax.build raises TVM errors as RuntimeError, ValueError, ...
        raise BuildError(f"the {side} module does not build for llvm: "
                         f"{_first_line(err)}", side=side) from err


def _first_line(err: Exception) -> str:
    """The message of a TVM error without its C++ backtrace: the check that failed, and
    where (TVM's checks often say only ``Check failed: (...) is false``)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    checks = [line for line in lines if "Check failed" in line or "Error" in line]
    message = (checks or lines or [type(err).__name__])[-1].rstrip(": ")
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None and tb.tb_frame.f_code.co_filename.endswith((".cc", ".h")):
        where = tb.tb_frame.f_code.co_name.split("(")[0].split(" ")[-1]
        message += f" (in {where}, {tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]})"
    return message


def compare_outputs(ref: list[np.ndarray], got: list[np.ndarray], rtol: float = 1e-5,
                    atol: float = 1e-5) -> Comparison:
    """Compare two runs' flattened outputs (:func:`run`); equal NaNs and infinities agree.

    A NaN where the other run has a number is an infinite error in both figures.
    """
    if len(ref) != len(got):
        return Comparison(float("inf"), float("inf"), len(ref), False)
    max_abs = max_rel = 0.0
    ok = True
    for r, g in zip(ref, got):
        if r.shape != g.shape:
            return Comparison(float("inf"), float("inf"), len(ref), False)
        r64, g64 = r.astype("float64"), g.astype("float64")
        same = (r64 == g64) | (np.isnan(r64) & np.isnan(g64))  # equal infinities count
        diff = np.where(same, 0.0, np.abs(r64 - g64))
        # NaN on one side only is as far off as it gets (a NaN difference would also
        # vanish from the maximum: Python's ``max(0.0, nan)`` is 0.0).
        diff = np.where(np.isnan(diff), np.inf, diff)
        if diff.size:
            max_abs = max(max_abs, float(diff.max()))
            rel = diff / np.fmax(np.abs(r64), 1e-12)  # fmax: a NaN reference divides by 1e-12
            rel = np.where(np.isnan(rel), np.inf, rel)  # inf / inf: a finite value, reference inf
            max_rel = max(max_rel, float(rel.max()))
        ok = ok and bool(np.allclose(g64, r64, rtol=rtol, atol=atol, equal_nan=True))
    return Comparison(max_abs, max_rel, len(ref), ok)


def assert_same_numerics(before: tvm.IRModule, after: tvm.IRModule, **options) -> Comparison:
    """:func:`compare`, raising ``AssertionError`` with the error figures on mismatch."""
    result = compare(before, after, **options)
    if not result.ok:
        raise AssertionError(f"numeric check failed: {result}")
    return result
