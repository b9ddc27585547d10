"""The rope family's example modules: what ``example()`` builds, and the tests reuse.

:func:`rotary` rotates a query ``(batch, heads, seq, 8)`` as the torch importer writes
Llama's ``q * cos + rotate_half(q) * sin`` (or GPT-J's interleaved rotation), with the
tables given as inputs, as constants, or computed from the positions and ``inv_freq``;
its knobs reach the composites' refusals.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from patternkit.engine import NoSuchExample

HEADS, LANES, SEQ = 2, 8, 6
_OPEN = 2**63 - 1  # torch's x[..., h:] as the importer writes it


def rotary(interleaved: bool = False, dtype: str = "float32", symbolic: bool = True,
           tables: str = "inputs", order: str = "x_first", halves: str = "rotation",
           concat_axis: int = -1, table_shape: str = "per_position",
           rotary_dim: int | None = None, passed: str = "rest",
           rotations: int = 1) -> tvm.IRModule:
    """``x * cos + rotate(x) * sin`` of ``x`` shaped ``(batch, HEADS, seq, LANES)``.

    Parameters
    ----------
    interleaved : bool
        GPT-J's rotation of even/odd lane pairs instead of Llama's halves.
    dtype, symbolic : str, bool
        ``symbolic``: batch and sequence are symbolic (else ``(2, HEADS, SEQ, LANES)``).
    tables : {"inputs", "computed", "constants", "not_cos", "ranged", "ranged_over_batch", \
"ranged_through_float16"}
        ``cos`` / ``sin`` given as ``(1, 1, seq, LANES)`` inputs, computed as
        ``cos(positions * inv_freq)`` (the frequencies repeated for the pairs), or
        constants (static shapes only); ``"not_cos"`` (a refusal's edge): constant
        tables, the one beside ``x`` ``tanh`` of the angles instead of their cosine.
        ``"ranged"``: computed ``(range_len_0, LANES)`` tables of the positions
        ``arange(x.shape[2])`` as ``from_onnx`` writes the dynamo exporter's float
        ``Range`` (:func:`_ranged_positions`: a length of its own, matched from a count
        computed at run time; the products with ``x`` then have unknown shapes);
        refusals' edges: the range over the batch instead (``"ranged_over_batch"``),
        or its count taken through ``float16`` (``"ranged_through_float16"``).
    rotations : {1, 2}
        ``2``: the result rotated again (as the spelling matrix chains two blocks), so
        that the second rotation's ``x`` has the first one's shape, unknown when the
        tables are ``"ranged"``.
    order : {"x_first", "rotated_first"}
        ``x * cos + rot * sin``, or ``rot * sin + cos * x``.
    halves : {"rotation", "swapped", "uneven"}
        Refusals' edges: the first half negated instead of the second (the even lanes,
        interleaved), or halves of 3 and 5 lanes.
    concat_axis : {-1, -2}
        ``-2`` (a refusal's edge, static shapes): halves of the sequence axis instead.
    table_shape : {"per_position", "per_head_mismatch"}
        ``"per_head_mismatch"`` (a refusal's edge): ``sin`` has one row per head, ``cos``
        one for all.
    rotary_dim : int, optional
        Rotate only lanes ``[0, rotary_dim)`` of ``x`` and concatenate the others back
        (Phi, NeoX ``rotary_pct``); the tables then have ``rotary_dim`` lanes.
    passed : {"rest", "overlapping"}
        ``"overlapping"`` (a refusal's edge): the lanes passed through start one lane early.
    """
    if rotary_dim is None and passed != "rest":
        raise NoSuchExample("passed= is the lanes a partial rotation passes through")
    if interleaved and (halves == "uneven" or concat_axis != -1):
        raise NoSuchExample("the interleaved form pairs lanes 2k and 2k + 1 of the last axis")
    if (tables in ("constants", "not_cos") or concat_axis != -1) and symbolic:
        raise NoSuchExample("constant tables and a sequence cut in halves need static shapes")
    if table_shape != "per_position" and tables != "inputs":
        raise NoSuchExample("table_shape= shapes input tables")
    if tables.startswith("ranged") and not symbolic:
        raise NoSuchExample("from_onnx writes a range of its own length for a symbolic one")
    if rotations != 1 and (rotary_dim is not None or not tables.startswith("ranged")):
        raise NoSuchExample("rotations=2 chains the half or interleaved rotation of ranged "
                            "tables")
    batch, seq = ((tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64"))
                  if symbolic else (2, SEQ))
    x = relax.Var("x", relax.TensorType((batch, HEADS, seq, LANES), dtype))
    params = [x]
    rotated_lanes = LANES if rotary_dim is None else rotary_dim
    table_dims = (1, 1, seq, rotated_lanes)
    if tables == "inputs":
        cos = relax.Var("cos", relax.TensorType(table_dims, dtype))
        sin_heads = HEADS if table_shape == "per_head_mismatch" else 1
        sin = relax.Var("sin", relax.TensorType((1, sin_heads, seq, rotated_lanes), dtype))
        params += [cos, sin]
    elif tables == "computed":
        positions = relax.Var("positions", relax.TensorType((seq,), dtype))
        params.append(positions)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            if tables == "computed":
                cos, sin = _computed_tables(bb, positions, interleaved, dtype, rotated_lanes)
            elif tables.startswith("ranged"):
                limit = batch if tables == "ranged_over_batch" else seq
                count = "float16" if tables == "ranged_through_float16" else "float32"
                ranged = _ranged_positions(bb, limit, count)
                cos, sin = _computed_tables(bb, bb.emit(relax.op.astype(ranged, dtype)),
                                            interleaved, dtype, rotated_lanes, expand=False)
            elif tables in ("constants", "not_cos"):
                angles = _angles(np.arange(SEQ, dtype="float64"), interleaved, rotated_lanes)
                cosine = np.cos(angles) if tables == "constants" else np.tanh(angles)
                cos = relax.const(cosine.reshape(table_dims).astype(dtype))
                sin = relax.const(np.sin(angles).reshape(table_dims).astype(dtype))
            full = x
            if rotary_dim is not None:
                x = bb.emit(_slice(full, 3, 0, rotary_dim))
            out = x
            for _ in range(rotations):
                rotated = _rotate(bb, out, interleaved, halves, concat_axis, rotated_lanes,
                                  x.ty.shape)
                direct = bb.emit(relax.op.multiply(out, cos) if order == "x_first"
                                 else relax.op.multiply(cos, out))
                turned = bb.emit(relax.op.multiply(rotated, sin))
                pair = (direct, turned) if order == "x_first" else (turned, direct)
                out = bb.emit(relax.op.add(*pair))
            if rotary_dim is not None:
                start = rotary_dim - 1 if passed == "overlapping" else rotary_dim
                out = bb.emit(relax.op.concat([out, bb.emit(_slice(full, 3, start, _OPEN))],
                                              axis=-1))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def _inv_freq(lanes: int) -> np.ndarray:
    return 1.0 / (10000.0 ** (np.arange(0, lanes, 2, dtype="float64") / lanes))


def _angles(positions: np.ndarray, interleaved: bool, lanes: int) -> np.ndarray:
    freqs = np.outer(positions, _inv_freq(lanes))
    return np.repeat(freqs, 2, axis=-1) if interleaved else np.concatenate([freqs, freqs], -1)


def _ranged_positions(bb: relax.BlockBuilder, limit: object, count_dtype: str) -> relax.Expr:
    """``arange(limit)`` (float32) as ``from_onnx`` writes a float ``Range`` of a symbolic
    limit: the count ``max(ceil((limit - 0) / 1), 0)`` computed at run time in
    ``count_dtype`` (the importer's: ``float32``), matched to a length of its own.
    """
    f32 = "float32"
    limit_f = tvm.tirx.Cast("int64", tvm.tirx.Cast(f32, limit))
    start = bb.emit(relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([limit_f])), ()))
    span = bb.emit(relax.op.subtract(bb.emit(relax.op.astype(start, count_dtype)),
                                     relax.const(0.0, count_dtype)))
    steps = bb.emit(relax.op.divide(bb.emit(relax.op.astype(span, "float64")),
                                    relax.const(1.0, "float64")))
    count = bb.emit(relax.op.maximum(bb.emit(relax.op.ceil(steps)), relax.const(0.0, "float64")))
    count = bb.match_cast(relax.op.reshape(bb.emit(relax.op.astype(count, "int64")), (1,)),
                          relax.TensorType((1,), "int64"))
    length = tvm.tirx.Var("range_len_0", "int64")
    bb.match_cast(bb.emit(relax.op.tensor_to_shape(count)), relax.ShapeType([length]))
    return bb.emit(relax.op.astype(relax.op.arange(0, length, 1, "int64"), f32))


def _computed_tables(bb: relax.BlockBuilder, positions: relax.Expr, interleaved: bool,
                     dtype: str, lanes: int, expand: bool = True
                     ) -> tuple[relax.Expr, relax.Expr]:
    """``cos`` / ``sin`` of ``positions * inv_freq`` as HF's rotary embedding computes them
    (``expand``: shaped ``(1, 1, seq, lanes)``, else ``(seq, lanes)`` as the ONNX export's).
    """
    inv_freq = relax.const(_inv_freq(lanes).astype(dtype))
    freqs = bb.emit(relax.op.multiply(relax.op.expand_dims(positions, [-1]), inv_freq))
    if interleaved:
        pairs = [bb.emit(relax.op.expand_dims(freqs, [-1]))] * 2
        emb = bb.emit(relax.op.reshape(relax.op.concat(pairs, axis=-1),
                                       (freqs.ty.shape[0], lanes)))
    else:
        emb = bb.emit(relax.op.concat([freqs, freqs], axis=-1))
    cos, sin = bb.emit(relax.op.cos(emb)), bb.emit(relax.op.sin(emb))
    if not expand:
        return cos, sin
    return (bb.emit(relax.op.expand_dims(cos, [0, 1])),
            bb.emit(relax.op.expand_dims(sin, [0, 1])))


def _slice(x: relax.Expr, axis: int, begin: int, end: int, stride: int = 1) -> relax.Expr:
    return relax.op.strided_slice(x, axes=[axis], begin=[begin], end=[end], strides=[stride])


def _rotate(bb: relax.BlockBuilder, x: relax.Expr, interleaved: bool, halves: str,
            concat_axis: int, lanes: int, shape: relax.Expr) -> relax.Expr:
    """``rotate_half(x)`` (or GPT-J's pair rotation) as the torch importer writes it;
    ``shape`` is ``x``'s (the pairs are reshaped back to it).
    """
    if interleaved:
        even, odd = (bb.emit(_slice(x, 3, start, _OPEN, 2)) for start in (0, 1))
        first, second = (even, odd) if halves == "rotation" else (odd, even)
        parts = [bb.emit(relax.op.expand_dims(bb.emit(relax.op.negative(second)), [4])),
                 bb.emit(relax.op.expand_dims(first, [4]))]
        stacked = bb.emit(relax.op.concat(parts, axis=-1))
        return bb.emit(relax.op.reshape(stacked, shape))
    axis = 3 if concat_axis == -1 else 2
    width = lanes if concat_axis == -1 else SEQ
    half = 3 if halves == "uneven" else width // 2
    first, second = bb.emit(_slice(x, axis, 0, half)), bb.emit(_slice(x, axis, half, _OPEN))
    if halves == "swapped":
        return bb.emit(relax.op.concat([bb.emit(relax.op.negative(first)), second],
                                       axis=concat_axis))
    return bb.emit(relax.op.concat([bb.emit(relax.op.negative(second)), first], axis=concat_axis))


