"""A deliberately wrong rule the job tests run to see a failing site reported."""

from tvm import relax

import patternkit as pk


class ScaledSoftmax(pk.DFPatternCallback):
    """A wrong rule: ``softmax(x) -> softmax(x) * 1.5``."""

    name = "demo.scaled_softmax"

    def __init__(self):
        super().__init__(rewrite_once=True)
        self.x = pk.wildcard()
        self.pattern = pk.is_op("nn.softmax")(self.x)

    def callback(self, pre, post, node_map):
        return relax.op.multiply(relax.op.nn.softmax(node_map[self.x][0], axis=-1),
                                 relax.const(1.5, "float32"))
