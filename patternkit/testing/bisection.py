"""Bisect a pipeline: the first rewrite or pass whose output leaves tolerance.

When a pipeline of rules and passes changes the numbers, :func:`bisect` replays it one
step at a time and compares each intermediate module with the pipeline's *input* on
llvm (seeded random inputs; each rule's own tolerance, the default tolerance for
passes).  A run of consecutive rewrite rules is replayed as the engine applies it --
rounds over the rules in order until a round changes nothing -- but one rule
*application* per step, so the culprit is one binding of one function, not "somewhere
in ``rewrite``".  A pass (or any other ``IRModule -> IRModule`` callable) is one step.

The result is a :class:`BrokenStep` (the rule or pass, the function and binding, the
shapes it read, the error, the modules on both sides and a drawing with
:func:`patternkit.viz.viz_diff`), or ``None`` when no step breaks the numbers.  Steps are
judged as :func:`patternkit.compare` judges (every element within tolerance *and* each
output's relative error as a whole), on inputs where the pipeline's input gives evidence:
a pipeline whose outputs are all zero or constant on every draw cannot be bisected, and
says so (``ValueError``) rather than finding nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import tvm
from tvm import relax

from ..engine import (
    RewriteLog,
    RewriteRecord,
    RewriteRule,
    Rule,
    RuleSet,
    Tolerance,
    as_rule,
    default_tolerance,
    reject,
    rewrite,
)
from ..engine.rule import Reject, check_of, is_rule
from ..errors import first_line
from ..ir import compat as C
from ..ir.rebuild import binding_text
from ..ir.walk import vars_read
from ..verification import numeric
from ..verification.differential import DRAWS, narrowest_float_dtype
from ..viz import viz_diff
from .fuzz import POSITIVE, as_transform, transform_name

__all__ = ["bisect", "BrokenStep"]

#: Replays stop after this many rule applications (a rule set that never settles).
MAX_APPLICATIONS = 10_000


@dataclass
class BrokenStep:
    """The first step of a pipeline whose output leaves tolerance.

    Attributes
    ----------
    step : str
        The rule's or the pass's name.
    index : int
        1-based position of the step in the replay.
    function, binding : str or None
        Where the rule rewrote (``None`` for a whole pass); ``binding`` is the binding's
        text before the rewrite (``lv3 = R.add(lv2, b)``).
    shapes : dict
        Variable name -> shape of the bindings the step replaced (empty for a pass).
    error : str
        How far the numbers moved, against which tolerance.
    before, after : tvm.IRModule
        The module the step received and the one it gave back.
    """

    step: str
    index: int
    function: str | None
    binding: str | None
    shapes: dict
    error: str
    before: Any = field(repr=False)
    after: Any = field(repr=False)
    records: tuple = field(default=(), repr=False)

    def drawing(self, context: int = 2):
        """The step drawn as a diff (:func:`patternkit.viz.viz_diff`), ``context`` hops
        around what changed.
        """
        return viz_diff(self.before, self.after, changes=list(self.records) or None,
                        context=context)

    def __str__(self) -> str:
        where = "the whole module" if self.function is None else \
            f"{self.function}: {self.binding}"
        lines = [f"FAIL: step {self.index} ({self.step}) changes the numbers: {self.error}",
                 f"  at {where}"]
        if self.shapes:
            lines.append("  shapes: " + ", ".join(f"{name} {shape}"
                                                  for name, shape in self.shapes.items()))
        return "\n".join(lines)


def bisect(mod: tvm.IRModule, steps: Any, *, seed: int = 0,
           tolerance: Tolerance | None = None) -> BrokenStep | None:
    """Replay ``steps`` on ``mod`` and return the first that leaves tolerance, else ``None``.

    Parameters
    ----------
    mod : tvm.IRModule
        The pipeline's input (not modified); ``main`` is run.
    steps : Rule, RuleSet, pass, callable, or a sequence of them
        The pipeline, in order.  Consecutive rewrite rules (a ``RuleSet``'s too) are
        replayed one application at a time; anything else is one step.
    seed : int
        Seed of the random inputs.
    tolerance : Tolerance, optional
        For every step; default: a rule's own ``tolerance(dtype)``, else
        :func:`~patternkit.engine.tolerance.default_tolerance` of ``mod``'s coarsest
        floating dtype.
    """
    dtype = narrowest_float_dtype(mod)
    inputs, reference = _evidence(mod, seed, tolerance or default_tolerance(dtype))
    state = {"mod": mod, "index": 0}

    def judge(after, name, rule, records) -> BrokenStep | None:
        state["index"] += 1
        before, state["mod"] = state["mod"], after
        tol = tolerance or (rule.tolerance(dtype) if rule is not None
                            else default_tolerance(dtype))
        try:
            got = numeric.run(after, inputs)
        except Exception as err:  # a step whose output no longer builds breaks it too
            error = f"the output does not build or run ({type(err).__name__}: " \
                    f"{first_line(err) if str(err).strip() else ''})"
        else:
            comparison = numeric.compare_outputs(reference, got, rtol=tol.rtol, atol=tol.atol)
            if comparison.ok:
                return None
            if comparison.inconclusive:  # a rule's looser tolerance swallows the outputs
                raise ValueError(f"step {state['index']} ({name}) cannot be judged at {tol}: "
                                 f"{comparison.reason}")
            error = (f"max abs error {comparison.max_abs_error:.3g}, max rel error "
                     f"{comparison.max_rel_error:.3g}, relative error as a whole "
                     f"{comparison.norm_error:.3g} ({tol})")
        return _broken(name, state["index"], before, after, records, error)

    for group in _groups(steps):
        if isinstance(group, list):
            found = _replay_rules(group, state, judge)
        else:
            found = judge(as_transform(group)(state["mod"]), transform_name(group), None, ())
        if found is not None:
            return found
    return None


def _evidence(mod: tvm.IRModule, seed: int, tol: Tolerance) -> tuple[list, list]:
    """Inputs (seed ``seed``, else the next few) on which ``mod``'s outputs are evidence,
    and those outputs.

    A step is judged by comparing its output with ``mod``'s on the same inputs, and
    outputs that are all zero, constant or within ``atol`` would let a wrong step through
    (:func:`~patternkit.verification.numeric.compare_outputs`): "no step breaks the
    numbers" would then be a lie, so a pipeline input with no such draw raises.
    """
    vm = numeric.build(mod)
    for draw in range(DRAWS):
        inputs = numeric.random_inputs(mod["main"], seed=seed + draw, positive=POSITIVE)
        reference = numeric.run(mod, inputs, vm=vm)
        weak = numeric.compare_outputs(reference, reference, rtol=tol.rtol, atol=tol.atol)
        if not weak.inconclusive:
            return inputs, reference
    raise ValueError(f"cannot bisect: the pipeline's input gives no evidence on seeds {seed} "
                     f"to {seed + DRAWS - 1}: {weak.reason}")


def _groups(steps: Any) -> list:
    """Steps as runs of rewrite rules (lists) and single other steps."""
    if isinstance(steps, (Rule, RuleSet)) or not isinstance(steps, Sequence):
        steps = [steps]
    groups: list = []
    for step in steps:
        rules = [as_rule(r) for r in step.rewrite_rules()] if isinstance(step, RuleSet) else \
            [as_rule(step)] if is_rule(step) and isinstance(as_rule(step), RewriteRule) else None
        if rules is None:
            groups.append(step)
        elif groups and isinstance(groups[-1], list):
            groups[-1].extend(rules)
        else:
            groups.append(rules)
    return groups


def _replay_rules(rules: list, state: dict, judge) -> BrokenStep | None:
    """Rounds over ``rules`` in order, one application per step, until nothing fires."""
    for _ in range(MAX_APPLICATIONS):
        fired = False
        for rule in rules:
            while True:
                log = RewriteLog()
                # A multi-root rule takes all its roots at once: its one pass is the step.
                step = _one_pass(rule) if rule.multi_root \
                    else _OneApplication(rule)
                after = rewrite(step, state["mod"], max_passes=1, log=log)
                if not log.records:
                    break
                fired = True
                found = judge(after, rule.rule_name, rule, tuple(log.records))
                if found is not None:
                    return found
        if not fired:
            return None
    return None


def _one_pass(rule: RewriteRule) -> RewriteRule:
    """A copy of ``rule`` that stops after one pass (``rewrite_once``)."""
    once = copy.copy(rule)
    once.rewrite_once = True
    return once


class _OneApplication(RewriteRule):
    """``rule``, accepting only the first match its check accepts (one step of a replay)."""

    def __init__(self, rule: RewriteRule):
        super().__init__(rewrite_once=True)
        self.inner = rule
        self.pattern = rule.pattern
        self.taken = False

    @property
    def name(self) -> str:
        return self.inner.name

    @name.setter
    def name(self, value: str) -> None:
        self.inner.name = value

    def roles(self) -> dict:
        return self.inner.roles()

    def check(self, match):
        if self.taken:
            return reject("bisect: one application per step")
        inner = check_of(self.inner)
        verdict = True if inner is None else inner(match)
        if verdict is not None and verdict is not False and not isinstance(verdict, Reject):
            self.taken = True
        return verdict

    def rewrite(self, match):
        return self.inner.rewrite(match)


def _broken(name: str, index: int, before: tvm.IRModule, after: tvm.IRModule,
            records: tuple, error: str) -> BrokenStep:
    if not records:
        return BrokenStep(name, index, None, None, {}, error, before, after)
    record: RewriteRecord = records[0]
    func = before[record.function]
    bindings = {C.var_name(b.var): b for block in func.body.blocks for b in block.bindings}
    root = bindings.get(record.root)
    text = binding_text(root.var, root.value) if root is not None else record.root
    shapes = {}
    for var_name in record.replaced:
        binding = bindings.get(var_name)
        if binding is not None:
            shape = C.static_shape(binding.var.ty)
            shapes[var_name] = tuple(shape) if shape is not None else str(binding.var.ty)
    for var in (vars_read(root.value) if root is not None else ()):
        shape = C.static_shape(var.ty) if isinstance(var.ty, relax.TensorType) else None
        if shape is not None:
            shapes.setdefault(C.var_name(var), tuple(shape))
    return BrokenStep(name, index, record.function, text, shapes, error, before, after, records)
