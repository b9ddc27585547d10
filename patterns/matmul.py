"""Matrix multiplications for external compilers: ``matmul [+ bias] [-> activation]`` composites
named as TVM's backend tables name them.

Recognises (:class:`MatmulComposite`, one variant per constructor arguments)

* ``matmul(x, w)``, or ``matmul(x, permute_dims(w))`` (``transposed=True``: a weight
  stored ``(out, in)``, as ``nn.Linear`` keeps it and the torch importer emits it);
* then, with ``bias=True``, ``add`` of a per-feature bias: a tensor that varies along the
  output's last axis only (``(N,)``, ``(1, N)``, ``(1, 1, N)``), in either operand order
  (the torch importer writes ``add(bias, matmul(...))``);
* then, with ``activation`` one of ``relu``, ``gelu``, ``gelu_tanh``, ``silu``, that
  activation, applied to the result or to a ``reshape`` of it: the torch importer runs an
  ``nn.Linear`` on a 3-D input as ``reshape`` to 2-D, matmul, add, ``reshape`` back, and
  the activation follows the last ``reshape`` (BERT's ``intermediate``, GPT-2's MLP, a
  Llama MLP's gate).  An elementwise activation commutes with a reshape, so the
  composite computes the same values either way.

Names are TVM's (``python/tvm/relax/backend/cuda/cutlass.py`` and ``cublas.py``):
``"<compiler>.matmul"``, then ``"_transposed"``, ``"_bias"`` and ``"_<activation>"`` for
the parts present: ``matmul_bias_relu``, ``matmul_transposed_bias_gelu``, ... .  cutlass and
cublas ship the ``relu`` and ``gelu`` variants with a bias; the ``gelu_tanh`` and ``silu``
ones, and activations without a bias (a Llama MLP has none), are named by the same rule
(TVM's ``_get_activation_from_name`` already parses ``_gelu_tanh`` and ``_silu``).  Each
part is named by one fixed piece in a fixed order, so distinct variants get distinct
names.  :func:`matmul_table` lists every variant, most specific first: the order a
pattern table needs, since a plain ``matmul`` entry would otherwise take the matmul of a
``matmul_bias_relu`` chain (and an untransposed one the matmul of a transposed chain).

The check refuses what a backend's epilogue would compute differently: a ``permute_dims``
that is not a transpose of the weight's last two axes, and an added tensor that is not a
per-feature bias (a full tensor, one that varies along another axis, a single value).  It
runs after the activation collapses of ``patternkit.patterns.activation``, which turn the
written-out GELU / SiLU into the ``nn`` ops matched here.

Deliberately not covered: residual ``add`` / ``multiply`` after the activation (cutlass's
``*_residual_*`` entries), quantised and dequantised weights (``decode_matmul``), a bias
reshaped inside the composite, and ``reshape`` between the matmul and the bias add.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, is_op, through, wildcard
from patternkit.engine import CompositeRule, RuleMatch, reject, variant_method
from patternkit.ir import NotPerChannel, dtype_of, per_channel_axis, static_shape, type_of

#: Activation name (as in the composite name) -> the Relax operator it stands for.
ACTIVATIONS = {"relu": "nn.relu", "gelu": "nn.gelu", "gelu_tanh": "nn.gelu_tanh",
               "silu": "nn.silu"}

_RELAX_ACTIVATIONS = {"relu": relax.op.nn.relu, "gelu": relax.op.nn.gelu,
                      "gelu_tanh": relax.op.nn.gelu_tanh, "silu": relax.op.nn.silu}


class MatmulComposite(CompositeRule):
    """``matmul [of a transposed weight] [+ per-feature bias] [-> activation]`` as a table entry.

    Parameters
    ----------
    compiler : str
        Prefix of the composite name (the codegen that will take it).
    transposed : bool
        The weight arrives through ``permute_dims`` swapping its last two axes.
    bias : bool
        A per-feature bias is added to the product.
    activation : {None, "relu", "gelu", "gelu_tanh", "silu"}
        The activation that follows (possibly after a ``reshape``), or none.
    """

    def __init__(self, compiler: str = "byoc", transposed: bool = False, bias: bool = False,
                 activation: str | None = None):
        super().__init__(compiler)
        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"MatmulComposite: activation must be None or one of "
                             f"{tuple(ACTIVATIONS)}, found {activation!r}")
        self.transposed, self.with_bias, self.activation = bool(transposed), bool(bias), activation
        self.x, self.weight = wildcard(), wildcard()
        rhs = self.weight
        if self.transposed:
            self.permute = is_op("permute_dims")(self.weight)
            rhs = self.permute
        self.matmul = is_op("matmul")(self.x, rhs)
        out: DFPattern = self.matmul
        if self.with_bias:
            self.bias = wildcard()
            self.add = is_op("add")(out, self.bias)
            out = self.add
        if activation is not None:
            out = is_op(ACTIVATIONS[activation])(through(out, ("reshape",), depth=1))
        self.pattern = out
        self.pattern_name = ("matmul" + "_transposed" * self.transposed + "_bias" * self.with_bias
                             + (f"_{activation}" if activation else ""))

    def check(self, match: RuleMatch) -> Any:
        """Accept unless the permute is no transpose or the added tensor no per-feature bias."""
        if self.transposed:
            refusal = _check_transpose(match)
            if refusal is not None:
                return refusal
        if self.with_bias:
            return _check_bias(match)
        return True

    # -- self-check example (used by tests and `patternkit verify`) ---------------------------
    @variant_method
    def example(self, dtype: str = "float32", shape: str = "batch_seq", frontend: str = "torch",
                bias_shape: str = "feature", seed: int = 0) -> tvm.IRModule:
        """A two-layer MLP in this variant's form: ``layer2(layer1(x))``, each layer
        ``x @ W [+ b] [-> activation]``, with seeded constant weights (variance 1/fan_in).

        ``shape``: ``x`` is ``(batch, seq, 16)`` with symbolic ``batch`` and ``seq``
        (``"batch_seq"``), ``(2, 8, 16)`` (``"static"``) or ``(8, 16)`` (``"matrix"``).
        ``frontend="torch"``: a layer on a 3-D ``x`` is ``reshape`` to 2-D, matmul, add,
        ``reshape`` back, then the activation (how the torch importer writes
        ``nn.Linear``); ``"direct"``: one batched matmul.  ``bias_shape``: ``"feature"``
        ``(N,)``, ``"row"`` ``(1, N)``, or edges the check refuses: ``"scalar"`` ``(1,)``
        (one value, not one per feature) and ``"residual"`` (the layer's input added back,
        a tensor of the output's shape).
        """
        rng = np.random.default_rng(seed)
        x = _example_input(dtype, shape)
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                h = self._example_layer(bb, rng, x, 16, frontend, bias_shape)
                out = bb.emit_output(self._example_layer(bb, rng, h, 16, frontend, bias_shape))
            bb.emit_func_output(out)
        return bb.get()

    @variant_method
    def example_space(self) -> dict[str, Sequence[Any]]:
        space: dict[str, Sequence[Any]] = {"dtype": ("float32", "float16"),
                                           "shape": ("batch_seq", "static", "matrix"),
                                           "frontend": ("torch", "direct")}
        if self.with_bias:
            space["bias_shape"] = ("feature", "row", "scalar", "residual")
        return space

    def _example_layer(self, bb: relax.BlockBuilder, rng: np.random.Generator, x: relax.Expr,
                       features: int, frontend: str, bias_shape: str) -> relax.Expr:
        dtype = dtype_of(type_of(x))
        dims = static_shape(type_of(x))
        inner = dims[-1]
        weight_shape = (features, inner) if self.transposed else (inner, features)
        weight = relax.const((rng.standard_normal(weight_shape) / np.sqrt(inner)).astype(dtype))
        rhs = bb.emit(relax.op.permute_dims(weight, [1, 0])) if self.transposed else weight
        flat = len(dims) > 2 and frontend == "torch"
        lhs = bb.emit(relax.op.reshape(x, (_product(dims[:-1]), inner))) if flat else x
        y = bb.emit(relax.op.matmul(lhs, rhs))
        if self.with_bias:
            if bias_shape == "residual":  # the layer's input: a tensor of the output's shape
                bias = lhs
            else:
                b_shape = {"feature": (features,), "row": (1, features), "scalar": (1,)}[bias_shape]
                bias = relax.const((rng.standard_normal(b_shape) * 0.5 + 0.25).astype(dtype))
            y = bb.emit(relax.op.add(bias, y))  # the torch importer's operand order
        if flat:
            y = bb.emit(relax.op.reshape(y, (*dims[:-1], features)))
        if self.activation is not None:
            y = bb.emit(_RELAX_ACTIVATIONS[self.activation](y))
        return y


#: ``(bias, activation)`` of the table's variants, most parts first.  Without a bias only
#: ``silu`` (a Llama MLP's gate projection has no bias); the other activations come after
#: a biased ``nn.Linear`` in the models the library targets (BERT, GPT-2, ViT), and
#: ``MatmulComposite(activation="relu")`` builds the unbiased variant where one is needed.
TABLE_PARTS = ((True, "relu"), (True, "gelu"), (True, "gelu_tanh"), (True, "silu"),
               (True, None), (False, "silu"), (False, None))


def matmul_table(compiler: str = "byoc") -> list[MatmulComposite]:
    """The table's :class:`MatmulComposite` variants, in the priority order a table needs.

    Transposed before plain (a plain entry would take the matmul of a transposed chain,
    leaving the ``permute_dims`` out), then the most parts first: bias and activation,
    bias, activation, the bare matmul (:data:`TABLE_PARTS`).
    """
    table = []
    for transposed in (True, False):
        for bias, activation in TABLE_PARTS:
            table.append(MatmulComposite(compiler, transposed, bias, activation))
    return table


def _check_transpose(match: RuleMatch) -> Any:
    """``None`` when ``permute_dims`` swaps the weight's last two axes, else the refusal."""
    rank = getattr(type_of(match.weight), "ndim", -1)
    if rank < 2:
        return reject(f"the permuted weight has {'an unknown rank' if rank < 0 else f'rank {rank}'}"
                      f": a transposed weight has at least two axes", at=match.weight)
    raw = match.permute.attrs.axes
    axes = None if raw is None else [int(a) for a in raw]
    transpose = [*range(rank - 2), rank - 1, rank - 2]
    if axes is None and rank == 2 or axes == transpose:
        return None
    return reject(f"permute_dims(weight, axes={axes}) does not swap the last two axes of the "
                  f"rank-{rank} weight: the product is not x @ weight^T", at=match.permute)


def _check_bias(match: RuleMatch) -> Any:
    out_ty, bias_ty = type_of(match.var_of("matmul")), type_of(match.bias)
    out_shape = static_shape(out_ty)
    if out_shape is None:
        return reject("the matmul output has no known shape", at=match.matmul)
    if dtype_of(bias_ty) != dtype_of(out_ty):
        return reject(f"bias dtype {dtype_of(bias_ty)} differs from the matmul output dtype "
                      f"{dtype_of(out_ty)}", at=match.bias)
    not_a_bias = (f"the added tensor of shape {static_shape(bias_ty)} is not a per-feature "
                  f"bias of the matmul output {out_shape}")
    try:
        axis = per_channel_axis(static_shape(bias_ty), out_shape, name="it",
                                of="the matmul output")
    except NotPerChannel as why:
        return reject(f"{not_a_bias}: {why}", at=match.bias)
    last = len(out_shape) - 1
    if axis != last:
        return reject(f"{not_a_bias}: it varies along axis {axis}, the feature axis is {last}",
                      at=match.bias)
    return True


def _example_input(dtype: str, shape: str) -> relax.Var:
    dims = {"batch_seq": (tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64"), 16),
            "static": (2, 8, 16), "matrix": (8, 16)}[shape]
    return relax.Var("x", relax.TensorType(dims, dtype))


def _product(dims: Sequence[Any]) -> Any:
    out = dims[0]
    for d in dims[1:]:
        out = out * d
    return out


#: The rewrite rules of this file: none (composites only).
RULES = ()

#: Pattern table entries of this file, in priority order (see :func:`matmul_table`).
COMPOSITES = tuple(matmul_table())
