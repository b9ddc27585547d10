# ruff: noqa: N803, N806  (TVMScript names as in TVM's tests: A, B, M, N)
"""``pk.from_rewriter``: TVM's own rewriter tests, run by patternkit and compared with TVM.

The cases are those of TVM's ``tests/python/relax/test_dataflow_rewriter.py`` (0.27),
rewritten here: each runs TVM's ``PatternMatchingRewriter`` and the patternkit rule made
from it on the same input and requires structurally equal results.  The cases patternkit
refuses on purpose (tuple results, subroutines) are at the end, each with its reason;
``docs/from-rewriter.md`` says why.
"""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

from patternkit.engine import RewriteLog, RuleSet, rewrite
from patternkit.engine.from_rewriter import TvmRewriterRule, from_rewriter
from patternkit.errors import CallbackError, PatternError

F16 = R.Tensor([16], "float32")


# -- the rewriters of TVM's tests ----------------------------------------------------------
@R.rewriter
class AddToPacked:
    @R.function
    def pattern(A: R.Tensor([16], "float32"), B: R.Tensor([16], "float32")):
        C = R.add(A, B)
        return C

    @R.function
    def replacement(A: R.Tensor([16], "float32"), B: R.Tensor([16], "float32")):
        C = R.call_pure_packed("my_optimized_add_impl", A, B, ty_args=R.Tensor([16], "float32"))
        return C


@R.rewriter
class MultiplyToPacked:
    @R.function
    def pattern(A: R.Tensor([16], "float32"), B: R.Tensor([16], "float32")):
        C = A * B
        return C

    @R.function
    def replacement(A: R.Tensor([16], "float32"), B: R.Tensor([16], "float32")):
        C = R.call_pure_packed("my_optimized_mul_impl", A, B, ty_args=R.Tensor([16], "float32"))
        return C


@R.rewriter
class DoubleToScale:
    @R.function
    def pattern(A: R.Tensor([16], "float32")):
        return A + A

    @R.function
    def replacement(A: R.Tensor([16], "float32")):
        return A * R.const(2.0, "float32")


@R.rewriter
class ScaleByScalarToPacked:
    @R.function
    def pattern(A: R.Tensor([16], "float32"), B: R.Tensor([], "float32")):
        C = A * B
        return C

    @R.function
    def replacement(A: R.Tensor([16], "float32"), B: R.Tensor([], "float32")):
        C = R.call_pure_packed("my_optimized_mul_impl", A, B, ty_args=R.Tensor([16], "float32"))
        return C


@R.rewriter
class FusedMultiplyAdd:
    @R.function
    def pattern(state: R.Tensor([16], "float32"), weights: R.Tensor([16, 16], "float32"),
                bias: R.Tensor([16], "float32")):
        state = R.matmul(weights, state)
        state = R.add(bias, state)
        return state

    @R.function
    def replacement(state: R.Tensor([16], "float32"), weights: R.Tensor([16, 16], "float32"),
                    bias: R.Tensor([16], "float32")):
        return R.call_pure_packed("my_optimized_fma_impl", state, weights, bias,
                                  ty_args=R.Tensor([16], "float32"))


@R.rewriter
class SquareMatmul:
    @R.function
    def pattern(A: R.Tensor(["M", "N"], "float32"), B: R.Tensor(["N", "N"], "float32")):
        return R.matmul(A, B)

    @R.function
    def replacement(A: R.Tensor(["M", "N"], "float32"), B: R.Tensor(["N", "N"], "float32")):
        M = T.int64()
        N = T.int64()
        return R.call_pure_packed("my_optimized_square_matmul", A, B,
                                  ty_args=R.Tensor([M, N], "float32"))


# -- the functions they rewrite --------------------------------------------------------------
@R.function
def split_then_add(x: R.Tensor([32], "float32")):
    R.func_attr({"global_symbol": "main"})
    split = R.split(x, 2)
    lhs = split[0]
    rhs = split[1]
    out = lhs + rhs
    return out


