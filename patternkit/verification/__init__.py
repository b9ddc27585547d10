"""Verification: numeric comparison on the llvm VM, and fuse/defuse round trips.

:mod:`~patternkit.verification.numeric` builds two modules for ``llvm``, runs them on
seeded random inputs and compares; :mod:`~patternkit.verification.roundtrip` checks
``DefuseOps(FuseOps(x)) == x`` structurally (and numerically on request);
:mod:`~patternkit.verification.sites` validates each rewrite of a run on its own.  For the
verification campaigns (:mod:`patternkit.testing.fuzz`):
:mod:`~patternkit.verification.differential` runs a transform under a time limit and
judges its result, :mod:`~patternkit.verification.shrink` cuts a failing module to its
smallest failing cone, :mod:`~patternkit.verification.script` prints modules as
TVMScript with constants inline, and :mod:`~patternkit.verification.report` holds the
results.
"""

from .by_example import example_rule_class, rule_by_example, verify_by_example
from .numeric import Comparison, assert_same_numerics, compare
from .roundtrip import RoundTripError, RoundTripResult, check_roundtrip
from .sites import SiteReport, validate_sites

__all__ = ["Comparison", "assert_same_numerics", "compare", "RoundTripError",
           "RoundTripResult", "check_roundtrip", "SiteReport", "validate_sites",
           "rule_by_example", "example_rule_class", "verify_by_example"]
