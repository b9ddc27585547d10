"""Mish with its softplus computed in float32 between casts: how torch.export writes a
float16 / bfloat16 ``x * tanh(F.softplus(x))``.

torch computes a half-precision ``softplus`` in float32, so the torch importer writes::

    s = astype(nn.softplus(astype(x, "float32")), "float16")
    y = x * tanh(s)

The ``mish`` composite (``patterns/activation``) takes this form besides the by-example
spellings (a by-example spelling keeps a cast's dtype as traced, so it cannot say "back
to ``x``'s dtype").  :func:`upcast_mish` is the pattern, :func:`upcast_refusal` its guard:
the casts are a round trip through a float at least as wide as ``x``'s dtype, and the
softplus is ``R.nn.softplus``'s default (beta 1, threshold 20), the one in Mish.
"""

from __future__ import annotations

from typing import Any

from patternkit.dpl import DFPattern, is_op, wildcard
from patternkit.engine import RoleMatch, reject
from patternkit.ir import round_trips_wider, type_of


def upcast_mish() -> tuple[DFPattern, dict[str, DFPattern]]:
    """``x * tanh(astype(nn.softplus(astype(x))))`` and its roles (``upcast_x``,
    ``upcast_softplus``, ``upcast_back``).
    """
    x = wildcard()
    softplus = is_op("nn.softplus")(is_op("astype")(x))
    back = is_op("astype")(softplus)
    roles = {"upcast_x": x, "upcast_softplus": softplus, "upcast_back": back}
    return is_op("multiply")(x, is_op("tanh")(back)), roles


def upcast_refusal(match: RoleMatch) -> Any:
    """``None`` when the softplus is Mish's and its casts a widening round trip, else the
    refusal (reason and expression).
    """
    softplus = match.upcast_softplus
    beta, threshold = float(softplus.attrs.beta), float(softplus.attrs.threshold)
    if (beta, threshold) != (1.0, 20.0):
        return reject(f"the softplus has beta {beta:g} and threshold {threshold:g}: Mish's is "
                      f"the default softplus (beta 1, threshold 20)", at=softplus)
    of_x = str(type_of(match.upcast_x).dtype)
    inner = str(type_of(match.var_of("upcast_softplus")).dtype)
    back = str(type_of(match.var_of("upcast_back")).dtype)
    if round_trips_wider(of_x, inner, back):
        return None
    return reject(f"the softplus computes in {inner} on a {of_x} x and is cast to {back}: "
                  f"only a round trip through a float as wide or wider is Mish in x's dtype",
                  at=softplus)
