"""The rule model: one base for rewrite rules and composite rules, and what they receive.

One protocol for every rule: a dotted ``name`` (``"batchnorm.collapse"``), what it
matches, ``check(match) -> plan | Reject`` and, for a rewrite, ``rewrite(match)``.  What
it matches is either a ``pattern`` (one root: the binding the rewrite replaces) or a
``context``, a :class:`~patternkit.dpl.context.PatternContext` (several roots: the
bindings a multi-output rewrite replaces); the two are two matching strategies of the
pattern language, and the rule's ``check`` and ``rewrite`` read either match the same way,
by role.  A rule comes in two kinds:

* :class:`RewriteRule`: ``rewrite(match)`` returns the replacement for the matched
  binding (a single-root rule), or ``{Var: replacement}`` for the bindings of the match
  (a multi-root rule);
* :class:`CompositeRule`: a subgraph an external compiler takes; it replaces nothing
  itself, ``MergeComposite`` wraps each accepted match in a ``Composite`` function named
  ``"<compiler>.<pattern_name>"``.

Relay's ``DFPatternCallback`` (``callback(pre, post, node_map)``) is not a third kind: it
is an adapter onto this protocol (:mod:`patternkit.engine.callback`); every entry point
that takes rules turns it into a rule with :func:`as_rule`.

``check(match)`` decides whether a match is taken.  It returns ``True`` to accept, or a
*plan* object (what the check computed, e.g. an axis) which then reaches ``rewrite`` as
``match.plan``, so nothing is computed twice and nothing is stashed on the
rule between the two calls.  To refuse, it returns :func:`reject` with a reason, or a
helper deep inside it raises one (a :class:`Reject` is an exception).

What ``check`` and ``rewrite`` receive is a :class:`RoleMatch`: the matched expressions by
*role*, the rule's named sub-patterns (``match.x``, ``match["gamma"]``, ``"bias" in
match``).  A single-root match (:class:`RuleMatch`) also has Relay's :class:`NodeMap`
(``match.node_map[p][0]``); a multi-root match
(:class:`~patternkit.engine.multi.BindingsMatch`) the block's bindings.

What an expression of a match is (Relax is in A-normal form, Relay was not):

* the root (``match.root``, Relay's ``pre`` and ``post``) is the root binding's value, a
  ``relax.Call`` (or Tuple / TupleGetItem) whose arguments are Vars.  ``pre`` and
  ``post`` are the same object: a match's inputs are Vars, and a Var already refers to
  any rewrite made earlier in the pass, which is what Relay's ``post`` gave;
* wildcard, variable and constant patterns map to the argument as written (a Var or a
  constant); call, tuple and tuple-get-item patterns map to the matched *value* (e.g. the
  ``relax.Call``, so that ``match.conv.attrs`` works), and ``match.var_of("conv")`` (or
  ``node_map.var(p)``) gives the Var that value is bound to.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..dpl.context import PatternContext
from ..dpl.matcher import Match
from ..dpl.pattern import DFPattern, pattern_to_text
from ..errors import PatternError
from ..ir.copying import deepcopy_sharing_tvm_objects
from .tolerance import EXACT, Tolerance, default_tolerance

#: The check as the engines call it: one match in, a check result out.
MatchCheck = Callable[[Any], Any]


# -- refusing a match ----------------------------------------------------------------------
class Reject(Exception):
    """Why a rule does not take a match: return it from ``check``, or raise it from a helper.

    It is falsy, so Relay-style code that tests ``if not check(...)`` keeps working.

    Attributes
    ----------
    reason : str
        One line saying what was expected and what was found.
    at : Relax expression or None
        The offending expression, when there is one.
    site : tuple of (str, int) or None
        File and line of the :func:`reject` call that made it: logs can point at the
        guard that fired, and the library's meta-test checks that every guard has a
        negative test.
    """

    def __init__(self, reason: str, at: Any = None):
        super().__init__(reason)
        self.reason = reason
        self.at = at
        self.site: tuple[str, int] | None = _caller_site(2)

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"reject({self.reason!r})"


class NoSuchExample(ValueError):
    """The knobs given to :meth:`Rule.example` describe no well-typed module.

    Raise it from ``example(**knobs)`` for a combination of knob values that cannot be
    built (parameter shapes that do not broadcast against ``x``, say); verification
    skips such combinations instead of counting them as instances.
    """


def reject(reason: str, at: Any = None) -> Reject:
    """Return (or raise) this from a ``check`` to refuse a match and say why."""
    refusal = Reject(reason, at)
    refusal.site = _caller_site(2)
    return refusal


def _caller_site(depth: int) -> tuple[str, int]:
    # One frame lookup per refusal (~0.2 us): cheap next to the match that preceded it.
    frame = sys._getframe(depth)  # pylint: disable=protected-access
    return frame.f_code.co_filename, frame.f_lineno


def judge(check: Callable[[Any], Any], match: Any) -> tuple[Reject | None, Any]:
    """Run ``check(match)``: ``(None, plan)`` if it accepts, ``(refusal, None)`` if not.

    A raised :class:`Reject` counts as returned; any other exception propagates, for the
    caller to name the rule and the binding.  A true bool accepts with no plan; ``None``
    or a false bool (Relay's ``False``, numpy's too) refuses; any other object is the
    plan, and is never tested for truth: a numpy array is a fine plan, and so is a number
    (an axis of 0, a folded scale ``c1 * c2`` that is a numpy scalar), which once
    accepted as a bare yes and reached ``rewrite`` as ``None``, or refused when it was 0.
    """
    try:
        result = check(match)
    except Reject as refusal:
        return refusal, None
    if result is True:
        return None, None
    if isinstance(result, Reject):
        return result, None
    if result is None or isinstance(result, (bool, np.bool_)):
        if result:
            return None, None
        declined = Reject(f"check returned {result!r}")
        declined.site = None  # the check's own ``return False``, not a reject() call
        return declined, None
    return None, result


# -- what a check and a rewrite receive ----------------------------------------------------
class NodeMap(Mapping[DFPattern, list[Any]]):
    """Pattern -> ``[matched expression]``, Relay's ``node_map``.

    Also carries the check's :attr:`plan` (``None`` when the check returned ``True``), so
    a Relay-style ``callback`` gets what ``check`` computed.
    """

    __slots__ = ("_match", "plan")

    def __init__(self, match: Match, plan: Any = None):
        self._match = match
        self.plan = plan

    def __getitem__(self, pattern: DFPattern) -> list[Any]:
        repeated = self._match.repeated.get(pattern)
        if repeated is not None:  # a dominator's path: every path node, as Relay listed them
            return list(repeated)
        try:
            return [self._match.captures[pattern]]
        except KeyError:
            raise KeyError(f"pattern {pattern_to_text(pattern)} is not part of this match "
                           f"(an unmatched alternative; a divide or multiply the matcher "
                           f"re-associated, so the expression has no such node; or a pattern "
                           f"from another rule)") from None

    def __iter__(self) -> Iterator[DFPattern]:
        return iter(self._match.captures)

    def __len__(self) -> int:
        return len(self._match.captures)

    def __contains__(self, pattern: object) -> bool:
        return pattern in self._match.captures or pattern in self._match.repeated

    def var(self, pattern: DFPattern) -> Any:
        """The Var bound to the value ``pattern`` matched (the expression itself for leaves)."""
        return self._match.bound_vars.get(pattern, self[pattern][0])

    @property
    def match(self) -> Match:
        """The pattern matcher's record underneath, for what roles do not name."""
        return self._match


