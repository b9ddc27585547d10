"""If patterns: ``is_if(cond, true_branch, false_branch)`` on Relax ``If`` bindings.

Where matching applies: a Relax ``If`` is bound in an ordinary (not dataflow) block,
since dataflow blocks hold no control flow.  ``is_if`` matches an ``If`` where it is
bound (the rewrite engine's candidates include it) or an ``If`` expression handed to
``match``; each branch pattern matches the branch's result, looking through the
branch's own bindings.  An ``If`` is never looked through as the operand of another
pattern (``add(is_if(...), x)`` does not match ``add(z, x)``): its value depends on
control flow, as a call's does not.
"""

from __future__ import annotations

import pytest
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk


@I.ir_module
class SameOnBothSides:
    @R.function
    def main(x: R.Tensor((4,), "float32"), flag: R.Tensor((), "bool")):
        y = R.exp(x)
        if flag:
            a = R.nn.relu(y)
            z = a
        else:
            z = R.nn.relu(y)
        w = R.add(z, x)
        return w


@I.ir_module
class DifferentSides:
    @R.function
    def main(x: R.Tensor((4,), "float32"), flag: R.Tensor((), "bool")):
        y = R.exp(x)
        if flag:
            z = R.nn.relu(y)
        else:
            z = R.nn.relu(x)
        w = R.add(z, x)
        return w


def _bound(mod, name):
    return next(b for block in mod["main"].body.blocks for b in block.bindings
                if b.var.name == name)


class HoistCommonBranch(pk.DFPatternCallback):
    """``if c: relu(y) else: relu(y)`` is ``relu(y)`` whatever ``c``."""

    def __init__(self):
        super().__init__()
        self.y = pk.wildcard()
        self.pattern = pk.is_if(pk.wildcard(), pk.is_op("nn.relu")(self.y),
                                pk.is_op("nn.relu")(self.y))

    def callback(self, pre, post, node_map):
        return relax.op.nn.relu(node_map[self.y][0])


def test_an_if_matches_through_each_branchs_own_bindings():
    z = _bound(SameOnBothSides, "z")
    cond, y = pk.wildcard(), pk.wildcard()
    pattern = pk.is_if(cond, pk.is_op("nn.relu")(y), pk.is_op("nn.relu")(y))
    found = pk.dpl.find_match(pattern, z.value, SameOnBothSides["main"])
    assert found is not None
    assert found.captures[cond].name == "flag" and found.captures[y].name == "y"
    # the branch bindings live inside the If: no interior binding of the match
    assert found.internal == [] and [e.name for e in found.inputs] == ["flag", "y"]
    assert pk.match(pattern, z.value)  # the If alone: its branches are its own graph


def test_an_if_whose_branches_differ_does_not_match_a_shared_capture():
    z = _bound(DifferentSides, "z")
    y = pk.wildcard()
    same = pk.is_if(pk.wildcard(), pk.is_op("nn.relu")(y), pk.is_op("nn.relu")(y))
    assert not pk.match(same, z.value, DifferentSides["main"])
    either = pk.is_if(pk.wildcard(), pk.is_op("nn.relu")(pk.wildcard()),
                      pk.is_op("nn.relu")(pk.is_var("x")))
    assert pk.match(either, z.value, DifferentSides["main"])
    assert not pk.match(pk.is_if(pk.wildcard(), pk.wildcard(), pk.wildcard()),
                        _bound(DifferentSides, "y").value)


def test_an_if_is_not_looked_through_as_an_operand():
    w = _bound(SameOnBothSides, "w")
    inner = pk.is_if(pk.wildcard(), pk.wildcard(), pk.wildcard())
    assert not pk.match(pk.is_op("add")(inner, pk.wildcard()), w.value,
                        SameOnBothSides["main"])


def test_rewrite_replaces_an_if_binding_and_keeps_the_numbers():
    out = pk.rewrite(HoistCommonBranch(), SameOnBothSides)
    assert not any(isinstance(b.value, relax.If) for block in out["main"].body.blocks
                   for b in block.bindings)
    assert _bound(out, "z").value.op.name == "relax.nn.relu"
    assert relax.analysis.check_well_formed(out)
    pk.assert_same_numerics(SameOnBothSides, out, rtol=0, atol=0)


def test_rewrite_leaves_an_if_that_does_not_match():
    out = pk.rewrite(HoistCommonBranch(), DifferentSides)
    assert isinstance(_bound(out, "z").value, relax.If)
    assert out.script() == DifferentSides.script()


def test_is_if_has_no_tvm_dpl_form():
    with pytest.raises(pk.PatternError, match="IfPattern has no tvm.relax.dpl"):
        pk.is_if(pk.wildcard(), pk.wildcard(), pk.wildcard()).to_dpl()
