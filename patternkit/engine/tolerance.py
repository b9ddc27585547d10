"""How far a rule's result may drift from its input on llvm, per dtype, and why.

A rewrite that reorders arithmetic (folding a batch norm into conv weights, collapsing an
elementwise chain into ``nn.batch_norm``) rounds differently from the code it replaces,
and how much depends on the dtype: what is one rounding in ``float32`` is ten thousand
times larger in ``bfloat16``.  So a rule states its tolerance *per dtype*
(:meth:`patternkit.Rule.tolerance`), and verification (the rule contract, ``patternkit
verify``) holds it to that.

:func:`default_tolerance` is what a rule gets unless it says otherwise: exact for
integer and boolean results and for composites (they only move bindings), and for
floating point ``rtol = atol = max(1e-5, 8 * eps(dtype))``: eight roundings of the dtype
(``float16``: 7.8e-3, ``bfloat16``: 6.3e-2), and never tighter than the 1e-5 the
library's float32 rules have always been held to.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.dtypes import machine_epsilon

__all__ = ["Tolerance", "EXACT", "default_tolerance"]

#: The floor of a floating-point tolerance: what float32 rewrites have been held to.
FLOAT_FLOOR = 1e-5

#: Roundings a rewrite may add to a floating-point result before it counts as wrong.
ROUNDINGS = 8


@dataclass(frozen=True)
class Tolerance:
    """How far a result may drift from the reference on llvm, and why.

    ``why`` is required: a tolerance nobody can explain is a tolerance nobody can tighten.
    Values are compared as ``numpy.allclose`` does: ``|got - ref| <= atol + rtol * |ref|``.
    """

    rtol: float
    atol: float
    why: str

    def __post_init__(self) -> None:
        if self.rtol < 0 or self.atol < 0:
            raise ValueError(f"tolerances are non-negative, found rtol={self.rtol}, "
                             f"atol={self.atol}")
        if not self.why.strip():
            raise ValueError("say why the tolerance is what it is (Tolerance.why)")

    @property
    def exact(self) -> bool:
        """Does the rule promise bit-identical results (both tolerances zero)?"""
        return self.rtol == 0 and self.atol == 0

    def __str__(self) -> str:
        return "exact" if self.exact else f"rtol={self.rtol:.3g}, atol={self.atol:.3g}"


#: For transforms that only move bindings (composites, partitions): bit-identical results.
EXACT = Tolerance(0.0, 0.0, "only the structure changes: the same operators run on the "
                            "same values, so the results are bit-identical")


def default_tolerance(dtype: str | None) -> Tolerance:
    """The tolerance a rewrite rule has unless it states its own; see the module docstring."""
    if dtype is None:
        return Tolerance(FLOAT_FLOOR, FLOAT_FLOOR, "dtype unknown: the float32 default")
    eps = machine_epsilon(dtype)
    if eps is None:
        return Tolerance(0.0, 0.0, f"{dtype} arithmetic is exact: a rewrite of it must "
                                   f"give the same values")
    tol = max(FLOAT_FLOOR, ROUNDINGS * eps)
    return Tolerance(tol, tol, f"default for {dtype}: {ROUNDINGS} roundings (eps {eps:.3g}), "
                               f"at least {FLOAT_FLOOR:g}")
