"""Parallel matmuls that share their left operand, combined into one matmul and a split.

:class:`CombineParallelMatmul` (``matmul.combine_parallel``) is a multi-root rule: a
``PatternContext`` whose ``x.used_by_all(matmul, 0, at_least=2)`` takes every matmul
reading ``x`` at once (the family's docstring lists what it recognises and its guards).
``CombineParallelMatmul(reshaped=True)`` (``matmul.combine_parallel_reshaped``) takes the
same matmuls where the shared operand was reshaped separately for each of them, as the
torch importer writes ``nn.Linear`` on a 3-D input (``reshape(x)`` once per Linear): the
reshapes are one value computed N times, so one reshape feeds the combined matmul.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from patternkit.dpl import PatternContext, is_op, wildcard
from patternkit.engine import BindingsRewriteRule, RoleMatch, reject
from patternkit.ir import const_value, dtype_of, is_tensor_constant, static_shape, type_of

from .examples import parallel_projections


@dataclass(frozen=True)
class CombinePlan:
    """The branches to combine (binding order) and how.

    ``matmuls`` are the matched matmul Vars, ``weights`` their right operands,
    ``widths`` each ``N_i``; ``outputs`` the Var each branch's result replaces (the bias
    add when ``biases`` are folded, else the matmul); ``out_dtype`` the common
    ``out_dtype`` attribute (``""``: the operands' dtype).
    """

    matmuls: tuple
    weights: tuple
    widths: tuple[int, ...]
    outputs: tuple
    biases: tuple | None
    out_dtype: str
    left_shape: Any = None  # the reshaped variant: the shape x is reshaped to, once


def _out_dtype(call: relax.Call) -> str:
    dtype = call.attrs.out_dtype
    text = "" if dtype is None else str(dtype)
    return "" if text in ("void", "None") else text


class CombineParallelMatmul(BindingsRewriteRule):
    """Matmuls sharing their left operand: one matmul on concatenated weights and a split.

    Parameters
    ----------
    reshaped : bool
        ``False`` (``matmul.combine_parallel``): the matmuls read ``x`` itself.  ``True``
        (``matmul.combine_parallel_reshaped``): each matmul reads its own
        ``reshape(x, shape)``, all to one shape.
    """

    def __init__(self, reshaped: bool = False) -> None:
        super().__init__()
        self.reshaped = bool(reshaped)
        self.name = ("matmul.combine_parallel_reshaped" if self.reshaped
                     else "matmul.combine_parallel")
        with PatternContext() as context:
            self.x = wildcard()
            if self.reshaped:
                self.reshape = is_op("relax.reshape")(wildcard(), wildcard(),
                                                      add_constraint=False)
                self.x.used_by_all(self.reshape, index=0, at_least=2)
            else:
                self.matmul = is_op("relax.matmul")(wildcard(), wildcard(),
                                                    add_constraint=False)
                self.x.used_by_all(self.matmul, index=0, at_least=2)
        self.context = context

    def _matmuls_of_reshapes(self, match: RoleMatch, refusals: list[str]) -> tuple[list, Any]:
        """The matmuls that each read one of the reshapes of ``x`` as their left operand,
        every reshape to the first one's shape (the others are named in ``refusals``);
        and that shape.
        """
        matmuls, first_ty, shape = [], None, None
        for var in match.reshape:
            readers = match.readers(var)
            value = match.value(readers[0]) if len(readers) == 1 else None
            if (match.escapes(var) or value is None or _op(value) != "relax.matmul"
                    or not value.args[0].same_as(var)):
                refusals.append(f"'{var.name}': this reshape of x is not read by one matmul "
                                f"alone, as its left operand")
                continue
            if first_ty is None:
                first_ty, shape = type_of(var), match.value(var).args[1]
            elif not tvm_ffi.structural_equal(type_of(var), first_ty):
                refusals.append(f"'{var.name}': x is reshaped to {_shape(var)}, not to the "
                                f"first branch's {static_shape(first_ty)}")
                continue
            matmuls.append(readers[0])
        return matmuls, shape

    # -- check ---------------------------------------------------------------------------
    def check(self, match: RoleMatch) -> Any:
        """A :class:`CombinePlan` when at least two matmuls read the same ``x`` with given
        weights of one layout and dtype; the others stay as they are.
        """
        x = match.x
        x_shape = _shape(x)
        if x_shape is not None and len(x_shape) < 2:
            return reject(f"the shared operand '{x.name}' is rank 1: matmul would "
                          f"contract it away, there is no axis to split", at=x)
        first_key: tuple[Any, ...] | None = None
        branches: list[tuple[Any, Any, int]] = []
        refusals: list[str] = []
        left_shape = None
        if self.reshaped:
            candidates, left_shape = self._matmuls_of_reshapes(match, refusals)
        else:
            candidates = list(match.matmul)
        for var in candidates:
            call = match.value(var)
            weight = call.args[1]
            why = self._weight_problem(match, weight)
            if why is not None:
                refusals.append(f"'{var.name}': {why}")
                continue
            key = (_dtype(weight), _dtype(call.args[0]), _out_dtype(call))
            if first_key is None:
                first_key = key
            if key != first_key:
                refusals.append(f"'{var.name}': weight dtype {key[0]} / out_dtype "
                                f"{key[2] or 'default'} differ from the first branch's "
                                f"{first_key[0]} / {first_key[2] or 'default'}")
                continue
            shape = _shape(weight)
            assert shape is not None  # _weight_problem refused an unknown shape
            branches.append((var, weight, int(shape[1])))
        if len(branches) < 2:
            return reject(f"fewer than two matmuls of '{x.name}' can be combined: "
                          f"{'; '.join(refusals)}", at=x)
        assert first_key is not None  # set by the first branch kept
        matmuls = tuple(v for v, _, _ in branches)
        if self.reshaped:
            for var in matmuls:  # each reads a reshape of the match: the rewrite replaces it
                match.claim(var)
        biases = self._biases(match, matmuls, [n for _, _, n in branches])
        outputs = matmuls if biases is None else tuple(add for add, _ in biases)
        for out in outputs:
            if out is not None and out not in matmuls:
                match.claim(out)
        return CombinePlan(matmuls, tuple(w for _, w, _ in branches),
                           tuple(n for _, _, n in branches), outputs,
                           None if biases is None else tuple(b for _, b in biases),
                           first_key[2], left_shape)

    @staticmethod
    def _weight_problem(match: RoleMatch, weight: Any) -> str | None:
        if not (_is_given(match, weight) or _is_transposed_given(match, weight)):
            return ("its weight is computed in the function, not a constant or a parameter "
                    "(or its permute_dims)")
        shape = _shape(weight)
        if shape is None:
            return "its weight has no static shape"
        if len(shape) != 2:
            return f"its weight has rank {len(shape)}, not 2"
        if not isinstance(shape[1], int):
            return f"its weight's width {shape[1]} is symbolic: the split needs static widths"
        return None

    @staticmethod
    def _biases(match: RoleMatch, matmuls: tuple, widths: list):
        """``[(add Var, bias)]`` per branch when every branch's only reader adds a bias."""
        found = []
        for var, width in zip(matmuls, widths):
            readers = match.readers(var)
            if len(readers) != 1 or match.escapes(var):
                return None
            add = match.value(readers[0])
            if not (isinstance(add, relax.Call) and isinstance(add.op, tvm.ir.Op)
                    and add.op.name == "relax.add" and len(add.args) == 2):
                return None
            args = list(add.args)
            bias = args[1] if args[0].same_as(var) else args[0]
            if bias.same_as(var) or not (is_tensor_constant(bias) or match.is_parameter(bias)):
                return None
            if _shape(bias) != (width,) or _dtype(bias) != _dtype(var):
                return None
            found.append((readers[0], bias))
        return found

    # -- rewrite -------------------------------------------------------------------------
    def rewrite(self, match: RoleMatch) -> dict:
        """One matmul on the concatenated weights (and biases), split back into each
        branch's output.
        """
        plan: CombinePlan = match.plan
        left = (match.x if plan.left_shape is None
                else relax.op.reshape(match.x, plan.left_shape))
        merged = relax.op.matmul(left, _concat(plan.weights),
                                 out_dtype=plan.out_dtype or None)
        if plan.biases is not None:
            merged = relax.op.add(merged, _concat(plan.biases, axis=0))
        cuts = np.cumsum(plan.widths)[:-1].tolist()
        parts = relax.op.split(merged, cuts, axis=-1)
        return {out: relax.TupleGetItem(parts, i) for i, out in enumerate(plan.outputs)}

    # -- example -------------------------------------------------------------------------
    def example(self, **knobs: Any) -> tvm.IRModule:
        """A q/k/v-style projection: :func:`~.examples.parallel_projections` with ``knobs``
        (``x`` reshaped once per branch in the reshaped variant).
        """
        return parallel_projections(**{"reshaped": self.reshaped, **knobs})

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two to four branches, with or without biases, two dtypes."""
        return {"branches": (3, 2, 4), "bias": (False, True), "dtype": ("float32", "float16")}


def _is_given(match: RoleMatch, expr: Any) -> bool:
    """A constant or a parameter: known before the function runs, never computed."""
    return is_tensor_constant(expr) or match.is_parameter(expr)


def _is_transposed_given(match: RoleMatch, expr: Any) -> bool:
    """``permute_dims`` of a rank-2 constant or parameter, bound in the block: how the
    torch importer writes ``nn.Linear``'s weight.
    """
    if not isinstance(expr, relax.Var) or expr not in match.bindings:
        return False
    value = match.value(expr)
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.permute_dims"):
        return False
    axes = value.attrs.axes
    return (_is_given(match, value.args[0]) and len(_shape(value.args[0]) or ()) == 2
            and (axes is None or [int(a) for a in axes] == [1, 0]))


def _op(value: Any) -> str | None:
    return (value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            else None)


def _shape(expr: Any) -> tuple | None:
    return static_shape(type_of(expr))


def _dtype(expr: Any) -> str | None:
    return dtype_of(type_of(expr))


def _concat(values: tuple, axis: int = -1) -> Any:
    """The values concatenated along ``axis``: one constant when all are constants."""
    if all(is_tensor_constant(v) for v in values):
        return relax.const(np.concatenate([const_value(v) for v in values], axis=axis))
    return relax.op.concat(list(values), axis=axis)
