"""``einsum.to_matmul``: a two-operand ``R.einsum`` that is a batched matmul, as one.

``attention.collapse`` reads matmuls: ``R.einsum((q, k), "bhqd,bhkd->bhqk")``, what
``einsum.from_call_tir`` recovers from an ONNX model (or a model that kept
``R.einsum``), is the matmul ``q @ k^T`` under another spelling.  This rule writes it
so, with the permutations the labels ask for::

    einsum((a, b), "bhqd,bhkd->bhqk")  ->  matmul(a, permute_dims(b, [0, 1, 3, 2]))
    einsum((a, b), "bhqk,bhkd->bhqd")  ->  matmul(a, b)
    einsum((a, b), "bqhd,bkhd->bhqk")  ->  matmul(permute_dims(a, ...), permute_dims(b, ...))

The labels sort into batch (in both operands and the result), row (first operand and
result), column (second operand and result) and contracted (both operands, not the
result).  It is a batched matmul when both operands have the rank of the result, with
one row, one column and one contracted label and the rest batch labels of provably equal
extents (``matmul`` would broadcast a batch axis of 1, which ``topi.einsum`` does not).
The batch axes keep the result's order, so the result needs a permutation only when the
row or column is not among its last two axes.  Within the default tolerance: ``matmul``
and ``einsum`` sum the same products, and their schedules may order them differently.

Refused with the reason: an equation with an ellipsis or no ``->``, a label repeated
within an operand, operands of other ranks than the result or of unknown shape,
not exactly one row, column and contracted label (an outer product, a matrix-vector
product, a label summed within one operand), batch axes of other extents, operands of
two dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import tvm
from tvm import relax

from patternkit.dpl import DFPattern, is_op, is_tuple, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import prove_equal, static_shape, type_of

from .examples import relax_einsum


@dataclass(frozen=True)
class MatmulPlan:
    """``permute_dims(matmul(permute_dims(a, a_axes), permute_dims(b, b_axes)), out_axes)``."""

    a_axes: tuple[int, ...]
    b_axes: tuple[int, ...]
    out_axes: tuple[int, ...]


class Unfit(Exception):
    """Why the einsum is no batched matmul (the rule's refusal reason)."""


class EinsumToMatmul(RewriteRule):
    """Rewrite a two-operand ``R.einsum`` that is a batched matmul into ``R.matmul``."""

    name = "einsum.to_matmul"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.a, self.b = wildcard(), wildcard()
        self.pattern: DFPattern = is_op("einsum")(is_tuple([self.a, self.b]))

    def check(self, match: RoleMatch) -> Any:
        """A :class:`MatmulPlan`, or the reason the einsum is no batched matmul."""
        try:
            return _plan(str(match.root.attrs.subscripts), match.a, match.b)
        except Unfit as unfit:
            return reject(f"{unfit.args[0]}: not a batched matmul", at=match.root)

    def rewrite(self, match: RoleMatch) -> Any:
        """``[permute_dims](matmul(a', b'))`` with the plan's permutations."""
        plan: MatmulPlan = match.plan
        out = relax.op.matmul(_permute(match.a, plan.a_axes), _permute(match.b, plan.b_axes))
        return _permute(out, plan.out_axes)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """:func:`~.examples.relax_einsum` with ``knobs``."""
        return relax_einsum(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Attention's einsums in both head layouts, 3-D and 2-D matmuls, both dtypes,
        symbolic batch and sequence; an outer product and a broadcast batch (refused).
        """
        return {"equation": ("bhsd,bhkd->bhsk", "bhsk,bhkd->bhsd", "bshd,bkhd->bhsk",
                             "bhsk,bkhd->bshd", "bij,bjk->bik", "ij,jk->ik", "bi,bj->bij",
                             "bij,bkj->bki"),
                "dtype": ("float32", "float16"), "shape": ("static", "symbolic"),
                "broadcast": (False, True)}


def _plan(equation: str, a: Any, b: Any) -> MatmulPlan:
    if "..." in equation or equation.count("->") != 1:
        raise Unfit(f"the equation {equation!r} has an ellipsis or no single '->'")
    inputs, out = equation.split("->")
    terms = inputs.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in (*terms, out)):
        raise Unfit(f"the equation {equation!r} repeats a label within a term")
    la, lb = terms
    shapes = [static_shape(type_of(x)) for x in (a, b)]
    if any(s is None for s in shapes) or not len(la) == len(lb) == len(out) >= 2:
        raise Unfit(f"the equation {equation!r} reads operands of rank {len(la)} and "
                    f"{len(lb)} into a result of rank {len(out)}: a matmul keeps the rank")
    if str(type_of(a).dtype) != str(type_of(b).dtype):
        raise Unfit(f"the operands are {type_of(a).dtype} and {type_of(b).dtype}")
    batch = [c for c in out if c in la and c in lb]
    rows = [c for c in la if c in out and c not in lb]
    cols = [c for c in lb if c in out and c not in la]
    summed = [c for c in la if c in lb and c not in out]
    if len(rows) != 1 or len(cols) != 1 or len(summed) != 1 or len(batch) != len(out) - 2:
        raise Unfit(f"the equation {equation!r} has {len(rows)} row, {len(cols)} column, "
                    f"{len(summed)} contracted and {len(batch)} batch labels (a matmul: "
                    f"one, one, one and the rest)")
    a_shape, b_shape = shapes
    assert a_shape is not None and b_shape is not None
    for c in batch:
        if not prove_equal(a_shape[la.index(c)], b_shape[lb.index(c)]):
            raise Unfit(f"the batch label {c!r} has extent {a_shape[la.index(c)]} in the "
                        f"first operand and {b_shape[lb.index(c)]} in the second")
    a_order = [*batch, rows[0], summed[0]]
    b_order = [*batch, summed[0], cols[0]]
    product = [*batch, rows[0], cols[0]]
    return MatmulPlan(tuple(la.index(c) for c in a_order), tuple(lb.index(c) for c in b_order),
                      tuple(product.index(c) for c in out))


def _permute(expr: Any, axes: tuple[int, ...]) -> Any:
    if axes == tuple(range(len(axes))):
        return expr
    return relax.op.permute_dims(expr, list(axes))
