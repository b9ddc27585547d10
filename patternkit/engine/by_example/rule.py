"""The rule a by-example pair makes: a rewrite into ``fused``, or a composite.

:func:`example_rule_class` makes one class per rule (named after the rule, documented by
its pattern's description), so a by-example rule is a rule like any other: its class
builds it again with no argument (the command line's ``--patterns rules.py`` accepts
either), the library lists it by class, and ``pk.verify`` draws instances from its
:meth:`~ExampleRewrite.example_space` (sizes of the symbolic dimensions, 1 included,
and dtypes).  Numeric verification of the pair itself lives one layer up
(:mod:`patternkit.verification.by_example`).

A match is accepted when ``fused``, traced again at the match's own types, type-checks
and gives the type of the binding it replaces (a scalar constant that broadcasts ``x``
to a higher rank makes the written form bigger than ``fused(x)``: refused, with that
reason); the rewrite is ``fused`` called on the matched expressions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from ...dpl import DFPattern
from ...errors import PatternError
from ...ir import compat as C, prove_equal
from ..rule import CompositeRule, NoSuchExample, RewriteRule, RoleMatch, reject
from ..tolerance import Tolerance, default_tolerance
from .generalisation import Generalised, expression_text, generalise
from .signature import Signature, read_signature, symbolic_types
from .tracing import constant_of, is_torch_function, trace

__all__ = ["ExampleSpec", "ExampleRewrite", "ExampleComposite", "example_rule_class",
           "FLOAT_DTYPES", "SIZES"]

#: The float dtypes a rule accepts when ``dtypes=`` names none.
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")

#: The sizes each symbolic dimension takes in ``example_space``: 1 (broadcast edge) first
#: after the default.
SIZES = (4, 1, 7)


@dataclass
class ExampleSpec:
    """Everything a by-example rule is made from (kept on its class).

    Attributes
    ----------
    name : str
    written : tuple of callables
        The spellings: the pattern matches any of them.
    fused : callable or None
        ``None``: a composite named ``name``.
    signature : Signature
    dtypes : tuple of str
        The float dtypes the rule accepts (its check refuses others).
    traced_dtype : str
        The dtype ``written`` was traced in.
    exact, commutative, associative
        The generalisation options.
    tolerance : Tolerance, float, dict or None
        What the author states (``None``: the default per dtype).
    spellings : list of Generalised
        One per ``written`` function.
    pattern : DFPattern
    """

    name: str
    written: tuple[Callable[..., Any], ...]
    fused: Callable[..., Any] | None
    signature: Signature
    dtypes: tuple[str, ...]
    traced_dtype: str
    exact: tuple[str, ...] = ()
    commutative: tuple[str, ...] = ()
    associative: bool = False
    tolerance: Any = None
    spellings: list[Generalised] = field(default_factory=list)
    pattern: DFPattern | None = None
    example: Callable[..., Any] | None = None
    example_space: Any = None
    fused_text: str = ""

    def rule_tolerance(self, dtype: str | None) -> Tolerance:
        """The stated tolerance for ``dtype`` results, else the default."""
        stated = self.tolerance
        if isinstance(stated, Mapping):
            stated = stated.get(dtype)
        if stated is None:
            return default_tolerance(dtype)
        if isinstance(stated, Tolerance):
            return stated
        value = float(stated)
        return Tolerance(value, value, f"stated by the author of {self.name}")

    def trace_written(self, index: int, dtype: str,
                      sizes: Mapping[str, int] | None = None) -> relax.Function:
        """Spelling ``index`` of ``written`` traced at ``dtype`` (and ``sizes``)."""
        types = symbolic_types(self.signature, dtype, sizes)
        constants = {k: constant_of(v, dtype) for k, v in self.signature.constants.items()}
        return trace(self.name, "written", self.written[index], types, constants)

    def trace_fused(self, types: Mapping[str, Any],
                    constants: Mapping[str, Any] | None = None) -> relax.Function:
        """``fused`` traced at ``types`` (name -> tensor type)."""
        assert self.fused is not None
        return trace(self.name, "fused", self.fused, types,
                     self.signature.constants if constants is None else constants)

    def describe(self) -> str:
        """The rule in words: what it matches, how it was generalised, what it makes."""
        into = "the composite " + self.name if self.fused is None else self.fused_text
        lines = [f"{self.name}: by example, {len(self.written)} spelling(s) -> {into}"]
        for i, spelling in enumerate(self.spellings):
            lines.append(f"  matches {spelling.text}")
            if i == 0:
                lines += ["    " + ln for ln in spelling.lines(self.signature)]
        lines.append(f"  dtypes: {', '.join(self.dtypes)}")
        return "\n".join(lines)


class _ExampleBase:
    """What both kinds share: roles from the spec, the check, the examples."""

    spec: ExampleSpec

    def describe(self) -> str:
        """The rule in words (:meth:`ExampleSpec.describe`)."""
        return self.spec.describe()

    def __str__(self) -> str:
        return self.spec.describe()

    def _common_check(self, match: RoleMatch) -> Any:
        spec = self.spec
        dtype = C.dtype_of(C.type_of(match.root))
        if dtype is None:
            return reject(f"the result has no known dtype; {spec.name} was shown "
                          f"{', '.join(spec.dtypes)} only", at=match.root)
        if dtype not in spec.dtypes:
            return reject(f"the result is {dtype}; {spec.name} accepts "
                          f"{', '.join(spec.dtypes)} (dtypes=)", at=match.root)
        spelling = self._spelling(match)
        for name, rank in spelling.ranks.items():
            shape = C.static_shape(match[name])
            if shape is None or len(shape) != rank:
                found = "an unknown rank" if shape is None else f"rank {len(shape)}"
                return reject(f"{name} has {found}; the example's body needs rank {rank}",
                              at=match[name])
        for role in spelling.exact:
            want = spelling.constants[role]
            have = C.const_to_numpy(match[role])
            tol = default_tolerance(str(have.dtype)) if have.dtype.kind == "f" else None
            same = (have.shape == want.shape and (
                np.array_equal(have, want) if tol is None else
                np.allclose(have.astype("float64"), want.astype("float64"),
                            rtol=tol.rtol, atol=tol.atol)))
            if not same:
                return reject(f"the constant {role} differs from the example's "
                              f"(exact={role!r})", at=match[role])
        return True

    def _spelling(self, match: RoleMatch) -> Generalised:
        spellings = self.spec.spellings
        if len(spellings) == 1:
            return spellings[0]
        for spelling in spellings:  # the first whose roles the match holds
            if all(r in match for r in spelling.roles):
                return spelling
        return spellings[0]

    def example(self, dtype: str | None = None, **sizes: Any) -> tvm.IRModule:
        """The first spelling of ``written`` at ``dtype`` and the sizes of the symbolic
        dimensions (each defaults to the first of :data:`SIZES`), as a module.
        """
        spec = self.spec
        if spec.example is not None:
            return spec.example(**({} if dtype is None else {"dtype": dtype}), **sizes)
        unknown = sorted(set(sizes) - set(spec.signature.symbols))
        if unknown:
            raise NoSuchExample(f"{spec.name}: no symbolic dimension {unknown[0]!r}")
        bound = {s: int(sizes.get(s, SIZES[0])) for s in spec.signature.symbols}
        func = spec.trace_written(0, dtype or spec.dtypes[0], bound)
        return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})

    def example_space(self) -> Any:
        """The dtypes the rule accepts and :data:`SIZES` for each symbolic dimension."""
        spec = self.spec
        if spec.example_space is not None:
            return spec.example_space
        space: dict[str, Sequence[Any]] = {"dtype": spec.dtypes}
        for symbol in spec.signature.symbols:
            space[symbol] = SIZES
        return space


class ExampleRewrite(_ExampleBase, RewriteRule):
    """A rewrite rule made from a ``written`` / ``fused`` pair (see :func:`example_rule_class`)."""

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        _install(self, self.spec)
        # The check's conclusion per (argument types, result type): a graph repeats its
        # shapes, and tracing fused again costs more than matching.  Keyed by structure
        # (the same symbolic Var objects), so two dims that only print alike never share.
        self._conclusions: dict[int, list[tuple[tuple[Any, ...], str | None]]] = {}

    def check(self, match: RoleMatch) -> Any:
        """Accept a match of a shown dtype whose ``fused`` form, traced at the match's own
        types, has the type of the binding it replaces.
        """
        common = self._common_check(match)
        if common is not True:
            return common
        spec = self.spec
        types = {n: C.type_of(match[n]) for n in spec.signature.tensors}
        want = C.type_of(match.root)
        constants = {k: match[k] if k in match else v
                     for k, v in spec.signature.constants.items()}
        key = (*types.values(), want)
        problem = None if constants else self._known_problem(key)
        if problem is _UNKNOWN:
            try:
                func = _trace_at(spec, types, constants)
            except PatternError as err:
                problem = f"fused does not apply at the match's types: {err}"
            else:
                problem = _type_problem(func.ret_ty, want)
            if not constants:
                self._remember(key, problem)
        if problem:
            return reject(str(problem), at=match.root)
        return True

    def _known_problem(self, key: tuple[Any, ...]) -> Any:
        """What the check concluded for these types before (:data:`_UNKNOWN`: never)."""
        for types, problem in self._conclusions.get(_types_hash(key), ()):
            if all(C.structural_equal(a, b) for a, b in zip(types, key)):
                return problem
        return _UNKNOWN

    def _remember(self, key: tuple[Any, ...], problem: str | None) -> None:
        if len(self._conclusions) > _CONCLUSIONS:
            self._conclusions.clear()
        self._conclusions.setdefault(_types_hash(key), []).append((key, problem))

    def rewrite(self, match: RoleMatch) -> Any:
        """``fused`` called on the matched expressions."""
        spec = self.spec
        assert spec.fused is not None
        args = [match[n] for n in spec.signature.tensors]
        constants = {k: match[k] if k in match else _const_like(v, match.root)
                     for k, v in spec.signature.constants.items()}
        return spec.fused(*args, **constants)


class ExampleComposite(_ExampleBase, CompositeRule):
    """A composite for external compilers made from a ``written`` function alone."""

    def __init__(self, compiler: str = "byoc"):
        super().__init__(compiler=compiler)
        _install(self, self.spec)

    def check(self, match: RoleMatch) -> Any:
        """Accept a match of a shown dtype (ranks and exact constants as the example)."""
        return self._common_check(match)


#: "Not concluded yet", distinct from ``None`` (no problem).
_UNKNOWN = object()

#: How many type keys a rule remembers before it starts again.
_CONCLUSIONS = 256


def _types_hash(key: tuple[Any, ...]) -> int:
    return hash(tuple(C.structural_hash(t) for t in key))


def _install(rule: RewriteRule | CompositeRule, spec: ExampleSpec) -> None:
    """The spec's pattern on the rule, and its roles as attributes (``Rule.roles`` reads them)."""
    assert spec.pattern is not None
    rule.pattern = spec.pattern
    for role, sub in spec.spellings[0].roles.items():
        setattr(rule, role, sub)


