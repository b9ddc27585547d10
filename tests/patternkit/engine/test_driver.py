"""DFPatternCallback + rewrite: Relay's rewrite semantics on Relax.

The toy rules here (exp(exp(w)) -> sigmoid(w), ...) are chosen to make the driver's
decisions easy to follow; they do not preserve numerics, so the numeric checks of the
engine live with the real rules in tests/patterns/.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk


class ExpToSigmoid(pk.DFPatternCallback):
    """exp(exp(w)) -> sigmoid(w): small enough to follow by hand."""

    name = "test.exp_exp"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.w = pk.wildcard()
        self.inner = pk.is_op("exp")(self.w)
        self.pattern = pk.is_op("exp")(self.inner)
        self.calls = []

    def callback(self, pre, post, node_map):
        self.calls.append((pre, post, node_map))
        return relax.op.sigmoid(node_map[self.w][0])


class ReluGrows(pk.DFPatternCallback):
    """relu(x) -> relu(relu(x)): its output always matches again."""

    name = "test.relu_grows"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.x = pk.wildcard()
        self.pattern = pk.is_op("nn.relu")(self.x)

    def callback(self, pre, post, node_map):
        return relax.op.nn.relu(relax.op.nn.relu(node_map[self.x][0]))


def exp_chain(length: int) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    expr = x
    for _ in range(length):
        expr = relax.op.exp(expr)
    return pk.from_expr(expr)


def ops_of(func: relax.Function) -> list[str]:
    return [b.value.op.name for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def test_callback_receives_relay_style_node_map():
    rule = ExpToSigmoid()
    mod = exp_chain(2)
    pk.rewrite(rule, mod)
    assert len(rule.calls) == 1
    pre, post, node_map = rule.calls[0]
    assert pre.same_as(post) and pre.op.name == "relax.exp"
    (w,) = node_map[rule.w]
    assert w.same_as(mod["main"].params[0])               # leaves: the argument as written
    (inner,) = node_map[rule.inner]
    assert isinstance(inner, relax.Call) and inner.op.name == "relax.exp"   # calls: the value
    assert isinstance(node_map.var(rule.inner), relax.Var)
    with pytest.raises(KeyError, match="not part of this match"):
        node_map[pk.wildcard()]


def test_outermost_match_wins_and_rounds_continue_until_stable():
    mod = exp_chain(5)
    log = pk.RewriteLog()
    out = pk.rewrite(ExpToSigmoid(), mod, log=log)
    # Relay groups from the output back: exp5(exp4) and exp3(exp2) in round one, exp1 is
    # left; round two finds no exp(exp(.)) any more.
    assert ops_of(out["main"]) == ["relax.exp", "relax.sigmoid", "relax.sigmoid"]
    assert log.count("test.exp_exp") == 2 and log.rounds == 2


def test_log_records_each_root_and_the_bindings_it_replaced():
    mod = exp_chain(5)
    log = pk.RewriteLog()
    out = pk.rewrite(ExpToSigmoid(), mod, log=log)
    assert [(r.rule, r.function, r.root, r.replaced, r.round) for r in log.records] == [
        ("test.exp_exp", "main", "lv2", ("lv1", "lv2"), 0),
        ("test.exp_exp", "main", "gv", ("lv3", "gv"), 0),
    ]
    # Without a log nothing is recorded, and the rewrite is the same.
    tvm.ir.assert_structural_equal(pk.rewrite(ExpToSigmoid(), mod), out)


def test_rewrite_accepts_module_function_and_bare_expression():
    mod = exp_chain(2)
    rule = ExpToSigmoid()
    assert isinstance(pk.rewrite(rule, mod), tvm.IRModule)
    func = pk.rewrite(rule, mod["main"])
    assert isinstance(func, relax.Function) and ops_of(func) == ["relax.sigmoid"]
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    expr = pk.rewrite(rule, relax.op.exp(relax.op.exp(x)))
    assert isinstance(expr, relax.Call) and expr.op.name == "relax.sigmoid"
    assert expr.args[0].same_as(x)


def test_rewrite_never_modifies_its_input():
    mod = exp_chain(3)
    text, main = mod.script(), mod["main"]
    out = pk.rewrite(ExpToSigmoid(), mod)
    assert mod.script() == text and mod["main"].same_as(main)
    assert out.script() != text


def test_no_match_returns_an_equal_module():
    mod = exp_chain(1)
    out = pk.rewrite(ExpToSigmoid(), mod)
    tvm.ir.assert_structural_equal(out, mod)


def test_non_converging_rules_stop_with_an_error_naming_them():
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    mod = pk.from_expr(relax.op.nn.relu(x))
    with pytest.raises(pk.errors.RewriteDidNotConverge, match=r"after 7 passes.*test\.relu_grows"):
        pk.rewrite(ReluGrows(), mod, max_passes=7)


def test_rewrite_once_applies_a_rule_in_one_pass_only():
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    mod = pk.from_expr(relax.op.nn.relu(x))
    out = pk.rewrite(ReluGrows(rewrite_once=True), mod)
    assert ops_of(out["main"]) == ["relax.nn.relu", "relax.nn.relu"]


def test_several_callbacks_apply_in_order_until_nothing_changes():
    class SigmoidToTanh(pk.DFPatternCallback):
        name = "test.sigmoid_tanh"

        def __init__(self):
            super().__init__()
            self.x = pk.wildcard()
            self.pattern = pk.is_op("sigmoid")(self.x)

        def callback(self, pre, post, node_map):
            return relax.op.tanh(node_map[self.x][0])

    log = pk.RewriteLog()
    out = pk.rewrite([SigmoidToTanh(), ExpToSigmoid()], exp_chain(4), log=log)
    assert ops_of(out["main"]) == ["relax.tanh", "relax.tanh"]
    assert log.counts() == {"test.exp_exp": 2, "test.sigmoid_tanh": 2}


def test_intermediate_used_outside_the_match_is_not_rewritten_by_default():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    inner = relax.op.exp(x)
    mod = pk.from_expr(relax.Tuple([relax.op.exp(inner), relax.op.nn.relu(inner)]))
    log = pk.RewriteLog()
    out = pk.rewrite(ExpToSigmoid(), mod, log=log)
    tvm.ir.assert_structural_equal(out, mod)
    assert log.reasons() == ["intermediate 'lv' is also used by 'lv2' outside the match"]
    allowed = pk.rewrite(ExpToSigmoid(), mod, allow_escaping_intermediates=True)
    assert sorted(ops_of(allowed["main"])) == ["relax.exp", "relax.nn.relu", "relax.sigmoid"]


class ExpToSigmoidKeepingInner(ExpToSigmoid):
    escapable_roles = ("inner",)


def test_a_rule_may_let_a_named_role_escape_and_keeps_its_binding_for_the_other_readers():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    inner = relax.op.exp(x)
    mod = pk.from_expr(relax.Tuple([relax.op.exp(inner), relax.op.nn.relu(inner)]))
    out = pk.rewrite(ExpToSigmoidKeepingInner(), mod)
    assert sorted(ops_of(out["main"])) == ["relax.exp", "relax.nn.relu", "relax.sigmoid"]
    kept = relu_input = None
    for binding in out["main"].body.blocks[0].bindings:
        if pk.ir.op_name(binding.value) == "relax.exp":
            kept = binding.var
        if pk.ir.op_name(binding.value) == "relax.nn.relu":
            relu_input = binding.value.args[0]
    assert relu_input.same_as(kept)  # the relu still reads exp(x), kept for it


def test_escapable_roles_must_name_roles_of_the_rule():
    class Misnamed(ExpToSigmoid):
        escapable_roles = ("innr",)

    with pytest.raises(pk.PatternError, match=r"escapable_roles names \['innr'\], which are "
                                              r"not roles of the rule"):
        pk.rewrite(Misnamed(), pk.from_expr(relax.op.exp(relax.op.exp(
            relax.Var("x", relax.TensorType((2,), "float32"))))))


def test_dead_code_that_was_already_there_is_kept():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                unused = R.nn.relu(x)
                a = R.exp(x)
                b = R.exp(a)
                R.output(b)
            return b

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                unused = R.nn.relu(x)
                b = R.sigmoid(x)
                R.output(b)
            return b

    tvm.ir.assert_structural_equal(pk.rewrite(ExpToSigmoid(), Before), Expected)


def test_check_can_veto_with_a_reason():
    class Picky(ExpToSigmoid):
        def check(self, pre, node_map):
            return pk.reject("not today")

    log = pk.RewriteLog()
    mod = exp_chain(2)
    tvm.ir.assert_structural_equal(pk.rewrite(Picky(), mod, log=log), mod)
    assert log.reasons("test.exp_exp") == ["not today"]


def test_callback_that_raises_names_the_rule_and_the_binding():
    class Broken(ExpToSigmoid):
        def callback(self, pre, post, node_map):
            raise ValueError("boom")

    mod = exp_chain(2)
    expected = r"test\.exp_exp.*ValueError: boom.*main: gv = R.exp"
    with pytest.raises(pk.errors.CallbackError, match=expected) as info:
        pk.rewrite(Broken(), mod)
    assert info.value.callback == "test.exp_exp"
    assert isinstance(info.value.__cause__, ValueError)


def test_relays_three_argument_form_runs_as_ported():
    """Relay's ``rewrite(callbacks, expr, mod)``: the module typed ``expr`` there; Relax
    expressions carry their types, so it is accepted and checked, not needed."""
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    expr = relax.op.exp(relax.op.exp(x))
    mod = exp_chain(1)
    out = pk.rewrite(ExpToSigmoid(), expr, mod)
    assert out.op.name == "relax.sigmoid"
    with pytest.raises(TypeError, match="mod must be a tvm.IRModule"):
        pk.rewrite(ExpToSigmoid(), expr, "main")


def test_callback_returning_a_non_expression_is_an_error():
    class ReturnsNumber(ExpToSigmoid):
        def callback(self, pre, post, node_map):
            return 3

    with pytest.raises(pk.errors.CallbackError, match="returned int"):
        pk.rewrite(ReturnsNumber(), exp_chain(2))


def test_callback_returning_the_wrong_type_is_an_error():
    class WrongShape(ExpToSigmoid):
        def callback(self, pre, post, node_map):
            return relax.op.sum(node_map[self.w][0], axis=[1])

    mod = exp_chain(2)
    with pytest.raises(pk.errors.CallbackError,
                       match=r"keep the binding's type \(the dtype and the rank differ|"
                             r"keep the binding's type \(did the rewrite forget a reshape\?\)"):
        pk.rewrite(WrongShape(), mod)


def test_a_replacement_of_another_dtype_is_named_as_a_missing_astype():
    class WrongDtype(ExpToSigmoid):
        def callback(self, pre, post, node_map):
            return relax.op.astype(node_map[self.w][0], "float16")

    with pytest.raises(pk.errors.CallbackError) as info:
        pk.rewrite(WrongDtype(), exp_chain(2))
    message = str(info.value)
    assert "did the rewrite forget an astype to float32?" in message
    assert "reshape" not in message and "\n" not in message


def test_rules_without_a_patternkit_pattern_are_rejected():
    class NoPattern(pk.DFPatternCallback):
        pass

    class TvmPattern(pk.DFPatternCallback):
        def __init__(self):
            super().__init__()
            self.pattern = relax.dpl.is_op("relax.exp")(relax.dpl.wildcard())

    with pytest.raises(pk.PatternError, match="NoPattern.pattern must be a patternkit pattern"):
        pk.rewrite(NoPattern(), exp_chain(1))
    with pytest.raises(pk.PatternError, match="tvm.relax.dpl"):
        pk.rewrite(TvmPattern(), exp_chain(1))
    with pytest.raises(pk.PatternError, match=r"rule 0: expected a rule \(a RewriteRule, "):
        pk.rewrite([object()], exp_chain(1))


def test_rewrite_pass_composes_in_a_sequential_with_instruments():
    @tvm.instrument.pass_instrument
    class Names:
        def __init__(self):
            self.seen = []

        def run_before_pass(self, mod, info):
            self.seen.append(info.name)

    names = Names()
    seq = tvm.transform.Sequential([pk.Rewrite(ExpToSigmoid()), relax.transform.Normalize()])
    with tvm.transform.PassContext(opt_level=3, instruments=[names]):
        out = seq(exp_chain(2))
    assert ops_of(out["main"]) == ["relax.sigmoid"]
    assert "patternkit.Rewrite(test.exp_exp)" in names.seen


def test_fused_functions_are_left_alone():
    mod = exp_chain(2)
    fused = mod["main"].with_attr("Primitive", True)
    mod2 = tvm.IRModule({"main": fused})
    tvm.ir.assert_structural_equal(pk.rewrite(ExpToSigmoid(), mod2), mod2)


# ---------------------------------------------------------------------- dead readers
def onnx_conv_batchnorm() -> tvm.IRModule:
    """What the ONNX importer emits for Conv(bias) + BatchNormalization + Relu (opset 14).

    Mirrors ``from_onnx`` binding for binding: the conv bias reshaped and added, an
    inference ``batch_norm`` whose mean and variance outputs ``lv5 = lv3[1]`` and
    ``lv6 = lv3[2]`` nothing reads.
    """
    rng = np.random.default_rng(0)

    def const(shape, low=None):
        data = rng.random(shape) + low if low is not None else rng.standard_normal(shape)
        return relax.const(data.astype("float32"))

    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"num_input": 1}):
        with bb.dataflow():
            lv = bb.emit(relax.op.nn.conv2d(x, const((4, 3, 3, 3)), padding=[1, 1, 1, 1]), "lv")
            lv1 = bb.emit(relax.op.reshape(const((4,)), (1, 4, 1, 1)), "lv1")
            lv2 = bb.emit(relax.op.add(lv, lv1), "lv2")
            lv3 = bb.emit(relax.op.nn.batch_norm(lv2, const((4,), 0.5), const((4,)),
                                                 const((4,)), const((4,), 0.5), axis=1,
                                                 epsilon=1e-5, training=False), "lv3")
            lv4 = bb.emit(relax.TupleGetItem(lv3, 0), "lv4")
            bb.emit(relax.TupleGetItem(lv3, 1), "lv5")
            bb.emit(relax.TupleGetItem(lv3, 2), "lv6")
            gv = bb.emit_output(relax.op.nn.relu(lv4), "gv")
        bb.emit_func_output(gv)
    return bb.get()


def imported_conv_batchnorm() -> tvm.IRModule:
    """The same Conv(bias) + BatchNormalization + Relu through the ONNX importer itself."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((4, 3, 3, 3)), "b": rng.standard_normal(4),
              "g": rng.random(4) + 0.5, "beta": rng.standard_normal(4),
              "mean": rng.standard_normal(4), "var": rng.random(4) + 0.5}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"],
                              epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv_bn_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(a.astype("float32"), name) for name, a in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return from_onnx(model, keep_params_in_input=False)


