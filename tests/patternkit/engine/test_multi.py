"""Multi-output patterns: ``PatternContext`` and ``rewrite_bindings`` with patternkit patterns.

Each behaviour is checked against ``tvm.relax.dpl.rewrite_bindings`` run with the same
context (converted by ``PatternContext.to_dpl``) and the same rewriter: the results must
be structurally equal, and every rewrite is run on llvm against its input.
"""

from __future__ import annotations

import pytest
import tvm_ffi
from tvm import relax

import patternkit as pk
from patternkit.engine.multi import dpl_rewriter

X = relax.TensorType((2, 8), "float32")
WT = relax.TensorType((8, 4), "float32")


def _function(body, params):
    """``main`` whose block ``body(emit, *params)`` builds; it returns the (unbound) output
    expression, so no ``gv = out`` copy is left for TVM to fold and patternkit to keep."""
    vars_ = [relax.Var(name, ty) for name, ty in params]
    bb = relax.BlockBuilder()
    with bb.function("main", vars_):
        with bb.dataflow():
            gv = bb.emit_output(body(lambda e, n: bb.emit(e, n), *vars_))
        bb.emit_func_output(gv)
    return bb.get()


def qkv_block(emit, x, w0, w1, w2):
    q = emit(relax.op.matmul(x, w0), "q")
    k = emit(relax.op.matmul(x, w1), "k")
    v = emit(relax.op.matmul(x, w2), "v")
    return relax.op.add(emit(relax.op.multiply(q, k), "qk"), v)


QKV_PARAMS = (("x", X), ("w0", WT), ("w1", WT), ("w2", WT))


def qkv_context():
    with pk.PatternContext() as ctx:
        inp = pk.wildcard()
        weights = [pk.wildcard() for _ in range(3)]
        matmuls = [pk.is_op("relax.matmul")(inp, w) for w in weights]
    return ctx, inp, weights, matmuls


def combine(inp, weights, matmuls):
    """The rewriter: one matmul on the concatenated weights, and a split."""
    def rewriter(matchings, bindings):
        ws = [matchings[w] for w in weights]
        widths = [int(matchings[w].ty.shape[1]) for w in weights]
        merged = relax.op.matmul(matchings[inp], relax.op.concat(ws, axis=1))
        cuts = [sum(widths[:i + 1]) for i in range(len(widths) - 1)]
        parts = relax.op.split(merged, cuts, axis=1)
        return {matchings[m]: relax.TupleGetItem(parts, i) for i, m in enumerate(matmuls)}
    return rewriter


def tvm_rewrite(ctx, rewriter, func):
    tvm_ctx, nodes = ctx.to_dpl()
    return relax.dpl.rewrite_bindings(tvm_ctx, dpl_rewriter(nodes, rewriter), func)


def test_three_matmuls_of_one_input_become_one_matmul_and_a_split_as_tvm_does():
    mod = _function(qkv_block, QKV_PARAMS)
    ctx, inp, weights, matmuls = qkv_context()
    out = pk.engine.rewrite_bindings(ctx, combine(inp, weights, matmuls), mod)
    ops = [b.value.op.name for b in out["main"].body.blocks[0].bindings
           if isinstance(b.value, relax.Call)]
    assert ops.count("relax.matmul") == 1 and "relax.split" in ops
    expected = tvm_rewrite(ctx, combine(inp, weights, matmuls), mod["main"])
    assert tvm_ffi.structural_equal(out["main"], expected)
    pk.assert_same_numerics(mod, out, rtol=1e-5, atol=1e-5)


def test_the_rewriter_gets_the_matched_vars_and_the_blocks_bindings_in_binding_order():
    mod = _function(qkv_block, QKV_PARAMS)
    ctx, inp, weights, matmuls = qkv_context()
    seen = []

    def rewriter(matchings, bindings):
        seen.append(({p: v.name for p, v in matchings.items()},
                     [v.name for v in bindings]))
        return {}

    out = pk.engine.rewrite_bindings(ctx, rewriter, mod)
    assert out.same_as(mod)  # nothing replaced: the input itself
    (matched, bound), = seen
    # symmetric patterns take the readers of x in binding order, as TVM assigns them
    assert [matched[m] for m in matmuls] == ["q", "k", "v"]
    assert [matched[w] for w in weights] == ["w0", "w1", "w2"]
    assert matched[inp] == "x"
    assert bound[:4] == ["q", "k", "v", "qk"]


def test_a_function_target_gives_a_function_and_the_input_is_untouched():
    mod = _function(qkv_block, QKV_PARAMS)
    before = mod.script()
    ctx, inp, weights, matmuls = qkv_context()
    out = pk.engine.rewrite_bindings(ctx, combine(inp, weights, matmuls), mod["main"])
    assert isinstance(out, relax.Function)
    assert mod.script() == before