def role_pattern(roles: Mapping[str, DFPattern], key: str | DFPattern) -> DFPattern:
    """The sub-pattern a match is indexed by: a pattern as given, or a role by name."""
    if isinstance(key, DFPattern):
        return key
    try:
        return roles[key]
    except KeyError:
        raise KeyError(f"no role {key!r} in this rule (roles: "
                       f"{', '.join(roles) or 'none'})") from None


#: What a role missing from a match's captures reads as: one dict look-up, not two.
_ABSENT = object()


class RoleMatch:
    """A match read by role: what every rule's ``check`` and ``rewrite`` receive.

    ``match.gamma`` / ``match["gamma"]`` is what the role ``gamma`` matched
    (``AttributeError`` / ``KeyError`` when it is not part of the match; ``"gamma" in
    match`` tells), :attr:`plan` what the rule's check returned, :attr:`root` where the
    match is (the root binding's value, or a multi-root match's first binding).  The two
    matching strategies give the two subclasses, :class:`RuleMatch` (one root) and
    :class:`~patternkit.engine.multi.BindingsMatch` (several); they say what a role
    matched (:meth:`_matched`), this class reads it by name.
    """

    __slots__ = ("_roles", "plan")

    def __init__(self, roles: Mapping[str, DFPattern], plan: Any = None):
        self._roles = roles
        self.plan = plan

    def _matched(self, pattern: DFPattern) -> Any:
        """What ``pattern`` matched; ``KeyError`` when it is not part of the match."""
        raise NotImplementedError

    def _has(self, pattern: DFPattern) -> bool:
        raise NotImplementedError

    @property
    def root(self) -> Any:
        """The matched root expression (a subclass says which, for several roots)."""
        raise NotImplementedError

    def _pattern(self, key: str | DFPattern) -> DFPattern:
        return role_pattern(self._roles, key)

    @property
    def roles(self) -> tuple[str, ...]:
        """The names of the roles that matched."""
        return tuple(r for r, p in self._roles.items() if self._has(p))

    def __getitem__(self, key: str | DFPattern) -> Any:
        pattern = self._pattern(key)
        try:
            return self._matched(pattern)
        except KeyError:
            raise KeyError(f"role {key!r} is not part of this match (an alternative that "
                           f"did not match; test with `{key!r} in match`)") from None

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            pattern = self._roles.get(key)
        else:
            pattern = key if isinstance(key, DFPattern) else None
        return pattern is not None and self._has(pattern)

    def __getattr__(self, role: str) -> Any:
        if role.startswith("__"):  # copy, pickle and friends probe for dunders
            raise AttributeError(role)
        try:
            return self[role]
        except KeyError as err:
            raise AttributeError(err.args[0]) from None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {', '.join(self.roles)}>"


