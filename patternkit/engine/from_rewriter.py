"""``from_rewriter``: TVM's ``PatternMatchingRewriter`` rules, run by patternkit's driver.

Relax users already write rules as ``@R.rewriter`` modules: a ``pattern`` function and a
``replacement`` function with the same signature.  TVM applies them with its own driver,
which re-matches the whole function after every rewrite (quadratic on a chain of
matches).  :func:`from_rewriter` turns such a rewriter into a patternkit
:class:`~patternkit.engine.rule.RewriteRule`, usable wherever a rule is (``rewrite``,
``RuleSet``, ``patternkit run --patterns``, the contract) and applied in linear time.

What the rule does is what TVM's rewriter does, built from TVM's own parts:

* the pattern is TVM's (``rewriter.pattern``), translated node for node by
  :class:`~patternkit.dpl.from_tvm.DplConverter`; a parameter's type is matched exactly
  as written (TVM's semantics), except that a symbolic dimension (``"M"``) matches any
  size, the same size wherever it occurs (the check unifies them);
* the replacement is TVM's too: the check calls the rewriter's own replacement builder
  (``rewriter.func``) on the match, and inlines the ``SeqExpr`` it returns (parameter
  aliases and their ``match_cast`` resolved, symbolic sizes bound to the matched ones),
  which is what TVM's driver leaves after canonicalising.  The inlined expression is the
  check's plan; ``rewrite`` returns it.

``r1 | r2`` (TVM's ``OrRewriter``) becomes one rule whose pattern is the alternatives in
order, each with its own replacement.  What patternkit cannot do the same way is refused
when the rule is made, by name, with a :class:`~patternkit.errors.PatternError` naming the
rule and the feature (see ``docs/from-rewriter.md``): a pattern returning a tuple (TVM's
``TupleRewriter``, several roots), a replacement calling a subroutine of the rewriter
module, and the pattern kinds :data:`~patternkit.dpl.from_tvm.INEXPRESSIBLE_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax
from tvm.relax import dpl
from tvm.relax.dpl import rewrite as dpl_rewrite

from ..dpl.from_tvm import DplConverter, FromDplError
from ..dpl.pattern import AltPattern, DFPattern, TypePattern
from ..errors import PatternError
from ..ir import compat as C
from .rule import Reject, RewriteRule, RoleMatch, reject

__all__ = ["from_rewriter", "TvmRewriterRule"]

#: Values with a scope of their own: one rewritten binding cannot hold them inlined.
_NOT_INLINABLE = (relax.SeqExpr, relax.If, relax.Function)
#: Values that compute something (everything else a binding holds is a leaf).
_COMPUTED = (relax.Call, relax.Tuple, relax.TupleGetItem, *_NOT_INLINABLE)


def from_rewriter(rewriter: Any, name: str | None = None) -> TvmRewriterRule:
    """A patternkit rewrite rule doing what TVM's rewriter ``rewriter`` does.

    Parameters
    ----------
    rewriter : PatternMatchingRewriter, IRModule or class
        An ``@R.rewriter`` object (or ``PatternMatchingRewriter.from_module`` /
        ``from_pattern``, or their composition ``r1 | r2``); an ``IRModule`` with
        ``pattern`` and ``replacement`` functions; or a class whose ``pattern`` and
        ``replacement`` attributes are such ``@R.function`` s.
    name : str, optional
        The rule's dotted name.  Default: ``"rewriter.<class name>"`` in lower case for
        a class, else ``"rewriter."`` and the root operators of the pattern
        (``"rewriter.add"``, ``"rewriter.add_or_multiply"``).

    Returns
    -------
    TvmRewriterRule
        A :class:`~patternkit.engine.rule.RewriteRule`.

    Raises
    ------
    PatternError
        ``rewriter`` is none of the above, TVM refuses to build it (its reason is kept),
        or it uses a feature patternkit cannot run the way TVM does (named).
    """
    if name is not None and (not isinstance(name, str) or not name):
        raise PatternError(f"from_rewriter: name must be a non-empty string, found {name!r}")
    given = _as_tvm_rewriter(rewriter, name)
    label = name or _class_name(rewriter)
    parts = _flatten(given, label or "rewriter")
    derived = label or "rewriter." + "_or_".join(dict.fromkeys(p.root_name for p in parts))
    return TvmRewriterRule(derived, parts, _pattern_function(rewriter))


def _pattern_function(rewriter: Any) -> relax.Function | None:
    """The ``pattern`` function the user wrote, when given one (a module or a class)."""
    found = None
    if isinstance(rewriter, tvm.IRModule):
        found = rewriter["pattern"]
    elif isinstance(rewriter, type):
        found = getattr(rewriter, "pattern", None)
    return found if isinstance(found, relax.Function) else None


@dataclass(frozen=True)
class _Alternative:
    """One ``ExprPatternRewriter``: its pattern translated, and TVM's replacement builder."""

    pattern: DFPattern
    #: TVM pattern node -> the patternkit node it became (for TVM's matchings map).
    nodes: tuple[tuple[Any, DFPattern], ...]
    #: Type patterns with symbolic sizes: the relaxed node and the type as written.
    symbolic: tuple[tuple[DFPattern, Any], ...]
    builder: Any
    root_name: str
    #: The parameters' type patterns (TVM node, patternkit node), when the pattern has
    #: the form ``from_module`` gives it (every leaf a typed wildcard): the replacement
    #: then depends on the matched arguments' types only, and is built once per types.
    parameters: tuple[tuple[Any, DFPattern], ...] | None = None
    #: Every parameter's type is written in full (shape and dtype): all matches have them.
    static_types: bool = False
    templates: dict[tuple[int, ...], list[tuple[tuple[Any, ...], _Template]]] = (
        field(default_factory=dict, compare=False, repr=False))


