"""The group-norm family's example modules: what its rules' ``example()`` build, and the tests
reuse.

:func:`written_out_group_norm` is a group norm as a model writes it by hand and the torch
importer emits it (``reshape`` to groups, a layer norm over each group, ``reshape``
back, the per-channel affine); :func:`group_norm_call` is ``R.nn.group_norm`` itself,
optionally followed by a SiLU (the composites' example).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from patternkit.engine import NoSuchExample

from ..layernorm.guards import NORM_IN_FLOAT32


def _batch(batch: int | str) -> Any:
    return tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch


def written_out_group_norm(groups: int = 4, channels: int = 8, dtype: str = "float32",
                           batch: int | str = 2, spatial: int = 2, inner: str = "ones",
                           grouping: str = "groups", affine_axis: str = "channel",
                           back: str = "input", seed: int = 0,
                           norm_dtype: str | None = None) -> tvm.IRModule:
    """``reshape(x, (N, G, -1)) -> layer_norm over the last axis -> reshape(x.shape)
    -> * w.reshape(1, C, 1, 1) + b.reshape(1, C, 1, 1)``, constants seeded.

    Parameters
    ----------
    groups, channels : int
        ``G`` and ``C`` of ``x: (N, C, 4[, 4])``.
    dtype : str
        Of ``x`` and the affine constants.  The inner norm of a bfloat16 ``x`` runs in
        float32 between casts (what ``layernorm.collapse`` makes of it: TVM has no
        bfloat16 layer_norm), its constants float32.
    batch : int or str
        ``N``; a string is a symbolic dimension.
    spatial : {1, 2}
        Spatial axes of ``x``.
    inner : {"ones", "constant", "learned", "instance", "instance_learned"}
        The layer norm's own gamma and beta: ``R.ones`` / ``R.zeros`` (what
        ``layernorm.collapse`` gives a hand-written group norm), constants of ones and
        zeros (``F.layer_norm`` without weights, as the torch importer writes it), or
        (an edge) learned values per position of the group.  ``"instance"``: the ONNX
        form instead, ``R.nn.instance_norm(channel_axis=1, axes=[2])`` over the groups
        with ``(G,)`` ones and zeros reshaped to ``(G, 1)`` and back (what
        ``instancenorm.collapse`` makes of ``InstanceNormalization`` as TVM imports it);
        ``"instance_learned"`` (an edge): that form with learned per-group values.
    grouping : {"groups", "channels_last"}
        ``"channels_last"`` (an edge): ``x`` is ``(N, 4, 4, C)`` and reshaped to
        ``(N, G, -1)``, which groups positions, not channels.
    affine_axis : {"channel", "last"}
        Axis the affine parameters vary along (``"last"``, an edge, needs ``C == 4``).
    back : {"input", "other"}
        The second reshape's target: ``x``'s shape, or (an edge) ``(N, C, 16)``, the
        spatial axes flattened.
    seed : int
        Seed of the constants.
    norm_dtype : str, optional
        (an edge) the dtype the inner norm runs in between casts, for another ``dtype``.
    """
    if back == "other" and grouping == "channels_last":
        raise NoSuchExample("back='other' reshapes a channels-first x")
    if back == "other" and spatial == 1:
        raise NoSuchExample("back='other' flattens two spatial axes (spatial=2)")
    if affine_axis == "last" and channels != 4:
        raise NoSuchExample("affine_axis='last' needs channels == 4 (the width)")
    rng = np.random.default_rng(seed)
    n = _batch(batch)
    rest = (4,) * spatial
    shape = (n, *rest, channels) if grouping == "channels_last" else (n, channels, *rest)
    x = relax.Var("x", relax.TensorType(shape, dtype))
    size = channels * 4 ** spatial // groups

    inner_dtype = norm_dtype or ("float32" if dtype in NORM_IN_FLOAT32 else dtype)

    def const(values, of=dtype):
        return relax.const(np.asarray(values, dtype="float32"), of)

    def inner_const(values):
        return const(values, inner_dtype)

    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            grouped = bb.emit(relax.op.reshape(x, (n, groups, size)))
            if inner_dtype != dtype:
                grouped = bb.emit(relax.op.astype(grouped, inner_dtype))
            if inner.startswith("instance"):
                normed = bb.emit(_instance_norm_of_groups(bb, grouped, groups, inner_const,
                                                          learned=inner != "instance",
                                                          rng=rng))
            elif inner == "ones":
                gamma = bb.emit(relax.op.ones((size,), inner_dtype))
                beta = bb.emit(relax.op.zeros((size,), inner_dtype))
            elif inner == "constant":
                gamma, beta = inner_const(np.ones(size)), inner_const(np.zeros(size))
            else:
                gamma = inner_const(rng.uniform(0.5, 1.5, size))
                beta = inner_const(rng.standard_normal(size))
            if not inner.startswith("instance"):
                normed = bb.emit(relax.op.nn.layer_norm(grouped, gamma, beta, axes=[-1],
                                                        epsilon=1e-5))
            if inner_dtype != dtype:
                normed = bb.emit(relax.op.astype(normed, dtype))
            target = shape if back == "input" else (n, channels, 4 ** spatial)
            y = bb.emit(relax.op.reshape(normed, target))
            axis = 1 if affine_axis == "channel" and grouping == "groups" else len(target) - 1
            width = int(target[axis])
            param = [width if a == axis else 1 for a in range(len(target))]
            scale = bb.emit(relax.op.reshape(const(rng.uniform(0.5, 1.5, width)), param))
            shift = bb.emit(relax.op.reshape(const(rng.standard_normal(width)), param))
            y = bb.emit(relax.op.add(bb.emit(relax.op.multiply(y, scale)), shift))
            out = bb.emit_output(relax.op.nn.silu(y))
        bb.emit_func_output(out)
    return bb.get()


def _instance_norm_of_groups(bb: relax.BlockBuilder, grouped: Any, groups: int, const: Any,
                             learned: bool, rng: np.random.Generator) -> Any:
    """``R.nn.instance_norm`` of ``grouped: (N, G, K)`` over its last axis, the groups its
    channels, gamma and beta ``(G,)`` constants reshaped to ``(G, 1)`` and back as TVM's
    ONNX importer leaves them; ones and zeros unless ``learned``.
    """
    gamma = rng.uniform(0.5, 1.5, groups) if learned else np.ones(groups)
    beta = rng.standard_normal(groups) if learned else np.zeros(groups)
    params = [bb.emit(relax.op.reshape(bb.emit(relax.op.reshape(const(v), (groups, 1))),
                                       (groups,))) for v in (gamma, beta)]
    return relax.op.nn.instance_norm(grouped, *params, channel_axis=1, axes=[2],
                                     epsilon=1e-5)


def group_norm_call(silu: bool = False, dtype: str = "float32", batch: int | str = 2,
                    groups: int = 4, seed: int = 0) -> tvm.IRModule:
    """``R.nn.group_norm`` of ``x: (N, 8, 4, 4)`` with seeded gamma and beta, then a SiLU
    when ``silu``.
    """
    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((_batch(batch), 8, 4, 4), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.group_norm(
                x, relax.const(rng.uniform(0.5, 1.5, 8).astype(dtype)),
                relax.const(rng.standard_normal(8).astype(dtype)), num_groups=groups,
                channel_axis=1, axes=[2, 3]))
            if silu:
                y = bb.emit(relax.op.nn.silu(y))
            out = bb.emit_output(relax.op.add(y, y))
        bb.emit_func_output(out)
    return bb.get()
