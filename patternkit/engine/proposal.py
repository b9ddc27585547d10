"""Find the non-overlapping matches of a pattern in a function (Relay's PatternGrouper).

Relay's rewriter and partitioner both start by *grouping* matches: roots are tried from
the function's result back towards its inputs, each match claims its interior nodes,
and a later root whose match would reuse a claimed node is skipped.  A match is also
skipped when one of its interior results is read outside the match (rewriting it would
leave that reader without a value); dead code reading it does not count (see
:mod:`~patternkit.engine.index`).  This module reproduces those rules on Relax
bindings, with the reason for every skipped match recorded for reports and tests
(:class:`~patternkit.engine.skip.Skip`: its kind, the bindings the match covered, and why).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from tvm import relax

from ..dpl.dominator import Uses
from ..dpl.matcher import Match, Matcher
from ..dpl.pattern import DFPattern, root_op_names
from ..ir import compat as C
from .index import FunctionIndex
from .rule import MatchCheck, Reject, RuleMatch, judge
from .skip import Skip, SkipKind


@dataclass
class Group:
    """One accepted match rooted at a binding.

    ``gid`` numbers groups in discovery order, from the function's result backwards, as
    Relay did (the outermost batch norm of a chain is group 0).  ``plan`` is what the
    check returned when it accepted the match (``None`` for ``True`` or no check).
    """

    position: tuple[int, int]
    binding: Any
    match: Match
    gid: int = 0
    plan: Any = None
    _root_var: Any = field(default=None, repr=False, compare=False)

    @property
    def root_var(self) -> relax.Var:
        """The Var the group's root binding defines."""
        # Read once: the driver asks for it several times per group, each an FFI read.
        if self._root_var is None:
            self._root_var = self.binding.var
        return self._root_var

    @property
    def interior(self) -> list[Any]:
        """Vars of the bindings the match replaces, root last."""
        return [*self.match.internal, self.binding.var]


#: The old name of :class:`~patternkit.engine.skip.Skip` here (one record for every pass).
Skipped = Skip


