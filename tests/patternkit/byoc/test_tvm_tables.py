"""TVM's registered pattern tables in patternkit: imported, run as FuseOpsByPattern runs them."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax import dpl
from tvm.relax.transform import FuseOpsByPattern, FusionPattern

import patternkit as pk
from patternkit.byoc.tables import tvm_tables
from patternkit.engine.wellformed import assert_well_formed
from patternkit.models import resnet18


@pytest.fixture(scope="module")
def resnet():
    return resnet18(batchnorm="op")


def _normalized(mod):
    return relax.transform.CanonicalizeBindings()(mod)


def _assert_same_module(ours, theirs):
    assert tvm_ffi.structural_equal(_normalized(ours), _normalized(theirs), map_free_vars=True)


def _snapshot(mod):
    """What a pass could change in place: the function map, and the printed IR."""
    return [(gv.name_hint, f) for gv, f in mod.functions.items()], mod.script()


def _assert_untouched(mod, snapshot):
    functions, text = snapshot
    assert [(gv.name_hint, f) for gv, f in mod.functions.items()] == functions
    assert mod.script() == text


def _matmul_module(*, relu_reads_matmul: bool):
    """``m = matmul(x, w)``, then ``add`` of ``m`` and either ``relu(m)`` or ``x``."""
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            m = bb.emit(relax.op.matmul(x, w))
            if relu_reads_matmul:  # m -> relu -> add(m, .): fusing add(matmul) is a cycle
                out = bb.emit_output(relax.op.add(m, bb.emit(relax.op.nn.relu(m))))
            else:  # add(m, x), and m read again afterwards: an escaping intermediate
                out = bb.emit_output(relax.op.multiply(bb.emit(relax.op.add(m, x)), m))
        bb.emit_func_output(out)
    return bb.get()


MATMUL_ADD = FusionPattern("t.matmul_add", dpl.is_op("relax.add")(
    dpl.is_op("relax.matmul")(dpl.wildcard(), dpl.wildcard()), dpl.wildcard()))


# -- importing ---------------------------------------------------------------------------------
def test_a_prefix_gives_tvms_entries_in_tvms_order_with_their_checks():
    table = pk.PatternTable.from_tvm("cutlass")
    registered = tvm_tables.registered_patterns("cutlass.")
    assert [e.name for e in table] == [str(p.name) for p in registered]
    assert len(table) > 70 and table.semantics == "tvm"
    assert [e.tvm_check is None for e in table] == [p.check is None for p in registered]
    assert sum(e.tvm_check is not None for e in table) > 70  # 76 of 79 in 0.27


def test_repeated_names_are_variants_of_one_composite():
    table = pk.PatternTable.from_tvm("cutlass")
    assert len(table.variants_of("cutlass.stacked_attention")) == 4
    assert table.names.count("cutlass.stacked_attention") == 1


def test_annotation_patterns_become_roles_inside_the_converted_pattern():
    entry = pk.PatternTable.from_tvm("cutlass.conv2d_bias_relu")[0]
    assert {"root", "lhs", "rhs", "bias"} <= set(entry.roles)
    inside = set()
    stack = [entry.pattern]
    while stack:
        node = stack.pop()
        inside.add(id(node))
        stack.extend(c for c in (node.children() if hasattr(node, "children") else ()) or ()
                     if c is not None)
        stack.extend(getattr(node, "args", None) or ())
    assert all(id(p) in inside for p in entry.roles.values())


def test_several_prefixes_and_fusion_pattern_lists_are_accepted():
    both = pk.PatternTable.from_tvm("cublas,cudnn")
    assert {e.compiler for e in both} == {"cublas", "cudnn"}
    assert [e.name for e in pk.PatternTable.from_tvm([MATMUL_ADD])] == ["t.matmul_add"]


def test_a_prefix_that_matches_no_table_lists_the_registered_ones():
    with pytest.raises(pk.byoc.PatternTableError, match="registered prefixes: .*cutlass.*tensorrt"):
        pk.PatternTable.from_tvm("cutlas")


def test_a_fusion_pattern_patternkit_cannot_express_is_named():
    bad = FusionPattern("t.unordered", dpl.is_op("relax.nn.relu")(
        dpl.is_tuple([dpl.wildcard(), dpl.wildcard()], unordered=True)))
    with pytest.raises(pk.byoc.PatternTableError, match=r"entry 1 \('t.unordered'\).*Unordered"):
        pk.PatternTable.from_tvm([MATMUL_ADD, bad])


# -- same composites as FuseOpsByPattern -------------------------------------------------------
@pytest.mark.parametrize("prefix", ["cutlass", "tensorrt", "openclml", "cudnn", "cublas",
                                    "nnapi", "coreml", "example_npu", "hipblas"])
def test_merge_composite_forms_exactly_what_fuse_ops_by_pattern_forms(resnet, prefix):
    table = pk.PatternTable.from_tvm(prefix)
    theirs = FuseOpsByPattern(tvm_tables.registered_patterns(prefix + "."))(resnet)
    _assert_same_module(pk.MergeComposite(table)(resnet), theirs)


@pytest.mark.parametrize("options", [{"bind_constants": False}, {"annotate_codegen": True}])
def test_the_fuse_ops_by_pattern_keywords_behave_as_tvms(resnet, options):
    patterns = tvm_tables.registered_patterns("tensorrt.")
    theirs = FuseOpsByPattern(patterns, **options)(resnet)
    ours = pk.MergeComposite(pk.PatternTable.from_tvm("tensorrt"), **options)(resnet)
    _assert_same_module(ours, theirs)



def test_a_tuple_written_in_an_argument_gives_its_fields_as_parameters_as_tvm_does():
    # Llama's rotary embedding imports as ``concat((neg, x))`` with the tuple inline.
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    y = relax.Var("y", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            n = bb.emit(relax.op.negative(x))
            twice = bb.emit(relax.op.concat(relax.Tuple([n, n]), axis=1))
            both = bb.emit(relax.op.concat(relax.Tuple([y, n]), axis=1))
            out = bb.emit_output(relax.op.add(twice, both))
        bb.emit_func_output(out)
    mod = bb.get()
    concat = FusionPattern("t.concat", dpl.is_op("relax.concat")(dpl.wildcard()))
    ours = pk.MergeComposite(pk.PatternTable.from_tvm([concat]))(mod)
    assert_well_formed(ours, "MergeComposite")  # a parameter read but never defined
    _assert_same_module(ours, FuseOpsByPattern([concat])(mod))
    report = pk.byoc.verify_table(pk.PatternTable.from_tvm([concat]), mod)
    assert report.fired == {"t.concat": 2} and not report.failures

def test_composites_over_a_symbolic_batch_define_their_own_symbolic_variables():
    """Two layer norms over ``(n, 8)``: each composite gets fresh ``n`` as TVM's
    ``SymbolicVarRenewMutator`` gives it (sharing the caller's ``n`` is not well formed)."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    gamma, beta = (relax.Var(name, relax.TensorType((8,), "float32"))
                   for name in ("gamma", "beta"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, gamma, beta]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.layer_norm(x, gamma, beta, axes=[-1]))
            y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(relax.op.nn.layer_norm(y, gamma, beta, axes=[-1]))
        bb.emit_func_output(out)
    mod = bb.get()
    norm = FusionPattern("t.layer_norm", dpl.is_op("relax.nn.layer_norm")(
        dpl.wildcard(), dpl.wildcard(), dpl.wildcard()))
    ours = pk.MergeComposite(pk.PatternTable.from_tvm([norm]))(mod)
    assert_well_formed(ours, "MergeComposite")
    _assert_same_module(ours, FuseOpsByPattern([norm])(mod))
    pk.assert_same_numerics(mod, ours, rtol=0, atol=0, shape_vars={"n": 3})


