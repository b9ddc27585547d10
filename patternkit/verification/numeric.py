"""Numeric checks: build a module for ``llvm``, run it on the Relax VM, compare.

Every rewrite patternkit ships is checked this way; users get the same helpers to check
their own passes.  Inputs are drawn from a seeded generator so a failure reproduces.

Integer inputs that index a table (token ids into an embedding) are drawn inside it
(:mod:`patternkit.verification.indices`), or in the range the caller gives; a comparison
whose inputs would read outside a table is refused, never reported as a match, since
TVM's ``take`` does not check its indices on the CPU.

Building is the slow part, and a pass is usually compared against the same "before"
many times: :func:`compare` keeps the last few built reference modules, looked up by
structure (:mod:`patternkit.verification.builds`: a module edited in place is rebuilt,
one that differs in a constant is never handed another's build), and the last
``after`` the same way (a job checks one rewrite at two sizes).  A caller that built
both sides already (the job builds them as one module,
:mod:`patternkit.verification.joint`) hands the builds in (``built=``).  An
``after`` structurally equal to ``before`` (a pass that changed nothing) is not built
again: the result says ``identical``.

A comparison is only as good as the numbers it compares.  Outputs that are all zero,
constant, non-finite, or no larger than the tolerance they are judged with would match
almost anything (a rule that multiplies a tiny softmax by 1.5 stays within ``atol``), so
:func:`compare_outputs` gives three verdicts, not two: ``"pass"`` (every element within
``atol + rtol * |reference|`` *and* each output's relative error as a whole within
:func:`norm_bound`), ``"fail"``, and ``"inconclusive"`` (the reference is weak evidence,
with the reason and its magnitude); ``"refused"`` when the inputs could not be run.
:attr:`Comparison.ok` means "passed on real evidence": it is ``False`` for everything but
``"pass"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..engine.tolerance import ROUNDINGS
from ..errors import BuildError, tvm_error_line
from ..ir import compat as C
from ..ir.dtypes import is_float_dtype, machine_epsilon
from .builds import BuildCache
from .indices import index_ranges, out_of_bounds
from .legalize_once import pipeline as legalize_once_pipeline
from .linked import LINKED_OPT_LEVEL, available as linked_builds_available, load_linked, pays_for

#: Integers for inputs that index nothing known: small, so valid in small tensors.
DEFAULT_INT_RANGE = (0, 8)

#: The verdicts of a comparison (:attr:`Comparison.status`).
PASS, FAIL, INCONCLUSIVE, REFUSED = "pass", "fail", "inconclusive", "refused"


def norm_bound(dtype: str | None, rtol: float) -> float:
    """How far an output may be from its reference *as a whole*:
    ``norm(got - ref) / norm(ref)`` at most ``max(rtol, ROUNDINGS * eps(dtype))``.

    The elementwise bound ``atol + rtol * |ref|`` lets every element be off by ``atol``,
    which is everything when the outputs are small: a random-weight network whose outputs
    are 3e-5 passes a rule that scales them by 1.5 at ``atol = 1e-4``.  The relative error
    of the whole tensor does not depend on the outputs' scale, and a rewrite that only
    rounds differently keeps it near the dtype's epsilon, so it is held to the comparison's
    own ``rtol``, and never below :data:`~patternkit.engine.tolerance.ROUNDINGS` roundings
    of the output's dtype (the rule's default tolerance), which a reordered float16 sum
    may legitimately need.  Integer outputs have no epsilon: ``rtol`` alone.
    """
    eps = machine_epsilon(dtype)
    return max(rtol, ROUNDINGS * eps) if eps is not None else rtol


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing two modules on the same random inputs.

    ``ok`` means "passed on real evidence" (``status == "pass"``); a caller that needs to
    tell a wrong result from weak evidence reads :attr:`status` and :attr:`reason`.
    """

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
    #: ``"pass"``, ``"fail"``, ``"inconclusive"`` (the reference's outputs are weak
    #: evidence, see the module docstring) or ``"refused"``; derived from ``ok`` and
    #: ``refused`` when not given.
    status: str = ""
    #: Why the comparison did not pass, in one line ("" when it passed).
    reason: str = ""
    #: The smallest root mean square of a reference output's finite elements: how much
    #: evidence the weakest output carries (NaN when nothing was run).
    magnitude: float = float("nan")
    #: The largest ``norm(got - ref) / norm(ref)`` over the outputs, and the bound it was
    #: held to (:func:`norm_bound`, the loosest among the outputs' dtypes).
    norm_error: float = 0.0
    norm_bound: float = float("nan")

    def __post_init__(self) -> None:
        if not self.status:
            status = REFUSED if self.refused else PASS if self.ok else FAIL
            object.__setattr__(self, "status", status)
        if self.ok != (self.status == PASS):
            raise ValueError(f"a comparison is ok exactly when it passes, found ok={self.ok} "
                             f"with status {self.status!r}")

    @property
    def inconclusive(self) -> bool:
        """The reference's outputs could not tell a right result from a wrong one."""
        return self.status == INCONCLUSIVE

    def __str__(self) -> str:
        if self.refused:
            return "REFUSED: " + "; ".join(self.refused)
        if self.status == INCONCLUSIVE:
            return f"INCONCLUSIVE: {self.reason}"
        verdict = "match" if self.ok else "MISMATCH"
        if self.identical:
            return f"{verdict}: identical modules ({self.outputs} output(s))"
        text = (f"{verdict}: {self.outputs} output(s), max abs error {self.max_abs_error:.3g}, "
                f"max rel error {self.max_rel_error:.3g}, relative error as a whole "
                f"{self.norm_error:.3g}")
        return text + (f" ({self.reason})" if self.reason and not self.ok else "")


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


