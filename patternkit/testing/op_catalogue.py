"""The operators random programs are grown from, each with its typing rule.

One :class:`OpEntry` per operator of ``relax.op`` (and ``nn``, ``image``) that the llvm
target builds in TVM 0.27: what operands it accepts, what it produces, and ``emit``,
which asks the :class:`~patternkit.testing.op_programs.Grower` for operands satisfying
the rule (found among the values computed so far, or made) and emits the call.  An
entry returns ``None`` when the program offers nothing it accepts and it cannot make it.

Operators with a restricted domain (``log``, ``sqrt``, ``acos``) get operands squashed
into it (``abs(x) + 0.5``, ``tanh(x) * 0.9``), so a program computes finite numbers on
every draw and a comparison means something.

:data:`EXCLUDED` lists the operators left out and why: those the llvm target cannot
build in 0.27 (found by trying), those whose results are not a function of their inputs
(sampling), those with data-dependent shapes, and those that are plumbing rather than
computation (``call_tir``, closures, ``print``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
from tvm import relax

# The grower (op_programs.Grower) and its values (op_programs.Value), which import this
# module: named here by duck type, so the two modules do not import each other.
Grower = Any
Value = Any

__all__ = ["OpEntry", "CATALOGUE", "EXCLUDED", "FLOAT16_UNSAFE", "entries_for"]

BOTH = ("float32", "float16")
ONLY32 = ("float32",)

op = relax.op
nn = relax.op.nn


@dataclass(frozen=True)
class OpEntry:
    """One operator: its typing rule in words, and how to grow a call of it."""

    name: str  # the Relax operator (relax.nn.conv2d) the entry emits
    accepts: str
    produces: str
    emit: Callable[[Grower], Value | None]
    dtypes: tuple[str, ...] = BOTH
    variant: str = ""  # what distinguishes entries of the same operator
    weight: int = 1  # how many times more often than others programs pick it

    @property
    def key(self) -> str:
        """The entry's name, with its variant when it has one."""
        return f"{self.name}[{self.variant}]" if self.variant else self.name


# -- domains ----------------------------------------------------------------------------------
def _squash(g: Grower, v: Value, domain: str) -> Value:
    """``v`` mapped into an operator's domain by an elementwise chain."""
    d = g.dtype
    if domain == "positive":  # log, sqrt, rsqrt, power's base
        return g.emit(op.add(op.abs(v.expr), relax.const(0.5, d)), v)
    if domain == "unit":  # acos, asin, atanh
        return g.emit(op.multiply(op.tanh(v.expr), relax.const(0.9, d)), v)
    if domain == "above_one":  # acosh
        return g.emit(op.add(op.abs(v.expr), relax.const(1.25, d)), v)
    if domain == "small":  # tan, exp, sinh, cosh: keep them finite in float16
        return g.emit(op.tanh(v.expr), v)
    return v


def _fv(g: Grower) -> Callable[[Value], bool]:
    return g.is_float


# -- elementwise ------------------------------------------------------------------------------
UNARY = {  # operator -> domain
    "abs": "", "acos": "unit", "acosh": "above_one", "asin": "unit", "asinh": "",
    "atan": "", "atanh": "unit", "ceil": "", "cos": "", "cosh": "small", "erf": "",
    "exp": "small", "floor": "", "log": "positive", "negative": "", "round": "",
    "rsqrt": "positive", "sigmoid": "", "sign": "", "sin": "", "sinh": "small",
    "sqrt": "positive", "square": "", "tan": "small", "tanh": "", "trunc": "",
}
NN_UNARY = ("relu", "gelu", "gelu_tanh", "silu", "selu", "softplus", "relu6")


def _unary(name: str, domain: str, fn: Callable) -> OpEntry:
    def emit(g: Grower) -> Value:
        v = _squash(g, g.operand(), domain)
        return g.emit(fn(v.expr), v, layout=v.layout)
    namespace = "relax.nn." if fn.__module__.endswith("nn") else "relax."
    return OpEntry(namespace + name, "a float tensor of any rank" +
                   (f" ({domain} values)" if domain else ""), "the same type", emit)


def _leakyrelu(g: Grower) -> Value:
    v = g.operand()
    return g.emit(nn.leakyrelu(v.expr, alpha=g.choice((0.01, 0.2))), v, layout=v.layout)


def _prelu(g: Grower) -> Value | None:
    v = g.operand(ranks=(2, 3, 4), static=True)
    axis = g.integer(0, v.rank - 1)
    alpha = g.tensor((v.shape[axis],), "alpha")
    return g.emit(nn.prelu(v.expr, alpha.expr, axis=axis), v, alpha)


