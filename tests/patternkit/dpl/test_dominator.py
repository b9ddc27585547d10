"""Dominator patterns: Relay's ``dominates(parent, path, child)`` on Relax.

The cases are Relay's own dominator tests (``test_match_dominator``,
``test_not_match_dominator``, ``test_match_typed_dominator``, the fuzzy/nested diamond,
``test_quadruple_rewrite_dominator``, ``test_partition_dominator``,
``test_quadruple_partition_dominator``, and the parallel-injective fusion case), written
as Relax bindings; every rewrite and partition is run on llvm against the input.
"""

from __future__ import annotations

import pytest
from tvm import relax

import patternkit as pk

X = relax.TensorType((1, 3, 12, 12), "float32")
W = relax.TensorType((3, 3, 3, 3), "float32")


def _conv(x, w):
    return relax.op.nn.conv2d(x, w, padding=(1, 1))


def _leaky(x):
    return relax.op.nn.leakyrelu(x, 0.0)


def _function(body, params=(("input", X), ("weight", W))):
    """``main`` whose dataflow block is built by ``body(emit, *params)``; bound Vars by name."""
    vars_ = [relax.Var(name, ty) for name, ty in params]
    bb = relax.BlockBuilder()
    with bb.function("main", vars_):
        with bb.dataflow():
            out = body(lambda expr, name: bb.emit(expr, name), *vars_)
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    mod = bb.get()
    named = {b.var.name: b.var for block in mod["main"].body.blocks for b in block.bindings}
    return mod, named


def classic_diamond(emit, inp, weight):
    conv = emit(_conv(inp, weight), "conv")
    relu = emit(relax.op.nn.relu(conv), "relu")
    relu = emit(relax.op.nn.relu(relu), "relu2")
    leaky = emit(_leaky(conv), "leaky")
    return emit(relax.op.add(relu, leaky), "out")


def deeper_diamond(emit, inp, weight):
    conv = emit(_conv(inp, weight), "conv")
    relu = emit(relax.op.nn.relu(conv), "relu")
    relu = emit(relax.op.nn.relu(relu), "relu2")
    relu = emit(relax.op.tanh(relu), "tanh")
    leaky = emit(_leaky(conv), "leaky")
    return emit(relax.op.add(relu, leaky), "out")


def single_branch(emit, inp, weight):
    conv = emit(_conv(inp, weight), "conv")
    relu = emit(relax.op.nn.relu(conv), "relu")
    relu = emit(relax.op.nn.relu(relu), "relu2")
    tanh = emit(relax.op.tanh(relu), "tanh")
    return emit(relax.op.add(relu, tanh), "out")


def nested_diamond(emit, inp, weight):
    conv = emit(_conv(inp, weight), "conv")
    relu = emit(relax.op.nn.relu(conv), "relu")
    twice = emit(relax.op.add(relu, relu), "twice")
    tanh = emit(relax.op.tanh(twice), "tanh")
    leaky = emit(_leaky(conv), "leaky")
    return emit(relax.op.add(tanh, leaky), "out")


def unary_elemwise():
    return pk.wildcard().has_attr({"TOpPattern": pk.dpl.K_ELEMWISE})(pk.wildcard())


def relay_diamond(path=None):
    """Relay's pattern: a conv2d, elementwise ops on every way, reconverging in an add."""
    is_conv2d = pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard())
    reduction = pk.is_op("add")(pk.wildcard(), pk.wildcard())
    return pk.dominates(is_conv2d, unary_elemwise() if path is None else path, reduction)


def fuzzy_path():
    return unary_elemwise() | pk.is_op("add")(pk.wildcard(), pk.wildcard())


# ---------------------------------------------------------------------- op kinds
def test_op_kinds_are_relays_static_kinds_as_no_relax_op_registers_one():
    x = relax.Var("x", X)
    assert pk.dpl.op_kind(relax.op.nn.relu(x).op) == pk.dpl.K_ELEMWISE
    assert pk.dpl.op_kind(relax.op.add(x, x).op) == pk.dpl.K_BROADCAST  # even on equal shapes
    assert pk.dpl.op_kind(relax.op.reshape(x, (3, 144)).op) == pk.dpl.K_INJECTIVE
    assert pk.dpl.op_kind(relax.op.permute_dims(x).op) == pk.dpl.K_INJECTIVE
    assert pk.dpl.op_kind(_conv(x, relax.Var("w", W)).op) == pk.dpl.K_OUT_EWISE_FUSABLE
    assert pk.match(unary_elemwise(), relax.op.tanh(x))
    assert not pk.match(unary_elemwise(), relax.op.add(x, x))


