"""What a pass receives and what it emits is checked, with errors naming who and where.

A rule that builds a replacement reading a Var it never bound used to pass, and
``well_formed`` failed passes later, far from the rule; a function that is not
normalised was silently left alone.
"""

from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit.engine import assert_well_formed
from patternkit.errors import MalformedIRError

TENSOR = relax.TensorType((2, 3), "float32")


class ExpExp(pk.DFPatternCallback):
    """exp(exp(w)) -> sigmoid(w), or whatever ``make(w)`` builds."""

    name = "test.exp_exp"

    def __init__(self, make=relax.op.sigmoid):
        super().__init__()
        self.w = pk.wildcard()
        self.pattern = pk.is_op("exp")(pk.is_op("exp")(self.w))
        self.make = make

    def callback(self, pre, post, node_map):
        return self.make(node_map[self.w][0])


@I.ir_module
class ExpsThenRelu:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.exp(a)
            c = R.nn.relu(b)
            R.output(c)
        return c


def _bound(mod, name):
    return next(b.var for b in mod["main"].body.blocks[0].bindings if b.var.name == name)


def test_a_replacement_reading_a_var_nobody_bound_is_an_error_at_the_rule():
    stranger = relax.Var("stranger", TENSOR)
    rule = ExpExp(lambda w: relax.op.add(w, stranger))
    text, main = ExpsThenRelu.script(), ExpsThenRelu["main"]
    with pytest.raises(MalformedIRError, match=(
            r"rewrite: rule test\.exp_exp returned a replacement for 'main: b = R\.exp\(a\)' "
            r"that reads 'stranger', which is not defined in this function")):
        pk.rewrite(rule, ExpsThenRelu)
    # the input is left as it was
    assert ExpsThenRelu.script() == text and ExpsThenRelu["main"].same_as(main)


def test_a_replacement_reading_a_var_bound_after_it_is_an_error():
    later = _bound(ExpsThenRelu, "c")
    with pytest.raises(MalformedIRError, match=r"reads 'c', which is bound after the binding "
                                               r"it replaces"):
        pk.rewrite(ExpExp(lambda w: relax.op.add(w, later)), ExpsThenRelu)


def test_a_replacement_reading_vars_in_scope_passes_the_check():
    out = pk.rewrite(ExpExp(lambda w: relax.op.add(w, w)), ExpsThenRelu)
    assert relax.analysis.check_well_formed(out)


def test_a_function_that_nests_calls_in_a_binding_is_refused_before_any_rewrite():
    x = relax.Var("x", TENSOR)
    lv, gv = relax.DataflowVar("lv", TENSOR), relax.Var("gv", TENSOR)
    block = relax.DataflowBlock([relax.VarBinding(lv, relax.op.exp(relax.op.exp(x))),
                                 relax.VarBinding(gv, lv)])
    mod = tvm.IRModule({"main": relax.Function([x], relax.SeqExpr([block], gv), TENSOR)})
    with pytest.raises(MalformedIRError, match=(
            r"rewrite: function 'main' is not normalised: binding 'main: lv = "
            r"R\.exp\(R\.exp\(x\)\)' nests a call in its value; run "
            r"relax\.transform\.Normalize\(\)")):
        pk.rewrite(ExpExp(), mod)


def test_a_function_returning_a_call_is_refused_instead_of_left_alone():
    # relax.Function wraps the call in an empty SeqExpr: no binding for a rule to match
    x = relax.Var("x", TENSOR)
    mod = tvm.IRModule({"main": relax.Function([x], relax.op.exp(relax.op.exp(x)), TENSOR)})
    with pytest.raises(MalformedIRError, match=r"'main' is not normalised: it returns a call "
                                               r"\(R\.exp\(R\.exp\(x\)\)\) instead of a Var"):
        pk.rewrite(ExpExp(), mod)
    normalized = relax.transform.Normalize()(mod)
    # normalised, the rule matches (the inner exp is outside dataflow: kept, not removed)
    assert [b.value.op.name for b in pk.rewrite(ExpExp(), normalized)["main"].body.blocks[0]
            .bindings] == ["relax.exp", "relax.sigmoid"]


