"""Legalising each distinct call once gives the module TVM's LegalizeOps gives, faster."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from patternkit.verification import numeric
from patternkit.verification.legalize_once import Reuse, legalize_once


def _layers(count: int = 3) -> tvm.IRModule:
    """``count`` identical layers (reshape, matmul with a weight of their own, add, a
    repeated argument), a concatenation of a tuple variable, and a function with a
    symbolic batch.
    """
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((2, 3, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(count):
                flat = bb.emit(relax.op.reshape(h, (6, 4)))
                weight = relax.const(rng.standard_normal((4, 4)).astype("float32"))
                mixed = bb.emit(relax.op.matmul(flat, weight))
                doubled = bb.emit(relax.op.add(mixed, mixed))
                h = bb.emit(relax.op.reshape(doubled, (2, 3, 4)))
            pair = bb.emit(relax.Tuple([h, h]))
            out = bb.emit_output(relax.op.concat(pair, axis=0))
        bb.emit_func_output(out)
    n = tvm.tirx.Var("n", "int64")
    y = relax.Var("y", relax.TensorType((n, 4), "float32"))
    with bb.function("dynamic", [y]):
        with bb.dataflow():
            first = bb.emit(relax.op.exp(y))
            out = bb.emit_output(relax.op.exp(first))
        bb.emit_func_output(out)
    return bb.get()


def test_each_distinct_call_is_legalised_once_into_the_module_tvm_gives():
    mod = _layers()
    before = mod.script()
    counts = Reuse()
    with tvm.target.Target("llvm"):
        once = legalize_once(counts)(mod)
        default = relax.transform.LegalizeOps()(mod)
    assert tvm_ffi.structural_equal(once, default)
    assert once.script() == default.script()  # names too
    # 3 layers: reshape, matmul (constants differ: 3), add, reshape -> 1 + 3 + 1 + 1 made;
    # concat of a tuple variable and the symbolic exps are legalised one by one
    assert (counts.made, counts.reused) == (6 + 1 + 2, 6)
    assert mod.script() == before  # the caller's module is left as it was


def test_a_check_build_legalises_once_and_computes_what_the_default_pipeline_builds(
        monkeypatch):
    tables = []
    real = Reuse.__init__

    def kept(self):
        real(self)
        tables.append(self)

    monkeypatch.setattr(Reuse, "__init__", kept)
    mod = _layers(2)
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype("float32")
    expected = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())["main"](x)
    assert tables == []  # TVM's own pipeline
    got = numeric.build(mod)["main"](x)
    assert len(tables) == 1 and tables[0].reused == 3
    np.testing.assert_array_equal(got.numpy(), expected.numpy())  # same kernels: same bits


def test_the_round_trip_prepares_its_reference_legalising_each_distinct_call_once(
        monkeypatch):
    from patternkit.verification import legalize_once as once_module
    from patternkit.verification.roundtrip import check_roundtrip, default_fusion

    tables: list[Reuse] = []

    class Counted(Reuse):
        def __init__(self) -> None:
            super().__init__()
            tables.append(self)

    monkeypatch.setattr(once_module, "Reuse", Counted)
    mod = _layers()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("scan", [x]):  # left to the build's dispatch passes by legalize_once
        with bb.dataflow():
            out = bb.emit_output(relax.op.cumsum(relax.op.exp(x), axis=1))
        bb.emit_func_output(out)
    scan = bb.get()["scan"]
    mod = tvm.IRModule({**{gv: f for gv, f in mod.functions.items()},
                        relax.GlobalVar("scan"): scan})
    prepare, _ = default_fusion()
    prepared = prepare(mod)
    assert len(tables) == 1 and tables[0].reused == 6  # the three layers' repeats
    plain = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                      relax.transform.AnnotateTIROpPattern()])(mod)
    assert tvm_ffi.structural_equal(prepared, plain)  # cumsum legalised too
    assert check_roundtrip(mod, func_name="main").difference is None
