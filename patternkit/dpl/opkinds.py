"""Operator kinds (Relay's ``TOpPattern``): what ``has_attr({"TOpPattern": K})`` reads.

Relay registered a fusion kind on every operator (``kElemWise`` for ``relu``,
``kBroadcast`` for ``add``, ``kInjective`` for ``reshape`` ...), and dominator patterns
named their path by kind: ``wildcard().has_attr({"TOpPattern": K_ELEMWISE})(wildcard())``
is "any unary elementwise operator".  No Relax operator registers ``TOpPattern`` in TVM
0.27 (Relax derives kinds from the TIR after legalisation, in
``AnnotateTIROpPattern``), so such a pattern would never match.  :func:`op_kind` reads
the operator's own ``TOpPattern`` where TVM registers one, and otherwise the kind Relay
gave the same operator (:data:`STATIC_KINDS`, by Relax name).

The static kinds are Relay's, independent of shapes: binary arithmetic and comparisons
are ``K_BROADCAST`` even on equal shapes, unary math and activations ``K_ELEMWISE``,
reshapes, permutations, squeezes, slices and concatenations ``K_INJECTIVE``.  An
operator Relay did not have, or that has no fixed kind (``call_tir``, a packed call), has
no kind and matches none.
"""

from __future__ import annotations

from typing import Any

import tvm

from ..ir import compat as C

__all__ = ["K_ELEMWISE", "K_BROADCAST", "K_INJECTIVE", "K_COMM_REDUCE",
           "K_OUT_EWISE_FUSABLE", "K_TUPLE", "K_OPAQUE", "KIND_NAMES", "STATIC_KINDS",
           "TOP_PATTERN", "op_kind", "ops_of_kind"]

# The values of TVM's ``OpPatternKind`` (include/tvm/relax/op_attr_types.h).
K_ELEMWISE = 0
K_BROADCAST = 1
K_INJECTIVE = 2
K_COMM_REDUCE = 3
K_OUT_EWISE_FUSABLE = 4
K_TUPLE = 7
K_OPAQUE = 8

#: Kind value -> its name, for messages.
KIND_NAMES = {K_ELEMWISE: "K_ELEMWISE", K_BROADCAST: "K_BROADCAST", K_INJECTIVE: "K_INJECTIVE",
              K_COMM_REDUCE: "K_COMM_REDUCE", K_OUT_EWISE_FUSABLE: "K_OUT_EWISE_FUSABLE",
              K_TUPLE: "K_TUPLE", K_OPAQUE: "K_OPAQUE"}

#: The attribute name Relay's patterns use.
TOP_PATTERN = "TOpPattern"

_ELEMWISE = """
    abs acos acosh asin asinh atan atanh ceil cos cosh erf exp floor log negative round
    rsqrt sigmoid sign sin sinh sqrt square tan tanh trunc isfinite isinf isnan
    logical_not bitwise_not clip astype zeros_like ones_like full_like zeros ones full
    nn.relu nn.leakyrelu nn.gelu nn.gelu_tanh nn.silu nn.selu nn.softplus tril triu
"""
_BROADCAST = """
    add subtract multiply divide floor_divide mod floor_mod power maximum minimum atan2
    log_add_exp equal not_equal less less_equal greater greater_equal logical_and logical_or
    logical_xor bitwise_and bitwise_or bitwise_xor left_shift right_shift where broadcast_to
    expand_dims nn.prelu
"""
_INJECTIVE = """
    reshape permute_dims squeeze flatten nn.batch_flatten concat split stack strided_slice
    dynamic_strided_slice take flip tile repeat layout_transform gather_elements gather_nd
    nn.pad nn.pixel_shuffle reverse_sequence image.resize2d
"""
_COMM_REDUCE = """
    sum mean max min prod variance std argmax argmin collapse_sum_like collapse_sum_to
"""
_OUT_EWISE_FUSABLE = """
    matmul nn.conv1d nn.conv2d nn.conv3d nn.conv1d_transpose nn.conv2d_transpose
    nn.conv3d_transpose nn.max_pool1d nn.max_pool2d nn.max_pool3d nn.avg_pool1d nn.avg_pool2d
    nn.avg_pool3d nn.adaptive_avg_pool1d nn.adaptive_avg_pool2d nn.adaptive_avg_pool3d
    one_hot
"""
_OPAQUE = """
    nn.softmax nn.log_softmax nn.layer_norm nn.batch_norm nn.group_norm nn.instance_norm
    nn.rms_norm nn.dropout nn.attention sort argsort topk cumsum cumprod nonzero unique
    arange scatter_elements scatter_nd
"""

#: Relax operator name -> the kind Relay registered for it.
STATIC_KINDS: dict[str, int] = {
    f"relax.{name}": kind
    for kind, names in ((K_ELEMWISE, _ELEMWISE), (K_BROADCAST, _BROADCAST),
                        (K_INJECTIVE, _INJECTIVE), (K_COMM_REDUCE, _COMM_REDUCE),
                        (K_OUT_EWISE_FUSABLE, _OUT_EWISE_FUSABLE), (K_OPAQUE, _OPAQUE))
    for name in names.split()
}

_REGISTERED: dict[int, int | None] = {}  # Op handle -> registered TOpPattern (None: none)


def op_kind(op: Any) -> int | None:
    """The ``TOpPattern`` kind of an operator: TVM's registration, else Relay's static kind.

    ``None`` when neither knows the operator (or ``op`` is not an operator).
    """
    if not isinstance(op, tvm.ir.Op):
        return None
    key = C.handle(op)
    if key not in _REGISTERED:
        try:
            registered = op.get_attr(TOP_PATTERN)
        except C.TVM_ERRORS:  # "Attribute 'TOpPattern' is not registered" (all of 0.27)
            registered = None
        _REGISTERED[key] = None if registered is None else int(registered)
    registered = _REGISTERED[key]
    if registered is not None:
        return registered
    return STATIC_KINDS.get(C.op_info(op)[0])


def ops_of_kind(kind: int) -> tuple[str, ...]:
    """Relax operator names of ``kind``, sorted (for ``to_dpl`` and messages)."""
    return tuple(sorted(name for name in tvm.ir.Op.list_op_names()
                        if name.startswith("relax.")
                        and op_kind(tvm.ir.Op.get(name)) == kind))