class TvmRewriterRule(RewriteRule):
    """A TVM ``PatternMatchingRewriter`` as a patternkit rule (see :func:`from_rewriter`).

    ``check`` builds the replacement with TVM's own builder and returns it inlined (the
    plan); it refuses, with the reason, a match whose symbolic sizes disagree
    (``N`` is 16 for one parameter and 15 for another).  ``rewrite`` returns the plan.
    """

    def __init__(self, name: str, alternatives: list[_Alternative],
                 pattern_function: relax.Function | None = None):
        super().__init__()
        self.name = name
        self._alternatives = tuple(alternatives)
        self._pattern_function = pattern_function
        pattern = alternatives[0].pattern
        for alternative in alternatives[1:]:
            pattern = AltPattern(pattern, alternative.pattern)
        self.pattern = pattern

    def roles(self) -> dict[str, DFPattern]:
        """No named roles: TVM's patterns name their parts by position only."""
        return {}

    def check(self, match: RoleMatch) -> Any:
        """The inlined replacement TVM's builder makes for ``match``, or why there is none."""
        captures = match.node_map.match.captures
        for alternative in self._alternatives:
            if alternative.pattern in captures:  # the first alternative that matched
                return self._replacement(alternative, match.root, captures)
        return reject("no alternative of the rewriter matched", match.root)

    def rewrite(self, match: RoleMatch) -> Any:
        """The replacement the check built (``match.plan``)."""
        return match.plan

    def example(self, **knobs: Any) -> Any:
        """The pattern as a module the rule fires on (``main``), for ``verify``.

        The user's ``pattern`` function when the rule was made from a module or a class;
        else the first alternative's pattern built over parameters of its written types.
        ``None`` when neither gives a function with fully written types (symbolic sizes
        or attributes the pattern does not spell out).
        """
        function = self._pattern_function or _function_of(self._alternatives[0])
        if function is None or not all(_fully_written(p.ty) for p in function.params):
            return None
        return tvm.IRModule({"main": function.with_attr("global_symbol", "main")})

    def _replacement(self, alternative: _Alternative, root: Any,
                     captures: dict[DFPattern, Any]) -> Any:
        sizes: dict[Any, Any] = {}
        for node, written in alternative.symbolic:
            if node in captures:
                _unify(written, C.type_of(captures[node]), sizes, captures[node])
        if alternative.parameters is not None:
            return self._from_template(alternative, root, captures)
        matchings = {tvm_node: captures[node] for tvm_node, node in alternative.nodes
                     if node in captures}
        return self._built(alternative, root, matchings)

    def _from_template(self, alternative: _Alternative, root: Any,
                       captures: dict[DFPattern, Any]) -> Any:
        """The replacement for arguments of these types, built once, with these arguments.

        Only for a builder that ``from_module`` made (it casts each parameter and reads
        nothing else); any other builder is called on every match.
        """
        assert alternative.parameters is not None
        arguments = tuple(captures[node] for _, node in alternative.parameters)
        if alternative.static_types:  # the pattern fixed every argument's type: one template
            templates = alternative.templates.setdefault((), [])
            found = templates[0] if templates else None
            types: tuple[Any, ...] = ()
        else:
            types = tuple(C.type_of(a) for a in arguments)
            key = tuple(C.structural_hash(t) for t in types)
            templates = alternative.templates.setdefault(key, [])
            found = next((t for t in templates
                          if all(C.structural_equal(a, b) for a, b in zip(t[0], types))),
                         None)
        if found is None:  # the builder on this match; a template only if it is TVM's
            raw = self._call_builder(alternative, root, _parameter_matchings(alternative,
                                                                            arguments))
            if isinstance(raw, Reject):
                return raw
            if not _casts_only_its_parameters(raw, arguments):
                object.__setattr__(alternative, "parameters", None)  # a builder of its own
                return _inline(raw, self.name)
            placeholders = tuple(relax.Var(f"arg{i}", C.type_of(a))
                                 for i, a in enumerate(arguments))
            template = self._built(alternative, root,
                                   _parameter_matchings(alternative, placeholders))
            if isinstance(template, Reject):
                return template
            found = (types, _Template(template, placeholders))
            templates.append(found)
        return found[1].instantiate(arguments)

    def _call_builder(self, alternative: _Alternative, root: Any,
                      matchings: dict[Any, Any]) -> Any:
        """What TVM's builder returns for ``matchings``, or a :class:`Reject` saying why not."""
        try:
            built = alternative.builder(root, matchings)
        except (*C.TVM_ERRORS, KeyError) as err:
            first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            return reject(f"TVM's replacement builder failed: {first}", root)
        if built is None:
            return reject("TVM's rewriter declined the match", root)
        return built

    def _built(self, alternative: _Alternative, root: Any, matchings: dict[Any, Any]) -> Any:
        raw = self._call_builder(alternative, root, matchings)
        return raw if isinstance(raw, Reject) else _inline(raw, self.name)


