"""The exceptions patternkit raises.

Every error names what was expected, what was found and, where there is one, the rule
(pattern or callback) and the binding involved, so a failure in a long pass pipeline can
be traced back without a debugger.  The input module is never modified when one of these
is raised: patternkit builds new IR and only returns it on success.
"""

from __future__ import annotations


class PatternkitError(Exception):
    """Base class of every error raised by patternkit."""


class PatternError(PatternkitError, TypeError):
    """Something that should be a pattern is not one, or a pattern is malformed."""


class CallbackError(PatternkitError):
    """A rewrite callback raised, or returned something that cannot replace the match.

    Attributes
    ----------
    callback : str
        Name of the callback (its rule name when it has one).
    binding : str
        The binding being rewritten, as ``"function:var = value"``.
    """

    def __init__(self, message: str, callback: str = "", binding: str = ""):
        super().__init__(message)
        self.callback = callback
        self.binding = binding


class RewriteDidNotConverge(PatternkitError):
    """A set of callbacks kept changing the graph after the maximum number of passes."""


class MalformedIRError(PatternkitError, ValueError):
    """The input IR is not well formed, or a transformation would make it ill formed."""


def _register_with_tvm_ffi() -> None:
    """Keep these exception types when they cross a ``tvm.transform.Pass`` boundary.

    A Python pass runs behind TVM's FFI; unregistered exceptions come back as a bare
    ``RuntimeError``.  Registering the classes makes ``pytest.raises(PatternError)`` and
    ``except PatternkitError`` work on a pass inside ``Sequential`` too.
    """
    try:
        import tvm_ffi
    except ImportError:  # pragma: no cover - tvm_ffi ships with apache-tvm 0.27
        return
    for cls in (PatternkitError, PatternError, CallbackError, RewriteDidNotConverge,
                MalformedIRError):
        try:
            tvm_ffi.register_error(f"patternkit.{cls.__name__}", cls)
        except Exception:  # pragma: no cover - an older tvm_ffi: keep RuntimeError
            return


_register_with_tvm_ffi()
