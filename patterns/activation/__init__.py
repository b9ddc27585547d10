"""Activations written out elementwise, collapsed into ``R.nn.gelu`` / ``gelu_tanh`` / ``silu``;
and the expansions that training graphs need.

Recognises (``x`` any floating-point tensor; every product in any grouping and operand
order, every number in any float dtype within that dtype's rounding)

* :class:`GeluCollapse` (``gelu.collapse``): the erf form of GELU,
  ``0.5 * x * (1 + erf(x * 0.7071067811865476))``, with the erf argument also written
  ``x / 1.4142135623730951`` (torch's ONNX export), the ``0.5`` applied first, last or
  to the ``1 + erf`` term, and ``x * (0.5 + 0.5 * erf(...))`` (what ``R.nn.gelu``
  legalises to) -> ``R.nn.gelu(x)``.
* :class:`GeluTanhCollapse` (``gelu_tanh.collapse``): the tanh approximation,
  ``0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x^3)))`` with ``x^3`` written
  ``power(x, 3)`` (transformers' ``NewGELUActivation``, what GPT-2 exports) or
  ``x * x * x``, and the factored argument ``0.7978845608 * x * (1 + 0.044715 * x * x)``
  (transformers' ``FastGELUActivation``; also what ``R.nn.gelu_tanh`` legalises to)
  -> ``R.nn.gelu_tanh(x)``.
* :class:`SiluCollapse` (``silu.collapse``): ``x * sigmoid(x)`` (swish; the torch importer
  writes ``nn.SiLU`` this way, e.g. in a Llama MLP) -> ``R.nn.silu(x)``.

The collapses are exact rewrites of the formula (``R.nn.gelu`` *is* the erf form,
``R.nn.gelu_tanh`` the tanh form): what changes is only the rounding of intermediate
results, a few ulp; the tests state the tolerance per dtype.

Expansions (:data:`EXPANSIONS`, never in the library itself: applied together with the
collapses they would undo each other).  ``relax.transform.Gradient`` in TVM 0.27 has no
gradient for ``nn.gelu``, ``nn.gelu_tanh`` or ``erf``, and TVM's
``DecomposeOpsForTraining`` leaves all three alone, so a training graph needs them
written with differentiable operators:

* :class:`GeluTanhExpand` (``gelu_tanh.expand``): ``R.nn.gelu_tanh(x)`` -> the tanh
  formula, associated exactly as TVM legalises it (``power``, ``tanh``, ``multiply`` and
  ``add`` all have gradients).  Exact up to a few ulp.
* :class:`GeluExpand` (``gelu.expand``): ``R.nn.gelu(x)`` -> ``x * (0.5 + 0.5 * erf(x /
  sqrt 2))`` with ``erf`` replaced by a rational approximation, since ``erf`` has no
  gradient: ``erf(z) ~ z * P(z^2) / Q(z^2)`` on ``z`` clamped to ``[-4, 4]`` (with
  ``maximum`` / ``minimum``: ``clip`` has no gradient either), the degree-13/8
  minimax polynomials of Eigen's float32 ``erf`` (TVM's ``fast_erf`` uses the same).
  It is computed in float32 (float16 and bfloat16 inputs are cast, as TVM's own
  legalisation of ``erf`` does): evaluated in float32 it is within 3e-7 of the true
  ``erf`` (two to three ulp near ``|erf| = 1``), and the gradient of the expanded GELU is
  within 1e-5 of GELU's derivative (the tests measure both).  This
  is an approximation, so the rule refuses float64 (whose rounding it would not meet).

Deliberately not covered

* **fast-gelu**, ``x * sigmoid(1.702 * x)`` (the sigmoid approximation of GELU, e.g.
  transformers' ``QuickGELUActivation``) is *not collapsed*: it differs from GELU by up to
  0.02 (from ``gelu_tanh`` by as much), so calling it ``R.nn.gelu`` would be a claim of
  equality that is false, and ``R.nn`` has no fast-gelu op to collapse it into exactly.
  It is not ``silu`` either (the sigmoid's argument is ``1.702 * x``, not ``x``), and
  stays written out.
* No ``silu.expand``: ``R.nn.silu`` has a gradient in TVM 0.27 (the tests check it).
* ``x / (1 + exp(-x))`` for swish, GELU with ``erfc``, ``x / 2`` for ``0.5 * x``, and
  ``x^3`` written ``x * x**2`` (no frontend emits these), and activations computed
  between casts (``astype`` to float32 and back).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import tvm
from tvm import relax

from patternkit.dpl import is_op, is_scalar, products, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import dtype_of, type_of

from .examples import (
    SHAPES,
    gelu_call,
    gelu_tanh_call,
    gelu_tanh_written_out,
    gelu_written_out,
    swish,
)

#: ``1 / sqrt(2)`` and ``sqrt(2)``: the erf form scales by one or divides by the other.
SQRT_HALF = 0.5 ** 0.5
SQRT_TWO = 2.0 ** 0.5
#: ``sqrt(2 / pi)`` and the cubic coefficient of the tanh approximation of GELU.
SQRT_TWO_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715

#: Eigen's float32 ``erf``: ``erf(z) ~ z * P(z^2) / Q(z^2)`` for ``|z| <= 4``, the
#: coefficients of ``P`` and ``Q`` from the highest power down (TVM's ``fast_erf`` uses
#: the same).  Beyond 4, ``erf`` is 1 to within 2e-8, below float32's resolution there.
ERF_NUMERATOR = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                 -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                 -1.60960333262415e-02)
ERF_DENOMINATOR = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                   -7.37332916720468e-03, -1.42647390514189e-02)
ERF_CLAMP = 4.0

#: Dtypes the erf approximation is accurate for (computed in float32, cast back).
_ERF_DTYPES = ("float16", "bfloat16", "float32")


def _const(value: float, dtype: str) -> relax.Expr:
    """A scalar constant of ``dtype`` (TVM rounds the Python float; numpy has no bfloat16)."""
    return relax.const(value, dtype)


# -- guards ------------------------------------------------------------------------------------
def _check_shape_kept(match: RoleMatch, op: str) -> Any:
    """Refuse when the pattern's constants broadcast ``x`` to a higher rank.

    A number in a pattern matches a one-element constant of any shape; ``x * c`` with
    ``c`` of shape ``(1, 1, 1)`` has rank 3 even for a vector ``x``, and ``op(x)`` would
    not.  Equal ranks mean equal shapes (a one-element operand changes no dimension).
    """
    x_ty, out_ty = type_of(match.x), type_of(match.root)
    x_rank = getattr(x_ty, "ndim", -1)
    out_rank = getattr(out_ty, "ndim", -1)
    if x_rank < 0 or out_rank < 0:
        return reject(f"x has an unknown rank: cannot tell whether the constants broadcast "
                      f"it to a higher rank, which {op}(x) would not", at=match.x)
    if x_rank != out_rank:
        return reject(f"the constants broadcast x from rank {x_rank} to rank {out_rank}; "
                      f"{op}(x) keeps x's shape", at=match.x)
    return True


# -- collapses ---------------------------------------------------------------------------------
class GeluCollapse(RewriteRule):
    """Collapse GELU's erf form ``0.5 * x * (1 + erf(x / sqrt 2))`` into ``R.nn.gelu(x)``."""

    name = "gelu.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.erf = is_op("erf")(self.x * SQRT_HALF | self.x / SQRT_TWO)
        written = products(0.5, self.x, self.erf + 1.0)
        legalised = self.x * (self.erf * 0.5 + 0.5)  # TVM's legalisation of R.nn.gelu
        self.pattern = written | legalised

    def check(self, match: RoleMatch) -> Any:
        """Accept unless the constants change ``x``'s rank."""
        return _check_shape_kept(match, "R.nn.gelu")

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.nn.gelu(x)`` in place of the written-out erf form."""
        return relax.op.nn.gelu(match.x)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """GELU's erf form written out: :func:`~.examples.gelu_written_out` with
        ``knobs``.
        """
        return gelu_written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """The spellings of the erf form met in exports: the half first, last or inside,
        legalised, the erf argument multiplied or divided; two dtypes and the shared shapes.
        """
        return {"dtype": ("float32", "float16"), "shape": SHAPES,
                "spelling": ("half_first", "half_last", "half_inner", "legalised"),
                "erf_argument": ("multiply", "divide")}


class GeluTanhCollapse(RewriteRule):
    """Collapse GELU's tanh approximation (``NewGELUActivation``) into ``R.nn.gelu_tanh(x)``."""

    name = "gelu_tanh.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = x = wildcard()
        # exactly 3: a power one ulp off is NaN wherever x is negative
        self.power = is_op("power")(x, is_scalar(3.0, rtol=0.0))
        cubic = products(CUBIC, self.power) | products(CUBIC, x, x, x)
        expanded = products(SQRT_TWO_OVER_PI, x + cubic)
        factored = products(SQRT_TWO_OVER_PI, x, products(CUBIC, x, x) + 1.0)
        self.tanh = is_op("tanh")(expanded | factored)
        self.pattern = products(0.5, x, self.tanh + 1.0)

    def check(self, match: RoleMatch) -> Any:
        """Accept unless the constants change ``x``'s rank."""
        return _check_shape_kept(match, "R.nn.gelu_tanh")

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.nn.gelu_tanh(x)`` in place of the written-out tanh approximation."""
        return relax.op.nn.gelu_tanh(match.x)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """GELU's tanh approximation written out:
        :func:`~.examples.gelu_tanh_written_out` with ``knobs``.
        """
        return gelu_tanh_written_out(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """The cube as a power, a product or factored, and the two cubic constants in use;
        two dtypes and the shared shapes.
        """
        return {"dtype": ("float32", "float16"), "shape": SHAPES,
                "cube": ("power", "product", "factored"), "cubic": (CUBIC, 0.0447)}


class SiluCollapse(RewriteRule):
    """Collapse swish, ``x * sigmoid(x)``, into ``R.nn.silu(x)``."""

    name = "silu.collapse"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.sigmoid = is_op("sigmoid")(self.x)
        self.pattern = self.x * self.sigmoid

    def rewrite(self, match: RoleMatch) -> Any:
        """``R.nn.silu(x)`` in place of ``x * sigmoid(x)``."""
        return relax.op.nn.silu(match.x)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """Swish, ``x * sigmoid(x)``: :func:`~.examples.swish` with ``knobs``."""
        return swish(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Swish with the sigmoid of ``x`` itself or of a scaled ``x`` (refused); two dtypes."""
        return {"dtype": ("float32", "float16"), "shape": SHAPES, "sigmoid_of": ("x", "scaled")}