def test_the_input_module_is_left_unchanged(resnet):
    before = _snapshot(resnet)
    pk.MergeComposite(pk.PatternTable.from_tvm("tensorrt"))(resnet)
    _assert_untouched(resnet, before)


# -- checks ------------------------------------------------------------------------------------
def test_a_tvm_check_that_rejects_is_reported_by_name(resnet):
    # cutlass's conv2d check wants float16 NHWC: this float32 NCHW ResNet is refused
    report = pk.offload_report(resnet, pk.PatternTable.from_tvm("cutlass.conv2d"))
    vetoed = report.host_ops_of_kind("vetoed")
    assert vetoed and all(h.op == "relax.nn.conv2d" for h in vetoed)
    assert vetoed[0].reason == "check of cutlass.conv2d rejected it"


def test_a_check_reads_a_pattern_check_context_like_tvms():
    seen = {}

    def check(context):
        seen["root"] = context.matched_expr
        seen["annotated"] = dict(context.annotated_expr)
        seen["bound"] = [str(v.name) for v in context.matched_bindings]
        lhs = context.annotated_expr["lhs"]
        seen["users"] = [str(v.name) for v in context.var_usages[context.value_to_bound_var[lhs]]]
        return True

    lhs = dpl.is_op("relax.matmul")(dpl.wildcard(), dpl.wildcard())
    fp = FusionPattern("t.matmul_add", dpl.is_op("relax.add")(lhs, dpl.wildcard()),
                       {"lhs": lhs}, check)
    mod = _matmul_module(relu_reads_matmul=False)
    pk.MergeComposite(pk.PatternTable.from_tvm([fp]))(mod)
    mine = dict(seen)
    FuseOpsByPattern([fp])(mod)
    assert mine["root"].same_as(seen["root"]) and mine["annotated"]["lhs"].same_as(
        seen["annotated"]["lhs"])
    assert sorted(mine["bound"]) == sorted(seen["bound"]) == ["lv", "lv1"]
    assert mine["users"] == seen["users"] == ["lv1", "gv"]


