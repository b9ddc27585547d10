"""Builds for ``llvm``, kept by what they build: the same program is not built twice.

A build of a 12-layer model costs seconds (Relax's pipeline, LLVM, the VM loading the
weights), and the checks of one process often ask for the same program again: the job's
comparison at a second size, a notebook that runs the job twice, a test suite.  A build
is looked up by the module's structural hash and the target, and a hit is confirmed by
structural equality, which compares constants by value: a module that differs from a
cached one in a single constant is built, never handed the other's build.  The cache
holds its own copy of each module it built (a caller's module changed in place later is
looked up by what it is then) and only the last few builds, each of which holds a
model's weights.

``PATTERNKIT_BUILD_CACHE=0`` in the environment, or :func:`caching` ``(False)`` around a
block, builds every time (the benchmark ``benchmarks/bench_run.py`` measures both).
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from typing import Any, Callable, Iterator

import tvm
import tvm_ffi
from tvm import relax

__all__ = ["BuildCache", "caching", "enabled"]

_ENABLED = [os.environ.get("PATTERNKIT_BUILD_CACHE", "1") != "0"]


def enabled() -> bool:
    """Whether caches look builds up (see the module docstring)."""
    return _ENABLED[-1]


@contextlib.contextmanager
def caching(on: bool) -> Iterator[None]:
    """Turn the lookup of cached builds on or off inside a ``with`` block."""
    _ENABLED.append(on)
    try:
        yield
    finally:
        _ENABLED.pop()


class BuildCache:
    """The last ``size`` builds, looked up by structure (see the module docstring).

    Parameters
    ----------
    builder : callable
        ``(module, target) -> VM``: how a missing build is made
        (:func:`patternkit.verification.numeric.build`, which lifts local functions first).
    size : int
        How many builds to keep; the least recently used goes first.
    """

    def __init__(self, builder: Callable[[tvm.IRModule, str], Any], size: int = 4):
        self.size = size
        self._builder = builder
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[int, str], list[tuple[tvm.IRModule, Any]]] = (
            OrderedDict())

    def vm(self, mod: tvm.IRModule, target: str = "llvm") -> relax.VirtualMachine:
        """The build of ``mod`` for ``target``: a cached one of an equal module, else new.

        Raises whatever ``relax.build`` raises for a module that does not build (nothing
        is cached for it).
        """
        if not enabled():
            self.misses += 1
            return self._builder(mod, target)
        key = (tvm_ffi.structural_hash(mod), target)
        for held, vm in self._entries.get(key, ()):
            if tvm_ffi.structural_equal(held, mod):
                self._entries.move_to_end(key)
                self.hits += 1
                return vm
        vm = self._builder(mod, target)
        self.misses += 1
        # a copy of its own: the caller may change ``mod`` in place afterwards
        held = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs,
                            global_infos=mod.global_infos)
        self._entries.setdefault(key, []).append((held, vm))
        self._entries.move_to_end(key)
        while sum(len(v) for v in self._entries.values()) > self.size:
            oldest = next(iter(self._entries))
            self._entries[oldest].pop(0)
            if not self._entries[oldest]:
                del self._entries[oldest]
        return vm

    def clear(self) -> None:
        """Forget every build."""
        self._entries.clear()
