"""pk.training.gradient: models with fused ops differentiate, and bad input is named."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit import training
from patternkit.errors import GradientError
from patternkit.patterns import EXPANSIONS
from patternkit.training import GradientReport, check_gradients, gradient, with_loss
from patternkit.verification.numeric import build


def ops_of(func: relax.Function) -> set[str]:
    return {b.value.op.name for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)}


@pytest.mark.parametrize("training_flag", [False, True])
def test_batch_norm_differentiates_with_its_own_training_flag(training_flag, batch_norm_loss,
                                                              seed_inputs):
    mod = batch_norm_loss(training_flag)
    report = GradientReport()
    grad = gradient(mod, report=report)
    assert report.expanded == {"relax.nn.batch_norm": 1}
    assert relax.analysis.check_well_formed(grad)
    assert "relax.nn.batch_norm" not in ops_of(grad["main_adjoint"])
    result = check_gradients(mod, grad, inputs=seed_inputs())
    assert result.ok, result
    assert [p.name for p in result.parameters] == [p.name for p in mod["main"].params]


def test_the_two_training_flags_give_different_gradients(batch_norm_loss, seed_inputs):
    """What DecomposeOpsForTraining gets wrong: it uses batch statistics for both."""
    inputs = seed_inputs()
    grads = {}
    for flag in (False, True):
        mod = batch_norm_loss(flag)
        vm = build(gradient(mod, wrt=["data"]))
        grads[flag] = vm["main_adjoint"](*[tvm.runtime.tensor(a) for a in inputs])[1][0].numpy()
    assert not np.allclose(grads[False], grads[True], atol=1e-3)


def test_the_primal_function_keeps_its_fused_op_and_the_input_is_untouched(batch_norm_loss):
    mod = batch_norm_loss(False)
    before = mod.script()
    grad = gradient(mod)
    assert mod.script() == before
    assert tvm_ffi.structural_equal(grad["main"], mod["main"])
    assert "relax.nn.batch_norm" in ops_of(grad["main"])


def test_wrt_selects_and_orders_the_gradients(batch_norm_loss, seed_inputs):
    mod = batch_norm_loss(False)
    grad = gradient(mod, wrt=["bn_gamma", "data"])
    result = check_gradients(mod, grad, inputs=seed_inputs())
    assert [p.name for p in result.parameters] == ["bn_gamma", "data"]
    assert result.ok, result


@I.ir_module
class LayerNormGeluLike:
    """layer_norm, erf and rsqrt, which Relax cannot differentiate."""

    @R.function
    def main(x: R.Tensor((2, 4, 8), "float32"), w: R.Tensor((8,), "float32"),
             b: R.Tensor((8,), "float32")) -> R.Tensor((), "float32"):
        with R.dataflow():
            ln = R.nn.layer_norm(x, w, b, axes=[-1], epsilon=1e-5)
            e = R.erf(ln)
            sq = R.multiply(x, x)
            r = R.rsqrt(R.add(sq, R.const(1.0, "float32")))
            y = R.multiply(e, r)
            loss = R.sum(y)
            R.output(loss)
        return loss


@pytest.mark.parametrize("expander", ["layernorm.expand", "tvm"])
def test_layer_norm_erf_and_rsqrt_differentiate_against_finite_differences(expander):
    report = GradientReport()
    # The library's rule writes layer_norm out; without it, DecomposeOpsForTraining does.
    expansions = None if expander == "layernorm.expand" else EXPANSIONS.by_prefix("batchnorm.")
    grad = gradient(LayerNormGeluLike, expansions=expansions, report=report)
    assert report.decomposed_by_tvm == (expander == "tvm")
    assert report.expansion_log.count("layernorm.expand") == (expander != "tvm")
    assert report.expanded == {"relax.nn.layer_norm": 1}  # erf and rsqrt gained gradients
    assert training.has_gradient("relax.erf") and training.has_gradient("relax.rsqrt")
    result = check_gradients(LayerNormGeluLike, grad, seed=3)
    assert result.ok, result


def test_with_loss_sums_a_tensor_output_into_a_scalar():
    x = relax.Var("x", relax.TensorType((3, 5), "float32"))
    w = relax.Var("w", relax.TensorType((5, 2), "float32"))
    mod = pk.from_expr(relax.op.nn.relu(relax.op.matmul(x, w)))
    with_sum = with_loss(mod)
    assert relax.analysis.check_well_formed(with_sum)
    grad = gradient(with_sum, func="main_loss", wrt=["w"])
    result = check_gradients(with_sum, grad, func="main_loss", seed=1)
    assert result.ok, result
    assert [p.name for p in result.parameters] == ["w"]


@I.ir_module
class Conv1d:
    @R.function
    def main(x: R.Tensor((1, 2, 8), "float32"), w: R.Tensor((3, 2, 3), "float32")
             ) -> R.Tensor((), "float32"):
        with R.dataflow():
            y = R.nn.conv1d(x, w)
            loss = R.sum(y)
            R.output(loss)
        return loss


def test_an_op_without_gradient_or_expansion_is_named_with_its_binding():
    before = Conv1d.script()
    with pytest.raises(GradientError,
                       match=r"relax\.nn\.conv1d \(1x, e\.g\. main: y = R\.nn\.conv1d"):
        gradient(Conv1d)
    assert Conv1d.script() == before


def test_a_wrt_name_that_is_not_a_parameter_is_refused(batch_norm_loss):
    with pytest.raises(GradientError, match=r"wrt names \['weight'\] are not parameters"):
        gradient(batch_norm_loss(False), wrt=["data", "weight"])


def test_a_function_without_a_scalar_loss_is_refused():
    x = relax.Var("x", relax.TensorType((3,), "float32"))
    with pytest.raises(GradientError, match="must return a scalar loss"):
        gradient(pk.from_expr(relax.op.exp(x)))


def test_a_missing_function_is_refused(batch_norm_loss):
    with pytest.raises(GradientError, match="has no function 'forward'"):
        gradient(batch_norm_loss(False), func="forward")


def test_gradient_is_importable_from_the_package():
    assert pk.training.gradient is training.gradient


def test_collapse_forward_reports_its_collapses_and_keeps_the_gradients(batch_norm_loss,
                                                                        seed_inputs):
    """The batch norm's forward value comes from the fused call again, the numbers stay."""
    mod = batch_norm_loss(False)
    report = GradientReport()
    grad = gradient(mod, collapse_forward=True, report=report)
    assert report.collapsed is not None and report.restored is not None
    assert relax.analysis.check_well_formed(grad)
    assert report.restored.restored == {"relax.nn.batch_norm": 1}
    assert "relax.nn.batch_norm" in ops_of(grad["main_adjoint"])
    result = check_gradients(mod, grad, inputs=seed_inputs())
    assert result.ok, result