@I.ir_module
class TwoFunctions:
    @R.function
    def func_a(x: R.Tensor([32], "float32")):
        split = R.split(x, 2)
        lhs = split[0]
        rhs = split[1]
        out = lhs + rhs
        return out

    @R.function
    def func_b(x: R.Tensor([16], "float32")):
        out = x + x
        return out


@I.ir_module
class DoubleMain:
    @R.function
    def main(x: R.Tensor([16], "float32")):
        y = x + x
        return y


@R.function(private=True)
def add_twice(x: R.Tensor([16], "float32")):
    y = x + x
    z = y + y
    return z


@R.function(private=True)
def add_then_multiply(A: R.Tensor([16], "float32"), B: R.Tensor([16], "float32"),
                      C: R.Tensor([16], "float32")):
    D = A + B
    E = C * D
    return E


@R.function(private=True)
def double(A: R.Tensor([16], "float32")):
    B = A + A
    return B


@R.function(private=True, pure=False)
def print_between_matmul_and_add(state: R.Tensor([16], "float32"),
                                 weights: R.Tensor([16, 16], "float32"),
                                 bias: R.Tensor([16], "float32")):
    R.print(format="Start of function")
    state = R.matmul(weights, state)
    R.print(format="After matmul, before add")
    state = R.add(bias, state)
    R.print(format="End of function")
    return state


@R.function(private=True, pure=False)
def print_around_matmul_and_add(state: R.Tensor([16], "float32"),
                                weights: R.Tensor([16, 16], "float32"),
                                bias: R.Tensor([16], "float32")):
    R.print(format="Start of function")
    state = R.matmul(weights, state)
    state = R.add(bias, state)
    R.print(format="End of function")
    return state


@R.function(private=True)
def dynamic_matmuls(A: R.Tensor(["N", "N*2"], "float32"), B: R.Tensor(["N*2", "N*2"], "float32"),
                    C: R.Tensor(["N", "N"], "float32")):
    N = T.int64()
    D: R.Tensor([N, N * 2], "float32") = R.matmul(A, B)
    E: R.Tensor([N * 2, N], "float32") = R.permute_dims(D)
    F: R.Tensor([N * 2, N], "float32") = R.matmul(E, C)
    return F


@R.function(private=True)
def add_in_dataflow(A: R.Tensor([16], "float32"), B: R.Tensor([16], "float32")):
    with R.dataflow():
        C = A + B
        D = C + B
        R.output(D)
    return D


# name -> (TVM rewriter, input); the TVM test each comes from is the name.
SAME_AS_TVM = {
    "rewrite_defined_by_ir_module": (AddToPacked, split_then_add),
    "rewriter_may_be_applied_to_ir_module": (AddToPacked, TwoFunctions),
    "same_pattern_applied_multiple_times": (AddToPacked, add_twice),
    "composition_of_rewrite_rules": (AddToPacked | MultiplyToPacked, add_then_multiply),
    "recursive_rewrite_rules": (DoubleToScale | ScaleByScalarToPacked, double),
    "match_dynamic_pattern_against_dynamic_shape": (SquareMatmul, dynamic_matmuls),
}


@pytest.mark.parametrize("case", sorted(SAME_AS_TVM))
def test_from_rewriter_gives_tvms_result(case):
    tvm_rewriter, before = SAME_AS_TVM[case]
    expected = tvm_rewriter(before)
    rule = from_rewriter(tvm_rewriter)
    after = rewrite(rule, before)
    tvm.ir.assert_structural_equal(after, expected)
    assert not tvm_ffi.structural_equal(before, after), "the case must make the rule fire"


