"""The helpers of ``patternkit.errors`` every layer shares: an error in one line, and the
reading of on/off environment variables."""

from __future__ import annotations

import pytest
from tvm import relax

from patternkit.errors import PatternError, env_switch, first_line, tvm_error_line

# ---------------------------------------------------------------------------------------
# first_line


def test_first_line_of_a_multi_line_message_is_its_first_line_stripped():
    err = ValueError("\n   shapes differ: (2, 3) and (4, 5)  \n  File 'x.py', line 3\n")
    assert first_line(err) == "shapes differ: (2, 3) and (4, 5)"


@pytest.mark.parametrize("message", ["", "   ", "\n \n"])
def test_first_line_of_an_empty_message_is_the_type_name(message):
    assert first_line(KeyboardInterrupt(message)) == "KeyboardInterrupt"
    assert first_line(PatternError(message)) == "PatternError"


def test_first_line_of_a_message_with_no_arguments_is_the_type_name():
    assert first_line(RuntimeError()) == "RuntimeError"


def test_first_line_is_cut_at_the_limit():
    err = RuntimeError("x" * 500 + "\nsecond")
    assert first_line(err, limit=200) == "x" * 200
    assert first_line(err) == "x" * 500
    assert first_line(RuntimeError(""), limit=3) == "Run"
    assert first_line(RuntimeError("short"), limit=200) == "short"


# ---------------------------------------------------------------------------------------
# tvm_error_line


def test_tvm_error_line_is_the_last_failed_check_not_the_first_line():
    err = RuntimeError("while building main:\n  Check failed: (a) is false:\n  note: b\n")
    assert tvm_error_line(err) == "Check failed: (a) is false"
    assert first_line(err) == "while building main:"


def test_tvm_error_line_falls_back_to_the_last_line_then_the_type_name():
    assert tvm_error_line(ValueError("context\nwhat went wrong")) == "what went wrong"
    assert tvm_error_line(ValueError("")) == "ValueError"


def test_tvm_error_line_names_the_cpp_function_that_raised():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    y = relax.Var("y", relax.TensorType((4, 5), "float32"))
    bb = relax.BlockBuilder()
    with pytest.raises(Exception) as caught:
        with bb.function("f", [x, y]):
            bb.emit_func_output(bb.emit(relax.op.matmul(x, y)))
    line = tvm_error_line(caught.value)
    assert line.startswith("Matmul requires the reduction length")
    assert line.endswith(" (in tvm::relax::InferTypeMatmul, linear_algebra.cc)"), line
    assert tvm_error_line(caught.value, where=False) == line.split(" (in ")[0]
    assert tvm_error_line(caught.value, limit=20, where=False) == line[:20]


def test_tvm_error_line_says_no_where_for_a_python_error():
    try:
        raise ValueError("Check failed: plain python")
    except ValueError as err:
        assert tvm_error_line(err) == "Check failed: plain python"


# ---------------------------------------------------------------------------------------
# env_switch

VARIABLE = "PATTERNKIT_TEST_ERRORS_SWITCH"


@pytest.mark.parametrize("value", ["0", "false", "no", "off", "OFF", " False ", "No\n"])
@pytest.mark.parametrize("default", [True, False])
def test_env_switch_off_words_turn_it_off(monkeypatch, value, default):
    monkeypatch.setenv(VARIABLE, value)
    assert env_switch(VARIABLE, default) is False


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "ON", " True ", "Yes"])
@pytest.mark.parametrize("default", [True, False])
def test_env_switch_on_words_turn_it_on(monkeypatch, value, default):
    monkeypatch.setenv(VARIABLE, value)
    assert env_switch(VARIABLE, default) is True


@pytest.mark.parametrize("value", [None, "", "   ", "2", "maybe", "enabled"])
@pytest.mark.parametrize("default", [True, False])
def test_env_switch_unset_empty_or_unknown_leaves_the_default(monkeypatch, value, default):
    if value is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, value)
    assert env_switch(VARIABLE, default) is default
