"""Graphs for tests: a pytest-friendly round-trip assertion and hypothesis strategies.

``assert_roundtrip`` wraps :func:`patternkit.check_roundtrip` so a failing round
trip reads as a test failure with the first differing binding printed on both sides.
``relax_graphs()`` draws random, well-formed Relax modules (one ``main`` with one dataflow
block) mixing elementwise and broadcast ops, reductions, ``conv2d``, ``matmul``,
``reshape``, ``concat``, ``split`` with tuple outputs, tensor constants, symbolic
dimensions and intermediates with several users -- the shapes that stress fusion: groups
that return tuples, partially used tuple parameters, lifted constants and symbolic
``tir_vars``.  On request (``dead=True``) they also hold dead bindings, as importers
leave them: unused tuple projections (the ONNX importer's ``lv5 = lv3[1]``), unused ops
and chains of them.  ``batchnorm_chain`` builds the benchmark's chain of batch-norm expressions.

hypothesis is only imported when a strategy is requested, so importing this module in
library code costs nothing.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..verification.roundtrip import RoundTripResult, check_roundtrip

__all__ = ["assert_roundtrip", "relax_graphs", "batchnorm_chain", "batchnorm_pattern",
           "fusion_patterns"]


def assert_roundtrip(mod: tvm.IRModule, fuse=None, *, numeric: bool = False,
                     **options) -> RoundTripResult:
    """Assert ``DefuseOps(fuse(mod))`` gives ``mod`` back; see :func:`check_roundtrip`.

    Raises ``AssertionError`` (a :class:`patternkit.roundtrip.RoundTripError`) naming the
    first differing binding, so pytest reports it as an ordinary test failure.
    """
    __tracebackhide__ = True  # pylint: disable=unused-variable  (pytest: hide this frame)
    return check_roundtrip(mod, fuse, numeric=numeric, **options)


# ---------------------------------------------------------------------- fixed graphs
def batchnorm_chain(n: int, shape: tuple = (1, 16), shared_params: bool = False
                    ) -> tvm.IRModule:
    """``main`` with ``n`` inference batch-norm expressions in one chain.

    Each unit is ``gamma * (x - mean) / sqrt(var + eps) + beta``: 6 bindings and 4
    parameters (distinct per unit unless ``shared_params``).  This is the workload of the
    DefuseOps benchmark and of the rewrite-engine notes.
    """
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    channel = relax.TensorType((shape[-1],), "float32")
    units = 1 if shared_params else n
    params = [[relax.Var(f"{role}{i}", channel) for role in ("mean", "var", "gamma", "beta")]
              for i in range(units)]
    bb = relax.BlockBuilder()
    with bb.function("main", [x] + [p for unit in params for p in unit]):
        with bb.dataflow():
            cur = x
            eps = relax.const(1e-5, "float32")
            for i in range(n):
                mean, var, gamma, beta = params[0 if shared_params else i]
                centred = bb.emit(relax.op.subtract(cur, mean))
                scaled = bb.emit(relax.op.multiply(gamma, centred))
                shifted = bb.emit(relax.op.add(var, eps))
                std = bb.emit(relax.op.sqrt(shifted))
                normed = bb.emit(relax.op.divide(scaled, std))
                cur = bb.emit(relax.op.add(normed, beta))
            out = bb.emit_output(cur)
        bb.emit_func_output(out)
    return bb.get()


def batchnorm_pattern():
    """The pattern of one :func:`batchnorm_chain` unit."""
    x, mean, var, gamma, beta, eps = (wildcard() for _ in range(6))
    centred = is_op("relax.subtract")(x, mean)
    scaled = is_op("relax.multiply")(gamma, centred)
    std = is_op("relax.sqrt")(is_op("relax.add")(var, eps))
    return is_op("relax.add")(is_op("relax.divide")(scaled, std), beta)


def fusion_patterns() -> list:
    """A set of ``FuseOpsByPattern`` patterns that fire on :func:`relax_graphs` output.

    Listed from high to low priority: conv2d with a following add, matmul with an add,
    an activation after a binary op, a lone conv2d / matmul, a reduction, a concat.
    """
    def any_of(*names):
        pattern = is_op(names[0])
        for name in names[1:]:
            pattern = pattern | is_op(name)
        return pattern

    conv = is_op("relax.nn.conv2d")(wildcard(), wildcard())
    matmul = is_op("relax.matmul")(wildcard(), wildcard())
    binary = any_of("relax.add", "relax.multiply", "relax.subtract", "relax.maximum")(
        wildcard(), wildcard())
    activation = any_of("relax.nn.relu", "relax.sigmoid", "relax.tanh")(binary)
    return [
        ("test.conv2d_add", is_op("relax.add")(conv, wildcard())),
        ("test.matmul_add", is_op("relax.add")(matmul, wildcard())),
        ("test.binary_activation", activation),
        ("test.conv2d", conv),
        ("test.matmul", matmul),
        ("test.reduce", any_of("relax.sum", "relax.mean", "relax.max")(wildcard())),
        ("test.concat", is_op("relax.concat")(wildcard())),
    ]


# ---------------------------------------------------------------------- random graphs
class _GraphBuilder:
    """Builds one random graph; the strategy feeds it hypothesis draws.

    Values are tracked with their shapes (ints, or PrimExprs over the symbolic dims) so
    every op is applied to operands it accepts; the block's outputs are all values that
    nobody else uses, so no binding is dead and every op survives fusion -- unless dead
    bindings are asked for, which are kept apart from the values so nothing live reads
    them.
    """

    # bounded ops only: long random chains must not overflow to inf/NaN, which would make
    # the numeric comparison meaningless
    UNARY = ("relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.negative", "relax.abs",
             "relax.cos")
    BINARY = ("relax.add", "relax.multiply", "relax.subtract", "relax.maximum")
    REDUCE = ("relax.sum", "relax.mean", "relax.max")

    def __init__(self, draw, st, symbolic: bool, constants: bool, dead: bool = False):
        self.draw, self.st = draw, st
        self.symbolic, self.constants, self.dead = symbolic, constants, dead
        self.rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        self.values: list = []  # (expr, shape)
        self.users: dict = {}
        self.tuples: list = []       # (split tuple, number of fields): for dead projections
        self.dead_values: list = []  # dead bindings, which only other dead bindings read

    # shapes -------------------------------------------------------------
    @staticmethod
    def _key(shape) -> tuple:
        return tuple(str(d) for d in shape)

    @staticmethod
    def _static(shape) -> bool:
        return all(isinstance(d, int) for d in shape)

    def _ty(self, shape):
        return relax.TensorType(list(shape), "float32")

    def _const(self, shape):
        data = self.rng.uniform(-1, 1, size=shape).astype("float32")
        return relax.const(data, "float32")

    # building -----------------------------------------------------------
    def params(self):
        st, draw = self.st, self.draw
        params = []
        n = tvm.tirx.Var("n", "int64") if self.symbolic and draw(st.booleans()) else None
        for index in range(draw(st.integers(1, 3))):
            if draw(st.booleans()):
                # an image batch: symbolic, as torch.export writes a dynamic batch, or 1
                batch = n if n is not None and draw(st.booleans()) else 1
                shape = (batch, draw(st.sampled_from((2, 3, 4))), draw(st.sampled_from((4, 6))),
                         draw(st.sampled_from((4, 6))))
            else:
                rows = n if n is not None and draw(st.booleans()) else draw(st.sampled_from((2, 3)))
                shape = (rows, draw(st.sampled_from((4, 6, 8))))
            var = relax.Var(f"x{index}", self._ty(shape))
            params.append(var)
            self.values.append((var, shape))
        return params

    def _pick(self, predicate=None):
        candidates = [v for v in self.values if predicate is None or predicate(v)]
        if not candidates:
            return None
        if self.draw(self.st.booleans()):
            # favour the newest value so chains (what fusion groups) are common
            return candidates[-1]
        return candidates[self.draw(self.st.integers(0, len(candidates) - 1))]

    def _use(self, *exprs):
        for expr in exprs:
            self.users[expr] = self.users.get(expr, 0) + 1

    def step(self, bb) -> None:
        st, draw = self.st, self.draw
        kind = draw(st.sampled_from(("unary", "binary", "binary", "broadcast", "reduce",
                                     "conv2d", "matmul", "reshape", "concat", "split")))
        value = self._pick()
        expr, shape = value
        if kind == "unary":
            op = draw(st.sampled_from(self.UNARY))
            out = _make_op(op, expr)
            self._emit(bb, out, shape, expr)
        elif kind == "binary":
            other = self._pick(lambda v: self._key(v[1]) == self._key(shape))
            if self.constants and self._static(shape) and draw(st.booleans()):
                other = (self._const(shape), shape)
            op = draw(st.sampled_from(self.BINARY))
            self._emit(bb, _make_op(op, expr, other[0]), shape, expr, other[0])
        elif kind == "broadcast":
            op = draw(st.sampled_from(self.BINARY))
            last = shape[-1]
            if self.constants and isinstance(last, int):
                operand = self._const((last,))
            else:
                operand = relax.const(float(self.rng.uniform(0.5, 1.5)), "float32")
            self._emit(bb, _make_op(op, expr, operand), shape, expr)
        elif kind == "reduce":
            op = draw(st.sampled_from(self.REDUCE))
            axis = draw(st.integers(0, len(shape) - 1))
            keepdims = draw(st.booleans()) or len(shape) == 1
            new_shape = tuple(1 if i == axis else d for i, d in enumerate(shape)) if keepdims \
                else tuple(d for i, d in enumerate(shape) if i != axis)
            call = getattr(relax.op, op.split(".")[-1])(expr, axis=[axis], keepdims=keepdims)
            self._emit(bb, call, new_shape, expr)
        elif kind == "conv2d":
            value = self._pick(lambda v: len(v[1]) == 4 and self._static(v[1][1:]))
            if value is None:
                return self.step_fallback(bb)
            expr, shape = value
            out_channels = draw(st.sampled_from((2, 4)))
            weight = self._const((out_channels, shape[1], 3, 3))
            call = relax.op.nn.conv2d(expr, weight, padding=[1, 1, 1, 1])
            self._emit(bb, call, (shape[0], out_channels, shape[2], shape[3]), expr)
        elif kind == "matmul":
            value = self._pick(lambda v: len(v[1]) == 2 and isinstance(v[1][1], int))
            if value is None:
                return self.step_fallback(bb)
            expr, shape = value
            cols = draw(st.sampled_from((4, 8)))
            weight = self._const((shape[1], cols))
            self._emit(bb, relax.op.matmul(expr, weight), (shape[0], cols), expr)
        elif kind == "reshape":
            total = 1
            for d in shape:
                total = total * d
            new_shape = (total,) if len(shape) == 2 else (shape[0], total // shape[0]) \
                if self._static(shape) else (total,)
            self._emit(bb, relax.op.reshape(expr, list(new_shape)), new_shape, expr)
        elif kind == "concat":
            other = self._pick(lambda v: self._key(v[1]) == self._key(shape))
            # axis 0 doubles a symbolic dim: fused callees then see ``n * 2``
            axis = draw(st.sampled_from((0, len(shape) - 1)))
            new_shape = tuple(d * 2 if i == axis else d for i, d in enumerate(shape))
            self._emit(bb, relax.op.concat([expr, other[0]], axis=axis), new_shape,
                       expr, other[0])
        elif kind == "split":
            value = self._pick(lambda v: isinstance(v[1][-1], int) and v[1][-1] % 2 == 0)
            if value is None:
                return self.step_fallback(bb)
            expr, shape = value
            tup = bb.emit(relax.op.split(expr, 2, axis=len(shape) - 1))
            self._use(expr)
            half = shape[:-1] + (shape[-1] // 2,)
            # sometimes only one field is used: FuseOps then passes a partial tuple
            for index in ((0, 1) if draw(st.booleans()) else (draw(st.integers(0, 1)),)):
                field = bb.emit(relax.TupleGetItem(tup, index))
                self.values.append((field, half))
            self.users[tup] = 1
            self.tuples.append((tup, 2))
        return None

    def step_dead(self, bb) -> None:
        """Maybe emit a dead binding: a projection nobody reads, an op of a live value
        nobody reads, or an op of an earlier dead binding (a dead chain).
        """
        st, draw = self.st, self.draw
        if draw(st.integers(0, 2)) != 0:
            return
        kind = draw(st.sampled_from(("projection", "op", "chain")))
        if kind == "projection" and self.tuples:
            tup, fields = self.tuples[draw(st.integers(0, len(self.tuples) - 1))]
            bb.emit(relax.TupleGetItem(tup, draw(st.integers(0, fields - 1))))
            return
        if kind == "chain" and self.dead_values:
            source = self.dead_values[draw(st.integers(0, len(self.dead_values) - 1))]
        else:
            source, _ = self._pick()
            if not isinstance(source.ty, relax.TensorType):
                return
        op = draw(st.sampled_from(self.UNARY))
        self.dead_values.append(bb.emit(_make_op(op, source)))

    def step_fallback(self, bb) -> None:
        expr, shape = self._pick()
        self._emit(bb, relax.op.nn.relu(expr), shape, expr)

    def _emit(self, bb, call, shape, *operands):
        var = bb.emit(call)
        self._use(*operands)
        self.values.append((var, shape))

    def outputs(self, params) -> list:
        param_set = set(params)
        return [v for v, _ in self.values if self.users.get(v, 0) == 0 and v not in param_set]


def _make_op(name, *args):
    short = name.split(".")[-1]
    namespace = relax.op.nn if name.startswith("relax.nn.") else relax.op
    return getattr(namespace, short)(*args)


def relax_graphs(max_ops: int = 8, symbolic: bool = True, constants: bool = True,
                 dead: bool = False):
    """A hypothesis strategy drawing random well-formed Relax modules.

    Parameters
    ----------
    max_ops : int
        Largest number of operator steps (at least ``min(3, max_ops)`` are taken; a
        ``split`` step emits up to three bindings).
    symbolic : bool
        Let inputs share a symbolic leading dimension ``n``: the rows of rank-2 inputs
        and the batch of rank-4 (image) inputs, which ``conv2d`` then carries through.
    constants : bool
        Use tensor constants as operands (conv/matmul weights always are constants).
    dead : bool
        Also emit dead bindings after some steps (nothing live reads them): unused tuple
        projections, unused ops of live values, and ops of earlier dead bindings.  Off by
        default, so that existing strategies draw the same graphs.

    Returns
    -------
    hypothesis.strategies.SearchStrategy[tvm.IRModule]

    Notes
    -----
    When hypothesis abandons a draw half-way (it does while searching and shrinking), TVM
    logs "BlockBuilder destroyed with remaining blocks!" on stderr; the half-built module
    is discarded and the message is harmless.
    """
    from hypothesis import strategies as st  # optional test dependency

    @st.composite
    def graphs(draw):
        spec = _GraphBuilder(draw, st, symbolic, constants, dead)
        bb = relax.BlockBuilder()
        params = spec.params()
        with bb.function("main", params):
            with bb.dataflow():
                for _ in range(draw(st.integers(min(3, max_ops), max_ops))):
                    spec.step(bb)
                    if dead:
                        spec.step_dead(bb)
                outs = spec.outputs(params)
                if not outs:  # every op consumed: emit one so main returns something
                    spec.step_fallback(bb)
                    outs = spec.outputs(params)
                result = outs[0] if len(outs) == 1 else relax.Tuple(outs)
                gv = bb.emit_output(result)
            bb.emit_func_output(gv)
        return bb.get()

    return graphs()