# -- where patternkit differs from TVM on purpose (docs/from-rewriter.md) ----------------------
def test_from_rewriter_keeps_the_dataflow_block_tvm_splits():
    # TVM's rewriter splits the caller's dataflow block around its replacement (the
    # replacement function has none); patternkit keeps the block.  Joined again, equal.
    theirs = AddToPacked(add_in_dataflow)
    after = rewrite(from_rewriter(AddToPacked), add_in_dataflow)
    assert not isinstance(theirs.body.blocks[0], relax.DataflowBlock)
    assert isinstance(after.body.blocks[0], relax.DataflowBlock)
    joined = relax.transform.ConvertToDataflow()(tvm.IRModule({"main": theirs}))["main"]
    tvm.ir.assert_structural_equal(after, joined)


@R.function(private=True, pure=False)
def fused_around_prints(state: R.Tensor([16], "float32"), weights: R.Tensor([16, 16], "float32"),
                        bias: R.Tensor([16], "float32")):
    R.print(format="Start of function")
    unused = R.matmul(weights, state)
    state = R.call_pure_packed("my_optimized_fma_impl", state, weights, bias,
                               ty_args=R.Tensor([16], "float32"))
    R.print(format="End of function")
    return state


@R.function(private=True, pure=False)
def fused_across_a_print(state: R.Tensor([16], "float32"), weights: R.Tensor([16, 16], "float32"),
                         bias: R.Tensor([16], "float32")):
    R.print(format="Start of function")
    unused = R.matmul(weights, state)
    R.print(format="After matmul, before add")
    state = R.call_pure_packed("my_optimized_fma_impl", state, weights, bias,
                               ty_args=R.Tensor([16], "float32"))
    R.print(format="End of function")
    return state


@pytest.mark.parametrize("before, expected", [
    (print_around_matmul_and_add, fused_around_prints),
    (print_between_matmul_and_add, fused_across_a_print),
], ids=["pattern_matching_may_occur_between_impure_functions",
        "pattern_matching_may_not_reorder_across_impure_functions"])
def test_from_rewriter_in_impure_functions_follows_the_patternkit_driver(before, expected):
    # patternkit's driver never removes a binding of a non-dataflow block (the user may
    # read it), so the matched matmul stays; and it treats pure bindings as free to move
    # across an impure call, where TVM refuses the match.
    after = rewrite(from_rewriter(FusedMultiplyAdd), before)
    tvm.ir.assert_structural_equal(after, expected)


def test_from_rewriter_refuses_symbolic_sizes_that_disagree_where_tvm_crashes():
    @R.function(private=True)
    def before(A: R.Tensor([8, 16], "float32"), B: R.Tensor([16, 15], "float32")):
        D = R.matmul(A, B)
        return D

    with pytest.raises(ValueError, match="MatchCast statements must be consistent"):
        SquareMatmul(before)
    log = RewriteLog()
    after = rewrite(from_rewriter(SquareMatmul), before, log=log)
    tvm.ir.assert_structural_equal(after, before)
    (skip,) = log.skipped
    assert skip.root == "D"
    assert "needs N = 16; found 15" in skip.reason


# -- the same rule, everywhere a rule goes ------------------------------------------------------
def test_from_rewriter_rule_runs_in_a_ruleset_with_other_rules():
    rules = RuleSet([from_rewriter(AddToPacked), from_rewriter(MultiplyToPacked)])
    assert [rule.name for rule in rules] == ["rewriter.add", "rewriter.multiply"]
    after = rewrite(rules, add_then_multiply)
    tvm.ir.assert_structural_equal(after, (AddToPacked | MultiplyToPacked)(add_then_multiply))


def test_from_rewriter_rule_loads_from_a_rule_file(tmp_path):
    from patternkit.app.rules import resolve_rules

    rule_file = tmp_path / "rules.py"
    rule_file.write_text(
        "from tvm.script import relax as R\n"
        "from patternkit.engine.from_rewriter import from_rewriter\n\n\n"
        "@R.rewriter\n"
        "class DoubleToScale:\n"
        "    @R.function\n"
        "    def pattern(A: R.Tensor([16], 'float32')):\n"
        "        return A + A\n\n"
        "    @R.function\n"
        "    def replacement(A: R.Tensor([16], 'float32')):\n"
        "        return A * R.const(2.0, 'float32')\n\n\n"
        "DOUBLE = from_rewriter(DoubleToScale, name='mine.double_to_scale')\n")
    for given in (f"{rule_file}:DOUBLE", str(rule_file)):  # by name, and every rule of it
        rules = resolve_rules([given])
        (rule,) = list(rules)
        assert isinstance(rule, TvmRewriterRule) and rule.name == "mine.double_to_scale"
        after = rewrite(rules, double)
        tvm.ir.assert_structural_equal(after, DoubleToScale(double))


