"""The native reader behind :func:`~patternkit.ir.snapshot.snapshot`: one C++ call.

``walker.cc`` is compiled at first use with ``tvm_ffi.cpp.load_inline`` (g++ and ninja;
tvm-ffi's own headers, no TVM ones) and cached by tvm-ffi (``TVM_FFI_CACHE_DIR``).  It
is optional: ``PATTERNKIT_NATIVE=0`` turns it off, and a failed build (or a failure of
the walk itself) warns once and leaves the pure-Python reader in charge for the rest of
the run.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable

import tvm
from tvm import relax

from ..walk import KIND_OF, expr_kind
from .reading import RawRead

#: Environment variable that turns the native reader off (``0``, ``false``, ``no``, ``off``).
NATIVE_VARIABLE = "PATTERNKIT_NATIVE"

_SOURCE = Path(__file__).with_name("walker.cc")
_FIELDS = ("var", "block", "dataflow", "kind", "op", "item", "arg_start", "args", "uses",
           "param_uses", "dtype", "rank", "dims_start", "dims")

_walker: Callable[..., Any] | None = None
_failed = False
_table: tuple[int, Any] = (-1, None)
_seeded = False


def enabled() -> bool:
    """Is the native reader allowed (:data:`NATIVE_VARIABLE` not set to false)?"""
    return os.environ.get(NATIVE_VARIABLE, "").strip().lower() not in ("0", "false", "no",
                                                                          "off")


def walker() -> Callable[..., Any] | None:
    """The compiled walk, built on first call; ``None`` if it cannot be built."""
    global _walker, _failed
    if _walker is None and not _failed:
        try:
            from tvm_ffi.cpp import load_inline

            source = _SOURCE.read_text()
            module = load_inline("patternkit_snapshot", cpp_sources=source,
                                 functions=["snapshot_walk"])
            _walker = module.snapshot_walk
        except Exception as exc:  # noqa: BLE001 - any build failure means: use Python
            _failed = True
            _warn("could not be built", exc)
    return _walker


def _warn(what: str, exc: BaseException) -> None:
    """Say once that the native reader is off for this run, and why (one line)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    warnings.warn(f"patternkit: the native snapshot reader {what} ({first[:200]}); using "
                  f"the pure-Python reader", RuntimeWarning, stacklevel=4)


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


def _kind_table() -> Any:
    """``(type index, kind)`` pairs of the types :data:`KIND_OF` has classified."""
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
        import tvm_ffi

        _table = (len(KIND_OF), tvm_ffi.Shape(pairs))
    return _table[1]


def read(func: relax.Function) -> RawRead | None | bool:
    """The raw record of ``func``; ``None`` if its body is not a ``SeqExpr``; ``False``
    if the native walk is not available or met a type it does not know.
    """
    global _walker, _failed
    walk = walker()
    if walk is None:
        return False
    try:
        out = walk(func, _kind_table())
    except Exception as exc:  # noqa: BLE001 - a native failure must not end the run
        _walker, _failed = None, True
        _warn("failed", exc)
        return False
    if int(out[0]) == 0:
        if type(func.body) is not relax.SeqExpr:
            return None
        return False
    fields: dict[str, Any] = {name: list(out[i + 1]) for i, name in enumerate(_FIELDS)}
    fields["dataflow"] = [bool(d) for d in fields["dataflow"]]
    fields["dataflow_var"] = [bool(d) for d in out[22]]
    fields["result"] = int(out[19])
    free_at, free_vars = list(out[17]), list(out[18])
    return RawRead(fields=fields, ops=list(out[15]), dtypes=list(out[16]),
                   free=list(zip(free_at, free_vars)), not_normal=int(out[20]),
                   result_not_normal=bool(int(out[21])))