#: LLVM's optimisation level for the ``llvm`` builds the checks run (``opt-level`` of the
#: target; TVM's default is 3).  A check runs each kernel once or twice on small inputs,
#: so most of an ``-O3`` build's time is compiling, not running: a 12-layer GPT-2's one
#: build for the job took 8.1 s of CPU at 3 and 3.3 s at 1, a float16 GPT-2 layer 14.5 s
#: and 1.8 s (``docs/tvm-bugs.md``), with the same outputs to the last bit.  Level 1
#: changes how LLVM schedules the arithmetic, never what it computes (no fast-math).
#: ``None``: TVM's default.
CHECK_OPT_LEVEL: int | None = 1

#: Whether ``llvm`` check builds are linked into a shared library by the system's C
#: compiler and loaded, at LLVM's ``opt-level`` 0, instead of JIT-compiled on load
#: (:mod:`patternkit.verification.linked`: 2.5x faster to a running VM, the same
#: outputs) when the module's run is small.  Without a compiler, or with
#: ``PATTERNKIT_LINK_CHECKS=0``, builds go through the JIT at :data:`CHECK_OPT_LEVEL`
#: whatever this says.
LINK_CHECKS = True

#: Whether ``llvm`` check builds legalise each distinct call once
#: (:mod:`patternkit.verification.legalize_once`); ``False``: TVM's default pipeline.
LEGALIZE_ONCE = True


def check_target(target: str = "llvm", linked: bool = False) -> str | tvm.target.Target:
    """The target the checks build for: ``llvm`` at :data:`CHECK_OPT_LEVEL` (``linked``:
    at :data:`~patternkit.verification.linked.LINKED_OPT_LEVEL`); any other target as
    given.
    """
    level = LINKED_OPT_LEVEL if linked else CHECK_OPT_LEVEL
    if target != "llvm" or level is None:
        return target
    return tvm.target.Target({"kind": "llvm", "opt-level": level})


