"""A rule file of the new kinds, as ``--patterns`` loads it: a rule by example, a TVM
rewriter, and rule classes that are never instantiated in the file."""

from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit.engine.from_rewriter import from_rewriter
from patternkit.verification import rule_by_example

hardswish = rule_by_example(
    "user.hardswish", lambda x: x * relax.op.clip(x + relax.const(3.0, "float32"), 0.0, 6.0)
    / relax.const(6.0, "float32"),
    lambda x: x * relax.op.minimum(relax.op.nn.relu(x + relax.const(3.0, x.ty.dtype)),
                                   relax.const(6.0, x.ty.dtype))
    / relax.const(6.0, x.ty.dtype), dtypes=("float32",))


@I.ir_module
class _MinusNegative:
    @R.function
    def pattern(x: R.Tensor, y: R.Tensor):
        return R.subtract(x, R.negative(y))

    @R.function
    def replacement(x: R.Tensor, y: R.Tensor):
        return R.add(x, y)


minus_negative = from_rewriter(_MinusNegative, name="user.minus_negative")


class DropDoubleNegation(pk.RewriteRule):
    """``-(-x)`` -> ``x``; only the class is defined: the loader builds it."""

    name = "user.double_negation"

    def __init__(self):
        super().__init__()
        self.x = pk.wildcard()
        self.pattern = pk.is_op("negative")(pk.is_op("negative")(self.x))

    def rewrite(self, match):
        return match.x


class ScaleBy(pk.RewriteRule):
    """A rule that needs an argument: not built by the loader, only by name with one."""

    name = "user.scale_by"

    def __init__(self, factor):
        super().__init__()
        self.factor = factor
        self.pattern = pk.is_op("multiply")(pk.wildcard(), pk.wildcard())

    def rewrite(self, match):
        return None
