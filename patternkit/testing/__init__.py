"""Public test helpers: the rule contract, round-trip assertions and graph strategies.

* :mod:`~patternkit.testing.contract`: state a rule's positive case, negative cases
  with their reasons and its numeric tolerance once (:class:`RuleCase`), and
  :func:`check_rule` proves it four ways (structure, reasons, round trip, numerics);
* :mod:`~patternkit.testing.graphs`: ``assert_roundtrip``, the hypothesis strategy
  ``relax_graphs()``, the benchmark's ``batchnorm_chain`` and ``fusion_patterns``;
* :mod:`~patternkit.testing.strategies`: ``relax_programs()``, random network-like
  programs for differential testing;
* :mod:`~patternkit.testing.op_programs`: ``op_programs()`` (import it from there),
  random programs grown operator by operator from the typing rules of
  :mod:`~patternkit.testing.op_catalogue` (``patternkit fuzz``'s default);
* :mod:`~patternkit.testing.fuzz`: campaigns -- ``verify`` (guard fuzzing of rules),
  ``fuzz_pass`` (differential testing of any pass), ``fuzz_roundtrip``;
* :mod:`~patternkit.testing.bisection`: ``bisect``, the first step of a pipeline that
  changes the numbers.

hypothesis is only imported when a strategy is requested, so importing this package
costs nothing beyond patternkit itself.
"""

from .bisection import BrokenStep, bisect
from .contract import (
                       EXACT,
                       Negative,
                       NegativeResult,
                       RuleCase,
                       RuleProof,
                       Tolerance,
                       apply_rule,
                       assert_reparses,
                       check_rule,
)
from .fuzz import fuzz_pass, fuzz_roundtrip, verify_rules
from .graphs import (
                       assert_roundtrip,
                       batchnorm_chain,
                       batchnorm_pattern,
                       fusion_patterns,
                       relax_graphs,
)
from .strategies import relax_programs

__all__ = [
    "RuleCase", "Negative", "Tolerance", "EXACT", "check_rule", "apply_rule",
    "assert_reparses", "RuleProof", "NegativeResult",
    "assert_roundtrip", "relax_graphs", "batchnorm_chain", "batchnorm_pattern",
    "fusion_patterns", "relax_programs", "fuzz_pass", "fuzz_roundtrip", "verify_rules",
    "bisect", "BrokenStep",
]
