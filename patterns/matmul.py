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

Parallel matmuls that share their left operand are combined into one matmul and a split
(a rewrite rule, not a composite):

Recognises N >= 2 ``R.matmul(x, w_i)`` bindings of one block that read the same ``x`` as
their left operand (a q/k/v projection, the gates of an LSTM cell), each ``w_i`` a
constant or a parameter of the function or the ``permute_dims`` of one (the torch
importer's ``nn.Linear``), rank 2, shaped ``(K, N_i)`` with a static
width ``N_i``.

:class:`CombineParallelMatmul` (``matmul.combine_parallel``) produces
``R.matmul(x, W)`` on the weights concatenated along their last axis (folded into one
constant when every ``w_i`` is a constant, an ``R.concat`` of the ``w_i`` otherwise) and an ``R.split``
of the result along its last axis; each matched binding becomes its part of the split.
When every branch is read only by an ``R.add`` of a rank-1 bias ``b_i`` of shape
``(N_i,)`` (constant or parameter), the adds are folded along: one add of the
concatenated biases before the split, and each add binding becomes its part.

Guards, each a reason in the log:

* branches of different weight dtypes or ``out_dtype`` are never combined together
  (TVM's own ``CombineParallelMatmul`` once produced a matmul of the wrong dtype there);
  the largest group that agrees with the first branch is combined, and the others are
  left for a later round;
* a rank-1 operand (``x`` or ``w_i``), a weight that is computed in the function, or a
  weight without a static shape or width is not combined;
* a branch whose result is also read elsewhere than by its bias add keeps all the bias
  adds unfolded (the raw matmul result is needed), the matmuls are still combined.

On imported models, run ``relax.transform.EliminateCommonSubexpr()`` first: the torch
importer reshapes the shared input once per ``nn.Linear``, so the matmuls read equal
values through different Vars until CSE makes them one.

The rule claims no speed-up on every target: one wide matmul usually beats N narrow
ones on CPU and GPU, and the split is a view after legalisation only where the backend
makes it one.  It builds on :class:`patternkit.engine.BindingsRewriteRule`: a
``PatternContext`` whose ``x.used_by_all(matmul, 0, at_least=2)`` takes every matmul
reading ``x`` at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, PatternContext, is_op, through, wildcard
from patternkit.engine import (
    BindingsMatch,
    BindingsRewriteRule,
    CompositeRule,
    NoSuchExample,
    RuleMatch,
    reject,
    variant_method,
)
from patternkit.ir import (
    NotPerChannel,
    const_value,
    dtype_of,
    is_tensor_constant,
    per_channel_axis,
    static_shape,
    type_of,
)

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
        # a float16 matmul accumulated in float32 and cast back (ToMixedPrecision,
        # patternkit's float16 torch import): the composite takes the cast with it
        self.cast_back = is_op("astype")(self.matmul)
        out: DFPattern = self.cast_back | self.matmul
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
        """Accept unless the permute is no transpose, the added tensor no per-feature bias,
        or a cast after the matmul changes its operands' dtype."""
        if "cast_back" in match:
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

    # -- self-check example (used by tests and `patternkit verify`) ---------------------------
    @variant_method
    def example(self, dtype: str = "float32", shape: str = "batch_seq", frontend: str = "torch",
                bias_shape: str = "feature", accumulate: str | None = None,
                seed: int = 0) -> tvm.IRModule:
        """A two-layer MLP in this variant's form: ``layer2(layer1(x))``, each layer
        ``x @ W [+ b] [-> activation]``, with seeded constant weights (variance 1/fan_in).

        ``shape``: ``x`` is ``(batch, seq, 16)`` with symbolic ``batch`` and ``seq``
        (``"batch_seq"``), ``(2, 8, 16)`` (``"static"``) or ``(8, 16)`` (``"matrix"``).
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
        x = _example_input(dtype, shape)
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                h = self._example_layer(bb, rng, x, 16, frontend, bias_shape, accumulate)
                out = bb.emit_output(self._example_layer(bb, rng, h, 16, frontend, bias_shape,
                                                         accumulate))
            bb.emit_func_output(out)
        return bb.get()

    @variant_method
    def example_space(self) -> dict[str, Sequence[Any]]:
        space: dict[str, Sequence[Any]] = {"dtype": ("float32", "float16"),
                                           "shape": ("batch_seq", "static", "matrix"),
                                           "frontend": ("torch", "direct"),
                                           "accumulate": (None, "cast_back")}
        if self.with_bias:
            space["bias_shape"] = ("feature", "row", "scalar", "residual")
        return space

    def _example_layer(self, bb: relax.BlockBuilder, rng: np.random.Generator, x: relax.Expr,
                       features: int, frontend: str, bias_shape: str,
                       accumulate: str | None) -> relax.Expr:
        dtype = dtype_of(type_of(x))
        dims = static_shape(type_of(x))
        inner = dims[-1]
        weight_shape = (features, inner) if self.transposed else (inner, features)
        weight = relax.const((rng.standard_normal(weight_shape) / np.sqrt(inner)).astype(dtype))
        rhs = bb.emit(relax.op.permute_dims(weight, [1, 0])) if self.transposed else weight
        flat = len(dims) > 2 and frontend == "torch"
        lhs = bb.emit(relax.op.reshape(x, (_product(dims[:-1]), inner))) if flat else x
        if accumulate == "cast_back":
            y = bb.emit(relax.op.astype(bb.emit(relax.op.matmul(lhs, rhs, out_dtype="float32")),
                                        dtype))
        else:
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
    product = "cast_back" if "cast_back" in match else "matmul"
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


# -- combining parallel matmuls ----------------------------------------------------------

@dataclass(frozen=True)
class CombinePlan:
    """The branches to combine (binding order) and how.

    ``matmuls`` are the matched matmul Vars, ``weights`` their right operands,
    ``widths`` each ``N_i``; ``outputs`` the Var each branch's result replaces (the bias
    add when ``biases`` are folded, else the matmul); ``out_dtype`` the common
    ``out_dtype`` attribute (``""``: the operands' dtype).
    """

    matmuls: tuple
    weights: tuple
    widths: tuple[int, ...]
    outputs: tuple
    biases: tuple | None
    out_dtype: str


def _out_dtype(call: relax.Call) -> str:
    dtype = call.attrs.out_dtype
    text = "" if dtype is None else str(dtype)
    return "" if text in ("void", "None") else text


class CombineParallelMatmul(BindingsRewriteRule):
    """Matmuls sharing their left operand: one matmul on concatenated weights and a split."""

    name = "matmul.combine_parallel"

    def __init__(self) -> None:
        super().__init__()
        with PatternContext() as context:
            self.x = wildcard()
            self.matmul = is_op("relax.matmul")(wildcard(), wildcard(), add_constraint=False)
            self.x.used_by_all(self.matmul, index=0, at_least=2)
        self.context = context

    # -- check ---------------------------------------------------------------------------
    def check(self, match: BindingsMatch) -> Any:
        x = match.x
        x_shape = _shape(x)
        if x_shape is not None and len(x_shape) < 2:
            return reject(f"the shared operand '{x.name}' is rank 1: matmul would "
                          f"contract it away, there is no axis to split", at=x)
        first_key, branches, refusals = None, [], []
        for var in match.matmul:
            call = match.value(var)
            weight = call.args[1]
            why = self._weight_problem(match, weight)
            if why is not None:
                refusals.append(f"'{var.name}': {why}")
                continue
            key = (_dtype(weight), _dtype(call.args[0]), _out_dtype(call))
            if first_key is None:
                first_key = key
            if key != first_key:
                refusals.append(f"'{var.name}': weight dtype {key[0]} / out_dtype "
                                f"{key[2] or 'default'} differ from the first branch's "
                                f"{first_key[0]} / {first_key[2] or 'default'}")
                continue
            branches.append((var, weight, int(_shape(weight)[1])))
        if len(branches) < 2:
            return reject(f"fewer than two matmuls of '{x.name}' can be combined: "
                          f"{'; '.join(refusals)}", at=x)
        matmuls = tuple(v for v, _, _ in branches)
        biases = self._biases(match, matmuls, [n for _, _, n in branches])
        outputs = matmuls if biases is None else tuple(add for add, _ in biases)
        for out in outputs:
            if out is not None and out not in matmuls:
                match.claim(out)
        return CombinePlan(matmuls, tuple(w for _, w, _ in branches),
                           tuple(n for _, _, n in branches), outputs,
                           None if biases is None else tuple(b for _, b in biases),
                           first_key[2])

    @staticmethod
    def _weight_problem(match: BindingsMatch, weight: Any) -> str | None:
        if not (_is_given(match, weight) or _is_transposed_given(match, weight)):
            return ("its weight is computed in the function, not a constant or a parameter "
                    "(or its permute_dims)")
        shape = _shape(weight)
        if shape is None:
            return "its weight has no static shape"
        if len(shape) != 2:
            return f"its weight has rank {len(shape)}, not 2"
        if not isinstance(shape[1], int):
            return f"its weight's width {shape[1]} is symbolic: the split needs static widths"
        return None

    @staticmethod
    def _biases(match: BindingsMatch, matmuls: tuple, widths: list):
        """``[(add Var, bias)]`` per branch when every branch's only reader adds a bias."""
        found = []
        for var, width in zip(matmuls, widths):
            readers = match.readers(var)
            if len(readers) != 1 or match.escapes(var):
                return None
            add = match.value(readers[0])
            if not (isinstance(add, relax.Call) and isinstance(add.op, tvm.ir.Op)
                    and add.op.name == "relax.add" and len(add.args) == 2):
                return None
            args = list(add.args)
            bias = args[1] if args[0].same_as(var) else args[0]
            if bias.same_as(var) or not (is_tensor_constant(bias) or match.is_parameter(bias)):
                return None
            if _shape(bias) != (width,) or _dtype(bias) != _dtype(var):
                return None
            found.append((readers[0], bias))
        return found

    # -- rewrite -------------------------------------------------------------------------
    def rewrite(self, match: BindingsMatch) -> dict:
        plan: CombinePlan = match.plan
        merged = relax.op.matmul(match.x, _concat(plan.weights),
                                 out_dtype=plan.out_dtype or None)
        if plan.biases is not None:
            merged = relax.op.add(merged, _concat(plan.biases, axis=0))
        cuts = np.cumsum(plan.widths)[:-1].tolist()
        parts = relax.op.split(merged, cuts, axis=-1)
        return {out: relax.TupleGetItem(parts, i) for i, out in enumerate(plan.outputs)}

    # -- example -------------------------------------------------------------------------
    @staticmethod
    def example(branches: int = 3, bias: bool = False, dtype: str = "float32",
                seed: int = 0) -> tvm.IRModule:
        """A q/k/v-style projection: ``branches`` matmuls of one input, seeded constants."""
        rng = np.random.default_rng(seed)
        x = relax.Var("x", relax.TensorType((2, 4, 8), dtype))
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                outs = []
                for i in range(branches):
                    w = relax.const(rng.standard_normal((8, 4 + i)).astype(dtype))
                    y = bb.emit(relax.op.matmul(x, w))
                    if bias:
                        y = bb.emit(relax.op.add(y, relax.const(
                            rng.standard_normal((4 + i,)).astype(dtype))))
                    outs.append(y)
                out = bb.emit_output(relax.op.concat(outs, axis=-1))
            bb.emit_func_output(out)
        return bb.get()

    @classmethod
    def example_space(cls) -> dict:
        return {"branches": (3, 2, 4), "bias": (False, True), "dtype": ("float32", "float16")}


def _is_given(match: BindingsMatch, expr: Any) -> bool:
    """A constant or a parameter: known before the function runs, never computed."""
    return is_tensor_constant(expr) or match.is_parameter(expr)


def _is_transposed_given(match: BindingsMatch, expr: Any) -> bool:
    """``permute_dims`` of a rank-2 constant or parameter, bound in the block: how the
    torch importer writes ``nn.Linear``'s weight."""
    if not isinstance(expr, relax.Var) or expr not in match.bindings:
        return False
    value = match.value(expr)
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.permute_dims"):
        return False
    axes = value.attrs.axes
    return (_is_given(match, value.args[0]) and len(_shape(value.args[0]) or ()) == 2
            and (axes is None or [int(a) for a in axes] == [1, 0]))


def _shape(expr: Any) -> tuple | None:
    return static_shape(type_of(expr))


def _dtype(expr: Any) -> str | None:
    return dtype_of(type_of(expr))


def _concat(values: tuple, axis: int = -1) -> Any:
    """The values concatenated along ``axis``: one constant when all are constants."""
    if all(is_tensor_constant(v) for v in values):
        return relax.const(np.concatenate([const_value(v) for v in values], axis=axis))
    return relax.op.concat(list(values), axis=axis)

RULES = (CombineParallelMatmul,)

#: Pattern table entries of this file, in priority order (see :func:`matmul_table`).
COMPOSITES = tuple(matmul_table())
