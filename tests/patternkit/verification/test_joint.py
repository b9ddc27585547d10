"""One build for before, after and the per-site functions: the same numbers as apart."""

import numpy as np
import tvm
from tvm import relax

import patternkit as pk
from patternkit.ir import compat as C
from patternkit.verification import numeric
from patternkit.verification.builds import caching
from patternkit.verification.joint import AFTER_PREFIX, build_joint, joint_module

INPUTS = [np.linspace(-2.0, 2.0, 8, dtype="float32").reshape(2, 4)]


def _module(scale: float, helper: bool = False) -> tvm.IRModule:
    """``relu(x) * scale``; with ``helper``, ``x * 2`` in a private function too."""
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    if helper:
        y = relax.Var("y", relax.TensorType((2, 4), "float32"))
        with bb.function("double", [y], private=True):
            bb.emit_func_output(relax.op.multiply(y, relax.const(2.0, "float32")))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(x))
            out = bb.emit_output(relax.op.multiply(r, relax.const(scale, "float32")))
        bb.emit_func_output(out)
    return bb.get()


def test_the_joint_build_runs_both_sides_and_compares_as_apart():
    before, after = _module(1.0), _module(1.5)
    before_text, after_text = before.script(), after.script()
    joint = build_joint(before, after, "main")
    assert joint is not None and joint.after_func == AFTER_PREFIX + "main"
    tensor = C.to_tensor(INPUTS[0])
    np.testing.assert_allclose(joint.vm["main"](tensor).numpy(), np.maximum(INPUTS[0], 0))
    np.testing.assert_allclose(joint.vm[joint.after_func](tensor).numpy(),
                               1.5 * np.maximum(INPUTS[0], 0))
    assert (before.script(), after.script()) == (before_text, after_text)  # untouched
    numeric.REFERENCE_BUILDS.clear()
    numeric.CANDIDATE_BUILDS.clear()
    together = pk.compare(before, after, inputs=INPUTS, built=joint.comparison())
    apart = pk.compare(before, after, inputs=INPUTS)
    assert together.status == apart.status == numeric.FAIL
    assert (together.max_abs_error, together.max_rel_error) == (apart.max_abs_error,
                                                                 apart.max_rel_error)


def test_no_joint_module_where_the_sides_do_not_share_their_other_functions():
    assert joint_module(_module(1.0), _module(1.5, helper=True), "main") is None
    assert joint_module(_module(1.0, helper=True), _module(1.5, helper=True), "main") is None
    assert joint_module(_module(1.0), _module(1.5), "absent") is None
    clash = {AFTER_PREFIX + "main": _module(2.0)["main"]}
    assert joint_module(_module(1.0), _module(1.5), "main", clash) is None


def test_a_joint_module_that_does_not_build_and_sharing_off_give_none(monkeypatch):
    before, after = _module(1.0), _module(1.5)
    with caching(False):
        assert build_joint(before, after, "main") is None

    def broken(mod, target="llvm"):
        raise RuntimeError("Check failed: not buildable")

    monkeypatch.setattr(numeric, "build", broken)
    assert build_joint(before, after, "main") is None


def test_the_extra_functions_build_beside_the_sides():
    before, after = _module(1.0), _module(1.5)
    extra = {"side": _module(3.0)["main"].with_attr("global_symbol", "side")}
    joint = build_joint(before, after, "main", extra)
    assert joint is not None
    np.testing.assert_allclose(joint.vm["side"](C.to_tensor(INPUTS[0])).numpy(),
                               3.0 * np.maximum(INPUTS[0], 0))
