"""``matmul [of a transposed weight] [+ per-feature bias] [-> activation]`` as table entries.

:class:`MatmulComposite` is one class for every variant (transposed weight, bias,
activation), named as TVM's cutlass and cublas tables name them; :func:`matmul_table`
lists the variants in the order a pattern table needs.  The checks refuse a permute that
is no transpose and an added tensor that is no per-feature bias.
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm

from patternkit.dpl import DFPattern, alt, is_op, through, wildcard
from patternkit.engine import CompositeRule, RoleMatch, reject
from patternkit.ir import NotPerChannel, dtype_of, per_channel_axis, static_shape, type_of

from .examples import mlp

ACTIVATIONS = {"relu": "nn.relu", "gelu": "nn.gelu", "gelu_tanh": "nn.gelu_tanh",
               "silu": "nn.silu"}


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
        rhs: DFPattern = self.weight
        if self.transposed:
            self.permute = is_op("permute_dims")(self.weight)
            rhs = self.permute
        self.matmul = is_op("matmul")(self.x, rhs)
        # a float16 matmul accumulated in float32 and cast back (ToMixedPrecision,
        # patternkit's float16 torch import): the composite takes the cast with it
        self.cast_back = is_op("astype")(self.matmul)
        out: DFPattern = alt(tag="cast", cast_back=self.cast_back, direct=self.matmul)
        if self.with_bias:
            self.bias = wildcard()
            self.add = is_op("add")(out, self.bias)
            out = self.add
        if activation is not None:
            out = is_op(ACTIVATIONS[activation])(through(out, ("reshape",), depth=1))
        self.pattern = out
        self.pattern_name = ("matmul" + "_transposed" * self.transposed + "_bias" * self.with_bias
                             + (f"_{activation}" if activation else ""))

    def check(self, match: RoleMatch) -> Any:
        """Accept unless the permute is no transpose, the added tensor no per-feature bias,
        or a cast after the matmul changes its operands' dtype.
        """
        if match.tag("cast") == "cast_back":
            cast, operands = match.cast_back, dtype_of(type_of(match.x))
            if str(cast.attrs.dtype) != operands:
                return reject(f"the matmul's result is cast to {cast.attrs.dtype}, not back to "
                              f"its operands' {operands}", at=cast)
        if self.transposed:
            refusal = _check_transpose(match)
            if refusal is not None:
                return refusal
        if self.with_bias:
            return _check_bias(match)
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A two-layer MLP in this variant's form: :func:`~.examples.mlp` with ``knobs``."""
        return mlp(transposed=self.transposed, bias=self.with_bias,
                   activation=self.activation, **knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes, the input shapes and frontends met in exports; the bias shapes when
        this variant takes one.
        """
        space: dict[str, Sequence[Any]] = {"dtype": ("float32", "float16"),
                                           "shape": ("batch_seq", "static", "matrix"),
                                           "frontend": ("torch", "direct"),
                                           "accumulate": (None, "cast_back")}
        if self.with_bias:
            space["bias_shape"] = ("feature", "row", "scalar", "residual")
        return space


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


def _check_transpose(match: RoleMatch) -> Any:
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


def _check_bias(match: RoleMatch) -> Any:
    product = "cast_back" if match.tag("cast") == "cast_back" else "matmul"
    out_ty, bias_ty = type_of(match.var_of(product)), type_of(match.bias)
    out_shape = static_shape(out_ty)
    if out_shape is None:
        return reject("the matmul output has no known shape", at=match.matmul)
    if dtype_of(bias_ty) != dtype_of(out_ty):
        return reject(f"bias dtype {dtype_of(bias_ty)} differs from the matmul output dtype "
                      f"{dtype_of(out_ty)}", at=match.bias)
    bias_shape = static_shape(bias_ty)
    try:
        axis = per_channel_axis(bias_shape, out_shape, name="it", of="the matmul output")
    except NotPerChannel as why:
        return reject(f"{_not_a_bias(bias_shape, out_shape)}: {why}", at=match.bias)
    last = len(out_shape) - 1
    if axis != last:
        return reject(f"{_not_a_bias(bias_shape, out_shape)}: it varies along axis {axis}, the "
                      f"feature axis is {last}", at=match.bias)
    return True


def _not_a_bias(bias_shape: Any, out_shape: Any) -> str:
    return (f"the added tensor of shape {bias_shape} is not a per-feature bias of the "
            f"matmul output {out_shape}")
