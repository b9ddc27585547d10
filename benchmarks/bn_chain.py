"""The benchmark workload: a chain of N elementwise batch norms.

Each unit is ``gamma * (x - mean) / sqrt(var + eps) + beta`` with its own four parameters
(6 bindings, 4 distinct parameters per unit), feeding the next unit's ``x``.  This is the
workload on which ``tvm.relax.dpl.rewrite_call`` is quadratic.
"""

from __future__ import annotations

import tvm
from tvm import relax

CHANNELS = 4
X_SHAPE = (1, CHANNELS, 2, 2)
PARAM_SHAPE = (CHANNELS, 1, 1)


def bn_chain(n: int) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType(X_SHAPE, "float32"))
    params = [x]
    bb = relax.BlockBuilder()
    units = []
    for i in range(n):
        unit = [relax.Var(f"{role}{i}", relax.TensorType(PARAM_SHAPE, "float32"))
                for role in ("gamma", "beta", "mean", "var")]
        units.append(unit)
        params.extend(unit)
    eps = relax.const(1e-5, "float32")
    with bb.function("main", params):
        with bb.dataflow():
            cur = x
            for i, (gamma, beta, mean, var) in enumerate(units):
                sub = bb.emit(relax.op.subtract(cur, mean))
                mul = bb.emit(relax.op.multiply(gamma, sub))
                add_eps = bb.emit(relax.op.add(var, eps))
                sqrt = bb.emit(relax.op.sqrt(add_eps))
                div = bb.emit(relax.op.divide(mul, sqrt))
                cur = bb.emit(relax.op.add(div, beta)) if i < n - 1 else \
                    bb.emit_output(relax.op.add(div, beta))
        bb.emit_func_output(cur)
    return bb.get()


def batch_norm_replacement(x, gamma, beta, mean, var, eps):
    """The replacement both engines build, so their outputs can be compared."""
    reshape = [relax.op.reshape(p, (CHANNELS,)) for p in (gamma, beta, mean, var)]
    epsilon = float(eps.value.numpy())
    return relax.TupleGetItem(
        relax.op.nn.batch_norm(x, *reshape, axis=1, epsilon=epsilon, training=False), 0)
