"""module_text: TVMScript with constants inline, which parses back to the same module."""

from __future__ import annotations

import numpy as np
from tvm import relax

from patternkit.ir import compat as C
from patternkit.verification.script import module_text, parse_module_text


def test_constants_are_printed_inline_and_the_text_parses_back_exactly():
    x = relax.Var("x", relax.TensorType((2, 3), "float16"))
    weight = relax.const(np.arange(6, dtype="float32").reshape(3, 2) / 7, "float16")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, weight))
        bb.emit_func_output(out)
    mod = bb.get()
    text = module_text(mod)
    assert "metadata" not in text and "R.const(np.array([" in text
    assert C.structural_equal(parse_module_text(text), mod)
