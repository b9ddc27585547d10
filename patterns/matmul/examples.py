"""The matmul family's example modules: what its rules' ``example()`` build, and the tests reuse.

:func:`mlp` is a two-layer MLP in a composite variant's form (as the torch importer
writes ``nn.Linear``, or one batched matmul), :func:`parallel_projections` a q/k/v-style
projection of one input (``matmul.combine_parallel``'s).  Their knobs reach the checks'
edges: bias shapes that are no per-feature bias, a matmul cast back from float32.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.engine import NoSuchExample
from patternkit.ir import dtype_of, static_shape, type_of

_RELAX_ACTIVATIONS = {"relu": relax.op.nn.relu, "gelu": relax.op.nn.gelu,
                      "gelu_tanh": relax.op.nn.gelu_tanh, "silu": relax.op.nn.silu}


class _Layer(NamedTuple):
    """How each layer of :func:`mlp` is written."""

    transposed: bool
    bias: bool
    activation: str | None
    frontend: str
    bias_shape: str
    accumulate: str | None


def mlp(transposed: bool = False, bias: bool = False, activation: str | None = None,
        dtype: str = "float32", shape: str = "batch_seq", frontend: str = "torch",
        bias_shape: str = "feature", accumulate: str | None = None,
        seed: int = 0) -> tvm.IRModule:
    """A two-layer MLP: ``layer2(layer1(x))``, each layer ``x @ W [+ b] [-> activation]``
    with seeded constant weights (variance 1/fan_in).

    ``transposed``: ``W`` is stored ``(out, in)`` and reaches the matmul through
    ``permute_dims``; ``bias``: a bias is added; ``activation``: one of ``relu``,
    ``gelu``, ``gelu_tanh``, ``silu`` follows, or none.  ``shape``: ``x`` is
    ``(batch, seq, 16)`` with symbolic ``batch`` and ``seq`` (``"batch_seq"``),
    ``(2, 8, 16)`` (``"static"``) or ``(8, 16)`` (``"matrix"``).
    ``frontend="torch"``: a layer on a 3-D ``x`` is ``reshape`` to 2-D, matmul, add,
    ``reshape`` back, then the activation (how the torch importer writes
    ``nn.Linear``); ``"direct"``: one batched matmul.  ``bias_shape``: ``"feature"``
    ``(N,)``, ``"row"`` ``(1, N)``, or edges the check refuses: ``"scalar"`` ``(1,)``
    (one value, not one per feature) and ``"residual"`` (the layer's input added back,
    a tensor of the output's shape).  ``accumulate="cast_back"``: each matmul
    accumulates in float32 and is cast straight back to ``dtype`` (float16), as TVM's
    ``ToMixedPrecision`` and patternkit's float16 torch import write it.
    """
    if accumulate == "cast_back" and dtype == "float32":
        raise NoSuchExample("accumulate='cast_back' accumulates a float16 matmul")
    rng = np.random.default_rng(seed)
    x = _input(dtype, shape)
    form = _Layer(transposed, bias, activation, frontend, bias_shape, accumulate)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = _layer(bb, rng, x, 16, form)
            out = bb.emit_output(_layer(bb, rng, h, 16, form))
        bb.emit_func_output(out)
    return bb.get()


def _layer(bb: relax.BlockBuilder, rng: np.random.Generator, x: relax.Expr, features: int,
           form: _Layer) -> relax.Expr:
    dtype = dtype_of(type_of(x))
    dims = static_shape(type_of(x))
    assert dims is not None  # the example builders give x a shape
    inner = dims[-1]
    weight_shape = (features, inner) if form.transposed else (inner, features)
    weight = relax.const((rng.standard_normal(weight_shape) / np.sqrt(inner)).astype(dtype))
    rhs = bb.emit(relax.op.permute_dims(weight, [1, 0])) if form.transposed else weight
    flat = len(dims) > 2 and form.frontend == "torch"
    lhs = bb.emit(relax.op.reshape(x, (_product(dims[:-1]), inner))) if flat else x
    if form.accumulate == "cast_back":
        y = bb.emit(relax.op.astype(bb.emit(relax.op.matmul(lhs, rhs, out_dtype="float32")),
                                    dtype))
    else:
        y = bb.emit(relax.op.matmul(lhs, rhs))
    if form.bias:
        if form.bias_shape == "residual":  # the layer's input: a tensor of the output's shape
            bias = lhs
        else:
            b_shape = {"feature": (features,), "row": (1, features),
                       "scalar": (1,)}[form.bias_shape]
            bias = relax.const((rng.standard_normal(b_shape) * 0.5 + 0.25).astype(dtype))
        y = bb.emit(relax.op.add(bias, y))  # the torch importer's operand order
    if flat:
        y = bb.emit(relax.op.reshape(y, (*dims[:-1], features)))
    if form.activation is not None:
        y = bb.emit(_RELAX_ACTIVATIONS[form.activation](y))
    return y


def _input(dtype: str, shape: str) -> relax.Var:
    dims = {"batch_seq": (tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64"), 16),
            "static": (2, 8, 16), "matrix": (8, 16)}[shape]
    return relax.Var("x", relax.TensorType(dims, dtype))


def _product(dims: Sequence[Any]) -> Any:
    out = dims[0]
    for d in dims[1:]:
        out = out * d
    return out


def parallel_projections(branches: int = 3, bias: bool = False, dtype: str = "float32",
                         seed: int = 0, reshaped: bool = False,
                         shapes: Sequence[tuple[int, ...]] | None = None) -> tvm.IRModule:
    """A q/k/v-style projection: ``branches`` matmuls of one input, seeded constants.

    ``reshaped``: each matmul reads its own ``reshape(x, (8, 8))`` (the torch importer's
    ``nn.Linear`` on a 3-D input), or ``reshape(x, shapes[i])`` where ``shapes`` is given
    (an edge: reshapes to different shapes).
    """
    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((2, 4, 8), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for i in range(branches):
                shape = (8, 8) if shapes is None else shapes[i]
                left = bb.emit(relax.op.reshape(x, shape)) if reshaped else x
                width = shape[-1] if reshaped else 8
                w = relax.const(rng.standard_normal((width, 4 + i)).astype(dtype))
                y = bb.emit(relax.op.matmul(left, w))
                if bias:
                    y = bb.emit(relax.op.add(y, relax.const(
                        rng.standard_normal((4 + i,)).astype(dtype))))
                outs.append(y)
            out = bb.emit_output(relax.op.concat(outs, axis=-1) if shapes is None
                                 else relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def linear_batch_norm(form: str = "levit", transposed: bool = True, bias: str = "none",
                      training: bool = False, bn_axis: str = "feature", reshape: str = "keep",
                      dtype: str = "float32", accumulate: str = "same", batch: int | str = 2,
                      seed: int = 0) -> tvm.IRModule:
    """A linear layer and an inference batch norm over its features, as the torch importer
    writes ``BatchNorm1d`` after ``nn.Linear`` (``matmul.fold_batchnorm``'s example).

    Parameters
    ----------
    form : {"levit", "flat", "batched", "batched_widened"}
        ``"levit"``: LeViT's ``LinearNorm`` on ``x: (batch, 5, 16)``: ``reshape`` to 2-D,
        matmul, ``reshape`` back to 3-D, ``reshape`` to 2-D again for the batch norm
        (``flatten(0, 1)``), the batch norm, ``reshape`` back.  ``"flat"``: ``x: (batch,
        16)``, matmul, the batch norm (a classifier head's ``BatchNorm1d``).
        ``"batched"``: as ``"levit"`` but the matmul batched, of ``broadcast_to(x)`` and the
        weight ``broadcast_to`` ``(batch, 16, 8)`` (LeViT's attention subsample through the
        torch importer); ``"batched_widened"`` (an edge): the weight is ``(16, 1)``, its one
        output feature broadcast to 8.
    transposed : bool
        The weight is stored ``(out, in)`` and reaches the matmul through ``permute_dims``
        (``nn.Linear``).
    bias : {"none", "feature", "feature_first", "scalar", "full"}
        A constant added to the product: per feature ``(8,)``, in the importer's order
        ``add(bias, matmul)`` (``"feature_first"``), one value ``(1,)``, or, an edge the
        check refuses, a tensor of the product's shape (``"full"``, static batch only).
    training : bool
        The batch norm's ``training`` flag.
    bn_axis : {"feature", "rows"}
        The batch norm's axis: the features, or (an edge) the rows of an ``(8, 8)``
        product (``form="flat"`` with 8 rows).
    reshape : {"keep", "regroup"}
        ``"regroup"`` (``form="levit"``): the last reshape before the batch norm regroups
        the ``(5 * batch, 8)`` product as ``(.., 4)`` rows, so the normalised axis no
        longer holds the matmul's features (an edge).
    dtype : {"float32", "float16", "bfloat16"}
        Of ``x``, the weight and the batch norm.
    accumulate : {"same", "cast_back"}
        ``"cast_back"``: the matmul accumulates in float32 and is cast straight back to
        ``dtype`` (``ToMixedPrecision``'s float16).
    batch : int or str
        The batch dimension; a string is a symbolic one.
    seed : int
        Seed of the constants.
    """
    if accumulate == "cast_back" and dtype == "float32":
        raise NoSuchExample("accumulate='cast_back' accumulates a low-precision matmul")
    if reshape == "regroup" and form not in ("levit", "batched"):
        raise NoSuchExample("reshape='regroup' regroups the reshapes of form='levit'")
    if bn_axis == "rows" and form != "flat":
        raise NoSuchExample("bn_axis='rows' normalises the rows of form='flat'")
    if form == "batched_widened" and transposed:
        raise NoSuchExample("form='batched_widened' broadcasts an (in, 1) weight (untransposed)")
    if bias == "full" and isinstance(batch, str):
        raise NoSuchExample("bias='full' needs a static batch to be a constant")
    rng = np.random.default_rng(seed)
    n: Any = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
    if bn_axis == "rows":
        n = 8  # the rows equal the features, so a batch norm over them type-checks
    inner, features, seq = 16, 8, 5
    batched = form.startswith("batched")
    x = relax.Var("x", relax.TensorType((n, inner) if form == "flat" else (n, seq, inner),
                                        dtype))

    def const(values, as_dtype=dtype):
        return relax.const(np.asarray(values, dtype="float32").astype(as_dtype))

    weight = rng.standard_normal((features, inner) if transposed else
                                 (inner, 1 if form == "batched_widened" else features))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            lhs = bb.emit(relax.op.reshape(x, (n * seq, inner))) if form == "levit" else x
            rhs = const(weight / np.sqrt(inner))
            if transposed:
                rhs = bb.emit(relax.op.permute_dims(rhs, [1, 0]))
            if batched:
                lhs = bb.emit(relax.op.broadcast_to(x, (n, seq, inner)))
                rhs = bb.emit(relax.op.broadcast_to(rhs, (n, inner, features)))
            y = bb.emit(relax.op.matmul(lhs, rhs, out_dtype="float32"
                                        if accumulate == "cast_back" else None))
            if accumulate == "cast_back":
                y = bb.emit(relax.op.astype(y, dtype))
            if bias != "none":
                shape = (tuple(int(d) for d in y.ty.shape) if bias == "full" else
                         {"feature": (features,), "feature_first": (features,),
                          "scalar": (1,)}[bias])
                b = const(rng.standard_normal(shape))
                y = bb.emit(relax.op.add(b, y) if bias == "feature_first"
                            else relax.op.add(y, b))
            if form != "flat":
                y = bb.emit(relax.op.reshape(y, (n, seq, features)))
                rows = (n * seq * 2, features // 2) if reshape == "regroup" else (n * seq,
                                                                                 features)
                y = bb.emit(relax.op.reshape(y, rows))
            size = int(y.ty.shape[0 if bn_axis == "rows" else -1])
            bn = bb.emit(relax.op.nn.batch_norm(
                y, const(rng.uniform(0.5, 1.5, size)), const(rng.standard_normal(size)),
                const(rng.standard_normal(size)), const(rng.uniform(0.5, 2.0, size)),
                axis=0 if bn_axis == "rows" else 1, training=training))
            y = bb.emit(relax.TupleGetItem(bn, 0))
            if form != "flat":
                y = bb.emit(relax.op.reshape(y, (n, seq, features)))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()
