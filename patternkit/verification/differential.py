"""Differential checks: run a transform on a module and judge what it gave back.

A transform is anything ``IRModule -> IRModule`` (a TVM pass, a ``Sequential``, a
patternkit rewrite, a user function).  :func:`apply_transform` runs it with a time limit
and turns what can go wrong with *it* into an :class:`Outcome` (it raised, it ran out of
time, it returned something that is not a module); :func:`judge_result` then checks what
it returned against the input: well formed, builds for llvm, and computes the same
numbers on seeded random inputs within a tolerance.  Nothing here knows about rules:
the fuzzing campaigns in :mod:`patternkit.testing.fuzz` build on it.

Seeded draws in [-1, 1] miss a rewrite that is exact there and wrong elsewhere (``relu``
written as a clip at 100, an approximation good for small values only), so a result is
also run on the adversarial whole-program draws of :data:`ADVERSARIAL`: wide values (the
per-site validation's :data:`~patternkit.verification.sites.WIDE` range of the program's
dtype), positive values and zeros.  They are judged as rewrite sites are
(:func:`~patternkit.verification.sites.judge`: each element against ``rtol * |ref|`` plus
``atol`` times the output's own root mean square, since a draw of +-1e4 rounds at 1e-3
where a draw of +-1 rounds at 1e-7; reference elements that are not finite are no
evidence), and they can only find a failure: a pass rests on the seeded draws.

The time limit is a ``SIGALRM`` timer, so it works in the main thread of a process (the
campaigns run there, in parallel worker processes too) and interrupts Python code and
any TVM call that returns to the interpreter; a native loop that never returns is out of
its reach.  :class:`TransformTimeout` derives from ``BaseException``, so a transform's
own ``except Exception`` does not swallow it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import tvm
from tvm import relax

from ..ir import compat as C
from ..ir.dtypes import coarsest_float
from . import numeric
from .sites import WIDE, judge

__all__ = ["Outcome", "TransformTimeout", "apply_transform", "judge_result", "time_limit",
           "narrowest_float_dtype", "adversarial_inputs", "FAILURE_KINDS", "ADVERSARIAL",
           "WIDE_SKIPPED"]

#: What can go wrong, and whether a campaign shrinks it: a wrong result is shrunk to a
#: minimal module; a transform that cannot cope with its input is reported as it came.
FAILURE_KINDS = {
    "mismatch": "the result computes different numbers on llvm",
    "ill-formed": "the result is not well formed",
    "build": "the result does not build for llvm (the input does)",
    "raised": "the transform raised",
    "timeout": "the transform ran out of time",
    "not-a-module": "the transform returned something that is not an IRModule",
    "inconclusive": "the input's outputs are no evidence (all zero, constant, non-finite or "
                    "within atol) on every draw, so the result could not be judged",
}

#: Input draws a judgement tries (seeds ``seed``, ``seed + 1``, ...) before it calls a
#: result inconclusive: a draw that makes the outputs degenerate (a ReLU of mostly
#: negative values) is the draw's fault, a program whose outputs are always degenerate
#: (``x - x``) is not.
DRAWS = 3

#: The adversarial whole-program draws (label, low, high) besides the seeded ones; ``None``
#: bounds stand for the :data:`~patternkit.verification.sites.WIDE` range of the
#: program's dtype.  Inputs named as positive (``input_options["positive"]``) stay in
#: [0.5, 1.5] in every draw, and integer inputs in their ranges.
ADVERSARIAL = (("wide", None, None),
               ("positive [0.5, 1.5]", 0.5, 1.5),  # a square root's or a logarithm's domain
               ("zeros", 0.0, 0.0))

#: Why a float16 program gets no wide draw: float16 ends at 65504, so a program that
#: squares and sums +-1e2 (a variance over 16 features) overflows in its own reference
#: and computes a finite, wrong output that a rewrite accumulating in float32 would be
#: blamed for; nothing at this layer can widen the reference to float64 to arbitrate.
#: (bfloat16 has float32's range and keeps its wide draw; float16 rewrite sites keep
#: theirs in ``patternkit run``, arbitrated in float64.)
WIDE_SKIPPED = "float16"


class TransformTimeout(BaseException):  # noqa: N818 (not an error of the caller's)
    """The transform ran past its time limit."""


@dataclass(frozen=True)
class Outcome:
    """What one transform did to one module.

    Attributes
    ----------
    result : tvm.IRModule or None
        What the transform returned (``None`` when it failed before returning one).
    kind : str or None
        ``None`` when all is well, else a key of :data:`FAILURE_KINDS`.
    error : str
        What went wrong, in a sentence or two ("" when all is well).
    changed : bool
        The result differs structurally from the input.
    max_abs_error, max_rel_error : float or None
        Of the numeric comparison, when one was made.
    seconds : float
        Time spent in the transform.
    """

    result: Any = None
    kind: str | None = None
    error: str = ""
    changed: bool = False
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether all is well: no failure of any kind."""
        return self.kind is None


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`TransformTimeout` in this block after ``seconds`` (``None``: never).

    Only the main thread can take signals; elsewhere the block runs without a limit.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum, _frame):
        raise TransformTimeout(f"no result after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def apply_transform(transform: Callable[[tvm.IRModule], Any], mod: tvm.IRModule,
                    timeout: float | None = None) -> Outcome:
    """Run ``transform(mod)`` within ``timeout`` seconds; never raises for the transform.

    A TVM error raised *because* of the alarm (the signal landed inside a Python callback
    that TVM called) still counts as a timeout: the clock decides, not the exception.
    """
    start = time.perf_counter()
    try:
        with time_limit(timeout):
            result = transform(mod)
    except TransformTimeout as err:
        return Outcome(kind="timeout", error=str(err), seconds=time.perf_counter() - start)
    except Exception as err:  # the transform's own failure, whatever it is
        seconds = time.perf_counter() - start
        if timeout and seconds >= timeout:
            return Outcome(kind="timeout", error=f"no result after {timeout:g} s", seconds=seconds)
        message = str(err).strip().splitlines()
        return Outcome(kind="raised", seconds=seconds,
                       error=f"{type(err).__name__}: {message[0] if message else ''}")
    seconds = time.perf_counter() - start
    if not isinstance(result, tvm.IRModule):
        return Outcome(kind="not-a-module", seconds=seconds,
                       error=f"returned a {type(result).__module__}.{type(result).__name__} "
                             f"({result!r:.80})")
    return Outcome(result=result, changed=not C.structural_equal(result, mod), seconds=seconds)