def test_a_check_that_raises_names_the_entry_and_leaves_the_module_alone():
    def check(_context):
        raise RuntimeError("boom")

    mod = _matmul_module(relu_reads_matmul=False)
    before = _snapshot(mod)
    fp = FusionPattern("t.matmul_add", MATMUL_ADD.pattern, {}, check)
    with pytest.raises(pk.errors.CallbackError, match="'t.matmul_add' raised RuntimeError: boom"):
        pk.MergeComposite(pk.PatternTable.from_tvm([fp]))(mod)
    _assert_untouched(mod, before)



def test_errors_raised_inside_a_pipeline_keep_their_patternkit_class(resnet):
    pipeline = tvm.transform.Sequential([pk.MergeComposite(pk.PatternTable.from_tvm("tensorrt")),
                                         pk.PartitionGraph(merge=False)])
    with pytest.raises(pk.byoc.PatternTableError, match=r"PartitionGraph\(merge=False\)"):
        pipeline(resnet)

    def check(_context):
        raise RuntimeError("boom")

    fp = FusionPattern("t.matmul_add", MATMUL_ADD.pattern, {}, check)
    pipeline = tvm.transform.Sequential([pk.MergeComposite(pk.PatternTable.from_tvm([fp]))])
    with pytest.raises(pk.errors.CallbackError,
                       match="'t.matmul_add' raised RuntimeError") as raised:
        pipeline(_matmul_module(relu_reads_matmul=False))
    assert raised.value.binding.startswith("main:")

# -- the two semantics -------------------------------------------------------------------------
def test_tvm_semantics_export_an_escaping_intermediate_relay_semantics_skip_the_match():
    mod = _matmul_module(relu_reads_matmul=False)
    table = pk.PatternTable.from_tvm([MATMUL_ADD])
    ours = pk.MergeComposite(table)(mod)
    _assert_same_module(ours, FuseOpsByPattern([MATMUL_ADD])(mod))
    composite = next(f for gv, f in ours.functions.items() if gv.name_hint != "main")
    assert isinstance(composite.ret_ty, relax.TupleType)  # (add, matmul): matmul is exported
    pk.assert_same_numerics(mod, ours, rtol=0, atol=0)
    log = pk.byoc.CompositeLog()
    relay_merged = pk.byoc.merge_composite(mod, table, semantics="relay", log=log)
    assert pk.byoc.composite_counts(relay_merged) == {}
    assert [s.kind for s in log.skipped] == ["escape"]