class RuleMatch(RoleMatch):
    """One match of a single-root rule's pattern, read by role.

    Besides what a :class:`RoleMatch` reads, ``match.var_of("conv")`` is the Var a call
    role's value is bound to and :attr:`node_map` Relay's pattern-keyed view.  A role
    whose name is one of the attributes is read with ``match[name]``.

    Parameters
    ----------
    match : patternkit.Match
        What the matcher found.
    roles : mapping of str to DFPattern
        The rule's named sub-patterns (:meth:`Rule.roles`).
    plan : object, optional
        What the rule's check returned (``None`` for ``True``).
    """

    __slots__ = ("_match", "_node_map")

    def __init__(self, match: Match, roles: Mapping[str, DFPattern], plan: Any = None):
        # RoleMatch's two slots set here: one per match, on the driver's hot path.
        self._roles = roles
        self.plan = plan
        self._match = match
        self._node_map: NodeMap | None = None

    @property
    def root(self) -> Any:
        """The root binding's value (Relay's ``pre``)."""
        return self._match.root

    @property
    def node_map(self) -> NodeMap:
        """Relay's pattern-keyed view of the same match."""
        if self._node_map is None:
            self._node_map = NodeMap(self._match, self.plan)
        return self._node_map

    def _matched(self, pattern: DFPattern) -> Any:
        repeated = self._match.repeated.get(pattern)
        if repeated is not None:  # a dominator's path: the list of its path nodes
            return list(repeated)
        return self._match.captures[pattern]

    def _has(self, pattern: DFPattern) -> bool:
        return pattern in self._match.captures or pattern in self._match.repeated

    def __getitem__(self, key: str | DFPattern) -> Any:
        # the common case, a role (by name or by pattern) that matched one node: two
        # look-ups; checks read a match a dozen times or more
        pattern = self._roles.get(key) if isinstance(key, str) else key
        match = self._match
        if pattern is not None and not match.repeated:
            found = match.captures.get(pattern, _ABSENT)
            if found is not _ABSENT:
                return found
        return super().__getitem__(key)

    def __getattr__(self, role: str) -> Any:
        # Checks read roles this way several times per match: the common case is two
        # dict look-ups here, the rest goes by RoleMatch.
        if role.startswith("__"):
            raise AttributeError(role)
        pattern = self._roles.get(role)
        match = self._match
        if pattern is not None and not match.repeated and pattern in match.captures:
            return match.captures[pattern]
        return super().__getattr__(role)

    def tag(self, tag: str) -> str | None:
        """The name of the alternative of ``alt(..., tag=tag)`` that matched (``None``:
        no alternative of that tag is part of the match); see :func:`patternkit.dpl.alt`.
        """
        return self._match.tag(tag)

    def var_of(self, key: str | DFPattern) -> Any:
        """The Var bound to the value a role matched (the expression itself for leaves)."""
        pattern = self._pattern(key)
        return self._match.bound_vars.get(pattern, self[key])


