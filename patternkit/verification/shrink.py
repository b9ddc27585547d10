"""Shrink a failing module to the smallest sub-program that still fails the same way.

A random program that breaks a pass is mostly noise: a dozen bindings, of which the
pass miscompiles one.  :func:`shrink_module` keeps the failure and drops the noise by
cutting ``main`` down to the *cone* of one binding -- the binding as the only result,
with just the bindings and parameters it reads -- trying the smallest cones first and
taking the first one that still fails.  Repeated until no smaller cone fails, it leaves
a program in which every binding feeds the failing result.

It is generic: ``still_fails(mod)`` decides, and should answer ``False`` for a candidate
that is itself broken (does not build), so the shrunk module stays a valid reproducer.
Only a ``main`` whose body is one dataflow block is cut (what the strategies draw); any
other module is returned as it is.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import tvm
from tvm import relax

from ..ir import compat as C
from ..ir.walk import vars_read

__all__ = ["shrink_module", "cones"]

log = logging.getLogger(__name__)


def shrink_module(mod: tvm.IRModule, still_fails: Callable[[tvm.IRModule], bool], *,
                  max_tries: int = 64) -> tvm.IRModule:
    """The smallest cone of ``mod["main"]`` that ``still_fails`` (``mod`` if none is smaller).

    ``max_tries`` bounds the calls of ``still_fails`` (each may build twice for llvm).
    """
    best, tries = mod, 0
    while True:
        smaller = None
        for candidate in cones(best):  # every one smaller than best, smallest first
            if tries >= max_tries:
                return best
            tries += 1
            if _fails(still_fails, candidate):
                smaller = candidate
                break
        if smaller is None:
            return best
        best = smaller


def _fails(still_fails: Callable[[tvm.IRModule], bool], candidate: tvm.IRModule) -> bool:
    try:
        return bool(still_fails(candidate))
    except Exception as err:  # a candidate the predicate cannot judge is no reproducer
        log.debug("shrink: candidate skipped (%s: %s)", type(err).__name__, err)
        return False


def cones(mod: tvm.IRModule) -> list[tvm.IRModule]:
    """One module per binding of ``main``: that binding's cone as the function's result,
    smallest first (ties in program order).
    """
    bindings = _bindings(mod)
    if not bindings:
        return []
    func = mod["main"]
    index = {C.handle(b.var): i for i, b in enumerate(bindings)}
    found = []
    for i in range(len(bindings)):
        keep = _cone(bindings, index, i)
        if len(keep) < len(bindings):
            found.append((len(keep), i, keep))
    found.sort(key=lambda item: (item[0], item[1]))
    modules = []
    for _, i, keep in found:
        candidate = _sub_module(mod, func, bindings, keep, bindings[i].var)
        if candidate is not None:
            modules.append(candidate)
    return modules


def _bindings(mod: tvm.IRModule) -> list | None:
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return None
    func = mod["main"]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return None
    blocks = list(func.body.blocks)
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        return None
    return list(blocks[0].bindings)


def _cone(bindings: list, index: dict, root: int) -> list[int]:
    """Indices of the bindings ``bindings[root]`` reads, transitively, and itself."""
    keep, stack = {root}, [root]
    while stack:
        for var in vars_read(bindings[stack.pop()].value):
            i = index.get(C.handle(var))
            if i is not None and i not in keep:
                keep.add(i)
                stack.append(i)
    return sorted(keep)


def _sub_module(mod: tvm.IRModule, func: relax.Function, bindings: list, keep: list[int],
                result: Any) -> tvm.IRModule | None:
    kept = [bindings[i] for i in keep]
    read = {C.handle(v) for b in kept for v in vars_read(b.value)}
    params = [p for p in func.params if C.handle(p) in read]
    output = relax.Var("gv", result.ty)
    block = relax.DataflowBlock([*kept, relax.VarBinding(output, result)])
    try:
        new_func = relax.Function(params, relax.SeqExpr([block], output), output.ty,
                                  func.is_pure, func.attrs)
        new_func = relax.BlockBuilder().normalize(new_func)
    except Exception as err:  # a cone whose symbolic sizes no parameter defines
        log.debug("shrink: cone not expressible (%s)", err)
        return None
    functions = dict(mod.functions.items())
    functions[mod.get_global_var("main")] = new_func
    candidate = C.copy_module(mod, functions)
    try:
        if not relax.analysis.check_well_formed(candidate):
            return None
    except Exception:  # the checker gives up on some malformed IR
        return None
    return candidate
