"""A snapshot of a Relax function: its bindings as flat integer arrays, read in one go.

Reading a function one FFI field at a time costs microseconds per binding; reading it
in one native call costs well under one.  :func:`snapshot` reads a function either way
(natively when it can, see :mod:`.native`) and gives the same
:class:`~.model.FunctionSnapshot` both ways.
"""

from __future__ import annotations

from typing import Any

from tvm import relax

from . import native, python_reader
from .model import (
    ARG_CONSTANT,
    ARG_FREE,
    ARG_LEAF,
    ARG_TUPLE,
    NOT_TENSOR,
    PARAM_BASE,
    SYMBOLIC,
    FunctionSnapshot,
    ValueKind,
    param_code,
    param_of,
)
from .reading import finish

__all__ = ["snapshot", "FunctionSnapshot", "ValueKind", "ARG_CONSTANT", "ARG_LEAF",
           "ARG_TUPLE", "ARG_FREE", "PARAM_BASE", "NOT_TENSOR", "SYMBOLIC", "param_code",
           "param_of"]


def snapshot(func: relax.Function, native_reader: bool | None = None,
             func_name: str | None = None) -> FunctionSnapshot:
    """The :class:`FunctionSnapshot` of ``func``.

    Parameters
    ----------
    func : relax.Function
        A normalised, well-formed function; it is only read.
    native_reader : bool, optional
        ``True``/``False`` to ask for the native or the Python reader; ``None`` (the
        default) uses the native one unless ``PATTERNKIT_NATIVE=0``.  The native reader
        falls back to Python whenever it cannot run, so the result never depends on it.
    func_name : str, optional
        The function's name in error messages (default: its ``global_symbol``, else
        ``"function"``).

    Returns
    -------
    FunctionSnapshot

    Raises
    ------
    MalformedIRError
        The function reads a Var it does not define, or is not in A-normal form; the
        message names the binding.
    """
    if func_name is None:
        func_name = _name(func)
    use_native = native.enabled() if native_reader is None else native_reader
    raw: Any = native.read(func) if use_native else False
    if raw is False:
        raw = python_reader.read(func)
    return finish(raw, func, func_name)


def _name(func: relax.Function) -> str:
    attrs = func.attrs
    if attrs is not None and "global_symbol" in attrs:
        return str(attrs["global_symbol"])
    return "function"
