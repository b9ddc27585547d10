"""A TVM table entry's check sees what ``FuseOpsByPattern`` hands it, entry after entry.

``FuseOpsByPattern`` rewrites the module after each entry, so the check of a later entry
receives an operand that an earlier entry fused as a call to that entry's composite (or
a projection of its results), not as the operator it replaced.  Each test runs the same
recording (or deciding) check under TVM's pass and under ``pk.MergeComposite`` and
compares what it saw.  Variables are compared by what they are bound to, not by name:
TVM binds a composite's call to a fresh ``lv``, patternkit keeps the variable's name.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax import dpl
from tvm.relax.transform import FuseOpsByPattern, FusionPattern

import patternkit as pk
from patternkit.byoc.tables import tvm_tables
from patternkit.models import resnet18


def _describe(expr, params) -> str:
    """``expr`` as text, naming the function's parameters and no other variable."""
    if isinstance(expr, relax.Var):
        return expr.name if any(expr.same_as(p) for p in params) else "%"
    if isinstance(expr, relax.Call):
        op = expr.op
        name = op.name if isinstance(op, tvm.ir.Op) else op.name_hint
        return f"{name}({', '.join(_describe(a, params) for a in expr.args)})"
    if isinstance(expr, relax.TupleGetItem):
        return f"{_describe(expr.tuple_value, params)}[{expr.index}]"
    return type(expr).__name__


def _operand_op(expr) -> str:
    """What an operand is: an operator's name, or the function a call calls."""
    if isinstance(expr, relax.TupleGetItem):
        return f"{_operand_op(expr.tuple_value)}[{expr.index}]"
    if isinstance(expr, relax.Call):
        return expr.op.name if isinstance(expr.op, tvm.ir.Op) else expr.op.name_hint
    return type(expr).__name__


def _recorder(params, seen):
    """A check that records what a ``PatternCheckContext`` holds, then accepts."""
    def check(context):
        values = context.value_to_bound_var
        usages = context.var_usages
        operands = {}
        for name, expr in context.annotated_expr.items():
            var = expr if isinstance(expr, relax.Var) else values.get(expr)
            operands[name] = (_operand_op(expr), _describe(expr, params),
                              None if var is None else len(usages.get(var, ())))
        seen.append({
            "root": _describe(context.matched_expr, params),
            "operands": operands,
            "bindings": sorted(_describe(v, params) for v in context.matched_bindings.values()),
            "values": sorted(_describe(v, params) for v in values),
            "usages": sorted(len(users) for users in usages.values()),
        })
        return True
    return check


def _chain():
    """``relu(x @ w)`` (entry 1), ``add(s @ w, x)`` whose matmul is read again (entry 2,
    two results), then binary ops over their results (entry 3)."""
    x, w, y = (relax.Var(name, relax.TensorType((4, 4), "float32")) for name in "xwy")
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, y]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(x, w))))
            s = bb.emit(relax.op.add(r, y))
            m2 = bb.emit(relax.op.matmul(s, w))
            t = bb.emit(relax.op.multiply(bb.emit(relax.op.add(m2, x)), m2))
            out = bb.emit_output(relax.op.subtract(t, r))
        bb.emit_func_output(out)
    return bb.get()


def _chain_table(check):
    mm = dpl.is_op("relax.matmul")(dpl.wildcard(), dpl.wildcard())
    lhs, rhs = dpl.wildcard(), dpl.wildcard()
    binary = (dpl.is_op("relax.add")(lhs, rhs) | dpl.is_op("relax.multiply")(lhs, rhs)
              | dpl.is_op("relax.subtract")(lhs, rhs))
    return [FusionPattern("t.matmul_relu", dpl.is_op("relax.nn.relu")(mm)),
            FusionPattern("t.matmul_add", dpl.is_op("relax.add")(mm, dpl.wildcard())),
            FusionPattern("t.binary", binary, {"lhs": lhs, "rhs": rhs}, check)]


def _same_module(ours, theirs) -> bool:
    canonical = relax.transform.CanonicalizeBindings()
    return tvm_ffi.structural_equal(canonical(ours), canonical(theirs), map_free_vars=True)


def test_a_later_entrys_check_sees_the_earlier_composites_as_fuse_ops_by_pattern_shows_them():
    mod = _chain()
    params = list(mod["main"].params)
    theirs, ours = [], []
    FuseOpsByPattern(_chain_table(_recorder(params, theirs)))(mod)
    pk.MergeComposite(pk.PatternTable.from_tvm(_chain_table(_recorder(params, ours))))(mod)
    assert ours == theirs
    # what the comparison covers: a call to the first composite, projections of the
    # variable bound to the second's call (two results), each bound to a variable the
    # use-def chain knows
    operands = {op for seen in theirs for op, _, _ in seen["operands"].values()}
    assert operands == {"fused_relax_matmul_relax_nn_relu", "Var", "DataflowVar[0]",
                        "DataflowVar[1]", "relax.multiply"}
    assert "fused_relax_matmul_relax_add(%, w, x)" in theirs[1]["values"]
    assert all(users for seen in theirs for _, _, users in seen["operands"].values()
               if users is not None)


