"""The module a rewrite is running on, for the rules that must read another function of it.

A rule sees one binding and the Vars it reads.  A ``call_tir`` names its PrimFunc by a
``GlobalVar``, which carries no body: a rule that proves what a PrimFunc computes (an
``einsum`` that ``from_onnx`` lowered to TIR) needs the module that defines it.
:func:`rewrite <patternkit.engine.driver.rewrite>` puts the module it was given in scope
for the length of the call, and :func:`current_module` reads it.  A rewrite only replaces
Relax bindings, so the PrimFuncs of that module are those of every round.

The scope is a :class:`contextvars.ContextVar`: nested and concurrent rewrites (threads,
asyncio tasks) each see their own module.  Outside a rewrite, or when the target was a
lone ``relax.Function``, :func:`current_module` is ``None`` and such a rule refuses.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import tvm

_CURRENT: ContextVar[tvm.IRModule | None] = ContextVar("patternkit_rewrite_module",
                                                        default=None)

__all__ = ["current_module", "module_in_scope"]


def current_module() -> tvm.IRModule | None:
    """The module the running rewrite was given; ``None`` outside one."""
    return _CURRENT.get()


@contextmanager
def module_in_scope(mod: tvm.IRModule) -> Iterator[tvm.IRModule]:
    """Make ``mod`` the :func:`current_module` until the ``with`` block ends."""
    token = _CURRENT.set(mod)
    try:
        yield mod
    finally:
        _CURRENT.reset(token)
