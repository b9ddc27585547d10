"""Pattern tables: the ordered, validated list of composites an external compiler takes.

Relay's ``MergeComposite(table)`` took a list of ``(name, pattern[, check])`` entries,
earlier entries winning.  :class:`PatternTable` validates such a list once (unique,
dotted names; patterns; callable checks), keeps its order as the priority, and can hand
it to TVM's own ``FuseOpsByPattern`` (:meth:`PatternTable.to_fusion_patterns`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from tvm import relax

from ..dpl.matcher import Match
from ..dpl.pattern import DFPattern
from ..engine.proposal import adapt_check
from ..engine.rule import NodeMap
from ..errors import PatternkitError


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
        ``False`` or :func:`patternkit.reject` (with a reason) to veto.
    priority : int
        Position in the table; ``0`` wins over everything else.
    """

    name: str
    pattern: DFPattern
    check: Callable | None = None
    priority: int = 0

    @property
    def compiler(self) -> str | None:
        """The prefix before the first ``.`` (the codegen name), or ``None``."""
        return self.name.split(".", 1)[0] if "." in self.name else None


class PatternTable(Sequence):
    """A validated, ordered pattern table (earlier entries have higher priority).

    Parameters
    ----------
    entries : iterable
        ``(name, pattern)`` or ``(name, pattern, check)`` tuples, :class:`CompositeEntry`
        objects, or rule objects with ``name``/``pattern`` (and optionally ``check``)
        attributes such as :class:`patterns.conv.ConvAddReluComposite`.
    compiler : str, optional
        When given, every name must start with ``"<compiler>."``.

    Raises
    ------
    PatternTableError
        An entry that is not a 2- or 3-tuple, a name that is empty, duplicated or (with
        ``compiler``) lacks the prefix, a pattern that is not a pattern, a check that is
        not callable.  The message names the entry and its position.
    """

    def __init__(self, entries: Iterable[Any], compiler: str | None = None):
        if isinstance(entries, PatternTable):
            entries = list(entries)
        if isinstance(entries, (str, bytes)) or not isinstance(entries, Iterable):
            raise PatternTableError("a pattern table is a list of (name, pattern[, check]) "
                                    f"entries, found {type(entries).__name__}")
        self.compiler = compiler
        self._entries: list[CompositeEntry] = []
        seen: dict[str, int] = {}
        for i, raw in enumerate(entries):
            entry = _as_entry(raw, i)
            if entry.name in seen:
                raise PatternTableError(
                    f"pattern table entry {i} ('{entry.name}') repeats the name of entry "
                    f"{seen[entry.name]}; composite names must be unique")
            if compiler is not None and not entry.name.startswith(compiler + "."):
                raise PatternTableError(
                    f"pattern table entry {i} ('{entry.name}') must be named "
                    f"'{compiler}.<pattern>' for compiler '{compiler}'")
            seen[entry.name] = i
            self._entries.append(entry)

    def __getitem__(self, i):
        return self._entries[i]

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"PatternTable({[e.name for e in self._entries]!r})"

    @property
    def names(self) -> list[str]:
        return [e.name for e in self._entries]

    def entry(self, name: str) -> CompositeEntry:
        for e in self._entries:
            if e.name == name:
                return e
        raise KeyError(name)

    def to_fusion_patterns(self) -> list:
        """The table as ``relax.transform.FusionPattern`` objects for ``FuseOpsByPattern``.

        Checks see ``ctx.matched_expr`` as ``pre`` (no node map).  Used by the benchmark
        and by users who want TVM's sharing, exporting semantics instead.
        """
        out = []
        for e in self._entries:
            check = None
            if e.check is not None:
                user_check = adapt_check(e.check)
                check = (lambda ctx, _c=user_check: bool(_c(ctx.matched_expr,
                                                          NodeMap(Match(ctx.matched_expr)))))
            out.append(relax.transform.FusionPattern(e.name, e.pattern.to_dpl(), {}, check))
        return out


def _as_entry(raw: Any, i: int) -> CompositeEntry:
    if isinstance(raw, CompositeEntry):
        name, pattern, check = raw.name, raw.pattern, raw.check
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
    return CompositeEntry(name, pattern, check, i)


def pattern_table(entries: Iterable[Any], compiler: str | None = None) -> PatternTable:
    """Validate ``entries`` into a :class:`PatternTable` (a no-op copy for a table)."""
    return PatternTable(entries, compiler)
