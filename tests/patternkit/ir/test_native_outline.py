"""The native outliner builds the same composites and partitions as the Python one.

``patternkit.ir.outline`` copies a match into a local function in one C++ call; the
Python outliner (``PATTERNKIT_NATIVE=0``, a failed build, or a match the native one does
not take) builds it through one FFI constructor per node.  A difference in a name, a
type or an attribute would change what an external compiler receives, so the two are
held to structural equality (and to the same printed module) on zoo models, and the
fallbacks are tested.
"""

from __future__ import annotations

import warnings

import pytest
import tvm_ffi
from tvm import relax

import patternkit as pk
import patternkit.engine.outline as engine_outline
from patternkit.byoc.merge import merge_composite
from patternkit.dpl import is_op, wildcard
from patternkit.engine.index import forget_indexes
from patternkit.ir import outline as native
from patternkit.ir.native_build import NATIVE_VARIABLE
from patternkit.models import zoo_model
from patternkit.patterns import LIBRARY

ZOO = ["gpt2?layers=1", "gpt2?layers=1&batch=dynamic", "gpt2?layers=1&dtype=float16",
       "resnet18?width=8&image=16", "onnx:gpt2?layers=1&opset=14"]


def _composites(mod):
    forget_indexes()  # each path outlines from an index of its own
    return merge_composite(mod, LIBRARY.composites().for_compiler("ccompiler"))


def _both_paths(monkeypatch, transform):
    """``transform()`` with the native outliner (asserting it outlined) and without."""
    taken = []

    def counted(*args):
        built = native.outline(*args)
        taken.append(built is not None)
        return built

    monkeypatch.setattr(engine_outline, "native_outline", counted)
    monkeypatch.delenv(NATIVE_VARIABLE, raising=False)
    assert native.OUTLINE.get(wait=True) is not None, "the native outliner did not build here"
    with_native = transform()
    natively = sum(taken)
    monkeypatch.setenv(NATIVE_VARIABLE, "0")
    in_python = transform()
    return with_native, in_python, natively


@pytest.mark.parametrize("spec", ZOO)
def test_composites_are_the_same_built_natively_or_in_python(spec, monkeypatch):
    mod = pk.rewrite(LIBRARY.rewrite_rules(), zoo_model(spec).mod)
    with_native, in_python, natively = _both_paths(monkeypatch, lambda: _composites(mod))
    assert natively > 0
    assert tvm_ffi.structural_equal(with_native, in_python)
    assert with_native.script() == in_python.script()


def test_partitions_are_the_same_built_natively_or_in_python(monkeypatch):
    mod = zoo_model("gpt2?layers=1").mod
    pattern = is_op("relax.matmul")(wildcard(), wildcard())
    with_native, in_python, natively = _both_paths(monkeypatch,
                                                   lambda: pk.partition(pattern, mod["main"]))
    assert natively > 0
    assert tvm_ffi.structural_equal(with_native, in_python)
    assert with_native.script() == in_python.script()


def _concat_relu() -> tvm_ffi.Object:
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    y = relax.Var("y", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.concat([x, y], axis=0)))
        bb.emit_func_output(out)
    return bb.get()


def test_a_match_reading_an_inline_tuple_is_left_to_python(monkeypatch):
    # ``R.concat((x, y))``: the tuple is rebuilt around the parameters, which only the
    # Python outliner does
    mod = _concat_relu()
    table = [("cc.concat_relu", is_op("relax.nn.relu")(is_op("relax.concat")(wildcard())))]
    with_native, in_python, natively = _both_paths(monkeypatch,
                                                   lambda: merge_composite(mod, table))
    assert natively == 0
    assert tvm_ffi.structural_equal(with_native, in_python)


def test_a_failing_native_outliner_warns_once_and_falls_back(monkeypatch):
    def crash(*args):
        raise RuntimeError("InternalError: field not found\nstack")

    mod = pk.rewrite(LIBRARY.rewrite_rules(), zoo_model("gpt2?layers=1").mod)
    monkeypatch.setenv(NATIVE_VARIABLE, "0")
    expected = _composites(mod)
    monkeypatch.delenv(NATIVE_VARIABLE)
    monkeypatch.setattr(native.OUTLINE, "built", crash)
    monkeypatch.setattr(native.OUTLINE, "failed", False)
    with pytest.warns(RuntimeWarning, match=r"native composite outliner failed \(InternalError: "
                                            r"field not found\); using the pure-Python path"):
        first = _composites(mod)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = _composites(mod)
    assert tvm_ffi.structural_equal(first, expected)
    assert tvm_ffi.structural_equal(second, expected)


def test_PATTERNKIT_NATIVE_0_never_calls_the_native_outliner(monkeypatch):
    def refuse(wait=False):
        raise AssertionError("the native outliner was asked for")

    monkeypatch.setattr(native.OUTLINE, "get", refuse)
    monkeypatch.setenv(NATIVE_VARIABLE, "0")
    mod = pk.rewrite(LIBRARY.rewrite_rules(), zoo_model("gpt2?layers=1").mod)
    assert "Composite" in _composites(mod).script()


def test_threads_outlining_at_once_get_what_one_thread_gets(monkeypatch):
    # tvm-ffi lets go of the GIL during a native call: the outliner's caches are shared
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.delenv(NATIVE_VARIABLE, raising=False)
    assert native.OUTLINE.get(wait=True) is not None
    models = [pk.rewrite(LIBRARY.rewrite_rules(), zoo_model(spec).mod)
              for spec in ("gpt2?layers=1", "resnet18?width=8&image=16")]
    table = LIBRARY.composites().for_compiler("ccompiler")
    alone = [merge_composite(mod, table) for mod in models]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda i: merge_composite(models[i % 2], table), range(8)))
    for i, merged in enumerate(together):
        assert tvm_ffi.structural_equal(merged, alone[i % 2])