def test_input_reading_an_undefined_var_is_refused_naming_the_binding():
    x, ghost = relax.Var("x", TENSOR), relax.Var("ghost", TENSOR)
    lv, gv = relax.DataflowVar("lv", TENSOR), relax.Var("gv", TENSOR)
    block = relax.DataflowBlock([relax.VarBinding(lv, relax.op.exp(ghost)),
                                 relax.VarBinding(gv, relax.op.exp(lv))])
    mod = tvm.IRModule({"main": relax.Function([x], relax.SeqExpr([block], gv), TENSOR)})
    with pytest.raises(MalformedIRError, match=r"function 'main' is not well formed: binding "
                                               r"'main: lv = R\.exp\(ghost\)' reads 'ghost'"):
        pk.rewrite(ExpExp(), mod)
    with pytest.raises(MalformedIRError, match=r"partition: function 'main' is not well formed"):
        pk.partition(pk.is_op("exp")(pk.wildcard()), mod)


def _two_functions_sharing_a_parameter() -> tvm.IRModule:
    x = relax.Var("x", TENSOR)
    bb = relax.BlockBuilder()
    for name, depth in (("main", 2), ("other", 1)):
        with bb.function(name, [x]):
            with bb.dataflow():
                value = x
                for _ in range(depth):
                    value = bb.emit(relax.op.exp(value))
                out = bb.emit_output(relax.op.nn.relu(value))
            bb.emit_func_output(out)
    return bb.get()


def test_debug_mode_runs_tvms_full_check_on_what_a_pass_receives(monkeypatch):
    # the cheap checks look at one function at a time; only TVM's sees this
    mod = _two_functions_sharing_a_parameter()
    pk.rewrite(ExpExp(), mod)  # not in debug mode: nothing looks across functions
    with pytest.raises(MalformedIRError, match=r"rewrite received a module that is not well "
                                               r"formed.*variable x is used as a parameter in "
                                               r"both function"):
        pk.rewrite(ExpExp(), mod, debug=True)
    monkeypatch.setenv("PATTERNKIT_DEBUG", "1")
    with pytest.raises(MalformedIRError, match="rewrite received a module"):
        pk.rewrite(ExpExp(), mod)
    with pytest.raises(MalformedIRError, match="partition received a module"):
        pk.partition(pk.is_op("exp")(pk.wildcard()), mod)


def test_assert_well_formed_names_who_and_which_function_for_callers_boundaries():
    mod = _two_functions_sharing_a_parameter()
    with pytest.raises(MalformedIRError, match=r"^the job's input received a module that is "
                                               r"not well formed"):
        assert_well_formed(mod, "the job's input", "input")
    assert_well_formed(ExpsThenRelu, "the job's input", "input")  # well formed: no error
    x = relax.Var("x", TENSOR)
    lv, gv = relax.DataflowVar("lv", TENSOR), relax.Var("gv", TENSOR)
    ghost = relax.Var("ghost", TENSOR)
    block = relax.DataflowBlock([relax.VarBinding(lv, relax.op.exp(x)),
                                 relax.VarBinding(gv, relax.op.add(lv, ghost))])
    broken = tvm.IRModule({"main": relax.Function([x], relax.SeqExpr([block], gv), TENSOR)})
    with pytest.raises(MalformedIRError, match=(
            r"the job produced a module that is not well formed \(rules that changed it: "
            r"a\.b\) in function 'main': .*\(the function is not well formed: binding "
            r"'main: gv = R\.add\(lv, ghost\)' reads 'ghost'")):
        assert_well_formed(broken, "the job", "output", rules=["a.b"])
