"""Private and unstable TVM API, and the accessors whose spelling changed in 0.27.

patternkit pins apache-tvm exactly, so it reads the stable Relax API (``Var.ty``,
``Call.args``, ``relax.TensorType``) directly wherever it needs it.  What lives here is
what a TVM release is likely to break: private FFI entry points (``tvm_ffi._ffi_api``
array access and raw constructors, ``__chandle__``, FFI type information), BlockBuilder
internals (scratch blocks), renamed accessors (``Var.name`` / ``GlobalVar.name_hint``,
``GenericConst.value``, ``tvm_ffi.structural_equal``, ``tvm.sym`` which was
``tvm.arith``), the errors TVM raises, and the per-operator cache that lets hot paths
read an operator's name and purity without going through the FFI.  No other module of
patternkit touches private TVM API; a test enforces it.  (The per-type cache of
expression kinds is :mod:`patternkit.ir.walk`.)
"""

from __future__ import annotations

import contextlib
import functools
import gc
from typing import Any, Callable, Iterator

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.sym import Analyzer as Analyzer  # re-exported; tvm.arith before 0.27

from ..errors import PatternkitError

_array_get = tvm_ffi._ffi_api.ArrayGetItem
_array_size = tvm_ffi._ffi_api.ArraySize


def array_items(array: Any) -> list[Any]:
    """A TVM FFI ``Array`` as a Python list.

    ``tuple(array)`` goes through three Python frames and two FFI calls per element; the
    rewrite engine reads every call's arguments, so it uses this direct path instead.
    """
    get = _array_get
    return [get(array, i) for i in range(_array_size(array))]


def call_args(call: Any) -> list[Any]:
    """The arguments of ``call`` as a list: ``call.args[i]`` indexes the FFI ``Array``
    through its Python ``__getitem__`` (~2 us), this reads each one directly.
    """
    return array_items(call.args)


def int_list(array: Any) -> list[int] | None:
    """An integer array attribute (an op's ``axis``) as a list of ints; ``None`` stays ``None``.

    ``[int(a) for a in attrs.axis]`` iterates the FFI ``Array`` through its Python
    ``__getitem__`` (~2.5 us an element); the checks read axes on every match.
    """
    if array is None:
        return None
    return [int(a) for a in array_items(array)]


#: ``handle(obj)``: a stable integer key for a TVM object (its C handle).
#:
#: Reading ``call.args[0]`` twice gives two Python wrappers of one node.  They hash
#: alike, but a dict lookup then falls back to ``Expr.__eq__``, which costs ~2 µs; the
#: engine's per-binding tables are keyed by this handle instead.  It is the unbound
#: method itself, not a wrapper around it, so that it costs what ``obj.__chandle__()``
#: costs: the matcher calls it a few times per pattern node.
handle = tvm_ffi.core.CObject.__chandle__


def is_tvm_object(obj: Any) -> bool:
    """Is ``obj`` a TVM FFI object (an expression, a type, an operator, a pass, ...)?"""
    return isinstance(obj, tvm_ffi.core.CObject)


def handle_or_none(obj: Any) -> int | None:
    """:data:`handle` of a TVM object, ``None`` for anything else (a str, a pattern)."""
    return obj.__chandle__() if isinstance(obj, tvm_ffi.core.CObject) else None