def judge_result(before: tvm.IRModule, outcome: Outcome, *, rtol: float, atol: float,
                 seed: int = 0, input_options: dict | None = None,
                 adversarial: bool = True) -> Outcome:
    """Check a changed result: well formed, builds, same numbers as ``before`` on llvm.

    The numbers are judged by :func:`~patternkit.verification.numeric.compare_outputs`:
    a draw on which ``before``'s outputs are no evidence is drawn again (:data:`DRAWS`
    seeds from ``seed``), and a result still unjudged after that is ``"inconclusive"``,
    a failure kind of its own: never a pass, and not a mismatch either.  With
    ``adversarial`` (the default), a result that misses on one of the
    :data:`ADVERSARIAL` draws is a ``"mismatch"`` too, named by its draw; those runs
    reuse the two builds, so they cost no build of their own.
    An outcome that already failed, or whose result equals the input, is returned as is
    (an unchanged module computes the same numbers).  ``before`` must build: a caller
    whose input does not build has no reference to compare with (``ValueError``).
    """
    if not outcome.ok or not outcome.changed:
        return outcome
    after = outcome.result
    try:
        well_formed = relax.analysis.check_well_formed(after)
    except Exception as err:  # the checker itself gives up on some malformed IR
        well_formed, why = False, f"{type(err).__name__}: {err}"
    else:
        why = "relax.analysis.check_well_formed is False"
    if not well_formed:
        return _failed(outcome, "ill-formed", why)
    try:
        reference_vm = numeric.build(before)
    except Exception as err:
        raise ValueError(f"the input does not build: {type(err).__name__}: {err}") from err
    try:
        after_vm = numeric.build(after)
    except Exception as err:
        message = str(err).strip().splitlines()
        return _failed(outcome, "build", f"{type(err).__name__}: {message[0] if message else ''}")
    for draw in range(DRAWS):
        inputs = numeric.random_inputs(before["main"], seed=seed + draw,
                                       **(input_options or {}))
        try:
            reference = numeric.run(before, inputs, vm=reference_vm)
        except Exception as err:
            raise ValueError(f"the input does not run: {type(err).__name__}: {err}") from err
        try:
            got = numeric.run(after, inputs, vm=after_vm)
        except Exception as err:
            message = str(err).strip().splitlines()
            return _failed(outcome, "build",
                           f"{type(err).__name__}: {message[0] if message else ''}")
        comparison = numeric.compare_outputs(reference, got, rtol=rtol, atol=atol)
        if not comparison.inconclusive:
            break
    checked = Outcome(after, None, "", True, comparison.max_abs_error,
                      comparison.max_rel_error, outcome.seconds)
    if not comparison.ok and not comparison.inconclusive:
        return _failed(checked, "mismatch",
                       f"max abs error {comparison.max_abs_error:.3g}, max rel error "
                       f"{comparison.max_rel_error:.3g}, relative error as a whole "
                       f"{comparison.norm_error:.3g} (rtol {rtol:.3g}, atol {atol:.3g}): "
                       f"{comparison.reason}")
    if adversarial:
        missed = _adversarial_miss(before, after, reference_vm, after_vm, rtol=rtol,
                                   atol=atol, seed=seed, input_options=input_options)
        if missed is not None:
            kind, error, (max_abs, max_rel) = missed
            return Outcome(after, kind, error, True, max_abs, max_rel, outcome.seconds)
    if comparison.inconclusive:
        return _failed(checked, "inconclusive", f"{comparison.reason} (seeds {seed} to "
                                                f"{seed + DRAWS - 1})")
    return checked


