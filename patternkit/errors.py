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


class NothingToPartition(PatternkitError, LookupError):
    """``PartitionGraph(compiler, strict=True)`` found no composite carrying ``compiler``.

    The message lists the compilers the module's composites do carry.
    """


class GradientError(PatternkitError):
    """A function cannot be differentiated as asked: bad ``wrt``, no scalar loss, an op
    with no gradient and no expansion.  Raised before ``relax.transform.Gradient`` runs,
    so the user sees the op or name at fault instead of TVM's internal check failure.
    """


class BuildError(PatternkitError, RuntimeError):
    """A module compared numerically does not build for its target.

    Attributes
    ----------
    side : str
        Which module failed: ``"before"`` (the reference, as given: a model that TVM's
        importer left unbuildable) or ``"after"`` (the transformed one: a bug in the pass).
    """

    def __init__(self, message: str, side: str = ""):
        super().__init__(message)
        self.side = side


class PatternkitWarning(UserWarning):
    """Base class of the warnings patternkit gives; filter them by this category."""


class RuleDeclinedEveryMatch(PatternkitWarning):
    """A rule was offered matches in one ``rewrite`` and left every one of them, each time
    by returning ``None`` with no reason: most often a rewrite (or a Relay ``callback``)
    that forgot its ``return``, or a ``check`` that forgot its ``return True``.

    Given once per rule per ``rewrite`` call, pointing at the rule's own method.  A rule
    that declines on purpose says so (its check returns ``reject(reason)``, a callback
    returns ``post``); to silence it anyway::

        warnings.filterwarnings("ignore", category=patternkit.errors.RuleDeclinedEveryMatch)
    """
