"""Check builds linked into a shared library: the same numbers, nothing left on disk, and
the JIT when there is no compiler or the link fails."""

from __future__ import annotations

import tempfile
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax, runtime
from tvm.script import ir as I, relax as R

from patternkit.verification import linked, numeric
from patternkit.verification.numeric import random_inputs


@I.ir_module
class Block:
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            h = R.nn.softmax(R.matmul(x, w), axis=-1)
            out = R.add(R.nn.gelu_tanh(h), R.sum(R.exp(h), axis=-1, keepdims=True))
            R.output(out)
        return out


def _outputs(vm) -> np.ndarray:
    inputs = [runtime.tensor(a) for a in random_inputs(Block["main"], seed=1)]
    return vm["main"](*inputs).numpy()


def _tvm_default() -> np.ndarray:
    return _outputs(relax.VirtualMachine(relax.build(Block, target="llvm"), runtime.cpu()))


@pytest.fixture
def fresh_state(monkeypatch):
    """The process's linking state as it is before its first build."""
    monkeypatch.delenv(linked.LINK_VARIABLE, raising=False)
    monkeypatch.setattr(linked, "_state", {"compiler": None, "looked": False,
                                           "failed": False})


def test_a_linked_build_runs_the_same_bits_and_leaves_no_file(fresh_state, monkeypatch,
                                                                 tmp_path):
    if not linked.available():
        pytest.skip("no C compiler on this machine")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    loads = []
    real_load = runtime.load_module
    monkeypatch.setattr(runtime, "load_module", lambda path: loads.append(path)
                        or real_load(path))
    vm = numeric.build(Block)
    assert len(loads) == 1 and loads[0].endswith(".so")  # linked, not JIT-compiled
    np.testing.assert_array_equal(_outputs(vm), _tvm_default())
    assert list(tmp_path.iterdir()) == []  # the library's folder removed once loaded


def test_a_failed_link_warns_once_and_the_checks_go_through_the_jit(fresh_state,
                                                                     monkeypatch):
    monkeypatch.setenv("CXX", "false")  # a "compiler" that fails every link
    with pytest.warns(UserWarning, match="linking a check build failed .*TVM's JIT"):
        vm = numeric.build(Block)
    np.testing.assert_array_equal(_outputs(vm), _tvm_default())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second attempt
        assert not linked.available()
        np.testing.assert_array_equal(_outputs(numeric.build(Block)), _tvm_default())


def test_without_a_writable_temporary_folder_the_check_still_builds(fresh_state,
                                                                     monkeypatch, tmp_path):
    if not linked.available():
        pytest.skip("no C compiler on this machine")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))  # mkdtemp fails
    with pytest.warns(UserWarning, match="linking a check build failed"):
        vm = numeric.build(Block)
    np.testing.assert_array_equal(_outputs(vm), _tvm_default())


@pytest.mark.parametrize("why", ["no compiler", "turned off"])
def test_without_a_compiler_or_turned_off_the_checks_use_the_jit_at_their_level(
        fresh_state, monkeypatch, why):
    from tvm.support import cc

    if why == "no compiler":
        monkeypatch.setattr(cc, "get_cc", lambda: None)
    else:
        monkeypatch.setenv(linked.LINK_VARIABLE, "0")
    targets = []
    real = relax.build
    monkeypatch.setattr(relax, "build", lambda mod, target, **kw: targets.append(target)
                        or real(mod, target=target, **kw))
    monkeypatch.setattr(runtime, "load_module", lambda path: pytest.fail("linked"))
    vm = numeric.build(Block)
    assert [dict(t.attrs).get("opt-level") for t in targets] == [numeric.CHECK_OPT_LEVEL]
    np.testing.assert_array_equal(_outputs(vm), _tvm_default())


def _matmul_chain(width: int, layers: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, width), "float32"))
    w = relax.Var("w", relax.TensorType((width, width), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            h = x
            for _ in range(layers):
                h = bb.emit(relax.op.tanh(relax.op.matmul(h, w)))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def test_the_work_estimate_counts_each_matmuls_reduction_in_the_largest_function():
    # 8 x 64 results, each a reduction of 64, then a tanh of each: twice
    two_layers = _matmul_chain(64, 2)
    assert linked.estimated_work(two_layers) == 2 * (8 * 64 * 64 + 8 * 64)
    # a check runs each function on its own: a smaller one beside it adds nothing
    beside = tvm.IRModule({"main": two_layers["main"],
                           "smaller": _matmul_chain(64, 1)["main"].with_attr("global_symbol",
                                                                             "smaller")})
    assert linked.estimated_work(beside) == linked.estimated_work(two_layers)
    # asked only whether it passes a bound, the count may stop early, but never below it
    bound = 8 * 64 * 64
    assert bound < linked.estimated_work(two_layers, stop_above=bound) <= 2 * (
        8 * 64 * 64 + 8 * 64)


def test_a_module_whose_run_is_large_is_built_through_the_jit(fresh_state, monkeypatch):
    # a wide model's slower unoptimised code would cost its checks more than linking saves
    small, large = _matmul_chain(64, 2), _matmul_chain(1024, 40)
    assert linked.pays_for(small) and not linked.pays_for(large)
    monkeypatch.setattr(linked, "LINK_WORK_LIMIT", linked.estimated_work(small) - 1)
    monkeypatch.setattr(runtime, "load_module", lambda path: pytest.fail("linked"))
    vm = numeric.build(small)  # now over the limit: not linked
    inputs = [runtime.tensor(a) for a in random_inputs(small["main"], seed=0)]
    assert np.isfinite(vm["main"](*inputs).numpy()).all()