def _conv_relu_add():
    """``relu(conv(x))`` read by an ``add``: entry 1 fuses the relu, entry 2 sees the add."""
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4, 3, 3), "float32"))
    y = relax.Var("y", relax.TensorType((1, 4, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, y]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w, padding=1))))
            out = bb.emit_output(relax.op.add(r, y))
        bb.emit_func_output(out)
    return bb.get()


def test_a_check_that_decides_on_its_operands_op_decides_as_under_fuse_ops_by_pattern():
    def not_after_a_relu(context):  # the residual add of a fused conv block only
        lhs = context.annotated_expr["lhs"]
        return not (isinstance(lhs, relax.Call) and isinstance(lhs.op, tvm.ir.Op)
                    and lhs.op.name == "relax.nn.relu")

    lhs = dpl.wildcard()
    conv = dpl.is_op("relax.nn.conv2d")(dpl.wildcard(), dpl.wildcard())
    table = [FusionPattern("t.conv_relu", dpl.is_op("relax.nn.relu")(conv)),
             FusionPattern("t.residual", dpl.is_op("relax.add")(lhs, dpl.wildcard()),
                           {"lhs": lhs}, not_after_a_relu)]
    mod = _conv_relu_add()
    theirs = FuseOpsByPattern(table)(mod)
    ours = pk.MergeComposite(pk.PatternTable.from_tvm(table))(mod)
    assert pk.byoc.composite_counts(ours) == {"t.conv_relu": 1, "t.residual": 1}
    assert _same_module(ours, theirs)
    pk.assert_same_numerics(mod, ours, rtol=0, atol=0)


def _recording_table(prefix: str, seen: list) -> list:
    """TVM's registered table ``prefix``, each check wrapped to record what it was handed
    (the op of every annotated expression) and what it decided."""
    def kind(expr) -> str:
        if isinstance(expr, relax.Call):
            return expr.op.name if isinstance(expr.op, tvm.ir.Op) else expr.op.name_hint
        return type(expr).__name__

    table = []
    for entry in tvm_tables.registered_patterns(prefix + "."):
        def check(context, entry=entry):
            accepted = bool(entry.check(context)) if entry.check is not None else True
            seen.append((entry.name, {k: kind(v) for k, v in context.annotated_expr.items()},
                         accepted))
            return accepted
        table.append(FusionPattern(entry.name, entry.pattern, entry.annotation_patterns, check,
                                   entry.attrs_getter))
    return table


def test_example_npus_batch_norm_check_sees_the_conv_composite_before_it():
    mod = resnet18(batchnorm="op")
    theirs, ours = [], []
    FuseOpsByPattern(_recording_table("example_npu", theirs))(mod)
    pk.MergeComposite(pk.PatternTable.from_tvm(_recording_table("example_npu", ours)))(mod)
    assert ours == theirs
    inputs = {seen["input"] for name, seen, _ in theirs if name == "example_npu.batch_norm"}
    assert "fused_relax_nn_conv2d" in inputs


def _two_functions():
    """The same ``relu(matmul)`` chains in two functions of other shapes: TVM names the
    second function's composite ``..._relu1``, and its check sees that name."""
    bb = relax.BlockBuilder()
    for name, shape in (("main", (2, 4)), ("other", (3, 5))):
        x = relax.Var("x", relax.TensorType(shape, "float32"))
        w = relax.Var("w", relax.TensorType((shape[1], shape[1]), "float32"))
        with bb.function(name, [x, w]):
            with bb.dataflow():
                r = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(x, w))))
                r2 = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(r, w))))
                out = bb.emit_output(relax.op.add(r2, r))
            bb.emit_func_output(out)
    return bb.get()


def test_the_composite_calls_a_check_sees_name_the_functions_tvm_names_across_functions():
    def table(seen):
        def check(context):
            seen.append(_operand_op(context.annotated_expr["lhs"]))
            return True
        lhs = dpl.wildcard()
        matmul = dpl.is_op("relax.matmul")(dpl.wildcard(), dpl.wildcard())
        return [FusionPattern("t.matmul_relu", dpl.is_op("relax.nn.relu")(matmul)),
                FusionPattern("t.add", dpl.is_op("relax.add")(lhs, dpl.wildcard()),
                              {"lhs": lhs}, check)]

    mod = _two_functions()
    theirs, ours = [], []
    expected = FuseOpsByPattern(table(theirs))(mod)
    fused = pk.MergeComposite(pk.PatternTable.from_tvm(table(ours)))(mod)
    assert ours == theirs == ["fused_relax_matmul_relax_nn_relu",
                              "fused_relax_matmul_relax_nn_relu1"]
    assert _same_module(fused, expected)
