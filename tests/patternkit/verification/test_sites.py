"""Per-site translation validation: every rewrite is run on its own, on the values the
model feeds it and on adversarial draws, and a wrong one is named."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import patternkit as pk
from patternkit.patterns import LIBRARY
from patternkit.patterns.batchnorm import BatchnormCollapse
from patternkit.verification import numeric
from patternkit.verification.sites import judge, plan_sites, validate_sites


def _f32(shape):
    return relax.TensorType(shape, "float32")


def _batchnorm_chain(layers: int) -> tvm.IRModule:
    """``layers`` written-out batch norms, each with its own parameters."""
    x = relax.Var("x", _f32((2, 3, 4, 4)))
    params = [x]
    out = x
    for i in range(layers):
        gamma, beta, mean, var = (relax.Var(f"{n}{i}", _f32((3, 1, 1)))
                                  for n in ("gamma", "beta", "mean", "var"))
        params += [gamma, beta, mean, var]
        out = gamma * (out - mean) / relax.op.sqrt(var + relax.const(1e-5, "float32")) + beta
        out = relax.op.nn.relu(out)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            result = bb.emit_output(out)
        bb.emit_func_output(result)
    return relax.transform.Normalize()(bb.get())


class ScaledSoftmax(pk.DFPatternCallback):
    """A wrong rule: ``softmax(x) -> softmax(x) * factor``."""

    name = "demo.scaled_softmax"

    def __init__(self, factor: float):
        super().__init__(rewrite_once=True)
        self.factor = factor
        self.x = pk.wildcard()
        self.pattern = pk.is_op("nn.softmax")(self.x)

    def callback(self, pre, post, node_map):
        return relax.op.multiply(relax.op.nn.softmax(node_map[self.x][0], axis=-1),
                                 relax.const(self.factor, "float32"))


def _tiny_softmax_model() -> tvm.IRModule:
    """A model whose outputs are tiny: softmax over 512 keys, scaled down by 1e-3."""
    x = relax.Var("x", _f32((2, 512)))
    return pk.from_expr(relax.op.multiply(relax.op.nn.softmax(x, axis=-1),
                                          relax.const(1e-3, "float32")))


def test_a_correct_rewrite_passes_on_the_real_values_and_the_adversarial_draws():
    mod = _batchnorm_chain(1)
    text = mod.script()
    log = pk.RewriteLog()
    after = pk.rewrite(BatchnormCollapse(), mod, log=log)
    inputs = numeric.random_inputs(mod["main"], seed=1, positive=("var",))
    report = validate_sites(mod, after, log, inputs=inputs)
    (site,) = report.sites
    assert (site.rule, site.function, site.status) == ("batchnorm.collapse", "main", "pass")
    assert site.inputs[0].startswith("real values at") and site.inputs[0].endswith("pass")
    assert any(label.startswith("wide") for label in site.inputs)
    assert site.max_rel_error < 1e-5  # relative to the output's scale (wide draws: 1e4)
    assert report.ok and report.by_rule() == {"batchnorm.collapse": {
        "sites": 1, "validated": 1, "failed": 0, "not_run": 0}}
    assert mod.script() == text  # the user's module is left as it was


@pytest.mark.parametrize("factor", [1.5, 1.01])
def test_a_wrong_rewrite_fails_where_the_whole_model_comparison_misses_it(factor):
    mod = _tiny_softmax_model()
    log = pk.RewriteLog()
    after = pk.rewrite(ScaledSoftmax(factor), mod, log=log)
    inputs = numeric.random_inputs(mod["main"])
    # the model's outputs (about 2e-6) are far below an absolute atol of 1e-4
    whole = numeric.compare_outputs(numeric.run(mod, inputs), numeric.run(after, inputs),
                                    rtol=1e-4, atol=1e-4)
    assert whole.max_abs_error < 1e-4
    report = validate_sites(mod, after, log, inputs=inputs)
    (site,) = report.failures
    assert site.rule == "demo.scaled_softmax" and site.function == "main"
    assert site.binding == log.records[0].root
    assert "real values" in site.reason and "off" in site.reason
    assert not report.ok
    assert "FAIL demo.scaled_softmax at main:" in str(report)


def test_identical_sites_are_built_once_and_run_on_every_duplicates_values():
    mod = _batchnorm_chain(3)
    log = pk.RewriteLog()
    after = pk.rewrite(BatchnormCollapse(), mod, log=log)
    assert log.count() == 3
    report = validate_sites(mod, after, log,
                            inputs=numeric.random_inputs(mod["main"], positive=("var",)))
    (site,) = report.sites
    assert len(site.duplicates) == 2 and report.builds == 1
    assert sum(label.startswith("real values at") for label in site.inputs) == 3
    assert report.by_rule()["batchnorm.collapse"]["validated"] == 3


def test_a_site_of_a_symbolic_dimension_is_cut_out_as_is_and_run_with_it_bound_to_one():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", _f32((n, 3, 4, 4)))
    gamma, beta, mean, var = (relax.Var(name, _f32((3, 1, 1)))
                              for name in ("gamma", "beta", "mean", "var"))
    mod = pk.from_expr(gamma * (x - mean) / relax.op.sqrt(var + relax.const(1e-5, "float32"))
                       + beta)
    log = pk.RewriteLog()
    after = pk.rewrite(BatchnormCollapse(), mod, log=log)
    # a size that stands alone in an input's shape: the region's inputs, no sizes argument
    (region,) = [regions[0] for regions in plan_sites(mod, log).groups]
    assert len(region.before.params) == len(region.after.params) == len(region.inputs)
    assert all(isinstance(p.ty, relax.TensorType) for p in region.before.params)
    report = validate_sites(mod, after, log)  # no inputs: adversarial draws only
    (site,) = report.sites
    assert site.status == "pass"
    assert "uniform [0.5, 1.5], every symbolic dimension 1: pass" in site.inputs
    assert not any(label.startswith("real values at") for label in site.inputs)


def test_a_multi_root_rewrite_is_validated_on_the_vars_it_kept():
    x = relax.Var("x", _f32((4, 8)))
    ws = [relax.Var(f"w{i}", _f32((8, 8))) for i in range(3)]
    bb = relax.BlockBuilder()
    with bb.function("main", [x, *ws]):
        with bb.dataflow():
            outs = [bb.emit(relax.op.matmul(x, w)) for w in ws]
            result = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(result)
    mod = bb.get()
    log = pk.RewriteLog()
    rule = LIBRARY["matmul.combine_parallel"]
    after = pk.rewrite(rule, mod, log=log)
    assert log.count() >= 1
    report = validate_sites(mod, after, log, inputs=numeric.random_inputs(mod["main"]))
    (site,) = report.sites
    assert (site.rule, site.status) == ("matmul.combine_parallel", "pass")
    assert site.inputs[0] == f"real values at {site.binding}: pass"
    assert report.ok


def test_judge_takes_no_weak_evidence():
    zeros = [np.zeros((4, 4), "float32")]
    assert judge(zeros, zeros, 1e-5, 1e-5).verdict == "inconclusive"
    constant = [np.full((4,), 0.25, "float32")]
    assert judge(constant, constant, 1e-5, 1e-5).verdict == "inconclusive"
    assert judge(constant, [c * 1.5 for c in constant], 1e-5, 1e-5).verdict == "fail"
    ref = [np.linspace(-1, 1, 16, dtype="float32")]
    assert judge(ref, ref, 1e-5, 1e-5).verdict == "pass"
    nan = [np.where(np.arange(16) == 3, np.nan, ref[0]).astype("float32")]
    assert judge(ref, nan, 1e-5, 1e-5).verdict == "fail"
    # an overflow of the reference is no evidence against a result that did not overflow
    inf = [np.where(np.arange(16) == 3, np.inf, ref[0]).astype("float32")]
    assert judge(inf, ref, 1e-5, 1e-5).verdict == "pass"
    # near zero, a value is judged against its tensor's scale, not an absolute atol
    small = [ref[0] * 1e-6]
    assert judge(small, [small[0] * 1.01], 1e-5, 1e-5).verdict == "fail"


def test_a_subnormal_reference_is_no_evidence_but_can_still_fail():
    # a random-weight MobileViT's batch-norm sites carry values near 1e-43: below float32's
    # smallest normal number every operation keeps a few bits, and a correct fold differed
    # by 4e-45, which the tensor's own scale called a failure
    ref = (np.random.default_rng(0).standard_normal(64) * 1e-42).astype("float32")
    rounded = ref.copy()
    rounded[3] += np.float32(4e-45)
    found = judge([ref], [rounded], 1e-5, 1e-5)
    assert found.verdict == "inconclusive"
    assert "subnormal" in found.reason and "smallest normal number" in found.reason
    assert judge([ref], [ref + np.float32(1.0)], 1e-5, 1e-5).verdict == "fail"
    # float16's smallest normal number is 6.1e-5: a tensor of scale 1e-6 is subnormal there
    half = (np.linspace(-1, 1, 16) * 1e-6).astype("float16")
    assert judge([half], [half], 1e-3, 1e-3).verdict == "inconclusive"


@pytest.mark.models
@pytest.mark.parametrize("name, options", [("gpt2", {"batch": "dynamic"}), ("llama", {}),
                                           ("resnet18", {}),
                                           # matmul.combine_parallel fires on the ONNX
                                           # export: its q, k, v read one x reshaped thrice
                                           ("onnx:bert", {"opset": 14})])
def test_every_site_of_a_zoo_model_is_validated_on_its_own_values(name, options, zoo):
    model = zoo(name, **options)
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY.rewrite_rules(), model.mod, log=log)
    rules = {r.rule_name: r for r in LIBRARY.rewrite_rules()}
    report = validate_sites(model.mod, after, log,
                            inputs=[np.array(a) for a in model.arguments()],
                            func_name=model.entry,
                            tolerance=lambda rule, dtype: rules[rule].tolerance(dtype))
    assert log.count() > 0
    assert report.ok, str(report)
    counted = report.by_rule()
    assert sum(row["validated"] for row in counted.values()) == log.count()
    assert all(s.inputs[0].startswith("real values at") for s in report.sites)
    # an attention's mask is also drawn with rows that are entirely -inf (padding)
    assert all("rows masked with -inf: pass" in s.inputs for s in report.sites
               if s.rule == "attention.collapse")
    # sizes that stand alone (a dynamic batch) are read off the tensors: the site functions
    # take exactly the region's inputs, no sizes parameter
    regions = [r for group in plan_sites(model.mod, log, model.entry).groups for r in group]
    assert all(not r.sizes and len(r.before.params) == len(r.inputs) for r in regions)
    assert tvm_ffi.structural_equal(model.mod, zoo(name, **options).mod)
