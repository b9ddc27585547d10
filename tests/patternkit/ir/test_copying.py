"""Deep copies of patterns, rules and the library (patternkit.ir.copying)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_DEEPCOPIES = textwrap.dedent("""
    import copy
    import tvm_ffi
    from tvm import relax
    import patternkit as pk
    from patternkit.dpl import is_expr, wildcard
    from patternkit.engine import RewriteRule
    from patternkit.patterns import LIBRARY

    class AddOne(RewriteRule):  # a user rule keeping a Relax constant
        name = "user.add_one"

        def __init__(self):
            super().__init__()
            self.one = relax.const(1.0, "float32")
            self.x = wildcard()
            self.pattern = self.x + is_expr(self.one)

        def rewrite(self, match):
            return relax.op.add(match.x, self.one)

    rule = AddOne()
    twin = copy.deepcopy(rule)
    print(twin.one is rule.one, twin.x is not rule.x, twin.pattern.args[0] is twin.x)

    library = copy.deepcopy(LIBRARY)
    first = LIBRARY.names[0]
    print(library.names == LIBRARY.names, library[first] is not LIBRARY[first])
    name = "attention.collapse"
    mod = LIBRARY[name].example()
    print(tvm_ffi.structural_equal(pk.rewrite([library[name]], mod),
                                   pk.rewrite([LIBRARY[name]], mod)))
""")


def test_patterns_rules_and_the_library_deep_copy_sharing_their_tvm_objects():
    # TVM 0.27 copies a Relax constant through save_json, which segfaults
    # (docs/tvm-bugs.md): copy.deepcopy(LIBRARY) killed the process.  In a child
    # process, so that a regression fails this test instead of the test run.
    child = subprocess.run([sys.executable, "-c", _DEEPCOPIES], capture_output=True, text=True,
                           timeout=600)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == ["True"] * 6
