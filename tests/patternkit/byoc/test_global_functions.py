"""FunctionTable: the composites a pass adds, shared and named as BlockBuilder.add_func does."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from patternkit.byoc.merge.global_functions import FunctionTable
from patternkit.ir.kinds import COMPOSITE


def _composite(name: str, weight: float, size: int = 4) -> relax.Function:
    """``add(x, <constant weight>)`` tagged ``Composite=name``, as FuseOpsByPattern builds it."""
    x = relax.Var("x", relax.TensorType((size,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("composite", [x], private=True):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, relax.const(np.full(size, weight, "float32"))))
        bb.emit_func_output(out)
    return bb.get()["composite"].with_attr(COMPOSITE, name)


def _module_with(*names: str) -> tvm.IRModule:
    """A module whose functions already use ``names`` (one of them a composite)."""
    functions = {}
    for i, name in enumerate(names):
        functions[tvm.ir.GlobalVar(name)] = _composite("t.existing", 100.0 + i)
    return tvm.IRModule(functions)


# Dots in the name, names taken already, repeats, equal functions and functions that
# differ only in their constants' data (which TVM's dedup hash does not see).
ADDS = [("fused.add", 1.0, 4), ("fused_add", 1.0, 4), ("fused.add", 2.0, 4),
        ("fused_add", 3.0, 4), ("fused_add1", 4.0, 4), ("fused_add", 2.0, 4),
        ("fused_add", 5.0, 8), ("fused_mul", 6.0, 4), ("fused_add", 100.0, 4)]


@pytest.mark.parametrize("existing", [(), ("fused_add2",), ("fused_add", "fused_add1")])
def test_functions_are_shared_and_named_as_block_builder_add_func_does(existing):
    mod = _module_with(*existing)
    bb = relax.BlockBuilder(mod)
    table = FunctionTable(mod, COMPOSITE)
    for name, weight, size in ADDS:
        func = _composite("t.add", weight, size)
        theirs, ours = bb.add_func(func, name), table.add(func, name)
        assert ours.name_hint == theirs.name_hint
        assert tvm_ffi.structural_equal(ours.ty, theirs.ty)
    assert tvm_ffi.structural_equal(table.module(mod, {}), bb.get())


def test_an_added_function_equal_to_one_of_the_module_is_that_function():
    mod = _module_with("fused_add")
    table = FunctionTable(mod, COMPOSITE)
    assert table.add(_composite("t.existing", 100.0), "fused_other").name_hint == "fused_add"
    assert table.module(mod, {}).get_global_vars() == mod.get_global_vars()


def test_the_module_is_not_modified():
    mod = _module_with("fused_add")
    before = mod.script()
    table = FunctionTable(mod, COMPOSITE)
    table.add(_composite("t.add", 1.0), "fused_add")
    out = table.module(mod, {})
    assert mod.script() == before
    assert len(out.get_global_vars()) == 2


def test_a_function_without_the_marker_is_refused():
    table = FunctionTable(tvm.IRModule({}), COMPOSITE)
    with pytest.raises(ValueError, match="must carry 'Composite'"):
        table.add(_composite("t.add", 1.0).without_attr(COMPOSITE), "fused_add")