@pytest.mark.parametrize("build", [onnx_conv_batchnorm, imported_conv_batchnorm],
                         ids=["mirrored", "onnx_importer"])
def test_dead_readers_do_not_stop_the_batch_norm_fold_on_onnx_graphs(build):
    from patternkit.patterns import LIBRARY

    mod = build()
    bindings = {b.var.name: b.value for b in mod["main"].body.blocks[0].bindings}
    assert isinstance(bindings["lv5"], relax.TupleGetItem)  # the dead reader of lv3 is there
    log = pk.RewriteLog()
    out = pk.rewrite(LIBRARY.find("conv.fold_batchnorm"), mod, log=log)
    assert log.counts() == {"conv.fold_batchnorm": 1} and log.reasons() == []
    # the batch norm is gone with its dead readers, not kept alive for them
    assert ops_of(out["main"]) == ["relax.nn.conv2d", "relax.add", "relax.nn.relu"]
    assert relax.analysis.check_well_formed(out)
    pk.assert_same_numerics(mod, out, rtol=1e-5, atol=1e-5)


def test_an_intermediate_read_only_by_dead_code_does_not_escape():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 3), "float32"), y: R.Tensor((2, 3), "float32")):
            with R.dataflow():
                a = R.exp(x)
                dead = R.sigmoid(a)
                also_dead = R.add(dead, y)
                b = R.exp(a)
                kept = R.nn.relu(y)
                R.output(b)
            return b

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 3), "float32"), y: R.Tensor((2, 3), "float32")):
            with R.dataflow():
                b = R.sigmoid(x)
                kept = R.nn.relu(y)
                R.output(b)
            return b

    log = pk.RewriteLog()
    tvm.ir.assert_structural_equal(pk.rewrite(ExpToSigmoid(), Before, log=log), Expected)
    assert log.reasons() == []  # no "intermediate 'a' is also used by 'dead'"


