"""TVM 0.27 bug: tvm-ffi's JSON graph serialisation crashes on Relax types (docs/tvm-bugs.md).

Each case runs in a child process: the crash is a segmentation fault, not an exception.
When a release fixes it the test passes, the strict xfail turns that into a failure,
and the entry can be retired.  The control shows that the child
process and the round trip themselves work (an ``Op`` and a ``Shape`` serialise), so the
xfail fails for the bug and not for the harness.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_ROUND_TRIP = textwrap.dedent("""
    import tvm, tvm_ffi
    from tvm import relax
    from tvm_ffi.serialization import from_json_graph_str, to_json_graph_str
    for obj in [{objects}]:
        for save, load in [(to_json_graph_str, from_json_graph_str),
                           (tvm.ir.save_json, tvm.ir.load_json)]:
            assert tvm_ffi.structural_equal(load(save(obj)), obj), save(obj)
""")


def _round_trip_in_child(*objects: str) -> subprocess.CompletedProcess:
    """Round-trip ``objects`` (Python expressions) through both serialisers in a child
    (one child per test: each starts TVM, which takes seconds)."""
    code = _ROUND_TRIP.format(objects=", ".join(objects))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def test_objects_without_a_relax_type_round_trip():
    child = _round_trip_in_child('tvm.ir.Op.get("relax.add")', "tvm_ffi.Shape([2, 3])")
    assert child.returncode == 0, child.stderr[-2000:]


@pytest.mark.xfail(strict=True, reason="TVM 0.27's JSON graph serialisation (tvm-ffi "
                                       "ToJSONGraph) crashes the interpreter on a Relax "
                                       "type (SIGSEGV)")
def test_a_relax_type_and_var_round_trip_through_json():
    child = _round_trip_in_child('relax.TensorType((2, 3), "float32")',
                                 'relax.Var("x", relax.TensorType((2, 3), "float32"))')
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
