"""TVM's registered pattern tables (``tvm.relax.backend.pattern_registry``), read for patternkit.

Importing TVM's backend modules registers their ``FusionPattern`` tables (about 300
entries for cutlass, cublas, cudnn, tensorrt, openclml, coreml, nnapi, hipblas and
example_npu in 0.27), even though the PyPI wheel ships none of the codegens.  This module
loads those backends, lists the registered prefixes, and converts each ``FusionPattern``
into what a patternkit table entry needs (:class:`TvmEntrySpec`): the pattern through
:func:`patternkit.dpl.from_dpl`, the annotation patterns as the entry's roles (the same
nodes, so a check reads what TVM's would), the check function and ``attrs_getter``.

The table itself (:meth:`patternkit.PatternTable.from_tvm`) is built in
:mod:`patternkit.byoc.tables.table`.
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from tvm.relax.backend.pattern_registry import get_patterns_with_prefix
from tvm.relax.transform import FusionPattern

from ...dpl.from_tvm import DplConverter
from ...dpl.pattern import DFPattern

logger = logging.getLogger(__name__)

#: The backend modules of apache-tvm 0.27 whose import registers a pattern table.
BACKEND_MODULES = (
    "tvm.relax.backend.cuda.cutlass",
    "tvm.relax.backend.cuda.cublas",
    "tvm.relax.backend.cuda.cudnn",
    "tvm.relax.backend.contrib.tensorrt",
    "tvm.relax.backend.adreno.clml",
    "tvm.relax.backend.metal.coreml",
    "tvm.relax.backend.contrib.nnapi",
    "tvm.relax.backend.rocm.hipblas",
    "tvm.relax.backend.contrib.example_npu",
)


@dataclass(frozen=True)
class TvmEntrySpec:
    """One ``FusionPattern`` in patternkit's terms.

    Attributes
    ----------
    name : str
        The composite name (``"cutlass.conv2d_bias_relu"``); variants repeat it.
    pattern : DFPattern
    annotations : mapping of str to DFPattern
        TVM's ``annotation_patterns``, as nodes of ``pattern``: the entry's roles.
    check : callable or None
        TVM's ``check(PatternCheckContext) -> bool``.
    attrs_getter : callable or None
        TVM's ``attrs_getter(annotated_expr) -> dict`` of extra composite attributes.
    source : tvm.relax.transform.FusionPattern
        The pattern it was converted from (``to_fusion_patterns`` hands it back to TVM).
    """

    name: str
    pattern: DFPattern
    annotations: Mapping[str, DFPattern] = field(default_factory=dict)
    check: Callable | None = None
    attrs_getter: Callable | None = None
    source: Any = None


@functools.cache
def load_backends() -> tuple[str, ...]:
    """Import every backend of :data:`BACKEND_MODULES`; returns the ones that failed.

    A backend that cannot be imported (a missing optional dependency) only loses its
    table; the failure is logged once.
    """
    failed = []
    for name in BACKEND_MODULES:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 (any import-time failure loses one table)
            logger.warning("could not import TVM backend %s: %s", name, err)
            failed.append(name)
    return tuple(failed)


def registered_patterns(prefix: str = "") -> list:
    """TVM's ``FusionPattern`` objects whose names start with ``prefix``, highest priority first."""
    load_backends()
    return list(get_patterns_with_prefix(prefix))


def registered_prefixes() -> list[str]:
    """The backend prefixes of the registered patterns (``["coreml", "cublas", ...]``)."""
    return sorted({str(p.name).split(".", 1)[0] for p in registered_patterns("")})


def resolve(spec: str | Iterable[Any]) -> list:
    """The ``FusionPattern`` list for a prefix (``"cutlass"``, ``"cutlass.conv2d"``), a
    comma-separated list of prefixes, or an iterable of ``FusionPattern`` / TVM tuples.

    Raises
    ------
    LookupError
        A prefix matches no registered pattern (the message lists the prefixes).
    TypeError
        An item is neither a ``FusionPattern`` nor a ``(name, pattern, ...)`` tuple.
    """
    if isinstance(spec, str):
        found = []
        for prefix in [p.strip() for p in spec.split(",") if p.strip()] or [spec]:
            patterns = registered_patterns(prefix if "." in prefix else prefix + ".")
            if not patterns:
                raise LookupError(f"no TVM pattern table is registered under {prefix!r}; "
                                  f"registered prefixes: {', '.join(registered_prefixes())}")
            found.extend(patterns)
        return found
    out = []
    for i, item in enumerate(spec):
        if isinstance(item, FusionPattern):
            out.append(item)
        elif isinstance(item, tuple) and len(item) >= 2:
            out.append(FusionPattern(*item))
        else:
            raise TypeError(f"item {i} is a {type(item).__name__}; expected a "
                            f"tvm.relax.transform.FusionPattern or a (name, pattern[, "
                            f"annotation_patterns[, check]]) tuple")
    return out


def convert(fusion_pattern: Any) -> TvmEntrySpec:
    """``fusion_pattern`` in patternkit's terms; raises :class:`~patternkit.dpl.FromDplError`."""
    converter = DplConverter()
    pattern = converter.convert(fusion_pattern.pattern)
    annotations = {str(k): converter.convert(v)
                   for k, v in fusion_pattern.annotation_patterns.items()}
    return TvmEntrySpec(str(fusion_pattern.name), pattern, annotations,
                        fusion_pattern.check, fusion_pattern.attrs_getter, fusion_pattern)


__all__ = ["BACKEND_MODULES", "TvmEntrySpec", "load_backends", "registered_patterns",
           "registered_prefixes", "resolve", "convert"]
