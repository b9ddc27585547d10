"""Outlining a match into a local function (used by partition and MergeComposite)."""

from __future__ import annotations

import gc

import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.engine.outline import uses_symbolic_vars
from patternkit.ir.kinds import PARTITIONED_FROM_PATTERN
from patternkit.testing import batchnorm_chain


def batchnorm_pattern() -> pk.DFPattern:
    x, gamma, beta, mean, var = (pk.wildcard() for _ in range(5))
    return gamma * (x - mean) / pk.is_op("sqrt")(var + pk.is_constant()) + beta


def local_functions(mod) -> list[relax.Function]:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Function)]


def test_outlined_functions_are_named_after_their_ops_in_post_order():
    functions = local_functions(pk.partition(batchnorm_pattern(), batchnorm_chain(2)))
    assert [str(f.attrs[PARTITIONED_FROM_PATTERN]) for f in functions] == \
        ["subtract_multiply_add_sqrt_divide_add_"] * 2


def test_outlining_leaves_no_reference_cycles_for_the_garbage_collector():
    # A cycle per match kept the function's whole index alive after the pass, until a
    # collection swept it: 180 ms at 24,000 bindings (benchmarks/README.md).
    mod = batchnorm_chain(20)
    gc.collect()
    gc.disable()
    try:
        out = pk.partition(batchnorm_pattern(), mod)
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert len(local_functions(out)) == 20


def _flattened_linear():
    """``reshape(matmul(reshape(x, (b*s, 16)), w), (b, s, 8))``: the torch importer's
    ``nn.Linear`` on a 3-D input; the last reshape uses ``b`` and ``s``, which the
    matmul's type ``(b * s, 8)`` does not define."""
    b, s = tvm.tirx.Var("b", "int64"), tvm.tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((b, s, 16), "float32"))
    w = relax.Var("w", relax.TensorType((16, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            flat = bb.emit(relax.op.reshape(x, (b * s, 16)))
            y = bb.emit(relax.op.matmul(flat, w))
            out = bb.emit_output(relax.op.reshape(y, (b, s, 8)))
        bb.emit_func_output(out)
    return bb.get()


def test_symbolic_dims_the_inputs_do_not_define_are_passed_as_a_shape_parameter():
    mod = _flattened_linear()
    pattern = pk.is_op("reshape")(pk.is_op("matmul")(pk.wildcard(), pk.wildcard()), pk.wildcard())
    out = pk.partition(pattern, mod)
    [func] = local_functions(out)
    last = func.params[-1]
    assert isinstance(last.ty, relax.ShapeType)
    assert [v.name for v in last.ty.values] == ["b", "s"]
    assert relax.analysis.check_well_formed(out)
    tvm.ir.assert_structural_equal(func.ret_ty, mod["main"].ret_ty)
    pk.assert_same_numerics(mod, out, shape_vars={"b": 2, "s": 3}, rtol=0, atol=0)
    tvm.ir.assert_structural_equal(pk.DefuseOps()(out), mod)


def test_a_match_whose_inputs_define_its_dims_gets_no_shape_parameter():
    mod = _flattened_linear()
    out = pk.partition(pk.is_op("reshape")(pk.wildcard(), pk.wildcard()), mod)
    flatten, unflatten = local_functions(out)
    # reshape(x): x's type (b, s, 16) defines b and s; reshape(y): (b * s, 8) does not
    assert not any(isinstance(p.ty, relax.ShapeType) for p in flatten.params)
    assert isinstance(unflatten.params[-1].ty, relax.ShapeType)
    pk.assert_same_numerics(mod, out, shape_vars={"b": 2, "s": 3}, rtol=0, atol=0)


@I.ir_module
class _SymbolicInside:
    """Static parameters and result; ``n`` appears only inside, through a match_cast."""

    @R.function
    def main(x: R.Tensor((8,), "float32"), m: R.Tensor(ndim=1, dtype="float32")):
        n = T.int64()
        with R.dataflow():
            y = R.match_cast(m, R.Tensor((n,), "float32"))
            z = R.sum(R.exp(y))
            out = R.add(x, z)
            R.output(out)
        return out


@I.ir_module
class _Static:
    @R.function
    def main(x: R.Tensor((8,), "float32")):
        with R.dataflow():
            out = R.exp(x)
            R.output(out)
        return out


@I.ir_module
class _SymbolicParameter:
    @R.function
    def main(x: R.Tensor(("n",), "float32")):
        with R.dataflow():
            out = R.exp(x)
            R.output(out)
        return out


@pytest.mark.parametrize("mod, expected", [(_Static, False), (_SymbolicParameter, True),
                                           (_SymbolicInside, True)],
                         ids=["static", "symbolic parameter", "symbolic only inside"])
def test_a_function_uses_symbolic_variables_wherever_one_appears(mod, expected):
    assert uses_symbolic_vars(mod["main"]) is expected
