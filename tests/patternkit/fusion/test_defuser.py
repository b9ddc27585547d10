"""DefuseOps: each kind of fused function is inlined back into exactly the original IR."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, te, topi
from tvm.relax import dpl
from tvm.relax.transform import FuseOpsByPattern, MergeCompositeFunctions
from tvm.script import ir as I, relax as R, tirx as T

import patternkit as pk
from patternkit.byoc import PartitionGraph, merge_composite
from patternkit.errors import MalformedIRError
from patternkit.fusion import DEFUSE_KINDS, DefuseOps, defuse, function_kinds
from patternkit.testing import batchnorm_chain, batchnorm_pattern
from patternkit.verification.numeric import assert_same_numerics
from patternkit.verification.roundtrip import check_roundtrip, default_fusion

# LegalizeOps + AnnotateTIROpPattern: FuseOps only groups annotated call_tir calls
PREPARE, FUSE_OPS = default_fusion()


def _global_names(mod):
    return sorted(gv.name_hint for gv in mod.functions)


def _kinds_in(mod):
    return sorted({k for _, f in mod.functions.items() for k in function_kinds(f)})


def _fuse_ops(mod):
    reference = PREPARE(mod)
    fused = FUSE_OPS(reference)
    assert _kinds_in(fused) == ["primitive"], "FuseOps should have created groups"
    return reference, fused


@I.ir_module
class ConvChain:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
             b: R.Tensor((1, 4, 1, 1), "float32")):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            a = R.add(c, b)
            r = R.nn.relu(a)
            s = R.add(r, R.const(np.full((1, 4, 1, 1), 0.5, "float32")))
            m = R.max(s, axis=[1], keepdims=True)
            R.output(m)
        return m


@I.ir_module
class SplitEscape:
    """A tuple-returning group (split), partially used tuple fields and an intermediate
    that escapes its group (FuseOps then returns a Tuple from the group)."""

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            e = R.exp(x)
            s = R.split(e, 2, axis=1)
            a = R.nn.relu(s[0])
            m = R.matmul(x, w)
            t = R.add(m, R.const(np.ones((8,), "float32")))
            u = R.sigmoid(t)
            v = R.sum(t, axis=[1])
            R.output(a, u, v)
        return (a, u, v)


@I.ir_module
class Symbolic:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32"), y: R.Tensor(("n", 8), "float32")):
        n = T.int64()
        with R.dataflow():
            c = R.concat((x, y), axis=0)
            e = R.exp(c)
            s = R.split(e, 2, axis=1)
            a = R.add(s[0], s[1])
            r = R.reshape(a, R.shape([n * 8]))
            q = R.nn.relu(r)
            R.output(q)
        return q


def test_fuse_ops_output_defuses_to_the_legalized_input_exactly():
    reference, fused = _fuse_ops(ConvChain)
    restored = DefuseOps()(fused)
    tvm.ir.assert_structural_equal(restored, reference)
    assert _kinds_in(restored) == []
    assert_same_numerics(fused, restored, rtol=1e-6, atol=1e-6)


def test_tuple_returning_groups_and_escaping_intermediates_leave_no_tuple_behind():
    reference, fused = _fuse_ops(SplitEscape)
    fused_text = fused["main"].script()
    assert "[0]" in fused_text  # a group result is projected by the caller
    restored = defuse(fused)
    tvm.ir.assert_structural_equal(restored, reference)
    assert_same_numerics(reference, restored, rtol=1e-6, atol=1e-6)


def test_symbolic_shapes_are_rebound_to_the_callers_dims():
    reference, fused = _fuse_ops(Symbolic)
    # the reason DefuseOps exists: TVM's inliner leaves the callee's renewed ``n`` undefined
    # (apache-tvm 0.27.0.post1 is pinned exactly, so this documents, not guesses)
    inlined = relax.transform.InlinePrivateFunctions()(fused)
    assert not relax.analysis.check_well_formed(inlined)
    restored = defuse(fused)
    assert relax.analysis.check_well_formed(restored)
    tvm.ir.assert_structural_equal(restored, reference)
    assert_same_numerics(reference, restored, shape_vars={"n": 3}, rtol=1e-6, atol=1e-6)


def _scalar_symbolic_module():
    """A PrimFunc taking a scalar ``m``: FuseOps lifts it into a ``T.int64`` parameter."""
    m = tvm.tirx.Var("m", "int64")
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    y = relax.Var("y", relax.TensorType((4, 8), "float32"))
    shape = relax.Var("len", relax.ShapeType([m]))

    def scale(a, b, m):
        return te.compute((4, 8), lambda i, j: a[i, j] * m.astype("float32") + b[i, j],
                          name="scale")

    bb = relax.BlockBuilder()
    with bb.function("main", [x, y, shape]):
        with bb.dataflow():
            a = bb.emit_te(scale, x, y, m)
            b = bb.emit_te(topi.exp, a)
            out = bb.emit_output(b)
        bb.emit_func_output(out)
    return relax.transform.AnnotateTIROpPattern()(bb.get())


def test_scalar_symbolic_parameters_are_bound_to_the_callers_expression():
    reference = _scalar_symbolic_module()
    fused = relax.transform.FuseOps()(reference)
    callee = [f for _, f in fused.functions.items() if "primitive" in function_kinds(f)]
    assert len(callee) == 1 and any(tvm.ir.is_prim_var(p) for p in callee[0].params)
    restored = defuse(fused)
    assert relax.analysis.check_well_formed(restored)
    tvm.ir.assert_structural_equal(restored, reference)


def test_composite_functions_with_embedded_and_lifted_constants():
    mod = batchnorm_chain(3, shape=(2, 4))
    for bind_constants in (True, False):
        fused = FuseOpsByPattern([("bn.unit", batchnorm_pattern())],
                                 bind_constants=bind_constants)(mod)
        assert _kinds_in(fused) == ["composite"]
        restored = DefuseOps()(fused)
        tvm.ir.assert_structural_equal(restored, mod)
    assert_same_numerics(mod, restored, positive=("var",), rtol=1e-6, atol=1e-6)


@I.ir_module
class Byoc:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            b = R.add(c, R.const(np.ones((1, 4, 1, 1), "float32")))
            r = R.nn.relu(b)
            s = R.nn.softmax(r, axis=1)
            c2 = R.nn.conv2d(s, R.const(np.ones((4, 4, 3, 3), "float32")), padding=[1, 1, 1, 1])
            b2 = R.add(c2, R.const(np.ones((1, 4, 1, 1), "float32")))
            r2 = R.nn.relu(b2)
            R.output(r2)
        return r2


BYOC_PATTERNS = [  # TVM's pattern language, for TVM's FuseOpsByPattern
    ("cg.conv2d_bias_relu",
     dpl.is_op("relax.nn.relu")(dpl.is_op("relax.add")(
         dpl.is_op("relax.nn.conv2d")(dpl.wildcard(), dpl.wildcard()), dpl.is_const()))),
    ("cg.softmax", dpl.is_op("relax.nn.softmax")(dpl.wildcard())),
]
PK_BYOC_TABLE = [  # the same two patterns in patternkit's, for MergeComposite
    ("cg.conv2d_bias_relu",
     pk.is_op("nn.relu")(pk.is_op("add")(pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard()),
                                         pk.is_constant()))),
    ("cg.softmax", pk.is_op("nn.softmax")(pk.wildcard())),
]


@pytest.mark.parametrize("bind_constants", [True, False])
def test_annotate_codegen_wrappers_and_their_local_composites_are_inlined(bind_constants):
    fused = FuseOpsByPattern(BYOC_PATTERNS, bind_constants=bind_constants,
                             annotate_codegen=True)(Byoc)
    assert _kinds_in(fused) == ["codegen"]
    restored = DefuseOps()(fused)
    tvm.ir.assert_structural_equal(restored, Byoc)
    assert _global_names(restored) == ["main"]


def test_merge_composite_functions_output_is_undone():
    merged = MergeCompositeFunctions()(FuseOpsByPattern(BYOC_PATTERNS)(Byoc))
    assert _kinds_in(merged) == ["codegen"]
    tvm.ir.assert_structural_equal(DefuseOps()(merged), Byoc)
    assert_same_numerics(Byoc, DefuseOps()(merged), rtol=1e-5, atol=1e-5)


@I.ir_module
class ByocDynamicBatch:
    """``Byoc`` on a dynamic batch ``n``: the composites' parameters carry ``n`` directly."""

    @R.function
    def main(x: R.Tensor(("n", 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            b = R.add(c, R.const(np.ones((1, 4, 1, 1), "float32")))
            r = R.nn.relu(b)
            s = R.nn.softmax(r, axis=1)
            c2 = R.nn.conv2d(s, R.const(np.ones((4, 4, 3, 3), "float32")), padding=[1, 1, 1, 1])
            b2 = R.add(c2, R.const(np.ones((1, 4, 1, 1), "float32")))
            r2 = R.nn.relu(b2)
            R.output(r2)
        return r2


@pytest.mark.parametrize("fusion", [
    lambda mod: FuseOpsByPattern(BYOC_PATTERNS, annotate_codegen=True)(mod),
    lambda mod: MergeCompositeFunctions()(FuseOpsByPattern(BYOC_PATTERNS)(mod)),
], ids=["annotate_codegen", "merge_composite_functions"])
def test_byoc_output_with_a_dynamic_batch_is_undone(fusion):
    fused = fusion(ByocDynamicBatch)
    assert _kinds_in(fused) == ["codegen"] and relax.analysis.check_well_formed(fused)
    restored = DefuseOps()(fused)
    assert relax.analysis.check_well_formed(restored)
    tvm.ir.assert_structural_equal(restored, ByocDynamicBatch)
    for batch in (1, 3):
        assert_same_numerics(ByocDynamicBatch, restored, rtol=0, atol=0,
                             shape_vars={"n": batch})


def test_kinds_select_what_is_undone():
    merged = MergeCompositeFunctions()(FuseOpsByPattern(BYOC_PATTERNS)(Byoc))
    # only the composites: the Codegen wrapper stays, holding plain ops
    only_composites = DefuseOps(kinds=("composite",))(merged)
    assert relax.analysis.check_well_formed(only_composites)
    wrapper = [f for _, f in only_composites.functions.items() if "codegen" in function_kinds(f)]
    assert len(wrapper) == 1
    assert "Composite" not in wrapper[0].script()
    # only the wrappers: main now binds the local composite functions itself
    only_codegen = DefuseOps(kinds="codegen")(merged)
    assert _global_names(only_codegen) == ["main"]
    assert relax.analysis.check_well_formed(only_codegen)
    assert '"Composite": "cg.softmax"' in only_codegen["main"].script()
    # FuseOpsByPattern composites are Primitive too, yet "primitive" leaves them alone
    composite = FuseOpsByPattern(BYOC_PATTERNS)(Byoc)
    assert tvm_ffi.structural_equal(DefuseOps(kinds="primitive")(composite), composite)
    with pytest.raises(ValueError, match="unknown kind"):
        DefuseOps(kinds=("fused",))


@I.ir_module
class Partitioned:
    """Output shape of patternkit's ``partition``: local functions in the dataflow block."""

    @R.function
    def main(x: R.Tensor((2, 4), "float32"), mean: R.Tensor((4,), "float32"),
             var: R.Tensor((4,), "float32"), gamma: R.Tensor((4,), "float32"),
             beta: R.Tensor((4,), "float32")) -> R.Tensor((2, 4), "float32"):
        with R.dataflow():
            @R.function
            def lv_f(a: R.Tensor((2, 4), "float32"), b: R.Tensor((4,), "float32"),
                     c: R.Tensor((4,), "float32"), d: R.Tensor((4,), "float32"),
                     e: R.Tensor((4,), "float32")) -> R.Tensor((2, 4), "float32"):
                R.func_attr({"PartitionedFromPattern": "subtract_multiply_add_sqrt_divide_add_",
                             "Composite": "bn"})
                with R.dataflow():
                    s = R.subtract(a, b)
                    m = R.multiply(d, s)
                    p = R.add(c, R.const(1e-5, "float32"))
                    q = R.sqrt(p)
                    t = R.divide(m, q)
                    o = R.add(t, e)
                    R.output(o)
                return o

            lv = lv_f(x, mean, var, gamma, beta)
            lv1 = lv_f(lv, mean, var, gamma, beta)
            R.output(lv1)
        return lv1


@I.ir_module
class PartitionedExpected:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), mean: R.Tensor((4,), "float32"),
             var: R.Tensor((4,), "float32"), gamma: R.Tensor((4,), "float32"),
             beta: R.Tensor((4,), "float32")) -> R.Tensor((2, 4), "float32"):
        with R.dataflow():
            s = R.subtract(x, mean)
            m = R.multiply(gamma, s)
            p = R.add(var, R.const(1e-5, "float32"))
            q = R.sqrt(p)
            t = R.divide(m, q)
            lv = R.add(t, beta)
            s1 = R.subtract(lv, mean)
            m1 = R.multiply(gamma, s1)
            p1 = R.add(var, R.const(1e-5, "float32"))
            q1 = R.sqrt(p1)
            t1 = R.divide(m1, q1)
            lv1 = R.add(t1, beta)
            R.output(lv1)
        return lv1


def test_partition_local_functions_are_inlined_and_their_bindings_dropped():
    restored = DefuseOps(kinds="partition")(Partitioned)
    tvm.ir.assert_structural_equal(restored, PartitionedExpected)
    assert_same_numerics(PartitionedExpected, restored, positive=("var",), rtol=1e-6, atol=1e-6)
    # the same local function also counts as a composite (user attrs are honoured)
    tvm.ir.assert_structural_equal(DefuseOps(kinds="composite")(Partitioned), PartitionedExpected)
    # not selected: untouched
    assert tvm_ffi.structural_equal(DefuseOps(kinds="primitive")(Partitioned), Partitioned)


@I.ir_module
class TwoCallers:
    """Calls from two public functions, one of them inside a nested (closure) function."""

    @R.function(private=True)
    def fused_add_relu(a: R.Tensor((4,), "float32"), b: R.Tensor((4,), "float32")
                       ) -> R.Tensor((4,), "float32"):
        R.func_attr({"Primitive": True})
        with R.dataflow():
            s = R.add(a, b)
            gv = R.nn.relu(s)
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        cls = TwoCallers
        with R.dataflow():
            lv = cls.fused_add_relu(x, y)
            R.output(lv)
        return lv

    @R.function
    def other(x: R.Tensor((4,), "float32")):
        cls = TwoCallers

        @R.function
        def inner(z: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            w = cls.fused_add_relu(z, z)
            return w

        r = inner(x)
        return r


@I.ir_module
class TwoCallersExpected:
    @R.function
    def main(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            s = R.add(x, y)
            lv = R.nn.relu(s)
            R.output(lv)
        return lv

    @R.function
    def other(x: R.Tensor((4,), "float32")):
        @R.function
        def inner(z: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            s = R.add(z, z)
            w = R.nn.relu(s)
            return w

        r = inner(x)
        return r


def test_calls_in_several_functions_and_nested_functions_are_inlined():
    restored = defuse(TwoCallers)
    tvm.ir.assert_structural_equal(restored, TwoCallersExpected)


def test_only_functions_whose_calls_were_inlined_are_deleted():
    # fused_add_relu has no caller here: DefuseOps did not create that situation, so it
    # leaves the function alone rather than guess whether someone else still needs it
    uncalled = tvm.IRModule({gv: f for gv, f in TwoCallers.functions.items()
                             if gv.name_hint == "fused_add_relu"})
    assert _global_names(defuse(uncalled)) == ["fused_add_relu"]
    assert _global_names(defuse(TwoCallers)) == ["main", "other"]


def test_nothing_to_defuse_returns_an_equal_new_module_and_never_mutates_the_input():
    reference = PREPARE(ConvChain)
    out = defuse(reference)
    assert out is not reference
    assert tvm_ffi.structural_equal(out, reference)
    _, fused = _fuse_ops(ConvChain)
    before_hash = tvm_ffi.structural_hash(fused)
    names = _global_names(fused)
    defuse(fused)
    assert _global_names(fused) == names
    assert tvm_ffi.structural_hash(fused) == before_hash


def test_defuse_ops_composes_in_a_sequential_pipeline():
    pipeline = tvm.transform.Sequential([PREPARE, relax.transform.FuseOps(), DefuseOps()])
    tvm.ir.assert_structural_equal(pipeline(ConvChain), PREPARE(ConvChain))
    assert DefuseOps().info.name == "DefuseOps"


def _bn_unit():
    """One batchnorm_chain unit in patternkit's pattern language, for partition()."""
    x, mean, var, gamma, beta, eps = (pk.wildcard() for _ in range(6))
    return pk.is_op("add")(pk.is_op("divide")(pk.is_op("multiply")(gamma, pk.is_op("subtract")(
        x, mean)), pk.is_op("sqrt")(pk.is_op("add")(var, eps))), beta)


# kind -> (the module before, the pass that creates functions of that kind)
MADE_BY = {
    "primitive": (lambda: PREPARE(ConvChain), FUSE_OPS),
    "composite": (lambda: Byoc, FuseOpsByPattern(BYOC_PATTERNS)),
    "codegen": (lambda: merge_composite(Byoc, PK_BYOC_TABLE), PartitionGraph("cg")),
    "partition": (lambda: batchnorm_chain(3, shape=(2, 4)),
                  lambda mod: pk.partition(_bn_unit(), mod)),
}


@pytest.mark.parametrize("kind", sorted(set(DEFUSE_KINDS) | set(MADE_BY)))
def test_each_kind_undoes_exactly_what_its_pass_made(kind):
    # a kind DefuseOps dropped fails below ("unknown kind"); a new kind fails here
    if kind not in MADE_BY:
        pytest.fail(f"DefuseOps kind {kind!r} has no test: add the pass that makes it to MADE_BY")
    make_before, make = MADE_BY[kind]
    before = make_before()
    made = make(before)
    made_kinds = set()
    for _, func in made.functions.items():  # global functions and the local ones they bind
        made_kinds |= function_kinds(func)
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body,
                                            lambda e: made_kinds.update(function_kinds(e)))
    assert kind in made_kinds, f"{kind}: the pass made no such function"
    tvm.ir.assert_structural_equal(DefuseOps(kinds=kind)(made), before)


# ---------------------------------------------------------------------- bad input
def _replace_main_call(mod, new_args=None, new_op=None):
    """A copy of ``mod`` whose first call in main gets other args or another callee."""
    main = mod["main"]
    block = main.body.blocks[0]
    first = block.bindings[0]
    call = first.value
    new_call = relax.Call(new_op if new_op is not None else call.op,
                          new_args if new_args is not None else call.args, call.attrs,
                          call.ty_args, ret_ty=call.ty)
    bindings = [relax.VarBinding(first.var, new_call)] + list(block.bindings[1:])
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], main.body.body)
    new_main = relax.Function(main.params, body, main.ret_ty, main.is_pure, main.attrs)
    functions = dict(mod.functions.items())
    functions[mod.get_global_var("main")] = new_main
    return tvm.IRModule(functions)


def test_wrong_number_of_arguments_names_function_and_call_site():
    bad = _replace_main_call(TwoCallers, new_args=[TwoCallers["main"].params[0]])
    before = tvm_ffi.structural_hash(bad)
    with pytest.raises(MalformedIRError, match=r"main: 'fused_add_relu' takes 2 argument\(s\) "
                                               r"but is called with 1.*lv = "):
        defuse(bad)
    assert tvm_ffi.structural_hash(bad) == before


def test_call_to_a_missing_global_names_function_and_call_site():
    ghost = tvm.ir.GlobalVar("fused_ghost")
    bad = _replace_main_call(TwoCallers, new_op=ghost)
    with pytest.raises(MalformedIRError, match=r"main: call to the global 'fused_ghost'.*lv = "):
        defuse(bad)


def test_a_primitive_function_that_is_not_well_formed_is_rejected():
    callee = TwoCallers["fused_add_relu"]
    stranger = relax.Var("stranger", relax.TensorType((4,), "float32"))
    block = callee.body.blocks[0]
    first = block.bindings[0]
    broken_value = relax.Call(first.value.op, [first.value.args[0], stranger], first.value.attrs,
                              ret_ty=first.value.ty)
    bindings = [relax.VarBinding(first.var, broken_value)] + list(block.bindings[1:])
    broken = relax.Function(callee.params, relax.SeqExpr([relax.DataflowBlock(bindings)],
                                                         callee.body.body),
                            callee.ret_ty, callee.is_pure, callee.attrs)
    functions = dict(TwoCallers.functions.items())
    functions[TwoCallers.get_global_var("fused_add_relu")] = broken
    bad = tvm.IRModule(functions)
    with pytest.raises(MalformedIRError, match=r"'fused_add_relu' \(called from main: lv = .*"
                                               r"not well formed"):
        defuse(bad)
    # the check can be switched off for speed on trusted input
    assert "stranger" in defuse(bad, check_well_formed=False)["main"].script()


def test_errors_keep_their_type_through_the_pass_boundary():
    bad = _replace_main_call(TwoCallers, new_args=[TwoCallers["main"].params[0]])
    with pytest.raises(MalformedIRError, match="takes 2 argument"):
        tvm.transform.Sequential([DefuseOps()])(bad)


def test_patternkits_own_partition_output_round_trips():
    unit = _bn_unit()
    mod = batchnorm_chain(3, shape=(2, 4))
    partitioned = pk.partition(unit, mod, attrs={"Composite": "bn"})
    assert partitioned["main"].script().count('"PartitionedFromPattern"') == 3
    tvm.ir.assert_structural_equal(DefuseOps(kinds="partition")(partitioned), mod)
    result = check_roundtrip(mod, lambda m: pk.partition(unit, m), numeric=True,
                             numeric_options={"positive": ("var",)}, rtol=1e-6, atol=1e-6)
    assert result.numeric.ok


def test_an_offloaded_function_whose_composite_takes_a_shape_parameter_defuses():
    """The composite of a torch-style ``nn.Linear`` (reshape back to ``(batch, seq, 16)``
    inside it) takes ``R.Shape([batch, seq])``; inside the offloaded function that shape
    binds the composite's own dims, and only the offloaded function's parameters are bound
    from the caller's arguments."""
    from patternkit.patterns.matmul import MatmulComposite

    rule = MatmulComposite("ccompiler", transposed=True, bias=True, activation="gelu")
    mod = rule.example()
    offloaded = PartitionGraph("ccompiler")(merge_composite(mod, [rule]))
    restored = defuse(offloaded)
    assert relax.analysis.check_well_formed(restored)
    assert _global_names(restored) == ["main"]

    def ops(m):
        return [b.value.op.name for block in m["main"].body.blocks for b in block.bindings
                if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]

    assert sorted(ops(restored)) == sorted(ops(mod))  # the same ops, none left outlined
    assert_same_numerics(mod, restored, shape_vars={"batch": 2, "seq": 3}, rtol=0, atol=0)