#: The FFI constructors behind ``relax.Call(...)``, ``relax.Tuple(...)``,
#: ``relax.DataflowVar(...)`` and ``relax.Var(...)``, without the Python ``__init__`` that
#: converts its arguments: DefuseOps builds a few per inlined binding, and outlining a
#: composite a few per copied binding, from values they already hold.
#: ``new_call(ret_ty, op, args, attrs, ty_args, span)``, ``new_tuple(fields, span)``,
#: ``new_dataflow_var(name, ty, span)``, ``new_var(name, ty, span)`` (a Relax ``Var``).
new_call = tvm.ir._ffi_api.Call  # pylint: disable=protected-access
#: The ``ret_ty`` of an untyped call (what ``relax.Call(...)`` passes when given none):
#: normalisation infers the type.
MISSING_TYPE = tvm.ir.Type.missing()
new_tuple = tvm.ir._ffi_api.Tuple  # pylint: disable=protected-access
new_dataflow_var = relax._ffi_api.DataflowVar  # pylint: disable=protected-access
new_var = tvm.ir._ffi_api.Var  # pylint: disable=protected-access
#: ``new_var_binding(var, value, span)``, ``new_dataflow_block(bindings, span)``,
#: ``new_seq_expr(blocks, body, span)``, ``new_function(params, body, ret_ty, is_pure,
#: attrs, span)``: the same for the pieces of an outlined function.
new_var_binding = relax._ffi_api.VarBinding  # pylint: disable=protected-access
new_dataflow_block = relax._ffi_api.DataflowBlock  # pylint: disable=protected-access
new_seq_expr = relax._ffi_api.SeqExpr  # pylint: disable=protected-access
new_function = relax._ffi_api.Function  # pylint: disable=protected-access
#: ``update_type(expr, ty)``: give an untyped expression its type in place (what
#: normalisation would infer), for an expression built from typed parts.
update_type = relax._ffi_api.UpdateType  # pylint: disable=protected-access


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def attr_field_names(attrs: Any) -> tuple[str, ...]:
    """The fields of an attributes object (``Conv2DAttrs``), base classes' first.

    Read from the FFI type information (``__tvm_ffi_type_info__``), once per class.
    """
    cls = type(attrs)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        chain = []
        info = getattr(cls, "__tvm_ffi_type_info__", None)
        while info is not None:
            chain.append(info)
            info = info.parent_type_info
        names = _FIELD_NAMES[cls] = tuple(f.name for info in reversed(chain) for f in info.fields)
    return names


def var_name(var: Any) -> str:
    """The user-visible name of a Relax ``Var`` or ``GlobalVar``."""
    if isinstance(var, tvm.ir.GlobalVar):
        return str(var.name_hint)
    return str(var.name)


#: What TVM raises through the FFI.  Its C++ errors arrive as Python built-ins (a type
#: mismatch in ``normalize`` is a ``ValueError``) or as ``RuntimeError`` subclasses such
#: as ``tvm.error.InternalError`` (a missing operator attribute); 0.27 has no
#: ``tvm.error.TVMError`` to catch instead.
TVM_ERRORS = (RuntimeError, ValueError, TypeError)

_RELAX_TYPES = (relax.TensorType, relax.TupleType, relax.ShapeType, relax.FuncType,
                relax.ObjectType, tvm.ir.PrimType)


def type_of(expr: Any) -> Any:
    """The Relax type of an expression, or ``None`` if it cannot be known.

    Normalised IR carries its types.  A bare expression built with ``relax.op.*`` may
    not (its ``ty`` is the untyped ``ir.Type``); it is then normalised in a scratch
    block to infer one.  The caller's expression is not modified.
    """
    ty = getattr(expr, "ty", None)
    if type(ty) is relax.TensorType or isinstance(ty, _RELAX_TYPES):  # the common type first
        return ty
    if not isinstance(expr, tvm.ir.Expr) or isinstance(expr, tvm.ir.Op):
        return None
    bb = relax.BlockBuilder()
    with scratch_block(bb, dataflow=True):
        try:
            ty = getattr(bb.normalize(expr), "ty", None)
        except TVM_ERRORS:  # an ill-typed bare expression simply has no type
            ty = None
    return ty if isinstance(ty, _RELAX_TYPES) else None


@contextlib.contextmanager
def scratch_block(bb: relax.BlockBuilder, dataflow: bool = True) -> Iterator[list[Any]]:
    """Open a block on ``bb`` outside any function, for normalising loose expressions.

    ``BlockBuilder.normalize`` binds the nested calls of an expression into the current
    block; TVM's public API only opens blocks inside ``bb.function``.  The list yielded
    receives the finished block's bindings when the ``with`` ends.
    """
    if dataflow:
        bb._begin_dataflow_block()  # pylint: disable=protected-access
    else:
        bb._begin_binding_block()  # pylint: disable=protected-access
    bindings: list[Any] = []
    try:
        yield bindings
    finally:
        bindings.extend(array_items(bb._end_block().bindings))  # pylint: disable=protected-access


