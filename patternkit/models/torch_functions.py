"""A torch function traced into Relax exactly as patternkit imports torch models.

``pk.rule_by_example`` accepts a ``written`` side over torch tensors (``lambda x: x *
torch.clamp(x + 3, 0, 6) / 6``) so that the pattern is what the importer emits for that
spelling: its reshapes, broadcasts and decompositions included.  The function is wrapped
in a module, exported with ``torch.export`` on random inputs of the requested types
(symbolic dimensions at concrete sizes: the pattern does not keep sizes anyway), and
imported by :func:`~patternkit.models.importing.from_torch`, the zoo's own path with its
converters and fix-ups.  torch is imported only here, when such a function is traced.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping

from tvm import relax

from ..errors import PatternError, first_line
from ..ir import compat as C
from .importing import from_torch

__all__ = ["trace_torch_function", "SYMBOL_SIZES"]

#: The sizes symbolic dimensions are exported at, in order of first use (distinct, and
#: not 1, so that the exporter specialises no dimension into a broadcast).
SYMBOL_SIZES = (4, 5, 6, 7, 8, 9)


def _sizes(types: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    symbols: dict[str, int] = {}
    shapes = {}
    for name, ty in types.items():
        dims = []
        for dim in C.static_shape(ty) or ():
            if isinstance(dim, int):
                dims.append(dim)
            else:
                key = str(dim)
                if key not in symbols:
                    symbols[key] = SYMBOL_SIZES[len(symbols) % len(SYMBOL_SIZES)]
                dims.append(symbols[key])
        shapes[name] = tuple(dims)
    return shapes


def trace_torch_function(rule: str, side: str, fn: Callable[..., Any],
                         types: Mapping[str, Any], constants: Mapping[str, Any]
                         ) -> relax.Function:
    """``fn`` exported by ``torch.export`` and imported as patternkit imports models.

    Parameters
    ----------
    rule, side : str
        For errors: the rule's name, ``"written"`` or ``"fused"``.
    fn : callable
        Takes torch tensors (one per entry of ``types``) and the named constants.
    types : dict
        Parameter -> Relax tensor type (symbolic dimensions get :data:`SYMBOL_SIZES`).
    constants : dict
        Named constants, passed to ``fn`` as they are (Python numbers).

    Raises
    ------
    PatternError
        torch is missing, or ``torch.export`` or the importer refused the function: one
        line naming the rule and the cause.
    """
    try:
        import torch
    except ImportError:
        raise PatternError(f"{rule}: {side} computes with torch, which is not installed "
                           f"(pip install torch)") from None
    shapes = _sizes(types)
    generator = torch.Generator().manual_seed(0)
    inputs = []
    for name, ty in types.items():
        dtype = getattr(torch, C.dtype_of(ty) or "float32")
        inputs.append(torch.randn(shapes[name], generator=generator).to(dtype))
    plain = {k: (v if not isinstance(v, relax.Expr) else float(C.const_to_numpy(v)))
             for k, v in constants.items()}

    # forward takes the parameters by their names: the import names its Vars after them.
    names = ", ".join(types)
    forward = eval(f"lambda self, {names}: fn({names}, **plain)",
                   {"fn": fn, "plain": plain})
    module = type("Written", (torch.nn.Module,), {"forward": forward})()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's deprecation notices
        try:
            program = torch.export.export(module, tuple(inputs))
        except Exception as err:  # noqa: BLE001 - the user's function: say why torch refused
            raise PatternError(f"{rule}: torch.export cannot trace {side}: "
                               f"{type(err).__name__}: {first_line(err, limit=200)}") from None
        try:
            mod, _, _ = from_torch(program, keep_params=False, entry="main", text=rule,
                                   seconds={})
        except Exception as err:  # noqa: BLE001 - the importer's refusal, in one line
            raise PatternError(f"{rule}: the importer cannot import {side}: "
                               f"{first_line(err, limit=200)}") from None
    func = mod["main"]
    assert isinstance(func, relax.Function)
    if not isinstance(func.ret_ty, relax.TensorType):
        raise PatternError(f"{rule}: {side} must return one tensor; the import returns "
                           f"{func.ret_ty}")
    return func
