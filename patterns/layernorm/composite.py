"""``layer_norm`` as pattern-table entries: alone, or after a residual ``add``.

:class:`LayerNormComposite` is named as TVM's tables name it (``<compiler>.layer_norm``,
cutlass's conditions), and with ``skip=True`` ``<compiler>.add_layer_norm`` (onnxruntime's
SkipLayerNormalization: two tensors of one shape added, then the norm).
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm

from patternkit.dpl import DFPattern, is_op, wildcard
from patternkit.engine import CompositeRule, RoleMatch, reject
from patternkit.ir import static_shape, type_of

from .examples import layer_norm_call
from .guards import same_shape


class LayerNormComposite(CompositeRule):
    """``layer_norm`` (optionally after a residual ``add``) as a pattern-table entry.

    Parameters
    ----------
    compiler : str
        Prefix of the composite name (the codegen that takes it).
    skip : bool
        ``False``: ``<compiler>.layer_norm``, the op alone (TVM's ``cutlass.layer_norm``
        and ``tensorrt.nn.layer_norm`` take it).  ``True``:
        ``<compiler>.add_layer_norm``, ``layer_norm(a + b, ...)`` where ``a`` and ``b``
        have the norm's input shape (a residual, onnxruntime's SkipLayerNormalization).
    """

    def __init__(self, compiler: str = "byoc", skip: bool = False):
        super().__init__(compiler)
        self.skip = bool(skip)
        self.x, self.gamma, self.beta = wildcard(), wildcard(), wildcard()
        self.residual, self.input = wildcard(), wildcard()
        self.add = is_op("add")(self.input, self.residual)
        self.norm = is_op("nn.layer_norm")(self.add if self.skip else self.x, self.gamma,
                                          self.beta)
        self.pattern: DFPattern = self.norm
        self.pattern_name = "add_layer_norm" if self.skip else "layer_norm"

    def check(self, match: RoleMatch) -> Any:
        """Accept a norm over the last axis, with gamma and beta (cutlass's conditions)."""
        norm = match.norm
        attrs = norm.attrs
        if not (bool(attrs.center) and bool(attrs.scale)):
            return reject("the layer_norm has center or scale off: the backends' kernels "
                          "apply gamma and beta", at=norm)
        ndim = type_of(norm).ndim
        axes = [int(a) for a in attrs.axes]
        if len(axes) != 1 or axes[0] % max(ndim, 1) != ndim - 1:
            return reject(f"the layer_norm normalises axes {axes} of a rank-{ndim} tensor: "
                          f"the backends' kernels take the last axis only", at=norm)
        if self.skip:
            out_shape = static_shape(type_of(match.var_of("add")))
            for role in ("input", "residual"):
                shape = static_shape(type_of(match[role]))
                if not same_shape(shape, out_shape):
                    return reject(f"the add broadcasts its {role} of shape {shape} to "
                                  f"{out_shape}: a skip connection adds two tensors of one "
                                  f"shape", at=match[role])
        return True

    def example(self, **knobs: Any) -> tvm.IRModule:
        """``layer_norm`` of ``(2, 5, 16)``, after ``x + r`` for the skip variant:
        :func:`~.examples.layer_norm_call` with ``knobs``.
        """
        return layer_norm_call(residual=self.skip, **knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Two dtypes, a static or a symbolic shape, one or two normalised axes."""
        return {"dtype": ("float32", "float16"), "symbolic": (False, True), "axes": (1, 2)}