def _trace_at(spec: ExampleSpec, types: Mapping[str, Any],
              constants: Mapping[str, Any]) -> relax.Function:
    return spec.trace_fused(types, constants)


def _const_like(value: Any, root: Any) -> Any:
    dtype = C.dtype_of(C.type_of(root)) or "float32"
    return relax.const(value, dtype) if isinstance(value, float) else value


def _type_problem(fused: Any, written: Any) -> str | None:
    """Why ``fused``'s result type cannot stand for ``written``'s (``None``: it can)."""
    fused_dtype, written_dtype = C.dtype_of(fused), C.dtype_of(written)
    if fused_dtype != written_dtype:
        return f"fused gives {fused_dtype}, the written form {written_dtype}"
    fused_shape, written_shape = C.static_shape(fused), C.static_shape(written)
    if fused_shape is None or written_shape is None:
        ranks = getattr(fused, "ndim", -1), getattr(written, "ndim", -1)
        if -1 in ranks:
            return ("the written form has an unknown rank: cannot tell whether its constants "
                    "broadcast the parameters, which fused would not")
        if ranks[0] != ranks[1]:
            return (f"fused gives rank {ranks[0]}, the written form rank {ranks[1]}: its "
                    f"constants broadcast the parameters")
        return None
    if len(fused_shape) != len(written_shape) or not all(
            prove_equal(a, b) for a, b in zip(fused_shape, written_shape)):
        return (f"fused gives shape {_shape_text(fused_shape)}, the written form "
                f"{_shape_text(written_shape)}: its constants broadcast the parameters")
    return None


