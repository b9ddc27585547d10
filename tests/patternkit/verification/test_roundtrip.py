"""check_roundtrip: what it normalises, what it reports, and the numeric option."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax import dpl
from tvm.relax.transform import FuseOpsByPattern
from tvm.script import ir as I, relax as R, tirx as T

from patternkit.ir import var_name
from patternkit.ir.rebuild import rebuild_function
from patternkit.testing import assert_roundtrip
from patternkit.verification.roundtrip import (
    RoundTripError,
    canonical_binding_order,
    check_roundtrip,
    default_fusion,
    first_difference,
    normalize_for_comparison,
)

# LegalizeOps + AnnotateTIROpPattern: what check_roundtrip runs before FuseOps
PREPARE, _ = default_fusion()


@I.ir_module
class Reordered:
    """FuseOps emits the exp+add group where its last binding was, after the sum."""

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.sum(y, axis=[1])
            c = R.add(a, x)
            R.output(b, c)
        return (b, c)


@I.ir_module
class WithAlias:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            lv = R.nn.relu(x)
            gv = lv
            R.output(gv)
        return gv


@I.ir_module
class WithoutAlias:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            gv = R.nn.relu(x)
            R.output(gv)
        return gv


def test_default_round_trip_tolerates_reordered_independent_bindings():
    result = check_roundtrip(Reordered)
    # the order really did change, so a plain structural comparison would fail
    assert not tvm_ffi.structural_equal(result.restored, result.reference)
    assert result.ok and result.difference is None
    assert any("Primitive" in (f.attrs or {}) for _, f in result.fused.functions.items())


def test_normalisation_removes_trivial_aliases_on_both_sides():
    assert first_difference(WithAlias, WithoutAlias) is not None
    assert first_difference(normalize_for_comparison(WithAlias),
                            normalize_for_comparison(WithoutAlias)) is None


def test_canonical_order_is_the_same_for_any_topological_order():
    @I.ir_module
    class Other:
        @R.function
        def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 8), "float32")):
            with R.dataflow():
                b = R.sum(y, axis=[1])
                a = R.exp(x)
                c = R.add(a, x)
                R.output(b, c)
            return (b, c)

    assert not tvm_ffi.structural_equal(Other, Reordered)
    tvm.ir.assert_structural_equal(canonical_binding_order(Other),
                                   canonical_binding_order(Reordered))


def _sigmoid_for_relu(mod):
    """A deliberately wrong "fusion": FuseOps, then relu's PrimFunc call swapped for exp."""
    fused = relax.transform.FuseOps()(mod)
    functions = dict(fused.functions.items())
    names = {gv.name_hint: gv for gv in functions}
    for gv, func in list(functions.items()):
        if not isinstance(func, relax.Function) or "Primitive" not in (func.attrs or {}):
            continue
        text_before = func.script()
        if "relu" not in text_before:
            continue
        block = func.body.blocks[0]
        new_bindings = []
        for binding in block.bindings:
            value = binding.value
            if "relu" in str(value):
                call_tir_args = list(value.args)
                call_tir_args[0] = names["tir_exp"]
                value = relax.Call(value.op, call_tir_args, value.attrs, value.ty_args,
                                   ret_ty=value.ty)
            new_bindings.append(relax.VarBinding(binding.var, value))
        body = relax.SeqExpr([relax.DataflowBlock(new_bindings)], func.body.body)
        functions[gv] = relax.BlockBuilder().normalize(
            relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs))
    return tvm.IRModule(functions)


@I.ir_module
class ExpRelu:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.add(a, x)
            c = R.nn.relu(b)
            d = R.exp(c)
            R.output(d)
        return d


def test_a_broken_fusion_is_reported_with_the_differing_binding_on_both_sides():
    prepared = PREPARE(ExpRelu)
    with pytest.raises(RoundTripError) as info:
        check_roundtrip(prepared, fuse=_sigmoid_for_relu)
    message = str(info.value)
    assert "function 'main': binding #2" in message
    assert "expected: c: " in message and "relu" in message.split("restored:")[0]
    assert "tir_exp" in message.split("restored:")[1]
    assert info.value.result is not None and not info.value.result.ok
    # the same failure as a value instead of an exception
    result = check_roundtrip(prepared, fuse=_sigmoid_for_relu, raise_on_failure=False)
    assert result.difference is not None and not result.ok


@I.ir_module
class CountCastFromATensor:
    """``m`` is defined by a ``match_cast`` and read by the arange after it: TVM 0.27's
    ``FuseOps`` emits the arange's group above the cast (docs/tvm-bugs.md)."""

    @R.function
    def main(x: R.Tensor(("n",), "int64"), y: R.Tensor((1,), "int64")):
        m = T.int64()
        with R.dataflow():
            doubled = R.add(x, x)
            count = R.match_cast(R.tensor_to_shape(y), R.Shape([m]))
            total = R.sum(R.add(R.arange(0, m, 1, dtype="int64"), R.const(1, "int64")))
            out = R.add(doubled, total)
            R.output(out)
        return out


