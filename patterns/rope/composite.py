"""``x * cos + rotate(x) * sin`` as one pattern-table entry: rotary position embeddings.

:class:`RopeComposite` is one class for the half-rotation form (``<compiler>.rope``) and
the interleaved form (``<compiler>.rope_interleaved``); the checks are in :mod:`.guards`.
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm

from patternkit.dpl import DFPattern, is_op, is_tuple, wildcard
from patternkit.engine import CompositeRule, NoSuchExample, RoleMatch

from .examples import rotary
from .guards import concat_refusal, halves_refusal, partial_refusal, tables_refusal


class RopeComposite(CompositeRule):
    """``x * cos + rotate(x) * sin`` (rotary position embedding) as a pattern-table entry.

    Parameters
    ----------
    compiler : str
        Prefix of the composite name (the codegen that takes it).
    interleaved : bool
        ``False`` (``<compiler>.rope``, Llama, Qwen, Mistral, NeoX): ``rotate_half(x) =
        concat(-x[..., h:], x[..., :h])``.  ``True`` (``<compiler>.rope_interleaved``,
        GPT-J): the even and odd lanes pair up, ``rotate(x) = stack(-x[..., 1::2],
        x[..., ::2], -1).flatten(-2)``.
    partial : bool
        ``True`` (``..._partial``, Phi, NeoX ``rotary_pct``): only the first ``rotary_dim``
        lanes of ``full`` are rotated, ``concat(rope(full[..., :rotary_dim]),
        full[..., rotary_dim:])``; ``rotary_dim`` is the composite's first slice.
    """

    def __init__(self, compiler: str = "byoc", interleaved: bool = False, partial: bool = False):
        super().__init__(compiler)
        self.interleaved, self.partial = bool(interleaved), bool(partial)
        self.full = wildcard()
        self.x = (is_op("strided_slice")(self.full, varg_default_wildcard=True) if self.partial
                  else wildcard())
        self.negated = is_op("strided_slice")(self.x, varg_default_wildcard=True)
        self.kept = is_op("strided_slice")(self.x, varg_default_wildcard=True)
        parts: list[DFPattern] = [is_op("negative")(self.negated), self.kept]
        if self.interleaved:
            parts = [is_op("expand_dims")(part, varg_default_wildcard=True) for part in parts]
        self.concat = is_op("concat")(is_tuple(parts))
        self.rotated = (is_op("reshape")(self.concat, varg_default_wildcard=True)
                        if self.interleaved else self.concat)
        # the tables are the composite's inputs, wherever they come from: q and k share
        # them (one cos(angle) read by two rotations), so neither composite may take them
        self.cos, self.sin = wildcard(), wildcard()
        # add and multiply match with their operands either way round; the rotated side
        # comes first, so that x is bound by the slices before it is looked for beside cos
        # (the matcher swaps the operands of one call, and does not revisit a sibling's)
        self.add = is_op("add")(is_op("multiply")(self.rotated, self.sin),
                                is_op("multiply")(self.x, self.cos))
        self.pattern: DFPattern = self.add
        if self.partial:
            self.passed = is_op("strided_slice")(self.full, varg_default_wildcard=True)
            self.joined = is_op("concat")(is_tuple([self.add, self.passed]))
            self.pattern = self.joined
        self.pattern_name = ("rope" + "_interleaved" * self.interleaved
                             + "_partial" * self.partial)

    def check(self, match: RoleMatch) -> Any:
        """Accept unless the concat is no ``rotate_half`` of ``x`` (wrong halves, wrong
        axis), the tables do not broadcast against ``x`` alike, or constant tables are no
        cosine and sine of one angle.
        """
        checks = [partial_refusal(match)] if self.partial else []
        for refusal in (*checks, concat_refusal(match, self.interleaved),
                        halves_refusal(match, self.interleaved), tables_refusal(match)):
            if refusal is not None:  # a refusal is falsy: compare with None
                return refusal
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """Queries rotated in this variant's form: :func:`~.examples.rotary` with ``knobs``."""
        knobs.setdefault("rotary_dim", 4 if self.partial else None)
        if self.partial != (knobs["rotary_dim"] is not None):
            raise NoSuchExample("rotary_dim= is the rotated lanes of a partial rotation")
        return rotary(interleaved=self.interleaved, **knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes, static or symbolic batch and sequence, the tables given or computed,
        the rotation's operands either way round, and the edges the checks refuse.

        Not ``tables="ranged"`` (``from_onnx``'s tables of a dynamic sequence): that module
        does not build for llvm as imported, so ``verify`` could not compare it; the tests
        compare it with its proven length bound (:func:`.lengths.bind_proven_lengths`).
        """
        return {"dtype": ("float32", "float16"), "symbolic": (True, False),
                "tables": ("inputs", "computed", "constants", "not_cos"),
                "order": ("x_first", "rotated_first"),
                "halves": ("rotation", "swapped", "uneven"), "concat_axis": (-1, -2),
                "table_shape": ("per_position", "per_head_mismatch"),
                **({"passed": ("rest", "overlapping")} if self.partial else {})}
