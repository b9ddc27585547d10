"""Translate between Relay operator names and Relax operator names.

Relay users write ``is_op("nn.conv2d")`` and expect ``PartitionedFromPattern`` strings
such as ``"nn.conv2d_add_nn.relu_"``.  Relax registers the same operators as
``relax.nn.conv2d`` and ``relax.add``, and renamed a few (``leaky_relu`` became
``leakyrelu``, ``concatenate`` became ``concat``, ``cast`` became ``astype``).
"""

from __future__ import annotations

import difflib
from functools import lru_cache

import tvm

from ..errors import PatternError

#: Relay names whose Relax operator is spelled differently.
RELAY_TO_RELAX = {
    "nn.leaky_relu": "relax.nn.leakyrelu",
    "concatenate": "relax.concat",
    "cast": "relax.astype",
    "transpose": "relax.permute_dims",
}
RELAX_TO_RELAY = {relax_name: relay for relay, relax_name in RELAY_TO_RELAX.items()
                  if relay != "transpose"}

#: Relay operators with no one-to-one Relax operator, and what to write instead.
NO_RELAX_EQUIVALENT = {
    "nn.bias_add": "relax.add with a bias reshaped to broadcast, e.g. is_op('add')(x, wildcard())",
    "nn.dense": "relax.matmul(x, relax.permute_dims(w)), "
                "e.g. is_op('matmul')(x, is_op('permute_dims')(w))",
    "nn.global_avg_pool2d": "relax.nn.adaptive_avg_pool2d with output_size=[1, 1], e.g. "
                            "is_op('nn.adaptive_avg_pool2d')(x)",
    "nn.upsampling": "relax.image.resize2d, e.g. is_op('image.resize2d')(x, wildcard())",
    # Relay's batch_matmul transposed its second operand unless told not to
    # (transpose_b=True); relax.matmul never does, so the same name would read the other
    # layout in a ported rule
    "nn.batch_matmul": "relax.matmul, which batches over the leading axes and never "
                       "transposes (Relay's batch_matmul took y transposed by default), e.g. "
                       "is_op('matmul')(x, is_op('permute_dims')(y)) for transpose_b=True",
}


@lru_cache(maxsize=None)
def _registered_ops() -> tuple[str, ...]:
    return tuple(sorted(tvm.ir.Op.list_op_names()))


def relax_op_name(name: str) -> str:
    """The registered Relax operator name for a Relay or Relax spelling.

    >>> relax_op_name("nn.conv2d")
    'relax.nn.conv2d'
    """
    if not isinstance(name, str) or not name:
        raise PatternError(f"an operator name must be a non-empty string, got {name!r}")
    if name in NO_RELAX_EQUIVALENT:
        raise PatternError(f"Relay operator {name!r} has no Relax equivalent; use "
                           f"{NO_RELAX_EQUIVALENT[name]}")
    candidate = RELAY_TO_RELAX.get(name, name if name.startswith("relax.") else "relax." + name)
    registered = _registered_ops()
    if candidate not in registered:
        close = difflib.get_close_matches(candidate, registered, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise PatternError(f"unknown operator {name!r} (looked for {candidate!r}){hint}")
    return candidate


def get_op(name: str) -> tvm.ir.Op:
    """The ``tvm.ir.Op`` of an operator named in Relay's or Relax's spelling."""
    return tvm.ir.Op.get(relax_op_name(name))


def relay_short_name(relax_name: str) -> str:
    """Relay's spelling of a Relax operator name: ``relax.nn.relu`` -> ``nn.relu``."""
    if relax_name in RELAX_TO_RELAY:
        return RELAX_TO_RELAY[relax_name]
    return relax_name[len("relax."):] if relax_name.startswith("relax.") else relax_name