def build(mod: tvm.IRModule, target: str = "llvm") -> relax.VirtualMachine:
    """Build for ``target`` and return a VM on the CPU.

    ``llvm`` is built with each distinct operator call legalised once
    (:mod:`.legalize_once`; the same module as TVM's default pipeline), and linked into a
    shared library at LLVM's ``opt-level`` 0 where a C compiler is found and the module's
    run is small (:data:`LINK_CHECKS`, :mod:`.linked`), else JIT-compiled at
    :data:`CHECK_OPT_LEVEL` (:func:`check_target`).  Local functions (as produced by
    :func:`patternkit.partition`) are lifted first with ``LambdaLift``, since the VM
    lowering rejects them.
    """
    if _needs_lambda_lift(mod):
        mod = relax.transform.LambdaLift()(mod)
    linking = (target == "llvm" and LINK_CHECKS and linked_builds_available()
               and pays_for(mod))
    checked = check_target(target, linked=linking)
    pipeline = legalize_once_pipeline() if target == "llvm" and LEGALIZE_ONCE else "default"
    executable = relax.build(mod, target=checked, relax_pipeline=pipeline)
    loaded = load_linked(executable) if linking else None
    return relax.VirtualMachine(executable if loaded is None else loaded, tvm.cpu())


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

    An integer or boolean input of two or more elements whose draw came out constant
    (a mask that is all ``False`` masks every row; token ids all equal make every
    position look alike) gets its first element changed to another value of its range:
    such draws make outputs constant, which a comparison cannot judge.  The change is a
    function of the draw, so the inputs stay a function of ``seed``.
    """
    rng = np.random.default_rng(seed)
    shape_vars = shape_vars or {}
    ranges = {**index_ranges(func), **(int_ranges or {})}
    arrays = []
    for param in func.params:
        ty = param.ty
        shape = _concrete_shape(ty, shape_vars, default_dim)
        dtype = C.dtype_of(ty) or "float32"
        arr: np.ndarray
        if is_float_dtype(dtype):  # bfloat16 too: drawn as floats, rounded by the cast
            if any(tag in C.var_name(param) for tag in positive):
                arr = rng.uniform(0.5, 1.5, size=shape)
            else:
                arr = rng.uniform(low, high, size=shape)
        elif dtype == "bool":
            arr = rng.integers(0, 2, size=shape)
        else:
            lo, hi = ranges.get(C.var_name(param), DEFAULT_INT_RANGE)
            arr = rng.integers(lo, hi, size=shape)
        if dtype == "bool":
            arr = _not_constant(arr, 0, 2)
        elif not is_float_dtype(dtype):
            arr = _not_constant(arr, lo, hi)
        arrays.append(np.asarray(arr).astype(dtype))
    return arrays


def _not_constant(arr: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``arr`` with its first element moved off the common value when all its elements
    are equal and ``[lo, hi)`` holds another value (see :func:`random_inputs`).
    """
    if arr.size < 2 or hi - lo < 2 or np.any(arr != arr.flat[0]):
        return arr
    arr = arr.copy()
    arr.flat[0] = lo if arr.flat[0] != lo else lo + 1
    return arr


def flatten(result) -> list[np.ndarray]:
    """The tensors of a VM result (a tensor or nested tuples of them), in order."""
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


def _build_late(mod: tvm.IRModule, target: str) -> relax.VirtualMachine:
    return build(mod, target)  # looked up at call time: tests count calls of ``build``


REFERENCE_BUILDS = BuildCache(builder=_build_late)
#: The last build of a compared module: checking one rewrite at a second size (a
#: model's symbolic dimensions) runs the same build again.
CANDIDATE_BUILDS = BuildCache(size=1, builder=_build_late)


@dataclass(frozen=True)
class Built:
    """One VM that runs both sides of a comparison: ``before``'s function under its own
    name and ``after``'s under :attr:`after_func`.
    """

    vm: relax.VirtualMachine
    after_func: str


