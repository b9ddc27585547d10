"""Shared test helpers: small Relax graphs used across the suite."""

from __future__ import annotations

import pytest
from tvm import relax


def tensor_var(name: str, shape, dtype: str = "float32") -> relax.Var:
    return relax.Var(name, relax.TensorType(shape, dtype))


def elementwise_batchnorm(x, gamma, beta, mean, var, eps=None):
    """Relay's spelling: gamma * (x - mean) / sqrt(var + eps) + beta."""
    eps = relax.const(1e-5, "float32") if eps is None else eps
    return gamma * (x - mean) / relax.op.sqrt(var + eps) + beta


@pytest.fixture
def bn_vars():
    """x: (2, 3, 4, 4) and per-channel parameters shaped (3, 1, 1), as in the seed notes."""
    x = tensor_var("x", (2, 3, 4, 4))
    gamma, beta, mean, var = (tensor_var(n, (3, 1, 1)) for n in ("gamma", "beta", "mean", "var"))
    return x, gamma, beta, mean, var


@pytest.fixture
def make_var():
    """``make_var(name, shape, dtype="float32")`` -> a typed ``relax.Var``."""
    return tensor_var


@pytest.fixture
def make_bn():
    """``make_bn(x, gamma, beta, mean, var, eps=None)`` -> Relay-style elementwise BN."""
    return elementwise_batchnorm
