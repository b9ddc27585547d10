"""Emission types a convolution once per signature (``patternkit.engine.known_types``).

What users rely on: the emitted function is exactly the one TVM's normalisation of every
replacement gives (types, bindings, numbers), a convolution whose operator, attributes
and argument types were seen before in the block is not inferred again (0.3-0.6 ms each
in TVM 0.27), one with other attributes or argument types is, and an ill-typed
replacement is still the one-line error naming the rule and the binding.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from patternkit.engine import emit as emit_module
from patternkit.engine.emit import emit_rewrites
from patternkit.engine.index import FunctionIndex
from patternkit.engine.known_types import KnownTypes
from patternkit.errors import CallbackError
from patternkit.ir.compat import handle, structural_equal


def _weight(rng: np.random.Generator, out_channels: int = 4, in_channels: int = 4,
            k: int = 3) -> relax.Expr:
    return relax.const(rng.uniform(-1, 1, (out_channels, in_channels, k, k)).astype("float32"))


def _convolutions() -> tvm.IRModule:
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, _weight(rng), padding=[1, 1]))
            b = bb.emit(relax.op.nn.conv2d(a, _weight(rng), padding=[1, 1]))
            c = bb.emit(relax.op.nn.conv2d(b, _weight(rng)))
            d = bb.emit_output(relax.op.nn.max_pool2d(c, (2, 2)))
        bb.emit_func_output(d)
    return bb.get()


def _replacements(func: relax.Function) -> dict[int, relax.Expr]:
    """New weights for the three convolutions (the first two of one signature: same
    attributes, arguments of the same type) and a pooling plus a bias for the last;
    fresh (untyped) calls with the same constants on every call.
    """
    rng = np.random.default_rng(1)
    a, b, c, d = [binding for block in func.body.blocks for binding in block.bindings]
    return {handle(a.var): relax.op.nn.conv2d(func.params[0], _weight(rng), padding=[1, 1]),
            handle(b.var): relax.op.nn.conv2d(a.var, _weight(rng), padding=[1, 1]),
            handle(c.var): relax.op.nn.conv2d(b.var, _weight(rng)),
            handle(d.var): relax.op.add(relax.op.nn.max_pool2d(c.var, (2, 2)),
                                        relax.const(np.float32(0.5)))}


def _emit(mod: tvm.IRModule, replacements: dict[int, relax.Expr]) -> relax.Function:
    func = mod["main"]
    return emit_rewrites(func, FunctionIndex.build(func), replacements, "main",
                         pass_name="test").function


def _run(func: relax.Function, x: np.ndarray) -> np.ndarray:
    ex = relax.build(tvm.IRModule({"main": func}), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_a_signature_seen_before_is_given_its_type_and_the_function_is_unchanged(monkeypatch):
    mod = _convolutions()
    replacements = _replacements(mod["main"])
    builders: list[KnownTypes] = []

    class Recorded(KnownTypes):
        def __init__(self, bb):
            super().__init__(bb)
            builders.append(self)

    monkeypatch.setattr(emit_module, "KnownTypes", Recorded)
    emitted = _emit(mod, replacements)
    (known,) = builders
    assert (known.given, known.inferred) == (1, 3)  # conv b shares conv a's signature

    # the reference: every replacement typed by TVM's normalisation alone
    monkeypatch.setattr(KnownTypes, "give_types", lambda self, value, rule: None)
    mod_again = _convolutions()
    reference = _emit(mod_again, _replacements(mod_again["main"]))
    # the same bindings, types and values (constants compared by value)
    assert structural_equal(emitted, reference)
    x = np.random.default_rng(2).uniform(-1, 1, (1, 4, 8, 8)).astype("float32")
    np.testing.assert_allclose(_run(emitted, x), _run(reference, x), rtol=1e-6, atol=1e-6)


def test_other_attributes_or_argument_types_are_inferred_again():
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    y = relax.Var("y", relax.TensorType((1, 4, 9, 9), "float32"))
    rng = np.random.default_rng(3)
    bb = relax.BlockBuilder()
    with bb.function("f", [x, y]):
        known = KnownTypes(bb)
        calls = [relax.op.nn.conv2d(x, _weight(rng), padding=[1, 1]),
                 relax.op.nn.conv2d(x, _weight(rng)),                  # other padding
                 relax.op.nn.conv2d(y, _weight(rng), padding=[1, 1]),  # other input type
                 relax.op.nn.conv2d(x, _weight(rng), padding=[1, 1])]  # the first again
        for call in calls:
            known.give_types(call, "rule")
        bb.emit_func_output(x)
    assert (known.given, known.inferred) == (1, 3)
    assert [tuple(int(d) for d in c.ty.shape) for c in calls] == [
        (1, 4, 8, 8), (1, 4, 6, 6), (1, 4, 9, 9), (1, 4, 8, 8)]


def test_a_rule_whose_first_replacement_has_no_convolution_is_not_looked_at_again():
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    rng = np.random.default_rng(5)
    bb = relax.BlockBuilder()
    with bb.function("f", [x]):
        known = KnownTypes(bb)
        known.give_types(relax.op.add(x, x), "plain")
        later = relax.op.nn.conv2d(x, _weight(rng), padding=[1, 1])
        known.give_types(later, "plain")   # not looked at: normalised by TVM as before
        assert (known.given, known.inferred) == (0, 0)
        known.give_types(relax.op.nn.conv2d(x, _weight(rng), padding=[1, 1]), "convs")
        known.give_types(relax.op.nn.conv2d(x, _weight(rng), padding=[1, 1]), "convs")
        assert (known.given, known.inferred) == (1, 1)
        bb.emit_func_output(x)


def test_an_ill_typed_convolution_is_still_a_one_line_error_naming_the_binding():
    mod = _convolutions()
    func = mod["main"]
    first = func.body.blocks[0].bindings[0]
    wrong = {handle(first.var): relax.op.nn.conv2d(
        func.params[0], _weight(np.random.default_rng(4), in_channels=3))}
    with pytest.raises(CallbackError, match=r"rule test: the replacement for 'main: lv = "
                                            r".*' is not a valid Relax expression"):
        _emit(mod, wrong)
