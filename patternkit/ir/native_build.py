"""C++ helpers compiled at first use, and turned off for the run if they cannot be.

patternkit's native pieces (the function snapshot's walk, the composite outliner) are
small C++ sources compiled with ``tvm_ffi.cpp.load_inline`` (g++ and ninja; tvm-ffi's
own headers, no TVM ones) and cached by tvm-ffi (``TVM_FFI_CACHE_DIR``).  Each is
optional: ``PATTERNKIT_NATIVE=0`` turns them all off, and a failed build, or a failure of
the compiled function itself, warns once and leaves the pure-Python path in charge for the
rest of the run.  Both paths give the same results; the native one is only faster.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import tvm
import tvm_ffi
from tvm import relax

from ..errors import env_switch, first_line
from .walk import KIND_OF, expr_kind

#: Environment variable that turns the native paths off (``0``, ``false``, ``no``, ``off``).
NATIVE_VARIABLE = "PATTERNKIT_NATIVE"


_table: tuple[int, Any] = (-1, None)
_seeded = False


def enabled() -> bool:
    """Are native paths allowed (:data:`NATIVE_VARIABLE` not set to false)?"""
    return env_switch(NATIVE_VARIABLE, default=True)


class NativeFunction:
    """One function of a C++ source, built on first use; ``None`` once it has failed.

    ``what`` names it in the one warning a failure gives (``"native snapshot reader"``).
    With ``background``, the first :meth:`get` starts the build in a thread and returns
    ``None`` until it is done, so a run never waits for a compiler (seconds, once per
    machine) to save milliseconds: the Python path serves meanwhile, with the same
    results.  A process that exits before the build is done abandons it, and the next
    run starts it again (tvm-ffi locks its cache folder while a build runs, so two
    processes never build into one folder at once).
    """

    def __init__(self, module: str, source: Path, function: str, what: str, *,
                 background: bool = False):
        self.module, self.source, self.function, self.what = module, source, function, what
        self.background = background
        self.built: Callable[..., Any] | None = None
        self.failed = False
        self._builder: threading.Thread | None = None

    def get(self, wait: bool = False) -> Callable[..., Any] | None:
        """The compiled function, built on first call; ``None`` if it cannot be built, or
        (with ``background``, unless ``wait``) while it is being built.
        """
        if self.built is None and not self.failed:
            if self._builder is None and (wait or not self.background):
                self._build()
            elif self._builder is None:
                self._builder = threading.Thread(target=self._build, daemon=True,
                                                 name=f"patternkit build {self.module}")
                self._builder.start()
            elif wait:
                self._builder.join()
        return self.built

    def _build(self) -> None:
        try:
            from tvm_ffi.cpp import load_inline

            module = load_inline(self.module, cpp_sources=self.source.read_text(),
                                 functions=[self.function])
            self.built = getattr(module, self.function)
        except Exception as exc:  # noqa: BLE001 - any build failure means: use Python
            self.fail("could not be built", exc)

    def fail(self, what_happened: str, exc: BaseException) -> None:
        """Turn this function off for the run, saying once why (one line)."""
        self.built, self.failed = None, True
        warnings.warn(f"patternkit: the {self.what} {what_happened} "
                      f"({first_line(exc, limit=200)}); using the pure-Python path",
                      RuntimeWarning, stacklevel=4)


def _seed_kinds() -> None:
    """Classify the expression types of normalised Relax, so the walk knows them."""
    samples = [relax.Var("x", relax.TensorType((1,), "float32")),
               relax.DataflowVar("x", relax.TensorType((1,), "float32")),
               relax.Tuple([relax.const(1.0)]), tvm.ir.Op.get("relax.add"), tvm.ir.GlobalVar("f"),
               relax.const(1.0), relax.ShapeExpr([1]), relax.ExternFunc("f"),
               tvm.tirx.IntImm("int64", 1), tvm.tirx.FloatImm("float32", 1.0)]
    samples.append(relax.Call(samples[3], [samples[0], samples[0]]))
    samples.append(relax.TupleGetItem(samples[2], 0))
    for sample in samples:
        expr_kind(sample)


def kind_table() -> Any:
    """``(type index, kind)`` pairs of the types :data:`~patternkit.ir.walk.KIND_OF` has
    classified, as a ``tvm_ffi.Shape``: how native code tells a node's kind.  Rebuilt
    when the classification grows; a type not in it makes native code give up.
    """
    global _table, _seeded
    if not _seeded:
        _seed_kinds()
        _seeded = True
    if _table[0] != len(KIND_OF):
        pairs: list[int] = []
        for cls, kind in list(KIND_OF.items()):
            info = getattr(cls, "__tvm_ffi_type_info__", None)
            if info is not None:
                pairs += [info.type_index, int(kind)]
        _table = (len(KIND_OF), tvm_ffi.Shape(pairs))
    return _table[1]
