"""``byoc.attention`` / ``byoc.attention_bias``: ``R.nn.attention`` as pattern-table entries.

A backend that has a fused attention kernel (cutlass, cudnn) takes the op the collapse
emits; these entries name it as TVM's cutlass table does, and leave out a call with a
causal mask or a sliding window, which other kernels take.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tvm

from patternkit.dpl import DFPattern, is_op, wildcard
from patternkit.engine import CompositeRule, RoleMatch, reject

from .expand import fused_attention


class AttentionComposite(CompositeRule):
    """``R.nn.attention`` (``bias=True``: its bias form) as a pattern-table entry.

    Named as TVM's cutlass table names them: ``<compiler>.attention`` and
    ``<compiler>.attention_bias``.  A call with a causal mask or a sliding window is
    left out (``attention_var_len`` and sliding-window kernels are other entries).
    """

    def __init__(self, compiler: str = "byoc", bias: bool = False):
        super().__init__(compiler)
        self.with_bias = bool(bias)
        self.q, self.k, self.v = wildcard(), wildcard(), wildcard()
        if self.with_bias:
            self.bias = wildcard()
            self.attention = is_op("nn.attention_bias")(self.q, self.k, self.v, self.bias)
        else:
            self.attention = is_op("nn.attention")(self.q, self.k, self.v)
        self.pattern: DFPattern = self.attention
        self.pattern_name = "attention_bias" if self.with_bias else "attention"

    def check(self, match: RoleMatch) -> Any:
        """Accept a call without a causal mask or sliding window."""
        attrs = match.attention.attrs
        if attrs.causal_mask is not None or attrs.window_size is not None:
            return reject(f"the attention has causal_mask={attrs.causal_mask}, window_size="
                          f"{attrs.window_size}: the {self.pattern_name} entry takes neither",
                          at=match.attention)
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """``R.nn.attention`` in this variant's form (see ``AttentionExpand.example``):
        :func:`~.expand.fused_attention` with ``knobs`` (``dtype="float32"``,
        ``shape="static"``, ``causal_mask=None``) and this variant's bias.
        """
        return fused_attention(bias=self.with_bias, **knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Dtypes and shapes; a causal mask, refused."""
        return {"dtype": ("float32", "float16"), "shape": ("static", "symbolic", "cross"),
                "causal_mask": (None, "TopLeft")}