def test_dead_code_is_never_the_root_of_a_match():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 3), "float32")):
            with R.dataflow():
                unused = R.exp(R.exp(x))
                b = R.nn.relu(x)
                R.output(b)
            return b

    log = pk.RewriteLog()
    tvm.ir.assert_structural_equal(pk.rewrite(ExpToSigmoid(), Before, log=log), Before)
    assert log.records == [] and log.skipped == []


# ---------------------------------------------------------------------- runaway growth
def test_a_rule_that_grows_the_graph_every_round_stops_early_naming_it():
    # relu(a) -> relu(relu(a)) doubles the graph each round; with the default 100 passes
    # it used to run for minutes and exhaust memory
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    mod = pk.from_expr(relax.op.nn.relu(x))
    with pytest.raises(pk.errors.RewriteDidNotConverge,
                       match=r"after 7 passes function 'main' has grown from 1 to 128 bindings, "
                             r"past the bound of 66 .*rule test\.relu_grows replaced 64 "
                             r"binding\(s\) with 128"):
        pk.rewrite(ReluGrows(), mod)


def test_the_growth_bound_scales_with_the_input_and_can_be_raised_or_lifted():
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    expr = x
    for _ in range(100):
        expr = relax.op.nn.relu(expr)
    mod = pk.from_expr(expr)  # 100 bindings: bound 2 x 100 + 64
    did_not_converge = pk.errors.RewriteDidNotConverge
    with pytest.raises(did_not_converge, match=r"from 100 to 400 bindings.*bound of 264"):
        pk.rewrite(ReluGrows(), mod)
    with pytest.raises(did_not_converge, match=r"from 100 to 800 bindings.*bound of 464"):
        pk.rewrite(ReluGrows(), mod, max_growth=4)
    # no bound: only the pass limit stops it
    with pytest.raises(did_not_converge, match=r"after 3 passes; rules still changing"):
        pk.rewrite(ReluGrows(), mod, max_growth=None, max_passes=3)
    with pytest.raises(ValueError, match="max_growth must be at least 1"):
        pk.rewrite(ReluGrows(), mod, max_growth=0.5)


