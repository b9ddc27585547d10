"""``rule_by_example``: a rule from the code it matches, trusted only once it is checked.

A by-example rule (:mod:`patternkit.engine.by_example`) claims that ``written`` and
``fused`` compute the same thing.  Before the rule is handed back, that claim is checked
on llvm (:func:`find_counterexample`): both sides are traced at symbolic shapes, built
once per dtype (builds are cached by the module's structure, so a second rule of the same
pair, or a second construction, builds nothing), and run with every symbolic dimension
bound to several sizes (1 included: broadcasting edges) on seeded draws and on the
adversarial draws of :mod:`~patternkit.verification.differential` (wide values, the
positive range, zeros).  A draw whose outputs differ by more than the rule's tolerance is
shrunk (every dimension to 1, the inputs to the values at the worst element) and the pair
is refused with that counterexample printed as TVMScript; a pair whose ``written`` side
gives a constant on every draw cannot be judged and is refused too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tvm

from ..engine.by_example import ExampleSpec, example_rule_class, symbolic_types
from ..engine.rule import Rule
from ..errors import PatternError
from ..ir import compat as C
from . import numeric
from .differential import adversarial_inputs

__all__ = ["rule_by_example", "example_rule_class", "find_counterexample", "Counterexample",
           "verify_by_example", "BUILDS"]

log = logging.getLogger(__name__)

#: Bindings of the symbolic dimensions tried: all 1 (every broadcast edge), the default
#: size, and a mix (the first dimension 7, the others 1 then 3).
def _size_draws(symbols: Sequence[str]) -> list[dict[str, int]]:
    draws = [{s: 1 for s in symbols}, {s: 4 for s in symbols}]
    if symbols:
        draws.append({s: (7 if i == 0 else 3) for i, s in enumerate(symbols)})
        if len(symbols) > 1:
            draws.append({s: (1 if i == 0 else 5) for i, s in enumerate(symbols)})
    return draws


class _Builds:
    """Built pairs, by the structural hash of their module: constructing the same rule
    twice (or two rules of one pair) builds nothing the second time.
    """

    def __init__(self, size: int = 64):
        self.size = size
        self.entries: dict[int, Any] = {}

    def vm(self, mod: tvm.IRModule) -> Any:
        key = C.structural_hash(mod, map_free_vars=True)
        found = self.entries.get(key)
        if found is None:
            if len(self.entries) >= self.size:
                self.entries.pop(next(iter(self.entries)))
            found = self.entries[key] = numeric.build(mod)
        return found


#: The build cache of :func:`find_counterexample`.
BUILDS = _Builds()


@dataclass(frozen=True)
class Counterexample:
    """Inputs on which ``written`` and ``fused`` differ by more than the tolerance.

    Attributes
    ----------
    rule : str
    dtype : str
    sizes : dict
        The symbolic dimensions' values.
    inputs : dict
        Parameter -> the array drawn.
    written, fused : numpy.ndarray
        The two outputs.
    max_abs, max_rel : float
        The largest differences.
    tolerance : str
    script : str
        Both sides at these sizes, as TVMScript.
    draw : str
        Which draw found it.
    """

    rule: str
    dtype: str
    sizes: dict[str, int]
    inputs: dict[str, np.ndarray]
    written: np.ndarray
    fused: np.ndarray
    max_abs: float
    max_rel: float
    tolerance: str
    script: str
    draw: str

    def summary(self) -> str:
        """One line: where the two sides differ, and by how much."""
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items()) or "static shapes"
        values = "; ".join(f"{k} = {_array_text(v)}" for k, v in self.inputs.items())
        return (f"{self.rule}: written and fused differ in {self.dtype} at {sizes} "
                f"({self.draw}): {values} gives {_array_text(self.written)} written, "
                f"{_array_text(self.fused)} fused (max abs {self.max_abs:.3g}, max rel "
                f"{self.max_rel:.3g}; tolerance {self.tolerance}); state a tolerance= "
                f"that covers it if the difference is meant")

    def __str__(self) -> str:
        return self.summary() + "\n" + self.script


def _array_text(arr: np.ndarray) -> str:
    flat = np.asarray(arr, dtype="float64").ravel()
    if flat.size == 1:
        return f"{flat[0]:.8g}"
    head = ", ".join(f"{v:.6g}" for v in flat[:4])
    return f"[{head}{', ...' if flat.size > 4 else ''}] (shape {tuple(np.shape(arr))})"


def _pair_module(spec: ExampleSpec, indices: Sequence[int], dtype: str,
                 sizes: Mapping[str, int] | None = None) -> tvm.IRModule:
    """``fused`` and the spellings ``indices`` of ``written`` (``written_<i>``), traced
    at ``dtype`` and ``sizes`` (symbolic where ``None``): one module, one build.
    """
    fused = spec.trace_fused(symbolic_types(spec.signature, dtype, sizes),
                             dict(spec.signature.constants))
    functions = {"fused": fused.with_attr("global_symbol", "fused")}
    for i in indices:
        written = spec.trace_written(i, dtype, sizes)
        functions[f"written_{i}"] = written.with_attr("global_symbol", f"written_{i}")
    return tvm.IRModule(functions)


def _built_pairs(spec: ExampleSpec, dtype: str,
                 not_run: list[str]) -> list[tuple[int, tvm.IRModule, Any]]:
    """``(spelling, module, vm)`` for each spelling whose pair builds for llvm in ``dtype``.

    All spellings are built as one module; when that fails, one at a time, and a spelling
    that still does not build (TVM cannot lower an operator in that dtype, as ``power``
    in bfloat16) is listed in ``not_run``: its check in that dtype did not run.
    """
    everything = list(range(len(spec.written)))
    mod = _pair_module(spec, everything, dtype)
    try:
        vm = BUILDS.vm(mod)
    except Exception:  # noqa: BLE001 - retried one spelling at a time below
        vm = None
    if vm is not None:
        return [(i, mod, vm) for i in everything]
    built = []
    for i in everything:
        single = _pair_module(spec, [i], dtype)
        try:
            built.append((i, single, BUILDS.vm(single)))
        except Exception as err:  # noqa: BLE001 - NOT RUN, with TVM's reason
            reason = [ln for ln in str(err).splitlines() if ln.strip()][-1][:160]
            not_run.append(f"{spec.name}: NOT RUN in {dtype} for spelling {i}: the pair "
                           f"does not build for llvm ({reason})")
    return built


def _outputs(vm: Any, side: str, inputs: list[np.ndarray]) -> np.ndarray:
    (out,) = numeric.flatten(vm[side](*[C.to_tensor(a) for a in inputs]))[:1]
    return np.asarray(out, dtype="float64")


def _miss(written: np.ndarray, fused: np.ndarray, rtol: float,
          atol: float) -> tuple[bool, float, float, tuple[int, ...]]:
    """Do the outputs differ beyond ``atol + rtol * |written|`` (NaN/inf must agree)?"""
    if written.shape != fused.shape:
        return True, float("inf"), float("inf"), ()
    both = np.isfinite(written) & np.isfinite(fused)
    same_special = (~np.isfinite(written) & ~np.isfinite(fused)
                    & ((written == fused) | (np.isnan(written) & np.isnan(fused))))
    diff = np.where(both, np.abs(written - fused), 0.0)
    bad = ~(both | same_special) | (diff > atol + rtol * np.abs(written))
    err = np.where(~(both | same_special), np.inf, diff)
    rel = err / np.maximum(np.abs(written), np.finfo("float64").tiny)
    worst = np.unravel_index(int(np.argmax(err)), err.shape) if err.size else ()
    return bool(bad.any()), float(err.max(initial=0.0)), float(rel.max(initial=0.0)), \
        tuple(int(i) for i in worst)


def find_counterexample(spec: ExampleSpec, *, seed: int = 0,
                        dtypes: Sequence[str] | None = None,
                        not_run: list[str] | None = None) -> Counterexample | None:
    """Check ``written == fused`` on llvm for every spelling; the first counterexample.

    See the module docstring for the draws.  Returns ``None`` when the two sides agree on
    every draw within ``spec``'s tolerance.  A (dtype, spelling) whose pair TVM cannot
    build for llvm is not checked: it is logged as NOT RUN and added to ``not_run``.

    Raises
    ------
    PatternError
        ``written`` gave a constant output on every draw (nothing was judged), or the
        pair did not build.
    """
    if spec.fused is None:
        return None
    notes = [] if not_run is None else not_run
    symbols = spec.signature.symbols
    judged = False
    for dtype in dtypes or spec.dtypes:
        tol = spec.rule_tolerance(dtype)
        for index, mod, vm in _built_pairs(spec, dtype, notes):
            side = f"written_{index}"
            func = mod[side]
            for sizes in _size_draws(symbols):
                draws = [("seeded [-1, 1]",
                          numeric.random_inputs(func, seed=seed, shape_vars=sizes))]
                draws += adversarial_inputs(func, seed, dtype, {"shape_vars": sizes})
                for label, inputs in draws:
                    written = _outputs(vm, side, inputs)
                    fused = _outputs(vm, "fused", inputs)
                    finite = written[np.isfinite(written)]
                    if finite.size > 1 and np.ptp(finite) > 0:
                        judged = True
                    missed, abs_err, rel_err, worst = _miss(written, fused, tol.rtol, tol.atol)
                    if missed:
                        return _shrunk(spec, index, dtype, sizes, inputs, worst, label,
                                       (written, fused, abs_err, rel_err), vm, str(tol))
    for note in notes:
        log.warning("%s", note)
    if not judged:
        if notes and len(notes) == len(spec.written) * len(tuple(dtypes or spec.dtypes)):
            raise PatternError(f"{spec.name}: the pair builds for llvm in none of its dtypes; "
                               f"nothing was checked ({notes[0]})")
        raise PatternError(f"{spec.name}: written gives a constant output on every draw; "
                           f"the pair cannot be judged numerically")
    return None


def _shrunk(spec: ExampleSpec, index: int, dtype: str, sizes: dict[str, int],
            inputs: list[np.ndarray], worst: tuple[int, ...], label: str,
            found: tuple[np.ndarray, np.ndarray, float, float], vm: Any,
            tol: str) -> Counterexample:
    """The counterexample at size 1 everywhere with the worst element's inputs, when it
    still fails there; the draw as found otherwise.
    """
    tol_obj = spec.rule_tolerance(dtype)
    written, fused, abs_err, rel_err = found
    ones = {s: 1 for s in sizes}
    small = []
    for arr in inputs:
        value = arr[worst] if arr.shape == written.shape and worst else arr.flat[0]
        small.append(np.full(_ones_shape(spec, arr, sizes), value, dtype=arr.dtype))
    try:
        w1, f1 = _outputs(vm, f"written_{index}", small), _outputs(vm, "fused", small)
        missed, a1, r1, _ = _miss(w1, f1, tol_obj.rtol, tol_obj.atol)
    except Exception:  # noqa: BLE001 - a shape the pair does not take at size 1
        missed = False
    if missed:
        sizes, inputs, written, fused, abs_err, rel_err = ones, small, w1, f1, a1, r1
        label += ", shrunk"
    names = spec.signature.tensors
    from .script import module_text

    script = module_text(_pair_module(spec, [index], dtype, sizes))
    return Counterexample(spec.name, dtype, dict(sizes), dict(zip(names, inputs)), written,
                          fused, abs_err, rel_err, tol, script, label)


def _ones_shape(spec: ExampleSpec, arr: np.ndarray, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """``arr``'s shape with every symbolic dimension at 1 (static ones kept)."""
    for name in spec.signature.tensors:
        dims = spec.signature.shapes[name]
        concrete = tuple(sizes[d] if isinstance(d, str) else d for d in dims)
        if concrete == arr.shape:
            return tuple(1 if isinstance(d, str) else d for d in dims)
    return arr.shape