def compare(before: tvm.IRModule, after: tvm.IRModule, func_name: str = "main", seed: int = 0,
            rtol: float = 1e-5, atol: float = 1e-5, inputs: list[np.ndarray] | None = None,
            keep_runs: bool = False, built: Built | None = None,
            **input_options) -> Comparison:
    """Run both modules on the same seeded inputs and compare every output.

    ``before``'s build is reused across calls (see the module docstring), and so is
    ``after``'s by the next call, for the same module at other sizes.  Inputs that
    would index outside a table give a refused, failed :class:`Comparison` (nothing is
    run).  ``input_options`` go to :func:`random_inputs` (``int_ranges=``, ``positive=``).
    ``keep_runs``: the result also holds the inputs and both runs' outputs
    (:attr:`Comparison.runs`), so that nothing needs building or running again.
    A module that does not build raises :class:`~patternkit.errors.BuildError`, whose
    ``side`` says which.  ``built``: both sides' builds, made by the caller (the same
    programs, built as one module: see :class:`Built`); nothing is built here then.
    """
    if inputs is None:
        inputs = random_inputs(before[func_name], seed=seed, **input_options)
    refused = tuple(out_of_bounds(before[func_name], inputs))
    if refused:
        return Comparison(float("nan"), float("nan"), 0, False, refused,
                          reason="; ".join(refused))
    ref = run(before, inputs, func_name,
              vm=built.vm if built is not None else _built(REFERENCE_BUILDS, before, "before"))
    if after is before or tvm_ffi.structural_equal(after, before):
        # the same program: its build would run the same kernels on the same inputs
        return Comparison(0.0, 0.0, len(ref), True, identical=True, status=PASS,
                          runs=(inputs, ref, ref) if keep_runs else None)
    got = (run(after, inputs, built.after_func, vm=built.vm) if built is not None
           else run(after, inputs, func_name, vm=_built(CANDIDATE_BUILDS, after, "after")))
    result = compare_outputs(ref, got, rtol=rtol, atol=atol)
    return replace(result, runs=(inputs, ref, got)) if keep_runs else result


def _built(cache: BuildCache, mod: tvm.IRModule, side: str) -> relax.VirtualMachine:
    """``cache.vm(mod)``; a module that does not build raises :class:`BuildError` naming
    the side, so a caller can tell a model TVM imported unbuildable from a broken pass.
    """
    try:
        return cache.vm(mod)
    except Exception as err:  # relax.build raises TVM errors as RuntimeError, ValueError, ...
        raise BuildError(f"the {side} module does not build for llvm: "
                         f"{tvm_error_line(err)}", side=side) from err


