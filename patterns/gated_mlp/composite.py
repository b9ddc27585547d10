"""``act(x @ Wg) * (x @ Wu)`` as one pattern-table entry: SwiGLU and GeGLU.

:class:`GatedMlpComposite` is one class for the six variants (the activation, separate
or packed gate and up weights); :func:`gated_mlp_table` lists them.  The checks are in
:mod:`.guards`.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

import tvm

from patternkit.dpl import DFPattern, alt, is_op, is_tuple_get_item, through, wildcard
from patternkit.engine import CompositeRule, RoleMatch

from .examples import gated_mlp
from .guards import (
    activation_cast_refusal,
    bias_refusal,
    broadcast_refusal,
    cast_refusal,
    split_refusal,
    transpose_refusal,
)

#: The composite's base name for each activation of the gate.
KINDS = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu_tanh"}


class GatedMlpComposite(CompositeRule):
    """``act(x @ Wg [+ bg]) * (x @ Wu [+ bu])`` (SwiGLU, GeGLU) as a pattern-table entry.

    Parameters
    ----------
    compiler : str
        Prefix of the composite name (the codegen that takes it).
    activation : {"silu", "gelu", "gelu_tanh"}
        The gate's activation: ``<compiler>.swiglu``, ``<compiler>.geglu`` or
        ``<compiler>.geglu_tanh``.
    packed : bool
        ``False``: two projections of the same ``x``.  ``True`` (``..._packed``): one
        projection of twice the width, ``split`` into the gate half and the up half.
    """

    def __init__(self, compiler: str = "byoc", activation: str = "silu", packed: bool = False):
        super().__init__(compiler)
        if activation not in KINDS:
            raise ValueError(f"GatedMlpComposite: activation must be one of {tuple(KINDS)}, "
                             f"found {activation!r}")
        self.activation_kind, self.packed_weights = activation, bool(packed)
        self.x = wildcard()
        if self.packed_weights:
            packed_product = self._projection("packed")
            # the halves as ``chunk`` exports: items of one ``split`` (torch.export, the
            # dynamo exporter) or two ``strided_slice`` (the TorchScript exporter's Slice)
            self.split = is_op("split")(packed_product)
            self.gate = alt(tag="gate_half", split=is_tuple_get_item(self.split),
                            sliced=is_op("strided_slice")(packed_product,
                                                          varg_default_wildcard=True))
            self.up = alt(tag="up_half", split=is_tuple_get_item(self.split),
                          sliced=is_op("strided_slice")(packed_product,
                                                        varg_default_wildcard=True))
            gate, up = self.gate, self.up  # type: DFPattern, DFPattern
        else:
            gate, up = self._projection("gate"), self._projection("up")
        # the activation as written, or computed in float32 between casts (torch.export
        # of a float16 / bfloat16 silu)
        self.activation_widened = is_op("astype")(gate)
        self.activation = is_op(f"nn.{activation}")(
            alt(tag="activation_input", widened=self.activation_widened, direct=gate))
        self.activation_narrowed = is_op("astype")(self.activation)
        activated = alt(tag="activation_output", narrowed=self.activation_narrowed,
                        direct=self.activation)
        # multiply is matched with its operands either way round (act(g) * u, u * act(g))
        self.multiply = is_op("multiply")(activated, up)
        self.pattern: DFPattern = self.multiply
        self.pattern_name = KINDS[activation] + "_packed" * self.packed_weights

    def _projection(self, name: str) -> DFPattern:
        """``x @ W [+ b]`` as roles ``<name>_weight``, ``<name>_matmul``..., possibly
        between the importer's ``reshape`` of ``x`` to 2-D and of the product back.
        """
        weight = wildcard()
        permute = is_op("permute_dims")(weight)
        matmul = is_op("matmul")(through(self.x, ("reshape",), depth=1),
                                 alt(tag=f"{name}_weight", transposed=permute, direct=weight))
        bias = wildcard()
        product = alt(tag=f"{name}_bias", biased=is_op("add")(bias, matmul), plain=matmul)
        # a float16 / bfloat16 matmul accumulated in float32 (out_dtype) and cast back
        cast = is_op("astype")(product)
        narrowed = alt(tag=f"{name}_accumulation", narrowed=cast, direct=product)
        for role, pattern in (("weight", weight), ("permute", permute), ("matmul", matmul),
                              ("bias", bias), ("cast", cast)):
            setattr(self, f"{name}_{role}", pattern)
        setattr(self, name, product)
        return through(narrowed, ("reshape",), depth=1)

    def check(self, match: RoleMatch) -> Any:
        """Accept unless a weight's permute is no transpose, an added tensor no per-feature
        bias, the multiply broadcasts, or a packed projection is not split into a gate half
        and an up half.
        """
        projections = ("packed",) if self.packed_weights else ("gate", "up")
        guards: list[Callable[[RoleMatch], Any]] = [guard for projection in projections
                  for guard in (partial(transpose_refusal, projection=projection),
                                partial(bias_refusal, projection=projection))]
        guards += [partial(cast_refusal, projection=projection) for projection in projections]
        guards += [activation_cast_refusal]
        guards += [split_refusal] if self.packed_weights else []
        for guard in (*guards, broadcast_refusal):
            refusal = guard(match)
            if refusal is not None:  # a refusal is falsy: compare with None
                return refusal
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """A Llama-style MLP in this variant's form: :func:`~.examples.gated_mlp` with ``knobs``."""
        return gated_mlp(activation=self.activation_kind, packed=self.packed_weights, **knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes, the input shapes, both multiply orders, the weight forms (and one
        no transpose), with and without biases (and one full tensor), accumulated in the
        input's dtype or in float32 with the activation between casts (and a float32 MLP
        narrowed to float16, refused); the halves of a packed
        variant either way round (and two refused splits), cut by a split or by slices (and
        one of each, refused); an up projection that broadcasts.
        """
        space: dict[str, Sequence[Any]] = {
            "dtype": ("float32", "float16"), "shape": ("batch_seq", "static", "matrix"),
            "order": ("gate_first", "up_first"),
            "weights": ("transposed", "direct", "permuted_wrongly"),
            "bias": (False, True), "bias_shape": ("feature", "full"),
            "accumulate": ("same", "float32", "narrowed")}
        if self.packed_weights:
            space["halves"] = ("gate_up", "up_gate", "same", "thirds")
            space["cut"] = ("split", "slices", "mixed")
        else:
            space["up_width"] = (32, 1)
        return space


def gated_mlp_table(compiler: str = "byoc") -> list[GatedMlpComposite]:
    """Every :class:`GatedMlpComposite` variant; the packed and separate forms match
    disjoint graphs, so their order does not matter.
    """
    return [GatedMlpComposite(compiler, activation, packed)
            for activation in KINDS for packed in (False, True)]
