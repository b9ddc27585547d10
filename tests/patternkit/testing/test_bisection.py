"""bisect: the first rule application or pass of a pipeline that changes the numbers."""

from __future__ import annotations

import tvm
from tvm import relax

import patternkit as pk
from patternkit.dpl import is_op, wildcard
from patternkit.patterns import LIBRARY
from patternkit.patterns.batchnorm import BatchnormCollapse
from patternkit.testing.bisection import bisect


class ReluOfReluIsRelu(pk.DFPatternCallback):
    """Correct: ``relu(relu(x)) -> relu(x)``."""

    name = "test.relu_relu"

    def __init__(self):
        super().__init__()
        self.x = wildcard()
        self.pattern = is_op("relax.nn.relu")(is_op("relax.nn.relu")(self.x))

    def callback(self, pre, post, node_map):
        return relax.op.nn.relu(node_map[self.x][0])


class SigmoidIsRelu(pk.DFPatternCallback):
    """Deliberately wrong: ``sigmoid(x) -> relu(x)``."""

    name = "test.sigmoid_is_relu"

    def __init__(self):
        super().__init__()
        self.x = wildcard()
        self.pattern = is_op("relax.sigmoid")(self.x)

    def callback(self, pre, post, node_map):
        return relax.op.nn.relu(node_map[self.x][0])


def pipeline_input() -> tvm.IRModule:
    """relu(relu(x)) twice, then a sigmoid: the wrong rule fires on the third binding."""
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.relu(x))))
            b = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.relu(a))))
            s = bb.emit(relax.op.sigmoid(b))
            out = bb.emit_output(relax.op.add(s, a))
        bb.emit_func_output(out)
    return bb.get()


def test_bisect_names_the_one_wrong_rule_among_correct_ones():
    mod = pipeline_input()
    found = bisect(mod, [ReluOfReluIsRelu(), SigmoidIsRelu()])
    assert found is not None
    assert found.step == "test.sigmoid_is_relu"
    assert found.function == "main"
    assert "R.sigmoid" in found.binding
    assert found.shapes and all(shape == (2, 8) for shape in found.shapes.values())
    assert found.index == 3  # two relu rewrites came first and kept the numbers
    assert "max abs error" in found.error


def test_the_failing_step_is_drawn_around_what_changed():
    found = bisect(pipeline_input(), [ReluOfReluIsRelu(), SigmoidIsRelu()])
    drawing = found.drawing(context=1)
    assert "sigmoid" in drawing.source and "relu" in drawing.source


def test_bisect_is_none_when_no_step_changes_the_numbers():
    assert bisect(pipeline_input(), [ReluOfReluIsRelu()]) is None
    assert bisect(BatchnormCollapse().example(), LIBRARY) is None


def test_a_pass_is_one_step_and_has_no_binding():
    mod = pipeline_input()

    def drop_the_sigmoid(m):
        return pk.rewrite(SigmoidIsRelu(), m)

    found = bisect(mod, [relax.transform.CanonicalizeBindings(), drop_the_sigmoid])
    assert found.step == "drop_the_sigmoid" or found.step.endswith("drop_the_sigmoid")
    assert found.function is None and found.binding is None
    assert found.index == 2


def test_bisect_leaves_the_input_alone():
    mod = pipeline_input()
    text = mod.script()
    bisect(mod, [ReluOfReluIsRelu(), SigmoidIsRelu()])
    assert mod.script() == text