def test_a_rule_that_expands_a_small_function_once_is_within_the_bound():
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    out = pk.rewrite(ReluGrows(rewrite_once=True), pk.from_expr(relax.op.nn.relu(x)))
    assert ops_of(out["main"]) == ["relax.nn.relu", "relax.nn.relu"]


# ---------------------------------------------------------------------- silent no-ops
def test_a_callback_returning_none_leaves_the_binding_and_says_so(caplog):
    class Forgetful(ExpToSigmoid):
        def callback(self, pre, post, node_map):
            relax.op.sigmoid(node_map[self.w][0])  # the return is missing

    mod = exp_chain(2)
    log = pk.RewriteLog()
    with caplog.at_level("INFO", logger="patternkit.engine.driver"):
        out = pk.rewrite(Forgetful(), mod, log=log)
    tvm.ir.assert_structural_equal(out, mod)
    assert log.records == []
    assert [(s.root, s.kind, s.reason) for s in log.skipped] == [
        ("gv", "declined", "the rewrite returned None: binding left as it is")]
    assert "rule test.exp_exp left 1 match(es) in 'main' as they were" in caplog.text


def test_a_rule_class_instead_of_an_instance_is_a_type_error_naming_it():
    for call in (lambda: pk.rewrite(ExpToSigmoid, exp_chain(2)),
                 lambda: pk.rewrite([ExpToSigmoid(), ReluGrows], exp_chain(2)),
                 lambda: pk.Rewrite(ExpToSigmoid)):
        with pytest.raises(TypeError, match=r"(ExpToSigmoid|ReluGrows) is a rule class, not a "
                                            r"rule; pass an instance: \w+\(\)"):
            call()


