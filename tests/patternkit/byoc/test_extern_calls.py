"""Calls to extern (packed) functions stay on the host while the rest is partitioned.

A model that calls a registered function (``R.call_pure_packed``, ``R.call_dps_packed``,
``R.call_packed``), as importers and users' own probes do, used to stop
``PartitionGraph`` inside TVM's ``MergeCompositeFunctions`` ("Do not have a default for
relax.expr.ExternFunc").  The functions are registered here, so the partitioned module,
its external functions inlined back, builds for llvm and calls them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

from patternkit.app.cli import main
from patternkit.byoc import (
    MergeComposite,
    PartitionGraph,
    composite_counts,
    external_functions,
    inline_external,
)
from patternkit.dpl.pattern import is_op, wildcard

#: One composite per conv2d -> relu chain.
CONV_RELU = [("cc.conv_relu", is_op("relax.nn.relu")(is_op("relax.nn.conv2d")(wildcard(),
                                                                                wildcard())))]


@tvm.register_global_func("patternkit_test.scale_shift", override=True)
def _scale_shift(x):
    """A pure probe that changes the numbers, so a result that skipped it would differ."""
    return tvm.runtime.tensor(x.numpy() * 0.5 + 1.0)


@tvm.register_global_func("patternkit_test.square_into", override=True)
def _square_into(x, out):
    """Destination-passing style: writes ``x * x`` into ``out``."""
    out.copyfrom(x.numpy() * x.numpy())


WEIGHT = np.random.default_rng(0).standard_normal((4, 4, 1, 1)).astype("float32") * 0.5


@I.ir_module
class ProbedConvs:
    """Two conv -> relu chains with extern calls between them, in one dataflow block."""

    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
             ) -> R.Tensor((1, 4, 8, 8), "float32"):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            r = R.nn.relu(c)
            p = R.call_pure_packed("patternkit_test.scale_shift", r,
                                   ty_args=R.Tensor((1, 4, 8, 8), "float32"))
            d = R.call_dps_packed("patternkit_test.square_into", (p,),
                                  out_ty=R.Tensor((1, 4, 8, 8), "float32"))
            c2 = R.nn.conv2d(d, R.const(WEIGHT))
            s = R.nn.relu(c2)
            R.output(s)
        return s


@I.ir_module
class ImpureProbe:
    """An impure ``R.call_packed`` between two dataflow blocks (it cannot be in one)."""

    @R.function(pure=False)
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
             ) -> R.Tensor((1, 4, 8, 8), "float32"):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            r = R.nn.relu(c)
            R.output(r)
        p = R.call_packed("patternkit_test.scale_shift", r,
                          ty_args=R.Tensor((1, 4, 8, 8), "float32"))
        with R.dataflow():
            c2 = R.nn.conv2d(p, R.const(WEIGHT))
            s = R.nn.relu(c2)
            R.output(s)
        return s


def _host_calls(func: relax.Function) -> list[str]:
    """What ``func`` calls, in order: operator names, global function names, extern symbols."""
    out = []
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not isinstance(value, relax.Call):
                continue
            op = value.op
            if isinstance(op, tvm.ir.Op):
                name = op.name
                if name in ("relax.call_pure_packed", "relax.call_dps_packed"):
                    name += ":" + value.args[0].global_symbol
                out.append(name)
            elif isinstance(op, relax.ExternFunc):
                out.append("extern:" + op.global_symbol)
            else:
                out.append(op.name_hint)
    return out


@pytest.mark.parametrize("semantics", ["relay", "tvm"])
def test_extern_calls_stay_on_the_host_and_the_convolutions_around_them_partition(
        semantics, bit_exact):
    before = ProbedConvs.script()
    out = PartitionGraph("cc")(MergeComposite(CONV_RELU, semantics=semantics)(ProbedConvs))
    assert relax.analysis.check_well_formed(out)
    externals = sorted(external_functions(out, "cc"))
    assert len(externals) == 2
    assert composite_counts(out) == {"cc.conv_relu": 2}
    calls = _host_calls(out["main"])
    assert calls[1:3] == ["relax.call_pure_packed:patternkit_test.scale_shift",
                          "relax.call_dps_packed:patternkit_test.square_into"]
    assert {calls[0], calls[3]} == set(externals)
    bit_exact(ProbedConvs, inline_external(out))
    assert ProbedConvs.script() == before  # the user's module is left as it was


def test_an_impure_packed_call_outside_dataflow_stays_on_the_host(bit_exact):
    out = PartitionGraph("cc")(MergeComposite(CONV_RELU)(ImpureProbe))
    assert relax.analysis.check_well_formed(out)
    assert len(external_functions(out, "cc")) == 2
    assert "extern:patternkit_test.scale_shift" in _host_calls(out["main"])
    bit_exact(ImpureProbe, inline_external(out))


MODEL_FILE = '''
import numpy as np
import tvm
from tvm.script import ir as I, relax as R


@tvm.register_global_func("patternkit_test.file_probe", override=True)
def _probe(x):
    return tvm.runtime.tensor(x.numpy() * 0.5 + 1.0)


@I.ir_module
class mod:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
             b: R.Tensor((1, 4, 1, 1), "float32"), w2: R.Tensor((4, 4, 3, 3), "float32"),
             ) -> R.Tensor((1, 4, 8, 8), "float32"):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            a = R.add(c, b)
            r = R.nn.relu(a)
            p = R.call_pure_packed("patternkit_test.file_probe", r,
                                   ty_args=R.Tensor((1, 4, 8, 8), "float32"))
            c2 = R.nn.conv2d(p, w2, padding=[1, 1, 1, 1])
            a2 = R.add(c2, b)
            r2 = R.nn.relu(a2)
            R.output(r2)
        return r2
'''


def test_patternkit_run_partitions_a_model_file_that_calls_a_registered_function(tmp_path):
    model = tmp_path / "probed.py"
    model.write_text(MODEL_FILE)
    out = tmp_path / "out"
    assert main(["run", str(model), "--out", str(out), "--no-draw", "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] and report["numeric"]["ok"]
    assert report["composites"] == {"ccompiler.conv2d_add_relu": 2}
    assert model.read_text() == MODEL_FILE
