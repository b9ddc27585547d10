"""Pattern tables: the ordered, validated list of composites an external compiler takes.

Relay's ``MergeComposite(table)`` took a list of ``(name, pattern[, check])`` entries,
earlier entries winning.  :class:`PatternTable` validates such a list once (unique,
dotted names; patterns; callable checks), keeps its order as the priority, and can hand
it to TVM's own ``FuseOpsByPattern`` (:meth:`PatternTable.to_fusion_patterns`).  Rules
(:class:`patternkit.CompositeRule`) and rule sets are entries too: a rule brings its
check and its named roles.

TVM's registered tables come in with :meth:`PatternTable.from_tvm`: each
``FusionPattern`` becomes an entry whose pattern is converted by
:func:`patternkit.from_dpl`, whose roles are TVM's annotation patterns and whose check
is TVM's own, run on a ``PatternCheckContext``-compatible object
(:mod:`patternkit.byoc.tables.check_context`).  Such a table follows TVM's matching semantics
by default (``semantics="tvm"``, see :mod:`patternkit.byoc.merge`); repeated names are
variants of one composite (``cutlass.stacked_attention`` has four patterns).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from tvm import relax

from ...dpl.from_tvm import FromDplError
from ...dpl.matcher import Matcher
from ...dpl.pattern import DFPattern
from ...engine.proposal import adapt_check
from ...engine.rule import MatchCheck, Rule, RuleMatch, check_of, judge, require_instance
from ...engine.ruleset import RuleSet
from ...errors import CallbackError, PatternkitError
from ...ir import compat as C
from . import tvm_tables

logger = logging.getLogger(__name__)

#: The matching semantics a table may follow (see :mod:`patternkit.byoc.merge`).
SEMANTICS = ("relay", "tvm")


class PatternTableError(PatternkitError, ValueError):
    """A pattern table entry is malformed (the message names the entry)."""


@dataclass(frozen=True)
class CompositeEntry:
    """One row of a pattern table.

    Attributes
    ----------
    name : str
        The ``Composite`` attribute of the functions this entry forms, dotted as
        ``"<compiler>.<pattern>"`` (``"ccompiler.conv_add_relu"``).
    pattern : DFPattern
    check : callable or None
        ``check(pre)`` or ``check(pre, node_map)``; return ``True`` to accept,
        ``False`` or :func:`patternkit.reject` (with a reason) to veto.  For an entry
        made from a rule, the rule's own check.
    priority : int
        Position in the table; ``0`` wins over everything else.
    rule : Rule or None
        The rule the entry was made from (it gives the check its named roles).
    tvm_check : callable or None
        For an entry from a TVM table: TVM's ``check(PatternCheckContext) -> bool``,
        which the passes call with a :class:`~patternkit.byoc.tables.check_context.CheckContext`.
    annotations : mapping of str to DFPattern
        For an entry from a TVM table: TVM's annotation patterns (nodes of ``pattern``),
        which are the entry's roles.
    attrs_getter : callable or None
        TVM's ``attrs_getter(annotated_expr)``: extra attributes of the composite.
    source : tvm.relax.transform.FusionPattern or None
        The TVM pattern the entry was converted from.
    accept : callable or None
        The check as the passes call it, on a :class:`patternkit.RuleMatch`; derived
        (``None`` for a TVM entry, whose check needs the function: ``tvm_check``).
    roles : mapping
        The rule's named sub-patterns, or a TVM entry's annotations (empty for a tuple
        entry); derived.
    """

    name: str
    pattern: DFPattern
    check: Callable | None = None
    priority: int = 0
    rule: Rule | None = None
    tvm_check: Callable | None = field(default=None, repr=False, compare=False)
    annotations: Mapping[str, DFPattern] = field(default_factory=dict, repr=False,
                                                 compare=False)
    attrs_getter: Callable | None = field(default=None, repr=False, compare=False)
    source: Any = field(default=None, repr=False, compare=False)
    accept: MatchCheck | None = field(init=False, repr=False, compare=False)
    roles: Mapping[str, DFPattern] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rule is not None:
            accept, roles = check_of(self.rule), self.rule.roles()
        else:
            accept = adapt_check(self.check) if self.check is not None else None
            roles = dict(self.annotations)
        object.__setattr__(self, "accept", accept)  # frozen: derived once, here
        object.__setattr__(self, "roles", roles)

    @property
    def from_tvm(self) -> bool:
        """Was the entry converted from a TVM ``FusionPattern``?"""
        return self.source is not None

    @property
    def compiler(self) -> str | None:
        """The prefix before the first ``.`` (the codegen name), or ``None``."""
        return self.name.split(".", 1)[0] if "." in self.name else None


#: The tables of the last rule sets :meth:`PatternTable.of` was given, by ``(id, compiler)``;
#: each kept with its rule set, so that the id cannot be taken by another.
_TABLES_OF_RULESETS: dict[tuple[int, str | None], tuple[Any, "PatternTable"]] = {}
_RULESET_TABLES_KEPT = 8


class PatternTable(Sequence):
    """A validated, ordered pattern table (earlier entries have higher priority).

    Parameters
    ----------
    entries : iterable or RuleSet
        ``(name, pattern)`` or ``(name, pattern, check)`` tuples, :class:`CompositeEntry`
        objects, rules (:class:`patternkit.CompositeRule` such as
        :class:`patterns.conv.ConvAddReluComposite`, or any object with
        ``name``/``pattern`` and optionally ``check`` attributes), or a
        :class:`patternkit.RuleSet`, whose composites become the table.
    compiler : str, optional
        When given, every name must start with ``"<compiler>."``.
    semantics : {"relay", "tvm"}
        The matching semantics ``MergeComposite`` follows with this table by default
        (:mod:`patternkit.byoc.merge`): Relay's for patternkit's own tables, TVM's
        ``FuseOpsByPattern`` for a table from :meth:`from_tvm`.  A table given as a
        table keeps its own unless this is given.
    variants : bool
        Allow repeated names: each row is a variant of the one composite (TVM's tables
        do this); otherwise a repeated name is an error.

    Raises
    ------
    PatternTableError
        An entry that is not a 2- or 3-tuple, a name that is empty, duplicated or (with
        ``compiler``) lacks the prefix, a pattern that is not a pattern, a check that is
        not callable, an unknown ``semantics``.  The message names the entry and its
        position.
    """

    def __init__(self, entries: Iterable[Any], compiler: str | None = None, *,
                 semantics: str | None = None, variants: bool | None = None):
        require_instance(entries, "PatternTable")
        if isinstance(entries, PatternTable):
            semantics = entries.semantics if semantics is None else semantics
            variants = entries.variants if variants is None else variants
            entries = list(entries)
        elif isinstance(entries, RuleSet):
            entries = list(entries.composites())
        if isinstance(entries, (str, bytes)) or not isinstance(entries, Iterable):
            raise PatternTableError("a pattern table is a list of (name, pattern[, check]) "
                                    f"entries, found {type(entries).__name__}")
        semantics = "relay" if semantics is None else semantics
        if semantics not in SEMANTICS:
            raise PatternTableError(f"semantics must be one of {', '.join(SEMANTICS)}, found "
                                    f"{semantics!r}")
        self.compiler = compiler
        self.semantics: str = semantics
        self.variants: bool = bool(variants)
        self._entries: list[CompositeEntry] = []
        seen: dict[str, int] = {}
        for i, raw in enumerate(entries):
            entry = _as_entry(raw, i)
            if entry.name in seen and not self.variants:
                raise PatternTableError(
                    f"pattern table entry {i} ('{entry.name}') repeats the name of entry "
                    f"{seen[entry.name]}; composite names must be unique")
            if compiler is not None and not entry.name.startswith(compiler + "."):
                raise PatternTableError(
                    f"pattern table entry {i} ('{entry.name}') must be named "
                    f"'{compiler}.<pattern>' for compiler '{compiler}'"
                    f"{_renaming_hint(raw, compiler)}")
            seen.setdefault(entry.name, i)
            self._entries.append(entry)

    @classmethod
    def of(cls, table: Any, compiler: str | None = None) -> "PatternTable":
        """``table`` as a validated :class:`PatternTable`, validated once.

        A :class:`PatternTable` was validated when it was made and is returned as it is
        (unless ``compiler`` asks for a prefix it was not checked for); the table of a
        :class:`patternkit.RuleSet`, which cannot change, is kept for the next call.  A
        pass applied function after function, or a library applied model after model,
        then checks its 45 entries once, not on every call.
        """
        if isinstance(table, PatternTable) and compiler in (None, table.compiler):
            return table
        if not isinstance(table, RuleSet):
            return cls(table, compiler)
        key = (id(table), compiler)
        kept = _TABLES_OF_RULESETS.get(key)
        if kept is None or kept[0] is not table:
            if len(_TABLES_OF_RULESETS) >= _RULESET_TABLES_KEPT:
                _TABLES_OF_RULESETS.clear()
            kept = _TABLES_OF_RULESETS[key] = (table, cls(table, compiler))
        return kept[1]

    @classmethod
    def from_tvm(cls, prefix_or_patterns: str | Iterable[Any], *,
                 semantics: str = "tvm") -> "PatternTable":
        """A table of TVM's registered ``FusionPattern`` entries, in TVM's priority order.

        Parameters
        ----------
        prefix_or_patterns : str or iterable
            A registered prefix (``"cutlass"``, or ``"cutlass.conv2d"`` for part of a
            table), several separated by commas (``"cutlass,cublas"``), or a list of
            ``tvm.relax.transform.FusionPattern`` objects (or TVM's ``(name, pattern,
            annotation_patterns, check)`` tuples).  Importing the backends that register
            the tables is done here.
        semantics : {"tvm", "relay"}
            The matching semantics the table follows by default (TVM's).

        Each entry keeps TVM's check, run on a ``PatternCheckContext``-compatible object,
        and TVM's annotation patterns as its roles; repeated names are variants.

        Raises
        ------
        PatternTableError
            A prefix that matches no registered table (the message lists the registered
            prefixes), an item that is not a ``FusionPattern``, or an entry whose pattern
            uses a kind patternkit cannot express (the message names the entry and the
            kind).
        """
        try:
            patterns = tvm_tables.resolve(prefix_or_patterns)
        except (LookupError, TypeError) as err:
            raise PatternTableError(f"PatternTable.from_tvm: {err}") from err
        entries = []
        for i, fusion_pattern in enumerate(patterns):
            try:
                spec = tvm_tables.convert(fusion_pattern)
            except FromDplError as err:
                raise PatternTableError(f"PatternTable.from_tvm: entry {i} "
                                        f"('{fusion_pattern.name}'): {err}") from err
            entries.append(CompositeEntry(spec.name, spec.pattern, None, i,
                                          tvm_check=spec.check, annotations=spec.annotations,
                                          attrs_getter=spec.attrs_getter, source=spec.source))
        return cls(entries, semantics=semantics, variants=True)

    def __getitem__(self, i):
        return self._entries[i]

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"PatternTable({[e.name for e in self._entries]!r})"

    @property
    def names(self) -> list[str]:
        """Entry names in priority order (a name with variants once, at its first row)."""
        return list(dict.fromkeys(e.name for e in self._entries))

    def entry(self, name: str) -> CompositeEntry:
        """The first (highest-priority) entry named ``name``."""
        for e in self._entries:
            if e.name == name:
                return e
        raise KeyError(name)

    def variants_of(self, name: str) -> list[CompositeEntry]:
        """Every row named ``name``, in priority order."""
        return [e for e in self._entries if e.name == name]

    def to_fusion_patterns(self) -> list:
        """The table as ``relax.transform.FusionPattern`` objects for ``FuseOpsByPattern``.

        For users who want TVM's semantics (identical matches share one function,
        escaping intermediates are exported) and for the benchmark.  Checks see what
        ``MergeComposite`` shows them: ``pre`` is ``ctx.matched_expr``, and the node map
        (or a rule's roles) comes from matching the entry's pattern again, with
        patternkit's matcher, through the bindings ``FuseOpsByPattern`` is about to fuse
        (``ctx.matched_bindings``).  A refused match is not fused; a check that raises
        stops the pass with a :class:`patternkit.CallbackError` naming the entry.
        An entry from a TVM table is handed back as the ``FusionPattern`` it came from.
        """
        return [e.source if e.from_tvm else
                relax.transform.FusionPattern(e.name, e.pattern.to_dpl(), {}, _fusion_check(e))
                for e in self._entries]


def _fusion_check(entry: CompositeEntry) -> Callable[[Any], bool] | None:
    """``entry``'s check as ``FuseOpsByPattern`` calls it, on a ``PatternCheckContext``."""
    accept = entry.accept
    if accept is None:
        return None

    def check(ctx: Any) -> bool:
        values = {C.handle(var): value for var, value in ctx.matched_bindings.items()}
        found = Matcher(table=values).match(entry.pattern, ctx.matched_expr)
        if found is None:  # TVM's matcher took something patternkit's does not: not unchecked
            logger.debug("FuseOpsByPattern: '%s' matched %s, which patternkit's matcher "
                         "does not; not fused", entry.name, ctx.matched_expr)
            return False
        try:
            refusal, _ = judge(accept, RuleMatch(found, entry.roles))
        except Exception as err:
            raise CallbackError(f"FuseOpsByPattern: the check of pattern table entry "
                                f"'{entry.name}' raised {type(err).__name__}: {err}",
                                entry.name, "") from err
        return refusal is None

    return C.ffi_callback(check)


def _renaming_hint(raw: Any, compiler: str) -> str:
    """How to name a composite rule's entries for ``compiler``, when ``raw`` is one: its
    name comes from the rule (``byoc.hardswish``), and ``compiler=`` only checks it.
    """
    if callable(getattr(raw, "for_compiler", None)):
        return (f"; a composite rule names its entry '<compiler>.<pattern>' itself: pass "
                f"rule.for_compiler({compiler!r}) (or RuleSet.for_compiler({compiler!r}))")
    return ""


def _as_entry(raw: Any, i: int) -> CompositeEntry:
    require_instance(raw, f"pattern table entry {i}")
    rule = None
    if isinstance(raw, CompositeEntry):
        if raw.priority != i:  # rows keep everything they carry, at their new position
            raw = dataclasses.replace(raw, priority=i)
        name, pattern, check = raw.name, raw.pattern, raw.check
    elif isinstance(raw, Rule):
        name, pattern, rule = raw.rule_name, raw.pattern, raw
        check = raw.check if check_of(raw) is not None else None
    elif isinstance(raw, (tuple, list)):
        if len(raw) not in (2, 3):
            raise PatternTableError(f"pattern table entry {i} must be (name, pattern) or "
                                    f"(name, pattern, check), found {len(raw)} items")
        name, pattern = raw[0], raw[1]
        check = raw[2] if len(raw) == 3 else None
    elif hasattr(raw, "pattern") and hasattr(raw, "name"):
        name, pattern, check = raw.name, raw.pattern, getattr(raw, "check", None)
    else:
        raise PatternTableError(f"pattern table entry {i} must be a (name, pattern[, check]) "
                                f"tuple, found {type(raw).__name__}")
    if not isinstance(name, str) or not name.strip():
        raise PatternTableError(f"pattern table entry {i} needs a non-empty string name, "
                                f"found {name!r}")
    if not isinstance(pattern, DFPattern):
        raise PatternTableError(f"pattern table entry {i} ('{name}'): expected a patternkit "
                                f"pattern, found {type(pattern).__name__}")
    if check is not None and not callable(check):
        raise PatternTableError(f"pattern table entry {i} ('{name}'): check must be callable, "
                                f"found {type(check).__name__}")
    if isinstance(raw, CompositeEntry):
        return raw
    return CompositeEntry(name, pattern, check, i, rule)


def pattern_table(entries: Iterable[Any], compiler: str | None = None, *,
                  semantics: str | None = None) -> PatternTable:
    """Validate ``entries`` into a :class:`PatternTable` (a no-op copy for a table)."""
    return PatternTable(entries, compiler, semantics=semantics)