# -- methods of rule variants ---------------------------------------------------------------
class variant_method:  # noqa: N801  (a decorator, named like staticmethod and classmethod)
    """A rule method whose result depends on the rule's variant (its constructor arguments).

    On an instance it is that instance's method; on the class it is the method of the
    default variant, ``cls()``.  A rule whose variants need different examples (a
    ``conv2d + silu`` composite does not fire on a ``conv2d + relu`` block) decorates
    ``example`` and ``example_space`` with it: ``rule.example()`` is then an instance
    ``rule`` fires on, and ``Rule.example()`` keeps working as the static method it was
    before the rule had variants.

    >>> class Scaled(RewriteRule):                                  # doctest: +SKIP
    ...     def __init__(self, factor=2.0): ...
    ...     @variant_method
    ...     def example(self, dtype="float32"): ...                 # uses self.factor
    """

    def __init__(self, method: Callable[..., Any]):
        self.method = method
        self.__doc__ = method.__doc__
        self.__wrapped__ = method

    def __get__(self, instance: Any, owner: type) -> Callable[..., Any]:
        bound: Callable[..., Any] = self.method.__get__(
            owner() if instance is None else instance, owner)
        return bound


# -- the rules -----------------------------------------------------------------------------
class Rule:
    """The rule protocol: a dotted name, a pattern or a context, a check; the base of both kinds.

    Subclasses set :attr:`pattern` (one root) or :attr:`context` (several roots, a
    :class:`~patternkit.dpl.context.PatternContext`) in ``__init__``; sub-patterns kept as
    attributes are the roles.  They override :meth:`check` to refuse matches (it
    receives a :class:`RoleMatch` and returns ``True``, a plan, or :func:`reject`), and
    :meth:`example` to give the library's verification a module to run on.  The name is
    a class attribute (``name = "batchnorm.collapse"``) or set in ``__init__`` for rules
    whose variants have names of their own; it defaults to the class name.
    """

    # TVM objects a rule holds (constants) are shared: TVM 0.27 crashes copying them.
    __deepcopy__ = deepcopy_sharing_tvm_objects

    #: Roles whose binding may also be read outside the match.  A match is normally
    #: skipped when one of its interior results has another reader (the replacement would
    #: leave that computation duplicated); a role named here does not count, and its
    #: binding stays for the other readers.  For bindings that cost nothing to keep, such
    #: as the no-op ``astype`` an ONNX export ties to a residual.
    escapable_roles: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.pattern: DFPattern | None = None
        self.context: PatternContext | None = None

    @property
    def name(self) -> str:
        """Dotted rule name (``"<family>.<rule>"``); defaults to the class name."""
        return self.__dict__.get("_name") or type(self).__name__

    @name.setter
    def name(self, value: str) -> None:
        self.__dict__["_name"] = value

    @property
    def rule_name(self) -> str:
        """:attr:`name` (the name it had when rules kept their name in two attributes)."""
        return self.name

    @property
    def multi_root(self) -> bool:
        """Does the rule match a context of several roots rather than one pattern?"""
        return getattr(self, "context", None) is not None

    def root_patterns(self) -> tuple[DFPattern, ...]:
        """The patterns a match ends in: the pattern, or the context's patterns nothing reads.

        What :func:`~patternkit.dpl.explain` is asked about when a rule neither fires nor
        says why (a multi-root rule has no single pattern to explain).
        """
        if self.context is not None:
            return tuple(p for p in self.context.patterns if not self.context.consumers(p))
        return () if self.pattern is None else (self.pattern,)

    def roles(self) -> dict[str, DFPattern]:
        """Named sub-patterns (``x``, ``gamma``...): by default the pattern attributes."""
        return {name: value for name, value in vars(self).items()
                if isinstance(value, DFPattern) and name != "pattern"}

    def check(self, match: RoleMatch) -> Any:
        """``True`` or a plan to accept the match, :func:`reject` (returned or raised) to refuse."""
        return True

    def validate(self) -> None:
        """Raise :class:`PatternError` unless the rule has what it matches: a patternkit
        pattern, or a valid context.
        """
        if self.multi_root:
            if not isinstance(self.context, PatternContext):
                raise PatternError(f"{self.name}.context must be a patternkit PatternContext; "
                                   f"found {type(self.context).__name__}")
            self.context.validate()
            return
        pattern = getattr(self, "pattern", None)
        if not isinstance(pattern, DFPattern):
            found = ("None (set self.pattern, or self.context for several roots, in "
                     "__init__)" if pattern is None
                     else f"a {type(pattern).__module__}.{type(pattern).__name__}")
            raise PatternError(f"{self.name}.pattern must be a patternkit pattern "
                               f"(wildcard(), is_op(...), ...); found {found}")

    def example(self, **knobs: Any) -> Any:
        """A small ``tvm.IRModule`` the rule fires on, for ``patternkit verify``; ``None``: none.

        Keyword arguments (all with defaults) may vary the instance: dtype, layout, rank,
        parameter shapes, symbolic dimensions.  :meth:`example_space` says which values
        each may take, and the library's verification draws instances from it; a
        combination that makes no well-typed module raises :class:`NoSuchExample`.
        """
        return None

    def example_space(self) -> dict[str, Sequence[Any]] | list[dict[str, Sequence[Any]]]:
        """The degrees of freedom of :meth:`example`: keyword -> the values it may take.

        Each value list starts with the default and should reach the guard's edges (a
        dtype the rule must handle, a layout it must refuse, a shape whose dimensions
        collide with the channel count).  ``{}``: the example has no knobs.
        """
        return {}

    def tolerance(self, dtype: str | None) -> Tolerance:
        """How far the rule's result may drift from its input on llvm, for ``dtype`` results.

        Verification (``patternkit verify``, the rule contract) holds the rule to it.  The
        default (:func:`patternkit.engine.tolerance.default_tolerance`) is exact for
        integer dtypes and ``max(1e-5, 8 * eps)`` for floating ones; a rule whose
        arithmetic needs more (or promises less) overrides this and says why.
        """
        return default_tolerance(dtype)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class RewriteRule(Rule):
    """A rule that replaces each accepted match: ``rewrite(match) -> replacement``.

    Parameters
    ----------
    rewrite_once : bool
        Apply the rule in the first round only instead of until nothing changes.

    ``rewrite`` returns a Relax expression whose type fits the root binding, or ``None``
    (or the root itself) to leave the binding as it is.  A rule with a :attr:`context`
    (several roots) returns ``{Var: replacement}`` for bindings of the match
    (``match.owned``; an empty dict or ``None`` leaves the match alone).
    """

    def __init__(self, rewrite_once: bool = False):
        super().__init__()
        self.rewrite_once = rewrite_once

    def rewrite(self, match: RoleMatch) -> Any:
        """The replacement for ``match.root``; ``match.plan`` is what :meth:`check` returned.

        ``None`` (or ``match.root`` itself) leaves the binding as it is; the driver
        records it as a declined match (:class:`~patternkit.engine.skip.Skip`)
        and logs it.
        """
        raise NotImplementedError(f"{self.name} must implement rewrite(match)")


