"""``current_module()``: a rule's check sees the module ``rewrite`` was given (to read a
``call_tir``'s PrimFunc), only for the length of the call, and nested scopes restore it."""

from __future__ import annotations

import tvm
from tvm import relax

import patternkit as pk
from patternkit.engine import current_module, module_in_scope


class SeesTheModule(pk.RewriteRule):
    """exp(w) -> sigmoid(w), recording the module in scope at each check."""

    name = "test.sees_the_module"

    def __init__(self):
        super().__init__()
        self.w = pk.wildcard()
        self.pattern = pk.is_op("relax.exp")(self.w)
        self.seen: list = []

    def check(self, match):
        self.seen.append(current_module())
        return True

    def rewrite(self, match):
        return relax.op.sigmoid(match.w)


def _exp_module() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    return pk.from_expr(relax.op.exp(x))


def test_a_check_sees_the_module_rewrite_was_given_and_only_during_the_call():
    mod = _exp_module()
    rule = SeesTheModule()
    assert current_module() is None
    pk.rewrite(rule, mod)
    assert len(rule.seen) == 1 and rule.seen[0].same_as(mod)
    assert current_module() is None


def test_nested_scopes_restore_the_outer_module():
    outer, inner = _exp_module(), _exp_module()
    with module_in_scope(outer):
        rule = SeesTheModule()
        pk.rewrite(rule, inner)  # a rewrite inside another rule's scope
        assert rule.seen[0].same_as(inner)
        assert current_module().same_as(outer)
    assert current_module() is None
