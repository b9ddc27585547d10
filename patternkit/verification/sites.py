"""Per-site translation validation: every rewrite checked where it happened.

A whole-model comparison on random weights is a weak oracle on its own: an error made in
one layer attenuates through the rest, saturates in a softmax, or vanishes into outputs
that are all zero.  So each rewrite of a run (each record of a
:class:`~patternkit.engine.driver.RewriteLog`) is checked on its own: the region the rule
matched (its bindings, reading the values it read as parameters) and the replacement the
rule wrote (reading the same values) are cut out of the function as it was when the rule
ran, as two small Relax functions with the same parameters, built for ``llvm`` and run
side by side on

* **the values the real model feeds the site**: the entry function is run once on the
  job's inputs with every site's inputs as extra outputs (one build for all sites);
* **adversarial draws** from the site's types: uniform in [-1, 1] and in [0.5, 1.5] (the
  domain of a square root or a logarithm), wide values (+-1e4 in float32, +-1e2 in 16-bit
  floats), zeros; each again with every symbolic dimension bound to 1; and where a region
  adds an input before a softmax (an attention mask), rows of it that are all ``-inf``.

Tensor constants the region reads (weights, norm scales) become parameters too, fed their
own values in every draw: a rule's guard may depend on them (an exponent of exactly 2),
and identical layers then cut out as identical functions.  Sites that are identical up to
structure (same rule, same region, same types: a 12-layer model has one per layer kind)
are built once and run on every duplicate's real values; all sites of a run build as one
module (the job builds it with the model before and after: :func:`plan_sites` cuts the
sites out first, :mod:`patternkit.verification.joint` builds them all at once).

A site may read tensors whose shapes use a symbolic size only inside an expression (the
``4 * s`` windows of a shifted-window attention over a batch of ``s``): TVM's VM cannot
read ``s`` off such a shape, so the site's functions take it as a last ``R.Shape([s])``
parameter.  On the model's own values it is read off the model's inputs (where ``s``
stands alone) or solved from the shapes of the site's inputs; each adversarial draw
passes the sizes it was drawn with.

The judgement (:func:`judge`) is elementwise ``|got - ref| <= rtol * |ref| + atol * scale``,
with ``scale`` the reference's root mean square: a 1 % error fails wherever it happens,
and a value near zero is judged against its tensor's own scale, not against an absolute
``atol``.  Reference elements that are not finite are no evidence (a rewrite may avoid an
overflow the written-out form had), a result that is not finite where the reference is
fails, and a draw whose reference is all zero, constant or subnormal (its scale below the
dtype's smallest normal number, where rounding is all there is) cannot pass a site (it can
still fail it: such a reference is judged against ``atol`` alone).  A site none of whose
draws gave evidence is ``not_run``, with the reason: never
``pass``.  Where a draw misses and the caller can widen a function to float64
(``widen=``), both sides are measured against the widened region: the rewrite may round
differently than the code it replaced, not worse.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from ..engine.driver import RewriteLog, RewriteRecord
from ..engine.tolerance import Tolerance, default_tolerance
from ..errors import tvm_error_line
from ..ir import compat as C
from ..ir.walk import substitute, vars_read
from . import numeric

__all__ = ["Site", "SitePlan", "SiteReport", "plan_sites", "validate_sites", "judge",
           "Judgement"]

#: How much further from the float64 region the rewritten one may be (as the job's
#: whole-model arbitration, :mod:`patternkit.app.precision`).
SLACK = 2.0

#: The half-width of the "wide" draw, per float width: far outside the [-1, 1] of the
#: usual draw, where a constant dropped or an epsilon changed shows, but inside what the
#: dtype can square without overflowing everywhere.
WIDE = {"float16": 1e2, "bfloat16": 1e2, "float32": 1e4, "float64": 1e4}


# -- the judgement ------------------------------------------------------------------------
@dataclass(frozen=True)
class Judgement:
    """One draw's verdict: ``"pass"``, ``"fail"`` or ``"inconclusive"``, and why."""

    verdict: str
    max_abs_error: float
    max_rel_error: float
    reason: str = ""


def judge(ref: Sequence[np.ndarray], got: Sequence[np.ndarray], rtol: float,
          atol: float) -> Judgement:
    """Compare one draw's outputs; see the module docstring for the rule."""
    if len(ref) != len(got):
        return Judgement("fail", math.inf, math.inf,
                         f"{len(got)} output(s) where the region gives {len(ref)}")
    worst_abs = worst_rel = 0.0
    degenerate = []
    failed = ""
    for position, (r, g) in enumerate(zip(ref, got)):
        if r.shape != g.shape:
            return Judgement("fail", math.inf, math.inf,
                             f"output {position} has shape {g.shape}, the region's {r.shape}")
        r64, g64 = np.asarray(r, "float64"), np.asarray(g, "float64")
        finite = np.isfinite(r64)
        lost = finite & ~np.isfinite(g64)
        if lost.any():
            return Judgement("fail", math.inf, math.inf,
                             f"{int(lost.sum())} value(s) not finite where the region's are")
        values = r64[finite]
        if values.size == 0:
            degenerate.append("no finite value")
            continue
        diff = np.abs(r64 - g64)[finite]
        scale = float(np.sqrt(np.mean(values ** 2)))
        worst_abs = max(worst_abs, float(diff.max()))
        worst_rel = max(worst_rel, float(diff.max()) / scale if scale else
                        (0.0 if not diff.any() else math.inf))
        smallest = _smallest_normal(r.dtype)
        if scale == 0.0 or float(np.ptp(values)) == 0.0 or scale < smallest:
            degenerate.append("all zero" if scale == 0.0 else
                              f"constant ({values.flat[0]:.3g})" if float(np.ptp(values)) == 0.0
                              else f"subnormal (scale {scale:.3g}, below {r.dtype}'s smallest "
                                   f"normal number {smallest:.3g}: rounding there is noise)")
            bound = atol + rtol * np.abs(values)  # judged absolutely: there is no scale
        else:
            bound = rtol * np.abs(values) + atol * scale
        over = diff > bound
        if over.any() and not failed:
            k = int(np.argmax(diff - bound))
            failed = (f"{int(over.sum())} of {diff.size} value(s) off, worst {diff[k]:.3g} "
                      f"at a reference value {values[k]:.3g} (bound {bound[k]:.3g}, scale "
                      f"{scale:.3g})")
    if failed:
        return Judgement("fail", worst_abs, worst_rel, failed)
    if degenerate:
        return Judgement("inconclusive", worst_abs, worst_rel,
                         "the region's output is " + ", ".join(degenerate))
    return Judgement("pass", worst_abs, worst_rel)


