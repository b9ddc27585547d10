"""Which Relax ops ``relax.transform.Gradient`` can differentiate, and the two it lacks.

Relax 0.27 registers a gradient (the op attribute ``FPrimalGradient``) for 52 of its 230
ops.  The library's expand rules write fused ops out in differentiable ones, but the
natural spellings of GELU (``erf``) and of normalisations (``rsqrt``) use two ops that
have none; :func:`ensure_extra_gradients` registers them, once, at the lowest priority, so
a gradient TVM registers itself (in a later release) always wins.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import tvm
from tvm import relax

from ..ir import op_name
from ..ir.dtypes import is_float_dtype
from ..ir.rebuild import describe_binding
from ..ir.walk import vars_read

_GRADIENT_ATTR = "FPrimalGradient"
_registered = False


def has_gradient(name: str) -> bool:
    """Whether ``relax.transform.Gradient`` knows the op called ``name``."""
    return tvm.ir.Op.get(name).get_attr(_GRADIENT_ATTR) is not None


def ops_without_gradient(func: relax.Function, func_name: str = "main",
                         wrt: Iterable[str] | None = None) -> dict[str, list[str]]:
    """The ops of ``func`` that have no gradient, each with the bindings that call it.

    With ``wrt`` (parameter names), only the bindings whose value depends on one of those
    parameters count: ``Gradient`` never differentiates the rest (a BERT's attention mask
    built with ``arange`` and ``bitwise_and`` from integer inputs).  Nor does it
    differentiate a binding whose value holds no floating-point tensor, or carry a
    dependence through one: the ``shape_of(table)`` of the negative-index wrap TVM's ONNX
    importer puts before every ``Gather`` reads the weight, but only for its shape.
    """
    missing: dict[str, list[str]] = defaultdict(list)
    depends = None if wrt is None else {p for p in func.params if p.name in set(wrt)}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if depends is not None:
                if not any(var in depends for var in vars_read(value)):
                    continue
                if not _holds_floats(binding.var.ty):
                    continue
                depends.add(binding.var)
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                name = op_name(value)
                if name is not None and not has_gradient(name):
                    missing[name].append(describe_binding(func_name, binding))
    return dict(missing)


def _holds_floats(ty) -> bool:
    """Is ``ty`` a floating-point tensor, or a tuple holding one?"""
    if isinstance(ty, relax.TupleType):
        return any(_holds_floats(field) for field in ty.fields)
    return isinstance(ty, relax.TensorType) and is_float_dtype(ty.dtype)


def _erf_grad(orig_var, orig_call, output_grad, ctx):
    """D erf(x) / dx = 2 / sqrt(pi) * exp(-x * x)."""
    x = orig_call.args[0]
    dtype = x.ty.dtype
    scale = relax.const(2.0 / math.sqrt(math.pi), dtype)
    return [output_grad * scale * relax.op.exp(relax.op.negative(x * x))]


def _rsqrt_grad(orig_var, orig_call, output_grad, ctx):
    """D x^(-1/2) / dx = -1/2 * rsqrt(x)^3, reusing the forward value ``orig_var``."""
    half = relax.const(-0.5, orig_call.args[0].ty.dtype)
    return [output_grad * half * orig_var * orig_var * orig_var]


def ensure_extra_gradients() -> None:
    """Register gradients for ``relax.erf`` and ``relax.rsqrt`` unless TVM has its own.

    A process-wide registration (op attributes are global in TVM), done on the first
    call of :func:`patternkit.training.gradient`, never at import.
    """
    global _registered
    if _registered:
        return
    for name, grad in (("relax.erf", _erf_grad), ("relax.rsqrt", _rsqrt_grad)):
        if not has_gradient(name):
            relax.op.register_gradient(name, grad, level=1)
    _registered = True