class CompositeRule(Rule):
    """A subgraph an external compiler takes: a pattern-table entry with a check.

    Parameters
    ----------
    compiler : str
        The codegen that takes the composite; the rule is named
        ``"<compiler>.<pattern_name>"`` (``"ccompiler.conv2d_add_relu"``).

    Pass the rule itself to :class:`patternkit.PatternTable`, ``MergeComposite`` or
    ``offload_report`` (a :class:`patternkit.RuleSet` of them works too).
    """

    #: The composite's name after the compiler prefix; subclasses set it.
    pattern_name: str = ""

    def tolerance(self, dtype: str | None) -> Tolerance:
        """:data:`EXACT` for every dtype: a composite only wraps bindings in a function."""
        return EXACT

    def __init__(self, compiler: str = "byoc"):
        super().__init__()
        self.compiler = _compiler_name(type(self).__name__, compiler)

    @property
    def name(self) -> str:
        """``"<compiler>.<pattern_name>"``: derived, so :meth:`for_compiler` renames it."""
        return f"{self.compiler}.{self.pattern_name or type(self).__name__}"

    @name.setter
    def name(self, value: str) -> None:
        raise AttributeError(f"{type(self).__name__}: a composite is named "
                             f"'<compiler>.<pattern_name>'; set pattern_name, not name")

    def for_compiler(self, compiler: str) -> CompositeRule:
        """The same rule named for ``compiler`` (patterns are shared; they are immutable)."""
        if compiler == self.compiler:
            return self
        renamed = copy.copy(self)  # keeps every variant argument the rule was built with
        renamed.compiler = _compiler_name(type(self).__name__, compiler)
        return renamed

    def entry(self) -> tuple[str, DFPattern | None, Callable[[Any, NodeMap], Any] | None]:
        """``(name, pattern, check)`` for a hand-built pattern table.

        ``check`` is Relay's ``check(pre, node_map)``; it runs this rule's check on the
        match.  Passing the rule itself to a table is equivalent.
        """
        check = check_of(self)
        if check is None:
            return (self.name, self.pattern, None)
        roles = self.roles()

        def relay_check(pre: Any, node_map: NodeMap) -> Any:
            return check(RuleMatch(node_map.match, roles))

        return (self.name, self.pattern, relay_check)


