"""The global functions a pass adds to a module, deduplicated and named as TVM's BlockBuilder does.

``BlockBuilder.add_func(func, name)`` returns the ``GlobalVar`` of a structurally equal
function already in the module, or adds ``func`` under a fresh name: ``name`` with dots
turned into underscores, then ``name1``, ``name2``, ... (TVM's ``NameSupply``), skipping
names the module already uses.  ``FuseOpsByPattern`` adds every composite that way, so
patternkit must name and share composites exactly so to give the same module.

It cannot use ``add_func`` itself and stay linear: TVM's deduplication map hashes a
function *without* the data of its constants, so the composites that differ only in
their weights (one ``matmul`` + bias per layer with ``bind_constants=True``) all land in
one bucket, and each new one is compared with every earlier one.  On this machine 200,
400 and 800 ``add``-with-a-constant functions that differ only in the constant took
0.85, 3.2 and 13.6 s to add (0.015 and 0.041 s for 400 and 800 that differ in shape);
here they take 0.014, 0.032 and 0.039 s.  The hash used here includes the constants'
data (``tvm_ffi.structural_hash``), so functions with equal hashes are (almost always)
equal, and the module is built once at the end.

Only the functions that can equal an added one are indexed: a function added here
carries an identifying attribute (``Composite``, ``Codegen``), and structural equality
compares attributes, so a function of the module without it never equals one.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from ...ir import compat as C
from ...ir.kinds import attr


class FunctionTable:
    """The functions of ``mod`` carrying attribute ``marker``, and those added since.

    Parameters
    ----------
    mod : tvm.IRModule
        Read, never modified; :meth:`module` builds the result.
    marker : str
        The attribute every added function carries (``"Composite"``).
    """

    def __init__(self, mod: tvm.IRModule, marker: str):
        self.marker = marker
        self.names = {gv.name_hint for gv in mod.get_global_vars()}
        self.counters: dict[str, int] = {}  # TVM's NameSupply: base name -> last suffix
        self.by_hash: dict[int, list[tuple[Any, tvm.ir.GlobalVar]]] = {}
        self.added: list[tuple[tvm.ir.GlobalVar, relax.Function]] = []
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function) and attr(func, marker) is not None:
                self.by_hash.setdefault(C.structural_hash(func), []).append((func, gv))

    def add(self, func: relax.Function, name: str) -> tvm.ir.GlobalVar:
        """``BlockBuilder.add_func(func, name)``: the ``GlobalVar`` that now holds ``func``."""
        if attr(func, self.marker) is None:
            raise ValueError(f"FunctionTable: a function added here must carry "
                             f"'{self.marker}'")
        bucket = self.by_hash.setdefault(C.structural_hash(func), [])
        equal = [gv for other, gv in bucket if C.structural_equal(other, func)]
        if equal:  # TVM returns the first name in lexicographic order
            return min(equal, key=lambda gv: gv.name_hint)
        fresh = self._fresh(name)
        while fresh in self.names:
            fresh = self._fresh(name)
        gv = C.typed_global_var(fresh, func)
        self.names.add(fresh)
        bucket.append((func, gv))
        self.added.append((gv, func))
        return gv

    def module(self, mod: tvm.IRModule, updates: dict) -> tvm.IRModule:
        """``mod`` with the functions in ``updates`` (GlobalVar -> function) replaced and
        the added functions appended, in the order they were added.
        """
        functions = {gv: updates.get(gv, func) for gv, func in mod.functions.items()}
        functions.update(self.added)
        return C.copy_module(mod, functions)

    def _fresh(self, name: str) -> str:
        """The next name TVM's ``NameSupply.FreshName(name)`` gives."""
        name = name.replace(".", "_")
        if name not in self.counters:
            self.counters[name] = 0
            return name
        candidate = name
        while candidate in self.counters:
            self.counters[name] += 1
            candidate = f"{name}{self.counters[name]}"
        self.counters[candidate] = 0
        return candidate


__all__ = ["FunctionTable"]
