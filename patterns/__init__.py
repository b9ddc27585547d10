"""patternkit's declarative pattern library, importable as ``patternkit.patterns``.

One module per family (``batchnorm``, ...).  Each module documents what it recognises
and produces, defines one class per rule and ends with a ``RULES`` tuple.  Importing a
module registers nothing anywhere: use :func:`all_rules` or the modules' ``RULES``.
"""

from __future__ import annotations

import importlib

#: Family modules, in the order their rules are applied by default.
FAMILIES = ("batchnorm",)


def all_rules() -> list:
    """Every rule class in the library, family by family."""
    rules = []
    for family in FAMILIES:
        module = importlib.import_module(f"{__name__}.{family}")
        rules.extend(module.RULES)
    return rules