def _function_of(alternative: _Alternative) -> relax.Function | None:
    """The pattern of a ``from_module`` rewriter written back as a function (its calls
    carry no attributes, so only a pattern without attribute constraints qualifies).
    """
    if alternative.parameters is None or not alternative.static_types:
        return None
    params = [relax.Var(f"a{i}", typed.ty) for i, (typed, _) in enumerate(alternative.parameters)]
    values: dict[int, Any] = {C.handle(typed): v
                              for (typed, _), v in zip(alternative.parameters, params)}
    root = next(tvm_node for tvm_node, node in alternative.nodes if node is alternative.pattern)
    bb = relax.BlockBuilder()
    try:
        with bb.function("main", params):
            with bb.dataflow():
                out = bb.emit_output(_emitted(root, values, bb))
            bb.emit_func_output(out)
    except (*C.TVM_ERRORS, _NoExample):
        return None
    function = bb.get()["main"]
    return function if isinstance(function, relax.Function) else None


class _NoExample(Exception):
    """The pattern has a part :func:`_function_of` cannot write as Relax."""


def _emitted(pattern: Any, values: dict[int, Any], bb: relax.BlockBuilder) -> Any:
    known = values.get(C.handle(pattern))
    if known is not None:
        return known
    if not (isinstance(pattern, dpl.CallPattern) and isinstance(pattern.op, dpl.ExprPattern)):
        raise _NoExample(type(pattern).__name__)
    args = [_emitted(a, values, bb) for a in C.array_items(pattern.args)]
    # Through the Python constructor (relax.op.nn.silu for "relax.nn.silu"): it gives the
    # call the attributes its type inference reads (a bare Call without them crashes).
    name = str(pattern.op.expr.name)
    make: Any = relax.op
    for part in name.split(".")[1:]:
        make = getattr(make, part, None)
    if not callable(make) or not name.startswith("relax."):
        raise _NoExample(name)
    value = bb.emit(make(*args))
    values[C.handle(pattern)] = value
    return value