def test_from_rewriter_accepts_a_module_a_class_and_a_python_rewriter():
    @I.ir_module
    class DoubleModule:
        @R.function
        def pattern(A: R.Tensor([16], "float32")):
            return A + A

        @R.function
        def replacement(A: R.Tensor([16], "float32")):
            return A * R.const(2.0, "float32")

    class DoubleClass:
        pattern = DoubleModule["pattern"]
        replacement = DoubleModule["replacement"]

    from tvm.relax.dpl import PatternMatchingRewriter, is_const, is_op, wildcard

    y, one = wildcard(), is_const()

    def drop_multiply_by_one(orig, matchings):
        value = matchings[one].value.numpy()
        return matchings[y] if value.size == 1 and float(value) == 1.0 else orig

    drop = PatternMatchingRewriter.from_pattern(is_op("relax.multiply")(y, one),
                                                drop_multiply_by_one)

    @R.function(private=True)
    def before(A: R.Tensor([16], "float32")):
        B = A + A
        C = R.multiply(B, R.const(1.0, "float32"))
        D = R.multiply(C, R.const(3.0, "float32"))
        return D

    expected = (DoubleToScale | drop)(before)
    for given, name in ((DoubleModule, "rewriter.add"), (DoubleClass, "rewriter.doubleclass")):
        rule = from_rewriter(given)
        assert rule.name == name
        tvm.ir.assert_structural_equal(rewrite(rule, double), DoubleToScale(double))
    both = from_rewriter(DoubleToScale | drop, name="mine.both")
    assert both.name == "mine.both"
    # drop returns the matched Var itself: patternkit leaves the alias C = B, which TVM's
    # rewriter folds; CanonicalizeBindings folds it the same way.
    canonical = relax.transform.CanonicalizeBindings()
    after = canonical(tvm.IRModule({"main": rewrite(both, before)}))["main"]
    tvm.ir.assert_structural_equal(after, expected)


def test_from_rewriter_never_changes_the_users_function():
    before_text = add_twice.script()
    rewrite(from_rewriter(AddToPacked), add_twice)
    assert add_twice.script() == before_text


def test_from_rewriter_rule_is_numerically_verified_by_the_rule_contract():
    from patternkit.testing.contract import EXACT, Negative, RuleCase, check_rule

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor([16], "float32")):
            with R.dataflow():
                y = R.add(x, x)
                z = R.nn.relu(y)
                R.output(z)
            return z

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor([16], "float32")):
            with R.dataflow():
                y = R.multiply(x, R.const(2.0, "float32"))
                z = R.nn.relu(y)
                R.output(z)
            return z

    @I.ir_module
    class OtherShape:
        @R.function
        def main(x: R.Tensor([8], "float32")):
            with R.dataflow():
                y = R.add(x, x)
                R.output(y)
            return y

    # x + x and x * 2 are the same float32 numbers (doubling is exact).
    check_rule(RuleCase(from_rewriter(DoubleToScale), Before, Expected,
                        [Negative("shape_as_written", OtherShape, "R.Tensor((16,)")], EXACT))


