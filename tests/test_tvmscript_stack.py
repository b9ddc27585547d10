"""The test session's cheaper ``inspect.stack`` gives what ``inspect.stack`` gives."""

from __future__ import annotations

import inspect

import tvm
import tvmscript_stack
from tvm.script import ir as I, relax as R


def _both(depth: int):
    if depth:
        return _both(depth - 1)
    return inspect.stack(), tvmscript_stack.stack()


def test_the_cheap_stack_has_the_frames_lines_and_positions_of_inspects():
    real, cheap = _both(3)
    assert len(real) == len(cheap) > 5
    assert real[0].frame is cheap[0].frame and real[0].lineno == cheap[0].lineno
    for a, b in zip(real[1:], cheap[1:]):  # the callers' frames, to pytest's own
        assert (a.frame, a.filename, a.lineno, a.function, a.code_context, a.index,
                a.positions) == (b.frame, b.filename, b.lineno, b.function, b.code_context,
                                 b.index, b.positions)


def test_tvmscript_parsed_with_it_finds_the_class_and_the_closure():
    assert tvm.script.parser.ir.entry.inspect.stack is tvmscript_stack.stack
    shape = (2, 3)

    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor(shape, "float32")):
            return R.add(x, x)

    assert isinstance(Module, tvm.IRModule)
    assert [int(d) for d in Module["main"].params[0].ty.shape] == [2, 3]