def _parameter_matchings(alternative: _Alternative, values: tuple[Any, ...]) -> dict[Any, Any]:
    """TVM's matchings map for parameters bound to ``values``: the typed wildcard and the
    wildcard inside it (the builder reads both).
    """
    assert alternative.parameters is not None
    matchings = {}
    for (typed, _), value in zip(alternative.parameters, values):
        matchings[typed] = matchings[typed.pattern] = value
    return matchings


def _casts_only_its_parameters(built: Any, arguments: tuple[Any, ...]) -> bool:
    """Is ``built`` what ``from_module``'s builder makes: a ``SeqExpr`` whose first block
    binds each argument (``v = arg``) and casts it to its parameter (``A = match_cast(v)``)?
    """
    if not isinstance(built, relax.SeqExpr) or not C.array_items(built.blocks):
        return False
    wanted = {C.handle(a) for a in arguments}
    bound: set[int] = set()
    cast: set[int] = set()
    for binding in C.array_items(C.array_items(built.blocks)[0].bindings):
        value = binding.value
        if isinstance(binding, relax.MatchCast) and C.handle(value) in bound:
            cast.add(C.handle(value))
        elif C.handle(value) in wanted:  # a matched Var, or a matched constant
            bound.add(C.handle(binding.var))
            wanted.discard(C.handle(value))
    return not wanted and cast == bound


class _Template:
    """A replacement built for placeholder arguments, compiled to build it for real ones.

    The expression is flattened into steps in post order, shared parts once; a step
    makes one Call, Tuple or TupleGetItem from earlier slots (the arguments first, then
    the leaves), with the operator, attributes and types read once here instead of per
    match.
    """

    def __init__(self, template: Any, placeholders: tuple[Any, ...]):
        self._slots: dict[int, int] = {C.handle(p): i for i, p in enumerate(placeholders)}
        self._leaves: list[Any] = []
        self._steps: list[tuple[str, Any, tuple[int, ...]]] = []
        self._result = self._compile(template)

    def _slot_of_leaf(self, expr: Any) -> int:
        self._leaves.append(expr)
        return -len(self._leaves)  # negative: a leaf, read from the end

    def _compile(self, expr: Any) -> int:
        key = C.handle(expr)
        slot = self._slots.get(key)
        if slot is not None:
            return slot
        if isinstance(expr, relax.Call):
            refs = tuple(self._compile(a) for a in C.array_items(expr.args))
            step: tuple[str, Any, tuple[int, ...]] = (
                "call", (expr.op, expr.attrs, expr.ty_args), refs)
        elif isinstance(expr, relax.Tuple):
            step = ("tuple", None, tuple(self._compile(f) for f in C.array_items(expr.fields)))
        elif isinstance(expr, relax.TupleGetItem):
            step = ("item", int(expr.index), (self._compile(expr.tuple_value),))
        else:
            slot = self._slots[key] = self._slot_of_leaf(expr)
            return slot
        self._steps.append(step)
        slot = self._slots[key] = 1_000_000 + len(self._steps) - 1
        return slot

    def instantiate(self, arguments: tuple[Any, ...]) -> Any:
        """The replacement with ``arguments`` for the placeholders."""
        leaves = self._leaves
        made: list[Any] = []

        def read(slot: int) -> Any:
            if slot < 0:
                return leaves[-slot - 1]
            if slot >= 1_000_000:
                return made[slot - 1_000_000]
            return arguments[slot]

        for kind, data, refs in self._steps:
            values = [read(r) for r in refs]
            if kind == "call":
                op, attrs, ty_args = data
                made.append(C.new_call(C.MISSING_TYPE, op, values, attrs, ty_args, None))
            elif kind == "tuple":
                made.append(C.new_tuple(values, None))
            else:
                made.append(relax.TupleGetItem(values[0], data))
        return read(self._result)


# -- taking the rewriter apart ------------------------------------------------------------
def _class_name(rewriter: Any) -> str | None:
    if isinstance(rewriter, type):
        return "rewriter." + rewriter.__name__.lower()
    return None