# -- bad input: one line naming the rule and the cause ----------------------------------------
@R.rewriter
class ExplicitTuple:
    @R.function
    def pattern(lhs_A: R.Tensor([16, 16], "float32"), lhs_B: R.Tensor([16, 16], "float32"),
                rhs: R.Tensor([16], "float32")):
        proj_A = R.matmul(lhs_A, rhs)
        proj_B = R.matmul(lhs_B, rhs)
        proj_tuple = (proj_A, proj_B)
        return proj_tuple

    @R.function
    def replacement(lhs_A: R.Tensor([16, 16], "float32"), lhs_B: R.Tensor([16, 16], "float32"),
                    rhs: R.Tensor([16], "float32")):
        lhs = R.concat([lhs_A, lhs_B])
        proj_concat = R.matmul(lhs, rhs)
        proj_tuple = R.split(proj_concat, 2)
        return proj_tuple


@R.rewriter
class ImplicitTupleSharedWildcard:
    @R.function
    def pattern(x: R.Tensor([16], "float32"), y: R.Tensor([16], "float32"),
                z: R.Tensor([16], "float32")):
        lhs = x + y
        rhs = y + z
        return (lhs, rhs)

    @R.function
    def replacement(x: R.Tensor([16], "float32"), y: R.Tensor([16], "float32"),
                    z: R.Tensor([16], "float32")):
        return R.call_pure_packed("optimized_impl", x, y, z,
                                  ty_args=R.Tuple([R.Tensor([16], "float32"),
                                                   R.Tensor([16], "float32")]))


@R.rewriter
class SplitRotaryEmbedding:
    @R.function
    def pattern(qkv: R.Tensor([12288], "float32")):
        qkv_tuple = R.split(qkv, 3, axis=0)
        q = qkv_tuple[0]
        k = qkv_tuple[1]
        v = qkv_tuple[2]
        q_embed = R.call_pure_packed("rotary_embedding", [q], ty_args=R.Tensor([4096], "float32"))
        k_embed = R.call_pure_packed("rotary_embedding", [k], ty_args=R.Tensor([4096], "float32"))
        return (q_embed, k_embed, v)

    @R.function
    def replacement(qkv: R.Tensor([12288], "float32")):
        return R.call_pure_packed("split_rotary_embedding", [qkv],
                                  ty_args=[R.Tensor([4096], "float32"),
                                           R.Tensor([4096], "float32"),
                                           R.Tensor([4096], "float32")])


# The tuple cases of TVM's tests (explicit, output, implicit, shared wildcard, mismatched
# wildcard, extra compute, three elements, dynamic shape) use these three rewriters.
@pytest.mark.parametrize("tvm_rewriter", [ExplicitTuple, ImplicitTupleSharedWildcard,
                                          SplitRotaryEmbedding],
                         ids=["explicit_tuple", "implicit_tuple_shared_wildcard",
                              "implicit_tuple_with_three_elements"])
def test_from_rewriter_refuses_a_pattern_returning_a_tuple(tvm_rewriter):
    with pytest.raises(PatternError, match=r"^rewriter: a pattern whose result is a tuple"):
        from_rewriter(tvm_rewriter)


def test_from_rewriter_refuses_tvms_tuple_rewriter_by_name():
    with pytest.raises(PatternError, match=r"^mine\.tuple: TupleRewriter \(a pattern "):
        from_rewriter(ExplicitTuple.rhs, name="mine.tuple")


def test_from_rewriter_refuses_a_replacement_with_subroutines():
    @I.ir_module
    class WithSubroutine:
        @R.function
        def pattern(A: R.Tensor([16], "float32")):
            return A + A

        @R.function
        def replacement(A: R.Tensor([16], "float32")):
            return WithSubroutine.subroutine(A)

        @R.function(private=True)
        def subroutine(A: R.Tensor([16], "float32")) -> R.Tensor([16], "float32"):
            return A * R.const(2.0, "float32")

    with pytest.raises(PatternError, match=r"^rewriter\.add: the replacement calls "
                                           r"subroutines of the rewriter module \(subroutine\)"):
        from_rewriter(WithSubroutine)
    # Given as a built rewriter, the subroutine shows only at the first match.
    rule = from_rewriter(PatternMatchingRewriterFromModule(WithSubroutine))
    with pytest.raises(CallbackError, match=r"rule rewriter\.add: .*calls the module "
                                            r"function subroutine.*'main: y = R\.add\(x, x\)'"):
        rewrite(rule, DoubleMain)