def is_tensor_constant(expr: Any) -> bool:
    """Whether ``expr`` is a tensor constant (``relax.Constant``)."""
    return isinstance(expr, tvm.ir.GenericConst)


def is_constant(expr: Any) -> bool:
    """Tensor constants and prim-value immediates (``relax.prim_value``)."""
    # The exact test first: ``isinstance`` against TVM's classes costs ~0.7 us.
    return type(expr) is tvm.ir.GenericConst or isinstance(expr, tvm.ir.Constant)


def const_to_numpy(expr: Any) -> np.ndarray:
    """The payload of a tensor constant or a prim-value immediate as a numpy array.

    The array is a copy (the caller may modify it; the constant stays as it was).  It is
    read through DLPack, which costs about 1 us against 30 us for ``Tensor.numpy()``:
    the matcher reads a scalar constant for every number in a pattern it tries, and the
    normalisation rules one more for their epsilon.  Dtypes numpy cannot take by DLPack
    (bfloat16) go through ``numpy()``.
    """
    if isinstance(expr, tvm.ir.GenericConst):
        tensor = expr.value
        try:
            return np.from_dlpack(tensor).copy()
        except (BufferError, TypeError, RuntimeError):
            return np.asarray(tensor.numpy())
    if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return np.asarray(expr.value)
    raise TypeError(f"expected a constant, found {type(expr).__name__}")


_OP_INFO: dict[int, tuple[str, bool]] = {}  # Op handle -> (name, pure); ops live as long as TVM
VAR_TYPES = frozenset({relax.Var, relax.DataflowVar})  # exact types, for ``type(x) in VAR_TYPES``


def op_info(op: Any) -> tuple[str, bool]:
    """``(name, pure)`` of an operator, cached: pure means no side effects (FPurity)."""
    key = handle(op)
    info = _OP_INFO.get(key)
    if info is None:
        try:
            pure = bool(op.get_attr("FPurity"))
        except TVM_ERRORS:  # no FPurity registered: not known to be pure
            pure = False
        info = _OP_INFO[key] = (op.name, pure)
    return info


def op_name(expr: Any) -> str | None:
    """``"relax.add"`` for a call to an operator, ``None`` for anything else.

    Exact type checks and a per-operator cache: this runs on every binding of every
    pass, and TVM's classes use ``ABCMeta``, which makes ``isinstance`` slow.
    """
    if type(expr) is not relax.Call:
        return None
    op = expr.op
    if type(op) is not tvm.ir.Op:
        return None
    return op_info(op)[0]


def is_pure_value(value: Any) -> bool:
    """May a binding of ``value`` be looked through, moved or removed?

    Everything but calls with side effects (an operator without ``FPurity``, an extern
    function) and the values that are not data (local functions, ``If``).
    """
    if type(value) is relax.Call:
        op = value.op
        if type(op) is tvm.ir.Op:
            return op_info(op)[1]
        return not isinstance(op, relax.ExternFunc)
    return not isinstance(value, (relax.Function, relax.If))


def static_shape(ty: Any) -> tuple[Any, ...] | None:
    """Shape of a tensor, given its type or the expression itself.

    Parameters
    ----------
    ty : relax type, Relax expression, or None
        A type (``var.ty``, ``type_of(expr)``) or an expression whose type is read with
        :func:`type_of` (``static_shape(match.x)``).

    Returns
    -------
    tuple or None
        The dims as ints (symbolic dims stay PrimExprs); ``None`` when ``ty`` is
        ``None``, not a tensor, or a tensor of unknown shape.  The rules' checks read a
        few shapes per match, so the dims are read straight off the FFI array.

    Raises
    ------
    TypeError
        ``ty`` is neither a type nor an expression (a tuple of dims, a string): a
        guard comparing its ``None`` would pass vacuously.
    """
    if type(ty) is not _TENSOR_TYPE and not isinstance(ty, _TENSOR_TYPE):
        if ty is None or isinstance(ty, tvm.ir.Type):
            return None
        if isinstance(ty, tvm.ir.Expr):
            return static_shape(type_of(ty))
        raise TypeError(f"static_shape takes a Relax expression or type, not "
                        f"{type(ty).__name__} {ty!r:.60}")
    shape = ty.shape
    if shape is None:
        return None
    values = shape.values if type(shape) is _SHAPE_EXPR else getattr(shape, "values", None)
    if values is None and not isinstance(shape, _SHAPE_EXPR):
        return None  # a shape held by a Var (``R.reshape(x, shape_param)``): unknown
    dims = array_items(values) if values is not None else list(shape)
    return tuple([d.value if type(d) is _INT_IMM else d for d in dims])  # exact test: below