# ---------------------------------------------------------------------- one index per round
class SigmoidToTanh(pk.DFPatternCallback):
    name = "test.sigmoid_tanh"

    def __init__(self):
        super().__init__()
        self.x = pk.wildcard()
        self.pattern = pk.is_op("sigmoid")(self.x)

    def callback(self, pre, post, node_map):
        return relax.op.tanh(node_map[self.x][0])


def test_all_rules_of_a_round_share_one_index_of_each_function(monkeypatch):
    from patternkit.engine import driver
    from patternkit.engine.index import FunctionIndex

    builds = []
    original = FunctionIndex.build.__func__

    def counting(cls, func):
        builds.append(func)
        return original(cls, func)

    monkeypatch.setattr(driver.FunctionIndex, "build", classmethod(counting))
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    mod = pk.from_expr(relax.op.sigmoid(_nest(relax.op.exp, x, 4)))
    log = pk.RewriteLog()
    out = pk.rewrite([SigmoidToTanh(), ExpToSigmoid()], mod, log=log)
    assert ops_of(out["main"]) == ["relax.tanh"] * 3
    # round 1: both rules fire on one index; round 2: sigmoid_tanh; round 3 finds no
    # root operator left and indexes nothing (one index per rule: 3 builds)
    assert log.counts() == {"test.sigmoid_tanh": 3, "test.exp_exp": 2}
    assert log.rounds == 3 and len(builds) == 2


