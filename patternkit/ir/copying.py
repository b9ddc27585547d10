"""Deep copies of patternkit objects that hold TVM objects.

TVM 0.27 copies and pickles its objects through ``save_json``, which kills the process
on any Relax expression (a segmentation fault, not an exception: ``docs/tvm-bugs.md``).
So ``copy.deepcopy`` of a pattern holding ``is_expr(relax.const(...))``, of a rule, or of
the whole library crashed the interpreter.  TVM objects are immutable, so a deep copy
may share them: :func:`deepcopy_sharing_tvm_objects` copies everything else as
``copy.deepcopy`` would (shared sub-objects stay shared) and keeps TVM objects as they
are.  Patterns and rules use it as their ``__deepcopy__``.
"""

from __future__ import annotations

import copy
import types
from typing import Any

import numpy as np

from .compat import is_tvm_object

#: Values whose insides hold no TVM object worth finding (or that deepcopy keeps as is).
_OPAQUE = (str, bytes, int, float, complex, type(None), type, types.FunctionType,
           types.BuiltinFunctionType, types.MethodType, types.ModuleType, np.ndarray,
           np.generic)

#: The memo key under which one deep copy keeps the ids :func:`share_tvm_objects` has
#: walked: a rule's walk covers its patterns, whose own ``__deepcopy__`` then skips them.
#: The id of an object kept alive, so that no object being copied can have it.
_WALKED_SENTINEL = object()
_WALKED = id(_WALKED_SENTINEL)


def share_tvm_objects(root: Any, memo: dict[int, Any]) -> None:
    """Record every TVM object reachable from ``root`` in a ``copy.deepcopy`` ``memo`` as
    its own copy, so that the deep copy in progress shares it instead of copying it.

    Reachable: through lists, tuples, sets, dicts (keys and values) and the ``__dict__``
    of plain objects.
    """
    seen: set[int] = memo.setdefault(_WALKED, set())
    stack = [root]
    while stack:
        value = stack.pop()
        if id(value) in seen or isinstance(value, _OPAQUE):
            continue
        seen.add(id(value))
        if is_tvm_object(value):
            memo.setdefault(id(value), value)
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend(value)
        else:
            stack.extend(getattr(value, "__dict__", {}).values())


def deepcopy_sharing_tvm_objects(obj: Any, memo: dict[int, Any]) -> Any:
    """A ``__deepcopy__`` for a class whose state is its ``__dict__``: TVM objects shared."""
    share_tvm_objects(vars(obj), memo)
    new = object.__new__(type(obj))
    memo[id(obj)] = new
    new.__dict__.update(copy.deepcopy(vars(obj), memo))
    return new
