"""``graph_split``: cut a function into consecutive, runnable subgraph modules.

Relay users split a model for pipelined execution with
``graph_split(mod["main"], [{"op_name": "add", "op_index": 0}, ...])``: the graph is cut
right after the ``op_index``-th call (counting from 0, in program order) of ``op_name``,
and every piece becomes a module of its own.  The same on Relax:

* the function's bindings are taken in program order and cut after each split point,
  so ``n`` split points give ``n + 1`` modules (``n`` when nothing but aliases and
  tuple plumbing follows the last split point: those stay with the last piece);
* piece ``k``'s ``main`` takes, in order, the values computed by earlier pieces that it
  reads (named after the original variables) and then the original parameters it reads;
* it returns every value it computes that a later piece (or the original result)
  needs: one tensor when there is one, otherwise a tuple.  The names of the returned
  values are kept in the ``main`` attribute ``"split_outputs"``, which chains the pieces
  when they run.

Running the pieces builds them, which is the verification layer's job:
:func:`~patternkit.verification.split_run.run_split` does it.

Op names may be spelled the Relay way (``"add"``, ``"nn.conv2d"``) or the Relax way.
Limitations: functions with symbolic shapes whose variables are only defined by an
earlier piece, and ``If`` bindings, are not split (the piece would not be well formed);
an error names the split entry.
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm
from tvm import relax

from ..errors import MalformedIRError, PatternkitError
from ..ir import compat as C
from ..ir.opnames import relax_op_name
from ..ir.walk import substitute

SPLIT_OUTPUTS = "split_outputs"
SPLIT_INPUTS = "split_function_params"


class GraphSplitError(PatternkitError, ValueError):
    """A split configuration entry cannot be applied (the message names the entry)."""


def _split_points(bindings: list[Any], split_conf: Sequence[dict[str, Any]]) -> list[int]:
    """The binding index after which each entry of ``split_conf`` cuts, in order."""
    points: list[int] = []
    for i, conf in enumerate(split_conf):
        if not isinstance(conf, dict) or "op_name" not in conf or "op_index" not in conf:
            raise GraphSplitError(f"split entry {i} must be a dict with 'op_name' and "
                                  f"'op_index', found {conf!r}")
        try:
            name = relax_op_name(conf["op_name"])
        except PatternkitError as err:
            raise GraphSplitError(f"split entry {i} ({conf!r}): {err}") from err
        want = int(conf["op_index"])
        seen = -1
        position = None
        for j, binding in enumerate(bindings):
            if C.op_name(binding.value) == name:
                seen += 1
                if seen == want:
                    position = j
                    break
        if position is None:
            raise GraphSplitError(f"split entry {i} ({conf!r}): the function has only "
                                  f"{seen + 1} call(s) of {name}")
        if points and position <= points[-1]:
            raise GraphSplitError(f"split entry {i} ({conf!r}) is not after the previous "
                                  f"split point; list split points in program order")
        points.append(position)
    return points


def graph_split(func: Any, split_conf: Sequence[dict[str, Any]]) -> list[tvm.IRModule]:
    """Cut ``func`` after each split point; see the module docstring.

    Parameters
    ----------
    func : relax.Function or tvm.IRModule (its ``main``)
    split_conf : list of ``{"op_name": str, "op_index": int}``

    Returns
    -------
    list of tvm.IRModule
        Consecutive pieces, each well formed and buildable.
    """
    if isinstance(func, tvm.IRModule):
        func = func["main"]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        raise MalformedIRError(f"graph_split expects a relax.Function, found {type(func).__name__}")
    bindings = [b for block in C.array_items(func.body.blocks)
                for b in C.array_items(block.bindings)]
    for b in bindings:
        if isinstance(b.value, (relax.If, relax.Function)):
            raise MalformedIRError(f"graph_split: binding '{C.var_name(b.var)}' holds a "
                                   f"{type(b.value).__name__}; inline or lift it first")
    points = _split_points(bindings, split_conf)
    bounds = [0] + [p + 1 for p in points]
    if bounds[-1] < len(bindings):
        tail = bindings[bounds[-1]:]
        if any(isinstance(b.value, relax.Call) for b in tail):
            bounds.append(len(bindings))
        else:  # only aliases / tuple plumbing after the last cut: keep them with it
            bounds[-1] = len(bindings)
    result = func.body.body
    # For each var: which piece defines it; which pieces read it.
    defined_in: dict[int, int] = {}
    pieces = [bindings[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1)]
    for k, piece in enumerate(pieces):
        for b in piece:
            defined_in[C.handle(b.var)] = k
    needed_after: dict[int, int] = {}  # var handle -> last piece that reads it
    reads_of: list[list[Any]] = []
    for k, piece in enumerate(pieces):
        reads = []
        for b in piece:
            reads.extend(relax.analysis.free_vars(b.value))
        reads_of.append(reads)
        for v in reads:
            needed_after[C.handle(v)] = max(needed_after.get(C.handle(v), -1), k)
    final_reads = list(relax.analysis.free_vars(result))
    for v in final_reads:
        needed_after[C.handle(v)] = len(pieces)
    modules = []
    for k, piece in enumerate(pieces):
        modules.append(_build_piece(func, k, piece, reads_of[k], defined_in, needed_after,
                                    result if k == len(pieces) - 1 else None, len(pieces)))
    return modules


def _build_piece(func: Any, k: int, piece: list[Any], reads: list[Any],
                 defined_in: dict[int, int], needed_after: dict[int, int], result: Any,
                 n_pieces: int) -> tvm.IRModule:
    """Piece ``k`` as a module: its inputs are the Vars earlier pieces or ``func`` define,
    its outputs what later pieces read (``result`` for the last piece).
    """
    params: list[Any] = []
    mapping: dict[int, Any] = {}
    seen: set[int] = set()
    carried = [v for v in reads if defined_in.get(C.handle(v), k) < k]
    originals = [v for v in reads if C.handle(v) not in defined_in]
    for v in carried + [p for p in func.params if any(p.same_as(o) for o in originals)]:
        if C.handle(v) in seen:
            continue
        seen.add(C.handle(v))
        param = relax.Var(C.var_name(v), v.ty)
        params.append(param)
        mapping[C.handle(v)] = param
    if result is not None:
        outputs = [result]
    else:
        outputs = [b.var for b in piece if needed_after.get(C.handle(b.var), -1) > k]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            for b in piece:
                value = _bind(b.value, mapping)
                if isinstance(b, relax.MatchCast):
                    new = bb.match_cast(value, b.ty, C.var_name(b.var))
                else:
                    new = bb.emit(value, C.var_name(b.var))
                mapping[C.handle(b.var)] = new
            outs = [_bind(o, mapping) for o in outputs]
            out = outs[0] if len(outs) == 1 else relax.Tuple(outs)
            gv_out = bb.emit_output(out)
        bb.emit_func_output(gv_out)
    mod = bb.get()
    names = [C.var_name(o) if isinstance(o, relax.Var) else "result" for o in outputs]
    main = (mod["main"].with_attr(SPLIT_OUTPUTS, names)
            .with_attr(SPLIT_INPUTS, [C.var_name(p) for p in func.params]))
    mod = tvm.IRModule({mod.get_global_var("main"): main})
    if not relax.analysis.check_well_formed(mod):
        raise MalformedIRError(f"graph_split: piece {k} of {n_pieces} is not well formed "
                               f"(symbolic shapes defined in an earlier piece?)")
    return mod


def _bind(expr: Any, mapping: dict[int, Any]) -> Any:
    """``expr`` with the Vars whose handles are in ``mapping`` replaced (``bb.emit``
    types the result).
    """
    return substitute(expr, mapping, by_handle=True, keep_types=False) if mapping else expr


__all__ = ["graph_split", "GraphSplitError", "SPLIT_OUTPUTS", "SPLIT_INPUTS"]
