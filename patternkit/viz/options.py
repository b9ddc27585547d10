"""Options of ``viz_expr`` / ``viz_diff``, validated once, and the visualiser's error type."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..errors import PatternkitError
from .labels import OP_NAME_STYLES

__all__ = ["VizError", "VizOptions", "make_options"]


class VizError(PatternkitError, ValueError):
    """Bad input to the visualiser (not Relax IR, unknown option, a focus naming nothing)."""


COLOR_BY = ("cluster", "compiler", "composite", "op", "rule", "none")
CONSTANTS = ("fold", "node")
CALLS = ("inline", "once")


@dataclass
class VizOptions:
    """Every knob of the visualiser; see :func:`patternkit.viz.viz_expr` for their meaning."""

    op_names: str = "relay"
    constants: str = "fold"
    calls: str = "inline"
    color_by: str = "cluster"
    collapse: Any = "auto"
    max_nodes: int = 150
    hard_limit: int = 5000
    focus: Any = None
    radius: int = 2
    functions: Any = None
    highlight: Any = None
    max_attrs: int = 3
    legend: bool = True
    header: bool = True
    rankdir: str = "TB"
    timeout: float = 20.0
    title: str = ""
    columns: int = 1
    max_side: int = 0


def make_options(**kwargs: Any) -> VizOptions:
    """Validate keyword options, raising :class:`VizError` that names the bad one."""
    known = {f.name for f in fields(VizOptions)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise VizError(
            f"unknown visualiser option(s) {unknown}; expected some of {sorted(known)}"
        )
    opts = VizOptions(**kwargs)
    _choice("op_names", opts.op_names, OP_NAME_STYLES)
    _choice("constants", opts.constants, CONSTANTS)
    _choice("calls", opts.calls, CALLS)
    _choice("color_by", opts.color_by, COLOR_BY)
    _choice("rankdir", opts.rankdir, ("TB", "LR", "BT", "RL"))
    for name in ("max_nodes", "hard_limit", "radius", "max_attrs", "columns", "max_side"):
        value = getattr(opts, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise VizError(f"option {name}= expects a non-negative int, found {value!r}")
    if not isinstance(opts.timeout, (int, float)) or opts.timeout <= 0:
        raise VizError("option timeout= expects a positive number of seconds, "
                       f"found {opts.timeout!r}")
    collapse = opts.collapse
    if collapse is None or collapse is False:
        opts.collapse = "none"
    elif collapse is True:
        opts.collapse = "all"
    elif isinstance(collapse, str):
        pass  # "auto" | "all" | "none" | a glob on cluster names
    elif (isinstance(collapse, (list, tuple, set, frozenset))
          and all(isinstance(c, str) for c in collapse)):
        opts.collapse = tuple(sorted(collapse))
    else:
        raise VizError(
            "option collapse= expects 'auto', 'all', 'none', a glob on cluster names or a list "
            f"of globs, found {collapse!r}"
        )
    if opts.functions is not None:
        if isinstance(opts.functions, str):
            opts.functions = (opts.functions,)
        elif not all(isinstance(f, str) for f in opts.functions):
            raise VizError(f"option functions= expects function names, found {opts.functions!r}")
        opts.functions = tuple(opts.functions)
    return opts


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise VizError(f"option {name}= expects one of {list(allowed)}, found {value!r}")
