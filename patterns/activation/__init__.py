"""Activations written out elementwise, collapsed into ``R.nn.gelu`` / ``gelu_tanh`` / ``silu``;
and the expansions that training graphs need.  Every rule here is an identity, so each is
a rule by example (``docs/rules-by-example.md``): the formula as written, the op it is.

Recognises (``x`` any floating-point tensor; every product in any grouping and operand
order, every number in any float dtype within that dtype's rounding)

* ``gelu.collapse``: the erf form of GELU, ``0.5 * x * (1 + erf(x * 0.7071067811865476))``,
  with the erf argument also written ``x / 1.4142135623730951`` (torch's ONNX export), the
  ``0.5`` applied first, last or to the ``1 + erf`` term, and ``x * (0.5 + 0.5 *
  erf(...))`` (what ``R.nn.gelu`` legalises to) -> ``R.nn.gelu(x)``.
* ``gelu_tanh.collapse``: the tanh approximation, ``0.5 * x * (1 + tanh(0.7978845608 *
  (x + 0.044715 * x^3)))`` with ``x^3`` written ``power(x, 3)`` (transformers'
  ``NewGELUActivation``, what GPT-2 exports) or ``x * x * x``, and the factored argument
  ``0.7978845608 * x * (1 + 0.044715 * x * x)`` (``FastGELUActivation``; also what
  ``R.nn.gelu_tanh`` legalises to) -> ``R.nn.gelu_tanh(x)``.
* ``silu.collapse``: ``x * sigmoid(x)`` (swish; the torch importer writes ``nn.SiLU``
  this way, e.g. in a Llama MLP) -> ``R.nn.silu(x)``.
* ``relu6.collapse``: ``minimum(maximum(x, 0), 6)``, ``maximum(minimum(x, 6), 0)`` and
  the torch importer's two clips ``clip(clip(x, 0, inf), -inf, 6)`` (what it writes for
  the ``clamp`` inside ``nn.Hardswish`` / ``nn.Hardsigmoid``) -> ``R.clip(x, 0, 6)``, the
  one spelling TVM's ``relax.op.nn.relu6`` builds (0.27 has no relu6 op), so that the
  composites that read a relu6 see one form.  Exact: clamps do not round.
* ``clip.collapse_onnx`` (:mod:`.onnx_clip`, a class: it has guards): TVM's
  ``from_onnx`` of ``Clip``, two ``call_tir`` of TOPI's ``maximum`` and ``minimum`` with
  NaN-guarded bounds -> ``R.clip(x, lo, hi)``, so an ONNX ``Clip(0, 6)`` (torch's
  ``nn.ReLU6`` through either exporter) is the canonical relu6 too.
* ``maximum.collapse_onnx``, ``minimum.collapse_onnx`` (:mod:`.onnx_minmax`, a class:
  it has a guard): ``from_onnx``'s ``Max`` / ``Min``, a ``max`` / ``min`` reduction over
  a ``stack`` of the operands broadcast to one shape -> ``R.maximum`` / ``R.minimum``, so
  torch's ``minimum(maximum(x, 0), 6)`` through the TorchScript exporter is a relu6 too.
* ``hardsigmoid.canonicalize``: TVM's ``from_onnx`` of ``HardSigmoid``, ``clip(x / 6 +
  0.5, 0, 1)`` (the ``1/6`` as a constant factor), and ``clip(x + 3, 0, 6) * (1/6)`` ->
  the canonical ``clip(x + 3, 0, 6) / 6`` (torch's ``nn.Hardsigmoid`` after
  ``relu6.collapse``).
* ``hardswish.canonicalize``: TVM's ``from_onnx`` of ``HardSwish``, ``x * (clip(x + 3, 0,
  6) / 6)`` (also ``x * hardsigmoid(x)`` by hand, once hard-sigmoid is canonical), and
  ``x * clip(x + 3, 0, 6) * (1/6)`` in any grouping -> the canonical ``x * clip(x + 3,
  0, 6) / 6`` (torch's ``nn.Hardswish`` / ``F.hardswish`` and the hand-written ``x *
  relu6(x + 3) / 6`` after ``relu6.collapse``).  Relax has no hard-sigmoid or hard-swish
  op: the canonical spellings are what the composites take.  Both move roundings (a
  division for a product, ``x / 6 + 0.5`` for ``(x + 3) / 6``): a few ulp.
* ``softplus.collapse``: torch's thresholded softplus, ``where(x * 1 > 20, x, log(exp(x *
  1) + 1) / 1)`` (``nn.Softplus``; without the ``* 1`` and ``/ 1`` inside ``nn.Mish``),
  ``from_onnx``'s overflow-free ``max(x, 0) + log(1 + exp(-|x|))``, and the dynamo
  exporter's ``where(x > 20, x, Softplus(x))`` (``from_onnx`` makes the ``Softplus`` an
  ``R.nn.softplus``, which thresholds at 20 itself: the ``where`` changes nothing) ->
  ``R.nn.softplus(x)`` (beta 1, threshold 20).  The bare ``log(1 + exp(x))`` is *not*
  collapsed: it overflows to inf where the op does not (x > 88 in float32), so the two
  are not the same function.
* ``softplus.collapse_cast_beta`` (:mod:`.softplus_casts`): the dynamo exporter's
  half-precision softplus once ``softplus.collapse`` ran, ``where(x > 20, x,
  R.nn.softplus(x) / astype(1.0, x.dtype))`` -> ``R.nn.softplus(x)`` (exact).

Composites (:data:`COMPOSITES`, for external compilers): ``hardswish`` and
``hardsigmoid`` on the canonical spellings above (the hard-swish first: its relu6 is the
hard-sigmoid's); ``mish``, ``x * tanh(R.nn.softplus(x))`` (after ``softplus.collapse``)
or ``x * tanh(log(1 + exp(x)))`` (``from_onnx``'s ``Mish``: the bare softplus overflows to
inf past x = 88 in float32, where ``tanh`` is 1 either way, so this one is Mish), or with
the softplus computed in float32 between casts (torch.export of a float16 / bfloat16 Mish
written out; :mod:`.mish_casts`);
``quick_gelu``, ``x * sigmoid(1.702 * x)`` (CLIP's; no Relax op computes it exactly).

A match whose constants broadcast ``x`` to a higher rank (or of unknown rank) is refused:
the fused op would have another shape.  The collapses are exact rewrites of the formula:
what changes is only the rounding of intermediate results, a few ulp.

Expansions (:data:`EXPANSIONS`, never in the library itself: applied together with the
collapses they would undo each other).  ``relax.transform.Gradient`` in TVM 0.27 has no
gradient for ``nn.gelu``, ``nn.gelu_tanh`` or ``erf``, so a training graph needs them
written with differentiable operators:

* ``gelu_tanh.expand``: ``R.nn.gelu_tanh(x)`` -> the tanh formula, associated exactly as
  TVM legalises it.  Exact up to a few ulp.
* ``gelu.expand``: ``R.nn.gelu(x)`` -> ``x * (0.5 + 0.5 * erf(x / sqrt 2))`` with ``erf``
  replaced by :func:`rational_erf` (``erf`` has no gradient): ``z * P(z^2) / Q(z^2)`` on
  ``z`` clamped to ``[-4, 4]`` (``maximum`` / ``minimum``: ``clip`` has no gradient
  either), Eigen's float32 minimax polynomials (TVM's ``fast_erf`` uses the same),
  computed in float32 (float16 and bfloat16 inputs are cast, as TVM legalises ``erf``):
  within 3e-7 of ``erf``.  An approximation, so float64 is refused (``dtypes=``).

Deliberately not covered

* **fast-gelu**, ``x * sigmoid(1.702 * x)``, is *not collapsed*: it differs from GELU by
  up to 0.02 (``rule_by_example`` refuses that pair with the counterexample), and it is
  not ``silu`` either.  It stays written out; the ``quick_gelu`` composite takes it.
* No ``silu.expand``: ``R.nn.silu`` has a gradient in TVM 0.27 (the tests check it).
* ``x / (1 + exp(-x))`` for swish, GELU with ``erfc``, ``x / 2`` for ``0.5 * x``,
  ``x^3`` written ``x * x**2``, and activations computed between casts.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from tvm import relax

from patternkit.dpl import alt
from patternkit.engine import RoleMatch
from patternkit.verification import example_rule_class

from .examples import (
    SHAPES,
    gelu_call,
    gelu_tanh_call,
    gelu_tanh_written_out,
    gelu_written_out,
    hardsigmoid_written_out,
    hardswish_written_out,
    mish_written_out,
    quick_gelu_written_out,
    relu6_written_out,
    softplus_written_out,
    swish as swish_example,
)
from .mish_casts import upcast_mish, upcast_refusal
from .onnx_clip import OnnxClipCollapse
from .onnx_minmax import OnnxMaxCollapse, OnnxMinCollapse
from .softplus_casts import SoftplusCastBetaCollapse

#: ``1 / sqrt(2)`` and ``sqrt(2)``: the erf form scales by one or divides by the other.
SQRT_HALF = 0.5 ** 0.5
SQRT_TWO = 2.0 ** 0.5
#: ``sqrt(2 / pi)`` and the cubic coefficient of the tanh approximation of GELU.
SQRT_TWO_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715

#: Eigen's float32 ``erf``: ``erf(z) ~ z * P(z^2) / Q(z^2)`` for ``|z| <= 4``, the
#: coefficients of ``P`` and ``Q`` from the highest power down.
ERF_NUMERATOR = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                 -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                 -1.60960333262415e-02)
ERF_DENOMINATOR = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                   -7.37332916720468e-03, -1.42647390514189e-02)
ERF_CLAMP = 4.0

#: A function of ``x`` over Relax expressions: a spelling, or a part of one.
Spelling = Callable[[relax.Expr], relax.Expr]

#: The example knobs every rule of the family shares.
_DTYPES = ("float32", "float16")


def _c(value: float, like: relax.Expr) -> relax.Expr:
    """A scalar constant in the dtype of ``like`` (a traced or matched tensor)."""
    return relax.const(value, like.ty.dtype)


# -- collapses ---------------------------------------------------------------------------------
def _erf_times(x: relax.Expr) -> relax.Expr:
    return relax.op.erf(x * _c(SQRT_HALF, x))


def _erf_over(x: relax.Expr) -> relax.Expr:
    return relax.op.erf(x / _c(SQRT_TWO, x))


def _gelu_written(erf: Spelling) -> Spelling:
    return lambda x: _c(0.5, x) * x * (erf(x) + _c(1.0, x))


def _gelu_legalised(erf: Spelling) -> Spelling:
    return lambda x: x * (erf(x) * _c(0.5, x) + _c(0.5, x))


GeluCollapse = example_rule_class(
    "gelu.collapse",
    [_gelu_written(_erf_times), _gelu_written(_erf_over),
     _gelu_legalised(_erf_times), _gelu_legalised(_erf_over)],
    lambda x: relax.op.nn.gelu(x), associative=True,
    example=gelu_written_out,
    example_space={"dtype": _DTYPES, "shape": SHAPES,
                   "spelling": ("half_first", "half_last", "half_inner", "legalised"),
                   "erf_argument": ("multiply", "divide")},
    doc="Collapse GELU's erf form ``0.5 * x * (1 + erf(x / sqrt 2))`` into ``R.nn.gelu(x)``.")


def _tanh_gelu(argument: Spelling) -> Spelling:
    return lambda x: _c(0.5, x) * x * (relax.op.tanh(argument(x)) + _c(1.0, x))


GeluTanhCollapse = example_rule_class(
    "gelu_tanh.collapse",
    [_tanh_gelu(lambda x: _c(SQRT_TWO_OVER_PI, x) * (
        x + _c(CUBIC, x) * relax.op.power(x, _c(3.0, x)))),
     _tanh_gelu(lambda x: _c(SQRT_TWO_OVER_PI, x) * (x + _c(CUBIC, x) * x * x * x)),
     _tanh_gelu(lambda x: _c(SQRT_TWO_OVER_PI, x) * x * (_c(CUBIC, x) * x * x + _c(1.0, x)))],
    lambda x: relax.op.nn.gelu_tanh(x), associative=True,
    example=gelu_tanh_written_out,
    example_space={"dtype": _DTYPES, "shape": SHAPES, "cube": ("power", "product", "factored"),
                   "cubic": (CUBIC, 0.0447)},
    doc="Collapse GELU's tanh approximation (``NewGELUActivation``) into "
        "``R.nn.gelu_tanh(x)``.")

SiluCollapse = example_rule_class(
    "silu.collapse", lambda x: x * relax.op.sigmoid(x), lambda x: relax.op.nn.silu(x),
    example=swish_example,
    example_space={"dtype": _DTYPES, "shape": SHAPES, "sigmoid_of": ("x", "scaled")},
    doc="Collapse swish, ``x * sigmoid(x)``, into ``R.nn.silu(x)``.")


def _relu6_spellings() -> list[Spelling]:
    return [lambda x: relax.op.minimum(relax.op.maximum(x, _c(0.0, x)), _c(6.0, x)),
            lambda x: relax.op.maximum(relax.op.minimum(x, _c(6.0, x)), _c(0.0, x)),
            lambda x: relax.op.clip(relax.op.clip(x, 0, math.inf), -math.inf, 6)]


Relu6Collapse = example_rule_class(
    "relu6.collapse", _relu6_spellings(), lambda x: relax.op.nn.relu6(x),
    commutative=("maximum", "minimum"),
    example=relu6_written_out,
    example_space={"dtype": _DTYPES, "shape": SHAPES,
                   "spelling": ("two_clips", "min_max", "max_min"), "upper": (6.0, 5.0)},
    doc="Collapse relu6 written as ``minimum(maximum(x, 0), 6)`` or as two clips into "
        "``R.clip(x, 0, 6)``.")


def _hard_clip(x: relax.Expr) -> relax.Expr:
    """``clip(x + 3, 0, 6)``: the relu6 both hard activations are made of."""
    return relax.op.clip(x + _c(3.0, x), 0, 6)


def hardsigmoid_canonical(x: relax.Expr) -> relax.Expr:
    """The canonical hard-sigmoid, ``clip(x + 3, 0, 6) / 6``."""
    return relax.op.divide(_hard_clip(x), _c(6.0, x))


def hardswish_canonical(x: relax.Expr) -> relax.Expr:
    """The canonical hard-swish, ``x * clip(x + 3, 0, 6) / 6``."""
    return relax.op.divide(x * _hard_clip(x), _c(6.0, x))


HardsigmoidCanonicalize = example_rule_class(
    "hardsigmoid.canonicalize",
    [lambda x: relax.op.clip(x * _c(1.0 / 6.0, x) + _c(0.5, x), 0, 1),
     lambda x: _hard_clip(x) * _c(1.0 / 6.0, x)],
    hardsigmoid_canonical,
    example=hardsigmoid_written_out,
    example_space={"dtype": _DTYPES, "shape": SHAPES, "spelling": ("onnx", "scaled"),
                   "offset": (3.0, 2.0)},
    doc="Rewrite hard-sigmoid as ``from_onnx`` writes it into the canonical ``clip(x + 3, 0, "
        "6) / 6``.")

HardswishCanonicalize = example_rule_class(
    "hardswish.canonicalize",
    [lambda x: x * relax.op.divide(_hard_clip(x), _c(6.0, x)),
     lambda x: x * _hard_clip(x) * _c(1.0 / 6.0, x)],
    hardswish_canonical, associative=True,
    example=hardswish_written_out,
    example_space={"dtype": _DTYPES, "shape": SHAPES, "spelling": ("onnx", "scaled"),
                   "offset": (3.0, 2.0)},
    doc="Rewrite hard-swish as ``from_onnx`` writes it into the canonical ``x * clip(x + 3, 0, "
        "6) / 6``.")


def _torch_softplus(scaled: bool) -> Spelling:
    def written(x: relax.Expr) -> relax.Expr:
        s = x * _c(1.0, x) if scaled else x
        log = relax.op.log(relax.op.exp(s) + _c(1.0, x))
        if scaled:
            log = relax.op.divide(log, _c(1.0, x))
        return relax.op.where(relax.op.greater(s, _c(20.0, x)), x, log)
    return written


SoftplusCollapse = example_rule_class(
    "softplus.collapse",
    [_torch_softplus(scaled=True), _torch_softplus(scaled=False),
     lambda x: relax.op.maximum(x, _c(0.0, x)) + relax.op.log(
         _c(1.0, x) + relax.op.exp(relax.op.negative(relax.op.abs(x)))),
     lambda x: relax.op.where(relax.op.greater(x, _c(20.0, x)), x, relax.op.nn.softplus(x))],
    lambda x: relax.op.nn.softplus(x),
    example=softplus_written_out,
    example_space={"dtype": _DTYPES, "shape": SHAPES,
                   "spelling": ("torch", "mish", "onnx", "dynamo"),
                   "threshold": (20.0, 10.0)},
    doc="Collapse torch's thresholded softplus, ``from_onnx``'s stable one and the dynamo "
        "exporter's threshold around ``Softplus`` into ``R.nn.softplus(x)``.")


def _canonical_example(example: Callable[..., Any]) -> Callable[..., Any]:
    """``example`` in its canonical spelling (the composites' examples)."""
    def canonical(dtype: str = "float32", shape: str = "batch_seq",
                  offset: float = 3.0) -> Any:
        return example(dtype=dtype, shape=shape, spelling="canonical", offset=offset)
    return canonical


HardswishComposite = example_rule_class(
    "hardswish", [hardswish_canonical],
    example=_canonical_example(hardswish_written_out),
    example_space={"dtype": _DTYPES, "shape": SHAPES, "offset": (3.0, 2.0)},
    doc="Hard-swish, ``x * clip(x + 3, 0, 6) / 6``, as one composite.")

HardsigmoidComposite = example_rule_class(
    "hardsigmoid", [hardsigmoid_canonical],
    example=_canonical_example(hardsigmoid_written_out),
    example_space={"dtype": _DTYPES, "shape": SHAPES, "offset": (3.0, 2.0)},
    doc="Hard-sigmoid, ``clip(x + 3, 0, 6) / 6``, as one composite.")


_MishByExample = example_rule_class(
    "mish", [lambda x: x * relax.op.tanh(relax.op.nn.softplus(x)),
             lambda x: x * relax.op.tanh(relax.op.log(_c(1.0, x) + relax.op.exp(x)))],
    example=mish_written_out,
    example_space={"dtype": (*_DTYPES, "bfloat16"), "shape": SHAPES,
                   "inner": ("softplus", "log1p_exp", "sigmoid", "softplus_upcast",
                             "softplus_beta2_upcast", "softplus_downcast")},
    doc="Mish, ``x * tanh(softplus(x))``, as one composite.")


class MishComposite(_MishByExample):  # type: ignore[misc, valid-type]
    """Mish, ``x * tanh(softplus(x))``, as one composite: the by-example spellings, and
    the softplus computed in float32 between casts (:mod:`.mish_casts`).
    """

    def __init__(self, compiler: str = "byoc"):
        super().__init__(compiler)
        upcast, roles = upcast_mish()
        for role, pattern in roles.items():
            setattr(self, role, pattern)
        written = vars(self)["pattern"]  # the by-example spellings' pattern
        self.pattern = alt(tag="mish_form", written=written, upcast=upcast)

    def check(self, match: RoleMatch) -> Any:
        """The by-example check, or for the cast form :func:`.mish_casts.upcast_refusal`."""
        if match.tag("mish_form") != "upcast":
            return super().check(match)
        refusal = upcast_refusal(match)
        return True if refusal is None else refusal

QuickGeluComposite = example_rule_class(
    "quick_gelu", [lambda x: x * relax.op.sigmoid(x * _c(1.702, x))],
    example=quick_gelu_written_out,
    example_space={"dtype": _DTYPES, "shape": SHAPES, "scale": (1.702, 1.7)},
    doc="Quick-GELU, ``x * sigmoid(1.702 * x)``, as one composite.")


# -- expansions --------------------------------------------------------------------------------
def gelu_tanh_formula(x: relax.Expr) -> relax.Expr:
    """The tanh approximation in the dtype of ``x``, operation for operation as TVM
    legalises ``R.nn.gelu_tanh`` (the same roundings).
    """
    arg = (_c(SQRT_TWO_OVER_PI, x) * x) * (_c(1.0, x) + (_c(CUBIC, x) * x) * x)
    return (_c(0.5, x) * x) * (_c(1.0, x) + relax.op.tanh(arg))


def gelu_formula(x: relax.Expr) -> relax.Expr:
    """GELU as TVM legalises it: scale in the dtype of ``x``, erf (:func:`rational_erf`) in
    float32, then ``x * (0.5 + 0.5 * erf)``.
    """
    dtype = x.ty.dtype
    z = x * _c(SQRT_HALF, x)
    if dtype != "float32":
        z = relax.op.astype(z, "float32")
    erf = rational_erf(z)
    if dtype != "float32":
        erf = relax.op.astype(erf, dtype)
    return x * (_c(0.5, x) + erf * _c(0.5, x))


def rational_erf(z: relax.Expr) -> relax.Expr:
    """``erf(z)`` for a float32 ``z`` with differentiable operators only (see the module
    docstring): ``z * P(z^2) / Q(z^2)`` on ``z`` clamped to ``[-4, 4]``, Horner's rule.
    """
    def c(value: float) -> relax.Expr:
        return relax.const(value, "float32")

    z = relax.op.minimum(relax.op.maximum(z, c(-ERF_CLAMP)), c(ERF_CLAMP))
    z2 = z * z

    def horner(coefficients: tuple[float, ...]) -> relax.Expr:
        acc = c(coefficients[0])
        for coefficient in coefficients[1:]:
            acc = acc * z2 + c(coefficient)
        return acc

    return (z * horner(ERF_NUMERATOR)) / horner(ERF_DENOMINATOR)


GeluTanhExpand = example_rule_class(
    "gelu_tanh.expand", lambda x: relax.op.nn.gelu_tanh(x), gelu_tanh_formula,
    example=gelu_tanh_call,
    example_space={"dtype": ("float32", "float16", "float64"), "shape": SHAPES},
    doc="Write ``R.nn.gelu_tanh(x)`` out with differentiable operators (for ``Gradient``).")

GeluExpand = example_rule_class(
    "gelu.expand", lambda x: relax.op.nn.gelu(x), gelu_formula,
    dtypes=("float32", "float16", "bfloat16"),  # the erf approximation's reach
    example=gelu_call,
    example_space={"dtype": ("float32", "float16", "bfloat16", "float64"), "shape": SHAPES},
    doc="Write ``R.nn.gelu(x)`` out with differentiable operators, erf as a rational "
        "function.")

#: The collapse rules of this file, in priority order (``LIBRARY``).
RULES = (GeluCollapse, GeluTanhCollapse, SiluCollapse, OnnxClipCollapse,
         OnnxMaxCollapse, OnnxMinCollapse, Relu6Collapse,
         HardsigmoidCanonicalize, HardswishCanonicalize, SoftplusCollapse,
         SoftplusCastBetaCollapse)

#: The composites of this file (``LIBRARY``, after every rewrite of the library).
COMPOSITES = (HardswishComposite, HardsigmoidComposite, MishComposite, QuickGeluComposite)

#: The expansion rules of this file (``EXPANSIONS``; never applied with :data:`RULES`).
EXPANSIONS = (GeluExpand, GeluTanhExpand)
