"""What a by-example function takes: its tensors, its named constants, and their shapes.

``pk.rule_by_example(name, written, fused)`` traces two Python functions with the same
parameters.  A parameter without a default is a tensor of the matched graph (a wildcard
of the pattern); a parameter with a default is a *named constant* (``eps=1e-5``): traced
as that constant, matched as any constant unless the rule names it exact, and handed to
``fused`` as the constant the graph holds.  This module reads the parameters once, checks
that both sides agree on them, and makes the symbolic shapes the functions are traced at.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import tvm
from tvm import relax

from ...errors import PatternError

__all__ = ["Signature", "read_signature", "symbolic_types", "DEFAULT_SHAPE"]

#: The shape a tensor parameter is traced at unless ``shapes=`` says otherwise: two
#: symbolic dimensions, the same for every parameter (elementwise bodies need no more).
DEFAULT_SHAPE = ("m", "n")

#: Names a role may not take: the rule's own attributes.
_RESERVED = frozenset({"name", "pattern", "context", "rewrite_once", "compiler", "check",
                       "rewrite", "example", "example_space", "tolerance", "roles", "spec"})


@dataclass(frozen=True)
class Signature:
    """The parameters of a by-example pair.

    Attributes
    ----------
    tensors : tuple of str
        Parameters without a default, in order: the matched tensors.
    constants : dict
        Parameters with a default: name -> the default (a number or an array).
    shapes : dict
        Tensor name -> its dimensions (``int`` or the name of a symbolic dimension).
    """

    tensors: tuple[str, ...]
    constants: dict[str, Any] = field(default_factory=dict)
    shapes: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbolic dimensions, in first-use order."""
        seen: dict[str, None] = {}
        for name in self.tensors:
            for dim in self.shapes[name]:
                if isinstance(dim, str):
                    seen.setdefault(dim)
        return tuple(seen)

    def text(self) -> str:
        """``(x, y, *, eps=1e-05)``: the parameters as written."""
        parts = list(self.tensors)
        parts += [f"{k}={v!r}" for k, v in self.constants.items()]
        return "(" + ", ".join(parts) + ")"


def _parameters(rule: str, side: str, fn: Callable[..., Any]) -> list[inspect.Parameter]:
    if not callable(fn):
        raise PatternError(f"{rule}: {side} must be a function over tensors, found "
                           f"{type(fn).__name__} {fn!r:.60}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as err:
        raise PatternError(f"{rule}: cannot read the parameters of {side}: {err}") from None
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise PatternError(f"{rule}: {side} takes *{p.name}; name every parameter, "
                               f"the pattern has one wildcard per parameter")
    return params


def read_signature(rule: str, written: Callable[..., Any], fused: Callable[..., Any] | None,
                   shapes: Mapping[str, Sequence[Any]] | None = None) -> Signature:
    """The parameters of ``written`` (and ``fused``, which must take the same ones).

    Raises
    ------
    PatternError
        A side that is not a function, a pair whose parameters differ, a parameter named
        like an attribute of the rule, a shape given for no parameter.
    """
    params = _parameters(rule, "written", written)
    names = [p.name for p in params]
    if fused is not None:
        other = [p.name for p in _parameters(rule, "fused", fused)]
        if other != names:
            raise PatternError(f"{rule}: written takes ({', '.join(names)}) but fused takes "
                               f"({', '.join(other)}); both sides need the same parameters")
    clash = sorted(set(names) & _RESERVED)
    if clash:
        raise PatternError(f"{rule}: the parameter name {clash[0]!r} is taken by the rule "
                           f"itself; rename it")
    tensors = tuple(p.name for p in params if p.default is inspect.Parameter.empty)
    if not tensors:
        raise PatternError(f"{rule}: written has no tensor parameter (one without a "
                           f"default): there is nothing for the pattern to match")
    constants = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    given = dict(shapes or {})
    unknown = sorted(set(given) - set(tensors))
    if unknown:
        raise PatternError(f"{rule}: shapes= names {unknown[0]!r}, which is not a tensor "
                           f"parameter of written ({', '.join(tensors)})")
    resolved = {}
    for name in tensors:
        dims = tuple(given.get(name, DEFAULT_SHAPE))
        for dim in dims:
            if not (isinstance(dim, str) and dim.isidentifier()) and not (
                    isinstance(dim, int) and not isinstance(dim, bool) and dim > 0):
                raise PatternError(f"{rule}: shapes[{name!r}] has the dimension {dim!r}; "
                                   f"use positive ints or names of symbolic dimensions")
        resolved[name] = dims
    return Signature(tensors, constants, resolved)


def symbolic_types(signature: Signature, dtype: str,
                   sizes: Mapping[str, int] | None = None) -> dict[str, relax.TensorType]:
    """The type of each tensor parameter: its symbolic dimensions as ``int64`` shape
    variables shared by name (or bound to ``sizes``), of ``dtype``.
    """
    symbols = {s: tvm.tirx.Var(s, "int64") for s in signature.symbols}
    bound = dict(sizes or {})
    types = {}
    for name in signature.tensors:
        dims = [bound.get(d, symbols[d]) if isinstance(d, str) else d
                for d in signature.shapes[name]]
        types[name] = relax.TensorType(dims, dtype)
    return types