def adversarial_inputs(func: relax.Function, seed: int = 0, dtype: str | None = None,
                       input_options: dict | None = None
                       ) -> list[tuple[str, list[np.ndarray]]]:
    """``(label, inputs)`` for each :data:`ADVERSARIAL` draw of ``func``'s parameters.

    ``dtype`` picks the wide range (default: float32's); ``input_options`` are passed to
    :func:`~patternkit.verification.numeric.random_inputs` (``positive``,
    ``int_ranges``, ``shape_vars``).
    """
    wide = WIDE.get(dtype or "float32", WIDE["float32"])
    draws = []
    for label, low, high in ADVERSARIAL:
        if low is None or high is None:
            if dtype == WIDE_SKIPPED:
                continue
            label, low, high = f"wide [-{wide:g}, {wide:g}]", -wide, wide
        arrays = numeric.random_inputs(func, seed=seed, low=low, high=high,
                                       **(input_options or {}))
        draws.append((label, arrays))
    return draws


def _adversarial_miss(before: tvm.IRModule, after: tvm.IRModule, reference_vm: Any,
                      after_vm: Any, *, rtol: float, atol: float, seed: int,
                      input_options: dict | None,
                      ) -> tuple[str, str, tuple[float | None, float | None]] | None:
    """The first adversarial draw ``after`` misses: ``(kind, error, (max abs, max rel))``.

    A draw ``before`` cannot run, or whose outputs are no evidence (all zero, constant,
    nowhere finite), proves nothing either way and is passed over.
    """
    dtype = narrowest_float_dtype(before)
    for label, inputs in adversarial_inputs(before["main"], seed, dtype, input_options):
        try:
            reference = numeric.run(before, inputs, vm=reference_vm)
        except Exception:  # noqa: BLE001 - an input ``before`` cannot take: no evidence
            continue
        try:
            got = numeric.run(after, inputs, vm=after_vm)
        except Exception as err:  # noqa: BLE001 - the input runs, the result does not
            message = str(err).strip().splitlines()
            return ("build", f"on {label} inputs (seed {seed}) the result does not run: "
                             f"{type(err).__name__}: {message[0] if message else ''}",
                    (None, None))
        verdict = judge(reference, got, rtol, atol)
        if verdict.verdict == "fail":
            return ("mismatch", f"on {label} inputs (seed {seed}): max abs error "
                                f"{verdict.max_abs_error:.3g}, max rel error "
                                f"{verdict.max_rel_error:.3g} (rtol {rtol:.3g}, atol "
                                f"{atol:.3g} times the output's root mean square): "
                                f"{verdict.reason}",
                    (verdict.max_abs_error, verdict.max_rel_error))
    return None


def _failed(outcome: Outcome, kind: str, error: str) -> Outcome:
    return Outcome(outcome.result, kind, error, outcome.changed, outcome.max_abs_error,
                   outcome.max_rel_error, outcome.seconds)


def narrowest_float_dtype(mod: tvm.IRModule, func_name: str = "main") -> str | None:
    """The floating dtype with the coarsest rounding among a function's inputs, outputs
    and tensor constants (``None``: no floating tensor at all).

    It bounds how exactly any rewrite can reproduce the function's numbers, so it is the
    dtype whose tolerance applies (a float16 weight folded for a float32 result rounds
    in float16).
    """
    func = mod[func_name]
    dtypes = [C.dtype_of(p.ty) for p in func.params]
    dtypes += [C.dtype_of(ty) for ty in _tensor_types(func.ret_ty)]

    def visit(expr):
        if isinstance(expr, tvm.ir.GenericConst):
            dtypes.append(C.dtype_of(expr.ty))

    relax.analysis.post_order_visit(func.body, visit)
    return coarsest_float(dtypes)


def _tensor_types(ty: Any) -> list:
    if isinstance(ty, relax.TupleType):
        return [t for field in ty.fields for t in _tensor_types(field)]
    return [ty]
