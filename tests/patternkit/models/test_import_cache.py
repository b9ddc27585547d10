"""The import cache: a second load of a torch zoo model skips the export, and is the same.

The cache folder is in ``tmp_path``.  One test builds a real model, twice, through the
entry's builder (not ``zoo_model``'s per-process memo): a tiny GPT-2, 1 layer, hidden
32; the others keep a small hand-written module (CI's budget).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from patternkit.models import ZooError, import_cache, parse_spec, torch_models, zoo
from patternkit.models.zoo import ZOO
from patternkit.models.zoomodel import Deferred, InputSpec, ZooModel, described, description

pytestmark = pytest.mark.models

SPEC = "zoo:gpt2?layers=1&hidden=32&heads=2"


def _build(text: str = SPEC):
    spec = parse_spec(text)
    return ZOO[spec.name].build_function()(spec)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The cache in ``tmp_path``, active for the test."""
    pytest.importorskip("transformers")
    monkeypatch.setenv(import_cache.FOLDER, str(tmp_path / "imports"))
    monkeypatch.delenv(import_cache.SWITCH, raising=False)
    with import_cache.using():
        yield tmp_path / "imports"


def _no_export(*args, **kwargs):
    raise AssertionError("exported although the import was cached")


def test_a_cached_import_skips_the_export_and_gives_the_same_model(cache, monkeypatch):
    first = _build()
    assert "export" in first.seconds and len(list(cache.iterdir())) == 1
    monkeypatch.setattr(torch_models, "export", _no_export)
    again = _build()
    assert set(again.seconds) == {"cached_import"}
    assert tvm_ffi.structural_equal(again.mod, first.mod)  # constants compared by value
    assert again.mod.script() == first.mod.script()  # names too: reports read them
    assert again.families == first.families and again.families["softmax"] == 1
    assert again.metadata == first.metadata and again.symbolic_dims == first.symbolic_dims
    # the source module is still there: the reference the checks compare against
    np.testing.assert_array_equal(again.reference()[0], first.reference()[0])


def test_a_cached_load_builds_the_torch_model_only_when_something_reads_it(cache,
                                                                           monkeypatch):
    spec = parse_spec(SPEC)
    first = zoo._build.__wrapped__(spec)  # the loader's path, past the per-process memo
    made = []
    real = torch_models.gpt2_source
    monkeypatch.setattr(torch_models, "gpt2_source",
                        lambda options: made.append(options) or real(options))
    monkeypatch.setattr(torch_models, "export", _no_export)
    again = zoo._build.__wrapped__(spec)
    assert made == [] and set(again.seconds) == {"cached_import"}
    assert tvm_ffi.structural_equal(again.mod, first.mod)
    for name in ("entry", "input_specs", "sizes", "symbolic_dims", "dim_bounds", "families",
                 "metadata", "input_ranges"):
        assert getattr(again, name) == getattr(first, name), name
    for name, array in first.inputs.items():
        np.testing.assert_array_equal(again.inputs[name], array)
    # the reference builds the source, once, with the same seeded weights
    np.testing.assert_array_equal(again.reference()[0], first.reference()[0])
    assert len(made) == 1 and type(again.source) is type(first.source)
    assert again.source is again.source and len(made) == 1


