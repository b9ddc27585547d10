"""Each family's near-miss detector: its skeleton, so that a miss is never silent.

A family's rules match its spellings exactly; a spelling they do not know (an attention
with a scale the rule refuses, a layer norm whose epsilon is a tensor, an einsum where a
matmul was expected further up) is left as it is, and without a detector the only trace
is a rewrite that did not happen.  :data:`NEAR_MISSES` declares, per family, a loose
pattern of the ops any spelling of it has; after ``pk.rewrite(LIBRARY, mod, log=log)``,
``log.near_misses(NEAR_MISSES)`` lists every such skeleton left in the rewritten model
with the rule that looked at it and why it declined
(:mod:`patternkit.engine.near_misses`), and ``patternkit run`` writes them to
``report.md`` ("Near misses") and ``report.json``.

The skeletons, most specific first (a site two detectors see is reported by the first):

* attention: ``softmax -> matmul`` (the scores' softmax read by a matmul, through a cast,
  a reshape or the NaN guard of torch's ONNX export), and ``softmax -> call_tir`` (an ONNX
  ``Einsum``, which ``from_onnx`` lowers to a TIR function, left when
  ``einsum.from_call_tir`` refuses it), and
  ``softmax -> einsum`` (an ``R.einsum`` that ``einsum.to_matmul`` refuses);
* softmax: ``exp(...) / sum(...)`` written out (shifted by a max or not);
* norm (layer, group and instance norms): ``x - mean(x)``, the centring every one of
  them starts with;
* RMS norm: ``rsqrt|sqrt(mean(x * x) [+ eps])`` of an uncentred ``x``;
* batch norm: ``(x - mean) / sqrt(var + eps)`` (or ``* rsqrt``) with the statistics given;
* activations: GELU's ``erf``, GELU-tanh's ``tanh(c * (x + c' * ...))``, SiLU's
  ``x * sigmoid(x)`` (or of a cast or a multiple of ``x``) or ``x / (1 + exp(-x))``,
  hard-swish/hard-sigmoid's ``x * clip(x + 3, ...)`` or ``clip(x + 3, ...) / 6``;
* quantisation: ``(q.astype(f) - zero_point) * scale`` of an 8-bit ``q``, and
  ``clip(round(x / scale) + zero_point, ...)``;
* rotary embeddings: ``x * cos + concat(...) * sin`` (the half rotation);
* gated MLPs: ``act(gate) * b`` with ``act`` a SiLU or a GELU of a projection (a
  matmul, biased or not, or a part of a packed one).

A spelling a family's rules deliberately leave is named with its reason where it is found
(``_KNOWN``): attention with Gemma 2's logit softcap.

Each detector names its family's rules (rewrite rules and composites): their refusals
explain a site, and a composite that takes a site makes it no miss.  Deliberately loose:
a site that is no instance of the family (``x - mean(x)`` centring data for a cosine
similarity) is reported with the family's reason, which says what it is not.
"""

from __future__ import annotations

from patternkit.dpl import (
    DFPattern,
    divide_by_sqrt,
    has_dtype,
    is_constant,
    is_op,
    is_tuple,
    is_tuple_get_item,
    square,
    through,
    up_to_cast,
    wildcard,
)
from patternkit.engine import NearMissDetector, Rule, RuleSet

from . import LIBRARY, family_of

__all__ = ["NEAR_MISSES", "detectors"]


def _op(name: str) -> DFPattern:
    return is_op(f"relax.{name}")


def _nan_guarded(probabilities: DFPattern) -> DFPattern:
    """``probabilities`` or ``where(isnan(p), 0, p)`` of them: torch's ONNX export of
    ``scaled_dot_product_attention`` with a bool mask zeroes the rows the mask empties.
    """
    return probabilities | _op("where")(_op("isnan")(probabilities), wildcard(), probabilities)


def _attention() -> DFPattern:
    softmax = _op("nn.softmax")(wildcard())
    return _op("matmul")(up_to_cast(through(up_to_cast(_nan_guarded(softmax)))), wildcard())


def _attention_call_tir() -> DFPattern:
    # from_onnx lowers an ONNX Einsum to a call_tir of topi's einsum (einsum.from_call_tir)
    softmax = _op("nn.softmax")(wildcard())
    probabilities = is_tuple([up_to_cast(through(up_to_cast(softmax))), wildcard()])
    return _op("call_tir")(wildcard(), probabilities, varg_default_wildcard=True)


