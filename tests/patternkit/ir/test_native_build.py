"""Native helpers never make a run wait or fail: built in the background when asked,
turned off with one warning when they cannot be built."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import pytest

from patternkit.ir import native_build
from patternkit.ir.native_build import NativeFunction


class _Module:
    def compiled(self):
        return "native"


def test_a_background_build_serves_nothing_until_it_is_done(monkeypatch):
    import tvm_ffi.cpp

    release = threading.Event()
    builds = []

    def slow_load_inline(name, cpp_sources, functions):
        builds.append(name)
        release.wait(timeout=30)
        return _Module()

    monkeypatch.setattr(tvm_ffi.cpp, "load_inline", slow_load_inline)
    function = NativeFunction("m", Path(__file__), "compiled", "test helper", background=True)
    assert function.get() is None  # the build started; the caller goes on in Python
    assert function.get() is None
    release.set()
    built = function.get(wait=True)
    assert built is not None and built() == "native"
    assert function.get() is built
    assert builds == ["m"]  # one build, however many callers asked


def test_a_failed_background_build_warns_once_and_stays_off(monkeypatch):
    import tvm_ffi.cpp

    def broken(*args, **kwargs):
        raise RuntimeError("g++: command not found\nmore")

    monkeypatch.setattr(tvm_ffi.cpp, "load_inline", broken)
    function = NativeFunction("m", Path(__file__), "compiled", "test helper", background=True)
    with pytest.warns(RuntimeWarning, match=r"the test helper could not be built \(g\+\+: "
                                            r"command not found"):
        assert function.get(wait=True) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert function.get() is None and function.get(wait=True) is None


@pytest.mark.parametrize("value, on", [("", True), ("1", True), ("0", False), ("off", False),
                                       ("False", False), ("no", False)])
def test_PATTERNKIT_NATIVE_turns_native_code_off(monkeypatch, value, on):
    monkeypatch.setenv(native_build.NATIVE_VARIABLE, value)
    assert native_build.enabled() is on
