"""A check build linked into a shared library by the system's C compiler, then loaded.

Most of a small check build's time is not TVM's pipeline but LLVM making machine code
when the VM is created: an ``llvm`` executable is JIT-compiled on load, and TVM's JIT
always compiles at LLVM's most aggressive level, whatever the target's ``opt-level``
says (0.46 s for the 18 kernels of one attention test, 2.3 s for a 12-layer GPT-2).
Written to an object file instead, the code is compiled at the target's own level: at
``opt-level`` 0 LLVM's fast instruction selector makes it in a fraction of that time,
and the system's compiler links it in tens of milliseconds.  Measured on the zoo's
12-layer GPT-2: 4.4 s to a running VM through the JIT at level 1, 1.8 s linked at level
0; its ResNet-50 6.2 s and 2.4 s; the outputs bit for bit the same.  The code runs
slower: 0.06 s instead of 0.015 s for that GPT-2's forward pass, which the few runs of a
check do not notice, but 1.25 s instead of 0.83 s for two GPT-2 layers of real width
(768), where four runs spend what linking saved.  So only a module whose run is small
is linked (:func:`pays_for`: at most :data:`LINK_WORK_LIMIT` multiply-adds, roughly
counted from its types); a larger one is JIT-compiled at the checks' usual level.

:func:`load_linked` returns ``None`` where there is no C compiler (TVM looks for one as
``tvm.support.cc`` does: ``$CXX``, ``$CC``, then ``g++``, ``gcc``, ``clang++`` ... on the
path), when ``PATTERNKIT_LINK_CHECKS=0`` is set, or after a link has failed once (with
one warning): the caller then builds through the JIT, which needs nothing but TVM.  The
library is written to a temporary folder that is removed as soon as it is loaded (the
loaded code stays mapped), so nothing is left on disk.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from typing import Any

import tvm
from tvm import relax

from ..errors import env_switch, first_line
from ..ir import compat as C

__all__ = ["LINK_VARIABLE", "LINKED_OPT_LEVEL", "LINK_WORK_LIMIT", "available",
           "estimated_work", "load_linked", "pays_for"]

#: Environment variable that turns linking off (``0``, ``false``, ``no``, ``off``): every
#: check build is JIT-compiled on load, as TVM does by default.
LINK_VARIABLE = "PATTERNKIT_LINK_CHECKS"

#: LLVM's optimisation level for a linked check build (see the module docstring).
LINKED_OPT_LEVEL = 0

#: The most multiply-adds (:func:`estimated_work`) of a module whose check build is
#: linked at level 0: about where its slower code starts to cost, over a check's runs,
#: what linking saves (the zoo's 12-layer GPT-2, width 64, counts 10.6 million; two
#: layers of width 768 count 229 million).
LINK_WORK_LIMIT = 1 << 25

#: What an unknown (symbolic) dimension counts as in :func:`estimated_work`.
UNKNOWN_DIM = 8

_state: dict[str, Any] = {"compiler": None, "looked": False, "failed": False}


def available() -> bool:
    """Can check builds be linked here: a C compiler found, linking not turned off and
    not failed in this process?
    """
    if not env_switch(LINK_VARIABLE, default=True):
        return False
    if _state["failed"]:
        return False
    if not _state["looked"]:
        from tvm.support import cc

        _state["compiler"], _state["looked"] = cc.get_cc(), True
    return _state["compiler"] is not None


def load_linked(executable: Any) -> tvm.runtime.Module | None:
    """``executable`` (a ``relax.build`` result for ``llvm``) linked and loaded, or
    ``None`` when it cannot be (see the module docstring): the caller uses it as it is.
    """
    if not available():
        return None
    folder = None
    try:
        folder = tempfile.mkdtemp(prefix="patternkit-check-")  # no writable temp: the JIT
        path = os.path.join(folder, "check.so")
        executable.export_library(path, workspace_dir=folder)
        return tvm.runtime.load_module(path)
    except Exception as err:  # noqa: BLE001 - a failed link must not fail the check
        _state["failed"] = True
        warnings.warn(f"patternkit: linking a check build failed "
                      f"({first_line(err, limit=200)}); building through TVM's JIT for the "
                      f"rest of the run", stacklevel=2)
        return None
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def pays_for(mod: tvm.IRModule) -> bool:
    """Is ``mod``'s run small enough for its check build to be linked at level 0?"""
    return estimated_work(mod, stop_above=LINK_WORK_LIMIT) <= LINK_WORK_LIMIT


def estimated_work(mod: tvm.IRModule, stop_above: int | None = None) -> int:
    """Roughly the multiply-adds of one run of ``mod``'s largest Relax function.

    The largest, not the sum: a check runs each function of its module on its own (the
    job's one build holds before, after and every site), and what the slower code costs
    is each run's.  Every operator call counts its result's elements, times the length
    of the reduction for a ``matmul`` (its first operand's last dimension) or a
    convolution (the weight's elements per output channel); an unknown dimension counts
    :data:`UNKNOWN_DIM`.  A guide for choosing how to build, not a measure.

    ``stop_above``: stop counting once a function's count passes it (the answer is then
    only known to be larger), so a large model is not walked to the end to learn that.
    """
    largest = 0
    for _, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        work = 0
        for block in C.array_items(func.body.blocks):
            for binding in C.array_items(block.bindings):
                value = binding.value
                if isinstance(value, relax.Call):
                    work += _elements(C.type_of(binding.var)) * _reduction(value)
                    if stop_above is not None and work > stop_above:
                        return work
        largest = max(largest, work)
    return largest


def _elements(ty: Any) -> int:
    shape = C.static_shape(ty) if isinstance(ty, relax.TensorType) else None
    count = 1
    for dim in shape or ():
        count *= _dim(dim)
    return count


def _reduction(call: relax.Call) -> int:
    name = C.op_name(call) or ""
    args = C.call_args(call)
    if name == "relax.matmul" and args:
        shape = C.static_shape(C.type_of(args[0]))
        return _dim(shape[-1]) if shape else UNKNOWN_DIM
    if name.startswith("relax.nn.conv") and len(args) > 1:
        shape = C.static_shape(C.type_of(args[1]))
        if not shape:
            return UNKNOWN_DIM
        per_channel = 1
        for dim in shape[1:]:
            per_channel *= _dim(dim)
        return per_channel
    return 1


def _dim(dim: Any) -> int:
    return dim if isinstance(dim, int) else UNKNOWN_DIM
