"""Per-site validation of sites whose inputs are shaped by an expression of a symbolic size.

A shifted-window attention partitions a dynamic batch ``s`` into ``4 * s`` windows: the
site cut out of it reads tensors shaped ``(4 * s, ...)`` and no tensor shaped ``(s, ...)``,
and TVM's VM cannot read ``s`` off a shape it only sees multiplied.  Such a site takes
``s`` as one more parameter, valued from the model's own values at the site.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import patternkit as pk
from patternkit.engine.tolerance import Tolerance
from patternkit.ir import compat as C
from patternkit.patterns import LIBRARY
from patternkit.patterns.batchnorm import BatchnormCollapse
from patternkit.training.precision import as_float64
from patternkit.verification import numeric
from patternkit.verification.sites import _draws, plan_sites, validate_sites


def _f32(shape):
    return relax.TensorType(shape, "float32")


def _batchnorm_of_merged(x_shape: tuple, merged: list) -> tvm.IRModule:
    """A written-out batch norm on ``x`` (``x_shape``) reshaped to ``merged`` first, its
    leading sizes merged into one.
    """
    x = relax.Var("x", _f32(x_shape))
    gamma, beta, mean, var = (relax.Var(name, _f32((3, 1, 1)))
                              for name in ("gamma", "beta", "mean", "var"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, gamma, beta, mean, var]):
        with bb.dataflow():
            flat = bb.emit(relax.op.reshape(x, relax.ShapeExpr(merged)))
            out = gamma * (flat - mean) / relax.op.sqrt(var + relax.const(1e-5, "float32"))
            result = bb.emit_output(out + beta)
        bb.emit_func_output(result)
    return relax.transform.Normalize()(bb.get())


def _batchnorm_of_windows() -> tvm.IRModule:
    """A written-out batch norm on ``x`` (``(n, 4, 3, 4, 4)``) seen as ``4 * n`` windows."""
    n = tvm.tirx.Var("n", "int64")
    return _batchnorm_of_merged((n, 4, 3, 4, 4), [4 * n, 3, 4, 4])


def _validated_on_real_values(mod: tvm.IRModule, shape_vars: dict[str, int]) -> tuple:
    """``batchnorm.collapse`` on ``mod``, its one site validated on the model's values
    drawn with ``shape_vars``: asserts it passes there first; returns ``(after, log,
    inputs, report)``.
    """
    log = pk.RewriteLog()
    after = pk.rewrite(BatchnormCollapse(), mod, log=log)
    inputs = numeric.random_inputs(mod["main"], seed=1, shape_vars=shape_vars,
                                   positive=("var",))
    report = validate_sites(mod, after, log, inputs=inputs)
    (site,) = report.sites
    assert site.status == "pass", str(site)
    assert site.inputs[0] == f"real values at {site.binding}: pass"
    return after, log, inputs, report


def test_a_site_read_as_a_multiple_of_the_batch_runs_on_its_real_values_and_draws():
    mod = _batchnorm_of_windows()
    text = mod.script()
    _, log, inputs, report = _validated_on_real_values(mod, {"n": 2})
    (site,) = report.sites
    assert "wide [-10000, 10000]: pass" in site.inputs
    assert "uniform [0.5, 1.5], every symbolic dimension 1: pass" in site.inputs
    assert report.builds == 1
    assert mod.script() == text  # the user's module is left as it was

    # the site takes n as a trailing R.Shape([n]); the draws keep n = 2, the real value
    plan = plan_sites(mod, log)
    (region,) = [regions[0] for regions in plan.groups]
    *tensors, carried = region.before.params
    assert isinstance(carried.ty, relax.ShapeType)
    assert [v.name for v in carried.ty.values] == ["n"]
    assert len(tensors) == len(region.inputs)
    given = dict(zip(["gamma", "beta", "mean", "var"], inputs[1:]))
    real = [given.get(C.var_name(x), np.asarray(inputs[0]).reshape(8, 3, 4, 4))
            for x in region.inputs]
    windows = next(i for i, x in enumerate(region.inputs) if len(x.ty.shape) == 4)
    draws = {label: (arrays[windows].shape[0], sizes) for label, arrays, sizes in
             _draws(region, [("real values", real)], seed=0)}
    assert draws["real values"] == (8, {"n": 2})
    assert draws["uniform [-1, 1]"] == draws["zeros"] == (8, {"n": 2})
    assert draws["uniform [-1, 1], every symbolic dimension 1"] == (4, {"n": 1})


def test_a_site_read_as_a_product_of_two_sizes_takes_them_from_the_model_inputs():
    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")
    mod = _batchnorm_of_merged((n, m, 3, 4, 4), [n * m, 3, 4, 4])
    after, log, _, with_inputs = _validated_on_real_values(mod, {"n": 2, "m": 3})
    (site,) = with_inputs.sites
    assert "uniform [0.5, 1.5], every symbolic dimension 1: pass" in site.inputs
    # without the model's inputs, the drawn sizes are passed as they were drawn
    (drawn,) = validate_sites(mod, after, log).sites
    assert drawn.status == "pass" and "uniform [-1, 1]: pass" in drawn.inputs


def test_a_rounding_miss_at_such_a_site_is_measured_against_float64_with_its_sizes():
    mod = _batchnorm_of_windows()
    log = pk.RewriteLog()
    after = pk.rewrite(BatchnormCollapse(), mod, log=log)
    inputs = numeric.random_inputs(mod["main"], seed=1, shape_vars={"n": 2},
                                   positive=("var",))
    exact = lambda rule, dtype: Tolerance(0.0, 0.0, "no rounding allowed")  # noqa: E731
    missed = validate_sites(mod, after, log, inputs=inputs, tolerance=exact)
    assert missed.sites[0].status == "fail"  # the collapsed form rounds differently
    arbitrated = validate_sites(mod, after, log, inputs=inputs, tolerance=exact,
                                widen=lambda func: as_float64(func, "site"))
    (site,) = arbitrated.sites
    assert site.status == "pass" and f"real values at {site.binding}: pass" in site.inputs


class ReluOfReshape(pk.DFPatternCallback):
    """A correct rule: ``relu(reshape(x, shape)) -> reshape(relu(x), shape)``."""

    name = "demo.relu_of_reshape"

    def __init__(self):
        super().__init__(rewrite_once=True)
        self.x = pk.wildcard()
        self.shape = pk.wildcard()
        self.pattern = pk.is_op("nn.relu")(pk.is_op("reshape")(self.x, self.shape))

    def callback(self, pre, post, node_map):
        return relax.op.reshape(relax.op.nn.relu(node_map[self.x][0]), node_map[self.shape][0])


def test_a_site_reading_a_size_no_input_carries_still_says_not_run_with_why():
    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")
    x = relax.Var("x", _f32((n, 4)))
    sizes = relax.Var("sizes", relax.ShapeType([m]))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, sizes]):
        with bb.dataflow():
            seen = bb.emit(relax.op.reshape(x, relax.ShapeExpr([m, 4])))
            result = bb.emit_output(relax.op.nn.relu(seen))
        bb.emit_func_output(result)
    mod = bb.get()
    log = pk.RewriteLog()
    after = pk.rewrite(ReluOfReshape(), mod, log=log)
    assert log.count() == 1
    report = validate_sites(mod, after, log)
    (site,) = report.sites
    assert site.status == "not_run"
    assert site.reason.startswith("the matched region does not build for llvm on its own")
    assert report.ok  # a site that could not run is no failure


@pytest.mark.models
def test_every_cosine_attention_site_of_a_dynamic_batch_swin_v2_runs(zoo):
    model = zoo("swinv2", batch="dynamic")
    rule = LIBRARY["attention.cosine"]
    log = pk.RewriteLog()
    after = pk.rewrite(rule, model.mod, log=log)
    report = validate_sites(model.mod, after, log,
                            inputs=[np.array(a) for a in model.arguments()],
                            func_name=model.entry, rules=[rule],
                            widen=lambda func: as_float64(func, "site"))
    assert report.by_rule() == {"attention.cosine": {"sites": 2, "validated": 2, "failed": 0,
                                                     "not_run": 0}}, str(report)
    assert report.builds == 1  # every site builds in one module again
    for site in report.sites:
        assert site.inputs[0] == f"real values at {site.binding}: pass"
        assert "rows masked with -inf: pass" in site.inputs
    assert tvm_ffi.structural_equal(model.mod, zoo("swinv2", batch="dynamic").mod)
