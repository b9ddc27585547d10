"""Errors of ``pk.engine.rewrite_bindings`` name the user's rewriter, never the engine.

A user who hands ``rewrite_bindings`` a function or a callable rule object reads, when it
fails, the name they gave it (its ``__name__``, or its ``name``), not "rule
rewrite_bindings"; and the library's multi-root rule carries its dotted name.
"""

from __future__ import annotations

import pytest
from tvm import relax

import patternkit as pk
from patternkit.patterns.matmul import CombineParallelMatmul


def _two_matmuls() -> relax.Function:
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    w0 = relax.Var("w0", relax.TensorType((4, 4), "float32"))
    w1 = relax.Var("w1", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w0, w1]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, w0))
            b = bb.emit(relax.op.matmul(x, w1))
            out = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(out)
    return bb.get()


def _shared_operand_context() -> pk.PatternContext:
    with pk.PatternContext() as context:
        x = pk.wildcard()
        matmul = pk.is_op("relax.matmul")(pk.wildcard(), pk.wildcard(), add_constraint=False)
        x.used_by_all(matmul, index=0, at_least=2)
    return context


def test_a_failing_function_rewriter_is_named_by_its_function_name():
    def fuse_shared_matmuls(matchings, bindings):
        raise ValueError("boom")

    with pytest.raises(pk.errors.CallbackError, match=r"^rule fuse_shared_matmuls: ") as caught:
        pk.engine.rewrite_bindings(_shared_operand_context(), fuse_shared_matmuls, _two_matmuls())
    assert caught.value.callback == "fuse_shared_matmuls"
    assert "rewrite_bindings" not in str(caught.value)


class _FixMatmuls:
    """A callable rule object: it names itself with ``name``."""

    name = "user.fix_matmuls"

    def __call__(self, matchings, bindings):
        raise RuntimeError("not written yet")


def test_a_failing_callable_rule_is_named_by_its_name_attribute():
    mod = _two_matmuls()
    before = mod.script()
    with pytest.raises(pk.errors.CallbackError, match=r"^rule user\.fix_matmuls: ") as caught:
        pk.engine.rewrite_bindings(_shared_operand_context(), _FixMatmuls(), mod)
    assert caught.value.callback == "user.fix_matmuls"
    assert mod.script() == before


def test_combine_parallel_matmul_has_a_dotted_name():
    name = CombineParallelMatmul().name
    assert name == "matmul.combine_parallel" and "." in name.strip(".")
