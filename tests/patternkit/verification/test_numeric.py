"""Numeric checks: seeded random inputs, and comparisons that report their error figures."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.verification.numeric import random_inputs


@I.ir_module
class Mixed:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32"), h: R.Tensor((2, "m"), "float16"),
             idx: R.Tensor((3,), "int64"), mask: R.Tensor((2,), "bool"),
             var: R.Tensor((3,), "float32")):
        return x


# ---------------------------------------------------------------------- random_inputs
def test_random_inputs_follow_each_parameters_shape_and_dtype():
    x, h, idx, mask, var = random_inputs(Mixed["main"], shape_vars={"n": 5}, default_dim=2,
                                         positive=("var",))
    assert (x.shape, x.dtype) == ((5, 4), np.float32)   # n from shape_vars
    assert (h.shape, h.dtype) == ((2, 2), np.float16)   # m from default_dim
    assert (idx.shape, idx.dtype) == ((3,), np.int64) and mask.dtype == np.bool_
    assert ((-1 <= x) & (x < 1)).all() and ((0.5 <= var) & (var < 1.5)).all()
    assert ((0 <= idx) & (idx < 8)).all()  # small ints: valid indices into small tensors


def test_random_inputs_draw_floats_in_the_requested_range():
    (x, *_) = random_inputs(Mixed["main"], low=2.0, high=3.0)
    assert x.shape == (3, 4)  # the default symbolic dimension is 3
    assert ((2 <= x) & (x < 3)).all()


def test_random_bfloat16_inputs_are_fractions_in_the_range_not_integers():
    # bfloat16 used to fall through to the integer branch: small whole numbers, no
    # evidence for a bfloat16 model's numeric check.
    x = relax.Var("x", relax.TensorType((64,), "bfloat16"))
    (arr,) = random_inputs(relax.Function([x], x), seed=0)
    values = arr.astype(np.float32)
    assert str(arr.dtype) == "bfloat16"
    assert ((-1 <= values) & (values < 1)).all()
    assert np.any(values != np.round(values)) and len(set(values.tolist())) > 32


def test_random_inputs_are_reproducible_from_the_seed():
    first = random_inputs(Mixed["main"], seed=7)
    again = random_inputs(Mixed["main"], seed=7)
    other = random_inputs(Mixed["main"], seed=8)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], other[0])


def test_a_parameter_without_a_known_shape_is_refused():
    x = relax.Var("x", relax.TensorType(ndim=2, dtype="float32"))
    func = relax.Function([x], relax.SeqExpr([], x), ret_ty=x.ty)
    with pytest.raises(ValueError, match="cannot draw a random input for a parameter"):
        random_inputs(func)


def test_a_dimension_that_is_an_expression_is_refused():
    n = T.int64()
    x = relax.Var("x", relax.TensorType([n * 2], "float32"))
    func = relax.Function([x], relax.SeqExpr([], x), ret_ty=x.ty)
    with pytest.raises(ValueError, match="cannot pick a concrete value for the dimension"):
        random_inputs(func)


# ---------------------------------------------------------------------- compare
@I.ir_module
class Plus:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        return R.add(x, R.const(0.0, "float32"))


@I.ir_module
class PlusAnEighth:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        return R.add(x, R.const(0.125, "float32"))


# exactly representable: every output is off by exactly 0.125, relatively by 0.125 at 1.0
INPUTS = [np.array([1.0, 2.0, 4.0, 8.0], "float32")]


def test_compare_reports_the_largest_absolute_and_relative_errors():
    result = pk.compare(Plus, PlusAnEighth, inputs=INPUTS, rtol=0, atol=0)
    assert (result.max_abs_error, result.max_rel_error, result.outputs) == (0.125, 0.125, 1)
    assert not result.ok
    assert str(result) == ("MISMATCH: 1 output(s), max abs error 0.125, "
                           "max rel error 0.125, relative error as a whole 0.0271 (the "
                           "output: 4 of 4 element(s) outside atol + rtol * |reference|)")


@pytest.mark.parametrize("tolerance", ["atol", "rtol"])
def test_an_error_exactly_at_the_tolerance_passes_and_just_above_fails(tolerance):
    # atol binds where the reference is 0; the relative error as a whole (0.125 * 2 over
    # norm([2, 4, 8]) = 0.027) is held to rtol, so rtol leaves it room there
    inputs, other = ([np.array([0.0, 2.0, 4.0, 8.0], "float32")], {"rtol": 0.03}) \
        if tolerance == "atol" else (INPUTS, {"atol": 0})
    at = pk.compare(Plus, PlusAnEighth, inputs=inputs, **{tolerance: 0.125}, **other)
    below = pk.compare(Plus, PlusAnEighth, inputs=inputs,
                       **{tolerance: float(np.nextafter(0.125, 0))}, **other)
    assert at.ok and not below.ok


def test_an_absolute_tolerance_does_not_excuse_an_error_of_the_whole_output():
    # every element within atol = 0.125, yet the output as a whole is 2.7 % off
    result = pk.compare(Plus, PlusAnEighth, inputs=INPUTS, rtol=0, atol=0.125)
    assert result.status == "fail" and not result.ok
    assert result.norm_error == pytest.approx(0.125 * 2 / np.linalg.norm(INPUTS[0]))
    assert "relative error as a whole" in result.reason


def test_identical_modules_compare_exactly_on_seeded_random_inputs():
    result = pk.compare(Plus, Plus, rtol=0, atol=0)
    assert result.ok and (result.max_abs_error, result.max_rel_error) == (0.0, 0.0)


@I.ir_module
class SqrtAndShift:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        return (R.sqrt(x), R.add(x, R.const(1.0, "float32")))


def test_every_output_of_a_tuple_is_compared_and_nans_in_the_same_place_agree():
    negative = [np.array([-1.0, 0.0, 1.0, 4.0], "float32")]  # sqrt(-1) is NaN on both sides
    result = pk.compare(SqrtAndShift, SqrtAndShift, inputs=negative, rtol=0, atol=0)
    assert result.ok and result.outputs == 2 and result.max_abs_error == 0.0


@I.ir_module
class SqrtOfAbs:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        return (R.sqrt(R.abs(x)), R.add(x, R.const(1.0, "float32")))


def test_a_nan_on_one_side_only_is_an_infinite_error_not_a_zero_one():
    negative = [np.array([-1.0, 0.0, 1.0, 4.0], "float32")]  # NaN before, 1.0 after
    result = pk.compare(SqrtAndShift, SqrtOfAbs, inputs=negative, rtol=1, atol=1)
    assert not result.ok
    assert result.max_abs_error == result.max_rel_error == float("inf")


@I.ir_module
class Reshaped:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        return R.reshape(x, R.shape([2, 2]))


@I.ir_module
class Twice:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        return (x, x)


@pytest.mark.parametrize("after", [Reshaped, Twice], ids=["other shape", "more outputs"])
def test_outputs_that_cannot_be_compared_are_an_infinite_mismatch(after):
    result = pk.compare(Plus, after, rtol=1, atol=1)
    assert not result.ok and result.max_abs_error == result.max_rel_error == float("inf")


def test_assert_same_numerics_raises_with_the_figures_or_returns_the_comparison():
    with pytest.raises(AssertionError, match=r"numeric check failed: MISMATCH: 1 output\(s\), "
                                             r"max abs error 0\.125"):
        pk.assert_same_numerics(Plus, PlusAnEighth, inputs=INPUTS, rtol=0, atol=0.1)
    result = pk.assert_same_numerics(Plus, PlusAnEighth, inputs=INPUTS, rtol=0.03, atol=0.125)
    assert isinstance(result, pk.verification.Comparison) and result.ok


def test_local_functions_from_partition_are_lifted_before_the_build(make_var):
    x = make_var("x", (4,))
    mod = pk.from_expr(relax.op.nn.relu(relax.op.exp(x)))
    partitioned = pk.partition(pk.is_op("nn.relu")(pk.is_op("exp")(pk.wildcard())), mod)
    assert any(isinstance(b.value, relax.Function)
               for b in partitioned["main"].body.blocks[0].bindings)
    assert pk.compare(mod, partitioned, rtol=0, atol=0).ok


# ---------------------------------------------------------------------- reference builds
def test_compare_builds_the_reference_once_and_again_after_the_module_changes(monkeypatch):
    import tvm

    from patternkit.verification import numeric

    mod = tvm.IRModule(dict(Plus.functions))  # our own copies, to change in place below
    after = tvm.IRModule(dict(PlusAnEighth.functions))
    numeric.REFERENCE_BUILDS.clear()
    numeric.CANDIDATE_BUILDS.clear()
    builds = []
    real = numeric.build
    monkeypatch.setattr(numeric, "build", lambda m, *a, **k: builds.append(m) or real(m, *a, **k))
    for _ in range(3):  # the same pair again, as the job checks a second size
        assert not pk.compare(mod, after, inputs=INPUTS, rtol=0, atol=0).ok
    assert len(builds) == 2  # "before" once, "after" once
    mod["main"] = PlusAnEighth["main"]  # changed in place: the cached builds are stale
    after["main"] = Plus["main"]
    assert not pk.compare(mod, after, inputs=INPUTS, rtol=0, atol=0).ok
    assert len(builds) == 4


def test_an_after_identical_to_before_is_not_built_twice(monkeypatch):
    from patternkit.verification import numeric

    numeric.REFERENCE_BUILDS.clear()
    numeric.CANDIDATE_BUILDS.clear()
    builds = []
    real = numeric.build
    monkeypatch.setattr(numeric, "build", lambda m, *a, **k: builds.append(m) or real(m, *a, **k))
    import tvm

    same = pk.compare(Plus, tvm.IRModule(dict(Plus.functions)), inputs=INPUTS, rtol=0, atol=0)
    assert same.ok and same.identical and len(builds) == 1
    assert "identical modules" in str(same)
    other = pk.compare(Plus, PlusAnEighth, inputs=INPUTS, rtol=0, atol=0)
    assert not other.ok and not other.identical and len(builds) == 2


@I.ir_module
class CumsumOfBools:
    """llvm cannot build a cumsum of bools (TVM's torch importer emits one)."""

    @R.function
    def main(x: R.Tensor((2, 5), "float32")) -> R.Tensor((2, 5), "float32"):
        with R.dataflow():
            negative = R.less(x, R.const(0.0, "float32"))
            out = R.astype(R.cumsum(negative, axis=-1), "float32")
            R.output(out)
        return out


@I.ir_module
class CumsumOfInts:
    @R.function
    def main(x: R.Tensor((2, 5), "float32")) -> R.Tensor((2, 5), "float32"):
        with R.dataflow():
            negative = R.astype(R.less(x, R.const(0.0, "float32")), "int32")
            out = R.astype(R.cumsum(negative, axis=-1), "float32")
            R.output(out)
        return out


@pytest.mark.parametrize("before, after, side", [(CumsumOfBools, CumsumOfInts, "before"),
                                                 (CumsumOfInts, CumsumOfBools, "after")])
def test_a_module_that_does_not_build_is_a_build_error_naming_the_side(before, after, side):
    with pytest.raises(pk.errors.BuildError, match=f"the {side} module does not build for llvm: "
                                            r"Check failed.*\(in .*CodeGenLLVM") as caught:
        pk.compare(before, after)
    assert caught.value.side == side


@I.ir_module
class Block:
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 16), "float32"),
             g: R.Tensor((16,), "float32"), b: R.Tensor((16,), "float32")):
        with R.dataflow():
            h = R.nn.layer_norm(R.matmul(x, w), g, b, axes=[-1])
            s = R.nn.softmax(R.multiply(h, R.tanh(h)), axis=-1)
            out = R.add(R.nn.gelu_tanh(s), R.sum(R.exp(h), axis=-1, keepdims=True))
            R.output(out)
        return out