# -- expansions --------------------------------------------------------------------------------
def _float_dtype(match: RoleMatch, op: str, allowed: Sequence[str] | None = None) -> Any:
    """The dtype of ``x`` as the plan, or a refusal when it is unknown or not allowed."""
    dtype = dtype_of(type_of(match.x))
    if dtype is None:
        return reject(f"x has no known dtype: the constants of {op}'s formula need one",
                      at=match.x)
    if allowed is not None and dtype not in allowed:
        return reject(f"x is {dtype}: the rational erf approximation is accurate to float32 "
                      f"rounding only (about 3e-7); leave {op} to a float64 graph as it is",
                      at=match.x)
    return dtype


class GeluTanhExpand(RewriteRule):
    """Write ``R.nn.gelu_tanh(x)`` out with differentiable operators (for ``Gradient``)."""

    name = "gelu_tanh.expand"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.pattern = is_op("nn.gelu_tanh")(self.x)

    def check(self, match: RoleMatch) -> Any:
        """The dtype of ``x`` (the plan): the constants are made in it."""
        return _float_dtype(match, "R.nn.gelu_tanh")

    def rewrite(self, match: RoleMatch) -> Any:
        """The tanh approximation in the plan's dtype, as TVM legalises it (the same roundings)."""
        x, dtype = match.x, match.plan

        def c(value):
            return _const(value, dtype)

        # TVM's legalisation, operation for operation: the same roundings.
        arg = (c(SQRT_TWO_OVER_PI) * x) * (c(1.0) + (c(CUBIC) * x) * x)
        return (c(0.5) * x) * (c(1.0) + relax.op.tanh(arg))

    def example(self, **knobs: Any) -> tvm.IRModule:
        """One ``R.nn.gelu_tanh``: :func:`~.examples.gelu_tanh_call` with ``knobs``."""
        return gelu_tanh_call(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """The float dtypes with a tanh (float64 included) and the shared shapes."""
        return {"dtype": ("float32", "float16", "float64"), "shape": SHAPES}


class GeluExpand(RewriteRule):
    """Write ``R.nn.gelu(x)`` out with differentiable operators, erf as a rational function."""

    name = "gelu.expand"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        self.x = wildcard()
        self.pattern = is_op("nn.gelu")(self.x)

    def check(self, match: RoleMatch) -> Any:
        """The dtype of ``x`` (the plan), one the erf approximation is accurate for."""
        return _float_dtype(match, "R.nn.gelu", allowed=_ERF_DTYPES)

    def rewrite(self, match: RoleMatch) -> Any:
        """GELU as TVM legalises it: scale in the dtype of ``x``, erf in float32, then
        ``x * (0.5 + 0.5 * erf)``.
        """
        x, dtype = match.x, match.plan
        # As TVM legalises R.nn.gelu: scale in x's dtype, erf in float32, then
        # x * (0.5 + 0.5 * erf).
        z = x * _const(SQRT_HALF, dtype)
        if dtype != "float32":
            z = relax.op.astype(z, "float32")
        erf = rational_erf(z)
        if dtype != "float32":
            erf = relax.op.astype(erf, dtype)
        return x * (_const(0.5, dtype) + erf * _const(0.5, dtype))

    def example(self, **knobs: Any) -> tvm.IRModule:
        """One ``R.nn.gelu``: :func:`~.examples.gelu_call` with ``knobs``."""
        return gelu_call(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """The dtypes the erf approximation serves (float64 refused) and the shared shapes."""
        return {"dtype": ("float32", "float16", "bfloat16", "float64"), "shape": SHAPES}


def rational_erf(z: relax.Expr) -> relax.Expr:
    """``erf(z)`` for a float32 ``z`` with differentiable operators only (see the module
    docstring): ``z * P(z^2) / Q(z^2)`` on ``z`` clamped to ``[-4, 4]``, Horner's rule.
    """
    def c(value):
        return _const(value, "float32")

    z = relax.op.minimum(relax.op.maximum(z, c(-ERF_CLAMP)), c(ERF_CLAMP))
    z2 = z * z

    def horner(coefficients):
        acc = c(coefficients[0])
        for coefficient in coefficients[1:]:
            acc = acc * z2 + c(coefficient)
        return acc

    return (z * horner(ERF_NUMERATOR)) / horner(ERF_DENOMINATOR)


#: The collapse rules of this file, in priority order (``LIBRARY``).
RULES = (GeluCollapse, GeluTanhCollapse, SiluCollapse)

#: The expansion rules of this file (``EXPANSIONS``; never applied with :data:`RULES`).
EXPANSIONS = (GeluExpand, GeluTanhExpand)