# ---------------------------------------------------------------------- match
@pytest.mark.parametrize("body", [classic_diamond, deeper_diamond, single_branch])
def test_relays_diamonds_match_at_the_add(body):
    mod, v = _function(body)
    found = pk.dpl.find_match(relay_diamond(), v["out"], mod["main"])
    assert found is not None
    # the parent's own inputs are the match's inputs; the diamond's nodes are interior
    assert [e.name for e in found.inputs] == ["input", "weight"]
    assert {e.name for e in found.internal} >= {"out", "conv"}


def test_the_path_nodes_are_listed_by_the_node_map_in_visit_order():
    mod, v = _function(classic_diamond)
    pattern = relay_diamond()
    found = pk.dpl.find_match(pattern, v["out"], mod["main"])
    # each reader's inputs are found before the walk goes deeper: relu2, leaky, then relu
    relu2, leaky, relu = found.repeated[pattern.path]
    assert relu2.args[0].same_as(v["relu"]) and leaky.op.name == "relax.nn.leakyrelu"
    assert relu.args[0].same_as(v["conv"])


def test_a_fuzzy_path_matches_the_nested_diamond():
    mod, v = _function(nested_diamond)
    assert pk.dpl.find_match(relay_diamond(fuzzy_path()), v["out"], mod["main"]) is not None


def test_a_typed_dominator_matches_only_the_types_it_names():
    mod, v = _function(classic_diamond)
    is_conv2d = pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard())

    def diamond(dtype, shape):
        path = unary_elemwise().has_dtype(dtype)
        child = pk.is_op("add")(pk.wildcard(), pk.wildcard()).has_shape(shape)
        return pk.dominates(is_conv2d, path, child)

    assert pk.dpl.find_match(diamond("float32", [1, 3, 12, 12]), v["out"], mod["main"])
    assert not pk.dpl.find_match(diamond("float32", [1, 1, 12, 12]), v["out"], mod["main"])
    assert not pk.dpl.find_match(diamond("float16", [1, 3, 12, 12]), v["out"], mod["main"])


def _fake_diamond(emit, in1, w1, in2, w2):
    relu = emit(relax.op.nn.relu(emit(_conv(in1, w1), "conv1")), "relu")
    leaky = emit(_leaky(emit(_conv(in2, w2), "conv2")), "leaky")
    return emit(relax.op.add(relu, leaky), "out")


def _broadcast_on_the_path(emit, inp, weight):
    conv = emit(_conv(inp, weight), "conv")
    relu = emit(relax.op.nn.relu(conv), "relu")
    twice = emit(relax.op.add(relu, relu), "twice")
    leaky = emit(_leaky(conv), "leaky")
    return emit(relax.op.add(twice, leaky), "out")


def _relu_on_the_input(emit, inp, weight):
    conv = emit(_conv(inp, weight), "conv")
    relu = emit(relax.op.nn.relu(inp), "relu")
    leaky = emit(_leaky(conv), "leaky")
    return emit(relax.op.add(relu, leaky), "out")


def _no_conv(emit, inp, weight):
    relu = emit(relax.op.nn.relu(inp), "relu")
    relu = emit(relax.op.nn.relu(relu), "relu2")
    tanh = emit(relax.op.tanh(relu), "tanh")
    return emit(relax.op.add(relu, tanh), "out")


@pytest.mark.parametrize("body, params", [
    (_fake_diamond, (("input1", X), ("weight1", W), ("input2", X), ("weight2", W))),
    (_broadcast_on_the_path, (("input", X), ("weight", W))),
    (_relu_on_the_input, (("input", X), ("weight", W))),
    (_no_conv, (("input", X), ("weight", W))),
], ids=["fake diamond", "add is not elementwise", "relu on the input", "no conv"])
def test_relays_non_diamonds_do_not_match(body, params):
    mod, v = _function(body, params)
    assert pk.dpl.find_match(relay_diamond(), v["out"], mod["main"]) is None