def test_used_by_and_only_used_by_constrain_the_consumers_as_in_tvm():
    def body(emit, x, w0, w1):
        a = emit(relax.op.matmul(x, w0), "a")
        r = emit(relax.op.nn.relu(a), "r")
        b = emit(relax.op.matmul(x, w1), "b")
        s = emit(relax.op.nn.relu(b), "s")
        t = emit(relax.op.add(b, s), "t")  # b has two readers
        return relax.op.add(r, t)

    mod = _function(body, (("x", X), ("w0", WT), ("w1", WT)))
    for only in (False, True):
        with pk.PatternContext() as ctx:
            mm = pk.is_op("relax.matmul")(pk.wildcard(), pk.wildcard(), add_constraint=False)
            relu = pk.is_op("relax.nn.relu")(pk.wildcard(), add_constraint=False)
            (mm >> relu) if only else (mm ^ relu)
        found = []

        def rewriter(matchings, bindings):
            found.append(matchings[mm].name)
            return {matchings[relu]: relax.op.nn.gelu(matchings[mm])}

        out = pk.engine.rewrite_bindings(ctx, rewriter, mod)
        assert found == (["a"] if only else ["a", "b"])
        expected = tvm_rewrite(ctx, rewriter, mod["main"])
        assert tvm_ffi.structural_equal(out["main"], expected), only
        assert relax.analysis.check_well_formed(out)


def test_a_duplicated_chain_is_another_node_and_takes_the_next_pair():
    def body(emit, x, w0, w1):
        r = emit(relax.op.nn.relu(emit(relax.op.matmul(x, w0), "a")), "r")
        s = emit(relax.op.nn.relu(emit(relax.op.matmul(x, w1), "b")), "s")
        return relax.op.add(r, s)

    mod = _function(body, (("x", X), ("w0", WT), ("w1", WT)))
    with pk.PatternContext() as ctx:
        mm = pk.is_op("relax.matmul")(pk.wildcard(), pk.wildcard(), add_constraint=False)
        relu = pk.is_op("relax.nn.relu")(pk.wildcard(), add_constraint=False)
        first = mm >> relu
        second = first.dup()
    found = ctx.match_dfb(mod["main"].body.blocks[0])
    assert [found[p].name for p in (*first.patterns, *second.patterns)] == ["a", "r", "b", "s"]


def test_a_replacement_for_a_var_the_match_does_not_own_is_an_error_naming_the_binding():
    mod = _function(qkv_block, QKV_PARAMS)
    before = mod.script()
    ctx, inp, weights, matmuls = qkv_context()
    out_var = next(b.var for b in mod["main"].body.blocks[0].bindings if b.var.name == "qk")

    def rewriter(matchings, bindings):
        return {out_var: matchings[inp]}

    with pytest.raises(pk.errors.CallbackError, match=r"main: qk = .*does not own") as caught:
        pk.engine.rewrite_bindings(ctx, rewriter, mod)
    assert caught.value.callback == "rewriter"  # the rewriter's own name
    assert caught.value.binding.startswith("main: qk = R.multiply(q, k)")
    assert mod.script() == before


def test_a_replacement_whose_type_does_not_fit_is_an_error_and_the_input_is_unchanged():
    mod = _function(qkv_block, QKV_PARAMS)
    before = mod.script()
    ctx, inp, weights, matmuls = qkv_context()

    def rewriter(matchings, bindings):
        return {matchings[matmuls[0]]: relax.op.sum(matchings[inp])}  # a scalar for a matrix

    with pytest.raises(pk.errors.CallbackError, match=r"rule rewriter: .*type"):
        pk.engine.rewrite_bindings(ctx, rewriter, mod)
    assert mod.script() == before


def test_a_rewriter_that_raises_is_reported_with_the_binding():
    mod = _function(qkv_block, QKV_PARAMS)
    ctx, *_ = qkv_context()

    def rewriter(matchings, bindings):
        raise ValueError("boom")

    with pytest.raises(pk.errors.CallbackError, match=r"ValueError: boom \(at 'main: q = "):
        pk.engine.rewrite_bindings(ctx, rewriter, mod)


def test_an_empty_context_is_a_pattern_error():
    with pytest.raises(pk.PatternError, match="holds no constraint"):
        pk.engine.rewrite_bindings(pk.PatternContext(), lambda m, b: {}, _function(qkv_block,
                                                                             QKV_PARAMS))


# ---------------------------------------------------------------------- the class form
class CombineQKV(pk.engine.BindingsRewriteRule):
    """Three matmuls of one input as one rule with several roots."""

    def __init__(self):
        super().__init__()
        self.context, self.inp, self.weights, self.matmuls = qkv_context()

    def rewrite(self, match):
        return combine(self.inp, self.weights, self.matmuls)(match.matchings, match.bindings)


def test_a_rule_with_several_roots_is_applied_by_rewrite_in_every_block_of_a_chain():
    def chain(emit, x, w0, w1, w2):
        for _ in range(3):
            x = qkv_block(emit, x, w0, w1, w2)
            x = emit(relax.op.matmul(emit(x, "y"), relax.op.permute_dims(w0)), "back")
        return x

    mod = _function(chain, QKV_PARAMS)
    log = pk.RewriteLog()
    out = pk.rewrite(CombineQKV(), mod, log=log)
    assert len([r for r in log.records if r.rule == "CombineQKV"]) == 3
    ops = [b.value.op.name for b in out["main"].body.blocks[0].bindings
           if isinstance(b.value, relax.Call)]
    assert ops.count("relax.split") == 3
    pk.assert_same_numerics(mod, out, rtol=1e-5, atol=1e-5)