def PatternMatchingRewriterFromModule(mod):  # noqa: N802  (TVM's spelling)
    from tvm.relax.dpl import PatternMatchingRewriter

    return PatternMatchingRewriter.from_module(mod)


def test_from_rewriter_refuses_modules_tvm_refuses():
    @I.ir_module
    class NoPattern:
        @R.function
        def replacement():
            return R.tuple()

    @I.ir_module
    class NoReplacement:
        @R.function
        def pattern():
            return R.tuple()

    @I.ir_module
    class PrimPattern:
        @T.prim_func(s_tir=True)
        def pattern():
            pass

        @R.function
        def replacement():
            return R.tuple()

    @I.ir_module
    class ShapesDiffer:
        @R.function
        def pattern(A: R.Tensor([32])):
            return A

        @R.function
        def replacement(A: R.Tensor([16])):
            return A

    @I.ir_module
    class PrimReplacement:
        @R.function
        def pattern():
            return R.tuple()

        @T.prim_func(s_tir=True)
        def replacement():
            pass

    cases = [(NoPattern, "the rewriter module has no 'pattern' function"),
             (NoReplacement, "the rewriter module has no 'replacement' function"),
             (PrimPattern, "the rewriter module's 'pattern' is a PrimFunc, not a Relax function"),
             (PrimReplacement,
              "the rewriter module's 'replacement' is a PrimFunc, not a Relax function"),
             (ShapesDiffer, "TVM refuses the rewriter module: .*must have the same signature")]
    for module, reason in cases:
        with pytest.raises(PatternError, match=rf"^mine\.rule: {reason}") as refused:
            from_rewriter(module, name="mine.rule")
        assert "\n" not in str(refused.value)


def test_from_rewriter_refuses_what_is_not_a_rewriter():
    with pytest.raises(PatternError, match=r"^from_rewriter: expected a TVM rewriter .*found "
                                           r"function"):
        from_rewriter(lambda x: x)
    with pytest.raises(PatternError, match=r"^rewriter\.notarule: a rewriter class needs "
                                           r"@R.function 'pattern' and 'replacement'"):
        from_rewriter(type("NotARule", (), {}))


def test_from_rewriter_refuses_a_pattern_kind_patternkit_cannot_express():
    from tvm.relax.dpl import PatternMatchingRewriter, is_op, is_tuple, wildcard

    unordered = is_tuple([wildcard(), wildcard()], unordered=True)
    rewriter = PatternMatchingRewriter.from_pattern(is_op("relax.concat")(unordered),
                                                    lambda orig, m: orig)
    with pytest.raises(PatternError, match=r"^mine\.concat: the pattern uses tvm\.relax\.dpl\."
                                           r"UnorderedTuplePattern, which patternkit cannot "
                                           r"express$"):
        from_rewriter(rewriter, name="mine.concat")


def test_from_rewriter_calls_a_python_replacement_on_every_match():
    # A typed-wildcard pattern looks like from_module's, but this function reads more than
    # the arguments' types (here: how often it was called); it must run once per match.
    from tvm.relax.dpl import PatternMatchingRewriter, is_op, wildcard

    x = wildcard().has_ty(relax.TensorType([16], "float32"))
    calls = []

    def scale_by_call_count(orig, matchings):
        calls.append(orig)
        return relax.op.multiply(matchings[x], relax.const(float(len(calls)), "float32"))

    rule = from_rewriter(PatternMatchingRewriter.from_pattern(is_op("relax.add")(x, x),
                                                              scale_by_call_count))
    after = rewrite(rule, add_twice)
    factors = sorted(float(b.value.args[1].value.numpy())
                     for b in after.body.blocks[0].bindings)
    assert len(calls) == 2 and factors == [1.0, 2.0]