def test_a_parent_also_read_outside_the_diamond_gives_no_match():
    def body(emit, inp, weight):
        conv = emit(_conv(inp, weight), "conv")
        relu = emit(relax.op.nn.relu(conv), "relu")
        leaky = emit(_leaky(conv), "leaky")
        out = emit(relax.op.add(relu, leaky), "out")
        return emit(relax.op.add(out, conv), "final")  # conv escapes the diamond

    mod, v = _function(body)
    assert pk.dpl.find_match(relay_diamond(), v["out"], mod["main"]) is None


def test_parallel_injective_ops_between_two_broadcasts_form_a_diamond():
    # Relay's FuseOps case: y = x + 1; left_shift(squeeze(y), transpose(y))
    xt = relax.TensorType((10, 20), "int32")

    def body(emit, x):
        y = emit(relax.op.add(x, relax.const(1, "int32")), "y")
        z = emit(relax.op.reshape(y, (10, 20)), "z")
        u = emit(relax.op.permute_dims(emit(relax.op.permute_dims(y), "t"), [1, 0]), "u")
        return emit(relax.op.left_shift(z, u), "out")

    mod, v = _function(body, (("x", xt),))
    # (None): any arguments, since Relax's reshape also takes its shape as an argument
    injective = pk.wildcard().has_attr({"TOpPattern": pk.dpl.K_INJECTIVE})(None)

    def broadcast():  # a new pattern each time: one pattern object matches one node
        return pk.wildcard().has_attr({"TOpPattern": pk.dpl.K_BROADCAST})(pk.wildcard(),
                                                                        pk.wildcard())

    pattern = pk.dominates(broadcast(), injective, broadcast())
    found = pk.dpl.find_match(pattern, v["out"], mod["main"])
    assert found is not None
    assert [e.op.name for e in found.repeated[pattern.path]] == \
        ["relax.reshape", "relax.permute_dims", "relax.permute_dims"]
    partitioned = pk.partition(pattern, mod)
    assert _partition_names(partitioned) == ["add_reshape_permute_dims_permute_dims_left_shift_"]
    pk.assert_same_numerics(mod, partitioned, rtol=0, atol=0)


# ---------------------------------------------------------------------- ambiguity
def test_a_path_that_also_takes_the_parent_kind_is_an_error_naming_the_binding():
    mod, v = _function(classic_diamond)
    anything_elementwise_or_conv = unary_elemwise() | pk.is_op("nn.conv2d")(pk.wildcard(),
                                                                           pk.wildcard())
    pattern = relay_diamond(anything_elementwise_or_conv)
    with pytest.raises(pk.dpl.AmbiguousDominator, match="conv = R.nn.conv2d") as caught:
        pk.dpl.find_match(pattern, v["out"], mod["main"])
    assert isinstance(caught.value, pk.PatternkitError)

    class Drop(pk.DFPatternCallback):
        def __init__(self):
            super().__init__()
            self.pattern = pattern

        def callback(self, pre, post, node_map):
            return post

    before = mod.script()
    with pytest.raises(pk.dpl.AmbiguousDominator, match=r"rule Drop: .*main"):
        pk.rewrite(Drop(), mod)
    assert mod.script() == before


def test_a_path_node_that_is_the_root_of_a_smaller_diamond_is_an_error():
    def body(emit, inp, weight):
        conv = emit(_conv(inp, weight), "conv")
        relu = emit(relax.op.nn.relu(conv), "relu")
        inner = emit(relax.op.add(relu, relu), "inner")  # conv's only way to the root
        tanh = emit(relax.op.tanh(inner), "tanh")
        exp = emit(relax.op.exp(inner), "exp")
        return emit(relax.op.add(tanh, exp), "out")

    mod, v = _function(body)
    with pytest.raises(pk.dpl.AmbiguousDominator, match="inner = R.add.*complete diamond"):
        pk.dpl.find_match(relay_diamond(fuzzy_path()), v["out"], mod["main"])
    # in Relay's nested diamond, leaky_relu(conv) goes around the inner add: no ambiguity
    nested, w = _function(nested_diamond)
    assert pk.dpl.find_match(relay_diamond(fuzzy_path()), w["out"], nested["main"]) is not None


def test_relays_wildcard_path_is_no_ambiguity():
    mod, v = _function(classic_diamond)
    child = pk.is_op("add")(pk.wildcard(), pk.wildcard())
    pattern = child.dominates(pk.is_op("nn.conv2d")(pk.wildcard(), pk.wildcard()))
    assert pk.dpl.find_match(pattern, v["out"], mod["main"]) is not None