def _shape_text(shape: Sequence[Any]) -> str:
    inner = ", ".join(str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def class_name(rule: str) -> str:
    """``"silu.collapse"`` -> ``"SiluCollapse"``."""
    words = re.split(r"[^0-9A-Za-z]+", rule)
    name = "".join(w[:1].upper() + w[1:] for w in words if w)
    return name if name[:1].isalpha() else "Rule" + name


def example_rule_class(name: str, written: Any, fused: Any = None, *,
                       dtypes: Sequence[str] | None = None,
                       shapes: Mapping[str, Sequence[Any]] | None = None,
                       commutative: Sequence[str] = (), exact: Sequence[str] = (),
                       associative: bool = False, tolerance: Any = None,
                       example: Callable[..., Any] | None = None, example_space: Any = None,
                       module: str | None = None, doc: str | None = None) -> type:
    """The class of the rule ``written`` -> ``fused`` (a composite without ``fused``).

    Traces each spelling of ``written`` and generalises it; no numeric check (that is
    :func:`patternkit.verification.by_example.rule_by_example`'s).  See there for the
    parameters.

    Raises
    ------
    PatternError
        One line naming the rule and the cause (see :mod:`.signature`, :mod:`.tracing`,
        :mod:`.generalisation`).
    """
    if not isinstance(name, str) or not name.strip():
        raise PatternError(f"rule_by_example: the name must be a non-empty string, found "
                           f"{name!r:.60}")
    spellings = tuple(written) if isinstance(written, (list, tuple)) else (written,)
    if not spellings:
        raise PatternError(f"{name}: written names no function")
    if fused is not None and not callable(fused):
        raise PatternError(f"{name}: fused must be a function with written's parameters "
                           f"(or None for a composite), found {type(fused).__name__} "
                           f"{fused!r:.60}")
    if fused is not None and is_torch_function(fused):
        raise PatternError(f"{name}: fused computes with torch; write it with relax.op "
                           f"(a torch written with a Relax fused is the supported mix)")
    signature = read_signature(name, spellings[0], fused, shapes)
    for other in spellings[1:]:
        read_signature(name, spellings[0], other, shapes)
    accepted = tuple(dtypes) if dtypes is not None else FLOAT_DTYPES
    bad = [d for d in accepted if d not in FLOAT_DTYPES]
    if bad or not accepted:
        raise PatternError(f"{name}: dtypes= takes float dtypes ({', '.join(FLOAT_DTYPES)}),"
                           f" found {bad[0] if bad else 'none'!r}")
    if any(is_torch_function(w) for w in spellings) and dtypes is None:
        accepted = ("float32", "float16", "bfloat16", "float64")
    spec = ExampleSpec(name, spellings, fused, signature, accepted, accepted[0],
                       tuple(exact), tuple(commutative), associative, tolerance,
                       example=example, example_space=example_space)
    pattern: DFPattern | None = None
    shared: dict[str, DFPattern] = {}  # one role, one pattern, in every spelling
    for index in range(len(spellings)):
        func = _pattern_trace(spec, index)
        general = generalise(name, func, signature, named=_named_constants(func, signature),
                             exact=exact, commutative=commutative, associative=associative,
                             roles=shared)
        spec.spellings.append(general)
        pattern = general.pattern if pattern is None else pattern | general.pattern
    spec.pattern = pattern
    if fused is not None:
        try:
            traced = spec.trace_fused(symbolic_types(signature, "float64"))
        except PatternError:
            traced = spec.trace_fused(symbolic_types(signature, accepted[0]))
        spec.fused_text = expression_text(name, traced, signature)
    base: type = ExampleRewrite if fused is not None else ExampleComposite
    attrs: dict[str, Any] = {"spec": spec, "__doc__": doc or spec.describe(),
                             "__module__": module or getattr(spellings[0], "__module__",
                                                             __name__)}
    if fused is None:
        attrs["pattern_name"] = name
    else:
        attrs["name"] = name
    return type(class_name(name), (base,), attrs)


def _pattern_trace(spec: ExampleSpec, index: int) -> relax.Function:
    """Spelling ``index`` traced for its pattern: in float64 when it takes it, so that the
    numbers keep every digit the author wrote (a float32 graph's rounded constant is then
    within float32's rounding of it), else in the first accepted dtype.
    """
    try:
        return spec.trace_written(index, "float64")
    except PatternError:
        return spec.trace_written(index, spec.dtypes[0])


def _named_constants(func: relax.Function, signature: Signature) -> dict[int, str]:
    """Handles of the constants that hold a named-constant parameter's value.

    The trace passes each named constant as one Relax constant; the body holds it as is.
    """
    if not signature.constants:
        return {}
    found: dict[int, str] = {}
    wanted = {name: np.asarray(v) for name, v in signature.constants.items()}

    def visit(expr: Any) -> None:
        if C.is_tensor_constant(expr):
            value = C.const_to_numpy(expr)
            for name, want in wanted.items():
                if name not in found.values() and value.shape == want.shape and np.allclose(
                        value.astype("float64"), want.astype("float64"), rtol=1e-3):
                    found[C.handle(expr)] = name
                    return

    relax.analysis.post_order_visit(func.body, visit)
    return found
