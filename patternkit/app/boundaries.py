"""Well-formedness at the job's boundaries: what it loads, and what each step hands on.

A pass that emits a module TVM would reject later (a Var used outside its scope, a
symbolic variable defined in two functions) should fail *at that pass*, named, not three
steps on inside ``relax.build``.  The job checks the module it loaded and the output of
each step with :func:`require_well_formed`.

This is a seam: until the engine's shared well-formedness helper is available it asks
TVM's own checker (``relax.analysis.well_formed``, which raises with its reason).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..errors import MalformedIRError


def require_well_formed(mod: tvm.IRModule, stage: str) -> tvm.IRModule:
    """``mod`` unchanged, or :class:`MalformedIRError` naming ``stage`` and TVM's reason."""
    try:
        relax.analysis.well_formed(mod)
    except Exception as err:  # TVM raises its own error types; the reason is the message
        reason = str(err).strip().splitlines()
        raise MalformedIRError(f"{stage}: the module is not well formed: "
                               f"{reason[-1] if reason else type(err).__name__}") from err
    return mod