def _nest(op, x, depth):
    for _ in range(depth):
        x = op(x)
    return x


def test_a_later_rule_of_the_round_does_not_look_through_a_binding_an_earlier_one_replaced():
    class ExpToTanh(pk.DFPatternCallback):
        name = "test.exp_tanh"

        def __init__(self):
            super().__init__()
            self.x = pk.wildcard()
            self.pattern = pk.is_op("exp")(self.x)

        def callback(self, pre, post, node_map):
            return relax.op.tanh(node_map[self.x][0])

    class ReluOfExp(pk.DFPatternCallback):
        name = "test.relu_exp"

        def __init__(self):
            super().__init__()
            self.x = pk.wildcard()
            self.pattern = pk.is_op("nn.relu")(pk.is_op("exp")(self.x))

        def callback(self, pre, post, node_map):
            return relax.op.negative(node_map[self.x][0])

    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    mod = pk.from_expr(relax.op.nn.relu(relax.op.exp(x)))
    log = pk.RewriteLog()
    out = pk.rewrite([ExpToTanh(), ReluOfExp()], mod, log=log)
    # as Relay's rule-by-rule passes: exp is tanh before relu_exp looks, so it never fires
    assert ops_of(out["main"]) == ["relax.tanh", "relax.nn.relu"]
    assert log.counts() == {"test.exp_tanh": 1}


def test_a_later_rule_of_the_round_skips_a_binding_an_earlier_one_absorbed():
    class ExpToNegative(pk.DFPatternCallback):
        name = "test.exp_negative"

        def __init__(self):
            super().__init__()
            self.x = pk.wildcard()
            self.pattern = pk.is_op("exp")(self.x)

        def callback(self, pre, post, node_map):
            return relax.op.negative(node_map[self.x][0])

    log = pk.RewriteLog()
    out = pk.rewrite([ExpToSigmoid(), ExpToNegative()], exp_chain(2), log=log)
    assert ops_of(out["main"]) == ["relax.sigmoid"]
    assert log.counts() == {"test.exp_exp": 1}
    assert log.reasons("test.exp_negative") == [
        "overlaps the match of 'test.exp_exp' at 'gv' (earlier in this round), which already "
        "took 'gv'",
        "overlaps the match of 'test.exp_exp' at 'gv' (earlier in this round), which already "
        "took 'lv'"]
