"""Random Relax programs grown from each operator's typing rule.

:func:`relax_programs` (``strategies.py``) draws programs that look like networks: a
conv block, a norm, an activation.  A pass that rewrites anything else -- a reduction
with ``keepdims``, a broadcast of a size-1 axis against a full one, a ``strided_slice``
of a transposed tensor, a float16 matmul accumulating in float32 -- never meets such a
program there.  :func:`op_programs` draws programs one operator at a time instead: each
step picks an entry of the operator catalogue (:mod:`~patternkit.testing.op_catalogue`),
and the entry finds operands it accepts among the values computed so far, or makes them
(a new input, a constant, or a value computed from an input by an elementwise chain, a
transpose or a reshape), then emits the call.  Relax's own type inference gives each
result its type; the grower keeps the shapes (ints, or the symbolic ``tirx.Var`` of a
``R.Tensor(("n", 4))`` parameter), dtypes and, for images, layouts.

What the programs cover: ranks 1 to 5, operands that broadcast against each other
(size-1 axes on either side, scalars, fewer axes), computed operands, ``NCHW``/``NHWC``
data with ``OIHW``/``HWIO`` kernels, ``out_dtype`` wider than the inputs, float16
programs, a symbolic leading dimension (the checks run it at
:data:`~patternkit.verification.numeric.DEFAULT_DIM`), tuples built and read back,
operators returning tuples, and results of every dtype (bool, int64) as outputs.

The choices come from a :class:`Chooser`: hypothesis' ``draw`` in :func:`op_programs`
(so a failing program shrinks: fewer steps, earlier entries, simpler shapes), or a numpy
generator in :func:`grow_program`, which grows one program applying given entries in
order (the tests use it to build every entry of the catalogue).  Constants come from a
numpy generator seeded by one drawn integer, and are scaled by ``1 / sqrt(fan_in)`` for
weights, so outputs stay of order one and a comparison means something.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import tvm
from tvm import relax

__all__ = ["op_programs", "grow_program", "Grower", "Value", "Chooser", "RandomChooser",
           "OPERAND_KINDS", "FLOAT16_SHARE"]

#: How a made operand comes to be, simplest first (shrinking prefers the first).
OPERAND_KINDS = ("input", "constant", "computed")
#: How a computed operand is computed from a new input.
COMPUTED_KINDS = ("chain", "transpose", "reshape")
#: One program in this many is float16 (the others float32).
FLOAT16_SHARE = 4
#: The symbolic dimension of programs that have one.
SYMBOL = "n"
#: Largest element count of a made tensor: programs stay cheap to build and run.
MAX_ELEMENTS = 256


class Chooser:
    """Where the grower's choices come from: ``integer(lo, hi)`` inclusive, ``choice``."""

    def integer(self, low: int, high: int) -> int:  # pragma: no cover - interface
        """An integer in ``[low, high]``."""
        raise NotImplementedError

    def choice(self, options: Sequence[Any]) -> Any:
        """One of ``options`` (earlier ones are simpler)."""
        return options[self.integer(0, len(options) - 1)]


class _HypothesisChooser(Chooser):
    def __init__(self, draw: Callable, st: Any):
        self.draw, self.st = draw, st

    def integer(self, low: int, high: int) -> int:
        return int(self.draw(self.st.integers(low, high)))


class RandomChooser(Chooser):
    """Choices from a seeded numpy generator (no shrinking)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def integer(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``, from the generator."""
        return int(self.rng.integers(low, high + 1))


@dataclass(frozen=True)
class Value:
    """A value of the program: its expression, shape, dtype and (images) layout."""

    expr: Any
    shape: tuple  # ints, or symbolic dimensions as text ("n")
    dtype: str
    layout: str | None = None

    @property
    def rank(self) -> int:
        """The number of axes."""
        return len(self.shape)

    @property
    def static(self) -> bool:
        """Whether every dimension is a number."""
        return all(isinstance(d, int) for d in self.shape)

    @property
    def size(self) -> int:
        """The number of elements (of the static dimensions)."""
        return math.prod(d for d in self.shape if isinstance(d, int))


def _dims(ty: Any) -> tuple:
    """A type's shape as ints and, for symbolic dimensions, their text (``"n"``)."""
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape)


