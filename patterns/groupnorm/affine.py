"""What a group norm and an instance norm written out share: a unit inner norm, then a
per-channel affine step.

``groupnorm.collapse`` and ``instancenorm.collapse`` both match an inner norm whose gamma
and beta are ones and zeros (``R.ones`` / ``R.zeros`` or constants, as
``layernorm.collapse`` and the importers write them), possibly run wider between casts,
followed by ``multiply(scale)`` and ``add(shift)`` per channel.  The pattern pieces and
guards here are the ones both rules apply, with the same reasons, so the two rules cannot
drift apart.  Each guard raises :func:`~patternkit.engine.reject` with the reason and the
expression it is about.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from patternkit.dpl import DFPattern, alt, is_constant, is_op, wildcard
from patternkit.engine import RoleMatch, reject
from patternkit.ir import (
    NotPerChannel,
    const_value,
    dtype_of,
    per_channel_axis,
    round_trips_wider,
    static_shape,
    type_of,
)

__all__ = ["UnitParams", "unit_params", "shape_text", "check_unit_params",
           "check_exact_narrowing", "check_per_channel_affine"]


class UnitParams(NamedTuple):
    """The inner norm's gamma and beta patterns, and the constants they may be."""

    gamma: DFPattern
    beta: DFPattern
    constant_gamma: DFPattern
    constant_beta: DFPattern


def unit_params() -> UnitParams:
    """The inner norm's gamma and beta as ``R.ones`` / ``R.zeros`` (tags ``gamma_form`` /
    ``beta_form`` ``filled``) or as constants (``constant``, whose values
    :func:`check_unit_params` checks).
    """
    constant_gamma, constant_beta = is_constant(), is_constant()
    return UnitParams(alt(tag="gamma_form", constant=constant_gamma,
                          filled=is_op("ones")(wildcard())),
                      alt(tag="beta_form", constant=constant_beta,
                          filled=is_op("zeros")(wildcard())),
                      constant_gamma, constant_beta)


def shape_text(shape: Any) -> str:
    """A shape as a refusal writes it: ``(2, 8, 4, 4)`` (``()`` when unknown)."""
    return "(" + ", ".join(str(d) for d in shape or ()) + ")"


def check_unit_params(match: RoleMatch, roles: tuple[str, str], op: str, norm: str) -> None:
    """Refuse an inner norm whose constant gamma is not all ones or beta not all zeros.

    ``roles``: the match's roles of the constant gamma and beta (absent when the norm
    takes ``R.ones`` / ``R.zeros``); ``op``: the inner norm's operator as a refusal names
    it; ``norm``: the norm the rule collapses to (``"a group norm"``).
    """
    for role, value, fill in zip(roles, ("gamma", "beta"), (1.0, 0.0)):
        if role in match and not np.all(const_value(match[role]) == fill):
            raise reject(f"the {op}'s {value} is not all {fill:g}: {norm} scales and shifts "
                         f"per channel only", at=match[role])


def check_exact_narrowing(narrowed: Any, wide: str | None, result: str) -> None:
    """Refuse a cast of the inner norm's ``wide`` result (``narrowed``) to a dtype that
    ``wide`` does not hold exactly: the affine step would run in another precision.

    ``result``: the norm's result as the refusal names it (``"the float32 norm's"``).
    """
    narrow = dtype_of(type_of(narrowed))
    if not round_trips_wider(narrow or "", wide or "", narrow or ""):
        raise reject(f"{result} result is cast to {narrow}, which {wide} does not hold "
                     f"exactly: the scale and shift would be applied in another precision",
                     at=narrowed)


def check_per_channel_affine(match: RoleMatch, x_shape: Any) -> None:
    """Refuse a ``scale`` or ``shift`` that does not vary along ``x``'s channel axis 1
    only (a full-tensor parameter, one along another axis).
    """
    for role in ("scale", "shift"):
        try:
            axis = per_channel_axis(static_shape(type_of(match[role])), x_shape,
                                    name=f"the {role}", of="x")
        except NotPerChannel as why:
            raise reject(str(why), at=match[role]) from None
        if axis != 1:
            raise reject(f"the {role} varies along axis {axis} of x {shape_text(x_shape)}, "
                         f"not along its channel axis 1", at=match[role])
