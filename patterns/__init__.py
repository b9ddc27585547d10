"""patternkit's declarative pattern library, importable as ``patternkit.patterns``.

One module per family (``batchnorm``, ``activation``, ``layernorm``, ``rmsnorm``,
``groupnorm``, ``instancenorm``, ``softmax``, ``einsum``, ``attention``, ``conv``, ``matmul``,
``gated_mlp``, ``rope``, ``backward``); a family that outgrows one file (400
lines) is a subpackage instead (``conv/``: its rules, guards and ``examples.py``).  Each
family documents what it recognises and produces, defines one class per rule and exports a
``RULES`` tuple (rewrite rules), and where it has them a ``COMPOSITES`` tuple (composite
rules for external compilers) and an ``EXPANSIONS`` tuple (fused op -> written-out form).
A tuple holds rule classes (built with their defaults) or rule instances (a variant, built
with its constructor arguments).  Importing a module registers nothing anywhere.  A rule's
``example(**knobs)`` is an instance method that calls the family's example builders (at
the end of a one-file family, in ``examples.py`` of a package), which the tests reuse.

:data:`LIBRARY` is the whole library as one :class:`patternkit.RuleSet`, in application
order: ``pk.rewrite(LIBRARY, mod)`` applies its rewrite rules,
``pk.MergeComposite(LIBRARY.for_compiler("ccompiler"))`` forms its composites, and
``LIBRARY.by_prefix("batchnorm.")`` picks a family.  Composites are named for the
placeholder compiler :data:`COMPOSITE_PREFIX` until renamed with ``for_compiler``.
Adding a family is one import and one ``|`` term in :data:`LIBRARY`.

:data:`EXPANSIONS` is a separate rule set: the expand rules undo collapses of the
library, so applying both together would loop.  Training graphs use it, before
``relax.transform.Gradient``, for the fused ops that have no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from patternkit.engine import CompositeRule, Rule, RuleSet

from . import (
    activation,
    attention,
    backward,
    batchnorm,
    conv,
    einsum,
    gated_mlp,
    groupnorm,
    instancenorm,
    layernorm,
    matmul,
    quantize,
    rmsnorm,
    rope,
    softmax,
)

#: Prefix of composite names in the library; replaced by the compiler chosen at use.
COMPOSITE_PREFIX = "byoc"


def _built(entry: Any, *args: Any) -> Rule:
    """A family tuple's entry as a rule: an instance as it is, a class built with ``args``."""
    return entry if isinstance(entry, Rule) else entry(*args)


def _family_rules(module: Any) -> RuleSet:
    """A family module's rules (``RULES``, then ``COMPOSITES``) as a rule set."""
    rules = [_built(entry) for entry in module.RULES]
    rules += [cast(CompositeRule, _built(entry, COMPOSITE_PREFIX)).for_compiler(COMPOSITE_PREFIX)
              for entry in getattr(module, "COMPOSITES", ())]
    return RuleSet(rules)


def _family_expansions(module: Any) -> RuleSet:
    """A family module's expand rules (``EXPANSIONS``, if it has them) as a rule set."""
    return RuleSet(_built(entry) for entry in getattr(module, "EXPANSIONS", ()))


#: Every rewrite rule and composite of the library, in application order: the collapses
#: (batch norm, activations, norms, softmax, einsum (ONNX einsums to matmuls), then
#: attention, which reads ``R.nn.softmax`` and the matmuls)
#: run before the conv and matmul composites that take their fused ops (the gated MLPs
#: before the matmuls, which would take the gate's ``matmul -> silu`` alone); the backward
#: composites (gradient graphs only) come last.
# The layer and RMS norms come before the batch norm: ``batchnorm.collapse``'s statistics
# are wildcards, so its pattern also matches a written-out layer norm (``mean`` is then a
# computed binding) in full, only for the match to be refused.  The norms' rules take
# those bindings first, and a root already taken is not matched again; the families
# accept disjoint graphs (a batch norm's statistics are constants, a layer norm's are
# computed), so the order changes no result, only the wasted matches.
LIBRARY = (_family_rules(activation) | _family_rules(layernorm) | _family_rules(groupnorm)
           | _family_rules(instancenorm) | _family_rules(rmsnorm)
           | _family_rules(batchnorm) | _family_rules(softmax) | _family_rules(einsum)
           | _family_rules(attention)
           | _family_rules(gated_mlp) | _family_rules(rope) | _family_rules(quantize)
           | _family_rules(conv) | _family_rules(matmul) | _family_rules(backward))

#: The expand rules (fused op -> written-out ops that ``relax.transform.Gradient`` can
#: differentiate), for training graphs.  Kept apart from :data:`LIBRARY`: its collapse
#: rules undo them, so applying both would never settle.  ``softmax`` has none:
#: ``Gradient`` differentiates ``R.nn.softmax``, and has no gradient for the ``max`` of
#: its written-out form.
EXPANSIONS = (_family_expansions(activation) | _family_expansions(layernorm)
              | _family_expansions(rmsnorm) | _family_expansions(batchnorm)
              | _family_expansions(attention))  # in LIBRARY's family order



def family_of(rule: Any) -> str:
    """The family a library rule belongs to (``"conv"``), by the module that defines it.

    A family is a module of this package or a subpackage of it (``patterns/conv/``): the
    family is the first name under ``patternkit.patterns`` either way.
    """
    module = type(rule).__module__
    prefix = f"{__name__}."
    if not module.startswith(prefix):
        raise ValueError(f"{rule!r} is not defined in {__name__} (it is in {module})")
    return module[len(prefix):].split(".", 1)[0]


#: Family names (``"batchnorm"``), in application order; derived from :data:`LIBRARY`.
FAMILIES = tuple(dict.fromkeys(family_of(rule) for rule in LIBRARY))


def all_rules() -> list:
    """Every rewrite rule class in the library, family by family."""
    return list(dict.fromkeys(type(rule) for rule in LIBRARY.rewrite_rules()))


def all_composites() -> list:
    """Every composite rule class in the library (a class with several variants once)."""
    return list(dict.fromkeys(type(rule) for rule in LIBRARY.composites()))


@dataclass(frozen=True)
class LibraryEntry:
    """One entry of the library, as ``patternkit list`` shows it."""

    name: str
    kind: str  # "rewrite" or "composite"
    summary: str
    cls: Any
    rule: Any = None  # the instance in LIBRARY

    def make(self, compiler: str | None = None) -> Any:
        """The rule; composites are named for ``compiler`` (default ``byoc``)."""
        rule = self.rule if self.rule is not None else (
            self.cls(COMPOSITE_PREFIX) if self.kind == "composite" else self.cls())
        if isinstance(rule, CompositeRule):
            return rule.for_compiler(compiler or COMPOSITE_PREFIX)
        return rule


def _summary(cls: Any) -> str:
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def catalog() -> list[LibraryEntry]:
    """Every rewrite rule and composite of the library, in application order."""
    return [LibraryEntry(rule.rule_name,
                         "composite" if isinstance(rule, CompositeRule) else "rewrite",
                         _summary(type(rule)), type(rule), rule)
            for rule in LIBRARY]


def find(name: str) -> LibraryEntry:
    """The library entry called ``name``; ``KeyError`` suggests the closest names."""
    rule = LIBRARY.find(name)
    return next(entry for entry in catalog() if entry.rule is rule)
