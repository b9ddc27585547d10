"""patterns/matmul/fold.py: a BatchNorm1d after a Linear folded into the matmul's constants."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.byoc import composite_functions, merge_composite
from patternkit.patterns import LIBRARY
from patternkit.patterns.matmul import BatchnormFoldIntoMatmul, matmul_table
from patternkit.patterns.matmul.examples import linear_batch_norm
from patternkit.testing import Negative, RuleCase, Tolerance, check_rule
from patternkit.verification.numeric import build as build_for_checks

#: float32: the fold rounds W * s and (b - mean) * s + beta once from float64, batch_norm
#: rounds after each of its steps; outputs are below 10 in magnitude.
F32 = Tolerance(1e-5, 1e-5, "the fold rounds W * s and (b - mean) * s + beta once, from "
                            "float64; batch_norm rounds after every step")
#: float16: the folded weight is rounded to float16 (half an ulp, 2**-11 relative, per
#: product), and the unfolded graph rounds the matmul, the bias add and each batch-norm
#: step to float16: a few float16 ulp of outputs below 8.
F16 = Tolerance(1e-2, 1e-2, "the folded float16 weight and the unfolded graph's float16 "
                            "steps round differently: a few float16 ulp of outputs below 8")
TOLERANCE = {"float32": F32, "float16": F16}

_SCRIPT = '''
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("n", 5, 16), "{dtype}"), w: R.Tensor((8, 16), "{dtype}"),
             b: R.Tensor((8,), "{dtype}"), gamma: R.Tensor((8,), "{dtype}"),
             beta: R.Tensor((8,), "{dtype}"), mean: R.Tensor((8,), "{dtype}"),
             var: R.Tensor((8,), "{dtype}")) -> R.Tensor(("n", 5, 8), "{dtype}"):
        n = T.int64()
        with R.dataflow():
            flat = R.reshape(x, R.shape([n * 5, 16]))
            wt = R.permute_dims(w, axes=[1, 0])
            product = R.matmul(flat, wt)
            biased = R.add(b, product)
            tokens = R.reshape(biased, R.shape([n, 5, 8]))
            rows = R.reshape(tokens, R.shape([n * 5, 8]))
            bn = R.nn.batch_norm(rows, gamma, beta, mean, var, axis=1, epsilon=1e-5,
                                 training=False)
            normed = bn[0]
            out = R.reshape(normed, R.shape([n, 5, 8]))
            R.output(out)
        return out
'''

_EXPECTED = '''
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("n", 5, 16), "{dtype}"), w: R.Tensor((8, 16), "{dtype}"),
             b: R.Tensor((8,), "{dtype}")) -> R.Tensor(("n", 5, 8), "{dtype}"):
        n = T.int64()
        with R.dataflow():
            flat = R.reshape(x, R.shape([n * 5, 16]))
            wt = R.permute_dims(w, axes=[1, 0])
            product = R.matmul(flat, wt)
            biased = R.add(product, b)
            tokens = R.reshape(biased, R.shape([n, 5, 8]))
            rows = R.reshape(tokens, R.shape([n * 5, 8]))
            out = R.reshape(rows, R.shape([n, 5, 8]))
            R.output(out)
        return out
'''


def _bind(mod: tvm.IRModule, **arrays: np.ndarray) -> tvm.IRModule:
    return relax.transform.BindParams("main", {k: tvm.runtime.tensor(v)
                                               for k, v in arrays.items()})(mod)


def _parameters(dtype: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": (rng.standard_normal((8, 16)) / 4).astype(dtype),
            "b": rng.standard_normal(8).astype(dtype),
            "gamma": rng.uniform(0.5, 1.5, 8).astype(dtype),
            "beta": rng.standard_normal(8).astype(dtype),
            "mean": rng.standard_normal(8).astype(dtype),
            "var": rng.uniform(0.5, 2.0, 8).astype(dtype)}


def _folded(p: dict[str, np.ndarray], eps: float = 1e-5) -> dict[str, np.ndarray]:
    """The definition of the fold, in float64 rounded once: each output feature's weight row
    times s = gamma / sqrt(var + eps), and (b - mean) * s + beta."""
    f64 = {k: v.astype("float64") for k, v in p.items()}
    scale = f64["gamma"] / np.sqrt(f64["var"] + eps)
    dtype = p["w"].dtype
    return {"w": (f64["w"] * scale[:, None]).astype(dtype),
            "b": ((f64["b"] - f64["mean"]) * scale + f64["beta"]).astype(dtype)}


def _int8_matmul_batch_norm() -> tvm.IRModule:
    """An int8 matmul accumulated in float32 and normalised: no float weight to scale."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((4, 16), "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(rng.integers(-4, 4, (16, 8)), "int8"),
                                        out_dtype="float32"))
            stats = [relax.const(rng.uniform(0.5, 1.5, 8), "float32") for _ in range(4)]
            bn = bb.emit(relax.op.nn.batch_norm(y, *stats, axis=1, training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    return bb.get()


def _matmul_batch_norm(weight: np.ndarray, permute: list[int] | None = None,
                       x_shape=(2, 5, 16), cast_to: str | None = None,
                       dtype: str = "float32") -> tvm.IRModule:
    """``matmul(x, [permute_dims] W) [-> astype] -> batch_norm`` over the last axis."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType(x_shape, dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            rhs = relax.const(weight.astype(dtype))
            if permute is not None:
                rhs = bb.emit(relax.op.permute_dims(rhs, permute))
            y = bb.emit(relax.op.matmul(x, rhs, out_dtype="float32" if cast_to else None))
            if cast_to:
                y = bb.emit(relax.op.astype(y, cast_to))
            size = int(y.ty.shape[-1])
            stats = [relax.const(rng.uniform(0.5, 1.5, size), str(y.ty.dtype)) for _ in range(4)]
            bn = bb.emit(relax.op.nn.batch_norm(y, *stats, axis=len(y.ty.shape) - 1,
                                                training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    return bb.get()


def _bias_along_the_rows() -> tvm.IRModule:
    """Eight rows and eight features: a ``(8, 1)`` bias has one value per row, not per
    feature; folding it as a per-feature bias would change the numbers."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((16, 8)), "float32")))
            y = bb.emit(relax.op.add(y, relax.const(rng.standard_normal((8, 1)), "float32")))
            stats = [relax.const(rng.uniform(0.5, 1.5, 8), "float32") for _ in range(4)]
            bn = bb.emit(relax.op.nn.batch_norm(y, *stats, axis=1, training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    return bb.get()


def _weight_not_constant() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    w = relax.Var("w", relax.TensorType((16, 8), "float32"))
    stats = (relax.const(np.ones(8, "float32")) for _ in range(4))
    return pk.from_expr(relax.TupleGetItem(relax.op.nn.batch_norm(
        relax.op.matmul(x, w), *stats, axis=1, training=False), 0))


NEGATIVES = [
    Negative("training_mode", linear_batch_norm(training=True),
             "batch_norm is in training mode (batch statistics)"),
    Negative("batch_norm_over_the_rows", linear_batch_norm(form="flat", bn_axis="rows"),
             "batch_norm axis 0 is not the last axis of its input (8, 8), which holds the "
             "matmul's features"),
    Negative("reshape_regroups_the_features", linear_batch_norm(reshape="regroup"),
             "the reshape to (20, 4) does not keep the matmul's 8 features on its last axis"),
    Negative("full_tensor_bias", linear_batch_norm(bias="full"),
             "the matmul bias has shape (10, 8): a per-channel parameter varies along "
             "exactly one axis"),
    Negative("bias_along_the_rows", _bias_along_the_rows(),
             "the matmul bias varies along axis 0 of the matmul output (8, 8), not along its "
             "features (the last axis)"),
    Negative("int8_weight", _int8_matmul_batch_norm(), "weight dtype int8 is not floating point"),
    Negative("batched_weight", _matmul_batch_norm(np.ones((2, 16, 8))),
             "the weight has rank 3: only a 2-D weight has one set of output features"),
    Negative("permute_that_is_no_transpose",
             _matmul_batch_norm(np.ones((16, 8)), permute=[0, 1]),
             "permute_dims axes [0, 1] on the 2-D weight are no transpose"),
    Negative("cast_to_another_dtype",
             _matmul_batch_norm(np.ones((16, 8)), cast_to="bfloat16", dtype="float16"),
             "the matmul's result is cast to bfloat16, not back to its weight's float16"),
    Negative("weight_not_constant", _weight_not_constant(), "no match: permute_dims(const)"),
    Negative("broadcast_widens_the_features",
             linear_batch_norm(form="batched_widened", transposed=False),
             "the broadcast_to takes the weight's 1 output features to (2, 16, 8): only a "
             "broadcast that keeps them on the last axis scales with them"),
]


def _case(dtype: str) -> RuleCase:
    params = _parameters(dtype)
    before = _bind(tvm.script.from_source(_SCRIPT.format(dtype=dtype)), **params)
    expected = _bind(tvm.script.from_source(_EXPECTED.format(dtype=dtype)), **_folded(params))
    return RuleCase(BatchnormFoldIntoMatmul(), before, expected,
                    negatives=NEGATIVES if dtype == "float32" else [
                        Negative("training_mode", linear_batch_norm(training=True, dtype=dtype),
                                 "batch_norm is in training mode (batch statistics)")],
                    tolerance=TOLERANCE[dtype])


#: The float32 case; ``tests/patterns/test_matmul.py`` runs it as the family's contract case.
FOLD_CASE = _case("float32")
FOLD_FLOAT16_CASE = _case("float16")


def test_batchnorm_fold_into_a_linear_meets_the_rule_contract_in_float16():
    check_rule(FOLD_FLOAT16_CASE)


@pytest.mark.parametrize("form", ["levit", "flat"])
@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("bias", ["none", "feature", "feature_first", "scalar"])
@pytest.mark.parametrize("batch", [2, "n"])
def test_every_spelling_of_a_linear_and_batch_norm_folds_with_the_same_numbers(
        form, transposed, bias, batch):
    before = linear_batch_norm(form=form, transposed=transposed, bias=bias, batch=batch)
    log = pk.RewriteLog()
    after = pk.rewrite(BatchnormFoldIntoMatmul(), before, log=log)
    assert log.counts() == {"matmul.fold_batchnorm": 1}
    assert "batch_norm" not in after.script()
    pk.assert_same_numerics(before, after, rtol=F32.rtol, atol=F32.atol)


@pytest.mark.parametrize(("transposed", "batch", "dtype"),
                         [(True, 2, "float32"), (False, "n", "float32"), (True, "n", "float16")])
def test_a_batched_matmul_of_a_broadcast_weight_folds_its_batch_norm(transposed, batch, dtype):
    """LeViT's attention subsample through the torch importer: the Linear is a batched
    matmul of broadcast_to(x) and broadcast_to(permute_dims(W)); the scaled weight is
    broadcast the same way."""
    before = linear_batch_norm(form="batched", transposed=transposed, bias="feature",
                               batch=batch, dtype=dtype)
    log = pk.RewriteLog()
    after = pk.rewrite(BatchnormFoldIntoMatmul(), before, log=log)
    assert log.counts() == {"matmul.fold_batchnorm": 1}
    text = after.script()
    assert "batch_norm" not in text and text.count("R.broadcast_to(") == 2
    tol = TOLERANCE[dtype]
    pk.assert_same_numerics(before, after, rtol=tol.rtol, atol=tol.atol,
                            shape_vars={"n": 2})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_low_precision_matmul_accumulated_in_float32_folds_under_the_cast(dtype):
    before = linear_batch_norm(dtype=dtype, accumulate="cast_back", bias="feature")
    log = pk.RewriteLog()
    after = pk.rewrite(BatchnormFoldIntoMatmul(), before, log=log)
    assert log.counts() == {"matmul.fold_batchnorm": 1}
    text = after.script()
    assert "batch_norm" not in text and "R.astype(" in text
    if dtype == "float16":  # TVM 0.27 builds no bfloat16 batch_norm for llvm
        pk.assert_same_numerics(before, after, rtol=F16.rtol, atol=F16.atol)


def test_the_folded_linear_is_taken_by_the_matmul_bias_composite():
    folded = pk.rewrite(BatchnormFoldIntoMatmul(), linear_batch_norm(bias="feature"))
    merged = merge_composite(folded, matmul_table("ccompiler"))
    composites = [str(f.attrs["Composite"]) for _, f in composite_functions(merged)]
    assert composites == ["ccompiler.matmul_transposed_bias"]


def _levit_like(torch):
    class LinearNorm(torch.nn.Module):
        def __init__(self, inputs: int, outputs: int):
            super().__init__()
            self.c = torch.nn.Linear(inputs, outputs, bias=False)
            self.bn = torch.nn.BatchNorm1d(outputs)

        def forward(self, x):
            x = self.c(x)
            return self.bn(x.flatten(0, 1)).reshape_as(x)

    class Block(torch.nn.Module):
        """Two LinearNorm MLP layers with a hard-swish between them, and a classifier head
        (Linear with bias + BatchNorm1d), as LeViT stacks them."""

        def __init__(self):
            super().__init__()
            self.mlp1, self.mlp2 = LinearNorm(16, 32), LinearNorm(32, 16)
            self.qkv = LinearNorm(16, 48)
            self.head = torch.nn.Sequential(torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 10))
            self.head_norm = torch.nn.BatchNorm1d(10)

        def forward(self, x):
            x = x + self.mlp2(torch.relu(self.mlp1(x)))
            q, k, v = self.qkv(x).split(16, dim=-1)
            x = x + q * k.sigmoid() + v
            return self.head_norm(self.head(x.mean(1)))

    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    return model


def _count(mod: tvm.IRModule, op: str) -> int:
    return mod.script().count(op)


@pytest.mark.parametrize("dynamic_batch", [False, True])
def test_a_levit_like_torch_model_keeps_only_the_batch_norm_that_follows_no_linear(
        dynamic_batch):
    torch = pytest.importorskip("torch")
    from patternkit.models.importing import from_torch

    model = _levit_like(torch)
    x = torch.randn(3, 5, 16)
    dynamic = {"x": {0: torch.export.Dim("batch", min=2, max=64)}} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (x,), dynamic_shapes=dynamic)
    mod, _, _ = from_torch(program, keep_params=False, entry="main", text="levit-like",
                           seconds={})
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, mod, log=log)
    # five batch norms: three after a LinearNorm's Linear, one after the head's Linear,
    # and the head's first, which follows a mean (no linear layer to fold it into)
    assert _count(mod, "R.nn.batch_norm(") == 5
    assert log.counts().get("matmul.fold_batchnorm") == 4
    assert _count(after, "R.nn.batch_norm(") == 1
    vm = build_for_checks(after)
    got = vm["main"](tvm.runtime.tensor(x.numpy()))
    got = got[0] if isinstance(got, (list, tuple)) or not hasattr(got, "numpy") else got
    expected = model(x).detach().numpy()
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