def _clip(g: Grower) -> Value:
    v = g.operand()
    low = g.choice((-0.5, 0.0))
    return g.emit(op.clip(v.expr, low, g.choice((0.5, 6.0))), v, layout=v.layout)


BINARY = {  # operator -> domain of the second operand
    "add": "", "subtract": "", "multiply": "", "divide": "positive", "maximum": "",
    "minimum": "", "power": "small", "floor_divide": "positive", "floor_mod": "positive",
    "atan2": "", "log_add_exp": "",
}


def _binary(name: str, domain: str) -> OpEntry:
    fn = getattr(op, name)

    def emit(g: Grower) -> Value:
        a = g.operand()
        b = g.pick(lambda v: v is not a and g.is_float(v) and _broadcasts(v.shape, a.shape)) \
            if g.flag() else None
        b = b or g.tensor(g.broadcast_shape(a.shape))
        if name == "power":  # a positive base, a small exponent
            a = _squash(g, a, "positive")
        b = _squash(g, b, domain)
        if g.flag():  # either side may be the one that broadcasts
            a, b = (b, a) if not domain and name != "power" else (a, b)
        return g.emit(fn(a.expr, b.expr), a, b)
    return OpEntry(f"relax.{name}", "two float tensors that broadcast against each other",
                   "the broadcast shape", emit)


def _broadcasts(a: tuple, b: tuple) -> bool:
    return all(x == y or 1 in (x, y) for x, y in zip(reversed(a), reversed(b)))


COMPARE = ("equal", "not_equal", "greater", "greater_equal", "less", "less_equal")


def _compare(name: str) -> OpEntry:
    fn = getattr(op, name)

    def emit(g: Grower) -> Value:
        a = g.operand()
        b = g.tensor(g.broadcast_shape(a.shape))
        return g.emit(fn(a.expr, b.expr), a, b)
    return OpEntry(f"relax.{name}", "two float tensors that broadcast",
                   "a bool tensor of the broadcast shape", emit)


def _where(g: Grower) -> Value:
    cond = g.pick(lambda v: v.dtype == "bool")
    if cond is None:
        a = g.operand()
        cond = g.emit(op.greater(a.expr, relax.const(0.0, g.dtype)), a)
    x = g.tensor(g.broadcast_shape(cond.shape))
    y = g.tensor(g.broadcast_shape(cond.shape))
    return g.emit(op.where(cond.expr, x.expr, y.expr), cond, x, y)


def _logical(name: str) -> OpEntry:
    fn = getattr(op, name)

    def emit(g: Grower) -> Value:
        a = g.pick(lambda v: v.dtype == "bool")
        if a is None:
            x = g.operand()
            a = g.emit(op.less(x.expr, relax.const(0.25, g.dtype)), x)
        if name == "logical_not":
            return g.emit(fn(a.expr), a)
        x = g.tensor(g.broadcast_shape(a.shape))
        b = g.emit(op.greater(x.expr, relax.const(-0.25, g.dtype)), x)
        return g.emit(fn(a.expr, b.expr), a, b)
    return OpEntry(f"relax.{name}", "bool tensors (comparisons made if none)",
                   "a bool tensor", emit)


def _predicate(name: str) -> OpEntry:
    fn = getattr(op, name)

    def emit(g: Grower) -> Value:
        v = g.operand()
        return g.emit(fn(op.divide(v.expr, v.expr)), v)  # 0/0 is nan somewhere, maybe
    return OpEntry(f"relax.{name}", "a float tensor", "a bool tensor", emit)


def _astype(g: Grower) -> Value:
    v = g.pick(lambda v: v.dtype in ("bool", "int64", "int32")) if g.flag() else None
    if v is not None:
        return g.emit(op.astype(v.expr, g.dtype), v)
    v = g.operand()
    target = g.choice(("float32", "int32", "float16"))
    if target == "int32":  # floats to ints: scaled, so the integers are not all zero
        v = g.emit(op.multiply(v.expr, relax.const(4.0, g.dtype)), v)
    return g.emit(op.astype(v.expr, target), v)


# -- reductions and scans -----------------------------------------------------------------------
def _axes(g: Grower, v: Value) -> list[int]:
    axes = [a for a in range(v.rank) if g.flag()]
    return axes or [g.integer(0, max(v.rank - 1, 0))]


def _reduce(name: str) -> OpEntry:
    fn = getattr(op, name)

    def emit(g: Grower) -> Value:
        v = g.operand(ranks=(1, 2, 3, 4, 5))
        axes = _axes(g, v)
        if g.integer(0, 3) == 0 and name not in ("variance", "std"):
            axis = None
        else:
            axis = axes if g.flag() else [a - v.rank for a in axes]  # negative axes too
        return g.emit(fn(v.expr, axis=axis, keepdims=g.flag()), v)
    return OpEntry(f"relax.{name}", "a float tensor, axes (or none), keepdims",
                   "the reduced tensor", emit, ONLY32 if name in ("prod", "std", "variance")
                   else BOTH)


