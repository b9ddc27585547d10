"""``ZooModel.make_inputs``: valid inputs for every model (ids in range, masks all ones)."""

from __future__ import annotations

import numpy as np
import pytest

from patternkit.models import InputSpec, ZooError

pytestmark = pytest.mark.models


def test_token_ids_stay_inside_the_vocabulary_and_the_mask_is_all_ones(zoo):
    model = zoo("gpt2")
    inputs = model.make_inputs(seed=3)
    ids = inputs["input_ids"]
    assert ids.dtype == np.int64 and ids.shape == (2, 8)
    assert 0 <= ids.min() and ids.max() < model.spec["vocab"]
    assert np.all(inputs["attention_mask"] == 1)
    assert model.input_ranges["input_ids"] == (0, model.spec["vocab"])


def test_bert_token_types_stay_inside_the_type_vocabulary(zoo):
    model = zoo("bert", type_vocab=3)
    types = np.concatenate([model.make_inputs(seed=s)["token_type_ids"].ravel()
                            for s in range(4)])
    assert set(np.unique(types)) == {0, 1, 2}
    assert model.input_ranges["token_type_ids"] == (0, 3)


def test_inputs_are_seeded_and_the_default_ones_are_read_only(zoo):
    model = zoo("gpt2")
    assert np.array_equal(model.make_inputs(5)["input_ids"], model.make_inputs(5)["input_ids"])
    assert not np.array_equal(model.make_inputs(5)["input_ids"],
                              model.make_inputs(6)["input_ids"])
    with pytest.raises(ValueError):
        model.inputs["input_ids"][0, 0] = 1


def test_only_a_dynamic_dimension_takes_another_size(zoo):
    dynamic = zoo("gpt2", batch="dynamic", seq="dynamic")
    assert dynamic.make_inputs(batch=3, seq=5)["input_ids"].shape == (3, 5)
    with pytest.raises(ZooError, match="outside"):
        dynamic.make_inputs(seq=65)  # the position table has 64 rows
    with pytest.raises(ZooError, match="'batch' is not dynamic"):
        zoo("gpt2").make_inputs(batch=3)


def test_an_integer_input_without_bounds_is_an_error_naming_it():
    ids = InputSpec("input_ids", "int64", ("batch", 4))
    with pytest.raises(ZooError, match="input 'input_ids': an integer input needs low= and high="):
        ids.draw({"batch": 2}, np.random.default_rng(0))
    bounded = InputSpec("input_ids", "int64", ("batch", 4), 0, 10)
    drawn = bounded.draw({"batch": 2}, np.random.default_rng(0))
    assert drawn.shape == (2, 4) and drawn.min() >= 0 and drawn.max() < 10