def _attention_einsum() -> DFPattern:
    # an R.einsum (lifted by einsum.from_call_tir) that einsum.to_matmul left as it is
    softmax = _op("nn.softmax")(wildcard())
    return _op("einsum")(is_tuple([up_to_cast(through(up_to_cast(softmax))), wildcard()]))


def _softcap() -> DFPattern:
    # tanh(scores / c) * c (Gemma 2's attn_logit_softcapping), the scale either way
    scaled = _op("divide")(wildcard(), is_constant()) | _op("multiply")(wildcard(),
                                                                          is_constant())
    return _op("multiply")(_op("tanh")(scaled), is_constant())


#: Spellings a family's rules deliberately leave, per family: ``(pattern, rule, reason)``
#: (:attr:`~patternkit.engine.NearMissDetector.known`).
_KNOWN: dict[str, tuple[tuple[DFPattern, str, str], ...]] = {
    "attention": ((_softcap(), "attention.collapse",
                   "a logit softcap, tanh(scores / c) * c (Gemma 2), between the scores and "
                   "the softmax: R.nn.attention has no softcap, so the attention is left as "
                   "written"),),
}


def _softmax() -> DFPattern:
    # the shift is left out: torch's max(...).values arrives as a topk
    return _op("divide")(_op("exp")(wildcard()), _op("sum")(wildcard()))


def _norm() -> DFPattern:
    mean = _op("mean")(wildcard())
    return _op("subtract")(wildcard(), up_to_cast(through(mean)))


def _rms_norm() -> DFPattern:
    uncentred = wildcard() & ~_op("subtract")(wildcard(), wildcard())
    mean_square = _op("mean")(square(up_to_cast(uncentred)))
    radicand = _op("add")(mean_square, wildcard()) | mean_square
    return _op("rsqrt")(radicand) | _op("sqrt")(radicand)


def _batch_norm() -> DFPattern:
    centred = _op("subtract")(wildcard(), wildcard())
    return divide_by_sqrt(centred, _op("add")(wildcard(), wildcard()))


def _gelu() -> DFPattern:
    return _op("erf")(wildcard())


def _gelu_tanh() -> DFPattern:
    # x + 0.044715 x^3: an add with a product in it (the cube, however it is spelled); the
    # tanh of a biased matmul (BERT's pooler, tanh(x @ W + b)) is none
    inner = _op("add")(wildcard(), _op("multiply")(wildcard(), wildcard()))
    return _op("tanh")(_op("multiply")(wildcard(), inner) | inner)


def _silu() -> DFPattern:
    # the sigmoid of x, of a cast of x or of a multiple of x: a gate a * sigmoid(b) of two
    # unrelated tensors is no SiLU
    x = wildcard()
    of_x = up_to_cast(x) | _op("multiply")(x, wildcard())
    gate = _op("multiply")(x, up_to_cast(_op("sigmoid")(of_x)))
    one_plus = _op("add")(wildcard(), _op("exp")(_op("negative")(up_to_cast(x))))
    return gate | _op("divide")(x, one_plus)


def _hard_swish() -> DFPattern:
    # x * clip(x + c) or clip(x + c) / c': a relu6 of a biased conv, clip(conv + b), is none
    x = wildcard()
    once = _op("clip")(_op("add")(x, wildcard()), wildcard(), wildcard())
    clipped = once | _op("clip")(once, wildcard(), wildcard())  # before relu6.collapse
    return (_op("multiply")(x, clipped) | _op("divide")(clipped, wildcard())
            | _op("multiply")(clipped, is_constant()))


def _dequantize() -> DFPattern:
    # a cast of an 8-bit integer tensor, scaled: T5's (bool mask).astype(f) * big is none
    q = has_dtype("int8", wildcard()) | has_dtype("uint8", wildcard())
    widened = _op("astype")(q)
    return _op("multiply")(_op("subtract")(widened, wildcard()) | widened, wildcard())


def _quantize() -> DFPattern:
    rounded = _op("round")(wildcard())
    return _op("clip")(_op("add")(rounded, wildcard()) | rounded, wildcard(), wildcard())


