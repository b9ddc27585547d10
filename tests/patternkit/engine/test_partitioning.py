"""partition(): Relay's pattern.partition on Relax, reproducing the seed notes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk

BN_NAME = "subtract_multiply_add_sqrt_divide_add_"


def bn_pattern():
    x, var, mean, beta, gamma = (pk.wildcard() for _ in range(5))
    return gamma * (x - mean) / pk.is_op("sqrt")(var + pk.is_constant()) + beta


def local_functions(func: relax.Function) -> list[tuple[relax.Var, relax.Function]]:
    return [(b.var, b.value) for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Function)]


def test_single_batchnorm_becomes_one_function(bn_vars, make_bn):
    mod = pk.from_expr(make_bn(*bn_vars))
    out = bn_pattern().partition(mod)
    (fn_var, fn), = local_functions(out["main"])
    assert fn.attrs["PartitionedFromPattern"] == BN_NAME
    assert [p.name for p in fn.params] == [f"FunctionVar_0_{i}" for i in range(5)]
    # The call passes the inputs in pattern order: gamma, x, mean, var, beta.
    call = out["main"].body.blocks[0].bindings[-1].value
    assert call.op.same_as(fn_var)
    assert [a.name for a in call.args] == ["gamma", "x", "mean", "var", "beta"]
    assert relax.analysis.check_well_formed(out)
    pk.assert_same_numerics(mod, out, positive=("var",), rtol=0, atol=0)


def test_double_batchnorm_gives_two_separate_functions(bn_vars, make_bn):
    x, gamma, beta, mean, var = bn_vars
    bn1 = make_bn(x, gamma, beta, mean, var)
    mod = pk.from_expr(make_bn(bn1, gamma, beta, mean, var))
    out = pk.partition(bn_pattern(), mod)
    functions = local_functions(out["main"])
    assert len(functions) == 2
    assert not functions[0][1].same_as(functions[1][1])
    assert [f.attrs["PartitionedFromPattern"] for _, f in functions] == [BN_NAME, BN_NAME]
    # Relay numbers groups from the output backwards: the outer batch norm is group 0.
    assert functions[0][1].params[0].name == "FunctionVar_1_0"
    assert functions[1][1].params[0].name == "FunctionVar_0_0"
    assert relax.analysis.check_well_formed(out)
    pk.assert_same_numerics(mod, out, positive=("var",), rtol=0, atol=0)


def test_attrs_are_added_and_check_can_veto(bn_vars, make_bn):
    mod = pk.from_expr(make_bn(*bn_vars))
    out = pk.partition(bn_pattern(), mod, attrs={"Composite": "demo.bn"})
    (_, fn), = local_functions(out["main"])
    assert fn.attrs["Composite"] == "demo.bn"
    seen = []
    vetoed = pk.partition(bn_pattern(), mod, check=lambda pre: seen.append(pre) or False)
    tvm.ir.assert_structural_equal(vetoed, mod)
    assert len(seen) == 1 and seen[0].op.name == "relax.add"
    skipped = []
    pk.partition(bn_pattern(), mod, check=lambda pre, node_map: pk.reject("too big"),
                 skipped=skipped)
    assert [s.reason for s in skipped] == ["too big"]


def test_check_that_raises_is_reported_with_the_binding(bn_vars, make_bn):
    mod = pk.from_expr(make_bn(*bn_vars))

    def broken(pre):
        raise RuntimeError("no")

    with pytest.raises(pk.errors.CallbackError, match="RuntimeError: no.*main: gv = R.add"):
        pk.partition(bn_pattern(), mod, check=broken)


def test_match_with_an_escaping_intermediate_is_not_partitioned(bn_vars, make_bn):
    x, gamma, beta, mean, var = bn_vars
    centered = x - mean
    eps = relax.const(1e-5, "float32")
    bn = gamma * centered / relax.op.sqrt(var + eps) + beta
    mod = pk.from_expr(relax.Tuple([bn, centered]))  # gv = (lv5, lv), lv = x - mean
    skipped = []
    out = pk.partition(bn_pattern(), mod, skipped=skipped)
    tvm.ir.assert_structural_equal(out, mod)
    assert [s.reason for s in skipped] == [
        "intermediate 'lv' is also used by 'gv' outside the match"]


def test_match_with_an_intermediate_returned_by_the_block_is_not_partitioned(bn_vars, make_bn):
    x, gamma, beta, mean, var = bn_vars
    bb = relax.BlockBuilder()
    with bb.function("main", [x, gamma, beta, mean, var]):
        with bb.dataflow():
            centered = bb.emit_output(relax.op.subtract(x, mean), "centered")
            eps = relax.const(1e-5, "float32")
            bn = bb.emit_output(gamma * centered / relax.op.sqrt(var + eps) + beta)
        bb.emit_func_output(relax.Tuple([bn, centered]))
    mod = bb.get()
    skipped = []
    out = pk.partition(bn_pattern(), mod, skipped=skipped)
    tvm.ir.assert_structural_equal(out, mod)
    assert [s.reason for s in skipped] == [
        "intermediate 'centered' is an output of its block or of the function"]


def test_constants_matched_by_wildcards_become_parameters(make_var):
    x = make_var("x", (4,))
    scale = relax.const(np.full(4, 2.0, "float32"))
    mod = pk.from_expr(relax.op.nn.relu(relax.op.multiply(x, scale)))
    by_wildcard = pk.is_op("nn.relu")(pk.wildcard() * pk.wildcard())
    by_constant = pk.is_op("nn.relu")(pk.wildcard() * pk.is_constant())
    (_, lifted), = local_functions(pk.partition(by_wildcard, mod)["main"])
    (_, embedded), = local_functions(pk.partition(by_constant, mod)["main"])
    assert len(lifted.params) == 2 and len(embedded.params) == 1
    assert lifted.attrs["PartitionedFromPattern"] == "multiply_nn.relu_"


def test_partitioning_twice_does_not_nest(bn_vars, make_bn):
    mod = pk.from_expr(make_bn(*bn_vars))
    once = pk.partition(bn_pattern(), mod)
    tvm.ir.assert_structural_equal(pk.partition(bn_pattern(), once), once)


def test_bare_expression_gives_a_module_and_input_is_untouched(bn_vars, make_bn):
    bn = make_bn(*bn_vars)
    text = str(bn)
    out = bn_pattern().partition(bn)
    assert isinstance(out, tvm.IRModule) and len(local_functions(out["main"])) == 1
    assert str(bn) == text


def test_tuple_get_item_root_is_partitioned(make_var):
    x = make_var("x", (4, 8))
    mod = pk.from_expr(relax.op.nn.relu(relax.TupleGetItem(relax.op.split(x, 2, axis=1), 0)))
    pattern = pk.is_tuple_get_item(pk.is_op("split")(pk.wildcard()), 0)
    out = pk.partition(pattern, mod)
    (_, fn), = local_functions(out["main"])
    assert fn.attrs["PartitionedFromPattern"] == "split_TupleGetItem0_"
    pk.assert_same_numerics(mod, out)
