"""Emit a rewritten function: replacements normalised in place, dead bindings dropped.

The rewrite driver, ``partition`` and ``MergeComposite`` all end the same way: a map
from bound Vars to their new values becomes one new function.  Unchanged bindings are
re-emitted as they were, each replacement is checked to read only Vars in scope
(:func:`~patternkit.engine.wellformed.check_replacement_scope`) and normalised where it
stands (its nested calls become new bindings just before it), and the bindings the
replacements left without live readers are dropped
(:func:`~patternkit.engine.index.dead_after`).  One C++ normalisation of the whole
function at the end gives the new ``SeqExpr`` its type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tvm import relax

from ..dpl.constraints import type_matches
from ..errors import CallbackError
from ..ir import compat as C
from ..ir.rebuild import describe_binding, expr_text, make_block, rebuild_function
from .index import FunctionIndex, binding_key, dead_after, reads_of_value
from .known_types import KnownTypes
from .wellformed import check_replacement_scope


@dataclass(frozen=True)
class Emitted:
    """A rebuilt function and what its replacements became.

    ``added`` maps the handle of each replaced Var that was kept to the number of
    bindings its replacement was normalised into (1 for a plain call); ``bindings`` is
    the new function's binding count; ``keys`` the binding keys
    (:func:`~patternkit.engine.index.binding_key`) of its ``VarBinding`` bindings, which tell
    the next round whether a rule's root can occur in it without reading it again.
    """

    function: relax.Function
    added: dict[int, int]
    bindings: int
    keys: frozenset[str] = frozenset()


def emit_function(func: relax.Function, index: FunctionIndex, replacements: dict[int, Any],
                  rule_name: str, func_name: str) -> relax.Function:
    """Rebuild ``func`` with ``replacements``, dropping the bindings they made dead.

    ``replacements`` maps the handle (:func:`patternkit.ir.compat.handle`) of a bound Var
    to its new value; ``rule_name`` names the pass (``"partition"``) in errors.
    """
    return emit_rewrites(func, index, replacements, func_name, pass_name=rule_name).function


def emit_rewrites(func: relax.Function, index: FunctionIndex, replacements: dict[int, Any],
                  func_name: str, *, pass_name: str,
                  rule_of: Callable[[int], str] | None = None,
                  new_reads: dict[int, list[int]] | None = None,
                  normalized: dict[int, list[Any]] | None = None) -> Emitted:
    """:func:`emit_function` for replacements made by several rules.

    ``rule_of(handle)`` names the rule that made a replacement, for error messages
    (default: ``pass_name`` for all).  ``new_reads`` holds the
    :func:`~patternkit.engine.index.reads_of_value` of the replacements the caller has
    computed already.  Each replacement is normalised where it stands,
    so nested calls in it become new bindings right before it; everything else is
    re-emitted as it was.  ``normalized`` holds, for replacements the pass itself built
    typed (``MergeComposite``'s composite calls), the bindings their normalisation would
    give, which are emitted as they are (rules' replacements are always normalised and
    their types checked).

    Raises
    ------
    MalformedIRError
        A replacement reads a Var that is not in scope at the binding it replaces.
    CallbackError
        A replacement is not a valid Relax expression, or does not keep the binding's type.
    """
    rule_of = rule_of or (lambda _key: pass_name)
    normalized = normalized or {}
    new_reads = dict(new_reads or {})
    for key, value in replacements.items():
        reads = new_reads.get(key)
        if reads is None:
            reads = new_reads[key] = reads_of_value(value)
        owner = rule_of(key)
        check_replacement_scope(index, key, reads, pass_name,
                                "the pass itself" if owner == pass_name else f"rule {owner}",
                                func_name, value)
    dead = dead_after(index, replacements, new_reads)
    kept: dict[int, list[int]] = {}  # block -> positions of its kept replacements
    for key in replacements:
        if key not in dead:
            bi, j = index.position[key]
            kept.setdefault(bi, []).append(j)
    blocks = []
    added: dict[int, int] = {}
    new_keys: set[str] = set()
    count = 0
    for bi, (block, bindings, keys) in enumerate(zip(C.array_items(func.body.blocks),
                                                     index.blocks, index.keys)):
        is_dataflow = type(block) is relax.DataflowBlock
        replaced = [(bindings[j], replacements[keys[j][0]], rule_of(keys[j][0]))
                    for j in sorted(kept.get(bi, ()))  # in program order
                    if keys[j][0] not in normalized]
        segments = _normalize_replacements(replaced, is_dataflow, func_name)
        emitted = []
        for binding, (key, _) in zip(bindings, keys):
            if key in dead:
                continue
            if key in replacements:
                segment = normalized.get(key) or segments[key]
                emitted.extend(segment)
                added[key] = len(segment)
                new_keys.update(binding_key(b.value) for b in segment
                                if type(b) is relax.VarBinding)
            else:
                emitted.append(binding)
        if emitted:
            blocks.append(make_block(emitted, is_dataflow))
            count += len(emitted)
    return Emitted(rebuild_function(func, blocks), added, count,
                   frozenset(_kept_keys(index, replacements, dead) | new_keys))


def _kept_keys(index: FunctionIndex, replacements: dict[int, Any], dead: set[int]) -> set[str]:
    """The keys of the indexed ``VarBinding`` bindings the emission keeps as they were.

    Read off the index (no FFI): a key is kept when one of its bindings is neither
    replaced nor dropped, and the search for one usually stops at the first.
    """
    keys = index.keys
    kept = set()
    for key, positions in index.by_key.items():
        for bi, j in positions:
            handle = keys[bi][j][0]
            if handle not in replacements and handle not in dead:
                kept.add(key)
                break
    return kept


def _normalize_replacements(replaced: list[tuple[Any, Any, str]], is_dataflow: bool,
                            func_name: str) -> dict[int, list[Any]]:
    """Var handle -> the bindings replacing it: the value's nested calls, then the Var.

    All replacements of one block are normalised in one scratch block of a BlockBuilder
    (nested calls become bindings emitted just before the replaced Var), and the result
    is cut at each replaced Var: one FFI round trip per replacement, not four.
    """
    if not replaced:
        return {}
    bb = relax.BlockBuilder()
    known = KnownTypes(bb)
    targets = []
    with C.scratch_block(bb, dataflow=is_dataflow) as out:
        for binding, value, rule_name in replaced:
            var = binding.var  # read once (an FFI read each time)
            targets.append(C.handle(var))
            try:
                known.give_types(value, rule_name)  # a conv's type once per signature
                normalized = bb.normalize(value)
            except Exception as err:
                where = describe_binding(func_name, binding)
                raise CallbackError(f"rule {rule_name}: the replacement for '{where}' is not "
                                    f"a valid Relax expression: {err}", rule_name, where) from err
            expected = var.ty
            actual = C.type_of(normalized)
            if not C.structural_equal(actual, expected) and not type_matches(actual, expected):
                where = describe_binding(func_name, binding)
                raise CallbackError(
                    f"rule {rule_name}: the replacement has type {_type_line(actual)} but "
                    f"binding '{where}' has type {_type_line(expected)}; a rewrite must keep "
                    f"the binding's type ({_type_hint(actual, expected)})", rule_name, where)
            bb.emit_normalized(relax.VarBinding(var, normalized))
    if len(out) == len(targets):  # no nested calls: one binding per replacement, in order
        return {key: [new_binding] for key, new_binding in zip(targets, out)}
    segments: dict[int, list[Any]] = {}
    start = 0
    target_set = set(targets)
    for i, new_binding in enumerate(out):
        key = C.handle(new_binding.var)
        if key in target_set:
            segments[key] = out[start:i + 1]
            start = i + 1
    return segments


def _type_line(ty: Any) -> str:
    """A type on one line (a tuple's type prints over several), cut at 120 characters."""
    return expr_text(ty, 120)


def _type_hint(actual: Any, expected: Any) -> str:
    """What a rewrite usually forgot, from how the two types differ."""
    tensor = relax.TensorType
    if isinstance(actual, tensor) and isinstance(expected, tensor):
        if str(actual.dtype) != str(expected.dtype):
            if actual.ndim == expected.ndim:
                return f"did the rewrite forget an astype to {expected.dtype}?"
            return "the dtype and the rank differ"
        return "did the rewrite forget a reshape?"
    if isinstance(actual, relax.TupleType) and isinstance(expected, tensor):
        return "did the rewrite forget a [0] on a tuple?"
    return "did the rewrite forget a reshape or a [0] on a tuple?"