def test_an_ill_formed_fusion_is_reported_as_the_fusions_fault():
    result = check_roundtrip(CountCastFromATensor, raise_on_failure=False)
    assert not result.ok
    assert "Var m is not defined" in result.fusion_ill_formed
    # the restored module inherits the misplaced group; the report names the fusion
    assert result.difference == result.fusion_ill_formed
    assert result.difference.startswith("the fusion's output (not DefuseOps') is not well formed")
    # a fusion whose output is well formed is not blamed
    assert check_roundtrip(Reordered).fusion_ill_formed is None


def test_a_function_left_behind_is_reported():
    def fuse_and_forget(mod):
        fused = relax.transform.FuseOps()(mod)
        extra = relax.Function([], relax.SeqExpr([], relax.const(1.0, "float32")),
                               ret_ty=relax.TensorType((), "float32"))
        functions = dict(fused.functions.items())
        functions[tvm.ir.GlobalVar("leftover")] = extra
        return tvm.IRModule(functions)

    prepared = PREPARE(ExpRelu)
    with pytest.raises(RoundTripError, match=r"left over \['leftover'\]"):
        check_roundtrip(prepared, fuse_and_forget)


def test_any_pass_or_callable_can_be_the_fusion_and_numerics_are_checked():
    patterns = [("t.add_relu", dpl.is_op("relax.nn.relu")(dpl.is_op("relax.add")(
        dpl.wildcard(), dpl.wildcard())))]
    result = assert_roundtrip(ExpRelu, FuseOpsByPattern(patterns), numeric=True)
    assert result.numeric is not None and result.numeric.ok
    assert result.numeric.max_abs_error == 0.0  # same kernels, same order of arithmetic
    assert any("Composite" in (f.attrs or {}) for _, f in result.fused.functions.items())
    result = assert_roundtrip(ExpRelu, numeric=True, rtol=1e-6, atol=1e-6)
    assert result.numeric.ok
    with pytest.raises(TypeError, match="expected an IRModule"):
        check_roundtrip(ExpRelu, fuse=lambda m: m["main"])


def test_a_numeric_mismatch_raises_with_the_error_figures(monkeypatch):
    """Equal structure implies equal numbers, so the VM check can only disagree through a
    miscompiling build; simulate that to check the failure is raised, not swallowed."""
    import patternkit.verification.numeric as numeric

    def lying_compare(before, after, **options):
        return numeric.Comparison(max_abs_error=0.5, max_rel_error=0.25, outputs=1, ok=False)

    monkeypatch.setattr(numeric, "compare", lying_compare)
    with pytest.raises(RoundTripError, match="different values: MISMATCH.*max abs error 0.5"):
        check_roundtrip(ExpRelu, numeric=True)
    assert not check_roundtrip(ExpRelu, numeric=True, raise_on_failure=False).ok


@I.ir_module
class OnnxBatchNorm:
    """Conv + BatchNormalization as the ONNX importer writes it: the batch_norm's running
    mean is projected out and never read (``lv3 = lv1[1]``), a dead binding."""

    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
             g: R.Tensor((4,), "float32"), b: R.Tensor((4,), "float32"),
             m: R.Tensor((4,), "float32"), v: R.Tensor((4,), "float32")):
        with R.dataflow():
            lv = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            lv1 = R.nn.batch_norm(lv, g, b, m, v, axis=1, training=False)
            lv2 = lv1[0]
            lv3 = lv1[1]
            lv4 = R.nn.relu(lv2)
            R.output(lv4)
        return lv4


_RELU = [("cc.relu", dpl.is_op("relax.nn.relu")(dpl.wildcard()))]
_BATCH_NORM = tvm.ir.Op.get("relax.nn.batch_norm")


def _merge_composites(mod):
    """The BYOC fusion: MergeCompositeFunctions keeps only the outputs somebody reads."""
    return relax.transform.MergeCompositeFunctions()(FuseOpsByPattern(_RELU)(mod))


def _edit_main(mod, edit):
    """``mod`` with each binding of ``main``'s dataflow block whose ``edit(binding)`` is
    not ``None`` bound to that value instead."""
    main = mod["main"]
    blocks = []
    for block in main.body.blocks:
        bindings = []
        for binding in block.bindings:
            value = edit(binding)
            bindings.append(relax.VarBinding(binding.var,
                                             binding.value if value is None else value))
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    functions = dict(mod.functions.items())
    functions[mod.get_global_var("main")] = relax.Function(
        main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty, main.is_pure,
        main.attrs)
    return tvm.IRModule(functions)