def _module_label(module: tvm.IRModule) -> str:
    """``rewriter.<root op>`` of the module's pattern function, for errors before TVM runs."""
    try:
        pattern = module["pattern"]
        result = pattern.body.body
        value = relax.analysis.get_var2val(pattern).get(result, result)
        return "rewriter." + str(value.op.name).rsplit(".", 1)[-1]
    except (*C.TVM_ERRORS, AttributeError, KeyError):
        return "from_rewriter"


def _as_tvm_rewriter(rewriter: Any, name: str | None) -> Any:
    label = name or _class_name(rewriter) or "from_rewriter"
    if isinstance(rewriter, dpl_rewrite.PatternMatchingRewriter):
        return rewriter
    if isinstance(rewriter, type):
        functions = {key: getattr(rewriter, key) for key in ("pattern", "replacement")
                     if isinstance(getattr(rewriter, key, None), relax.Function)}
        if len(functions) < 2:
            raise PatternError(f"{label}: a rewriter class needs @R.function 'pattern' and "
                               f"'replacement' attributes (or the @R.rewriter decorator); "
                               f"found {sorted(functions) or 'neither'}")
        module = tvm.IRModule({tvm.ir.GlobalVar(k): f for k, f in functions.items()})
        return _from_module(module, label)
    if isinstance(rewriter, tvm.IRModule):
        return _from_module(rewriter, name or _module_label(rewriter))
    raise PatternError(f"{label}: expected a TVM rewriter (@R.rewriter, "
                       f"PatternMatchingRewriter, r1 | r2) or an IRModule with 'pattern' and "
                       f"'replacement' functions; found {type(rewriter).__name__}: "
                       f"{rewriter!r:.80}")


def _from_module(module: tvm.IRModule, label: str) -> Any:
    names = {gv.name_hint for gv in module.get_global_vars()}
    for required in ("pattern", "replacement"):
        if required not in names:
            raise PatternError(f"{label}: the rewriter module has no '{required}' function "
                               f"(it has {', '.join(sorted(names)) or 'none'})")
        if not isinstance(module[required], relax.Function):
            raise PatternError(f"{label}: the rewriter module's '{required}' is a "
                               f"{type(module[required]).__name__}, not a Relax function")
    extra = sorted(names - {"pattern", "replacement"})
    if extra:
        raise PatternError(f"{label}: the replacement calls subroutines of the rewriter "
                           f"module ({', '.join(extra)}); a patternkit rule replaces one "
                           f"binding and adds no function to the module")
    try:
        return dpl_rewrite.PatternMatchingRewriter.from_module(module)
    except (*C.TVM_ERRORS, KeyError) as err:
        lines = str(err).strip().splitlines()
        raise PatternError(f"{label}: TVM refuses the rewriter module: "
                           f"{lines[-1] if lines else type(err).__name__}") from err


def _flatten(rewriter: Any, label: str) -> list[_Alternative]:
    kind = type(rewriter).__name__
    if isinstance(rewriter, dpl_rewrite.OrRewriter):
        return _flatten(rewriter.lhs, label) + _flatten(rewriter.rhs, label)
    if isinstance(rewriter, dpl_rewrite.TupleRewriter):
        raise PatternError(f"{label}: TupleRewriter (a pattern returning a tuple of several "
                           f"results, matched as separate roots) cannot be run as a "
                           f"patternkit rule; write it as a multi-root rule (a context)")
    if not isinstance(rewriter, dpl_rewrite.ExprPatternRewriter):
        raise PatternError(f"{label}: {kind} is a TVM rewriter kind patternkit does not know")
    if isinstance(rewriter.pattern, dpl.TuplePattern):
        raise PatternError(f"{label}: a pattern whose result is a tuple (TuplePattern) cannot "
                           f"be run as a patternkit rule; the result must be one binding")
    converter = _TypedConverter()
    try:
        pattern = converter.convert(rewriter.pattern)
    except FromDplError as err:
        raise PatternError(f"{label}: the pattern uses tvm.relax.dpl.{err.kind}, which "
                           f"patternkit cannot express") from err
    parameters = _typed_parameters(rewriter.pattern)
    return [_Alternative(pattern, converter.pairs(), tuple(converter.symbolic),
                         rewriter.func, _root_name(rewriter.pattern),
                         None if parameters is None else
                         tuple((p, converter.convert(p)) for p in parameters),
                         parameters is not None and all(_fully_written(p.ty)
                                                        for p in parameters))]


