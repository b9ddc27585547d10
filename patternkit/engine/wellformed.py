"""Well-formedness at the engine's boundaries: what a pass receives, and what it emits.

A rule that returns an expression reading a Var that is not in scope (one it built and
never bound, one from another function, one bound further down) used to pass unnoticed
until ``relax.analysis.well_formed`` failed several passes later, far from the rule.
The engine now checks at three levels:

* **always, on what a pass receives** (:func:`check_input`, from the function index the
  pass builds anyway): every Var a binding reads is a parameter or bound before it, and
  the function is in A-normal form (no call nested in a binding's value, a result that
  is not a call).  Functions the pass does not index get :func:`check_shape` (a
  ``SeqExpr`` body whose result is not a call), so a hand-built
  ``relax.Function([x], R.exp(x))`` is refused rather than silently left alone.
  Failing input raises before anything is built, naming the function and the binding,
  so the caller's module is left as it was;
* **always, on what a pass emits** (:func:`check_replacement_scope`): every Var a
  replacement reads is a parameter of the function or bound before the binding it
  replaces, and visible from its block.  Linear, on the Python side, one look per Var a
  replacement reads;
* **in debug mode** (``debug=True`` on the pass, or the environment variable
  ``PATTERNKIT_DEBUG=1``), TVM's full ``relax.analysis.well_formed`` on the module each
  pass receives and on each one it emits (:func:`assert_well_formed`, also what the main
  job calls at its boundaries whatever the mode).  It costs about as much as indexing
  the module once (0.25 s at 24,000 bindings), hence not by default.

Every failure is a :class:`~patternkit.errors.MalformedIRError` naming the pass, the
rule when there is one, the function and the binding.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

import tvm
from tvm import relax

from ..errors import MalformedIRError, env_switch
from ..ir import compat as C
from ..ir.rebuild import describe_binding
from ..ir.walk import KIND_OF, VAR
from .index import FunctionIndex, nests_a_call

#: Environment variable that turns debug mode on for every pass (``1``, ``true``...).
DEBUG_VARIABLE = "PATTERNKIT_DEBUG"

#: Advice for input that is not in A-normal form.
_NORMALIZE = "run relax.transform.Normalize() on the module first"


def debug_mode(debug: bool | None = None) -> bool:
    """``debug`` if given, else whether :data:`DEBUG_VARIABLE` is set to a true value."""
    if debug is not None:
        return bool(debug)
    # Set to anything but an off word (``PATTERNKIT_DEBUG=verbose`` too), it is on.
    return env_switch(DEBUG_VARIABLE, default=bool(os.environ.get(DEBUG_VARIABLE, "").strip()))


def check_shape(func: relax.Function, pass_name: str, func_name: str) -> None:
    """The function's body must be a ``SeqExpr`` whose result is not a call.

    Cheap enough for every function a pass is given, including those it does not index
    (no candidate for its rules): ``relax.Function([x], R.exp(R.exp(x)))`` gets an
    empty ``SeqExpr`` around the nested call, on which every rule would silently find
    nothing.
    """
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        raise MalformedIRError(
            f"{pass_name}: function '{func_name}' is not normalised: its body is a "
            f"{type(body).__name__}, not a SeqExpr; {_NORMALIZE}")
    result = body.body
    if KIND_OF.get(type(result)) is not VAR and nests_a_call(result, True):
        raise MalformedIRError(
            f"{pass_name}: function '{func_name}' is not normalised: it returns a call "
            f"({_short(result)}) instead of a Var; {_NORMALIZE}")


def check_input(index: FunctionIndex, pass_name: str, func_name: str) -> None:
    """Raise if the indexed function reads an undefined Var or is not in A-normal form."""
    problem = input_problem(index, func_name)
    if problem is not None:
        raise MalformedIRError(f"{pass_name}: function '{func_name}' {problem}")


def input_problem(index: FunctionIndex, func_name: str) -> str | None:
    """What :func:`check_input` refuses in the indexed function, or ``None``."""
    if index.undefined is not None:
        position, key = index.undefined
        if position is None:
            return (f"is not well formed: its result reads "
                    f"'{_name_of(index.func.body.body, key)}', which is not defined in it")
        binding = index.binding_at(position)
        return (f"is not well formed: binding '{describe_binding(func_name, binding)}' reads "
                f"'{_name_of(binding.value, key)}', which is neither a parameter nor bound "
                f"before it")
    if index.not_normal is not None:
        position, what = index.not_normal
        where = ("its result" if position is None
                 else f"binding '{describe_binding(func_name, index.binding_at(position))}'")
        return f"is not normalised: {where} {what}; {_NORMALIZE}"
    return None


def check_replacement_scope(index: FunctionIndex, key: int, reads: Iterable[int],
                            pass_name: str, owner: str, func_name: str, value: Any) -> None:
    """Raise unless every Var in ``reads`` is in scope at the binding ``key`` replaces.

    In scope: a parameter of the function, or a Var bound before that binding, in the
    same block or (when it is not a ``DataflowVar``) in an earlier one.
    """
    position, params = index.position, index.params
    at = position[key]
    for read in reads:
        where = position.get(read)
        if where is None:
            if read in params:
                continue
            why = "is not defined in this function (built by the rule but never bound?)"
        elif where >= at:
            why = ("is the replaced binding itself" if where == at
                   else "is bound after the binding it replaces")
        elif where[0] != at[0] and index.dataflow[where[0]] and read not in index.escaping:
            why = "is a DataflowVar of another block"
        else:
            continue
        binding = index.binding_at(at)
        raise MalformedIRError(
            f"{pass_name}: {owner} returned a replacement for "
            f"'{describe_binding(func_name, binding)}' that reads '{_name_of(value, read)}', "
            f"which {why}; a replacement may read only the function's parameters and the "
            f"Vars bound before the binding it replaces")


def assert_well_formed(mod: tvm.IRModule, pass_name: str, stage: str = "output",
                       rules: Iterable[str] = ()) -> None:
    """TVM's full well-formedness check, as a :class:`MalformedIRError` naming the culprit.

    Parameters
    ----------
    mod : tvm.IRModule
    pass_name : str
        Who received or produced ``mod`` (``"rewrite"``, ``"the job's input"``...).
    stage : str
        ``"input"`` (what the pass received) or ``"output"`` (what it produced).
    rules : iterable of str
        The rules that changed the module, named in the error of an output.
    """
    try:
        relax.analysis.well_formed(mod)
        return
    except C.TVM_ERRORS as err:
        detail = " ".join(str(err).split()) or type(err).__name__
    func_name = _failing_function(mod)
    what = "received" if stage == "input" else "produced"
    by = ""
    names = sorted(set(rules))
    if names and stage != "input":
        by = f" (rules that changed it: {', '.join(names)})"
    where = f" in function '{func_name}'" if func_name else ""
    located = _located(mod, func_name)
    raise MalformedIRError(f"{pass_name} {what} a module that is not well formed{by}{where}: "
                           f"{detail}{located}")


def checked(pass_name: str, transform: Callable[[tvm.IRModule], tvm.IRModule],
            debug: bool | None = None) -> Callable[[tvm.IRModule], tvm.IRModule]:
    """``transform`` with :func:`assert_well_formed` on its input and output in debug mode."""
    if not debug_mode(debug):
        return transform

    def run(mod: tvm.IRModule) -> tvm.IRModule:
        assert_well_formed(mod, pass_name, "input")
        out = transform(mod)
        if out is not mod:
            assert_well_formed(out, pass_name, "output")
        return out

    return run


# -- naming what failed ----------------------------------------------------------------------
def _short(expr: Any, limit: int = 60) -> str:
    """``expr`` as one line of TVMScript, cut to ``limit`` characters."""
    text = " ".join(str(expr).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _name_of(expr: Any, key: int) -> str:
    """The name of the Var with handle ``key`` that ``expr`` reads."""
    for var in C.array_items(relax.analysis.free_vars(expr)):
        if C.handle(var) == key:
            return C.var_name(var)
    return "?"


def _failing_function(mod: tvm.IRModule) -> str | None:
    """The first function (by name) that TVM's check refuses on its own."""
    for gv, func in sorted(mod.functions.items(), key=lambda item: item[0].name_hint):
        if not isinstance(func, relax.Function):
            continue
        try:
            relax.analysis.well_formed(func)
        except C.TVM_ERRORS:
            name: str = gv.name_hint
            return name
    return None


def _located(mod: tvm.IRModule, func_name: str | None) -> str:
    """``" (binding '...' reads 'z' ...)"`` when the function index finds it, else ``""``."""
    if func_name is None or not isinstance(mod[func_name].body, relax.SeqExpr):
        return ""
    problem = input_problem(FunctionIndex.build(mod[func_name]), func_name)
    return "" if problem is None else f" (the function {problem})"


__all__ = ["DEBUG_VARIABLE", "debug_mode", "check_shape", "check_input", "input_problem",
           "check_replacement_scope", "assert_well_formed", "checked"]