# Exact type tests: ``isinstance`` against TVM's classes goes through ``ABCMeta`` when it
# fails (~0.7 us).
_TENSOR_TYPE = relax.TensorType
_SHAPE_EXPR = relax.ShapeExpr
_INT_IMM = tvm.tirx.IntImm


#: PrimType handle -> (the PrimType, its text).  TVM interns a dtype's PrimType (every
#: ``TensorType`` of one dtype holds the same object), so this holds one entry per dtype
#: seen; keeping the object alive keeps its handle from naming anything else.  ``str``
#: of a PrimType goes through the script printer (~4 us), and every check reads dtypes.
_DTYPE_TEXT: dict[int, tuple[Any, str | None]] = {}
_DTYPE_TEXT_LIMIT = 1024  # a bound in case some path makes PrimTypes that are not interned


def dtype_of(ty: Any) -> str | None:
    """The dtype text of a tensor type (``"float32"``), ``None`` for other types."""
    if type(ty) is not _TENSOR_TYPE and not isinstance(ty, _TENSOR_TYPE):
        return None
    prim = ty.dtype
    if prim is None:
        return None
    key = handle(prim)
    cached = _DTYPE_TEXT.get(key)
    if cached is None:
        if len(_DTYPE_TEXT) >= _DTYPE_TEXT_LIMIT:
            _DTYPE_TEXT.clear()
        cached = _DTYPE_TEXT[key] = (prim, str(prim) or None)
    return cached[1]


def structural_equal(a: Any, b: Any, map_free_vars: bool = False) -> bool:
    """Structural equality as a ``bool`` (free Vars mapped on request)."""
    return bool(tvm_ffi.structural_equal(a, b, map_free_vars=map_free_vars))


def structural_hash(a: Any, map_free_vars: bool = False) -> int:
    """The structural hash as an ``int``, consistent with :func:`structural_equal`."""
    return int(tvm_ffi.structural_hash(a, map_free_vars=map_free_vars))


def typed_global_var(name: str, func: Any) -> tvm.ir.GlobalVar:
    """A ``GlobalVar`` named ``name`` that carries ``func``'s type, as ``add_func`` makes it.

    A call to a global function is typed from its ``GlobalVar``; ``BlockBuilder.add_func``
    sets that type, but its cost grows with the module (see
    :mod:`patternkit.byoc.merge.global_functions`), so patternkit sets it itself.
    """
    gv = tvm.ir.GlobalVar(name)
    relax.expr._update_type(gv, func.ty)  # pylint: disable=protected-access
    return gv


def to_tensor(array: np.ndarray) -> Any:
    """Numpy -> ``tvm.runtime.Tensor`` (``tvm.nd.array`` in older releases)."""
    return tvm.runtime.tensor(array)


