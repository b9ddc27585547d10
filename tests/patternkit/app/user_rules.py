"""A user's own rule file, as ``--patterns user_rules.py`` / ``user_rules.py:NAME`` load it."""

import patternkit as pk


class DropDoubleNegation(pk.RewriteRule):
    """``-(-x)`` -> ``x``."""

    name = "user.double_negation"

    def __init__(self):
        super().__init__()
        self.x = pk.wildcard()
        self.pattern = pk.is_op("negative")(pk.is_op("negative")(self.x))

    def rewrite(self, match):
        return match.x


class DropDoubleRelu(pk.RewriteRule):
    """``relu(relu(x))`` -> ``relu(x)``."""

    name = "user.double_relu"

    def __init__(self):
        super().__init__()
        self.inner = pk.is_op("nn.relu")(pk.wildcard())
        self.pattern = pk.is_op("nn.relu")(self.inner)

    def rewrite(self, match):
        return match.inner


double_negation = DropDoubleNegation()
double_relu = DropDoubleRelu()
BOTH = [double_negation, double_relu]