@pytest.mark.parametrize("linking", ["1", "0"], ids=["linked", "jit"])
def test_the_checks_build_llvm_at_their_opt_level_and_compute_the_same_bits(monkeypatch,
                                                                             linking):
    # LLVM's -O3 is most of a check's build time; the checks' own levels (0 linked into
    # a shared library, 1 through TVM's JIT) must not change a result
    from tvm import runtime

    from patternkit.verification import linked, numeric

    monkeypatch.setenv(linked.LINK_VARIABLE, linking)
    if linking == "1" and not linked.available():
        pytest.skip("no C compiler on this machine: the checks build through the JIT")
    targets = []
    real = relax.build
    monkeypatch.setattr(relax, "build", lambda mod, target, **kw: targets.append(target)
                        or real(mod, target=target, **kw))
    inputs = [runtime.tensor(a) for a in random_inputs(Block["main"], seed=3)]
    checked = numeric.build(Block)["main"](*inputs).numpy()
    level = linked.LINKED_OPT_LEVEL if linking == "1" else numeric.CHECK_OPT_LEVEL
    assert [dict(t.attrs).get("opt-level") for t in targets] == [level] == [
        0 if linking == "1" else 1]
    default = relax.VirtualMachine(real(Block, target="llvm"), runtime.cpu())
    np.testing.assert_array_equal(checked, default["main"](*inputs).numpy())
    monkeypatch.setattr(numeric, "CHECK_OPT_LEVEL", None)  # TVM's own default, as asked
    assert numeric.check_target("llvm") == "llvm" and numeric.check_target("c") == "c"
