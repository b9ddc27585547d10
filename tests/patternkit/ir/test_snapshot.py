"""patternkit.ir.snapshot: one record of a function, the same from both readers.

The native reader (a C++ walk compiled on first use) and the pure-Python one must give
identical snapshots on real models and on random programs; the record must agree with
what the engine's index reads from the objects; bad input gets the engine's one-line
``MalformedIRError`` naming the binding; the native reader is optional at run time.
"""

from __future__ import annotations

import warnings

import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

from patternkit.engine.index import FunctionIndex
from patternkit.errors import MalformedIRError
from patternkit.ir import compat as C
from patternkit.ir.snapshot import (
    ARG_CONSTANT,
    ARG_TUPLE,
    SYMBOLIC,
    ValueKind,
    native,
    param_code,
    snapshot,
)
from patternkit.testing.op_programs import op_programs


def _both(func):
    """The snapshot from each reader; the native one must really have run."""
    assert native.walker() is not None, "the native reader did not build on this machine"
    return snapshot(func, native_reader=True), snapshot(func, native_reader=False)


def _module():
    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((2, "n"), "float32"), w: R.Tensor((3,), "float16")):
            with R.dataflow():
                a = R.exp(x)
                t = (a, x)
                b = t[0]
                c = R.concat((a, b), axis=1)
                R.output(c)
            d = R.add(c, R.const(1.0, "float32"))
            return d

    return Module


def test_the_record_of_a_small_function():
    func = _module()["main"]
    snap, python = _both(func)
    assert snap == python
    assert len(snap) == 5
    assert [snap.op_name(i) for i in range(5)] == ["relax.exp", None, None, "relax.concat",
                                                   "relax.add"]
    assert snap.kind == [ValueKind.OP_CALL, ValueKind.TUPLE, ValueKind.GET_ITEM,
                         ValueKind.OP_CALL, ValueKind.OP_CALL]
    assert snap.args_of(0) == [param_code(0)]
    assert snap.args_of(1) == [0, param_code(0)]
    assert snap.args_of(2) == [1] and snap.item[2] == 0
    assert snap.args_of(3) == [ARG_TUPLE]
    assert snap.args_of(4) == [3, ARG_CONSTANT]
    assert snap.uses == [2, 1, 1, 1, 1]  # a: by the tuple and by the concat's tuple literal
    assert snap.param_uses == [2, 0]
    assert snap.dataflow == [True, False] and snap.block == [0, 0, 0, 0, 1]
    assert snap.shape(0) == (2, SYMBOLIC) and snap.dtype_name(0) == "float32"
    assert snap.shape(1) is None and snap.dtype_name(1) is None  # a tuple
    assert snap.result == 4
    assert snap.var == [C.handle(b.var) for blk in func.body.blocks for b in blk.bindings]


def _agrees_with_the_index(func, snap):
    """The snapshot says what the engine's index and the objects say."""
    index = FunctionIndex.build(func)
    bindings = [b for blk in C.array_items(func.body.blocks) for b in C.array_items(blk.bindings)]
    assert len(snap) == len(bindings)
    for i, binding in enumerate(bindings):
        key = C.handle(binding.var)
        assert snap.var[i] == key
        assert snap.op_name(i) == C.op_name(binding.value)
        assert snap.uses[i] == index.readers.get(key, 0) + (key in _result_reads(func))
        ty = binding.var.ty
        expected = C.static_shape(ty)
        if expected is not None:
            assert snap.shape(i) == tuple(d if isinstance(d, int) else SYMBOLIC
                                          for d in expected)
        assert snap.dtype_name(i) == C.dtype_of(ty)


def _result_reads(func):
    from patternkit.ir.walk import vars_read

    return {C.handle(v) for v in vars_read(func.body.body)}


@pytest.mark.parametrize("spec", ["zoo:gpt2?layers=1", "zoo:onnx:conv_bn",
                                  "zoo:resnet18?width=8&image=16"])
def test_both_readers_agree_on_zoo_models(spec):
    from patternkit.models.zoo import zoo_model

    model = zoo_model(spec)
    func = model.mod[model.entry]
    snap, python = _both(func)
    assert snap == python
    _agrees_with_the_index(func, snap)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op_programs(min_ops=2, max_ops=8))
def test_both_readers_agree_on_random_programs(mod):
    func = mod["main"]
    snap, python = _both(func)
    assert snap == python
    _agrees_with_the_index(func, snap)


