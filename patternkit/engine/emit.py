"""Emit a rewritten function: replacements normalised in place, dead bindings dropped.

The rewrite driver, ``partition`` and ``MergeComposite`` all end the same way: a map
from bound Vars to their new values becomes one new function.  Unchanged bindings are
re-emitted as they were, each replacement is normalised where it stands (its nested
calls become new bindings just before it), and the bindings the replacements left
without readers are dropped (:func:`~patternkit.engine.index.dead_after`).  One C++
normalisation of the whole function at the end gives the new ``SeqExpr`` its type.
"""

from __future__ import annotations

from typing import Any

from tvm import relax

from ..dpl.constraints import type_matches
from ..errors import CallbackError
from ..ir import compat as C
from ..ir.rebuild import describe_binding, make_block, rebuild_function
from .index import FunctionIndex, dead_after


def emit_function(func: relax.Function, index: FunctionIndex, replacements: dict[int, Any],
                  rule_name: str, func_name: str) -> relax.Function:
    """Rebuild ``func`` with ``replacements``, dropping the bindings they made dead.

    ``replacements`` maps the handle (:func:`patternkit.ir.compat.handle`) of a bound Var
    to its new value.

    Each replacement is normalised where it stands, so nested calls in it become new
    bindings right before it; everything else is re-emitted as it was.
    """
    dead = dead_after(index, replacements)
    blocks = []
    for block, bindings, keys in zip(C.array_items(func.body.blocks), index.blocks, index.keys):
        is_dataflow = type(block) is relax.DataflowBlock
        replaced = [(binding, replacements[key]) for binding, (key, _) in zip(bindings, keys)
                    if key in replacements and key not in dead]
        segments = _normalize_replacements(replaced, is_dataflow, rule_name, func_name)
        emitted = []
        for binding, (key, _) in zip(bindings, keys):
            if key in dead:
                continue
            if key in replacements:
                emitted.extend(segments[key])
            else:
                emitted.append(binding)
        if emitted:
            blocks.append(make_block(emitted, is_dataflow))
    return rebuild_function(func, blocks)


def _normalize_replacements(replaced: list, is_dataflow: bool, rule_name: str,
                            func_name: str) -> dict[int, list]:
    """Var handle -> the bindings replacing it: the value's nested calls, then the Var.

    All replacements of one block are normalised in one scratch block of a BlockBuilder
    (nested calls become bindings emitted just before the replaced Var), and the result
    is cut at each replaced Var: one FFI round trip per replacement, not four.
    """
    if not replaced:
        return {}
    bb = relax.BlockBuilder()
    with C.scratch_block(bb, dataflow=is_dataflow) as out:
        for binding, value in replaced:
            try:
                normalized = bb.normalize(value)
            except Exception as err:
                where = describe_binding(func_name, binding)
                raise CallbackError(f"rule {rule_name}: the replacement for '{where}' is not "
                                    f"a valid Relax expression: {err}", rule_name, where) from err
            expected = binding.var.ty
            actual = C.type_of(normalized)
            if not C.structural_equal(actual, expected) and not type_matches(actual, expected):
                where = describe_binding(func_name, binding)
                raise CallbackError(
                    f"rule {rule_name}: the replacement has type {actual} but binding "
                    f"'{where}' has type {expected}; a rewrite must keep the binding's type "
                    f"(did the callback forget a reshape or a [0] on a tuple?)", rule_name, where)
            bb.emit_normalized(relax.VarBinding(binding.var, normalized))
    segments: dict[int, list] = {}
    start = 0
    targets = {C.handle(binding.var) for binding, _ in replaced}
    for i, new_binding in enumerate(out):
        key = C.handle(new_binding.var)
        if key in targets:
            segments[key] = out[start:i + 1]
            start = i + 1
    return segments
