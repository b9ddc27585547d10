"""``group_norm`` as pattern-table entries: alone, or followed by a SiLU.

:class:`GroupNormComposite` names ``<compiler>.group_norm`` and, with ``silu=True``,
``<compiler>.group_norm_silu``: the diffusion UNet / VAE block's norm and activation,
which fused group-norm kernels (TensorRT's and onnxruntime's ``GroupNorm`` with
``activation=1``) take as one.
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm

from patternkit.dpl import DFPattern, is_op, wildcard
from patternkit.engine import CompositeRule, RoleMatch

from .examples import group_norm_call


class GroupNormComposite(CompositeRule):
    """``group_norm`` (optionally followed by ``silu``) as a pattern-table entry.

    Parameters
    ----------
    compiler : str
        Prefix of the composite name (the codegen that takes it).
    silu : bool
        ``False``: ``<compiler>.group_norm``, the op alone.  ``True``:
        ``<compiler>.group_norm_silu``, ``silu(group_norm(...))``.
    """

    def __init__(self, compiler: str = "byoc", silu: bool = False):
        super().__init__(compiler)
        self.silu = bool(silu)
        self.x, self.gamma, self.beta = wildcard(), wildcard(), wildcard()
        self.norm = is_op("nn.group_norm")(self.x, self.gamma, self.beta)
        self.activation = is_op("nn.silu")(self.norm)
        self.pattern: DFPattern = self.activation if self.silu else self.norm
        self.pattern_name = "group_norm_silu" if self.silu else "group_norm"

    def check(self, match: RoleMatch) -> Any:
        """Accept every ``group_norm``: its attributes travel inside the composite."""
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """``group_norm`` of ``(N, 8, 4, 4)``, then a SiLU for the ``silu`` variant:
        :func:`~.examples.group_norm_call` with ``knobs``.
        """
        return group_norm_call(silu=self.silu, **knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes, a static or a symbolic batch, two group counts."""
        return {"dtype": ("float32", "float16"), "batch": (2, "n"), "groups": (2, 4)}