def test_from_rewriter_rule_runs_as_a_pass_in_a_sequential():
    # TVM's rewriter_may_be_used_as_ir_transform, with patternkit's Rewrite pass.
    from patternkit.engine import Rewrite

    expected = tvm.ir.transform.Sequential([AddToPacked])(DoubleMain)
    after = tvm.ir.transform.Sequential([Rewrite(from_rewriter(AddToPacked))])(DoubleMain)
    tvm.ir.assert_structural_equal(after, expected)


@R.function(private=True)
def add_in_branches(A: R.Tensor([16], "float32"), B: R.Tensor([16], "float32"),
                    cond: R.Prim("bool")):
    if cond:
        out = A + B
    else:
        C = A + B
        out = C + B
    return out


def test_from_rewriter_leaves_if_branches_as_the_driver_does():
    # TVM's rewrite_may_apply_within_conditional rewrites the three adds; patternkit's
    # driver rewrites a function's own bindings only (docs/from-rewriter.md).
    after = rewrite(from_rewriter(AddToPacked), add_in_branches)
    tvm.ir.assert_structural_equal(after, add_in_branches)
    assert not tvm_ffi.structural_equal(AddToPacked(add_in_branches), add_in_branches)


def test_from_rewriter_rule_is_verified_numerically_from_its_own_example():
    # pk.verify needs an example: the user's pattern function when given a module, else
    # the pattern written back as a function (an @R.rewriter object keeps no function).
    from patternkit.app.verify import verify

    silu = from_rewriter(SiluCollapse)
    example = silu.example()
    assert [p.ty.shape for p in example["main"].params] == [SiluCollapse.pattern.args[0].ty.shape]
    report = verify([silu, from_rewriter(DoubleToScale, name="mine.double"),
                     from_rewriter(AddToPacked, name="mine.packed_add")], budget=2)
    by_name = {target.target: target for target in report.targets}
    for name in ("rewriter.multiply", "mine.double"):
        assert by_name[name].fired == by_name[name].tried >= 1
        assert by_name[name].failures == [] and by_name[name].max_abs_error <= 1e-5
    # the packed function AddToPacked calls does not exist on llvm: verify says so
    (failure, *_) = by_name["mine.packed_add"].failures
    assert "my_optimized_add_impl" in str(failure)


def test_from_rewriter_rule_without_a_writable_example_has_none():
    assert from_rewriter(SquareMatmul).example() is None  # symbolic sizes


@R.rewriter
class SiluCollapse:
    @R.function
    def pattern(A: R.Tensor((2, 8), "float32")):
        B = R.multiply(A, R.sigmoid(A))
        return B

    @R.function
    def replacement(A: R.Tensor((2, 8), "float32")):
        return R.nn.silu(A)


@I.ir_module
class LooseMinusNegative:
    @R.function
    def pattern(x: R.Tensor, y: R.Tensor):
        return R.subtract(x, R.negative(y))

    @R.function
    def replacement(x: R.Tensor, y: R.Tensor):
        return R.add(x, y)


@I.ir_module
class SubtractNegative:
    @R.function
    def main(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            n = R.negative(b)
            s = R.subtract(a, n)
            r = R.nn.relu(s)
            R.output(r)
        return r


@I.ir_module
class AddKeepsTypes:
    @R.function
    def main(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            s = R.add(a, b)
            r = R.nn.relu(s)
            R.output(r)
        return r


def test_from_rewriter_keeps_the_types_a_loosely_typed_rewriter_would_weaken():
    # TVM casts the arguments to the parameters' R.Tensor and everything downstream loses
    # its shape; patternkit passes the arguments as they are.
    theirs = PatternMatchingRewriterFromModule(LooseMinusNegative)(SubtractNegative)
    assert theirs["main"].body.body.ty.shape is None
    after = rewrite(from_rewriter(LooseMinusNegative), SubtractNegative)
    tvm.ir.assert_structural_equal(after, AddKeepsTypes)
