"""patternkit's declarative pattern library, importable as ``patternkit.patterns``.

One module per family (``batchnorm``, ``conv``).  Each module documents what it
recognises and produces, defines one class per rule and ends with a ``RULES`` tuple
(rewrite rules, ``DFPatternCallback`` subclasses) and, where it has them, a
``COMPOSITES`` tuple (pattern-table entries for external compilers).  Importing a module
registers nothing anywhere: use :func:`all_rules`, :func:`catalog` or the tuples.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any

#: Family modules, in the order their rules are applied by default.
FAMILIES = ("batchnorm", "conv")

#: Prefix of composite names in the library; replaced by the compiler chosen at use.
COMPOSITE_PREFIX = "byoc"


def _family_modules() -> list:
    return [importlib.import_module(f"{__name__}.{family}") for family in FAMILIES]


def all_rules() -> list:
    """Every rewrite rule class in the library, family by family."""
    return [rule for module in _family_modules() for rule in module.RULES]


def all_composites() -> list:
    """Every composite (pattern-table entry) class in the library."""
    return [c for module in _family_modules() for c in getattr(module, "COMPOSITES", ())]


@dataclass(frozen=True)
class LibraryEntry:
    """One entry of the library, as ``patternkit list`` shows it."""

    name: str
    kind: str  # "rewrite" or "composite"
    summary: str
    cls: Any

    def make(self, compiler: str | None = None) -> Any:
        """A rule instance; composites are named for ``compiler`` (default ``byoc``)."""
        if self.kind == "composite":
            return self.cls(compiler or COMPOSITE_PREFIX)
        return self.cls()


def _summary(cls: Any) -> str:
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def catalog() -> list[LibraryEntry]:
    """Every rewrite rule and composite of the library, in application order."""
    entries = [LibraryEntry(rule.name, "rewrite", _summary(rule), rule) for rule in all_rules()]
    for comp in all_composites():
        entries.append(LibraryEntry(comp().name, "composite", _summary(comp), comp))
    return entries


def find(name: str) -> LibraryEntry:
    """The library entry called ``name``; ``KeyError`` suggests the closest names."""
    entries = {e.name: e for e in catalog()}
    if name in entries:
        return entries[name]
    close = difflib.get_close_matches(name, list(entries), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise KeyError(f"unknown pattern {name!r}{hint} (patternkit list shows them all)")
