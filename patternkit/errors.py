"""The exceptions patternkit raises.

Every error names what was expected, what was found and, where there is one, the rule
(pattern or callback) and the binding involved, so a failure in a long pass pipeline can
be traced back without a debugger.  The input module is never modified when one of these
is raised: patternkit builds new IR and only returns it on success.

Also the few helpers every layer shares and that import nothing of patternkit's:
:func:`first_line` and :func:`tvm_error_line`, which put another error into one line of
a message, and :func:`env_switch`, which reads an on/off environment variable.
"""

from __future__ import annotations

import os


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


def first_line(err: BaseException, limit: int | None = None) -> str:
    """The first non-blank line of ``err``'s message, stripped, or the name of its type
    when the message is empty; at most ``limit`` characters.

    Errors reach users as one line (a warning, a report's cell, the end of another
    error's message): the rest of a multi-line message, often a backtrace or a dump of
    a model, would bury what went wrong.
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    line = lines[0] if lines else type(err).__name__
    return line if limit is None else line[:limit]


def tvm_error_line(err: BaseException, limit: int | None = None, where: bool = True) -> str:
    """The one line of a TVM error that says what failed, at most ``limit`` characters:
    its last ``Check failed`` or ``...Error`` line, else its last line, else the name of
    its type.  With ``where``, and when the traceback ends in C++, the function and file
    that raised it follow, as ``(in tvm::relax::InferTypeMatmul, linear_algebra.cc)``.

    Not :func:`first_line`: TVM puts context first and the failed check last, and its
    checks often say only ``Check failed: (...) is false`` (hence where).
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    checks = [line for line in lines if "Check failed" in line or "Error" in line]
    message = (checks or lines or [type(err).__name__])[-1].rstrip(": ")
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if where and tb is not None and tb.tb_frame.f_code.co_filename.endswith((".cc", ".h")):
        function = tb.tb_frame.f_code.co_name.split("(")[0].split(" ")[-1]
        message += f" (in {function}, {tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]})"
    return message if limit is None else message[:limit]


_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def env_switch(name: str, default: bool) -> bool:
    """Whether the environment variable ``name`` turns its feature on.

    ``0``, ``false``, ``no``, ``off`` turn it off and ``1``, ``true``, ``yes``, ``on`` turn
    it on, in any case and with spaces around; unset, empty or any other value leaves
    ``default``.  One reading for every ``PATTERNKIT_*`` switch, so a value that turns
    one of them off turns any of them off.
    """
    value = os.environ.get(name, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    return default
