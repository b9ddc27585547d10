"""The gated-MLP family's example modules: what ``example()`` builds, and the tests reuse.

:func:`gated_mlp` writes ``act(x @ Wg) * (x @ Wu)`` followed by the down projection as
the torch importer writes a Llama / Gemma / T5 v1.1 MLP: each ``nn.Linear`` is a
``permute_dims`` of the ``(out, in)`` weight, a ``reshape`` of the 3-D input to 2-D, the
``matmul``, the bias ``add`` when there is one, and a ``reshape`` back.  With
``packed=True`` one linear of twice the width is ``split`` into the gate and up halves
(``torch.chunk(2, dim=-1)``), or cut by two ``strided_slice`` (``cut="slices"``: the
TorchScript ONNX exporter's ``Slice``).  Its knobs reach the composites' refusals.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.engine import NoSuchExample

#: The activation op of each gated-MLP kind, by its ``nn`` name.
ACTIVATION_OPS = {"silu": relax.op.nn.silu, "gelu": relax.op.nn.gelu,
                  "gelu_tanh": relax.op.nn.gelu_tanh}

HIDDEN, INTERMEDIATE = 16, 32


def gated_mlp(activation: str = "silu", packed: bool = False, bias: bool = False,
              dtype: str = "float32", shape: str = "batch_seq", order: str = "gate_first",
              weights: str = "transposed", halves: str = "gate_up", bias_shape: str = "feature",
              up_width: int = INTERMEDIATE, cut: str = "split", accumulate: str = "same",
              seed: int = 0) -> tvm.IRModule:
    """``down(act(x @ Wg [+ bg]) * (x @ Wu [+ bu]))`` with seeded constant weights.

    Parameters
    ----------
    activation : {"silu", "gelu", "gelu_tanh"}
    packed : bool
        One projection of width ``2 * INTERMEDIATE`` split in two along the last axis.
    bias : bool
        Each projection adds a bias (``add(bias, matmul)``, the importer's order).
    dtype, shape : str
        ``shape`` is ``"batch_seq"`` (symbolic ``(batch, seq, 16)``), ``"static"``
        ``(2, 5, 16)`` or ``"matrix"`` ``(5, 16)`` (no reshapes).
    order : {"gate_first", "up_first"}
        The multiply's operand order: ``act(g) * u`` or ``u * act(g)``.
    weights : {"transposed", "direct", "permuted_wrongly"}
        ``(out, in)`` weights through ``permute_dims`` (the importer's ``nn.Linear``),
        ``(in, out)`` weights read directly, or (a refusal's edge) a rank-3 weight whose
        ``permute_dims`` does not swap its last two axes.
    halves : {"gate_up", "up_gate", "same", "thirds"}
        For ``packed``: which split items are the gate and the up product; ``"same"``
        (a refusal's edge) multiplies the activation of a half by that same half,
        ``"thirds"`` splits in three parts of which the first two are used.
    bias_shape : {"feature", "full"}
        ``"full"`` (a refusal's edge) adds a tensor of the product's full shape.
    up_width : int
        The up projection's width; ``1`` (a refusal's edge) makes the multiply broadcast.
    cut : {"split", "slices", "mixed"}
        For ``packed``: the halves as items of one ``split``, as ``strided_slice`` of the
        last axis (``halves`` picks the parts alike), or (a refusal's edge) the gate an
        item of a split and the up product a slice.
    accumulate : {"same", "float32", "narrowed", "activation_in_float16"}
        ``"float32"``: torch.export of a float16 / bfloat16 MLP, each matmul accumulated in
        float32 (``out_dtype``) and cast back, the activation computed in float32 between
        casts.  Refusals' edges (on float32): ``"narrowed"`` casts the projections' products
        to float16 (the MLP then computes in float16), ``"activation_in_float16"`` computes
        the activation in float16 between casts.
    """
    if not packed and halves != "gate_up":
        raise NoSuchExample("halves= picks the items of a packed projection's split")
    if accumulate == "float32" and dtype == "float32":
        raise NoSuchExample("accumulate='float32' widens a float16 or bfloat16 MLP")
    if accumulate in ("narrowed", "activation_in_float16") and dtype != "float32":
        raise NoSuchExample(f"accumulate={accumulate!r} narrows a float32 MLP")
    if not packed and cut != "split":
        raise NoSuchExample("cut= is how a packed projection is cut in halves")
    if packed and up_width != INTERMEDIATE:
        raise NoSuchExample("up_width= is the width of a separate up projection")
    if not bias and bias_shape != "feature":
        raise NoSuchExample("bias_shape= shapes a bias; this example has none")
    if weights == "permuted_wrongly" and shape != "matrix":
        raise NoSuchExample("weights='permuted_wrongly' is written on a 2-D input")
    if bias_shape == "full" and shape == "batch_seq":
        raise NoSuchExample("bias_shape='full' is a constant of a static shape")
    rng = np.random.default_rng(seed)
    x = _input(dtype, shape)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if packed:
                parts = 3 if halves == "thirds" else 2
                both = _linear(bb, rng, x, parts * INTERMEDIATE, bias, weights, bias_shape,
                               accumulate)
                pick = {"gate_up": (0, 1), "up_gate": (1, 0), "same": (0, 0),
                        "thirds": (0, 1)}[halves]
                gate, up = _halves(bb, both, parts, pick, cut)
            else:
                gate = _linear(bb, rng, x, INTERMEDIATE, bias, weights, bias_shape, accumulate)
                up = _linear(bb, rng, x, up_width, bias, weights, bias_shape, accumulate)
            act = _activation(bb, activation, gate, accumulate)
            pair = (act, up) if order == "gate_first" else (up, act)
            hidden = bb.emit(relax.op.multiply(*pair))
            out = bb.emit_output(_linear(bb, rng, hidden, HIDDEN, False, "transposed", "feature"))
        bb.emit_func_output(out)
    return bb.get()


def _linear(bb: relax.BlockBuilder, rng: np.random.Generator, x: relax.Expr, features: int,
            bias: bool, weights: str, bias_shape: str, accumulate: str = "same") -> relax.Expr:
    """``x @ W [+ b]`` as the torch importer writes ``nn.Linear`` (reshapes on a 3-D ``x``),
    accumulated in float32 and cast back (``accumulate="float32"``) or cast to float16
    (``"narrowed"``).
    """
    dims = [d for d in x.ty.shape]
    dtype, inner = str(x.ty.dtype), int(dims[-1])
    scale = 1 / np.sqrt(inner)
    if weights == "permuted_wrongly":
        w = relax.const((rng.standard_normal((inner, 1, features)) * scale).astype(dtype))
        rhs = bb.emit(relax.op.permute_dims(w, [1, 0, 2]))
    elif weights == "transposed":
        w = relax.const((rng.standard_normal((features, inner)) * scale).astype(dtype))
        rhs = bb.emit(relax.op.permute_dims(w, [1, 0]))
    else:
        rhs = relax.const((rng.standard_normal((inner, features)) * scale).astype(dtype))
    flat = len(dims) > 2
    lhs = bb.emit(relax.op.reshape(x, (_product(dims[:-1]), inner))) if flat else x
    widened = accumulate == "float32"
    y = bb.emit(relax.op.matmul(lhs, rhs, out_dtype="float32" if widened else None))
    if bias:
        b_shape = (features,) if bias_shape == "feature" else tuple(int(d) for d in y.ty.shape)
        b = relax.const((rng.standard_normal(b_shape) * 0.5 + 0.25).astype(str(y.ty.dtype)))
        y = bb.emit(relax.op.add(b, y))
    if widened or accumulate == "narrowed":
        y = bb.emit(relax.op.astype(y, dtype if widened else "float16"))
    if flat:
        y = bb.emit(relax.op.reshape(y, (*dims[:-1], features)))
    return y


def _activation(bb: relax.BlockBuilder, activation: str, gate: relax.Expr,
                accumulate: str) -> relax.Expr:
    """The gate's activation, between casts to float32 (float16) and back for
    ``accumulate="float32"`` (``"activation_in_float16"``).
    """
    op = ACTIVATION_OPS[activation]
    inner = {"float32": "float32", "activation_in_float16": "float16"}.get(accumulate)
    if inner is None:
        return bb.emit(op(gate))
    act = bb.emit(op(bb.emit(relax.op.astype(gate, inner))))
    return bb.emit(relax.op.astype(act, str(gate.ty.dtype)))


def _halves(bb: relax.BlockBuilder, both: relax.Expr, parts: int, pick: tuple[int, int],
            cut: str) -> tuple[relax.Expr, relax.Expr]:
    """Parts ``pick`` of ``both`` cut in ``parts`` along the last axis, by ``cut``."""
    def item(index: int) -> relax.Expr:
        split = bb.emit(relax.op.split(both, parts, axis=-1))
        return bb.emit(relax.TupleGetItem(split, index))

    def sliced(index: int) -> relax.Expr:
        rank = len(both.ty.shape)
        return bb.emit(relax.op.strided_slice(
            both, axes=[rank - 1], begin=[index * INTERMEDIATE],
            end=[(index + 1) * INTERMEDIATE], strides=[1]))

    if cut == "split":
        split = bb.emit(relax.op.split(both, parts, axis=-1))
        return (bb.emit(relax.TupleGetItem(split, pick[0])),
                bb.emit(relax.TupleGetItem(split, pick[1])))
    if cut == "slices":
        return sliced(pick[0]), sliced(pick[1])
    return item(pick[0]), sliced(pick[1])


def _input(dtype: str, shape: str) -> relax.Var:
    dims = {"batch_seq": (tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64"), HIDDEN),
            "static": (2, 5, HIDDEN), "matrix": (5, HIDDEN)}[shape]
    return relax.Var("x", relax.TensorType(dims, dtype))


def _product(dims: Sequence[Any]) -> Any:
    out = dims[0]
    for d in dims[1:]:
        out = out * d
    return out
