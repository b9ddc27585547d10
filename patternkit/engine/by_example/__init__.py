"""Rules by example: a rule made from the code it matches and the code it becomes.

``written`` (one function or several spellings) is traced and generalised into a pattern
(:mod:`.generalisation`), ``fused`` is what a match becomes, traced again at the match's own
types (:mod:`.rule`); without ``fused`` the rule is a composite of its name.  The
parameters both take are read by :mod:`.signature`, the tracing (Relax or torch) is
:mod:`.tracing`.  The user's entry point, which also checks the pair numerically before
trusting it, is :func:`patternkit.verification.by_example.rule_by_example`.
"""

from .generalisation import Generalised, generalise
from .rule import (
    FLOAT_DTYPES,
    SIZES,
    ExampleComposite,
    ExampleRewrite,
    ExampleSpec,
    class_name,
    example_rule_class,
)
from .signature import Signature, read_signature, symbolic_types
from .tracing import is_torch_function, trace

__all__ = ["ExampleSpec", "ExampleRewrite", "ExampleComposite", "example_rule_class",
           "class_name", "Generalised", "generalise", "Signature", "read_signature",
           "symbolic_types", "trace", "is_torch_function", "FLOAT_DTYPES", "SIZES"]
