"""Shared test helpers: small Relax graphs and the hypothesis profiles used across the suite.

Hypothesis profiles (select one with the ``HYPOTHESIS_PROFILE`` environment variable):

``ci`` (default)
    300 examples per property, derandomised (a fixed seed) so CI failures reproduce;
``long``
    5000 examples per property, random seed, for a soak run.

A property that is slower per example takes a stated fraction of the profile's budget
(``settings.default.max_examples``), so ``long`` scales it too.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvmscript_stack
from tvm import relax

import patternkit as pk
from patternkit import ir as pk_ir
from patternkit.patterns.conv import ConvAddReluComposite

tvmscript_stack.install()  # before any test module's TVMScript is parsed

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is in the test extra; only the property tests need it
    pass
else:
    _COMMON = dict(deadline=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("ci", max_examples=300, derandomize=True, **_COMMON)
    settings.register_profile("long", max_examples=5000, **_COMMON)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="session")
def _import_cache_in_a_temporary_folder(tmp_path_factory):
    """The zoo fixture, the job and the CLI tests load zoo models through the import
    cache (subprocesses inherit the variable): keep their entries out of the user's
    ``~/.cache``, in one folder the session's workers share (pytest-xdist gives each
    worker its own temporary folder, under one of the session's).
    """
    if "PATTERNKIT_IMPORT_CACHE_DIR" not in os.environ:
        base = tmp_path_factory.getbasetemp()
        shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "imports"
        shared.mkdir(exist_ok=True)
        os.environ["PATTERNKIT_IMPORT_CACHE_DIR"] = str(shared)


def tensor_var(name: str, shape, dtype: str = "float32") -> relax.Var:
    return relax.Var(name, relax.TensorType(shape, dtype))


def elementwise_batchnorm(x, gamma, beta, mean, var, eps=None):
    """Relay's spelling: gamma * (x - mean) / sqrt(var + eps) + beta."""
    eps = relax.const(1e-5, "float32") if eps is None else eps
    return gamma * (x - mean) / relax.op.sqrt(var + eps) + beta


def op_names(mod, func_name: str = "main") -> list[str]:
    """Operator names of the calls bound in ``mod[func_name]``, in program order."""
    return [pk_ir.op_name(b.value) for block in mod[func_name].body.blocks
            for b in block.bindings if pk_ir.op_name(b.value)]


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


@pytest.fixture
def main_ops():
    """``main_ops(mod)`` -> the operator names called in ``mod["main"]``, in order."""
    return op_names


def assert_bit_exact(before, after, **options):
    """``assert_same_numerics`` with no tolerance at all (``rtol=0, atol=0``)."""
    return pk.assert_same_numerics(before, after, rtol=0, atol=0, **options)


@pytest.fixture
def bit_exact():
    """``bit_exact(before, after, **input_options)``: the same numbers, to the last bit.

    For transforms that only wrap bindings in functions or cut the graph into pieces
    (``partition``, ``MergeComposite``, ``PartitionGraph``, ``graph_split``): the VM runs
    the same kernels on the same values, so any difference is a bug, not rounding.
    """
    return assert_bit_exact


@pytest.fixture
def resnet_block():
    """ResNet-18's first block after batch-norm folding (``ConvAddReluComposite.example()``).

    conv7x7/2 + bias + relu, max_pool, conv3x3 + bias + relu, conv3x3 + bias, and the
    residual add: three conv2d -> add [-> relu] chains, the seed's BYOC workload.
    """
    return ConvAddReluComposite().example()


# -- the model zoo (patternkit.models): session-scoped, shared by every test that needs it ---
#: The smallest configs that still show each family's structure (one layer, narrow).
TINY_ZOO = {
    "gpt2": dict(layers=1, hidden=32, heads=2),
    "bert": dict(layers=1, hidden=32, heads=2),
    "llama": dict(layers=1, hidden=32, heads=4, kv_heads=2, intermediate=64),  # GQA 4:2
    "vit": dict(layers=1, hidden=32, heads=2),
    "t5": dict(layers=1, hidden=32, heads=2),
    "falcon": dict(layers=1, hidden=32, heads=2),  # multi-query: one key/value head
    "onnx:t5": dict(layers=1, hidden=32, heads=2),
    "resnet18": dict(width=8),
    "onnx:gpt2": dict(layers=1, hidden=32, heads=2),
    "onnx:bert": dict(layers=1, hidden=32, heads=2),
}


def _require_extras(name: str) -> None:
    from patternkit.models import ZOO

    for extra in ZOO[name].extras:
        pytest.importorskip(extra, reason=f"zoo:{name} needs the {extra} extra")


@pytest.fixture(scope="session")
def zoo():
    """``zoo(name, **options)`` -> the cached tiny :class:`~patternkit.models.ZooModel`.

    Options default to :data:`TINY_ZOO`; the test skips when the entry's extras (torch,
    transformers, onnx) are not installed.  Mark such tests ``@pytest.mark.models``.

    A torch model is exported and imported once per session, not once per worker: the
    import cache (:mod:`patternkit.models.import_cache`, in the workers' shared folder)
    hands the other workers the same module, held to its structural hash (most of a zoo
    test's time was the exporter's).  Tests of a fresh import call ``zoo_model`` itself.
    """
    from patternkit.models import import_cache, zoo_model

    def get(name: str, **options):
        _require_extras(name)
        with import_cache.using():
            return zoo_model(name, **{**TINY_ZOO.get(name, {}), **options})

    return get


@pytest.fixture(scope="session")
def zoo_vm():
    """``zoo_vm(model)`` -> ``run(inputs=None)``: the model built for llvm once per session.

    ``run`` calls the entry function on ``inputs`` (default ``model.inputs``) plus the
    kept weights and returns its first output as numpy.
    """
    import functools

    import tvm

    from patternkit.verification.numeric import build as build_for_checks

    @functools.cache
    def build(model):
        # built as the numeric checks build (LLVM opt-level 1: the same bits as -O3)
        vm = build_for_checks(model.mod)

        def run(inputs=None):
            out = vm[model.entry](*(tvm.runtime.tensor(np.array(a))
                                    for a in model.arguments(inputs)))
            return (out if hasattr(out, "numpy") else out[0]).numpy()

        return run

    return build
