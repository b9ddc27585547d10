"""The multi-root matcher: ``PatternContext.match_dfb`` finds a graph of patterns in a block.

It is part of the pattern language (as ``MatchGraph`` is in ``tvm.relax.dpl``): matching
a context needs no rewrite engine.  Rewriting what it finds is tested in
``tests/patternkit/engine/test_multi.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from tvm import relax

import patternkit as pk
from patternkit.dpl import match_dfb

X = relax.TensorType((2, 8), "float32")
WT = relax.TensorType((8, 4), "float32")


def _block(body, params):
    vars_ = [relax.Var(name, ty) for name, ty in params]
    bb = relax.BlockBuilder()
    with bb.function("main", vars_):
        with bb.dataflow():
            gv = bb.emit_output(body(lambda e, n: bb.emit(e, n), *vars_))
        bb.emit_func_output(gv)
    return bb.get()["main"].body.blocks[0]


def _qkv(emit, x, w0, w1, w2):
    q = emit(relax.op.matmul(x, w0), "q")
    k = emit(relax.op.matmul(x, w1), "k")
    v = emit(relax.op.matmul(x, w2), "v")
    return relax.op.add(emit(relax.op.multiply(q, k), "qk"), v)


QKV = (("x", X), ("w0", WT), ("w1", WT), ("w2", WT))


def test_match_dfb_gives_each_node_the_var_it_matched_in_binding_order():
    with pk.PatternContext() as ctx:
        inp = pk.wildcard()
        matmuls = [pk.is_op("relax.matmul")(inp, pk.wildcard()) for _ in range(3)]
    found = ctx.match_dfb(_block(_qkv, QKV))
    assert found[inp].name == "x"
    assert [found[m].name for m in matmuls] == ["q", "k", "v"]


def test_match_dfb_is_none_when_the_graph_does_not_occur():
    with pk.PatternContext() as ctx:
        pk.is_op("relax.nn.relu")(pk.wildcard())
    assert match_dfb(ctx, _block(_qkv, QKV)) is None


def test_a_consumer_needs_a_reader_of_its_producer():
    def body(emit, x, w0, w1):  # two matmuls, of two different inputs
        a = emit(relax.op.matmul(x, w0), "a")
        return relax.op.add(a, emit(relax.op.matmul(a, w1), "b"))

    with pk.PatternContext() as ctx:
        inp = pk.wildcard()
        first = pk.is_op("relax.matmul")(inp, pk.wildcard())
        second = pk.is_op("relax.matmul")(inp, pk.wildcard())
    assert ctx.match_dfb(_block(body, (("x", X), ("w0", relax.TensorType((8, 8), "float32")),
                                       ("w1", relax.TensorType((8, 8), "float32"))))) is None
    with pk.PatternContext() as chained:
        first = pk.is_op("relax.matmul")(pk.wildcard(), pk.wildcard())
        second = pk.is_op("relax.matmul")(first, pk.wildcard())
    found = chained.match_dfb(_block(body, (("x", X), ("w0", relax.TensorType((8, 8), "float32")),
                                            ("w1", relax.TensorType((8, 8), "float32")))))
    assert (found[first].name, found[second].name) == ("a", "b")


def test_match_dfb_wants_a_binding_block():
    with pk.PatternContext() as ctx:
        pk.is_op("relax.matmul")(pk.wildcard(), pk.wildcard())
    with pytest.raises(pk.PatternError, match="binding block, found Var"):
        ctx.match_dfb(relax.Var("x", X))


def test_matching_a_context_loads_no_engine_module():
    code = ("import sys\nfrom tvm import relax\nimport patternkit.dpl as dpl\n"
            "x = relax.Var('x', relax.TensorType((2, 2), 'float32'))\n"
            "bb = relax.BlockBuilder()\n"
            "with bb.function('main', [x]):\n"
            "    with bb.dataflow():\n"
            "        gv = bb.emit_output(relax.op.nn.relu(x))\n"
            "    bb.emit_func_output(gv)\n"
            "with dpl.PatternContext() as ctx:\n"
            "    relu = dpl.is_op('relax.nn.relu')(dpl.wildcard())\n"
            "assert ctx.match_dfb(bb.get()['main'].body.blocks[0])[relu].name == 'gv'\n"
            "assert not [m for m in sys.modules if m.startswith('patternkit.engine')]\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
