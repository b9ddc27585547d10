"""shrink_module: a failing program is cut to the smallest cone that still fails."""

from __future__ import annotations

from tvm import relax

from patternkit.verification.shrink import cones, shrink_module


def program():
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    y = relax.Var("y", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(x))
            b = bb.emit(relax.op.sigmoid(y))
            s = bb.emit(relax.op.tanh(a))
            out = bb.emit_output(relax.op.add(s, b))
        bb.emit_func_output(out)
    return bb.get()


def ops(mod):
    return [b.value.op.name for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call)]


def test_cones_come_smallest_first_and_keep_only_the_inputs_they_read():
    found = cones(program())
    assert [ops(m) for m in found][:2] == [["relax.nn.relu"], ["relax.sigmoid"]]
    assert [p.name for p in found[1]["main"].params] == ["y"]
    assert all(relax.analysis.check_well_formed(m) for m in found)


def test_the_smallest_failing_cone_is_kept():
    def has_tanh(mod):
        return "relax.tanh" in ops(mod)

    small = shrink_module(program(), has_tanh)
    assert ops(small) == ["relax.nn.relu", "relax.tanh"]
    assert [p.name for p in small["main"].params] == ["x"]


def test_a_module_whose_failure_needs_everything_stays_whole():
    mod = program()
    assert shrink_module(mod, lambda m: "relax.add" in ops(m)) is mod