def verify_by_example(rule: Rule, *, seed: int = 0) -> None:
    """Raise :class:`PatternError` with the counterexample unless ``rule``'s ``written``
    and ``fused`` agree on llvm (see :func:`find_counterexample`).
    """
    spec = getattr(type(rule), "spec", None)
    if not isinstance(spec, ExampleSpec):
        raise PatternError(f"{getattr(rule, 'name', rule)!r} is not a by-example rule")
    counterexample = find_counterexample(spec, seed=seed)
    if counterexample is not None:
        raise PatternError(counterexample.summary() + "\n" + counterexample.script)


def rule_by_example(name: str, written: Callable[..., Any] | Sequence[Callable[..., Any]],
                    fused: Callable[..., Any] | None = None, *,
                    dtypes: Sequence[str] | None = None,
                    shapes: Mapping[str, Sequence[Any]] | None = None,
                    commutative: Sequence[str] = (), exact: Sequence[str] = (),
                    associative: bool = False, tolerance: Any = None, verify: bool = True,
                    example: Callable[..., Any] | None = None, example_space: Any = None,
                    doc: str | None = None) -> Rule:
    """A rule that rewrites what ``written`` computes into what ``fused`` computes.

    ``written`` and ``fused`` are functions with the same parameters, over Relax
    expressions (``lambda x: x * relax.op.sigmoid(x)`` / ``lambda x:
    relax.op.nn.silu(x)``) or, for ``written``, over torch tensors (traced through
    ``torch.export`` and patternkit's importer, so the pattern is what the importer
    emits).  ``written`` may be a list of spellings; the rule matches any of them.
    Without ``fused`` the rule is the composite ``name`` for external compilers.

    The traced ``written`` is generalised (its ``describe()`` says how): parameters
    become wildcards, shapes are free (the rank is kept only when the body needs it),
    numbers match in any float dtype within that dtype's rounding, ``add`` and
    ``multiply`` (and the operators in ``commutative``) match in either operand order,
    tensor constants and parameters with defaults (``eps=1e-5``) match any constant
    unless named in ``exact``.

    Parameters
    ----------
    name : str
        The rule's dotted name (a composite's name after the compiler prefix).
    written, fused : callables
    dtypes : sequence of str, optional
        The float dtypes the rule accepts (default: all four); the check refuses others
        and the pair is checked numerically in each.
    shapes : dict, optional
        Parameter -> dims to trace it at (ints, or names of symbolic dimensions shared
        between parameters); default ``("m", "n")`` for every parameter.
    commutative : sequence of str
        Operators besides ``add`` / ``multiply`` whose two operands match in either order.
    exact : sequence of str
        Constants whose value must match: named-constant parameters or ``c0``, ``c1``...
    associative : bool
        Match chains of products in every grouping.
    tolerance : Tolerance, float or {dtype: ...}, optional
        How far ``fused`` may drift from ``written``; default the per-dtype default.
    verify : bool
        Check ``written == fused`` on llvm now (default).  ``False`` defers the check to
        :func:`verify_by_example`, ``patternkit verify`` and the rule contract (the
        library's rules do this: their tests prove them, importing them builds nothing).
    example, example_space : optional
        A module builder and its knobs for ``patternkit verify``, instead of the traced
        example at the symbolic sizes.
    doc : str, optional
        The rule class's docstring (default: the description).

    Raises
    ------
    PatternError
        One line naming the rule and the cause for bad input; with the counterexample
        (shrunk, as TVMScript) when the two sides differ beyond the tolerance.
    """
    cls = example_rule_class(name, written, fused, dtypes=dtypes, shapes=shapes,
                             commutative=commutative, exact=exact, associative=associative,
                             tolerance=tolerance, example=example, example_space=example_space,
                             doc=doc)
    rule: Rule = cls()
    if verify and fused is not None:
        verify_by_example(rule)
    return rule
