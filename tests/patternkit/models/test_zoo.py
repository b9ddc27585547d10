"""Zoo specs: ``zoo:NAME?option=value`` parses to one canonical, cached build."""

from __future__ import annotations

import pytest

from patternkit.models import ZOO, ZooError, parse_spec


def test_a_spec_names_only_the_options_that_differ_from_their_defaults():
    spec = parse_spec("zoo:gpt2?batch=dynamic&layers=2&seq=static")
    assert spec.text == "zoo:gpt2?batch=dynamic"
    assert spec["batch"] == "dynamic" and spec["layers"] == 2 and spec["seq"] == "static"


def test_the_zoo_prefix_is_optional_and_keyword_overrides_win():
    assert parse_spec("gpt2?layers=3", layers=4) == parse_spec("zoo:gpt2?layers=4")


def test_option_values_are_typed_by_their_default():
    spec = parse_spec("zoo:llama?keep_params=true&kv_heads=1&entry=forward")
    assert spec["keep_params"] is True and spec["kv_heads"] == 1 and spec["entry"] == "forward"


@pytest.mark.parametrize("text, message", [
    ("zoo:gtp2", "did you mean gpt2?"),
    ("zoo:gpt2?layer=2", "unknown option 'layer'"),
    ("zoo:gpt2?batch=symbolic", "option batch: expected one of static, dynamic"),
    ("zoo:gpt2?layers=two", "option layers:"),
    ("zoo:gpt2?keep_params=maybe", "expected true or false"),
    ("zoo:onnx:bert?opset=13", "expected one of 14, 17"),
    ("zoo:gpt2?layers", "zoo:gpt2: bad query field: 'layers'"),
])
def test_a_bad_spec_is_a_zoo_error_naming_what_is_wrong(text, message):
    with pytest.raises(ZooError, match=message.replace("?", r"\?")):
        parse_spec(text)


def test_every_entry_offers_the_shared_options():
    for entry in ZOO.values():
        assert {"batch", "batch_size", "keep_params", "entry", "seed"} <= set(entry.options), \
            entry.name


@pytest.mark.models
def test_the_same_canonical_spec_returns_the_same_cached_model(zoo):
    from patternkit.models import zoo_model

    model = zoo("gpt2")
    assert zoo_model(model.spec.text) is model
    assert zoo_model("gpt2", hidden=32, layers=1, heads=2) is model