class Grower:
    """Grows one program: operands found or made, calls emitted (see module docstring).

    Catalogue entries call :meth:`operand`, :meth:`tensor` and :meth:`emit`; the choices
    they make go through :meth:`integer`, :meth:`choice` and :meth:`flag`.
    """

    def __init__(self, chooser: Chooser, bb: relax.BlockBuilder, dtype: str,
                 symbolic: bool, seed: int):
        self.chooser, self.bb, self.dtype = chooser, bb, dtype
        self.rng = np.random.default_rng(seed)
        self.symbol = tvm.tirx.Var(SYMBOL, "int64") if symbolic else None
        self.values: list[Value] = []
        self.inputs: list[relax.Var] = []
        self.read: set[int] = set()
        self.emitted: list[str] = []  # catalogue entries applied, in order
        self.refused: list[str] = []  # entries whose call did not type-check, and why

    # -- choices ---------------------------------------------------------------------------
    def integer(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        return self.chooser.integer(low, high)

    def choice(self, options: Sequence[Any]) -> Any:
        """One of ``options``."""
        return self.chooser.choice(list(options))

    def flag(self) -> bool:
        """A coin."""
        return bool(self.integer(0, 1))

    # -- operands --------------------------------------------------------------------------
    def is_float(self, value: Value) -> bool:
        """Whether ``value`` is a tensor of the program's floating dtype."""
        return value.dtype == self.dtype

    def pick(self, accepts: Callable[[Value], bool]) -> Value | None:
        """A value ``accepts``; the newest one half of the time (chains are common)."""
        candidates = [v for v in self.values if accepts(v)]
        if not candidates:
            return None
        if self.flag():
            return candidates[-1]
        return candidates[self.integer(0, len(candidates) - 1)]

    def operand(self, accepts: Callable[[Value], bool] = lambda v: True, *,
                ranks: Iterable[int] = (1, 2, 3, 4, 5), static: bool = False,
                min_dim: int = 1, max_elements: int = MAX_ELEMENTS) -> Value:
        """A floating operand that ``accepts``: computed earlier, or made (a new shape of
        one of ``ranks``, every dimension at least ``min_dim``).
        """
        ranks = tuple(ranks)

        def fits(v: Value) -> bool:
            return (self.is_float(v) and v.rank in ranks and accepts(v)
                    and (v.static or not static)
                    and all(not isinstance(d, int) or d >= min_dim for d in v.shape))

        found = self.pick(fits) if self.values and self.integer(0, 3) else None
        if found is not None:
            return found
        for _ in range(8):
            shape = self.draw_shape(self.choice(ranks), static=static, min_dim=min_dim,
                                    max_elements=max_elements)
            made = self.tensor(shape)
            if accepts(made):
                return made
        raise ValueError("no operand of the ranks asked for was accepted")

    def draw_shape(self, rank: int, *, static: bool = False, min_dim: int = 1,
                   max_elements: int = MAX_ELEMENTS) -> tuple:
        """A shape of ``rank``; the first axis is the symbolic ``n`` some of the time."""
        largest = max(min_dim, int(round(max_elements ** (1.0 / max(rank, 1)))))
        sizes = [s for s in (1, 2, 3, 4, 5, 6, 8) if min_dim <= s <= max(largest, min_dim)]
        sizes = sizes or [min_dim]
        shape: list = [self.choice(sizes) for _ in range(rank)]
        if rank and self.symbol is not None and not static and self.integer(0, 2) == 0:
            shape[0] = SYMBOL
        return tuple(shape)

    def tensor(self, shape: tuple, role: str = "x", *, positive: bool = False,
               scale: float = 1.0, dtype: str | None = None) -> Value:
        """An operand of exactly ``shape``: a new input, a constant, or computed from a
        new input (an elementwise chain, a transpose or a reshape of another shape).
        """
        dtype = dtype or self.dtype
        symbolic = not all(isinstance(d, int) for d in shape)
        kind = self.choice(OPERAND_KINDS)
        if kind == "constant" and symbolic:
            kind = "input"
        if kind == "constant":
            low, high = (0.5, 1.5) if positive else (-1.0, 1.0)
            data = self.rng.uniform(low, high, size=shape) * scale
            return Value(relax.const(data.astype(dtype), dtype), tuple(shape), dtype)
        if kind == "input":
            return self._input(shape, role, positive, dtype)
        how = self.choice(COMPUTED_KINDS)
        if how == "transpose" and len(shape) >= 2:
            axes = list(range(len(shape)))
            axes = axes[1:] + axes[:1] if self.flag() else axes[::-1]
            inverse = [axes.index(i) for i in range(len(axes))]
            leaf = self._input(tuple(shape[a] for a in axes), role, positive, dtype)
            return self.emit(relax.op.permute_dims(leaf.expr, inverse), leaf, layout=None)
        if how == "reshape" and not symbolic and len(shape) >= 1:
            flat = (math.prod(shape),) if len(shape) > 1 else (1, shape[0])
            leaf = self._input(flat, role, positive, dtype)
            return self.emit(relax.op.reshape(leaf.expr, shape), leaf)
        leaf = self._input(shape, role, positive, dtype)
        if positive:
            return self.emit(relax.op.add(relax.op.abs(leaf.expr), relax.const(0.5, dtype)), leaf)
        factor = relax.const(float(self.rng.uniform(0.5, 1.5)) * scale, dtype)
        return self.emit(relax.op.multiply(leaf.expr, factor), leaf)

    def _input(self, shape: tuple, role: str, positive: bool, dtype: str) -> Value:
        # inputs named var* are drawn positive by the campaign (fuzz.POSITIVE)
        name = f"{'var' if positive else role}{len(self.inputs)}"
        if any(isinstance(d, str) and d != SYMBOL for d in shape):
            raise ValueError(f"cannot make an input of shape {shape}")
        dims = [self.symbol if d == SYMBOL else d for d in shape]
        var = relax.Var(name, relax.TensorType(dims, dtype))
        self.inputs.append(var)
        return Value(var, tuple(shape), dtype)

    def constant(self, data: np.ndarray) -> Value:
        """A constant holding ``data`` as it is (indices, masks)."""
        return Value(relax.const(data), tuple(data.shape), str(data.dtype))

    def broadcast_shape(self, shape: tuple) -> tuple:
        """A shape that broadcasts against ``shape``: the same, size-1 axes, fewer axes, a
        scalar, or full axes where ``shape`` has size 1 (broadcasting on either side).
        """
        how = self.integer(0, 5)
        if how == 0 or not shape:
            return shape
        if how == 1:  # size-1 axes on this side
            return tuple(1 if self.flag() else d for d in shape)
        if how == 2:  # fewer axes (trailing alignment)
            return shape[self.integer(1, len(shape)):]
        if how == 3:
            return ()
        if how == 4 and any(d == 1 for d in shape):  # full axes where shape has 1s
            return tuple(self.choice((2, 3)) if d == 1 else d for d in shape)
        if len(shape) < 5:  # one more leading axis
            return (self.choice((1, 2)),) + shape
        return shape

    # -- emitting --------------------------------------------------------------------------
    def emit(self, call: Any, *read: Value, layout: str | None = None) -> Value:
        """Bind ``call``; its type comes from Relax's inference."""
        ty = self.bb.normalize(call).ty
        if isinstance(ty, relax.TensorType) and ty.shape is None:
            raise ValueError(f"{call.op.name if hasattr(call, 'op') else call} has no "
                             f"known shape here")
        var = self.bb.emit(call)
        self.read.update(id(v.expr) for v in read)
        ty = var.ty
        if isinstance(ty, relax.TupleType):
            value = Value(var, (), "tuple", None)
        else:
            value = Value(var, _dims(ty), str(ty.dtype), layout)
        self.values.append(value)
        return value

    def emit_tuple_items(self, tuple_value: Value, count: int, layout: str | None = None
                         ) -> list[Value]:
        """Read some fields of a tuple back (all of them half of the time)."""
        self.read.add(id(tuple_value.expr))
        indices = range(count) if self.flag() else [self.integer(0, count - 1)]
        return [self.emit(relax.TupleGetItem(tuple_value.expr, i), layout=layout)
                for i in indices]

    def outputs(self) -> list:
        """The values nothing reads (not inputs, tuples or constants): the results."""
        inputs = {id(v) for v in self.inputs}
        return [v.expr for v in self.values
                if id(v.expr) not in self.read and id(v.expr) not in inputs
                and v.dtype != "tuple" and not isinstance(v.expr, tvm.ir.Constant)]


def _finish(grower: Grower, bb: relax.BlockBuilder) -> Any:
    outputs = grower.outputs()
    if not outputs:  # every value was read: the last one is the result
        last = [v for v in grower.values if v.dtype != "tuple"]
        outputs = [last[-1].expr]
    result = outputs[0] if len(outputs) == 1 else relax.Tuple(outputs)
    return bb.emit_output(result)


def _grow(chooser: Chooser, entries: Sequence[Any], steps: int | None, dtype: str,
          symbolic: bool, seed: int, in_order: bool) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    with bb.function("main"):
        with bb.dataflow():
            grower = Grower(chooser, bb, dtype, symbolic, seed)
            # Entries are counted from a drawn offset: hypothesis reuses the choices of
            # earlier programs when it makes new ones, and a fixed count would give the
            # same operators again and again.  Both numbers shrink to the first entry.
            weighted = [e for e in entries for _ in range(getattr(e, "weight", 1))]
            offset = grower.integer(0, 2 ** 16) % len(weighted) if not in_order else 0
            rotated = weighted[offset:] + weighted[:offset]
            plan = list(entries) if in_order else \
                [grower.choice(rotated) for _ in range(steps or 1)]
            for entry in plan:
                if in_order:
                    if entry.emit(grower) is None:
                        raise ValueError(f"{entry.key} found no operands it accepts")
                    grower.emitted.append(entry.key)
                    continue
                for attempt in range(4):  # an entry that accepts nothing here: another
                    chosen = entry if attempt == 0 else grower.choice(rotated)
                    if _try(grower, chosen):
                        break
            if not any(v.dtype != "tuple" for v in grower.values):
                made = grower.operand()  # nothing applied: a relu of an input as result
                grower.emit(relax.op.nn.relu(made.expr), made)
            gv = _finish(grower, bb)
        bb.emit_func_output(gv, params=grower.inputs)
    return bb.get()


def _try(grower: Grower, entry: Any) -> bool:
    """Apply ``entry``; ``False`` when it accepts nothing the program offers.

    An operand the entry made before it gave up stays in the program: a value like any
    other, that later entries may read.
    """
    try:
        made = entry.emit(grower)
    except Exception as err:  # noqa: BLE001 - the typing rule refused (recorded)
        grower.refused.append(f"{entry.key}: {type(err).__name__}: {err}"[:300])
        return False
    if made is None:
        return False
    grower.emitted.append(entry.key)
    return True


def grow_program(entries: Sequence[Any], *, seed: int = 0, dtype: str = "float32",
                 symbolic: bool = False) -> tvm.IRModule:
    """One program applying ``entries`` (catalogue entries) in order, choices seeded.

    Raises
    ------
    ValueError
        An entry found no operands it accepts.
    """
    return _grow(RandomChooser(seed), entries, None, dtype, symbolic, seed, in_order=True)


def op_programs(min_ops: int = 3, max_ops: int = 10, *, dtypes: tuple[str, ...] | None = None,
                symbolic: bool = True, entries: Sequence[Any] | None = None,
                drawn_choices: bool = False):
    """A hypothesis strategy of programs grown from the operator catalogue.

    Parameters
    ----------
    min_ops, max_ops : int
        Bounds of the number of catalogue entries applied (each may bind a few values:
        the operands it computes, a tuple and its fields).
    dtypes : tuple of str, optional
        The program's floating dtype is drawn from these; by default float16 one program
        in :data:`FLOAT16_SHARE`, float32 otherwise.
    symbolic : bool
        Let inputs have a symbolic leading dimension ``n``.
    entries : sequence of catalogue entries, optional
        Default: every entry of :data:`~patternkit.testing.op_catalogue.CATALOGUE` that
        builds in the program's dtype.
    drawn_choices : bool
        Draw every choice through hypothesis, so that hypothesis shrinks a failing
        program towards fewer steps, earlier entries and smaller shapes.  By default
        hypothesis draws the dtype, the step count and one seed, and the seed makes the
        other choices: hypothesis builds new examples from the choices of earlier ones,
        so programs of drawn choices come in clumps of near copies (the same operators
        for a few programs running), where seeded ones each differ.  A campaign shrinks
        its failures to their smallest failing cone either way
        (:func:`~patternkit.verification.shrink.shrink_module`).

    Returns
    -------
    hypothesis.strategies.SearchStrategy[tvm.IRModule]
    """
    from hypothesis import strategies as st  # optional test dependency

    from .op_catalogue import entries_for

    @st.composite
    def programs(draw):
        drawn = _HypothesisChooser(draw, st)
        if dtypes is None:
            dtype = "float16" if drawn.integer(0, FLOAT16_SHARE - 1) == 1 else "float32"
        else:
            dtype = drawn.choice(dtypes)
        usable = [e for e in (entries or entries_for(dtype)) if dtype in e.dtypes]
        steps = drawn.integer(min_ops, max(min_ops, max_ops))
        seed = drawn.integer(0, 2 ** 32 - 1)
        chooser = drawn if drawn_choices else RandomChooser(seed)
        with_symbol = symbolic and chooser.integer(0, 2) == 0
        return _grow(chooser, usable, steps, dtype, with_symbol, seed, in_order=False)

    return programs()