# ---------------------------------------------------------------------- rewrite, partition
class DominatorRemoval(pk.DFPatternCallback):
    """Relay's DominatorRemovalCallback: the whole diamond becomes its conv2d."""

    def __init__(self):
        super().__init__()
        self.inp, self.weight = pk.wildcard(), pk.wildcard()
        conv = pk.is_op("nn.conv2d")(self.inp, self.weight)
        reduction = pk.is_op("add")(pk.wildcard(), pk.wildcard())
        self.pattern = pk.dominates(conv, fuzzy_path(), reduction)

    def callback(self, pre, post, node_map):
        return _conv(node_map[self.inp][0], node_map[self.weight][0])


def _chain(*bodies):
    def body(emit, inp, weight):
        out = inp
        for make in bodies:
            out = make(emit, out, weight)
        return out
    return body


FOUR = (classic_diamond, deeper_diamond, single_branch, nested_diamond)


def test_quadruple_rewrite_leaves_four_convolutions():
    mod, _ = _function(_chain(*FOUR))
    out = pk.rewrite(DominatorRemoval(), mod)
    assert _ops(out) == ["relax.nn.conv2d"] * 4
    four_convs, _ = _function(_chain(*[lambda emit, x, w: emit(_conv(x, w), "c")] * 4))
    pk.assert_same_numerics(four_convs, out, rtol=0, atol=0)


def test_a_single_diamond_rewrite_is_numerically_its_conv_when_the_paths_cancel():
    # relu(relu(c)) + leakyrelu(c, 0) == 2 * relu(c): rewrite to exactly that
    class Double(DominatorRemoval):
        def callback(self, pre, post, node_map):
            conv = _conv(node_map[self.inp][0], node_map[self.weight][0])
            return relax.op.multiply(relax.op.nn.relu(conv), relax.const(2.0, "float32"))

    mod, _ = _function(classic_diamond)
    out = pk.rewrite(Double(), mod)
    assert _ops(out) == ["relax.nn.conv2d", "relax.nn.relu", "relax.multiply"]
    pk.assert_same_numerics(mod, out, rtol=0, atol=0)


def _ops(mod):
    return [b.value.op.name for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call)]


def _partition_names(mod):
    return [b.value.attrs["PartitionedFromPattern"] for block in mod["main"].body.blocks
            for b in block.bindings if isinstance(b.value, relax.Function)]


def test_partition_wraps_the_diamond_with_relays_name():
    def body(emit, inp, weight):
        sq = emit(relax.op.multiply(inp, inp), "sq")
        wsq = emit(relax.op.multiply(weight, weight), "wsq")
        return classic_diamond(emit, sq, wsq)

    mod, _ = _function(body)
    out = pk.partition(relay_diamond(), mod)
    assert _partition_names(out) == ["nn.conv2d_nn.relu_nn.relu_nn.leaky_relu_add_"]
    call, = [b.value for b in out["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, relax.Var)]
    assert [a.name for a in call.args] == ["sq", "wsq"]  # the parent's inputs
    assert relax.analysis.check_well_formed(out)
    pk.assert_same_numerics(mod, out, rtol=0, atol=0)


def test_quadruple_partition_gives_four_functions_named_as_relay_did():
    mod, _ = _function(_chain(*FOUR))
    out = pk.partition(relay_diamond(fuzzy_path()), mod)
    assert _partition_names(out) == [
        "nn.conv2d_nn.relu_nn.relu_nn.leaky_relu_add_",
        "nn.conv2d_nn.relu_nn.relu_tanh_nn.leaky_relu_add_",
        "nn.conv2d_nn.relu_nn.relu_tanh_add_",
        "nn.conv2d_nn.relu_add_tanh_nn.leaky_relu_add_",
    ]
    pk.assert_same_numerics(mod, out, rtol=0, atol=0)


def test_a_pattern_table_composite_takes_the_diamond():
    mod, _ = _function(classic_diamond)
    out = pk.MergeComposite([("demo.diamond", relay_diamond())])(mod)
    assert pk.byoc.composite_counts(out) == {"demo.diamond": 1}
    pk.assert_same_numerics(mod, out, rtol=0, atol=0)


def test_operator_kinds_and_dominators_have_no_tvm_dpl_form():
    with pytest.raises(pk.PatternError, match="no Relax operator registers TOpPattern"):
        unary_elemwise().to_dpl()
    with pytest.raises(pk.PatternError, match="DominatorPattern has no tvm.relax.dpl"):
        relay_diamond().to_dpl()
