"""A hypothesis strategy for random, well-typed Relax programs that look like networks.

:func:`relax_programs` draws one ``main`` with one dataflow block, built from the ops
real models are made of and that passes rewrite: ``conv2d`` (``NCHW`` and ``NHWC`` data,
``OIHW`` / ``HWIO`` / ``OHWI`` kernels, 1x1 and 3x3, padded or not; the first step of
programs with an image input, often followed by a norm or a bias and an activation as in
CNNs, with channel counts that collide with the spatial size), bias adds spelled for the
layout, inference ``batch_norm`` and ``layer_norm``, activations, ``matmul``,
``softmax``, pooling, reductions, ``reshape``, layout changes (``permute_dims`` between
``NCHW`` and ``NHWC``), ``concat`` and ``split`` (tuples), explicit tuples read back, and
dead code.  Inputs may have a symbolic batch or sequence length.  Every operand an op
accepts as a tensor -- weights, biases, norm parameters -- is drawn as a constant, as an
input of ``main`` or as a value computed from one (``w * 1.25``), so passes that only
handle constants meet the other two; a program either binds all its weights as
constants or takes all as inputs (as importers do), or mixes the three.

Nothing in it is aimed at a particular pass: it is the differential tester's default
(:func:`patternkit.fuzz_pass`), and what it finds there it finds by chance -- e.g. TVM
0.27's ``FoldBatchnormToConv2D`` on ``NHWC`` data (``docs/tvm-bugs.md``).

Values are tracked with their shapes (ints, or the symbolic ``tirx.Var``) and, for rank-4
tensors, their layout, so every op gets operands it accepts.  Weights are drawn with
variance ``1 / fan_in`` and variances are positive, so outputs stay of order one and a
numeric comparison means something.  The draws shrink well: fewer steps, earlier
(simpler) choices, a zero seed for the constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

__all__ = ["relax_programs", "STEP_KINDS"]

#: Step kinds in the order shrinking prefers them (the first is the simplest).
STEP_KINDS = ("activation", "binary", "bias", "conv2d", "norm", "matmul", "layout", "pool",
              "reduce", "reshape", "concat", "split", "tuple", "softmax", "dead")

ACTIVATIONS = ("relu", "sigmoid", "tanh", "gelu", "silu", "clip")
BINARY = ("add", "multiply", "subtract", "maximum")
KERNEL_LAYOUTS = ("OIHW", "HWIO", "OHWI")
#: What follows a conv2d step: nothing, or a batch norm or a bias (then maybe an activation).
CONV_FOLLOWERS = ("none", "norm", "bias")
OPERAND_KINDS = ("constant", "input", "computed")
#: How a program's operands are drawn: as importers emit them -- every weight bound as a
#: constant, or every weight a parameter of ``main`` -- or each one on its own.
OPERAND_STYLES = ("constants", "inputs", "mixed")
TO_OTHER_LAYOUT = {"NCHW": ("NHWC", [0, 2, 3, 1]), "NHWC": ("NCHW", [0, 3, 1, 2])}


@dataclass(frozen=True)
class _Value:
    expr: Any
    shape: tuple  # ints, or symbolic tirx.Vars
    layout: str | None = None  # "NCHW" / "NHWC" for rank-4 images

    @property
    def channel_axis(self) -> int:
        return self.layout.index("C") if self.layout else len(self.shape) - 1

    @property
    def static_tail(self) -> bool:
        return all(isinstance(d, int) for d in self.shape[1:])


class _ProgramBuilder:
    """Builds one program from hypothesis draws (see the module docstring)."""

    def __init__(self, draw, st, symbolic: bool, dtype: str, training: bool):
        self.draw, self.st = draw, st
        self.symbolic, self.dtype, self.training = symbolic, dtype, training
        self.rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
        self.operand_style = draw(st.sampled_from(OPERAND_STYLES))
        self.values: list[_Value] = []
        self.inputs: list[relax.Var] = []
        self.used: set = set()
        self.dead: set = set()

    # -- draws ----------------------------------------------------------------------------
    def choice(self, options):
        return self.draw(self.st.sampled_from(options))

    def flag(self) -> bool:
        return self.draw(self.st.booleans())

    def pick(self, accepts=lambda v: True) -> _Value | None:
        """A value an op accepts; the newest one half of the time (chains are common)."""
        candidates = [v for v in self.values if accepts(v)]
        if not candidates:
            return None
        if self.flag():
            return candidates[-1]
        return candidates[self.draw(self.st.integers(0, len(candidates) - 1))]

    def pick_any(self) -> _Value:
        """Any value, as :meth:`pick` draws it: there is always one (the first input)."""
        value = self.pick()
        assert value is not None, "a program starts with an input"
        return value

    # -- leaves ----------------------------------------------------------------------------
    def _symbol(self, name: str):
        return tvm.tirx.Var(name, "int64")

    def add_inputs(self) -> None:
        batch = self._symbol("n") if self.symbolic and self.flag() else None
        for index in range(self.draw(self.st.integers(1, 2))):
            kind = self.choice(("image", "matrix", "sequence"))
            lead = batch if batch is not None and self.flag() else self.choice((1, 2))
            if kind == "image":
                layout = self.choice(("NCHW", "NHWC"))
                c, h = self.choice((2, 3, 4)), self.choice((4, 6, 8))
                dims = {"N": lead, "C": c, "H": h, "W": h}
                shape = tuple(dims[a] for a in layout)
            elif kind == "matrix":
                layout, shape = None, (lead, self.choice((4, 6, 8)))
            else:
                layout, shape = None, (lead, self.choice((3, 4)), self.choice((4, 8)))
            var = relax.Var(f"x{index}", relax.TensorType(shape, self.dtype))
            self.inputs.append(var)
            self.values.append(_Value(var, shape, layout))

    def _const(self, shape, low=-1.0, high=1.0, scale=1.0):
        data = self.rng.uniform(low, high, size=shape) * scale
        return relax.const(data.astype("float32"), self.dtype)

    def operand(self, bb, role: str, shape: tuple, positive: bool = False, scale: float = 1.0):
        """A tensor operand: a constant, an input of ``main``, or a value computed from one
        (:data:`OPERAND_STYLES`: the program's style may fix the choice).
        """
        kind = {"constants": "constant", "inputs": "input"}.get(self.operand_style) \
            or self.choice(OPERAND_KINDS)
        low, high = (0.5, 1.5) if positive else (-1.0, 1.0)
        if kind == "input" or (kind == "computed" and self.flag()):
            leaf = relax.Var(f"{role}{len(self.inputs)}", relax.TensorType(shape, self.dtype))
            self.inputs.append(leaf)  # inputs named var* are drawn positive by the checks
        else:
            leaf = self._const(shape, low, high, scale)
        if kind != "computed":
            return leaf
        factor = relax.const(float(self.rng.uniform(0.75, 1.25)), self.dtype)
        return bb.emit(relax.op.multiply(leaf, factor))

    # -- steps -----------------------------------------------------------------------------
    def stem(self, bb) -> None:
        """Programs with an image input start as CNNs do: with a conv block."""
        if any(v.layout for v in self.values):
            self._conv2d(bb)

    def step(self, bb) -> None:
        kind = self.choice(STEP_KINDS)
        if not getattr(self, f"_{kind}")(bb):
            self._activation(bb)

    def emit(self, bb, call, shape, layout, *read) -> _Value:
        value = _Value(bb.emit(call), tuple(shape), layout)
        self.used.update(id(v.expr) for v in read)
        self.values.append(value)
        return value

    def _activation(self, bb, value: _Value | None = None) -> bool:
        value = value or self.pick_any()
        name = self.choice(ACTIVATIONS)
        call = (relax.op.clip(value.expr, 0.0, 6.0) if name == "clip"
                else getattr(relax.op.nn if hasattr(relax.op.nn, name) else relax.op, name)(
                    value.expr))
        self.emit(bb, call, value.shape, value.layout, value)
        return True

    def _binary(self, bb) -> bool:
        value = self.pick_any()
        same = [v for v in self.values if _same(v.shape, value.shape)]
        read: tuple[_Value, ...]
        if self.flag() and all(isinstance(d, int) for d in value.shape):
            other, read = self._const(value.shape), ()
        else:
            partner = same[self.draw(self.st.integers(0, len(same) - 1))]
            other, read = partner.expr, (partner,)
        op = self.choice(BINARY)
        if op == "subtract" and other is value.expr:  # x - x is zero: no evidence of anything
            op = "add"
        call = getattr(relax.op, op)(value.expr, other)
        self.emit(bb, call, value.shape, value.layout, value, *read)
        return True

    def _bias(self, bb, value: _Value | None = None) -> bool:
        value = value or self.pick(lambda v: isinstance(v.shape[v.channel_axis], int))
        if value is None:
            return False
        c = value.shape[value.channel_axis]
        if value.layout == "NCHW":
            shape = self.choice(((1, c, 1, 1), (c, 1, 1)))
        else:  # channels last: (C,) broadcasts onto them, so does (1, 1, 1, C)
            shape = self.choice(((c,), (1,) * (len(value.shape) - 1) + (c,)))
        bias = self.operand(bb, "b", shape)
        self.emit(bb, relax.op.add(value.expr, bias), value.shape, value.layout, value)
        return True

    def _conv2d(self, bb) -> bool:
        value = self.pick(lambda v: v.layout is not None and v.static_tail)
        if value is None:
            return False
        layout, kernel_layout = value.layout, self.choice(KERNEL_LAYOUTS)
        assert layout is not None  # picked for it
        dims = dict(zip(layout, value.shape))
        k = self.choice((3, 1))
        pad = k // 2 if self.flag() or dims["H"] < k else 0  # an image smaller than k: pad
        h = dims["H"] - k + 1 + 2 * pad
        # Half the time the channel count collides with the output's spatial size, where
        # a pass that mistakes one axis for the other still type-checks.
        out_c = h if self.flag() else self.choice((2, 4, 8))
        kernel = {"O": out_c, "I": dims["C"], "H": k, "W": k}
        weight = self.operand(bb, "w", tuple(kernel[a] for a in kernel_layout),
                              scale=np.sqrt(3.0 / (dims["C"] * k * k)))
        call = relax.op.nn.conv2d(value.expr, weight, padding=pad, data_layout=layout,
                                  kernel_layout=kernel_layout)
        out = {"N": dims["N"], "C": out_c, "H": h, "W": h}
        conv = self.emit(bb, call, tuple(out[a] for a in layout), layout, value)
        # CNNs are built of conv -> batch norm / bias -> activation blocks.
        follow = self.choice(CONV_FOLLOWERS)
        if follow == "norm":
            self._norm(bb, conv)
        elif follow == "bias":
            self._bias(bb, conv)
        if follow != "none" and self.flag():
            self._activation(bb, self.values[-1])
        return True

    def _norm(self, bb, value: _Value | None = None) -> bool:
        value = value or self.pick(lambda v: isinstance(v.shape[v.channel_axis], int))
        if value is None:
            return False
        size = value.shape[value.channel_axis]
        if value.layout is None and self.flag():  # sequences and matrices: layer_norm
            gamma, beta = (self.operand(bb, role, (size,)) for role in ("gamma", "beta"))
            call = relax.op.nn.layer_norm(value.expr, gamma, beta, axes=[-1])
            self.emit(bb, call, value.shape, value.layout, value)
            return True
        gamma, beta, mean = (self.operand(bb, role, (size,)) for role in ("gamma", "beta", "mean"))
        var = self.operand(bb, "var", (size,), positive=True)
        bn = bb.emit(relax.op.nn.batch_norm(value.expr, gamma, beta, mean, var,
                                            axis=value.channel_axis, training=self.training))
        self.used.add(id(value.expr))
        if self.flag():  # a statistic nobody reads, as importers leave it
            self.dead.add(id(bb.emit(relax.TupleGetItem(bn, 1))))
        self.emit(bb, relax.TupleGetItem(bn, 0), value.shape, value.layout)
        return True

    def _matmul(self, bb) -> bool:
        value = self.pick(lambda v: v.layout is None and isinstance(v.shape[-1], int))
        if value is None:
            return False
        k, m = value.shape[-1], self.choice((4, 8))
        weight = self.operand(bb, "w", (k, m), scale=np.sqrt(3.0 / k))
        self.emit(bb, relax.op.matmul(value.expr, weight), value.shape[:-1] + (m,), None, value)
        return True

    def _layout(self, bb) -> bool:
        value = self.pick(lambda v: len(v.shape) in (2, 4))
        if value is None:
            return False
        if value.layout is not None:
            layout, axes = TO_OTHER_LAYOUT[value.layout]
        elif not all(isinstance(d, int) for d in value.shape):
            return False  # a transposed symbolic batch would meet matmul weights
        else:
            layout, axes = None, [1, 0]
        shape = tuple(value.shape[a] for a in axes)
        self.emit(bb, relax.op.permute_dims(value.expr, axes), shape, layout, value)
        return True

    def _pool(self, bb) -> bool:
        value = self.pick(lambda v: v.layout is not None)
        if value is None or value.layout is None:
            return False
        dims = dict(zip(value.layout, value.shape))
        op = self.choice((relax.op.nn.max_pool2d, relax.op.nn.avg_pool2d))
        if dims["H"] % 2 == 0 and self.flag():
            call, h = op(value.expr, pool_size=2, strides=2, layout=value.layout), dims["H"] // 2
        else:
            call, h = op(value.expr, pool_size=3, padding=1, layout=value.layout), dims["H"]
        out = {**dims, "H": h, "W": h}
        self.emit(bb, call, tuple(out[a] for a in value.layout), value.layout, value)
        return True

    def _reduce(self, bb) -> bool:
        value = self.pick_any()
        if value.layout is not None:  # global average pooling, kept 4-D
            axes = [value.layout.index("H"), value.layout.index("W")]
        else:
            axes = [len(value.shape) - 1]
        op = self.choice((relax.op.mean, relax.op.sum, relax.op.max))
        shape = tuple(1 if i in axes else d for i, d in enumerate(value.shape))
        self.emit(bb, op(value.expr, axis=axes, keepdims=True), shape, value.layout, value)
        return True

    def _reshape(self, bb) -> bool:
        value = self.pick(lambda v: v.static_tail)
        if value is None:
            return False
        flat = int(np.prod(value.shape[1:]))
        shape: tuple[Any, ...]
        if len(value.shape) >= 3 or flat % 2:
            shape = (value.shape[0], flat)
        else:
            shape = (value.shape[0], 2, flat // 2)
        self.emit(bb, relax.op.reshape(value.expr, shape), shape, None, value)
        return True

    def _concat(self, bb) -> bool:
        value = self.pick(lambda v: isinstance(v.shape[v.channel_axis], int))
        if value is None:
            return False
        same = [v for v in self.values if _same(v.shape, value.shape) and v.layout == value.layout]
        other = same[self.draw(self.st.integers(0, len(same) - 1))]
        axis = value.channel_axis
        shape = tuple(2 * d if i == axis else d for i, d in enumerate(value.shape))
        self.emit(bb, relax.op.concat([value.expr, other.expr], axis=axis), shape,
                  value.layout, value, other)
        return True

    def _split(self, bb) -> bool:
        value = self.pick(lambda v: isinstance(v.shape[v.channel_axis], int)
                          and v.shape[v.channel_axis] % 2 == 0)
        if value is None:
            return False
        axis = value.channel_axis
        parts = bb.emit(relax.op.split(value.expr, 2, axis=axis))
        self.used.update((id(value.expr), id(parts)))
        half = tuple(d // 2 if i == axis else d for i, d in enumerate(value.shape))
        for index in ((0, 1) if self.flag() else (self.draw(self.st.integers(0, 1)),)):
            self.emit(bb, relax.TupleGetItem(parts, index), half, value.layout)
        return True

    def _tuple(self, bb) -> bool:
        first, second = self.pick_any(), self.pick_any()
        pair = bb.emit(relax.Tuple([first.expr, second.expr]))
        self.used.update((id(first.expr), id(second.expr), id(pair)))
        back = self.draw(self.st.integers(0, 1))
        chosen = (first, second)[back]
        self.emit(bb, relax.TupleGetItem(pair, back), chosen.shape, chosen.layout)
        return True

    def _softmax(self, bb) -> bool:
        value = self.pick(lambda v: v.layout is None)
        if value is None:
            return False
        self.emit(bb, relax.op.nn.softmax(value.expr, axis=-1), value.shape, None, value)
        return True

    def _dead(self, bb) -> bool:
        value = self.pick_any()
        self.dead.add(id(bb.emit(relax.op.nn.relu(value.expr))))
        return True

    def outputs(self) -> list:
        inputs = {id(v) for v in self.inputs}
        return [v.expr for v in self.values if id(v.expr) not in self.used
                and id(v.expr) not in self.dead and id(v.expr) not in inputs]


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(
        (x == y) if isinstance(x, int) and isinstance(y, int) else x is y for x, y in zip(a, b))


def relax_programs(max_ops: int = 8, *, symbolic: bool = True,
                   dtypes: tuple[str, ...] = ("float32",), training: bool = False):
    """A hypothesis strategy drawing random well-typed Relax programs (see module docstring).

    Parameters
    ----------
    max_ops : int
        Largest number of steps (at least one is taken; a step may emit a few bindings:
        an operand computed for it, a batch norm's tuple and its fields).
    symbolic : bool
        Let inputs share a symbolic batch (or sequence) dimension ``n``.
    dtypes : tuple of str
        The dtype of each program is drawn from these.
    training : bool
        The ``training`` flag of every ``batch_norm`` (importers emit ``False``; with
        ``True`` a batch norm normalises with batch statistics).

    Returns
    -------
    hypothesis.strategies.SearchStrategy[tvm.IRModule]
    """
    from hypothesis import strategies as st  # optional test dependency

    @st.composite
    def programs(draw):
        spec = _ProgramBuilder(draw, st, symbolic, draw(st.sampled_from(dtypes)), training)
        spec.add_inputs()
        bb = relax.BlockBuilder()
        with bb.function("main"):
            with bb.dataflow():
                spec.stem(bb)
                for _ in range(draw(st.integers(1, max(1, max_ops)))):
                    spec.step(bb)
                outputs = spec.outputs() or [spec.values[0].expr]  # every step was dead code
                result = outputs[0] if len(outputs) == 1 else relax.Tuple(outputs)
                gv = bb.emit_output(result)
            bb.emit_func_output(gv, params=spec.inputs)
        return bb.get()

    return programs()