def _small(value: float = 1.0) -> tvm.IRModule:
    """A module with what the printer writes specially: a tensor constant (twice), a
    scalar -inf, a symbolic dimension."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 3), "float32"))
    weight = relax.const(np.array([value, 2.0, 3.0], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.maximum(relax.op.add(x, weight),
                                         relax.const(float("-inf"), "float32")))
            out = bb.emit_output(relax.op.multiply(y, weight))
        bb.emit_func_output(out)
    return bb.get()


def _imported(value: float = 1.0) -> import_cache.Imported:
    return import_cache.Imported(_small(value), {"w": np.arange(4, dtype="float16")},
                                 ["a fix-up"], 2)


def test_an_entry_reads_back_the_module_its_weights_and_notes(cache):
    assert import_cache.write("zoo:small", _imported())
    found = import_cache.read("zoo:small")
    assert found is not None and tvm_ffi.structural_equal(found.mod, _small())
    assert found.mod.script() == _small().script()
    assert found.fixups == ["a fix-up"] and found.softmax == 2
    assert found.params["w"].dtype == np.float16 and found.params["w"].tolist() == [0, 1, 2, 3]
    assert import_cache.read("zoo:small?seed=1") is None  # another spec: a miss


def test_the_key_names_the_spec_and_the_versions(monkeypatch):
    base = import_cache.key(SPEC)
    assert import_cache.key(SPEC + "&seed=1") != base
    monkeypatch.setattr(import_cache.tvm, "__version__", "0.0.0")
    assert import_cache.key(SPEC) != base
    monkeypatch.undo()
    monkeypatch.setattr(import_cache, "_sources_digest", lambda: "an edited patternkit")
    assert import_cache.key(SPEC) != base


def test_an_entry_that_does_not_give_back_its_module_is_never_used(cache):
    assert import_cache.write("zoo:small", _imported())
    (entry,) = cache.iterdir()
    np.savez(entry / "constants.npz", c0=np.array([9.0, 2.0, 3.0], "float32"))
    assert import_cache.read("zoo:small") is None  # the text parses, the weight differs
    assert not entry.exists() and entry.with_suffix(".unusable").exists()
    assert not import_cache.write("zoo:small", _imported())  # this model is not kept again
    assert import_cache.read("zoo:small") is None


def test_a_damaged_entry_is_a_miss(cache):
    assert import_cache.write("zoo:small", _imported())
    (entry,) = cache.iterdir()
    (entry / "meta.json").write_text("{")
    assert import_cache.read("zoo:small") is None and not entry.exists()


def test_off_switch_outside_using_and_unwritable_folder_keep_nothing(cache, monkeypatch,
                                                                     tmp_path):
    monkeypatch.setenv(import_cache.SWITCH, "0")
    assert not import_cache.write("zoo:small", _imported()) and not cache.exists()
    monkeypatch.delenv(import_cache.SWITCH)
    with import_cache.using(False):
        assert not import_cache.write("zoo:small", _imported()) and not cache.exists()
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv(import_cache.FOLDER, str(blocked / "imports"))
    assert not import_cache.write("zoo:small", _imported())
    assert import_cache.read("zoo:small") is None


def test_a_description_gives_back_tuples_and_refuses_what_json_cannot_hold():
    spec = parse_spec("zoo:gpt2")
    built = []

    def build_source():
        built.append(1)
        return "the source", lambda inputs: [np.zeros(1)]

    model = ZooModel(spec=spec, mod=_small(), entry="main",
                     input_specs=(InputSpec("x", "float32", ("batch", 3)),), sizes={"batch": 2},
                     symbolic_dims={"batch": "n"}, dim_bounds={"batch": (1, None)}, params={},
                     families={"layernorm": 1}, source="a module",
                     metadata={"gqa": (4, 2), "config": {"depths": (2, 2)}, "fixups": ["f"]},
                     seconds={}, reference_fn=lambda inputs: [])
    again = described(spec, model.mod, {}, json.loads(json.dumps(description(model))),
                      Deferred(build_source), {})
    assert again.metadata == model.metadata and again.metadata["gqa"] == (4, 2)
    assert again.input_specs == model.input_specs and again.dim_bounds == model.dim_bounds
    assert built == [] and again.reference()[0].shape == (1,) and again.source == "the source"
    assert built == [1]
    with pytest.raises(AttributeError, match="no attribute 'sauce'"):
        again.sauce  # noqa: B018 - a misspelt name is an AttributeError, as before
    odd = ZooModel(spec=spec, mod=_small(), entry="main", input_specs=(), sizes={},
                   symbolic_dims={}, dim_bounds={}, params={}, families={}, source=None,
                   metadata={"width": np.int64(3)}, seconds={}, reference_fn=lambda i: [])
    with pytest.raises(ZooError, match="cannot keep int64"):
        description(odd)