def test_a_match_that_would_depend_on_itself_is_skipped_where_tvm_crashes():
    # Deliberately not TVM's behaviour: FuseOpsByPattern stops with "cyclic dependency"
    # (depgroup != cur_group) on add(matmul) when relu(matmul) feeds the add.
    mod = _matmul_module(relu_reads_matmul=True)
    with pytest.raises(tvm.error.InternalError, match="cyclic dependency"):
        FuseOpsByPattern([MATMUL_ADD])(mod)
    log = pk.byoc.CompositeLog()
    out = pk.byoc.merge_composite(mod, pk.PatternTable.from_tvm([MATMUL_ADD]), log=log)
    assert pk.byoc.composite_counts(out) == {}
    assert [s.kind for s in log.skipped] == ["cycle"]
    assert "cycle" in pk.offload_report(mod, pk.PatternTable.from_tvm([MATMUL_ADD])
                                        ).host_ops[0].kind


def test_a_later_match_sharing_part_of_an_earlier_one_is_skipped_where_tvm_crashes():
    # Deliberately not TVM's behaviour: for subtract(relu(*), *) on
    # r = relu(x); a = r - y; out = r - a, FuseOpsByPattern lets the match at 'out' take
    # 'r' from the match at 'a' and then stops with "cyclic dependency".  patternkit keeps
    # the earlier match whole and reports the later one as an overlap.
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    y = relax.Var("y", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(x))
            out = bb.emit_output(relax.op.subtract(r, bb.emit(relax.op.subtract(r, y))))
        bb.emit_func_output(out)
    mod = bb.get()
    fp = FusionPattern("t.relu_sub", dpl.is_op("relax.subtract")(
        dpl.is_op("relax.nn.relu")(dpl.wildcard()), dpl.wildcard()))
    with pytest.raises(tvm.error.InternalError, match="cyclic dependency"):
        FuseOpsByPattern([fp])(mod)
    log = pk.byoc.CompositeLog()
    fused = pk.byoc.merge_composite(mod, pk.PatternTable.from_tvm([fp]), log=log)
    assert [(f.root, f.vars) for f in log.formed] == [("lv1", ("lv", "lv1"))]
    assert [(s.root, s.kind) for s in log.skipped] == [("gv", "overlap")]
    pk.assert_same_numerics(mod, fused, rtol=0, atol=0)


def test_an_unknown_semantics_is_refused():
    with pytest.raises(pk.byoc.PatternTableError, match="semantics"):
        pk.MergeComposite(pk.PatternTable.from_tvm([MATMUL_ADD]), semantics="onnx")


# -- PartitionGraph ----------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", ["tensorrt", "example_npu"])
def test_partition_graph_of_tvm_composites_is_merge_composite_functions(resnet, prefix):
    theirs = relax.transform.MergeCompositeFunctions()(
        FuseOpsByPattern(tvm_tables.registered_patterns(prefix + "."))(resnet))
    ours = pk.PartitionGraph()(pk.MergeComposite(pk.PatternTable.from_tvm(prefix))(resnet))
    _assert_same_module(ours, theirs)
    assert any(name.endswith("_" + prefix) for name in (gv.name_hint for gv in ours.functions))


def test_partition_graph_refuses_to_leave_another_compilers_tvm_composites_behind(resnet):
    fused = pk.MergeComposite(pk.PatternTable.from_tvm("cublas,tensorrt"))(resnet)
    with pytest.raises(pk.byoc.PatternTableError, match="also has composites of tensorrt"):
        pk.byoc.partition_graph(fused, "cublas")


def test_partition_graph_of_tvm_composites_takes_host_code_that_reads_a_symbolic_batch():
    """``R.arange(0, n)`` beside a composite: TVM's ``MergeCompositeFunctions`` crashes
    on it (as on a dynamic-batch GPT-2); PartitionGraph holds such bindings out of its way."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            pos = bb.emit(relax.op.arange(0, n, 1, dtype="float32"))
            y = bb.emit(relax.op.matmul(x, w))
            out = bb.emit_output(relax.op.multiply(y, relax.op.reshape(pos, (n, 1))))
        bb.emit_func_output(out)
    mod = bb.get()
    table = pk.PatternTable.from_tvm([FusionPattern(
        "t.matmul", dpl.is_op("relax.matmul")(dpl.wildcard(), dpl.wildcard()))])
    out = pk.PartitionGraph("t")(pk.MergeComposite(table)(mod))
    assert_well_formed(out, "PartitionGraph")
    assert len(pk.byoc.external_functions(out, "t")) == 1
    inlined = pk.byoc.inline_external(out)
    pk.assert_same_numerics(mod, inlined, rtol=0, atol=0, shape_vars={"n": 3})