def _arg_reduce(name: str) -> OpEntry:
    fn = getattr(op, name)

    def emit(g: Grower) -> Value:
        v = g.operand(static=True)
        return g.emit(fn(v.expr, axis=g.integer(0, v.rank - 1), keepdims=g.flag()), v)
    return OpEntry(f"relax.{name}", "a float tensor, one axis", "an int64 tensor", emit)


def _cumsum(g: Grower) -> Value:
    v = g.operand()
    axis = g.integer(-v.rank, v.rank - 1)
    return g.emit(op.cumsum(v.expr, axis=axis, exclusive=g.flag()), v)


def _cumprod(g: Grower) -> Value:
    v = g.operand(max_elements=64)
    v = g.emit(op.add(op.multiply(op.tanh(v.expr), relax.const(0.25, g.dtype)),
                      relax.const(1.0, g.dtype)), v)
    return g.emit(op.cumprod(v.expr, axis=g.integer(0, v.rank - 1)), v)


def _softmax(fn: Callable, name: str) -> OpEntry:
    def emit(g: Grower) -> Value:
        v = g.operand()
        return g.emit(fn(v.expr, axis=g.integer(-v.rank, v.rank - 1)), v, layout=v.layout)
    return OpEntry(f"relax.nn.{name}", "a float tensor, an axis", "the same type", emit)


# -- linear algebra -----------------------------------------------------------------------------
def _out_dtype(g: Grower) -> str | None:
    """float16 programs accumulate in float32 half of the time, as mixed precision does."""
    if g.dtype == "float16" and g.flag():
        return "float32"
    return None


def _matmul(g: Grower) -> Value:
    a = g.operand(lambda v: isinstance(v.shape[-1], int), ranks=(1, 2, 3, 4))
    k = a.shape[-1]
    m = g.choice((1, 3, 4, 8))
    if a.rank == 1 or g.integer(0, 2) == 0:
        shape: tuple = (k, m) if g.flag() or a.rank == 1 else (k,)
    else:  # batch axes broadcast against the lhs' (a size-1 batch, or fewer axes)
        batch = tuple(d if isinstance(d, int) and g.flag() else 1 for d in a.shape[:-2])
        shape = batch[g.integer(0, len(batch)):] + (k, m)
    b = g.tensor(shape, "w", scale=float(k) ** -0.5)
    if g.flag():  # the weight stored transposed, as linear layers keep it
        b = g.tensor(shape[:-2] + (shape[-1], shape[-2]), "w", scale=float(k) ** -0.5) \
            if len(shape) >= 2 else b
        if len(shape) >= 2:
            axes = list(range(len(shape)))
            axes[-1], axes[-2] = axes[-2], axes[-1]
            b = g.emit(op.permute_dims(b.expr, axes), b)
    return g.emit(op.matmul(a.expr, b.expr, out_dtype=_out_dtype(g)), a, b)


def _linear(g: Grower) -> Value:
    a = g.operand(lambda v: isinstance(v.shape[-1], int), ranks=(2, 3))
    k, m = a.shape[-1], g.choice((2, 4, 6))
    w = g.tensor((m, k), "w", scale=float(k) ** -0.5)
    bias = g.tensor((m,), "b") if g.flag() else None
    read = (a, w) + ((bias,) if bias is not None else ())
    return g.emit(op.linear(a.expr, w.expr, bias.expr if bias is not None else None), *read)


def _outer(g: Grower) -> Value:
    a = g.operand(ranks=(1,), static=True, max_elements=16)
    b = g.tensor((g.choice((2, 3, 5)),))
    return g.emit(op.outer(a.expr, b.expr), a, b)


def _einsum(g: Grower) -> Value:
    a = g.operand(ranks=(2,), static=True, max_elements=64)
    b = g.tensor((a.shape[1], g.choice((2, 3))))
    return g.emit(op.einsum([a.expr, b.expr], "ij,jk->ik"), a, b)


# -- convolutions and pools ---------------------------------------------------------------------
SPATIAL = {1: "W", 2: "HW", 3: "DHW"}


def _data_layout(g: Grower, v: Value, dims: int) -> str:
    if v.layout is not None and len(v.layout) == dims + 2:
        return v.layout
    spatial = SPATIAL[dims]
    return g.choice(("NC" + spatial, "N" + spatial + "C"))


