"""The function index read from a snapshot holds what the field-by-field index holds.

``FunctionIndex.build_from_snapshot`` fills its tables from one snapshot of the function
(native, or the pure-Python reader with ``PATTERNKIT_NATIVE=0``) and reads binding
objects only when asked for; ``build_by_fields`` reads every binding over the FFI.  Every
table the engine reads must come out the same, on hand-written functions, zoo models and
random programs.
"""

from __future__ import annotations

import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

from patternkit.engine.index import SNAPSHOT_INDEX_VARIABLE, FunctionIndex
from patternkit.engine.lazy_bindings import LazyBindings
from patternkit.ir import compat as C
from patternkit.ir.snapshot import native
from patternkit.testing.op_programs import op_programs

TENSOR = relax.TensorType((2,), "float32")


@I.ir_module
class Mixed:
    """Tuples, a tuple literal argument, a match_cast, two outputs, an impure block."""

    @R.function(pure=False)
    def main(x: R.Tensor((2, "n"), "float32"), y: R.Tensor((2, "n"), "float32")):
        n = T.int64()
        with R.dataflow():
            a = R.exp(x)
            b = R.add(a, a)
            t = (b, y)
            c = t[0]
            d = R.concat((a, c), axis=1)
            dead = R.negative(d)
            m = R.match_cast(c, R.Tensor((2, n), "float32"))
            o = R.nn.relu(m)
            R.output(a, o, d)
        p = R.print(o, format="{}")
        q = R.sigmoid(o)
        return (q, a, d)


def assert_same_index(fast: FunctionIndex, slow: FunctionIndex) -> None:
    """Every table of the two indexes of one function agrees."""
    assert fast.position == slow.position
    assert fast.params == slow.params
    assert dict(fast.readers) == slow.readers
    assert fast.reads == slow.reads
    assert fast.escaping == slow.escaping
    assert list(fast.by_key.items()) == list(slow.by_key.items())
    assert fast.keys == slow.keys
    assert fast.dataflow == slow.dataflow
    assert (fast.undefined, fast.not_normal) == (slow.undefined, slow.not_normal)
    assert [list(table) for table in fast.values] == [list(table) for table in slow.values]
    for table, expected in zip(fast.values, slow.values):
        assert all(table.get(key).same_as(value) for key, value in expected.items())
    assert [len(block) for block in fast.blocks] == [len(block) for block in slow.blocks]
    assert all(a.same_as(b) for fb, sb in zip(fast.blocks, slow.blocks) for a, b in zip(fb, sb))
    assert fast.dead_code == slow.dead_code
    for key in slow.readers:
        assert fast.live_readers(key) == slow.live_readers(key)


@pytest.fixture(params=["native", "python"])
def reader(request, monkeypatch):
    """Each snapshot reader in turn (the native one must really build here)."""
    if request.param == "native":
        assert native.walker() is not None, "the native reader did not build on this machine"
        monkeypatch.delenv(native.NATIVE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(native.NATIVE_VARIABLE, "0")
    return request.param


def test_a_mixed_function_is_indexed_alike(reader):
    func = Mixed["main"]
    assert_same_index(FunctionIndex.build_from_snapshot(func), FunctionIndex.build_by_fields(func))


def test_operator_calls_are_indexed_without_reading_their_bindings(reader):
    @I.ir_module
    class Chain:
        @R.function
        def main(x: R.Tensor((4,), "float32")):
            with R.dataflow():
                a = R.exp(x)
                b = R.add(a, R.const(1.0, "float32"))
                c = R.multiply(b, a)
                R.output(c)
            return c

    index = FunctionIndex.build_from_snapshot(Chain["main"])
    (block,) = index.blocks
    assert isinstance(block, LazyBindings) and block.loaded == 0
    assert index.by_key == {"relax.exp": [(0, 0)], "relax.add": [(0, 1)],
                            "relax.multiply": [(0, 2)]}
    b = index.values[0].get(index.keys[0][1][0])  # the matcher looks through b: read now
    assert b is not None and b.op.name == "relax.add" and block.loaded == 1


def test_a_malformed_function_is_indexed_field_by_field(reader):
    x, y = relax.Var("x", TENSOR), relax.Var("y", TENSOR)
    ghost = relax.Var("ghost", TENSOR)
    exp = tvm.ir.Op.get("relax.exp")
    nested = relax.Function([x], relax.SeqExpr([relax.BindingBlock([relax.VarBinding(
        y, relax.Call(exp, [relax.Call(exp, [x])]))])], y), TENSOR)
    undefined = relax.Function([x], relax.SeqExpr([relax.BindingBlock([relax.VarBinding(
        y, relax.op.add(x, ghost))])], y), TENSOR)
    index = FunctionIndex.build_from_snapshot(nested)
    assert index.not_normal == ((0, 0), "nests a call in its value")
    assert not isinstance(index.blocks[0], LazyBindings)
    assert FunctionIndex.build_from_snapshot(undefined).undefined == ((0, 0), C.handle(ghost))
    assert_same_index(index, FunctionIndex.build_by_fields(nested))


@pytest.mark.parametrize("spec", ["zoo:gpt2?layers=1", "zoo:onnx:conv_bn"])
def test_zoo_models_are_indexed_alike(spec, reader):
    from patternkit.models.zoo import zoo_model

    model = zoo_model(spec)
    func = model.mod[model.entry]
    assert_same_index(FunctionIndex.build_from_snapshot(func), FunctionIndex.build_by_fields(func))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op_programs(min_ops=2, max_ops=8))
def test_random_programs_are_indexed_alike(mod):
    func = mod["main"]
    assert_same_index(FunctionIndex.build_from_snapshot(func), FunctionIndex.build_by_fields(func))


def test_a_failing_native_walk_never_fails_a_rewrite(monkeypatch):
    import warnings

    import patternkit as pk
    from patternkit.patterns import LIBRARY

    def crash(func, table):
        raise RuntimeError("InternalError: field not found\nstack")

    monkeypatch.setattr(native.WALK, "built", crash)
    monkeypatch.setattr(native.WALK, "failed", False)
    monkeypatch.delenv(native.NATIVE_VARIABLE, raising=False)
    monkeypatch.setenv(SNAPSHOT_INDEX_VARIABLE, "1")
    relu6 = LIBRARY.find("relu6.collapse")

    example = relu6.example()  # two clips, collapsed into one
    with pytest.warns(RuntimeWarning, match=r"native snapshot reader failed \(InternalError"):
        first = pk.rewrite(relu6, example)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = pk.rewrite(relu6, example)
    assert C.structural_equal(first, second)
    assert len(first["main"].body.blocks[0].bindings) == 1


def test_the_field_by_field_index_stays_the_default(monkeypatch):
    monkeypatch.delenv(SNAPSHOT_INDEX_VARIABLE, raising=False)
    assert FunctionIndex.build(Mixed["main"]).snapshot is None
    monkeypatch.setenv(SNAPSHOT_INDEX_VARIABLE, "1")
    assert FunctionIndex.build(Mixed["main"]).snapshot is not None
