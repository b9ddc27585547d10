"""Verification: numeric comparison on the llvm VM, and fuse/defuse round trips.

:mod:`~patternkit.verification.numeric` builds two modules for ``llvm``, runs them on
seeded random inputs and compares; :mod:`~patternkit.verification.roundtrip` checks
``DefuseOps(FuseOps(x)) == x`` structurally (and numerically on request).
"""

from .numeric import Comparison, assert_same_numerics, compare
from .roundtrip import RoundTripError, RoundTripResult, check_roundtrip

__all__ = ["Comparison", "assert_same_numerics", "compare", "RoundTripError",
           "RoundTripResult", "check_roundtrip"]
