"""Differential checks: run a transform on a module and judge what it gave back.

A transform is anything ``IRModule -> IRModule`` (a TVM pass, a ``Sequential``, a
patternkit rewrite, a user function).  :func:`apply_transform` runs it with a time limit
and turns what can go wrong with *it* into an :class:`Outcome` (it raised, it ran out of
time, it returned something that is not a module); :func:`judge_result` then checks what
it returned against the input: well formed, builds for llvm, and computes the same
numbers on seeded random inputs within a tolerance.  Nothing here knows about rules:
the fuzzing campaigns in :mod:`patternkit.testing.fuzz` build on it.

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

import tvm
from tvm import relax

from ..ir import compat as C
from ..ir.dtypes import coarsest_float
from . import numeric

__all__ = ["Outcome", "TransformTimeout", "apply_transform", "judge_result", "time_limit",
           "narrowest_float_dtype", "FAILURE_KINDS"]

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
                 seed: int = 0, input_options: dict | None = None) -> Outcome:
    """Check a changed result: well formed, builds, same numbers as ``before`` on llvm.

    The numbers are judged by :func:`~patternkit.verification.numeric.compare_outputs`:
    a draw on which ``before``'s outputs are no evidence is drawn again (:data:`DRAWS`
    seeds from ``seed``), and a result still unjudged after that is ``"inconclusive"``,
    a failure kind of its own: never a pass, and not a mismatch either.
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
    if comparison.inconclusive:
        return _failed(checked, "inconclusive", f"{comparison.reason} (seeds {seed} to "
                                                f"{seed + DRAWS - 1})")
    if not comparison.ok:
        return _failed(checked, "mismatch",
                       f"max abs error {comparison.max_abs_error:.3g}, max rel error "
                       f"{comparison.max_rel_error:.3g}, relative error as a whole "
                       f"{comparison.norm_error:.3g} (rtol {rtol:.3g}, atol {atol:.3g}): "
                       f"{comparison.reason}")
    return checked


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