def compare_outputs(ref: list[np.ndarray], got: list[np.ndarray], rtol: float = 1e-5,
                    atol: float = 1e-5) -> Comparison:
    """Compare two runs' flattened outputs (:func:`run`); ``ref`` is the reference.

    Equal NaNs and infinities agree; a NaN where the other run has a number is an
    infinite error in both figures, and fails.  Each output is judged in turn:

    1. every element within ``atol + rtol * |ref|`` (``numpy.allclose``), else ``"fail"``;
    2. the reference output is evidence: its finite elements are not all zero, not all
       equal (within the tolerance), not absent (all NaN or infinite), and their root
       mean square exceeds ``atol``; else ``"inconclusive"``, whatever the errors, since a
       wrong result that small passes step 1 too and the relative figures are rounding
       noise;
    3. ``norm(got - ref) / norm(ref)`` over its finite elements within
       :func:`norm_bound` of its dtype, else ``"fail"``.

    The verdict is ``"fail"`` if any output fails, else ``"inconclusive"`` if no output
    is evidence, or if a weak output differs from its reference at all (a difference
    that cannot be judged: a rewrite may have changed only that output), else ``"pass"``.
    A weak output reproduced bit for bit beside outputs that are evidence does not stop
    a pass: a gradient module returns constant gradients (the bias gradient of a summed
    loss is the batch size) next to the ones that tell.
    """
    if len(ref) != len(got):
        return Comparison(float("inf"), float("inf"), len(ref), False,
                          reason=f"{len(ref)} reference output(s), {len(got)} compared")
    max_abs = max_rel = norm_error = 0.0
    bound, magnitude = 0.0, float("inf")
    failures: list[str] = []
    weak: list[str] = []
    exact: list[str] = []  # weak outputs reproduced bit for bit
    evidence = 0
    for index, (r, g) in enumerate(zip(ref, got)):
        where = f"output {index}" if len(ref) > 1 else "the output"
        if r.shape != g.shape:
            return Comparison(float("inf"), float("inf"), len(ref), False,
                              reason=f"{where}: shape {g.shape}, reference {r.shape}")
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
        if r64.size == 0:  # nothing to compare, nothing to learn
            continue
        finite = np.isfinite(r64)
        values = r64[finite]
        rms = float(np.sqrt(np.mean(values ** 2))) if values.size else 0.0
        magnitude = min(magnitude, rms)
        dtype_bound = norm_bound(str(r.dtype), rtol)
        bound = max(bound, dtype_bound)
        scale = float(np.linalg.norm(values))
        off = float(np.linalg.norm(diff[finite]))
        error = off / scale if scale > 0 else 0.0 if off == 0 else float("inf")
        norm_error = max(norm_error, error)
        with np.errstate(invalid="ignore"):  # inf - inf: judged by ``same``
            close = np.abs(g64 - r64) <= atol + rtol * np.abs(r64)
        outside = int(np.count_nonzero(~(close | same)))
        if outside:
            failures.append(f"{where}: {outside} of {r64.size} element(s) outside atol + "
                            f"rtol * |reference|")
            continue
        why = _weak_evidence(values, r64.size, rms, rtol, atol)
        if why:
            if not np.all(same):  # a difference it cannot judge
                weak.append(f"{where} {why}")
            else:
                exact.append(f"{where} {why}")
            continue
        evidence += 1
        if error > dtype_bound:
            failures.append(f"{where}: relative error as a whole {error:.3g} exceeds "
                            f"{dtype_bound:.3g} ({r.dtype})")
    magnitude = magnitude if math.isfinite(magnitude) else float("nan")
    bound_held_to = bound or float("nan")
    if failures:
        return Comparison(max_abs, max_rel, len(ref), False, status=FAIL,
                          reason="; ".join(failures), magnitude=magnitude,
                          norm_error=norm_error, norm_bound=bound_held_to)
    if weak or not evidence:
        reason = "; ".join(weak or exact) or "no output has an element"
        return Comparison(max_abs, max_rel, len(ref), False, status=INCONCLUSIVE,
                          reason=f"not evidence: {reason}", magnitude=magnitude,
                          norm_error=norm_error, norm_bound=bound_held_to)
    return Comparison(max_abs, max_rel, len(ref), True, status=PASS, magnitude=magnitude,
                      norm_error=norm_error, norm_bound=bound_held_to)


def _weak_evidence(values: np.ndarray, size: int, rms: float, rtol: float,
                   atol: float) -> str:
    """Why an output whose finite elements are ``values`` (of ``size``) cannot tell a right
    result from a wrong one, or "".
    """
    if not values.size:
        return "is all NaN or infinite"
    if not np.any(values):
        return "is all zero" + (f" where finite ({values.size} of {size})"
                                if values.size < size else "")
    if rms <= atol:
        return f"is too small: magnitude (root mean square) {rms:.3g} <= atol {atol:.3g}"
    spread = float(values.max() - values.min())
    if values.size > 1 and spread <= atol + rtol * float(np.abs(values).max()):
        return f"is constant ({float(values.flat[0]):.6g}, spread {spread:.3g})"
    return ""


def assert_same_numerics(before: tvm.IRModule, after: tvm.IRModule, **options) -> Comparison:
    """:func:`compare`, raising ``AssertionError`` with the error figures unless it passed
    (an inconclusive comparison is not a pass: see the module docstring).
    """
    result = compare(before, after, **options)
    if not result.ok:
        raise AssertionError(f"numeric check failed: {result}")
    return result