def copy_module(mod: tvm.IRModule, functions: dict[Any, Any] | None = None) -> tvm.IRModule:
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
    size, see ``benchmarks/README.md``), and drops the index of each function it
    replaced (the indexes of unchanged functions are kept for the next pass).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _ErrorBridge:
    """Keeps patternkit's exceptions as they are when they cross a ``tvm.transform.Pass``.

    A Python pass runs behind TVM's FFI.  An exception raised in it goes through C++ as
    a *kind* (a name) and a message, and comes back as ``ERROR_NAME_TO_TYPE[kind](message)``
    -- a bare ``RuntimeError`` for a class the FFI does not know, the class itself
    rebuilt from the message for one it does (losing ``CallbackError.binding``).  The
    bridge registers each :class:`~patternkit.errors.PatternkitError` subclass when a
    pass raises it (subclasses live in every layer, and users define their own), with a
    factory that hands back the very exception object the pass raised, so that
    ``except PatternTableError as err: err...`` works on a pass inside ``Sequential``
    exactly as on a direct call.
    """

    def __init__(self) -> None:
        self.registered: set[type] = set()
        self.in_flight: dict[type, BaseException] = {}  # class -> the last one raised

    def send(self, err: PatternkitError) -> None:
        """Called as ``err`` leaves a pass: the FFI will rebuild it on the other side."""
        cls = type(err)
        self.in_flight[cls] = err
        if cls not in self.registered:
            kind = f"{cls.__module__}.{cls.__qualname__}"
            tvm_ffi.register_error(kind, cls)  # the kind ``err`` crosses as
            # ... and what the kind turns back into (the FFI wants a type to call)
            tvm_ffi.core.ERROR_NAME_TO_TYPE[kind] = self._receiver(cls)
            self.registered.add(cls)

    def _receiver(self, cls: type[BaseException]) -> type:
        bridge = self

        # The FFI calls the class with the message and raises whatever comes back.
        class Received:
            def __new__(_cls, message: str) -> BaseException:  # type: ignore[misc]
                return bridge.receive(cls, message)

        return Received

    def receive(self, cls: type[BaseException], message: str) -> BaseException:
        """The exception the FFI rebuilds from ``message``: the one raised, if it is that."""
        err = self.in_flight.pop(cls, None)
        if err is not None and str(err) == message:
            return err
        fresh: BaseException = cls.__new__(cls)  # its ``__init__`` may want more than the message
        Exception.__init__(fresh, message)
        return fresh


_ERRORS = _ErrorBridge()


def module_pass(transform: Callable[[tvm.IRModule, Any], tvm.IRModule],
                name: str) -> tvm.transform.Pass:
    """``transform(mod, ctx)`` as a ``tvm.transform.Pass`` named ``name`` (opt level 0).

    A :class:`~patternkit.errors.PatternkitError` raised by ``transform`` reaches the
    caller of the pass (or of the ``Sequential`` holding it) as itself (see
    :class:`_ErrorBridge`); any other exception as TVM's FFI converts it.
    """
    return tvm.transform.module_pass(ffi_callback(transform), opt_level=0, name=name)


def ffi_callback(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as TVM's C++ calls it back (a pass body, a ``FusionPattern`` check).

    A :class:`~patternkit.errors.PatternkitError` raised by ``fn`` reaches whoever called
    into TVM as itself (see :class:`_ErrorBridge`); any other exception as TVM's FFI
    converts it.
    """

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except PatternkitError as err:
            _ERRORS.send(err)
            raise

    return call


# -- tvm.relax.dpl fields that the FFI does not reflect ---------------------------------------
# ``CallPattern.varg_default_wildcard`` and ``GlobalVarPattern``'s name are C++ fields that
# 0.27 does not register for reflection: Python cannot read them.  TVM's printer does show
# them (``op(*, *, ...)``, ``GlobalVarPattern(name)``), so they are read from its text.
def dpl_call_has_varargs(pattern: Any) -> bool:
    """Does a ``tvm.relax.dpl.CallPattern`` accept more arguments than it lists?"""
    text = str(pattern)
    return text.endswith(", ...)") or text.endswith("(...)")


def dpl_global_var_name(pattern: Any) -> str:
    """The name (a substring to find) of a ``tvm.relax.dpl.GlobalVarPattern``; ``""``: any."""
    text = str(pattern)
    prefix = "GlobalVarPattern("
    if not (text.startswith(prefix) and text.endswith(")")):
        raise ValueError(f"unexpected text for a GlobalVarPattern: {text!r}")
    return text[len(prefix):-1]
