"""The seed's batch-norm test (note 000 of the seeds), shared by the training tests."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk


def batch_norm_loss(training_flag: bool, shape=(2, 7, 4, 3)) -> tvm.IRModule:
    """The seed's test: ``sum(batch_norm(data, gamma, beta, mean, var)[0])``, axis 1."""
    data = relax.Var("data", relax.TensorType(shape, "float32"))
    params = [relax.Var(n, relax.TensorType((shape[1],), "float32"))
              for n in ("bn_gamma", "bn_beta", "bn_moving_mean", "bn_moving_var")]
    bn = relax.op.nn.batch_norm(data, *params, axis=1, epsilon=1e-5, training=training_flag)
    return pk.from_expr(relax.op.sum(relax.TupleGetItem(bn, 0)))


def seed_inputs(shape=(2, 7, 4, 3), seed=0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    channel = lambda: rng.uniform(0.5, 1.5, (shape[1],)).astype("float32")  # noqa: E731
    return [rng.uniform(0, 10, shape).astype("float32")] + [channel() for _ in range(4)]


@pytest.fixture(name="batch_norm_loss")
def batch_norm_loss_fixture():
    return batch_norm_loss


@pytest.fixture(name="seed_inputs")
def seed_inputs_fixture():
    return seed_inputs
