"""A user rule the campaign tests record: ``relu(x) -> clip(x, 0, 100)``, wrong above 100
(or, ``right=True``, the correct ``clip(x, 0, inf)``)."""

from tvm import relax

import patternkit as pk


class ReluAsClip(pk.RewriteRule):
    """``relu(x)`` -> ``clip(x, 0, 100)``: right on small values, wrong above 100."""

    name = "user.relu_as_clip"

    def __init__(self, right: bool = False):
        super().__init__()
        self.right = right
        self.x = pk.wildcard()
        self.pattern = pk.is_op("nn.relu")(self.x)

    def rewrite(self, match):
        if self.right:
            return relax.op.clip(match.x, 0, float("inf"))
        return relax.op.clip(match.x, 0, 100)

    @staticmethod
    def example():
        x = relax.Var("x", relax.TensorType((4, 8), "float32"))
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(relax.op.nn.relu(x))
            bb.emit_func_output(out)
        return bb.get()