def _rope() -> DFPattern:
    rotated = _op("multiply")(_op("concat")(wildcard()), wildcard())
    return _op("add")(_op("multiply")(wildcard(), wildcard()), rotated)


def _gated_mlp() -> DFPattern:
    # the gate a projection: a matmul (biased or not), or a part of one packed gate/up
    # matmul (a split's item, a slice); a squeeze-and-excitation's silu(conv(x)) * s is none
    projection = _op("matmul")(wildcard(), wildcard())
    gate = up_to_cast(through(projection | _op("add")(projection, wildcard())
                              | is_tuple_get_item(wildcard())
                              | _op("strided_slice")(wildcard(), varg_default_wildcard=True)))
    act = _op("nn.silu")(gate) | _op("nn.gelu")(gate) | _op("nn.gelu_tanh")(gate)
    return _op("multiply")(act, wildcard())


#: (family, what the skeleton is, its pattern, the families whose rules explain it, and
#: the rule-name prefixes among them: ``()`` for all of them).
_SKELETONS: tuple[tuple[str, str, DFPattern, tuple[str, ...], tuple[str, ...]], ...] = (
    ("attention", "softmax -> matmul", _attention(), ("attention",), ()),
    ("attention", "softmax -> call_tir (an ONNX Einsum, which from_onnx 0.27 lowers to a "
     "TIR function: einsum.from_call_tir reads it back unless it refuses)",
     _attention_call_tir(), ("attention", "einsum"), ()),
    ("attention", "softmax -> einsum (not a batched matmul)", _attention_einsum(),
     ("attention", "einsum"), ()),
    ("softmax", "exp(x - max(x)) / sum(...)", _softmax(), ("softmax",), ()),
    ("norm", "x - mean(x)", _norm(), ("layernorm", "groupnorm", "instancenorm"), ()),
    ("rmsnorm", "rsqrt(mean(x * x) + eps)", _rms_norm(), ("rmsnorm",), ()),
    ("batchnorm", "(x - mean) / sqrt(var + eps)", _batch_norm(), ("batchnorm",), ()),
    ("gelu", "erf(x / sqrt(2))", _gelu(), ("activation",), ("gelu.",)),
    ("gelu_tanh", "tanh(c * (x + 0.044715 x^3))", _gelu_tanh(), ("activation",),
     ("gelu_tanh.",)),
    ("silu", "x * sigmoid(x)", _silu(), ("activation",), ("silu.", "byoc.quick_gelu")),
    ("hardswish", "x * clip(x + 3, 0, 6) / 6", _hard_swish(), ("activation",),
     ("hardswish.", "hardsigmoid.", "relu6.", "byoc.hardswish", "byoc.hardsigmoid")),
    ("dequantize", "(q.astype(f) - zero_point) * scale", _dequantize(), ("quantize",),
     ("dequantize.", "byoc.qdq")),
    ("quantize", "clip(round(x / scale) + zero_point)", _quantize(), ("quantize",),
     ("quantize.", "byoc.qdq")),
    ("rope", "x * cos + rotate_half(x) * sin", _rope(), ("rope",), ()),
    ("gated_mlp", "act(x @ Wg) * (x @ Wu)", _gated_mlp(), ("gated_mlp",), ()),
)


def detectors(rules: RuleSet = LIBRARY) -> tuple[NearMissDetector, ...]:
    """The families' detectors, each with its rules among ``rules`` (default the library).

    A family none of whose rules is in ``rules`` has no detector: ``patternkit run
    --patterns layernorm.collapse`` reports the norms it left, not the attention it was
    never asked about.
    """
    found = []
    for family, shape, pattern, families, prefixes in _SKELETONS:
        own: list[Rule] = [rule for rule in rules if _library_family(rule) in families
                           and (not prefixes or rule.name.startswith(prefixes))]
        if own:
            names = {rule.name for rule in own}
            known = tuple(k for k in _KNOWN.get(family, ()) if k[1] in names)
            found.append(NearMissDetector(family, shape, pattern, tuple(own), known))
    return tuple(found)


def _library_family(rule: Rule) -> str | None:
    """The library family ``rule`` belongs to; ``None`` for a rule of the user's."""
    try:
        return family_of(rule)
    except ValueError:
        return None


#: Every family's detector with its rules in :data:`patternkit.patterns.LIBRARY`.
NEAR_MISSES = detectors()