def adapt_check(check: Callable[..., Any]) -> MatchCheck:
    """Relay's ``check(pre)`` or ``check(pre, node_map)`` as a check of a :class:`RuleMatch`."""
    try:
        params = [p for p in inspect.signature(check).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        wants_node_map = len(params) >= 2
    except (TypeError, ValueError):  # builtins and C callables: assume check(pre)
        wants_node_map = False
    if wants_node_map:
        return lambda match: check(match.root, match.node_map)
    return lambda match: check(match.root)


def group_check(check: MatchCheck, roles: Mapping[str, DFPattern],
                on_error: Callable[[Group, Exception], Exception]) -> Callable[[Group], Any]:
    """``check`` as :func:`find_groups` calls it, on each group's :class:`RuleMatch`.

    A :class:`~patternkit.engine.rule.Reject` it raises is a refusal; any other exception
    becomes ``on_error(group, err)`` (chained), which names the rule and the binding.
    """
    def run(group: Group) -> Any:
        try:
            return check(RuleMatch(group.match, roles))
        except Reject:
            raise
        except Exception as err:
            raise on_error(group, err) from err

    return run


#: How many candidate roots :func:`find_groups` tests with the index's root check before
#: it judges whether the check pays: a composite entry's roots mostly match (every
#: ``matmul`` of GPT-2 takes its bias), and testing them all costs more than the matcher
#: saves.  Either way the matcher sees every root that can match.
CHECK_PROBE = 16


def find_groups(index: FunctionIndex, pattern: DFPattern,
                check: Callable[[Group], Any] | None = None,
                allow_escaping_intermediates: bool = False, *,
                taken: Mapping[int, tuple[str, Any]] | None = None,
                extra_readers: Mapping[int, list[tuple[str, Any]]] | None = None,
                report_claimed: bool = True, escapable: Sequence[DFPattern] = (),
                rule: str = "", function: str = "",
                ) -> tuple[list[Group], list[Skip]]:
    """Accepted groups (in program order) and the matches that were skipped.

    Dead code is never a root: as in Relay, where it was unreachable from the result,
    rules only see what the function computes.

    Parameters
    ----------
    check : callable, optional
        Called with each candidate :class:`Group` (see :func:`group_check`); it accepts,
        or refuses, as a rule's check does (:func:`~patternkit.engine.rule.judge`).  What
        it accepts with becomes the group's ``plan``.  Exceptions other than a
        ``Reject`` propagate to the caller, which names the rule.
    allow_escaping_intermediates : bool
        Accept matches whose interior results are also read outside the match (their
        bindings are then kept alongside the rewrite, as ``rewrite_call`` does).
    taken : mapping, optional
        Handles of bindings that earlier rules of the same round replaced or absorbed,
        each with ``(rule name, root Var)`` of the match that took it; a match touching
        one is skipped as an overlap.
    rule, function : str
        The names each :class:`~patternkit.engine.skip.Skip` records.
    extra_readers : mapping, optional
        Handle -> ``(rule name, root Var)`` of each earlier replacement of the round that
        reads it: reads the function index does not know of, which make an
        intermediate escape.
    report_claimed : bool
        Also match the candidate roots that an earlier group of this pattern already
        claimed, or that an earlier rule of the round took (``taken``), to report them as
        overlaps (Relay skipped them silently).  It costs a match per such root; the
        rewrite driver asks for it only when it keeps a log.
    """
    claimed: dict[int, Any] = {}  # handle -> root Var of the accepted group that claimed it
    groups: list[Group] = []
    skipped: list[Skip] = []
    uses = Uses(index.readers, index.escaping)  # what a dominator's reconvergence reads
    matchers = [Matcher(call_args=index.call_args, table=table, uses=uses,
                        call_ops=index.call_ops)
                for table in index.values]
    dead = index.dead_code
    keys, values = index.keys, index.values
    check_root = index.root_check(pattern)
    tested = passed = 0
    for position in reversed(index.candidates(root_op_names(pattern))):
        root_key = keys[position[0]][position[1]][0]  # the root's handle, without an FFI read
        if root_key in dead:
            continue
        if not report_claimed and (root_key in claimed or (taken and root_key in taken)):
            continue  # a match here would be an overlap, and nobody asks why
        if check_root is not None:  # a root the matcher would fail, dropped cheaply
            tested += 1
            accepted = check_root(position)
            passed += accepted
            if tested == CHECK_PROBE and 2 * passed > tested:
                check_root = None  # most roots pass: the matcher alone is cheaper
            if not accepted:
                continue
        binding = index.binding_at(position)
        # the value as the index holds it (no FFI read), unless the binding is impure
        value = values[position[0]].get(root_key)
        found = matchers[position[0]].match(pattern, binding.value if value is None else value)
        if found is None:
            continue
        var = binding.var
        covered = (*found.internal, var)
        overlap = (var if root_key in claimed else
                   next((v for v, k in zip(found.internal, found.internal_keys) if k in claimed),
                        None))
        if overlap is not None:
            skipped.append(Skip(rule, function, C.var_name(var),
                                f"overlaps a match that already claimed "
                                f"'{C.var_name(overlap)}'", position=position,
                                kind=SkipKind.OVERLAP, covered=covered))
            continue
        if taken:
            by = next(((v, taken[k]) for v, k in zip(covered, (*found.internal_keys, root_key))
                       if k in taken), None)
            if by is not None:
                skipped.append(Skip(
                    rule, function, C.var_name(var),
                    f"overlaps the match of {_taker(by[1])} (earlier in this round), which "
                    f"already took '{C.var_name(by[0])}'",
                    position=position, kind=SkipKind.OVERLAP, covered=covered))
                continue
        group = Group(position, binding, found, gid=len(groups), _root_var=var)
        if not allow_escaping_intermediates:
            escape = _escaping_use(index, group, extra_readers, escapable)
            if escape is not None:
                skipped.append(Skip(rule, function, C.var_name(var), escape,
                                    position=position, kind=SkipKind.ESCAPE, covered=covered))
                continue
        if check is not None:
            refusal, group.plan = judge(check, group)
            if refusal is not None:
                skipped.append(Skip(rule, function, C.var_name(var), refusal.reason, refusal,
                                    kind=SkipKind.CHECK, position=position, covered=covered))
                continue
        claimed[root_key] = var
        for key in found.internal_keys:
            claimed[key] = var
        groups.append(group)
    groups.reverse()
    return groups, skipped


def _escaping_use(index: FunctionIndex, group: Group,
                  extra_readers: Mapping[int, list[tuple[str, Any]]] | None = None,
                  escapable: Sequence[DFPattern] = ()) -> str | None:
    """Why an interior result of ``group`` is needed outside it, or ``None``.

    Counts suffice on the hot path: an interior Var escapes when the match's own
    bindings read it fewer times than the whole function does, and then only if some
    of the other readers are live (dead code's reads are not uses).  The bindings of
    ``escapable`` patterns may have other readers (a rule's ``escapable_roles``).
    """
    internal = group.match.internal_keys
    allowed = set()
    if escapable:
        bound = group.match.bound_vars
        allowed = {C.handle(bound[p]) for p in escapable if p in bound}
    members = [*internal, C.handle(group.root_var)]
    inside: dict[int, int] = {}
    reads, escaping, readers = index.reads, index.escaping, index.readers
    for member in members:
        for read in reads[member]:
            inside[read] = inside.get(read, 0) + 1
    for var, key in zip(group.match.internal, internal):
        if key in allowed:
            continue  # the binding stays for its other readers
        if key in escaping:
            return (f"intermediate '{C.var_name(var)}' is an output of its block or of "
                    f"the function")
        if extra_readers and key in extra_readers:
            return (f"intermediate '{C.var_name(var)}' is also read by the replacement "
                    f"made by {_taker(extra_readers[key][0])} (earlier in this round)")
        if inside.get(key, 0) < readers.get(key, 0):
            member_set = set(members)
            dead = index.dead_code
            outside = [u for u in index.users_of(key) if u not in member_set and u not in dead]
            if outside:
                return (f"intermediate '{C.var_name(var)}' is also used by "
                        f"'{C.var_name(index.var_of(outside[0]))}' outside the match")
    return None


def _taker(taker: tuple[str, Any]) -> str:
    """``"'rule' at 'lv3'"`` for a ``(rule name, root Var)`` pair."""
    rule, root = taker
    return f"'{rule}' at '{C.var_name(root)}'"


def match_bindings(target: Any, func: relax.Function,
                   roles: dict[str, DFPattern] | None = None) -> list[dict[str, Any]]:
    """Every match of a pattern or a rule in ``func`` as a ``{role: Var or Expr}`` dict.

    The format the visualiser's ``highlight=`` takes.  ``target`` is a pattern, or a rule
    (anything with a ``pattern`` and ``roles()``, whose role names are then reported).
    ``roles`` names the patterns to report; without roles the root is ``"root"``, each
    input is ``"input<i>"`` and each interior binding is named after its operator.
    Constants are left out: drawings fold them into their consumer.  Matches are
    grouped as for a rewrite, but intermediates read elsewhere do not hide a match.
    """
    if isinstance(target, DFPattern):
        pattern = target
    else:
        rule_pattern = getattr(target, "pattern", None)
        if not isinstance(rule_pattern, DFPattern):
            raise TypeError(f"expected a pattern or a rule with a pattern, found "
                            f"{type(target).__name__}")
        pattern = rule_pattern
        if roles is None and callable(getattr(target, "roles", None)):
            roles = target.roles()
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return []
    index = FunctionIndex.build(func)
    groups, _ = find_groups(index, pattern, allow_escaping_intermediates=True)
    found = []
    for group in groups:
        m = group.match
        entry: dict[str, Any] = {"root": group.root_var}
        if roles:
            for role, pat in roles.items():
                # Constants are drawn folded into their consumer, so they have no node.
                if pat in m.captures and not C.is_constant(m.captures[pat]):
                    entry[role] = m.bound_vars.get(pat, m.captures[pat])
        else:
            for i, expr in enumerate(m.inputs):
                if not C.is_constant(expr):
                    entry[f"input{i}"] = expr
        for var in m.internal:  # interior bindings, so the whole match is outlined
            value = index.binding_at(index.position_of(var)).value
            name = (C.op_name(value) or type(value).__name__).removeprefix("relax.")
            role, k = name, 1
            while role in entry:
                k += 1
                role = f"{name}#{k}"
            entry[role] = var
        found.append(entry)
    return found