def _smallest_normal(dtype: Any) -> float:
    """The smallest normal number of a float dtype (``ml_dtypes``' bfloat16 too); 0 for
    any other: below it a tensor's scale is made of subnormals, where every operation
    rounds to a few bits and a correct rewrite differs from the code it replaced.
    """
    try:
        return float(np.finfo(dtype).tiny)
    except (TypeError, ValueError):
        try:
            import ml_dtypes

            return float(ml_dtypes.finfo(dtype).tiny)
        except (ImportError, TypeError, ValueError):
            return 0.0


# -- the report ---------------------------------------------------------------------------
@dataclass
class Site:
    """One validated site (and the identical sites validated with it)."""

    rule: str
    function: str
    binding: str
    status: str  # "pass", "fail" or "not_run"
    reason: str = ""
    #: The draws that ran, each with its verdict: ``"real values: pass"``.
    inputs: list[str] = field(default_factory=list)
    max_abs_error: float = math.nan
    max_rel_error: float = math.nan
    tolerance: str = ""
    #: Bindings of the sites identical to this one, validated with it.
    duplicates: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        where = f"{self.rule} at {self.function}:{self.binding}"
        if self.status == "not_run":
            return f"NOT RUN {where}: {self.reason}"
        figures = (f"max abs error {self.max_abs_error:.3g}, max rel error "
                   f"{self.max_rel_error:.3g}")
        if self.status == "fail":
            return f"FAIL {where}: {self.reason} ({figures})"
        return f"pass {where} ({figures}; {len(self.inputs)} draw(s))"