def test_the_users_function_is_not_changed():
    mod = _module()
    before = mod.script()
    _both(mod["main"])
    assert mod.script() == before


def _undefined_read():
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    ghost = relax.Var("ghost", relax.TensorType((2,), "float32"))
    y = relax.Var("y", relax.TensorType((2,), "float32"))
    body = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(y, relax.op.add(x, ghost))])],
                         y)
    return relax.Function([x], body, relax.TensorType((2,), "float32"))


def _nested_call():
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    y = relax.Var("y", relax.TensorType((2,), "float32"))
    body = relax.SeqExpr([relax.BindingBlock([
        relax.VarBinding(y, relax.Call(tvm.ir.Op.get("relax.exp"),
                                       [relax.Call(tvm.ir.Op.get("relax.exp"), [x])]))])], y)
    return relax.Function([x], body, relax.TensorType((2,), "float32"))


@pytest.mark.parametrize("native_reader", [True, False])
@pytest.mark.parametrize("build, message", [
    (_undefined_read, r"^snapshot: function 'function' is not well formed: binding "
                      r"'function: y = R.add\(x, ghost\)' reads 'ghost', which is neither a "
                      r"parameter nor bound before it$"),
    (_nested_call, r"^snapshot: function 'function' is not normalised: binding 'function: y = "
                   r".*' nests a call in its value; run relax.transform.Normalize\(\)"),
])
def test_bad_input_is_refused_naming_the_binding(build, message, native_reader):
    with pytest.raises(MalformedIRError, match=message):
        snapshot(build(), native_reader=native_reader)


def test_a_function_returning_a_call_is_refused():
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    func = relax.Function([x], relax.op.exp(x), relax.TensorType((2,), "float32"))
    for native_reader in (True, False):
        with pytest.raises(MalformedIRError, match=r"^snapshot: function 'function' is not "
                                                   r"normalised: it returns a call instead of a "
                                                   r"Var; run relax.transform.Normalize\(\)"):
            snapshot(func, native_reader=native_reader)


def test_PATTERNKIT_NATIVE_0_never_calls_the_native_reader(monkeypatch):
    def refuse(func):
        raise AssertionError("the native reader ran")

    monkeypatch.setattr(native, "read", refuse)
    monkeypatch.setenv(native.NATIVE_VARIABLE, "0")
    func = _module()["main"]
    assert snapshot(func) == snapshot(func, native_reader=False)


def test_a_failed_build_warns_once_and_falls_back(monkeypatch):
    import tvm_ffi.cpp

    def broken(*args, **kwargs):
        raise RuntimeError("ninja: build stopped: subcommand failed.\nmore detail")

    monkeypatch.setattr(native.WALK, "built", None)
    monkeypatch.setattr(native.WALK, "failed", False)
    monkeypatch.setattr(tvm_ffi.cpp, "load_inline", broken)
    func = _module()["main"]
    with pytest.warns(RuntimeWarning, match=r"native snapshot reader could not be built "
                                            r"\(ninja: build stopped: subcommand failed.\)"):
        first = snapshot(func, native_reader=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = snapshot(func, native_reader=True)
    assert first == second == snapshot(func, native_reader=False)


def test_a_failing_native_walk_warns_once_and_falls_back(monkeypatch):
    def crash(func, table):
        raise RuntimeError("InternalError: field not found\nstack")

    monkeypatch.setattr(native.WALK, "built", crash)
    monkeypatch.setattr(native.WALK, "failed", False)
    func = _module()["main"]
    with pytest.warns(RuntimeWarning, match=r"native snapshot reader failed \(InternalError: "
                                            r"field not found\); using the pure-Python"):
        first = snapshot(func, native_reader=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = snapshot(func, native_reader=True)
    assert first == second == snapshot(func, native_reader=False)


def test_match_cast_and_symbolic_reads_agree():
    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor(("n",), "float32")):
            n = T.int64()
            with R.dataflow():
                y = R.match_cast(x, R.Tensor((n,), "float32"))
                z = R.reshape(y, R.shape([n, 1]))
                w = z
                R.output(w)
            return w

    snap, python = _both(Module["main"])
    assert snap == python
    assert snap.kind == [ValueKind.OTHER, ValueKind.OP_CALL, ValueKind.VAR]
    assert snap.args_of(0) == [param_code(0)] and snap.args_of(2) == [1]
    assert snap.uses == [1, 1, 1] and snap.param_uses == [1]
    assert snap.shape(1) == (SYMBOLIC, 1)