def _fully_written(ty: Any) -> bool:
    """A tensor type with a dtype and every size a number: what it matches has this type."""
    return (isinstance(ty, relax.TensorType) and bool(C.dtype_of(ty))
            and ty.shape is not None and not _has_symbolic_size(ty))


def _typed_parameters(pattern: Any) -> list[Any] | None:
    """The typed wildcards of ``pattern`` in first-seen order, when every leaf is one
    (the form ``from_module`` builds: a parameter is ``TypePattern(wildcard(), type)``).
    """
    found: dict[int, Any] = {}
    seen: set[int] = set()
    stack = [pattern]
    while stack:
        node = stack.pop()
        if C.handle(node) in seen:
            continue
        seen.add(C.handle(node))
        if isinstance(node, dpl.TypePattern) and isinstance(node.pattern, dpl.WildcardPattern):
            found.setdefault(C.handle(node), node)
        elif isinstance(node, dpl.CallPattern):
            if not (isinstance(node.op, dpl.ExprPattern) and isinstance(node.op.expr, tvm.ir.Op)):
                return None
            stack.extend(reversed(C.array_items(node.args)))
        elif isinstance(node, dpl.AttrPattern):
            stack.append(node.pattern)
        elif isinstance(node, dpl.TupleGetItemPattern):
            stack.append(node.tuple)
        elif isinstance(node, dpl.TuplePattern):
            stack.extend(reversed(C.array_items(node.fields)))
        else:  # a constant, a bare wildcard, an alternative...: the builder may read it
            return None
    return list(found.values())


def _root_name(pattern: Any) -> str:
    while isinstance(pattern, (dpl.TypePattern, dpl.DataTypePattern, dpl.ShapePattern,
                               dpl.AttrPattern)):
        pattern = pattern.pattern
    if isinstance(pattern, dpl.CallPattern) and isinstance(pattern.op, dpl.ExprPattern):
        op = pattern.op.expr
        if isinstance(op, tvm.ir.Op):
            return str(op.name).rsplit(".", 1)[-1]
    return type(pattern).__name__.replace("Pattern", "").lower() or "pattern"


