"""emit_rewrites: the function a pass emits, and what it tells the next round about it.

The rewrite driver decides from :attr:`Emitted.keys` whether a rule's root can occur in
the function it emitted, without reading that function again: keys that were missing
would silently end the fixed point too early, so they must be exactly the binding keys
of the emitted function.
"""

from __future__ import annotations

from hypothesis import given, strategies as st
from tvm import relax

from patternkit.engine.emit import emit_rewrites
from patternkit.engine.index import FunctionIndex, binding_key
from patternkit.ir.compat import handle
from patternkit.testing import relax_graphs


def _keys_of(func: relax.Function) -> frozenset:
    return frozenset(binding_key(b.value) for block in func.body.blocks
                     for b in block.bindings if isinstance(b, relax.VarBinding))


def _float_tensor(var) -> bool:
    ty = var.ty
    return isinstance(ty, relax.TensorType) and ty.dtype == "float32"


@given(relax_graphs(max_ops=12), st.lists(st.integers(0, 64), min_size=1, max_size=4),
       st.booleans())
def test_the_emitted_keys_are_the_binding_keys_of_the_emitted_function(mod, picks, nested):
    func = mod["main"]
    index = FunctionIndex.build(func)
    bindings = [b for block in index.blocks for b in block
                if isinstance(b, relax.VarBinding) and _float_tensor(b.var)]
    if not bindings:
        return
    replacements = {}
    for pick in picks:
        binding = bindings[pick % len(bindings)]
        var = binding.var
        # The value as it was, its own sigmoid, or a nested call that emission normalises
        # into new bindings (a key the function did not have before).
        source = next((a for a in binding.value.args if isinstance(a, relax.Var)
                       and _float_tensor(a) and a.ty.shape.same_as(var.ty.shape)), None) \
            if isinstance(binding.value, relax.Call) else None
        if source is None:
            continue
        replacements[handle(var)] = (relax.op.tanh(relax.op.sigmoid(source)) if nested
                                     else relax.op.sigmoid(source))
    if not replacements:
        return
    emitted = emit_rewrites(func, index, replacements, "main", pass_name="test")
    assert emitted.keys == _keys_of(emitted.function)
