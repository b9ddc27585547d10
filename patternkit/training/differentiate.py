"""``gradient``: ``relax.transform.Gradient`` on real models, fused ops expanded first.

Relax 0.27's ``Gradient`` differentiates 52 of 230 ops, and a model imported from torch or
ONNX calls ``nn.batch_norm``, ``nn.layer_norm``, ``nn.gelu``, ``nn.rms_norm`` ...; it
then fails with an internal check.  :func:`gradient` expands those ops first: the
library's expand rules (``patternkit.patterns.EXPANSIONS``: ``batchnorm.expand`` keeps each
call's own ``training`` flag), then TVM's ``DecomposeOpsForTraining`` for what the rules
leave (a ``layer_norm`` that ``layernorm.expand`` refuses), and this package's own
expansions (:mod:`.pooling`: ``adaptive_avg_pool2d`` as a mean or a pool); it registers
gradients for ``erf`` and ``rsqrt``, which the expansions use and Relax lacks; and it
names every op that remains undifferentiable before ``Gradient`` runs, with the reason an
expand rule gave for leaving it.

The returned module holds the user's functions unchanged (the primal ``main`` keeps its
fused ops) plus ``<func>_adjoint``, which ``Gradient`` builds from the expanded copy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import tvm
from tvm import relax

from ..dpl.pattern import is_op, wildcard
from ..engine import RewriteLog, RewriteRule, RuleSet, reject, rewrite
from ..errors import GradientError
from ..ir import type_of
from ..ir.dtypes import is_float_dtype
from ..patterns import EXPANSIONS, LIBRARY
from .forward import Restoration, restore_fused_forward
from .ops import ensure_extra_gradients, ops_without_gradient
from .pooling import TRAINING_EXPANSIONS

logger = logging.getLogger(__name__)

#: Attribute of the adjoint function: the parameter names its gradients are for, in order.
WRT_ATTR = "patternkit.wrt"


@dataclass
class GradientReport:
    """What :func:`gradient` did: pass one in (``report=GradientReport()``) to read it.

    Attributes
    ----------
    expanded : dict of str to int
        Ops without a gradient that were expanded, with their number of calls.
    expansion_log : RewriteLog
        The expand rules' rewrites, binding by binding.
    decomposed_by_tvm : bool
        Whether ``DecomposeOpsForTraining`` was needed after the rules.
    collapsed : RewriteLog or None
        With ``collapse_forward=True``: the collapses applied to the adjoint function.
    restored : Restoration or None
        With ``collapse_forward=True``: the fused ops whose forward value the adjoint
        computes with the user's call again, and why any was left written out.
    """

    expanded: dict[str, int] = field(default_factory=dict)
    expansion_log: RewriteLog = field(default_factory=RewriteLog)
    decomposed_by_tvm: bool = False
    collapsed: RewriteLog | None = None
    restored: Restoration | None = None


def gradient(mod: tvm.IRModule, func: str = "main", wrt: Sequence[str] | None = None, *,
             expansions: Any = None, collapse_forward: bool = False,
             collapse_rules: Any = None, report: GradientReport | None = None) -> tvm.IRModule:
    """Differentiate ``mod[func]``'s scalar result w.r.t. the parameters named in ``wrt``.

    Parameters
    ----------
    mod : tvm.IRModule
        Never modified.  ``mod[func]`` must return a scalar (0-d) tensor, the loss; see
        :func:`with_loss` to reduce an output to one.
    func : str
        The function to differentiate; the result adds ``func + "_adjoint"``.
    wrt : sequence of str, optional
        Parameter names to differentiate with respect to; default: every parameter.
    expansions : RuleSet or rules, optional
        Expand rules for ops without a gradient; default the library's ``EXPANSIONS``.
    collapse_forward : bool
        Give the adjoint's primal half its fused ops back: the forward value of every op
        that was expanded is computed by the user's own fused call again, and of its
        expansion only the interior the backward half reads is kept
        (:func:`~.forward.restore_fused_forward`); then the collapse rules
        (``collapse_rules``, default the library's rewrite rules) run on the adjoint for
        what is left written out and read by nothing else.  The cost: each restored op
        computes its value fused *and* the part of its expansion that the backward reads
        (a layer norm's mean and standard deviation, a GELU's erf polynomial), so the
        forward does somewhat more arithmetic than the expanded one, for the same saved
        activations; the gain is the fused kernels in the forward and a primal half that
        reads as the model.  ``benchmarks/README.md`` has the figures (a GELU MLP, a
        2-layer GPT-2).  The gradients are those of the expanded form either way.
    report : GradientReport, optional
        Filled with what was expanded and collapsed.

    Raises
    ------
    GradientError
        ``func`` is missing, a ``wrt`` name is not a parameter, the result is not a
        scalar, or an op has neither a gradient nor an expansion (each named, with the
        bindings that call it).  ``mod`` is left as it was.
    """
    report = report if report is not None else GradientReport()
    target = _function(mod, func)
    params = _wrt_params(target, func, wrt)
    _require_scalar_loss(target, func)

    expanded = expand_for_gradient(target, func, expansions, report)
    _require_one_dataflow_block(expanded, func)
    remaining = ops_without_gradient(expanded, func, wrt=[p.name for p in params])
    if remaining:
        why = _refusals(expanded, report.expansion_log)
        lines = [f"{op} ({len(sites)}x, e.g. {sites[0]}{why.get(op, '')})"
                 for op, sites in sorted(remaining.items())]
        raise GradientError(f"{func}: no gradient and no expansion for: " + "; ".join(lines))

    expanded = rewrite([_TAKE_WITH_FLAT_INDICES], expanded)
    by_name = {p.name: p for p in expanded.params}
    single = tvm.IRModule({func: expanded})
    try:
        with_adjoint = relax.transform.Gradient(func, [by_name[p.name] for p in params])(single)
    except Exception as err:  # a TVM error from inside the pass
        hint = ("; TVM 0.27's Gradient fails so on a function whose shapes compute with a "
                "symbolic dimension: bind it first (Function.bind_symbolic_vars)"
                if relax.analysis.tir_vars_in_type(expanded.ret_ty) or any(
                    relax.analysis.tir_vars_in_type(p.ty) for p in expanded.params) else "")
        raise GradientError(f"{func}: relax.transform.Gradient failed: {type(err).__name__}: "
                            f"{str(err).strip().splitlines()[-1]}{hint}") from err
    adjoint_name = func + "_adjoint"
    adjoint = with_adjoint[adjoint_name]
    if collapse_forward:
        report.restored = Restoration()
        adjoint = restore_fused_forward(target, expanded, adjoint, report.restored)
        report.collapsed = RewriteLog()
        adjoint = rewrite(_rules(collapse_rules, LIBRARY).rewrite_rules(), adjoint,
                          log=report.collapsed)
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    adjoint = adjoint.with_attr("global_symbol", adjoint_name)
    out[adjoint_name] = adjoint.with_attr(WRT_ATTR, [p.name for p in params])
    logger.info("%s: expanded %s; differentiated w.r.t. %s", func, report.expanded or "nothing",
                [p.name for p in params])
    return out


def with_loss(mod: tvm.IRModule, func: str = "main", reduce: str = "sum",
              name: str | None = None) -> tvm.IRModule:
    """A copy of ``mod`` plus ``name`` (default ``func + "_loss"``): ``reduce(func(...))``.

    The usual test loss (the ``sum`` of the output, whose gradient seed is ``ones_like``,
    as in the Relay-era tests) for a model that returns one tensor.  The new function is
    ``func`` with one more binding at the end of its dataflow block.
    """
    target = _function(mod, func)
    reducer = {"sum": relax.op.sum, "mean": relax.op.mean}.get(reduce)
    if reducer is None:
        raise GradientError(f"with_loss: reduce must be 'sum' or 'mean', found {reduce!r}")
    ret = type_of(target.body)
    if not isinstance(ret, relax.TensorType):
        raise GradientError(f"with_loss: {func} returns {ret}, not one tensor")
    copy = relax.utils.copy_with_new_vars(target)
    body = copy.body
    loss = relax.Var("loss", relax.TensorType((), ret.dtype))
    binding = relax.VarBinding(loss, reducer(body.body))
    blocks = list(body.blocks)
    if blocks and isinstance(blocks[-1], relax.DataflowBlock):
        blocks[-1] = relax.DataflowBlock(list(blocks[-1].bindings) + [binding])
    else:
        blocks.append(relax.DataflowBlock([binding]))
    loss_name = name or func + "_loss"
    loss_func = relax.Function(copy.params, relax.SeqExpr(blocks, loss),
                               relax.TensorType((), ret.dtype), copy.is_pure,
                               copy.attrs).with_attr("global_symbol", loss_name)
    out = tvm.IRModule(dict(mod.functions))
    out[loss_name] = loss_func
    return relax.transform.Normalize()(out)


def _function(mod: tvm.IRModule, func: str) -> relax.Function:
    if not isinstance(mod, tvm.IRModule):
        raise GradientError(f"expected a tvm.IRModule, found {type(mod).__name__}")
    names = [gv.name_hint for gv in mod.get_global_vars()]
    if func not in names:
        raise GradientError(f"the module has no function {func!r} (it has {sorted(names)})")
    target = mod[func]
    if not isinstance(target, relax.Function):
        raise GradientError(f"{func} is not a Relax function")
    return target


def _wrt_params(target: relax.Function, func: str, wrt: Sequence[str] | None) -> list:
    params = list(target.params)
    if wrt is None:
        return params
    if isinstance(wrt, str):
        wrt = [wrt]
    by_name = {p.name: p for p in params}
    unknown = [name for name in wrt if name not in by_name]
    if unknown:
        raise GradientError(f"{func}: wrt names {unknown} are not parameters "
                            f"(parameters: {list(by_name)})")
    return [by_name[name] for name in wrt]


def _require_scalar_loss(target: relax.Function, func: str) -> None:
    ret = type_of(target.body)
    if isinstance(ret, relax.TensorType) and ret.ndim == 0:
        return
    raise GradientError(f"{func} must return a scalar loss (a 0-d tensor), found {ret}; "
                        "reduce the output first, e.g. with patternkit.training.with_loss")


def _rules(rules: Any, default: RuleSet) -> RuleSet:
    if rules is None:
        return default
    return rules if isinstance(rules, RuleSet) else RuleSet(rules)


def expand_for_gradient(target: relax.Function, func: str = "main", expansions: Any = None,
                        report: GradientReport | None = None) -> relax.Function:
    """``target`` with every op that lacks a gradient expanded, where a rule or TVM can.

    The expand rules run first (``expansions``, default the library's, and this
    package's own, :data:`~.pooling.TRAINING_EXPANSIONS`, always), then TVM's
    ``DecomposeOpsForTraining`` if an op it decomposes is left; ops that remain are left
    in place (:func:`gradient` names them).
    """
    report = report if report is not None else GradientReport()
    ensure_extra_gradients()
    missing = ops_without_gradient(target, func)
    if not missing:
        return target
    report.expanded = {op: len(sites) for op, sites in missing.items()}
    # Expansions grow the graph by design (a batch norm becomes ten bindings) and end by
    # construction (what they emit holds no op they match), so no growth bound applies.
    rules = _rules(expansions, EXPANSIONS) | RuleSet(TRAINING_EXPANSIONS)
    expanded = rewrite(rules, target, log=report.expansion_log, max_growth=None)
    still = ops_without_gradient(expanded, func)
    if any(op in still for op in _TVM_DECOMPOSES):
        single = relax.transform.DecomposeOpsForTraining()(tvm.IRModule({func: expanded}))
        expanded = single[func]
        report.decomposed_by_tvm = True
        still = ops_without_gradient(expanded, func)
    report.expanded = {op: n for op, n in report.expanded.items() if op not in still}
    return expanded


def _refusals(func: relax.Function, log: RewriteLog) -> dict[str, str]:
    """``": <rule> refused: <reason>"`` per op, for the first binding of it an expand rule
    refused (what :func:`gradient`'s error quotes after the binding).
    """
    by_root = {skip.root: skip for skip in log.skipped if skip.rule}
    out: dict[str, str] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value, skip = binding.value, by_root.get(binding.var.name)
            if skip is None or not isinstance(value, relax.Call):
                continue
            if isinstance(value.op, tvm.ir.Op):
                out.setdefault(value.op.name, f": {skip.rule} refused: {skip.reason}")
    return out


#: Ops TVM's ``DecomposeOpsForTraining`` writes out.  It also decomposes ``batch_norm``, with
#: batch statistics whatever the call's ``training`` flag; ``batchnorm.expand`` runs first,
#: so no batch norm is left for it.
_TVM_DECOMPOSES = ("relax.nn.layer_norm",)


class _TakeWithFlatIndices(RewriteRule):
    """``take(table, ids, axis=0)`` with ``ids`` of rank > 1, as a take of the flattened
    ids reshaped back: TVM 0.27 legalises the gradient of ``take`` (``take_backward``) for
    1-d indices only ("indices in take must be 1-dim Tensor"), and TVM's ONNX importer
    takes an embedding with the ``(batch, seq)`` ids themselves.
    """

    name = "training.take_flat_indices"

    def __init__(self):
        super().__init__()
        self.table, self.ids = wildcard(), wildcard()
        self.pattern = is_op("take")(self.table, self.ids)

    def check(self, match):
        """Accept a take along axis 0 of a float table by ids of known rank-2+ shape."""
        table_ty, ids_ty = type_of(match.table), type_of(match.ids)
        attrs = match.root.attrs
        if (not isinstance(table_ty, relax.TensorType) or not isinstance(ids_ty, relax.TensorType)
                or table_ty.shape is None or ids_ty.shape is None):
            return reject("the table or the ids have no known shape", at=match.root)
        if ids_ty.ndim < 2:
            return reject("the ids are already 1-d, as take's gradient wants them",
                          at=match.ids)
        if attrs.axis is None or int(attrs.axis) != 0 or not is_float_dtype(table_ty.dtype):
            return reject("not an embedding: a take along another axis than 0, or of a "
                          "table that is not floating-point", at=match.root)
        return True

    def rewrite(self, match):
        """The take of the flattened ids, reshaped back to ``ids.shape + table.shape[1:]``."""
        table_ty, ids_ty = type_of(match.table), type_of(match.ids)
        attrs = match.root.attrs
        count = 1
        for dim in ids_ty.shape:
            count = count * dim
        rows = relax.op.take(match.table, relax.op.reshape(match.ids, relax.ShapeExpr([count])),
                             axis=0, mode=attrs.mode)
        return relax.op.reshape(rows, relax.ShapeExpr(list(ids_ty.shape)
                                                      + list(table_ty.shape)[1:]))


_TAKE_WITH_FLAT_INDICES = _TakeWithFlatIndices()


def _require_one_dataflow_block(func: relax.Function, name: str) -> None:
    blocks = func.body.blocks
    if len(blocks) == 1 and isinstance(blocks[0], relax.DataflowBlock):
        return
    raise GradientError(f"{name}: relax.transform.Gradient needs the body as one dataflow "
                        f"block, found {len(blocks)} block(s); run "
                        "relax.transform.ConvertToDataflow first")
