"""Cached builds: the same program is not built twice, a different one never shares a build."""

import numpy as np
import tvm
from tvm import relax

from patternkit.verification import numeric
from patternkit.verification.builds import BuildCache, caching

X = np.array([1.0, 1.0], "float32")


def _plus(value: float) -> tvm.IRModule:
    """``x + [1, value]``: modules that differ in one element of one constant."""
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, relax.const(np.array([1.0, value],
                                                                      "float32"))))
        bb.emit_func_output(out)
    return bb.get()


def _result(vm) -> np.ndarray:
    return vm["main"](tvm.runtime.tensor(X)).numpy()


def test_a_module_differing_in_one_constant_is_built_not_handed_the_other_build():
    cache = BuildCache(builder=numeric.build)
    two, three = cache.vm(_plus(2.0)), cache.vm(_plus(3.0))
    assert two is not three and cache.misses == 2 and cache.hits == 0
    np.testing.assert_array_equal(_result(two), [2.0, 3.0])
    np.testing.assert_array_equal(_result(three), [2.0, 4.0])
    again = cache.vm(_plus(2.0))  # a new module object, equal to the first
    assert again is two and cache.hits == 1 and cache.misses == 2


def test_a_module_changed_in_place_after_its_build_is_built_again():
    cache = BuildCache(builder=numeric.build)
    mod = _plus(2.0)
    first = cache.vm(mod)
    mod["main"] = _plus(5.0)["main"]
    changed = cache.vm(mod)
    assert changed is not first
    np.testing.assert_array_equal(_result(changed), [2.0, 6.0])
    assert cache.vm(_plus(2.0)) is first  # the cache kept the module as it was built


def test_the_cache_keeps_only_the_last_builds_and_can_be_turned_off():
    cache = BuildCache(size=1, builder=numeric.build)
    cache.vm(_plus(2.0))
    cache.vm(_plus(3.0))
    cache.vm(_plus(2.0))  # pushed out by the 3.0 build
    assert cache.misses == 3 and cache.hits == 0
    with caching(False):
        cache.vm(_plus(2.0))
    assert cache.misses == 4 and cache.hits == 0
    cache.vm(_plus(2.0))
    assert cache.hits == 1
