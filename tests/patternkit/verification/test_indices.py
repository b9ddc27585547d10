"""Integer inputs that index a table: found through the bindings, checked before a run."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from patternkit.ir import compat as C
from patternkit.verification.indices import index_ranges, index_tables, out_of_bounds


def _embedding_model():
    """ids (int64) -> astype int32 -> take(table[10, 4]); types (int64) -> take(types[2, 4])."""
    ids = relax.Var("ids", relax.TensorType((2, 3), "int64"))
    types = relax.Var("types", relax.TensorType((2, 3), "int64"))
    other = relax.Var("other", relax.TensorType((2, 3), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [ids, types, other]):
        with bb.dataflow():
            cast = bb.emit(relax.op.astype(ids, "int32"))
            words = bb.emit(relax.op.take(relax.const(np.ones((10, 4), "float32")), cast, axis=0))
            flat = bb.emit(relax.op.reshape(types, (6,)))
            kinds = bb.emit(relax.op.take(relax.const(np.ones((2, 4), "float32")), flat, axis=0))
            shifted = bb.emit(relax.op.add(other, relax.const(1, "int64")))
            more = bb.emit(relax.op.take(relax.const(np.ones((5, 4), "float32")), shifted,
                                         axis=0))
            out = bb.emit_output(relax.op.add(relax.op.sum(words), relax.op.sum(kinds)
                                              + relax.op.sum(more)))
        bb.emit_func_output(out)
    return bb.get()["main"]


def test_an_integer_input_is_followed_through_casts_and_reshapes_to_the_table_it_indexes():
    tables = index_tables(_embedding_model())
    assert [t.size for t in tables["ids"]] == [10]
    assert [t.size for t in tables["types"]] == [2]
    assert index_ranges(_embedding_model()) == {"ids": (0, 10), "types": (0, 2)}


def test_an_index_computed_from_an_input_is_not_attributed_to_it():
    # other + 1 indexes the third table: its valid inputs are [-1, 4), not [0, 5)
    assert "other" not in index_tables(_embedding_model())


def test_inputs_inside_their_tables_pass_and_one_outside_is_named_with_its_table():
    func = _embedding_model()
    fine = [np.full((2, 3), 9), np.ones((2, 3), "int64"), np.zeros((2, 3), "int64")]
    assert out_of_bounds(func, fine) == []
    bad = [fine[0], np.full((2, 3), 7), fine[2]]
    (problem,) = out_of_bounds(func, bad)
    assert "'types' holds values in [7, 7]" in problem and "axis of size 2" in problem
    negative = [np.full((2, 3), -1), fine[1], fine[2]]
    assert "'ids'" in out_of_bounds(func, negative)[0]


def test_random_integer_inputs_are_drawn_inside_the_tables_they_index():
    from patternkit.verification.numeric import random_inputs

    ids, types, other = random_inputs(_embedding_model(), seed=3)
    assert ids.max() < 10 and types.max() < 2 and ids.min() >= 0
    assert other.max() < 8  # indexes nothing known: the small default range
    ids, types, _ = random_inputs(_embedding_model(), int_ranges={"types": (1, 2)})
    assert (types == 1).all()


def test_compare_refuses_inputs_that_would_read_outside_a_table():
    import tvm

    import patternkit as pk

    mod = tvm.IRModule({"main": _embedding_model()})
    result = pk.compare(mod, mod, int_ranges={"types": (0, 8)}, seed=1)
    assert not result.ok and result.refused
    assert "REFUSED" in str(result) and "'types'" in str(result)


def test_the_negative_index_wrap_of_onnx_gather_is_followed_to_the_table():
    # TVM's ONNX importer writes Gather(table, ids) as take(table, where(ids < 0, ids + 5,
    # ids)); not followed, token-type ids were drawn past their table of 2 and the job
    # compared what take read outside it (different on every run)
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    table = numpy_helper.from_array(np.ones((5, 3), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"])], "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 4])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["batch", 4, 3])],
        initializer=[table])
    func = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]))["main"]
    ops = [C.op_name(b.value) for b in func.body.blocks[0].bindings]
    assert "relax.where" in ops  # the wrap is there to see through
    assert index_ranges(func) == {"ids": (0, 5)}
    assert out_of_bounds(func, [np.array([[0, 1, 4, 2]])]) == []
    assert out_of_bounds(func, [np.array([[0, 1, 7, 2]])])
