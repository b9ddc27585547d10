"""Private and unstable TVM API, and the accessors whose spelling changed in 0.27.

patternkit pins apache-tvm exactly, so it reads the stable Relax API (``Var.ty``,
``Call.args``, ``relax.TensorType``) directly wherever it needs it.  What lives here is
what a TVM release is likely to break: private FFI entry points (``tvm_ffi._ffi_api``
array access, ``__chandle__``), BlockBuilder internals (scratch blocks), renamed
accessors (``Var.name`` / ``GlobalVar.name_hint``, ``GenericConst.value``,
``tvm_ffi.structural_equal``, ``tvm.sym`` which was ``tvm.arith``), and the caches that
make hot paths avoid ``isinstance`` on TVM's ABC classes.  No other module of patternkit
touches private TVM API; a test enforces it.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Iterator

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

Var = relax.Var
Call = relax.Call
Function = relax.Function
Op = tvm.ir.Op
GlobalVar = tvm.ir.GlobalVar
Constant = tvm.ir.Constant
GenericConst = tvm.ir.GenericConst
TensorType = relax.TensorType
TupleType = relax.TupleType
from tvm.sym import Analyzer  # noqa: E402,F401  (re-exported; tvm.arith before 0.27)


_array_get = tvm_ffi._ffi_api.ArrayGetItem
_array_size = tvm_ffi._ffi_api.ArraySize


def array_items(array: Any) -> list:
    """A TVM FFI ``Array`` as a Python list.

    ``tuple(array)`` goes through three Python frames and two FFI calls per element; the
    rewrite engine reads every call's arguments, so it uses this direct path instead.
    """
    get = _array_get
    return [get(array, i) for i in range(_array_size(array))]


def handle(obj: Any) -> int:
    """A stable integer key for a TVM object.

    Reading ``call.args[0]`` twice gives two Python wrappers of one node.  They hash
    alike, but a dict lookup then falls back to ``Expr.__eq__``, which costs ~2 µs; the
    engine's per-binding tables are keyed by this handle instead.
    """
    return obj.__chandle__()


def var_name(var: Any) -> str:
    """The user-visible name of a Relax ``Var`` or ``GlobalVar``."""
    if isinstance(var, GlobalVar):
        return var.name_hint
    return var.name


_RELAX_TYPES = (relax.TensorType, relax.TupleType, relax.ShapeType, relax.FuncType,
                relax.ObjectType, tvm.ir.PrimType)


def type_of(expr: Any):
    """The Relax type of an expression, or ``None`` if it cannot be known.

    Normalised IR carries its types.  A bare expression built with ``relax.op.*`` may
    not (its ``ty`` is the untyped ``ir.Type``); it is then normalised in a scratch
    block to infer one.  The caller's expression is not modified.
    """
    ty = getattr(expr, "ty", None)
    if isinstance(ty, _RELAX_TYPES):
        return ty
    if not isinstance(expr, tvm.ir.Expr) or isinstance(expr, tvm.ir.Op):
        return None
    bb = relax.BlockBuilder()
    with scratch_block(bb, dataflow=True):
        try:
            ty = getattr(bb.normalize(expr), "ty", None)
        except tvm.error.TVMError:  # an ill-typed bare expression simply has no type
            ty = None
    return ty if isinstance(ty, _RELAX_TYPES) else None


@contextlib.contextmanager
def scratch_block(bb: relax.BlockBuilder, dataflow: bool = True) -> Iterator[list]:
    """Open a block on ``bb`` outside any function, for normalising loose expressions.

    ``BlockBuilder.normalize`` binds the nested calls of an expression into the current
    block; TVM's public API only opens blocks inside ``bb.function``.  The list yielded
    receives the finished block's bindings when the ``with`` ends.
    """
    if dataflow:
        bb._begin_dataflow_block()  # pylint: disable=protected-access
    else:
        bb._begin_binding_block()  # pylint: disable=protected-access
    bindings: list = []
    try:
        yield bindings
    finally:
        bindings.extend(array_items(bb._end_block().bindings))  # pylint: disable=protected-access


def is_tensor_constant(expr: Any) -> bool:
    return isinstance(expr, GenericConst)


def is_constant(expr: Any) -> bool:
    """Tensor constants and prim-value immediates (``relax.prim_value``)."""
    return isinstance(expr, Constant)


def const_to_numpy(expr: Any) -> np.ndarray:
    """The payload of a tensor constant or a prim-value immediate as a numpy array."""
    if isinstance(expr, GenericConst):
        return expr.value.numpy()
    if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return np.asarray(expr.value)
    raise TypeError(f"expected a constant, found {type(expr).__name__}")


_OP_INFO: dict[int, tuple[str, bool]] = {}  # Op handle -> (name, pure); ops live as long as TVM
VAR_TYPES = frozenset({Var, relax.DataflowVar})  # exact types, for ``type(x) in VAR_TYPES``


def op_info(op: Any) -> tuple[str, bool]:
    """``(name, pure)`` of an operator, cached: pure means no side effects (FPurity)."""
    key = op.__chandle__()
    info = _OP_INFO.get(key)
    if info is None:
        try:
            pure = bool(op.get_attr("FPurity"))
        except (tvm.error.TVMError, AttributeError, ValueError):
            pure = False
        info = _OP_INFO[key] = (op.name, pure)
    return info


def op_name(expr: Any) -> str | None:
    """``"relax.add"`` for a call to an operator, ``None`` for anything else.

    Exact type checks and a per-operator cache: this runs on every binding of every
    pass, and TVM's classes use ``ABCMeta``, which makes ``isinstance`` slow.
    """
    if type(expr) is not Call:
        return None
    op = expr.op
    if type(op) is not Op:
        return None
    return op_info(op)[0]


def is_pure_value(value: Any) -> bool:
    """May a binding of ``value`` be looked through, moved or removed?

    Everything but calls with side effects (an operator without ``FPurity``, an extern
    function) and the values that are not data (local functions, ``If``).
    """
    if type(value) is Call:
        op = value.op
        if type(op) is Op:
            return op_info(op)[1]
        return not isinstance(op, relax.ExternFunc)
    return not isinstance(value, (relax.Function, relax.If))


def static_shape(ty: Any) -> tuple | None:
    """Shape of a tensor type as a tuple of ints (symbolic dims stay PrimExprs).

    Returns ``None`` when the type is not a tensor or its shape is unknown.
    """
    if not isinstance(ty, TensorType) or ty.shape is None:
        return None
    dims = []
    for d in ty.shape.values if hasattr(ty.shape, "values") else ty.shape:
        dims.append(int(d) if isinstance(d, tvm.tirx.IntImm) else d)
    return tuple(dims)


def dtype_of(ty: Any) -> str | None:
    if not isinstance(ty, TensorType) or ty.dtype is None:
        return None
    text = str(ty.dtype)
    return text or None


def structural_equal(a: Any, b: Any, map_free_vars: bool = False) -> bool:
    return bool(tvm_ffi.structural_equal(a, b, map_free_vars=map_free_vars))


def structural_hash(a: Any, map_free_vars: bool = False) -> int:
    return int(tvm_ffi.structural_hash(a, map_free_vars=map_free_vars))


def to_tensor(array: np.ndarray):
    """numpy -> ``tvm.runtime.Tensor`` (``tvm.nd.array`` in older releases)."""
    return tvm.runtime.tensor(array)


def copy_module(mod: tvm.IRModule, functions: dict | None = None) -> tvm.IRModule:
    """A new IRModule with the same attributes; never hands back the caller's object."""
    funcs = dict(mod.functions.items()) if functions is None else functions
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector around a whole-function pass.

    Indexing a function allocates a few Python objects per binding and no cycles; with
    the collector on, its generation-2 sweeps make that cost grow faster than linearly
    (0.46 s instead of 0.19 s for 24k bindings).

    The pause only defers the work for what is still alive when it ends: the first
    collection afterwards traverses every object allocated during the pause that
    survived it, and on a large heap that sweep grows faster than the number of objects
    (cache misses).  A pass should therefore keep nothing per binding alive past the
    pause unless the caller asked for it: ``rewrite`` records its rewrites only when
    given a ``log`` (7 FFI wrappers per rewrite made the sweep 15x slower at 4x the
    size, see ``benchmarks/README.md``).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
