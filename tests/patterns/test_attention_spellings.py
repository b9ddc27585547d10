"""Attention whose softmax is written by hand, ``exp(x - x.max(-1).values) / sum``, end to
end: softmax.collapse (before attention in the library) makes it ``R.nn.softmax``, and
attention.collapse then takes the attention.

``x.amax(-1, keepdim=True)`` imports too: TVM 0.27's torch importer has no ``amax``, and
patternkit's import converts it (``patternkit.models.torch_converters``, ``docs/tvm-bugs.md``).
"""

from __future__ import annotations

import warnings

import pytest

import patternkit as pk
from patternkit.patterns import LIBRARY
from patternkit.patterns.attention.plan import FLOAT32

torch = pytest.importorskip("torch")


class HandSoftmaxAttention(torch.nn.Module):
    """q @ k^T * scale, the max-shifted softmax written out over ``axis``, @ v."""

    def __init__(self, axis: int = -1):
        super().__init__()
        self.axis = axis

    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        e = torch.exp(scores - scores.max(self.axis, keepdim=True).values)
        return (e / e.sum(self.axis, keepdim=True)) @ v


def _imported(module):
    from patternkit.models.importing import from_torch

    torch.manual_seed(0)
    args = tuple(torch.randn(2, 2, 8, 16) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.export.export(module.eval(), args)
    mod, _, _ = from_torch(program, False, "main", type(module).__name__, {})
    return mod


def test_a_hand_written_softmax_inside_attention_collapses_to_one_attention():
    before = _imported(HandSoftmaxAttention())
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count("softmax.collapse") == 1 and log.count("attention.collapse") == 1
    text = after.script()
    assert text.count("R.nn.attention") == 1 and "R.exp" not in text
    pk.assert_same_numerics(before, after, rtol=FLOAT32.rtol, atol=FLOAT32.atol)


def test_a_hand_written_softmax_over_the_queries_is_refused_by_attention_with_its_axis():
    before = _imported(HandSoftmaxAttention(axis=2))
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY, before, log=log)
    assert log.count("softmax.collapse") == 1 and log.count("attention.collapse") == 0
    assert any("the softmax normalises axis 2" in r for r in log.reasons("attention.collapse"))
    pk.assert_same_numerics(before, after, rtol=FLOAT32.rtol, atol=FLOAT32.atol)