class _TypedConverter(DplConverter):
    """``DplConverter`` with TVM's meaning of a symbolic size in a type pattern.

    patternkit's :class:`TypePattern` compares a symbolic size by name; TVM's binds it.
    A type pattern with symbolic sizes becomes one with the rank and dtype only, and the
    type as written is kept for the check, which unifies the sizes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.symbolic: list[tuple[DFPattern, Any]] = []
        self._tvm_nodes: dict[int, Any] = {}

    def convert(self, pattern: Any) -> DFPattern:
        """The patternkit node for ``pattern`` (its TVM node is remembered)."""
        self._tvm_nodes.setdefault(C.handle(pattern), pattern)
        return super().convert(pattern)

    def _convert_node(self, pattern: Any) -> DFPattern:
        if isinstance(pattern, dpl.TypePattern) and _has_symbolic_size(pattern.ty):
            ty = pattern.ty
            relaxed = TypePattern(self.convert(pattern.pattern),
                                  relax.TensorType(ndim=ty.ndim, dtype=C.dtype_of(ty) or ""))
            self.symbolic.append((relaxed, ty))
            return relaxed
        return super()._convert_node(pattern)

    def pairs(self) -> tuple[tuple[Any, DFPattern], ...]:
        """(TVM node, patternkit node) for every node converted."""
        return tuple((self._tvm_nodes[key], node) for key, node in self._memo.items())


def _has_symbolic_size(ty: Any) -> bool:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return False
    shape = ty.shape
    dims = shape.values if isinstance(shape, relax.ShapeExpr) else None
    if dims is None:
        return True  # a shape held by a Var: known only at run time
    return any(not isinstance(d, tvm.tirx.IntImm) for d in dims)


# -- symbolic sizes -----------------------------------------------------------------------
def _unify(written: Any, actual: Any, sizes: dict[Any, Any], at: Any) -> None:
    """Bind the symbolic sizes of ``written`` to those of ``actual``; raise a Reject."""
    dims = C.array_items(written.shape.values)
    have = C.static_shape(actual) if isinstance(actual, relax.TensorType) else None
    if have is None or len(have) != len(dims):
        raise Reject(f"the pattern's type {written} needs a known shape of rank {len(dims)}; "
                     f"found {actual}", at)
    analyzer = tvm.sym.Analyzer()
    for var, value in sizes.items():
        analyzer.bind(var, value)
    for want, got in zip(dims, have):
        got_expr = got if isinstance(got, tvm.ir.Expr) else tvm.tirx.IntImm("int64", got)
        if tvm.ir.is_prim_var(want) and want not in sizes:
            sizes[want] = got_expr
            analyzer.bind(want, got_expr)
            continue
        if not analyzer.can_prove_equal(want, got_expr):
            raise Reject(f"the pattern's type {written} needs {want} = "
                         f"{_dim_text(analyzer.simplify(want))}; found {got} (in {actual})", at)


def _dim_text(dim: Any) -> str:
    return str(dim.value) if isinstance(dim, tvm.tirx.IntImm) else str(dim)


# -- inlining TVM's replacement -----------------------------------------------------------
def _inline(built: Any, rule_name: str) -> Any:
    """TVM's replacement ``SeqExpr`` as one nested expression (shared parts stay shared).

    The ``SeqExpr`` starts by casting each matched argument to its parameter's type
    (``A = R.match_cast(x, R.Tensor((M, N)))``); the casts bind the replacement's
    symbolic sizes, which are substituted, and the parameters become the arguments.
    """
    if not isinstance(built, relax.SeqExpr):
        return built
    sizes: dict[Any, Any] = {}
    aliases: dict[int, Any] = {}
    for block in C.array_items(built.blocks):
        for binding in C.array_items(block.bindings):
            value = binding.value
            if isinstance(value, relax.Var):
                source = aliases.get(C.handle(value), value)
            else:  # the builder first binds each argument as matched (a Var or a constant)
                source = None if isinstance(value, _COMPUTED) else value
            if source is not None:
                aliases[C.handle(binding.var)] = source
                if isinstance(binding, relax.MatchCast) and _has_symbolic_size(binding.ty):
                    _unify(binding.ty, C.type_of(source), sizes, source)
    if sizes:
        free = list(relax.analysis.free_vars(built))
        wrapper = relax.Function(free, built, ret_ty=relax.AnyType()).bind_symbolic_vars(sizes)
        built = wrapper.body
    env: dict[int, Any] = {}
    passed: set[int] = set()  # Vars holding a matched argument as it is
    for block in C.array_items(built.blocks):
        for binding in C.array_items(block.bindings):
            raw = binding.value
            value = _substitute(raw, env, rule_name)
            if not isinstance(raw, _COMPUTED) and (not isinstance(raw, relax.Var)
                                                   or C.handle(raw) in passed
                                                   or C.handle(raw) not in env):
                passed.add(C.handle(binding.var))
            elif isinstance(binding, relax.MatchCast):
                raise Reject(f"the replacement binds R.match_cast of a computed value "
                             f"({binding.var.name}), which one rewritten binding cannot hold",
                             binding.value)
            env[C.handle(binding.var)] = value
    return _substitute(built.body, env, rule_name)


def _substitute(expr: Any, env: dict[int, Any], rule_name: str) -> Any:
    """``expr`` with the Vars of ``env`` replaced (by the very objects: sharing is kept)."""
    if isinstance(expr, relax.Var):
        return env.get(C.handle(expr), expr)
    if isinstance(expr, relax.Call):
        if isinstance(expr.op, tvm.ir.GlobalVar):
            raise PatternError(f"{rule_name}: the replacement calls the module function "
                               f"{expr.op.name_hint}, which a patternkit rule cannot add")
        args = [_substitute(a, env, rule_name) for a in C.array_items(expr.args)]
        return relax.Call(expr.op, args, expr.attrs, list(expr.ty_args))
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_substitute(f, env, rule_name) for f in C.array_items(expr.fields)])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_substitute(expr.tuple_value, env, rule_name), expr.index)
    if isinstance(expr, _NOT_INLINABLE):
        raise Reject(f"the replacement holds a {type(expr).__name__}, which patternkit "
                     f"cannot inline into one binding", expr)
    return expr  # a leaf: a constant, shape, string, extern function or operator