@dataclass
class SiteReport:
    """What :func:`validate_sites` found: one :class:`Site` per distinct site."""

    sites: list[Site] = field(default_factory=list)
    #: Builds the validation took (one for the real values, one or a few for the sites).
    builds: int = 0

    @property
    def ok(self) -> bool:
        """No site failed (a site that could not run is not a failure)."""
        return not self.failures

    @property
    def failures(self) -> list[Site]:
        """The sites whose numbers did not match."""
        return [s for s in self.sites if s.status == "fail"]

    def by_rule(self) -> dict[str, dict[str, int]]:
        """Rule -> ``{"sites", "validated", "failed", "not_run"}``, duplicates counted."""
        out: dict[str, dict[str, int]] = {}
        for site in self.sites:
            row = out.setdefault(site.rule, {"sites": 0, "validated": 0, "failed": 0,
                                             "not_run": 0})
            n = 1 + len(site.duplicates)
            row["sites"] += n
            row[{"pass": "validated", "fail": "failed", "not_run": "not_run"}[site.status]] += n
        return out

    def summary_lines(self) -> list[str]:
        """``rule: N sites, M validated, K failed`` per rule."""
        lines = []
        for rule, row in self.by_rule().items():
            line = (f"{rule}: {row['sites']} site(s), {row['validated']} validated, "
                    f"{row['failed']} failed")
            if row["not_run"]:
                line += f", {row['not_run']} not run"
            lines.append(line)
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The report as plain Python data (what :meth:`to_json` serialises)."""
        return {"ok": self.ok, "builds": self.builds, "by_rule": self.by_rule(),
                "sites": [asdict(s) for s in self.sites]}

    def to_json(self) -> str:
        """The report as indented JSON."""
        return json.dumps(self.to_dict(), indent=1)

    def __str__(self) -> str:
        return "\n".join(self.summary_lines() + [str(s) for s in self.sites
                                                  if s.status != "pass"])


# -- cutting a site out -------------------------------------------------------------------
@dataclass
class _Region:
    """A site cut out: the matched region and its replacement as functions."""

    record: RewriteRecord
    inputs: list  # per parameter: the Var or tensor constant of the source it stands for
    before: relax.Function
    after: relax.Function
    key: int
    #: The symbolic sizes both functions take as a trailing ``R.Shape`` parameter
    #: (:func:`_carried_sizes`); empty for most sites.
    sizes: list = field(default_factory=list)


class _Bindings:
    """The bindings of one source function by Var handle: ``(position, binding, dataflow)``."""

    def __init__(self, func: relax.Function):
        self.by_var: dict[int, tuple[int, Any, bool]] = {}
        position = 0
        for block in func.body.blocks:
            dataflow = isinstance(block, relax.DataflowBlock)
            for binding in block.bindings:
                self.by_var[C.handle(binding.var)] = (position, binding, dataflow)
                position += 1


def _tensor_constants(expr: Any) -> list:
    """Tensor constants of rank 1 and more in ``expr`` (scalars stay in the structure)."""
    found: list = []
    relax.analysis.post_order_visit(
        expr, lambda e: found.append(e) if isinstance(e, tvm.ir.GenericConst)
        and len(e.value.shape) > 0 else None)
    return found


def _bindings_of(func: relax.Function, cache: dict[int, _Bindings]) -> _Bindings:
    found = cache.get(id(func))
    if found is None:
        found = cache[id(func)] = _Bindings(func)
    return found


def _cut(record: RewriteRecord, cache: dict[int, _Bindings]) -> _Region | str:
    """The region of ``record`` and its replacement, or why they cannot be cut out."""
    source = record.source
    if source is None or (record.replacement is None and record.result is None):
        return "the rewrite's region is not recorded"
    bindings = _bindings_of(source, cache)
    if record.replacement is None:  # a multi-root rule: no single replacement
        cut = _cut_result(record, bindings, cache)
        if isinstance(cut, str):
            return cut
        outputs, after_bindings = cut
        before_bindings = _slice(bindings, outputs, _inputs_of(after_bindings))
        if isinstance(before_bindings, str):
            return before_bindings
        return _region(record, bindings, outputs, before_bindings, after_bindings)
    region = []
    for var in record.replaced_vars:
        found = bindings.by_var.get(C.handle(var))
        if found is None:
            return f"binding {C.var_name(var)} is not in function {record.function}"
        position, binding, dataflow = found
        why = _unsupported(binding, dataflow)
        if why:
            return why
        region.append((position, binding))
    region.sort(key=lambda item: item[0])
    before_bindings = [(b.var, b.value) for _, b in region]
    after_bindings = before_bindings[:-1] + [(record.root_var, record.replacement)]
    return _region(record, bindings, [record.root_var], before_bindings, after_bindings)


def _region(record: RewriteRecord, bindings: _Bindings, outputs: list, before_bindings: list,
            after_bindings: list) -> _Region | str:
    """The two sides as functions of the inputs they read (see :func:`_shared_views`)."""
    shared = _shared_views(bindings, _inputs_of(before_bindings, after_bindings))
    before_bindings, after_bindings = shared + before_bindings, shared + after_bindings
    inputs = _inputs_of(before_bindings, after_bindings)
    if isinstance(inputs, str):
        return inputs
    sizes = _carried_sizes(inputs)
    try:
        before = _site_function(before_bindings, inputs, outputs, sizes)
        after = _site_function(after_bindings, inputs, outputs, sizes)
    except Exception as err:  # e.g. a symbolic size no parameter defines
        return f"the region does not stand alone as a function: {tvm_error_line(err)}"
    key = hash((C.structural_hash(before), C.structural_hash(after)))
    return _Region(record, inputs, before, after, key, sizes)


#: Operators that only change how a value is viewed: inputs that are such views of one
#: value are cut out with the views, so that the draws keep them equal.
VIEWS = frozenset({"relax.reshape", "relax.permute_dims", "relax.expand_dims",
                   "relax.squeeze", "relax.flatten", "relax.astype", "relax.broadcast_to"})


def _shared_views(source: _Bindings, inputs: list | str) -> list:
    """The view bindings (:data:`VIEWS`) through which two or more inputs of a region read
    one value, in program order.

    A rule may rely on two of its inputs being the same value seen twice (the ONNX
    importer reshapes ``x`` once per projection, and ``matmul.combine_parallel`` proves
    the reshapes equal): drawn as independent parameters they would differ, and the
    rewrite would look wrong where it is not.  Cut with their views, they read the one
    value they share.
    """
    if isinstance(inputs, str):
        return []
    chains: dict[int, list] = {}  # input handle -> its view bindings, nearest first
    roots: dict[int, list[int]] = {}  # the value viewed -> inputs viewing it
    for leaf in inputs:
        if not isinstance(leaf, relax.Var):
            continue
        chain, key = [], C.handle(leaf)
        while True:
            found = source.by_var.get(key)
            if found is None or not found[2] or C.op_name(found[1].value) not in VIEWS:
                break
            chain.append(found)
            key = C.handle(C.call_args(found[1].value)[0])
        roots.setdefault(key, []).append(C.handle(leaf))
        chains[C.handle(leaf)] = chain
    taken: dict[int, tuple[int, Any]] = {}
    for root, viewers in roots.items():
        if len(viewers) < 2 and not (viewers and root in {C.handle(x) for x in inputs
                                                            if isinstance(x, relax.Var)}
                                     and chains[viewers[0]]):
            continue
        for viewer in viewers:
            for position, binding, _ in chains[viewer]:
                taken[C.handle(binding.var)] = (position, binding)
    ordered = sorted(taken.values(), key=lambda item: item[0])
    return [(b.var, b.value) for _, b in ordered]


def _unsupported(binding: Any, dataflow: bool) -> str:
    name = C.var_name(binding.var)
    if not isinstance(binding, relax.VarBinding):
        return f"binding {name} is a match_cast"
    if not dataflow:
        return f"binding {name} is outside a dataflow block"
    if not C.is_pure_value(binding.value):
        return f"binding {name} calls an impure function"
    return ""


def _cut_result(record: RewriteRecord, source: _Bindings, cache: dict[int, _Bindings]
                ) -> tuple[list, list] | str:
    """``(outputs, bindings)`` of a multi-root rewrite in the function it emitted: the
    replaced Vars still bound there, and every binding they read that the source did not
    have (the new values), back to Vars the source had.
    """
    result = _bindings_of(record.result, cache)
    outputs = [v for v in record.replaced_vars if C.handle(v) in result.by_var]
    if not outputs:
        return "the rewrite kept none of the Vars it replaced"
    replaced = {C.handle(v) for v in record.replaced_vars}
    # a value the source computes the same way (not replaced) is an input
    found = _walk_back(result, outputs, lambda key: key in source.by_var and key not in replaced)
    return found if isinstance(found, str) else (outputs, found)


def _slice(source: _Bindings, outputs: list, inputs: list | str) -> list | str:
    """The source's bindings that compute ``outputs`` from ``inputs``, in program order:
    what a multi-root rule replaced, as the source computed it.
    """
    if isinstance(inputs, str):
        return inputs
    stop = {C.handle(x) for x in inputs} - {C.handle(v) for v in outputs}
    return _walk_back(source, outputs, stop.__contains__)


def _walk_back(bindings: _Bindings, outputs: list, is_input: Callable[[int], bool]
               ) -> list | str:
    """The bindings ``outputs`` are computed by, back to the Vars ``is_input`` (a handle
    predicate) names and to parameters, in program order; or why one cannot be cut out.
    """
    taken: dict[int, tuple[int, Any]] = {}
    stack = list(outputs)
    while stack:
        key = C.handle(stack.pop())
        found = bindings.by_var.get(key)
        if key in taken or found is None or is_input(key):
            continue
        position, binding, dataflow = found
        why = _unsupported(binding, dataflow)
        if why:
            return why
        taken[key] = (position, binding)
        stack.extend(vars_read(binding.value))
    ordered = sorted(taken.values(), key=lambda item: item[0])
    return [(b.var, b.value) for _, b in ordered]


def _inputs_of(*sides: list) -> list | str:
    """The Vars and tensor constants the bindings of ``sides`` read but do not bind."""
    inside = {C.handle(var) for side in sides for var, _ in side}
    inputs: list = []
    seen: set[int] = set()
    for side in sides:
        for _, value in side:
            for leaf in [*vars_read(value), *_tensor_constants(value)]:
                key = C.handle(leaf)
                if key in inside or key in seen:
                    continue
                seen.add(key)
                if isinstance(leaf, relax.Var) and not isinstance(leaf.ty, relax.TensorType):
                    return (f"it reads {C.var_name(leaf)}, of type {leaf.ty}: only tensors can "
                            f"be drawn")
                inputs.append(leaf)
    return inputs


def _site_function(bindings: list, inputs: list, outputs: list, sizes: Sequence = ()
                   ) -> relax.Function:
    """``bindings`` as a function of ``inputs`` returning ``outputs`` (a tuple of them
    when there are several); with ``sizes``, a last parameter ``R.Shape([sizes])``.
    """
    params = [relax.Var(C.var_name(x) if isinstance(x, relax.Var) else f"const{i}", x.ty)
              for i, x in enumerate(inputs)]
    mapping = {C.handle(x): p for x, p in zip(inputs, params)}
    if sizes:
        params.append(relax.Var(SIZES, relax.ShapeType(list(sizes))))
    bb = relax.BlockBuilder()
    with bb.function("site", params):
        with bb.dataflow():
            for var, value in bindings:
                mapping[C.handle(var)] = bb.emit(
                    substitute(value, mapping, by_handle=True, keep_types=False))
            results = [mapping[C.handle(v)] for v in outputs]
            out = bb.emit_output(results[0] if len(results) == 1 else relax.Tuple(results))
        bb.emit_func_output(out)
    return bb.get()["site"]


#: The name of the parameter that carries a site's sizes (:func:`_carried_sizes`).
SIZES = "sizes"


def _carried_sizes(inputs: list) -> list:
    """The symbolic sizes the inputs' shapes use only inside expressions, in order.

    A shifted-window attention reads tensors of ``4 * s`` windows and none of ``s``:
    TVM's VM reads a size off a parameter's shape only where it stands alone, so a site
    function of those inputs does not build.  It takes these sizes as one more parameter
    (:func:`_size_arguments`), valued per draw (:func:`_draws`).
    """
    bare: set[str] = set()
    used: dict[str, Any] = {}
    for x in inputs:
        for dim in C.static_shape(x.ty) or ():
            if tvm.ir.is_prim_var(dim):
                bare.add(dim.name)
        for size in relax.analysis.tir_vars_in_type(x.ty):
            used.setdefault(size.name, size)
    return [size for name, size in used.items() if name not in bare]


def _solved_sizes(func: relax.Function, arrays: Sequence[np.ndarray], known: dict[str, int]
                  ) -> dict[str, int]:
    """``known`` (sizes read off bare dimensions) and every size a dimension of a parameter
    of ``func`` determines from the shape of its array in ``arrays``.

    A dimension that is an expression of one unknown size, affine in it (``4 * s``,
    ``s * 16 + 1``), gives that size; the value is kept only when the expression gives
    the array's size back, so an expression it does not fit leaves the size unknown.
    """
    sizes = dict(known)
    pending = [(dim, int(size)) for param, array in zip(func.params, arrays)
               for dim, size in zip(C.static_shape(param.ty) or (), np.shape(array))
               if not isinstance(dim, int) and not tvm.ir.is_prim_var(dim)]
    progress = True
    while progress:
        progress = False
        for dim, size in pending:
            unknown = [v for v in tvm.tirx.analysis.undefined_vars(dim) if v.name not in sizes]
            if len(unknown) == 1:
                value = _solve(dim, unknown[0], size, sizes)
                if value is not None:
                    sizes[unknown[0].name] = value
                    progress = True
    return sizes


def _solve(dim: Any, size_var: Any, size: int, known: Mapping[str, int]) -> int | None:
    """The value of ``size_var`` that makes ``dim`` equal ``size``, or ``None``."""
    def at(value: int) -> int | None:
        analyzer = C.Analyzer()
        for v in tvm.tirx.analysis.undefined_vars(dim):
            bound = value if v.same_as(size_var) else known.get(v.name)
            if bound is None:
                return None
            analyzer.bind(v, tvm.tirx.const(bound, str(v.ty.dtype)))
        found = analyzer.simplify(dim)
        return int(found) if isinstance(found, tvm.tirx.IntImm) else None

    zero, one = at(0), at(1)
    if zero is None or one is None or one == zero or (size - zero) % (one - zero):
        return None
    value = (size - zero) // (one - zero)
    return value if value >= 0 and at(value) == size else None


def _size_arguments(region: _Region, sizes: Mapping[str, int]) -> list:
    """The arguments a site's functions take after its tensors: the sizes it carries
    (:func:`_carried_sizes`) valued from ``sizes`` (a draw's), or nothing.

    Raises :class:`ValueError` naming a size ``sizes`` does not value.
    """
    if not region.sizes:
        return []
    missing = [v.name for v in region.sizes if v.name not in sizes]
    if missing:
        raise ValueError(f"the size(s) {', '.join(missing)} cannot be read off the model's "
                         "values or the shapes of the inputs")
    return [tvm.runtime.ShapeTuple([sizes[v.name] for v in region.sizes])]


# -- the values the real model feeds each site --------------------------------------------
#: The name of the entry function's copy that returns the sites' inputs.
PROBE = "__patternkit_site_inputs"


@dataclass
class _Probe:
    """The entry function rebuilt to return the values every site reads.

    Its dataflow blocks become plain blocks (a dataflow Var is invisible outside its
    block) and every wanted Var bound in it is its result; it builds in the same module as
    the sites, so reading the model's own values costs no build of its own.
    """

    function: relax.Function | None
    captured: list[int]  # handles of the Vars it returns, in order
    params: dict[int, int]  # handle of a parameter of the entry -> its position
    note: str = ""


def _probe(mod: tvm.IRModule, func_name: str, wanted: list) -> _Probe:
    func = mod[func_name]
    params = {C.handle(p): i for i, p in enumerate(func.params)}
    mapping: dict[int, Any] = {}
    blocks = []
    bound: dict[int, Any] = {}
    for block in func.body.blocks:
        new_bindings = []
        for binding in block.bindings:
            var = binding.var
            if isinstance(var, relax.DataflowVar):
                new_var = mapping[C.handle(var)] = relax.Var(C.var_name(var), var.ty)
            else:
                new_var = var
            value = substitute(binding.value, mapping, by_handle=True)
            if isinstance(binding, relax.MatchCast):
                new_bindings.append(relax.MatchCast(new_var, value, binding.ty))
            else:
                new_bindings.append(relax.VarBinding(new_var, value))
            bound[C.handle(var)] = new_var
        blocks.append(relax.BindingBlock(new_bindings))
    captured = [k for k in dict.fromkeys(C.handle(v) for v in wanted)
                if k in bound and k not in params and isinstance(bound[k].ty, relax.TensorType)]
    if not captured:
        return _Probe(None, [], params)
    try:
        result = relax.Tuple([bound[k] for k in captured])
        probe = relax.Function(func.params, relax.SeqExpr(blocks, result),
                               relax.TupleType([bound[k].ty for k in captured]), func.is_pure,
                               func.attrs)
        probe = relax.BlockBuilder().normalize(probe).with_attr("global_symbol", PROBE)
    except Exception as err:  # noqa: BLE001 - the sites still get their adversarial draws
        return _Probe(None, [], params, "the model's own values could not be read: "
                                        f"{tvm_error_line(err)}")
    return _Probe(probe, captured, params)


def _read_values(probe: _Probe, vm: Any, inputs: list[np.ndarray]
                 ) -> tuple[dict[int, np.ndarray], str]:
    """``({handle: value}, why not)`` of the wanted Vars on the model's own inputs."""
    values = {k: inputs[i] for k, i in probe.params.items()}
    if probe.function is None:
        return values, probe.note
    try:
        outputs = numeric.flatten(vm[PROBE](*[C.to_tensor(a) for a in inputs]))
    except Exception as err:  # noqa: BLE001
        return values, f"the model's own values could not be read: {tvm_error_line(err)}"
    values.update(zip(probe.captured, outputs))
    return values, ""


# -- the draws ----------------------------------------------------------------------------
def _symbolic_sizes(func: relax.Function, arrays: Sequence[np.ndarray] | None) -> dict[str, int]:
    """Symbolic dimension name -> size, read off ``arrays`` (the site's real values)."""
    sizes: dict[str, int] = {}
    if arrays is None:
        return sizes
    for param, array in zip(func.params, arrays):
        shape = C.static_shape(param.ty) or ()
        for dim, size in zip(shape, np.shape(array)):
            if tvm.ir.is_prim_var(dim):
                sizes.setdefault(dim.name, int(size))
    return sizes


def _draws(region: _Region, real: list[tuple[str, list[np.ndarray]]], seed: int,
           model_sizes: Mapping[str, int] | None = None
           ) -> list[tuple[str, list[np.ndarray], dict[str, int]]]:
    """``(label, inputs, sizes)`` per draw: the real values first, then the adversarial
    ones; ``sizes`` values the symbolic sizes of the draw (what a site that carries sizes,
    :func:`_carried_sizes`, is passed).

    The real values' sizes are ``model_sizes`` (read off the model's own inputs) and what
    the shapes of the site's inputs give (:func:`_solved_sizes`); the adversarial draws
    keep the first real draw's sizes (or bind every size to 1).
    """
    func = region.before
    constants = {i: x.value.numpy() for i, x in enumerate(region.inputs)
                 if isinstance(x, tvm.ir.GenericConst)}
    sizes = _symbolic_sizes(func, real[0][1] if real else None)
    draws = [(label, arrays, _real_sizes(region, arrays, model_sizes))
             for label, arrays in real]
    if region.sizes and real:
        sizes = {**draws[0][2], **sizes}
    symbolic = {v.name for p in func.params for v in relax.analysis.tir_vars_in_type(p.ty)}
    dtypes = [C.dtype_of(p.ty) or "" for p in func.params]
    dtype = next((d for d in dtypes if d.startswith(("float", "bfloat"))), "float32")
    wide = WIDE.get(dtype, 1e4)
    shapes = [("", sizes)]
    if symbolic:
        shapes.append((", every symbolic dimension 1", {name: 1 for name in symbolic}))
    for suffix, shape_vars in shapes:
        for label, low, high in (("uniform [-1, 1]", -1.0, 1.0),
                                 ("uniform [0.5, 1.5]", 0.5, 1.5),  # a sqrt's or log's domain
                                 (f"wide [-{wide:g}, {wide:g}]", -wide, wide),
                                 ("zeros", 0.0, 0.0)):
            drawn_sizes = {name: shape_vars.get(name, numeric.DEFAULT_DIM)
                           for name in symbolic}
            try:
                arrays = _random_inputs(region, seed, drawn_sizes, low, high)
            except ValueError:
                continue
            for i, value in constants.items():
                arrays[i] = value
            if low == high == 0.0:
                arrays = [np.zeros_like(a) if i not in constants
                          and a.dtype.kind == "f" else a for i, a in enumerate(arrays)]
            draws.append((label + suffix, arrays, drawn_sizes))
    masks = _mask_params(func)
    if masks and len(draws) > len(real):
        _, base, base_sizes = draws[0]  # the first real draw, else the first drawn
        draws.append(("rows masked with -inf", _masked(base, masks), base_sizes))
    return draws


def _real_sizes(region: _Region, arrays: Sequence[np.ndarray],
                model_sizes: Mapping[str, int] | None) -> dict[str, int]:
    """The sizes of a site that carries sizes on its real values: the model's own
    (``model_sizes``), then what the shapes of ``arrays`` give; ``{}`` for another site.
    """
    if not region.sizes:
        return {}
    known = {**(model_sizes or {}), **_symbolic_sizes(region.before, arrays)}
    return _solved_sizes(region.before, arrays, known)


def _random_inputs(region: _Region, seed: int, sizes: dict[str, int], low: float,
                   high: float) -> list[np.ndarray]:
    """:func:`~patternkit.verification.numeric.random_inputs` for the inputs of
    ``region``, every symbolic size valued by ``sizes``.

    A site that carries sizes (:attr:`_Region.sizes`) is drawn from its function with
    every size bound, so that a dimension ``4 * s`` is drawn ``4 *`` the value ``s`` is
    passed with.
    """
    func = region.before
    if not region.sizes:
        return numeric.random_inputs(func, seed=seed, shape_vars=sizes, low=low, high=high)
    bound = func.bind_symbolic_vars(
        {v: sizes[v.name] for p in func.params for v in relax.analysis.tir_vars_in_type(p.ty)})
    tensors_only = relax.Function(bound.params[:len(region.inputs)], bound.body, bound.ret_ty,
                                  bound.is_pure, bound.attrs)  # drawn from, never built
    return numeric.random_inputs(tensors_only, seed=seed, low=low, high=high)


def _mask_params(func: relax.Function) -> list[int]:
    """Positions of the floating parameters added to something in a region with a softmax:
    an attention mask, whose rows may be entirely ``-inf`` (a padded sequence).
    """
    params = {C.handle(p): i for i, p in enumerate(func.params)
              if (C.dtype_of(p.ty) or "").startswith(("float", "bfloat"))}
    added: list[int] = []
    softmax = False
    for block in func.body.blocks:
        for binding in block.bindings:
            name = C.op_name(binding.value)
            softmax = softmax or name == "relax.nn.softmax"
            if name == "relax.add":
                added += [params[C.handle(a)] for a in C.call_args(binding.value)
                          if C.handle(a) in params]
    return sorted(set(added)) if softmax else []


def _masked(arrays: list[np.ndarray], masks: list[int]) -> list[np.ndarray]:
    """``arrays`` with, in each mask, the first row (last axis) all ``-inf`` and every other
    element of the last row ``-inf``: a fully padded sequence and a partly padded one.
    """
    out = [np.array(a, copy=True) for a in arrays]
    for i in masks:
        mask = out[i]
        if mask.ndim == 0 or mask.size == 0:
            continue
        rows = mask.reshape(-1, mask.shape[-1])
        rows[0] = -np.inf
        rows[-1, ::2] = -np.inf
    return out


# -- validation ---------------------------------------------------------------------------
def validate_sites(before: tvm.IRModule, after: tvm.IRModule | None, log: RewriteLog, *,
                   inputs: Sequence[np.ndarray] | None = None, seed: int = 0,
                   func_name: str | None = None, rules: Any = (),
                   tolerance: Callable[[str, str | None], Tolerance] | None = None,
                   widen: Callable[[relax.Function], relax.Function] | None = None,
                   plan: SitePlan | None = None, vm: Any = None) -> SiteReport:
    """Validate every rewrite ``log`` recorded; a :class:`SiteReport`.

    Parameters
    ----------
    before, after : IRModule
        The module the rewrite was given and what it returned (``after`` is not read: the
        log holds each site's region and replacement; it is accepted so that a call says
        what it validates).  Neither is modified.
    log : RewriteLog
        The log of the ``pk.rewrite`` call.
    inputs : arrays, optional
        One per parameter of ``func_name`` in ``before``: the sites of that function are
        also run on the values the model computes from them.
    func_name : str, optional
        The function ``inputs`` are for (default ``main``).
    rules : rules, optional
        The rules that made the rewrites (a RuleSet or a list): each site is held to its
        rule's ``tolerance(dtype)``.
    tolerance : callable, optional
        ``(rule name, dtype) -> Tolerance``, over ``rules``; default
        :func:`~patternkit.engine.tolerance.default_tolerance` for a rule not given.
    widen : callable, optional
        A site function -> the same function in float64, for the arbitration of a draw
        that misses (see the module docstring).
    plan, vm : optional
        :func:`plan_sites` of the same ``before`` and ``log`` (made with ``probe=True``
        when ``inputs`` are given) and a VM of a build holding ``plan.functions()``
        beside ``before``'s functions: nothing is built here then.
    """
    del after  # see the docstring: the log is the record of what changed
    func_name = func_name or "main"
    if plan is None:
        plan = plan_sites(before, log, func_name, probe=inputs is not None)
    by_name = {getattr(r, "rule_name", None) or getattr(r, "name", ""): r for r in rules}

    def tol_of(rule: str, dtype: str | None) -> Tolerance:
        if tolerance is not None:
            return tolerance(rule, dtype)
        found = by_name.get(rule)
        return found.tolerance(dtype) if found is not None else default_tolerance(dtype)

    report = SiteReport(sites=list(plan.unsplit))
    groups = plan.groups
    probe = plan.probe if inputs is not None else None
    if vm is not None:
        built = _Built(shared=vm, probe_vm=vm, builds=1)
    else:
        built = _build_all(groups, before, probe, func_name)
    report.builds += built.builds
    real_values: dict[int, np.ndarray] = {}
    capture_note = ""
    if probe is not None and inputs is not None:  # a probe is made only for inputs
        real_values, capture_note = _read_values(probe, built.probe_vm, list(inputs))
    model_sizes = _model_sizes(before, func_name, inputs, groups)
    for number, regions in enumerate(groups):
        first = regions[0]
        site_vm, why = built.vm_of(number)
        tol = tol_of(first.record.rule, C.dtype_of(first.before.ret_ty))
        site = Site(first.record.rule, first.record.function, first.record.root, "not_run",
                    tolerance=str(tol), duplicates=[r.record.root for r in regions[1:]])
        report.sites.append(site)
        if site_vm is None:
            site.reason = why
            continue
        real = []
        for r in regions:
            arrays = _real_inputs(r, real_values, func_name)
            if arrays is not None:
                real.append((f"real values at {r.record.root}", arrays))
        if not real and inputs is not None:
            site.inputs.append("real values: " + (capture_note or "not available (an input "
                               "is made by an earlier rewrite or lives in another function)"))
        _run_site(site, site_vm, number, _draws(first, real, seed, model_sizes), tol, first,
                  widen)
    return report


def _model_sizes(before: tvm.IRModule, func_name: str, inputs: Sequence[np.ndarray] | None,
                 groups: list[list[_Region]]) -> dict[str, int]:
    """The symbolic sizes the model's own inputs give its entry function (``{}`` unless
    a site carries sizes, :func:`_carried_sizes`): a size a site sees only multiplied by
    another (``b * s``) is read off the model, where it stands alone.
    """
    if inputs is None or not any(regions[0].sizes for regions in groups):
        return {}
    if not any(gv.name_hint == func_name for gv in before.functions):
        return {}
    return _symbolic_sizes(before[func_name], list(inputs))


@dataclass
class SitePlan:
    """The sites of a log cut out and grouped, before anything is built.

    :meth:`functions` is what a build for them must hold beside the model's functions;
    a caller that builds them with other functions (the job builds them with the model
    before and after, :mod:`patternkit.verification.joint`) hands the plan and the VM to
    :func:`validate_sites`.
    """

    groups: list[list[_Region]]  # structurally identical sites, the first one built
    unsplit: list[Site]  # sites whose region could not be cut out: not run, with why
    probe: _Probe | None  # the entry function returning the sites' inputs

    def functions(self) -> dict[str, relax.Function]:
        """Name -> function: each group's region and replacement, and the probe."""
        functions: dict[str, relax.Function] = {}
        for number, regions in enumerate(self.groups):
            functions.update(_pair(number, regions[0]))
        if self.probe is not None and self.probe.function is not None:
            functions[PROBE] = self.probe.function
        return functions


def plan_sites(before: tvm.IRModule, log: RewriteLog, func_name: str = "main",
               probe: bool = True) -> SitePlan:
    """Cut every site of ``log`` out of ``before`` and group the identical ones; with
    ``probe``, also make the entry function that returns the values the sites read.
    """
    cache: dict[int, _Bindings] = {}
    groups: dict[int, list[_Region]] = {}
    unsplit = []
    for record in log.records:
        region = _cut(record, cache)
        if isinstance(region, str):
            unsplit.append(Site(record.rule, record.function, record.root, "not_run", region))
        else:
            groups.setdefault(region.key, []).append(region)
    made = None
    if probe and groups:
        wanted = [x for regions in groups.values() for r in regions
                  if r.record.function == func_name
                  for x in r.inputs if isinstance(x, relax.Var)]
        made = _probe(before, func_name, wanted)
    return SitePlan(list(groups.values()), unsplit, made)


def _real_inputs(region: _Region, values: Mapping[int, np.ndarray], func_name: str
                 ) -> list[np.ndarray] | None:
    if region.record.function != func_name:
        return None
    arrays = []
    for x in region.inputs:
        if isinstance(x, tvm.ir.GenericConst):
            arrays.append(x.value.numpy())
        elif C.handle(x) in values:
            arrays.append(values[C.handle(x)])
        else:
            return None
    return arrays


@dataclass
class _Built:
    """One VM for all sites, or per site where the module as a whole did not build."""

    shared: Any = None
    single: dict[int, tuple[Any, str]] = field(default_factory=dict)
    probe_vm: Any = None
    builds: int = 0

    def vm_of(self, number: int) -> tuple[Any, str]:
        if self.shared is not None:
            return self.shared, ""
        return self.single.get(number, (None, "not built"))


def _pair(number: int, region: _Region) -> dict[str, relax.Function]:
    return {f"site{number}_{side}": getattr(region, side).with_attr(
        "global_symbol", f"site{number}_{side}") for side in ("before", "after")}


def _module(functions: Mapping[str, relax.Function], base: tvm.IRModule | None = None,
            without: str | None = None) -> tvm.IRModule:
    """``functions`` as a module; with ``base``, beside its functions (those the probe
    calls) but ``without`` (the entry function: the probe stands in for it, and building
    the model twice would double the cost).
    """
    found = ({gv: f for gv, f in base.functions.items() if gv.name_hint != without}
             if base is not None else {})
    found.update({C.typed_global_var(name, f): f for name, f in functions.items()})
    return C.copy_module(base, found) if base is not None else tvm.IRModule(found)


def _build_all(groups: list[list[_Region]], before: tvm.IRModule,
               probe: _Probe | None, func_name: str) -> _Built:
    """Build every site pair, and the probe beside the model's functions, as one module;
    where that fails, the probe alone and the sites pair by pair, so that one site TVM
    cannot build does not cost the others their check.
    """
    built = _Built()
    functions: dict[str, relax.Function] = {}
    for number, regions in enumerate(groups):
        functions.update(_pair(number, regions[0]))
    probe_function = probe.function if probe is not None else None
    with_probe = probe_function is not None
    if probe_function is not None:
        functions[PROBE] = probe_function
    if not functions:
        return built
    built.builds += 1
    try:
        built.shared = numeric.build(_module(functions, before if with_probe else None,
                                             func_name))
        built.probe_vm = built.shared
        return built
    except Exception:  # noqa: BLE001 - isolate the failure below
        pass
    if probe is not None and probe_function is not None:
        built.builds += 1
        try:
            built.probe_vm = numeric.build(_module({PROBE: probe_function}, before, func_name))
        except Exception as err:  # noqa: BLE001
            probe.function = None
            probe.note = ("the model's own values could not be read: "
                          f"{tvm_error_line(err)}")
    for number, regions in enumerate(groups):
        built.builds += 1
        pair = _pair(number, regions[0])
        try:
            numeric.build(_module({k: v for k, v in pair.items() if k.endswith("before")}))
        except Exception as err:  # noqa: BLE001
            built.single[number] = (None, "the matched region does not build for llvm on "
                                          f"its own: {tvm_error_line(err)}")
            continue
        try:
            built.single[number] = (numeric.build(_module(pair)), "")
        except Exception as err:  # noqa: BLE001
            built.single[number] = (None, "the replacement does not build for llvm: "
                                          f"{tvm_error_line(err)}")
    return built


def _run_site(site: Site, vm: Any, number: int, draws: list, tol: Tolerance,
              region: _Region, widen: Callable | None) -> None:
    """Run every draw on both sides and set the site's verdict."""
    errors: list[tuple[float, float]] = []
    inconclusive: list[str] = []
    for label, arrays, sizes in draws:
        try:
            tensors = [C.to_tensor(a) for a in arrays] + _size_arguments(region, sizes)
            ref = numeric.flatten(vm[f"site{number}_before"](*tensors))
            got = numeric.flatten(vm[f"site{number}_after"](*tensors))
        except Exception as err:  # noqa: BLE001 - a draw the region cannot take
            site.inputs.append(f"{label}: not run ({tvm_error_line(err)})")
            continue
        verdict = judge(ref, got, tol.rtol, tol.atol)
        if verdict.verdict == "fail" and widen is not None:
            verdict = _arbitrate(verdict, region, arrays, sizes, ref, got, tol, widen)
        site.inputs.append(f"{label}: {verdict.verdict}")
        if verdict.verdict == "inconclusive":
            inconclusive.append(f"{label}: {verdict.reason}")
            continue
        errors.append((verdict.max_abs_error, verdict.max_rel_error))
        if verdict.verdict == "fail":
            site.status = "fail"
            site.reason = f"{label}: {verdict.reason}"
            break
        site.status = "pass"
    if errors:
        site.max_abs_error = max(e[0] for e in errors)
        site.max_rel_error = max(e[1] for e in errors)
    if site.status == "not_run":
        site.reason = ("no draw gave evidence: " + "; ".join(inconclusive) if inconclusive
                       else "no draw could run")


def _arbitrate(verdict: Judgement, region: _Region, arrays: list[np.ndarray],
               sizes: Mapping[str, int], ref: list[np.ndarray], got: list[np.ndarray],
               tol: Tolerance, widen: Callable) -> Judgement:
    """A missed draw measured against the region in float64: the replacement passes when
    it is at most :data:`SLACK` times as far from it as the region itself (+ atol).
    """
    try:
        wide = widen(region.before)
        wide_inputs = [a.astype("float64") if a.dtype.kind == "f" or str(a.dtype) == "bfloat16"
                       else a for a in arrays]
        vm = numeric.build(_module({"wide": wide.with_attr("global_symbol", "wide")}))
        truth = numeric.flatten(vm["wide"](*[C.to_tensor(a) for a in wide_inputs],
                                           *_size_arguments(region, sizes)))
    except Exception:  # noqa: BLE001 - no arbitration: the miss stands
        return verdict
    if len(truth) != len(ref):
        return verdict
    far_ref = far_got = 0.0
    scale = 0.0
    for t, r, g in zip(truth, ref, got):
        t64 = np.asarray(t, "float64")
        finite = np.isfinite(t64) & np.isfinite(np.asarray(r, "float64"))
        if not finite.any():
            continue
        if (finite & ~np.isfinite(np.asarray(g, "float64"))).any():
            return verdict
        scale = max(scale, float(np.sqrt(np.mean(t64[finite] ** 2))))
        far_ref = max(far_ref, float(np.abs(np.asarray(r, "float64") - t64)[finite].max()))
        far_got = max(far_got, float(np.abs(np.asarray(g, "float64") - t64)[finite].max()))
    if scale and far_got <= SLACK * far_ref + tol.atol * scale:
        return Judgement("pass", verdict.max_abs_error, verdict.max_rel_error,
                         f"within {SLACK:g}x the region's own distance to float64")
    return verdict

