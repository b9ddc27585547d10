"""Repeated layers drawn once: find the layer a function repeats and fold the copies.

A transformer's entry function is one block repeated per layer; drawn whole it is too
big for a layout, and the copies add nothing.  :func:`find_repeat` describes each
binding structurally (what it computes: the op, or the called function's kind and
structural hash, and *where its arguments come from*, as distances back to the
bindings that made them, so that two layers match only if they are wired alike) and
finds the period whose copies cover the most bindings in a row.  An argument matches
its copy when it comes from the same distance back *or* from the same value, since every
layer reads some values made once before them (a transformer's attention mask).
:func:`fold_repeats` keeps the first copy and what comes before and after, rewiring the
bindings after the repeats to the first copy's values, and says how many copies there were.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..ir import compat as C
from ..ir.kinds import cluster_kind
from ..ir.walk import substitute

#: Fewer bindings per copy than this is a repeated op, not a layer.
MIN_PERIOD = 4


@dataclass(frozen=True)
class Repeat:
    """``count`` copies of ``period`` bindings from binding ``start`` of a block."""

    block: int
    start: int
    period: int
    count: int


def _what(binding, mod: tvm.IRModule | None) -> tuple[tuple, tuple]:
    """What a binding computes (op, callee, projection...) and the arguments it reads."""
    value = binding.value
    if isinstance(value, relax.Call):
        op = value.op
        if isinstance(op, tvm.ir.GlobalVar) and mod is not None and op in mod.functions:
            return ("call", cluster_kind(mod[op]), tvm_ffi.structural_hash(mod[op], True)), \
                tuple(value.args)
        return ("op", C.op_name(value) or type(op).__name__), tuple(value.args)
    if isinstance(value, relax.TupleGetItem):
        return ("item", int(value.index)), (value.tuple_value,)
    if isinstance(value, relax.Tuple):
        return ("tuple", len(value.fields)), tuple(value.fields)
    return ("other", type(value).__name__), ()


def _encode(bindings, mod):
    """Per binding: an op code, and per argument its distance back and its source.

    Two bindings ``p`` apart are copies when they compute the same thing and each
    argument comes from the same distance back (the layer's own values, and the previous
    layer's output) *or* from the very same value (what every layer reads: the attention
    mask, a parameter).  Arguments that are not bound in the block (constants, shapes)
    match by kind.
    """
    n = len(bindings)
    position: dict = {}
    codes: dict = {}
    whats, arg_lists = [], []
    for i, binding in enumerate(bindings):
        what, args = _what(binding, mod)
        whats.append(codes.setdefault((what, len(args)), len(codes)))
        arg_lists.append(args)
        position[binding.var] = i
    width = max((len(a) for a in arg_lists), default=0)
    distance = np.full((n, max(width, 1)), -1, dtype=np.int64)
    source = np.full((n, max(width, 1)), -1, dtype=np.int64)
    kinds: dict = {}
    for i, args in enumerate(arg_lists):
        for k, arg in enumerate(args):
            j = position.get(arg)
            if j is not None and j < i:
                distance[i, k], source[i, k] = i - j, j
            else:  # a parameter, a constant, a shape: the same leaf or the same kind
                key = arg if isinstance(arg, relax.Var) else type(arg).__name__
                code = kinds.setdefault(key, len(kinds))
                distance[i, k] = source[i, k] = -2 - code
    return np.asarray(whats), distance, source


def find_repeat(func: relax.Function, mod: tvm.IRModule | None = None) -> Repeat | None:
    """The period repeated over the most consecutive bindings of a block, or ``None``."""
    if not isinstance(func.body, relax.SeqExpr):
        return None
    best: Repeat | None = None
    best_codes: tuple = ()
    for b, block in enumerate(func.body.blocks):
        bindings = list(block.bindings)
        codes = whats, distance, source = _encode(bindings, mod)
        n = len(bindings)
        for p in range(MIN_PERIOD, n // 2 + 1):
            args_alike = ((distance[p:] == distance[:-p]) | (source[p:] == source[:-p])).all(1)
            alike = (whats[p:] == whats[:-p]) & args_alike
            same = np.concatenate(([False], alike, [False]))
            edges = np.flatnonzero(np.diff(same.astype(np.int8)))
            if not len(edges):
                continue
            runs = edges[1::2] - edges[::2]
            k = int(np.argmax(runs))
            run, start = int(runs[k]), int(edges[::2][k])
            count = (run + p) // p
            if count >= 2 and (best is None or count * p > best.count * best.period):
                best, best_codes = Repeat(b, start, p, count), codes
    return None if best is None else _aligned(best, *best_codes)


def _aligned(found: Repeat, whats, distance, source) -> Repeat:
    """``found`` moved back to where its copies begin, with the copy before it if alike.

    The first layer reads the model's input, which may be made several bindings before it
    (a transformer's attention mask is computed in between), where the others read the
    layer just before them; compared by distance it differs, and the repeat found starts
    part-way into it.  Here an argument read from before its own copy matches one read
    from before the other's (each layer's input), so the copies start at the first layer
    and count it.  The earliest start within one period back wins, one more copy first.
    """
    p = found.period
    for count in (found.count + 1, found.count):
        for start in range(max(0, found.start - p), found.start + 1):
            if start + count * p <= len(whats) and _copies_alike(
                    whats, distance, source, start, p, count):
                return Repeat(found.block, start, p, count)
    return found


def _copies_alike(whats, distance, source, start: int, period: int, count: int) -> bool:
    """Whether ``count`` copies of ``period`` bindings from ``start`` compute alike."""
    j = np.arange(start, start + (count - 1) * period)
    k = j + period
    if not (whats[j] == whats[k]).all():
        return False
    first = (start + (j - start) // period * period)[:, None]  # where j's copy begins
    same = (distance[j] == distance[k]) | (source[j] == source[k])
    inputs = ((source[j] >= 0) & (source[j] < first)
              & (source[k] >= 0) & (source[k] < first + period))
    return bool((same | inputs).all())


def fold_repeats(mod: tvm.IRModule, func_name: str = "main") -> tuple[tvm.IRModule, str]:
    """``(mod with func_name's repeats folded to one copy, a note saying so)``.

    The result is for drawing only: it keeps the first copy's bindings and rewires what
    follows the repeats to them, so it computes something else.  ``mod`` is unchanged;
    with nothing repeated, ``(mod, "")``.
    """
    func = mod[func_name]
    found = find_repeat(func, mod)
    if found is None:
        return mod, ""
    blocks = list(func.body.blocks)
    bindings = list(blocks[found.block].bindings)
    first_end = found.start + found.period
    end = found.start + found.count * found.period
    mapping = {bindings[j].var: bindings[found.start + (j - found.start) % found.period].var
               for j in range(first_end, end)}
    kept = bindings[:first_end] + [
        _rebound(b, mapping) for b in bindings[end:]]
    new_blocks = []
    for i, block in enumerate(blocks):
        if i < found.block:
            new_blocks.append(block)
        elif i == found.block:
            new_blocks.append(type(block)(kept))
        else:
            new_blocks.append(type(block)([_rebound(b, mapping) for b in block.bindings]))
    body = substitute(func.body.body, mapping)
    folded = relax.Function(func.params, relax.SeqExpr(new_blocks, body), func.ret_ty,
                            func.is_pure, func.attrs)
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    out[func_name] = folded
    note = (f"; a layer of {found.period} bindings repeated x{found.count} is drawn once "
            f"(from {C.var_name(bindings[found.start].var)})")
    return out, note


def _rebound(binding, mapping: dict):
    value = substitute(binding.value, mapping)
    if isinstance(binding, relax.MatchCast):
        return relax.MatchCast(binding.var, value, binding.ty)
    return relax.VarBinding(binding.var, value)