def test_a_dead_binding_the_fusion_dropped_passes_and_is_listed_as_not_compared():
    assert "lv3" not in _merge_composites(OnnxBatchNorm)["main"].script()  # really dropped
    result = assert_roundtrip(OnnxBatchNorm, _merge_composites, numeric=True)
    assert [(d.function, d.name, d.text) for d in result.dropped_dead] == [
        ("main", "lv3", "lv3 = lv1[1]")]
    assert result.numeric.max_abs_error == 0.0
    # a fusion that keeps the dead binding is compared exactly, with nothing left out
    assert check_roundtrip(OnnxBatchNorm).dropped_dead == ()


def test_a_live_binding_changed_next_to_a_dropped_dead_one_still_fails():
    def swap_scale_and_shift(binding):
        value = binding.value
        if isinstance(value, relax.Call) and value.op.same_as(_BATCH_NORM):
            x, g, b, m, v = value.args
            return relax.Call(value.op, [x, b, g, m, v], value.attrs)
        return None

    def broken(mod):
        return _edit_main(_merge_composites(mod), swap_scale_and_shift)

    result = check_roundtrip(OnnxBatchNorm, broken, raise_on_failure=False)
    assert not result.ok and result.dropped_dead == ()
    assert "batch_norm" in result.difference
    assert "without the dead bindings of either side" in result.difference


def test_a_dead_binding_whose_value_changed_fails():
    def project_the_variance(binding):
        value = binding.value
        if isinstance(value, relax.TupleGetItem) and int(value.index) == 1:
            return relax.TupleGetItem(value.tuple_value, 2)
        return None

    def broken(mod):
        fused = relax.transform.FuseOps()(mod)  # keeps the dead projection
        return _edit_main(fused, project_the_variance)

    result = check_roundtrip(OnnxBatchNorm, broken, raise_on_failure=False)
    assert not result.ok and result.dropped_dead == ()
    assert "matches no dead binding of the reference" in result.difference
    assert "[2]" in result.difference


@I.ir_module
class TwinDeadChains:
    """Two dead chains that start with the same binding and then part (transformers'
    Gemma3 mask code computes ``arange(seq) + 0`` twice, once per mask axis): a matcher
    that pairs the restored ``a2`` with the reference's first twin ``a1`` fails two
    bindings later, where ``c1`` and ``c2`` differ."""

    @R.function
    def main(x: R.Tensor((8,), "float32")):
        with R.dataflow():
            a1 = R.exp(x)
            a2 = R.exp(x)
            b1 = R.expand_dims(a1, axis=[0])
            b2 = R.expand_dims(a2, axis=[0])
            c1 = R.expand_dims(b1, axis=[2])
            c2 = R.expand_dims(b2, axis=[1])
            y = R.nn.relu(x)
            R.output(y)
        return y


def _dropping(names, edit=None):
    """A "fusion" that removes the bindings of ``main`` named ``names`` (what ``FuseOps``
    does to the dead bindings a group swallows), then applies ``edit`` as
    :func:`_edit_main` does."""

    def fusion(mod):
        main = mod["main"]
        blocks = [relax.DataflowBlock([b for b in block.bindings if var_name(b.var) not in names])
                  for block in main.body.blocks]
        functions = dict(mod.functions.items())
        functions[mod.get_global_var("main")] = rebuild_function(
            main, relax.SeqExpr(blocks, main.body.body))
        kept = tvm.IRModule(functions)
        return kept if edit is None else _edit_main(kept, edit)

    return fusion


def test_a_dead_chain_kept_beside_its_dropped_twin_passes():
    result = check_roundtrip(TwinDeadChains, _dropping({"a1", "b1", "c1"}),
                             raise_on_failure=False)
    assert result.ok, result.difference
    assert sorted(d.name for d in result.dropped_dead) == ["a1", "b1", "c1"]
    # the other twin kept: the same, mirrored
    result = check_roundtrip(TwinDeadChains, _dropping({"a2", "b2", "c2"}),
                             raise_on_failure=False)
    assert result.ok, result.difference
    assert sorted(d.name for d in result.dropped_dead) == ["a2", "b2", "c2"]


def test_a_kept_dead_chain_whose_end_changed_beside_its_dropped_twin_fails():
    def another_axis(binding):
        if var_name(binding.var) == "c2":
            return R.expand_dims(binding.value.args[0], axis=[0])
        return None

    result = check_roundtrip(TwinDeadChains, _dropping({"a1", "b1", "c1"}, another_axis),
                             raise_on_failure=False)
    assert not result.ok and result.dropped_dead == ()
    assert "matches no dead binding of the reference" in result.difference
    assert "expand_dims" in result.difference