def check_of(rule: Rule) -> MatchCheck | None:
    """``rule.check``, or ``None`` when the rule accepts every match (it does not override
    :meth:`Rule.check`): the engines then skip the call.
    """
    return None if type(rule).check is Rule.check else rule.check


def as_rule(candidate: Any, where: str = "rule") -> Rule:
    """``candidate`` as a :class:`Rule`: a rule as it is, an adapter's rule (an object with
    ``as_rule()``, such as a ``DFPatternCallback``) as it converts itself.

    Every entry point that takes rules goes through here, so the engines see one protocol.
    """
    require_instance(candidate, where)
    if isinstance(candidate, Rule):
        return candidate
    convert = getattr(candidate, "as_rule", None)
    rule = convert() if callable(convert) else None
    if not isinstance(rule, Rule):
        raise PatternError(f"{where}: expected a rule (a RewriteRule, CompositeRule or "
                           f"DFPatternCallback), found {type(candidate).__name__}: "
                           f"{candidate!r:.80}")
    return rule


def is_rule(candidate: Any) -> bool:
    """Is ``candidate`` a rule, or an adapter onto one (a ``DFPatternCallback``)?"""
    return isinstance(candidate, Rule) or (not isinstance(candidate, type)
                                           and callable(getattr(candidate, "as_rule", None)))


def require_instance(candidate: Any, where: str) -> None:
    """Refuse a rule *class* where a rule is expected, saying how to make the instance.

    ``pk.rewrite(BatchnormCollapse, mod)`` would otherwise fail deep inside with
    ``'type' object is not iterable``: every entry point that takes rules calls this.
    """
    if isinstance(candidate, type) and (issubclass(candidate, Rule)
                                        or callable(getattr(candidate, "as_rule", None))):
        name = candidate.__name__
        raise PatternError(f"{where}: {name} is a rule class, not a rule; pass an instance: "
                           f"{name}()")


def _compiler_name(rule: str, compiler: Any) -> str:
    if not isinstance(compiler, str) or not compiler or "." in compiler:
        raise ValueError(f"{rule}: compiler must be a non-empty name without dots, "
                         f"found {compiler!r}")
    return compiler
