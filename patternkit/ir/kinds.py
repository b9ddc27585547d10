"""The kinds of functions that fusion and partitioning create, and their attribute names.

Every pass that makes or undoes fused functions (``FuseOps``, ``FuseOpsByPattern``,
``MergeCompositeFunctions``, patternkit's ``partition`` / ``MergeComposite`` /
``PartitionGraph``) marks them with function attributes.  This module is the one place
that spells those attributes and decides which kind a function is, so DefuseOps, the
rewrite driver, the external-compiler passes and the visualiser agree.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

#: ``FuseOps`` (and ``FuseOpsByPattern``) mark the functions they create ``Primitive``.
PRIMITIVE = "Primitive"
#: The pattern-table entry a composite function was formed by.
COMPOSITE = "Composite"
#: The external compiler that takes a function (what ``relax.transform.RunCodegen`` reads).
CODEGEN = "Codegen"
#: Relay's name of ``Codegen``; patternkit's ``PartitionGraph`` writes both.
COMPILER = "Compiler"
#: Relay's record of the operators a partitioned function computes.
PARTITIONED_FROM_PATTERN = "PartitionedFromPattern"
GLOBAL_SYMBOL = "global_symbol"

#: Functions carrying one of these were made by fusion or partitioning: passes that
#: rewrite user code do not look inside them.
FUSED_FUNCTION_ATTRS = (PRIMITIVE, COMPOSITE, CODEGEN, PARTITIONED_FROM_PATTERN)


class FunctionKind(str, Enum):
    """A kind of fused function; the values are the names DefuseOps takes."""

    PRIMITIVE = "primitive"
    COMPOSITE = "composite"
    CODEGEN = "codegen"
    PARTITION = "partition"

    def __str__(self) -> str:
        return self.value


def attr(func: Any, key: str, default: Any = None) -> Any:
    """``func.attrs[key]``, or ``default`` when the function has no such attribute."""
    attrs = getattr(func, "attrs", None)
    if attrs is None or key not in attrs:
        return default
    return attrs[key]


def function_kinds(func: Any) -> frozenset[FunctionKind]:
    """The fused-function kinds ``func`` belongs to (empty for an ordinary function).

    ``FuseOpsByPattern`` marks its functions ``Primitive`` as well as ``Composite``; such a
    function counts as a composite only, so that undoing ``FuseOps`` (the primitive kind)
    leaves pattern-based composites alone.
    """
    attrs = getattr(func, "attrs", None)
    if attrs is None:
        return frozenset()
    kinds = set()
    if COMPOSITE in attrs:
        kinds.add(FunctionKind.COMPOSITE)
    if CODEGEN in attrs:
        kinds.add(FunctionKind.CODEGEN)
    if PARTITIONED_FROM_PATTERN in attrs:
        kinds.add(FunctionKind.PARTITION)
    if not kinds and PRIMITIVE in attrs and bool(attrs[PRIMITIVE]):
        kinds.add(FunctionKind.PRIMITIVE)
    return frozenset(kinds)


def is_fused(func: Any) -> bool:
    """Was ``func`` made by fusion or partitioning (any of :data:`FUSED_FUNCTION_ATTRS`)?"""
    return any(attr(func, key) is not None for key in FUSED_FUNCTION_ATTRS)


def cluster_kind(func: Any) -> tuple[str, str]:
    """``(kind, name)`` under which the visualiser draws ``func``.

    ``Codegen``/``Compiler`` -> ``("codegen", compiler)``; ``Composite`` ->
    ``("composite", entry)``; ``PartitionedFromPattern`` -> ``("partition", ops)``;
    ``Primitive`` -> ``("primitive", "")``; anything else -> ``("function", "")``.
    """
    for key in (CODEGEN, COMPILER):
        value = attr(func, key)
        if value is not None:
            return FunctionKind.CODEGEN.value, str(value)
    for key, kind in ((COMPOSITE, FunctionKind.COMPOSITE),
                      (PARTITIONED_FROM_PATTERN, FunctionKind.PARTITION)):
        value = attr(func, key)
        if value is not None:
            return kind.value, str(value)
    if attr(func, PRIMITIVE) is not None:
        return FunctionKind.PRIMITIVE.value, ""
    return "function", ""
