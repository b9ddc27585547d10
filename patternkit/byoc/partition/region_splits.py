"""Which composites region merging kept apart from their neighbours to avoid a cycle.

``PartitionGraph`` (``MergeCompositeFunctions``) merges composites of one compiler that
feed each other into one external function, unless the merged function would depend on
itself: ``a = relu(x)`` and ``b = add(a, exp(a))`` with ``relu`` and ``add`` offloaded and
``exp`` on the host cannot be one region, since the region would both produce ``a`` for
``exp`` and wait for ``exp``'s result.  The coverage report names the composites this
happened to and the host path that forced it.

To know which region each composite went to, every composite call site gets its own
copy of its function marked with :data:`SITE` before partitioning (``FuseOpsByPattern``
shares equal composites between call sites); the mark travels with the function into
its region.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from ...ir import compat as C
from ...ir.kinds import CODEGEN, COMPOSITE, attr
from ...ir.rebuild import make_block, rebuild_function
from ...ir.targets import rewritable_functions
from ...ir.walk import vars_read

#: Attribute numbering the composite call sites while the coverage partitions a module.
SITE = "patternkit.CoverageSite"


@dataclass
class Site:
    """A call of a composite in the module ``MergeComposite`` made."""

    function: str
    var: Any  # the Var the call binds
    composite: str  # the entry name
    region: str | None = None  # its region, "<compiler> region <k>" (see assign_regions)
    split: str | None = None  # why it is not in the region it reads from


def mark_sites(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[Site]]:
    """``mod`` with one marked copy of the composite function per call site, and the sites.

    A global composite (TVM's form, shared by equal call sites) gets a marked copy per
    call; a local one (Relay's form: one per match) is marked where it is bound.
    """
    sites: list[Site] = []
    functions = dict(mod.functions.items())
    for gv, func in rewritable_functions(mod):
        local: dict[int, tuple[int, int]] = {}  # local composite's Var -> (block, position)
        blocks: list[list] = []
        changed = False
        for bi, block in enumerate(C.array_items(func.body.blocks)):
            bindings: list = []
            blocks.append(bindings)
            for binding in C.array_items(block.bindings):
                value = binding.value
                if isinstance(value, relax.Function) and attr(value, COMPOSITE) is not None:
                    local[C.handle(binding.var)] = (bi, len(bindings))
                elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
                    callee = mod[value.op]
                    if isinstance(callee, relax.Function) and attr(callee, COMPOSITE):
                        marked = callee.with_attr(SITE, len(sites))
                        new_gv = C.typed_global_var(f"{value.op.name_hint}_site{len(sites)}",
                                                    marked)
                        functions[new_gv] = marked
                        sites.append(Site(gv.name_hint, binding.var, str(callee.attrs[COMPOSITE])))
                        binding = relax.VarBinding(binding.var, relax.Call(
                            new_gv, value.args, value.attrs, value.ty_args, value.span,
                            ret_ty=value.ty))
                        changed = True
                elif isinstance(value, relax.Call) and C.handle(value.op) in local:
                    at_block, at = local.pop(C.handle(value.op))  # later calls share the mark
                    bound = blocks[at_block][at]
                    marked = bound.value.with_attr(SITE, len(sites))
                    blocks[at_block][at] = relax.VarBinding(bound.var, marked)
                    sites.append(Site(gv.name_hint, binding.var, str(marked.attrs[COMPOSITE])))
                    changed = True
                bindings.append(binding)
        if changed:
            old = C.array_items(func.body.blocks)
            functions[gv] = rebuild_function(func, [
                make_block(b, isinstance(o, relax.DataflowBlock), o.span)
                for b, o in zip(blocks, old)])
    return C.copy_module(mod, functions), sites


def assign_regions(partitioned: tvm.IRModule, sites: list[Site]) -> None:
    """Set ``site.region`` from the marks found inside the external functions.

    Regions are named ``"<compiler> region <k>"``, numbered in the order the host code
    first calls them: the external functions' own names come from the marked copies,
    not from what ``PartitionGraph`` names them on the unmarked module.
    """
    labels: dict[str, str] = {}
    for _, caller in rewritable_functions(partitioned):
        for block in C.array_items(caller.body.blocks):
            for binding in C.array_items(block.bindings):
                value = binding.value
                if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)):
                    continue
                func = partitioned[value.op]
                codegen = attr(func, CODEGEN) if isinstance(func, relax.Function) else None
                if codegen is None or value.op.name_hint in labels:
                    continue
                label = labels[value.op.name_hint] = f"{codegen} region {len(labels) + 1}"
                for site in _marks(partitioned, func):
                    sites[site].region = label


def _marks(mod: tvm.IRModule, func: relax.Function) -> list[int]:
    out = []
    for block in C.array_items(func.body.blocks):
        for binding in C.array_items(block.bindings):
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
                value = mod[value.op]
            if isinstance(value, relax.Function):
                mark = attr(value, SITE)
                if mark is not None:
                    out.append(int(mark))
    return out


def find_splits(marked: tvm.IRModule, sites: list[Site]) -> None:
    """Set ``site.split`` on each site kept out of the region of a site it reads directly.

    Two sites of one compiler where one reads the other's result are in different
    regions only if merging them would make a cycle: some other path leads from the
    first to the second, through host code or another region.  That path is looked for
    (bindings in block order are a topological order) and named in the reason.
    """
    by_function: dict[str, list[Site]] = {}
    for site in sites:
        by_function.setdefault(site.function, []).append(site)
    for gv, func in rewritable_functions(marked):
        mine = by_function.get(gv.name_hint)
        if mine:
            _find_splits_in(func, mine)


def _find_splits_in(func: relax.Function, sites: list[Site]) -> None:
    bindings = [b for block in C.array_items(func.body.blocks)
                for b in C.array_items(block.bindings)]
    site_of = {C.handle(s.var): s for s in sites}
    producer: dict[int, Site] = dict(site_of)  # Var -> the site whose result it is
    for b in bindings:
        if isinstance(b.value, relax.TupleGetItem):
            source = producer.get(C.handle(b.value.tuple_value))
            if source is not None:
                producer[C.handle(b.var)] = source
    for position, b in enumerate(bindings):
        reader = site_of.get(C.handle(b.var))
        if reader is None or reader.region is None or reader.split is not None:
            continue
        for read in vars_read(b.value):
            source = producer.get(C.handle(read))
            if (source is None or source.region is None or source.region == reader.region
                    or _compiler(source) != _compiler(reader)):
                continue
            via = _path_around(bindings[:position], producer, source, reader, b.value)
            if via is not None:
                reader.split = (f"region merging split it off from '{source.region}' to "
                                f"avoid a cycle (it reads '{C.var_name(source.var)}' both "
                                f"directly and through '{via}')")
                break


def _compiler(site: Site) -> str:
    return site.composite.split(".", 1)[0]


def _path_around(before: list, producer: dict, source: Site, reader: Site,
                 value: Any) -> str | None:
    """The first binding outside both regions on a path from ``source`` into ``value``."""
    regions = {source.region, reader.region}
    start = {key for key, site in producer.items() if site is source}
    first: dict[int, str] = {}  # a Var reached from source -> first binding on the way
    for b in before:
        key = C.handle(b.var)
        site = producer.get(key)
        if site is not None and site.region in regions:
            continue
        for read in vars_read(b.value):
            r = C.handle(read)
            if r in start or r in first:
                first[key] = first.get(r, C.var_name(b.var))
                break
    return next((first[C.handle(v)] for v in vars_read(value) if C.handle(v) in first), None)


__all__ = ["SITE", "Site", "mark_sites", "assign_regions", "find_splits"]