def test_a_gradient_tvm_cannot_take_is_a_gradient_error_naming_the_cure():
    from tvm.script import ir as I, relax as R, tirx as T

    @I.ir_module
    class Flattened:
        @R.function
        def main(x: R.Tensor(("n", 4), "float32"), w: R.Tensor((4, 4), "float32")):
            n = T.int64()
            with R.dataflow():
                loss = R.sum(R.reshape(R.matmul(x, w), R.shape([n * 4])))
                R.output(loss)
            return loss

    with pytest.raises(GradientError, match="bind_symbolic_vars"):
        gradient(Flattened, wrt=["w"])
    bound = tvm.IRModule({"main": Flattened["main"].bind_symbolic_vars({"n": 3})})
    assert "main_adjoint" in [gv.name_hint for gv in gradient(bound, wrt=["w"]).get_global_vars()]


def test_an_embedding_taken_with_batched_ids_differentiates():
    # TVM's ONNX importer takes an embedding with the (batch, seq) ids themselves, and
    # TVM 0.27 legalises take's gradient for 1-d indices only; the ids are flattened in
    # the differentiated copy, and the integer ops of the index wrap need no gradient
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class Embedded:
        @R.function
        def main(ids: R.Tensor((2, 3), "int64"), table: R.Tensor((5, 4), "float32"),
                 w: R.Tensor((4,), "float32")):
            with R.dataflow():
                rows = R.shape_to_tensor(R.shape_of(table))
                negative = R.less(ids, R.const(0, "int64"))
                wrapped = R.where(negative, R.add(ids, R.take(rows, R.const(0, "int64"))), ids)
                loss = R.sum(R.multiply(R.take(table, wrapped, axis=0), w))
                R.output(loss)
            return loss

    grad = gradient(Embedded, wrt=["table", "w"])
    assert "main" in [gv.name_hint for gv in grad.get_global_vars()]
    tvm.ir.assert_structural_equal(grad["main"], Embedded["main"])  # the primal as it was
    ids = np.array([[0, 4, 2], [4, 4, 1]], "int64")
    rng = np.random.default_rng(0)
    inputs = [ids, rng.standard_normal((5, 4)).astype("float32"),
              rng.standard_normal(4).astype("float32")]
    result = check_gradients(Embedded, grad, inputs=inputs)
    assert result.ok, result