def _image(g: Grower, dims: int, min_dim: int = 1) -> tuple[Value, str, dict]:
    v = g.operand(lambda v: v.static and v.rank == dims + 2, ranks=(dims + 2,), static=True,
                  min_dim=min_dim, max_elements=256 if dims < 3 else 128)
    layout = _data_layout(g, v, dims)
    return v, layout, dict(zip(layout, v.shape))


def _conv(dims: int) -> OpEntry:
    fn = {1: nn.conv1d, 2: nn.conv2d, 3: nn.conv3d}[dims]
    spatial = SPATIAL[dims]

    def emit(g: Grower) -> Value:
        v, layout, d = _image(g, dims, min_dim=2)
        kernel_layout = g.choice(("OI" + spatial, spatial + "IO")) if dims != 3 \
            else "OI" + spatial
        k = g.choice((1, 3, 2))
        small = min(d[a] for a in spatial)
        pad = k // 2 if g.flag() or small < k else 0
        groups = d["C"] if g.integer(0, 3) == 0 and dims == 2 else 1  # depthwise
        out_c = d["C"] if groups > 1 else g.choice((2, 3, 4))
        sizes = {"O": out_c, "I": d["C"] // groups, **{a: k for a in spatial}}
        weight = g.tensor(tuple(sizes[a] for a in kernel_layout), "w",
                          scale=float(d["C"] // groups * k ** dims) ** -0.5)
        strides = g.choice((1, 2)) if small >= 4 else 1
        call = fn(v.expr, weight.expr, strides=strides, padding=pad, groups=groups,
                  data_layout=layout, kernel_layout=kernel_layout, out_dtype=_out_dtype(g))
        return g.emit(call, v, weight, layout=layout)
    return OpEntry(f"relax.nn.conv{dims}d",
                   f"rank-{dims + 2} data (channels first or last), a kernel "
                   f"({'OI' + spatial}/{spatial + 'IO'}) whose I is the data's C / groups",
                   "the convolved tensor in the data's layout", emit)


def _conv_transpose(dims: int) -> OpEntry:
    fn = {1: nn.conv1d_transpose, 2: nn.conv2d_transpose}[dims]
    spatial = SPATIAL[dims]

    def emit(g: Grower) -> Value:
        v = g.operand(ranks=(dims + 2,), static=True, max_elements=128)
        layout = "NC" + spatial
        c = v.shape[1]
        k = g.choice((1, 2, 3))
        weight = g.tensor((c, g.choice((2, 3)), *([k] * dims)), "w",
                          scale=float(c * k ** dims) ** -0.5)
        call = fn(v.expr, weight.expr, strides=g.choice((1, 2)), data_layout=layout,
                  kernel_layout="IO" + spatial)
        return g.emit(call, v, weight, layout=layout)
    return OpEntry(f"relax.nn.conv{dims}d_transpose",
                   f"rank-{dims + 2} channels-first data, an IO{spatial} kernel",
                   "the upsampled tensor", emit)


def _pool(kind: str, dims: int) -> OpEntry:
    fn = getattr(nn, f"{kind}_pool{dims}d")
    spatial = SPATIAL[dims]

    def emit(g: Grower) -> Value:
        v, layout, d = _image(g, dims, min_dim=2)
        small = min(d[a] for a in spatial)
        size = g.choice((2, 3)) if small >= 3 else 2
        pad = g.integer(0, size // 2)
        call = fn(v.expr, pool_size=size, strides=g.choice((1, 2)), padding=pad,
                  ceil_mode=g.flag(), layout=layout)
        return g.emit(call, v, layout=layout)
    return OpEntry(f"relax.nn.{kind}_pool{dims}d", f"rank-{dims + 2} data, either layout",
                   "the pooled tensor", emit)


def _adaptive(dims: int) -> OpEntry:
    fn = getattr(nn, f"adaptive_avg_pool{dims}d")
    spatial = SPATIAL[dims]

    def emit(g: Grower) -> Value:
        v, layout, d = _image(g, dims)
        size = g.choice((1, 2)) if min(d[a] for a in spatial) >= 2 else 1
        return g.emit(fn(v.expr, output_size=size, layout=layout), v, layout=layout)
    return OpEntry(f"relax.nn.adaptive_avg_pool{dims}d", f"rank-{dims + 2} data",
                   "the pooled tensor (output size 1 or 2)", emit)


def _resize2d(g: Grower) -> Value:
    v, layout, d = _image(g, 2)
    size = (g.choice((2, 3, 6)), g.choice((2, 4, 5)))
    method = g.choice(("nearest_neighbor", "linear"))
    call = relax.op.image.resize2d(v.expr, size, layout=layout, method=method)
    return g.emit(call, v, layout=layout)


def _pad(g: Grower) -> Value:
    v = g.operand(static=True, ranks=(1, 2, 3, 4))
    widths = [g.integer(0, 2) for _ in range(2 * v.rank)]
    return g.emit(nn.pad(v.expr, widths, pad_value=g.choice((0.0, 1.5))), v)


# -- norms and attention ------------------------------------------------------------------------
def _layer_norm(g: Grower) -> Value:
    v = g.operand(lambda v: isinstance(v.shape[-1], int), ranks=(2, 3, 4))
    axes = [-1] if g.flag() or not isinstance(v.shape[-2], int) else [-2, -1]
    shape = tuple(v.shape[a] for a in axes)
    gamma, beta = g.tensor(shape, "gamma"), g.tensor(shape, "beta")
    return g.emit(nn.layer_norm(v.expr, gamma.expr, beta.expr, axes=axes), v, gamma, beta)


def _rms_norm(g: Grower) -> Value:
    v = g.operand(lambda v: isinstance(v.shape[-1], int), ranks=(2, 3))
    weight = g.tensor((v.shape[-1],), "gamma")
    return g.emit(nn.rms_norm(v.expr, weight.expr, axes=[-1]), v, weight)


def _group_norm(g: Grower) -> Value:
    v = g.operand(lambda v: v.shape[1] in (2, 4, 6, 8), ranks=(3, 4), static=True)
    c = v.shape[1]
    gamma, beta = g.tensor((c,), "gamma"), g.tensor((c,), "beta")
    call = nn.group_norm(v.expr, gamma.expr, beta.expr, num_groups=2, channel_axis=1,
                         axes=list(range(2, v.rank)))
    return g.emit(call, v, gamma, beta, layout=v.layout)


def _instance_norm(g: Grower) -> Value:
    v = g.operand(ranks=(3, 4), static=True, min_dim=2)
    c = v.shape[1]
    gamma, beta = g.tensor((c,), "gamma"), g.tensor((c,), "beta")
    call = nn.instance_norm(v.expr, gamma.expr, beta.expr, channel_axis=1,
                            axes=list(range(2, v.rank)))
    return g.emit(call, v, gamma, beta)


def _batch_norm(g: Grower) -> Value:
    v = g.operand(ranks=(2, 3, 4), static=True)
    axis = v.layout.index("C") if v.layout else g.choice((1, v.rank - 1))
    c = v.shape[axis]
    gamma, beta, mean = (g.tensor((c,), role) for role in ("gamma", "beta", "mean"))
    var = g.tensor((c,), "var", positive=True)
    bn = g.emit(nn.batch_norm(v.expr, gamma.expr, beta.expr, mean.expr, var.expr, axis=axis,
                              training=False), v, gamma, beta, mean, var)
    return g.emit_tuple_items(bn, 1, layout=v.layout)[0]


def _attention(g: Grower) -> Value:
    q = g.operand(ranks=(4,), static=True, max_elements=96)
    b, s, h, d = q.shape
    kv_len = g.choice((s, 2, 3))
    k = g.tensor((b, kv_len, h, d), "k")
    val = g.tensor((b, kv_len, h, g.choice((d, 2))), "v")
    causal = g.choice((None, "TopLeft", "BottomRight"))
    call = nn.attention(q.expr, k.expr, val.expr, scale=g.choice((None, 0.5)),
                        causal_mask=causal)
    return g.emit(call, q, k, val)


# -- indexing and shapes ------------------------------------------------------------------------
def _take(g: Grower) -> Value:
    v = g.operand(static=True)
    axis = g.integer(0, v.rank - 1)
    count = g.choice((1, 2, 3))
    indices = g.rng.integers(0, v.shape[axis], size=(count,) if g.flag() else ())
    idx = g.constant(np.asarray(indices, dtype=g.choice(("int64", "int32"))))
    return g.emit(op.take(v.expr, idx.expr, axis=axis), v)


def _strided_slice(g: Grower) -> Value | None:
    v = g.operand(lambda v: any(isinstance(d, int) and d >= 2 for d in v.shape))
    axes = [a for a, d in enumerate(v.shape) if isinstance(d, int) and d >= 2]
    axis = g.choice(axes)
    size = v.shape[axis]
    begin = g.integer(0, size - 1)
    stride = g.choice((1, 2))
    if g.flag():  # counted from the end
        begin, end = begin - size, size
    else:
        end = g.integer(begin + 1, size)
    return g.emit(op.strided_slice(v.expr, [axis], [begin], [end], [stride]), v)


def _concat(g: Grower) -> Value:
    a = g.operand()
    axis = g.integer(0, a.rank - 1)
    shape = tuple(g.choice((1, 2, 3)) if i == axis and isinstance(d, int) else d
                  for i, d in enumerate(a.shape))
    if not isinstance(a.shape[axis], int):
        shape = a.shape
    b = g.tensor(shape)
    parts = [a, b] if g.flag() else [b, a, a]
    return g.emit(op.concat([p.expr for p in parts], axis=axis), *parts, layout=a.layout)


def _split(g: Grower) -> Value | None:
    v = g.operand(lambda v: any(isinstance(d, int) and d >= 2 for d in v.shape))
    axes = [a for a, d in enumerate(v.shape) if isinstance(d, int) and d >= 2]
    axis = g.choice(axes)
    size = v.shape[axis]
    if g.flag() and size > 2:  # split at indices
        spec: int | list[int] = [g.integer(1, size - 1)]
        count = 2
    else:
        count = 2 if size % 2 == 0 else size
        spec = count
    parts = g.emit(op.split(v.expr, spec, axis=axis), v)
    return g.emit_tuple_items(parts, count, layout=v.layout)[-1]


def _stack(g: Grower) -> Value:
    a = g.operand(ranks=(1, 2, 3, 4))
    b = g.tensor(a.shape)
    return g.emit(op.stack([a.expr, b.expr], axis=g.integer(0, a.rank)), a, b)


def _tuple(g: Grower) -> Value:
    a, b = g.operand(), g.operand()
    pair = g.emit(relax.Tuple([a.expr, b.expr]), a, b)
    return g.emit_tuple_items(pair, 2)[-1]


def _reshape(g: Grower) -> Value | None:
    v = g.operand(lambda v: v.static and v.rank >= 1, static=True)
    total = v.size
    options = [(total,), (1, total)]
    for first in (2, 3, 4):
        if total % first == 0 and total > first:
            options.append((first, total // first))
            options.append((first, -1))
    if total % 4 == 0 and total >= 8:
        options.append((2, 2, total // 4))
    return g.emit(op.reshape(v.expr, g.choice(options)), v)


def _permute(g: Grower) -> Value:
    v = g.operand(ranks=(2, 3, 4, 5))
    axes = list(range(v.rank))
    shift = g.integer(1, v.rank - 1)
    axes = axes[shift:] + axes[:shift] if g.flag() else axes[::-1]
    if g.flag() and v.rank == 4:  # between NCHW and NHWC
        axes = [0, 2, 3, 1] if v.layout != "NHWC" else [0, 3, 1, 2]
        layout = "NHWC" if v.layout != "NHWC" else "NCHW"
        return g.emit(op.permute_dims(v.expr, axes), v, layout=layout)
    return g.emit(op.permute_dims(v.expr, axes), v)


def _expand_dims(g: Grower) -> Value:
    v = g.operand(ranks=(1, 2, 3, 4))
    return g.emit(op.expand_dims(v.expr, axis=g.integer(-v.rank - 1, v.rank)), v)


def _squeeze(g: Grower) -> Value:
    v = g.pick(lambda v: g.is_float(v) and 1 in v.shape and v.rank >= 2)
    if v is None:
        base = g.operand(ranks=(1, 2, 3))
        v = g.emit(op.expand_dims(base.expr, axis=g.integer(0, base.rank)), base)
    axes = [i for i, d in enumerate(v.shape) if d == 1]
    # every size-1 axis (axis=None) only when the shape is known: a symbolic axis may be
    # 1 too, so the result would have no shape, which llvm cannot build
    axis = None if g.flag() and v.static else [g.choice(axes)]
    return g.emit(op.squeeze(v.expr, axis=axis), v)


def _flatten(g: Grower) -> Value:
    v = g.operand(static=True)
    return g.emit(op.flatten(v.expr), v)


def _broadcast_to(g: Grower) -> Value:
    v = g.operand(lambda v: 1 in v.shape or v.rank < 4, ranks=(1, 2, 3), static=True)
    shape = tuple(g.choice((2, 3)) if d == 1 else d for d in v.shape)
    if g.flag():
        shape = (g.choice((1, 2)),) + shape
    return g.emit(op.broadcast_to(v.expr, shape), v)


def _tri(name: str) -> OpEntry:
    fn = getattr(op, name)

    def emit(g: Grower) -> Value:
        v = g.operand(lambda v: isinstance(v.shape[-1], int) and isinstance(v.shape[-2], int),
                      ranks=(2, 3))
        return g.emit(fn(v.expr, k=g.integer(-1, 1)), v)
    return OpEntry(f"relax.{name}", "a float tensor of rank 2 or more", "the same type",
                   emit)


def _flip(g: Grower) -> Value:
    v = g.operand(static=True)
    return g.emit(op.flip(v.expr, axis=g.integer(0, v.rank - 1)), v)


def _tile(g: Grower) -> Value:
    v = g.operand(static=True, ranks=(1, 2, 3), max_elements=64)
    return g.emit(op.tile(v.expr, [g.integer(1, 2) for _ in range(v.rank)]), v)


def _repeat(g: Grower) -> Value:
    v = g.operand(static=True, ranks=(1, 2, 3), max_elements=64)
    return g.emit(op.repeat(v.expr, g.integer(1, 3), axis=g.integer(0, v.rank - 1)), v)


def _sort(g: Grower) -> Value:
    v = g.operand(static=True)
    return g.emit(op.sort(v.expr, axis=g.integer(-1, v.rank - 1), descending=g.flag()), v)


def _entries() -> list[OpEntry]:
    out: list[OpEntry] = [_unary(n, d, getattr(op, n)) for n, d in UNARY.items()]
    out += [_unary(n, "", getattr(nn, n)) for n in NN_UNARY]
    # relu6 is built as a clip: the entry is named by the operator it emits
    out = [replace(e, name="relax.clip", variant="relu6") if e.name == "relax.nn.relu6" else e
           for e in out]
    out += [OpEntry("relax.nn.leakyrelu", "a float tensor", "the same type", _leakyrelu),
            OpEntry("relax.nn.prelu", "a float tensor, alpha along one axis",
                    "the same type", _prelu),
            OpEntry("relax.clip", "a float tensor, two bounds", "the same type", _clip)]
    out += [_binary(n, d) for n, d in BINARY.items()]
    out += [_compare(n) for n in COMPARE]
    out += [_predicate(n) for n in ("isfinite", "isnan", "isinf")]
    out += [_logical(n) for n in ("logical_and", "logical_or", "logical_xor", "logical_not")]
    out += [OpEntry("relax.where", "a bool condition and two tensors, all broadcasting",
                    "the broadcast shape", _where),
            OpEntry("relax.astype", "any tensor", "the same shape in another dtype",
                    _astype)]
    out += [_reduce(n) for n in ("sum", "mean", "max", "min", "prod", "variance", "std")]
    out += [_arg_reduce(n) for n in ("argmax", "argmin")]
    out += [OpEntry("relax.cumsum", "a float tensor, an axis", "the same type", _cumsum),
            OpEntry("relax.cumprod", "a float tensor near one, an axis", "the same type",
                    _cumprod, ONLY32),
            _softmax(nn.softmax, "softmax"), _softmax(nn.log_softmax, "log_softmax")]
    out += [OpEntry("relax.matmul", "(..., m, k) and (..., k, n) with broadcasting batch "
                    "axes, or rank 1 on either side", "(..., m, n), in out_dtype", _matmul),
            OpEntry("relax.matmul", "(..., k) and an (n, k) weight", "(..., n)", _linear,
                    variant="linear"),
            OpEntry("relax.outer", "two vectors", "a matrix", _outer),
            OpEntry("relax.einsum", "two matrices, ij,jk->ik", "a matrix", _einsum)]
    out += [_conv(1), _conv(2), _conv(3), _conv_transpose(1), _conv_transpose(2)]
    out += [_pool(kind, dims) for kind in ("max", "avg") for dims in (1, 2, 3)]
    out += [_adaptive(dims) for dims in (1, 2, 3)]
    out += [OpEntry("relax.image.resize2d", "rank-4 data, either layout",
                    "the resized tensor", _resize2d),
            OpEntry("relax.nn.pad", "a tensor, widths before and after each axis",
                    "the padded tensor", _pad)]
    out += [OpEntry("relax.nn.layer_norm", "data, gamma and beta over the last axes",
                    "the same type", _layer_norm),
            OpEntry("relax.nn.rms_norm", "data, a weight over the last axis",
                    "the same type", _rms_norm),
            OpEntry("relax.nn.group_norm", "rank 3-4 data with an even channel count",
                    "the same type", _group_norm),
            OpEntry("relax.nn.instance_norm", "rank 3-4 channels-first data",
                    "the same type", _instance_norm, ONLY32),
            OpEntry("relax.nn.batch_norm", "data, four (C,) parameters on its channel axis",
                    "a 3-tuple, its first field read", _batch_norm, ONLY32),
            OpEntry("relax.nn.attention", "q (B, S, H, D), k (B, L, H, D), v (B, L, H, Dv)",
                    "(B, S, H, Dv)", _attention, ONLY32)]
    out += [OpEntry("relax.take", "a tensor, constant int indices along an axis",
                    "the gathered tensor", _take),
            OpEntry("relax.strided_slice", "a tensor, an axis of size 2 or more",
                    "the slice", _strided_slice),
            OpEntry("relax.concat", "tensors equal but along the axis", "the joined tensor",
                    _concat),
            OpEntry("relax.split", "a tensor, sections or indices", "a tuple, fields read",
                    _split),
            OpEntry("relax.stack", "tensors of one shape", "one more axis", _stack),
            OpEntry("relax.Tuple", "any two tensors", "a tuple, fields read", _tuple),
            OpEntry("relax.reshape", "a static tensor, a shape of the same size (or -1)",
                    "the reshaped tensor", _reshape),
            OpEntry("relax.permute_dims", "a tensor of rank 2 or more, a permutation",
                    "the transposed tensor", _permute),
            OpEntry("relax.expand_dims", "a tensor, an axis", "one more axis", _expand_dims),
            OpEntry("relax.squeeze", "a tensor with size-1 axes", "fewer axes", _squeeze),
            OpEntry("relax.flatten", "a static tensor", "a vector", _flatten),
            OpEntry("relax.broadcast_to", "a tensor, a shape it broadcasts to",
                    "that shape", _broadcast_to),
            _tri("tril"), _tri("triu"),
            OpEntry("relax.flip", "a tensor, an axis", "the same type", _flip),
            OpEntry("relax.tile", "a tensor, repeats per axis", "the tiled tensor", _tile),
            OpEntry("relax.repeat", "a tensor, repeats along an axis", "the longer tensor",
                    _repeat),
            OpEntry("relax.sort", "a tensor, an axis", "the same type", _sort)]
    return out


#: Entries picked more often: what passes rewrite most (convolutions, matmuls, the
#: broadcasting arithmetic around them, layout and shape changes).
WEIGHTS = {"relax.nn.conv2d": 4, "relax.matmul": 3, "relax.add": 2, "relax.subtract": 2,
           "relax.multiply": 2, "relax.permute_dims": 2, "relax.reshape": 2,
           "relax.nn.softmax": 2, "relax.nn.layer_norm": 2, "relax.sum": 2}


def _weighted(entries: list[OpEntry]) -> list[OpEntry]:
    return [replace(e, weight=WEIGHTS.get(e.name, 1)) for e in entries]


#: Every entry programs are grown from.
CATALOGUE: tuple[OpEntry, ...] = tuple(_weighted(_entries()))

#: Entries that llvm builds but not in float16 in 0.27, and why (docs/tvm-bugs.md).
FLOAT16_UNSAFE = {
    "relax.nn.batch_norm": "legalised to a float32 result (docs/tvm-bugs.md)",
    "relax.nn.attention": "legalised to a float32 result (docs/tvm-bugs.md)",
    "relax.nn.instance_norm": "legalised to a float32 result, as batch_norm",
    **{f"relax.{name}": f"llvm has no float16 tirx.{name} (unknown intrinsic)"
       for name in ("acos", "acosh", "asin", "asinh", "atan", "cosh", "sinh", "atan2")},
}

#: Operators of relax.op / relax.op.nn left out of the catalogue, and why.
EXCLUDED = {
    # results not a function of the inputs, or shapes that depend on the data
    "relax.nn.dropout": "random at training time (identity in inference)",
    "relax.multinomial_from_uniform": "sampling",
    "relax.nonzero": "data-dependent output shape",
    "relax.unique": "data-dependent output shape",
    "relax.all_class_non_max_suppression": "data-dependent output shape",
    # plumbing, not computation
    "relax.call_tir": "calls a PrimFunc: not an operator of a graph",
    "relax.call_dps_packed": "calls an external function",
    "relax.call_pure_packed": "calls an external function",
    "relax.print": "side effect",
    "relax.assert_op": "side effect",
    "relax.shape_of": "shape plumbing (R.Shape results)",
    "relax.tensor_to_shape": "shape plumbing (R.Shape results)",
    "relax.hint_on_device": "device annotation",
    "relax.to_vdevice": "device annotation",
    # llvm cannot build them in 0.27 (tried)
    "relax.nn.pixel_shuffle": "LegalizeOps calls topi.nn.pixel_shuffle, which 0.27 lacks "
                              "(AttributeError)",
    # creation ops: outputs constant whatever the inputs (no evidence for a comparison)
    "relax.zeros": "constant output", "relax.ones": "constant output",
    "relax.full": "constant output", "relax.arange": "constant output",
    "relax.eye": "constant output",
}


def entries_for(dtype: str) -> list[OpEntry]:
    """The entries that build in ``dtype``."""
    return [e for e in CATALOGUE if dtype in e.dtypes and
            not (dtype == "float16" and e.name in FLOAT16_UNSAFE)]
