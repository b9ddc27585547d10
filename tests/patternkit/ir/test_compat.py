"""The private and version-sensitive TVM accessors behave as the rest of patternkit needs."""

from __future__ import annotations

from pathlib import Path

import pytest
import tvm
from tvm import relax

from patternkit.byoc.tables.table import PatternTableError
from patternkit.dpl.from_tvm import FromDplError
from patternkit.errors import CallbackError, PatternkitError
from patternkit.ir import compat as C


def tensor(name, shape):
    return relax.Var(name, relax.TensorType(shape, "float32"))


def test_two_python_wrappers_of_one_node_have_the_same_handle():
    call = relax.op.add(tensor("x", (2,)), tensor("y", (2,)))
    first, second = call.args[0], call.args[0]
    assert first is not second and C.handle(first) == C.handle(second)
    assert C.handle(call.args[0]) != C.handle(call.args[1])


def test_handle_or_none_is_none_for_objects_outside_tvm():
    assert C.handle_or_none("x") is None and C.handle_or_none(None) is None
    op = tvm.ir.Op.get("relax.add")
    assert C.handle_or_none(op) == C.handle(op)


def test_type_of_an_ill_typed_bare_expression_is_none():
    # shapes (2,) and (3,) do not broadcast: normalising raises inside TVM
    bad = relax.op.add(tensor("x", (2,)), tensor("y", (3,)))
    assert C.type_of(bad) is None
    good = relax.op.add(tensor("x", (2,)), tensor("y", (2,)))
    assert C.static_shape(C.type_of(good)) == (2,)


def test_op_info_gives_the_name_and_purity_of_an_operator():
    assert C.op_info(tvm.ir.Op.get("relax.add")) == ("relax.add", True)
    assert C.op_info(tvm.ir.Op.get("relax.print"))[1] is False


def test_attr_field_names_lists_an_attribute_class_s_fields():
    x, w = tensor("x", (1, 3, 8, 8)), tensor("w", (4, 3, 3, 3))
    names = C.attr_field_names(relax.op.nn.conv2d(x, w).attrs)
    assert {"strides", "padding", "dilation", "groups", "data_layout"} <= set(names)


def test_the_raw_constructors_build_typed_nodes():
    x = tensor("x", (2,))
    ty = relax.TensorType((2,), "float32")
    call = C.new_call(ty, tvm.ir.Op.get("relax.nn.relu"), [x], None, [], None)
    assert isinstance(call, relax.Call) and call.ty.same_as(ty)
    var = C.new_dataflow_var("lv", ty, None)
    assert type(var) is relax.DataflowVar and var.name == "lv"
    assert type(C.new_tuple([x, var], None)) is relax.Tuple


def test_const_to_numpy_returns_a_copy_in_the_constant_s_dtype():
    import numpy as np
    from tvm import relax

    from patternkit.ir import compat

    for dtype in ("float32", "float16", "bfloat16"):  # bfloat16: not readable by DLPack
        const = relax.const(np.arange(4, dtype="float32"), dtype)
        array = compat.const_to_numpy(const)
        assert str(array.dtype) == dtype and array.astype("float32").tolist() == [0, 1, 2, 3]
        array[0] = 7  # the constant stays as it was
        assert compat.const_to_numpy(const).astype("float32").tolist() == [0, 1, 2, 3]


def test_int_list_reads_an_axis_attribute_as_python_ints():
    x = relax.Var("x", relax.TensorType((2, 3, 4), "float32"))
    assert C.int_list(relax.op.mean(x, axis=[-1, 0]).attrs.axis) == [-1, 0]
    assert C.int_list(relax.op.mean(x, axis=None).attrs.axis) is None


def test_dtype_of_names_every_dtype_the_same_way_the_printer_does():
    for dtype in ("float32", "float16", "bfloat16", "int8", "bool", "float8_e4m3fn"):
        ty = relax.TensorType((2,), dtype)
        assert C.dtype_of(ty) == str(ty.dtype) == dtype
        assert C.dtype_of(relax.TensorType((5, 5), dtype)) == dtype  # read from the cache
    assert C.dtype_of(relax.TensorType((2,), "void")) is None
    assert C.dtype_of(relax.ShapeType(ndim=2)) is None


# -- errors raised inside a pass --------------------------------------------------------------
class UsersOwnError(PatternkitError):
    """A subclass patternkit has never seen (a user's check raising its own error)."""


def _failing_pass(err):
    def transform(_mod, _ctx):
        raise err
    return C.module_pass(transform, "test.fails")


@pytest.mark.parametrize("err", [
    PatternTableError("a table error"),
    FromDplError("a kind patternkit cannot express", "FunctionPattern"),
    CallbackError("a callback raised", "rule", "main:lv = add(x, y)"),
    UsersOwnError("a user's error"),
], ids=lambda err: type(err).__name__)
def test_a_patternkit_error_raised_in_a_pass_reaches_the_caller_as_itself(err):
    pipeline = tvm.transform.Sequential([tvm.transform.Sequential([_failing_pass(err)])])
    with pytest.raises(type(err)) as raised:
        pipeline(tvm.IRModule({}))
    assert raised.value is err  # the same object: its attributes are all there


def test_a_patternkit_error_raised_twice_in_a_pass_is_the_second_one_the_second_time():
    first, second = PatternTableError("first"), PatternTableError("second")
    for err in (first, second):
        with pytest.raises(PatternTableError) as raised:
            _failing_pass(err)(tvm.IRModule({}))
        assert raised.value is err


def test_other_exceptions_cross_a_pass_as_tvm_converts_them():
    with pytest.raises(ValueError, match="not patternkit's"):
        _failing_pass(ValueError("not patternkit's"))(tvm.IRModule({}))


def test_every_pass_patternkit_builds_goes_through_module_pass():
    root = Path(C.__file__).resolve().parents[1]
    builders = ("tvm.transform.module_pass", "relax.transform.function_pass",
                "relax.transform.dataflowblock_pass", "transform.module_pass(")
    offenders = [f"{path.relative_to(root.parent)}: {word}"
                 for path in root.rglob("*.py") if path.name != "compat.py"
                 for word in builders if word in path.read_text()]
    assert not offenders, "passes built outside ir.compat.module_pass:\n" + "\n".join(offenders)


def test_static_shape_of_an_expression_reads_its_type():
    # a guard written ``static_shape(match.x) == (2, 3)`` must not pass vacuously
    x = tensor("x", (2, 3))
    assert C.static_shape(x) == (2, 3)
    assert C.static_shape(relax.op.add(x, x)) == (2, 3)
    n = tvm.tirx.Var("n", "int64")
    dims = C.static_shape(relax.Var("y", relax.TensorType((n, 4), "float32")))
    assert dims is not None and dims[0].same_as(n) and dims[1] == 4


def test_static_shape_of_a_non_tensor_is_none():
    assert C.static_shape(None) is None
    assert C.static_shape(relax.TupleType([])) is None
    assert C.static_shape(relax.Var("t", relax.TupleType([tensor("a", (1,)).ty]))) is None
    assert C.static_shape(relax.TensorType(ndim=2, dtype="float32")) is None


@pytest.mark.parametrize("bad", [(2, 3), "x", 3])
def test_static_shape_of_something_else_raises_a_one_line_type_error(bad):
    with pytest.raises(TypeError, match=r"static_shape takes a Relax expression or type") as info:
        C.static_shape(bad)
    assert "\n" not in str(info.value)
