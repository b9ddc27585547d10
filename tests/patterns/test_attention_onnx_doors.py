"""attention.collapse on torch's SDPA through the ONNX exporters, as ``from_onnx`` imports
it: the TorchScript exporter (opsets 14, 17) multiplies the query and the key each by
``sqrt(scale)`` computed from constants at run time (``sqrt(cast(1 / sqrt(H)))``), the
dynamo exporter by a constant ``sqrt(scale)``, its key transposed in 3-D and split back
into heads.  The rule's model forms (``onnx_sdpa``) and refusals are in the contract case
and the form tests of test_attention.py; here a small module is exported for real.
"""

from __future__ import annotations

import warnings

import onnx
import pytest
import torch
import torch.nn.functional as F

import patternkit as pk
from patternkit.models.importing import from_onnx_model
from patternkit.models.onnx_models import export_to_onnx
from patternkit.patterns.attention import AttentionCollapse
from patternkit.patterns.attention.plan import FLOAT16, FLOAT32


class Sdpa(torch.nn.Module):
    """Two heads of 8 from a (2, 8, 16) input: SDPA with its default scale, 8 ** -0.5."""

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.reshape(b, s, 2, 8).transpose(1, 2) for t in (x, x * 0.5, x + 1.0))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, 16)


def _imported(exporter: str, opset: int | None, dtype: str = "float32"):
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0)).to(
        getattr(torch, dtype))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        data = export_to_onnx(Sdpa().eval(), (x,), ["x"], opset=opset, exporter=exporter)
    mod, _ = from_onnx_model(onnx.load_from_string(data), False, "main", "sdpa", {})
    return mod


# float16: the exporter casts sqrt(H) to float32 for the division, one call deeper
@pytest.mark.parametrize("exporter, opset, dtype", [("torchscript", 14, "float32"),
                                                    ("torchscript", 17, "float16"),
                                                    ("dynamo", None, "float32")])
def test_sdpa_through_an_onnx_exporter_collapses_with_its_scale_and_the_numbers_kept(
        exporter, opset, dtype):
    mod = _imported(exporter, opset, dtype)
    before = mod.script()
    log = pk.RewriteLog()
    after = pk.rewrite([AttentionCollapse()], mod, log=log)
    assert mod.script() == before  # the user's module is left as it was
    fused = [b.value for block in after["main"].body.blocks for b in block.bindings
             if pk.ir.op_name(b.value) == "relax.nn.attention"]
    assert len(fused) == 1, [s.reason for s in log.skipped]
    # sqrt(s) * sqrt(s) in the model's dtype: s up to its rounding
    assert float(fused[0].attrs.scale) == pytest.approx(8 ** -0.5,
                                                        rel=1e-6 if dtype == "float32" else 2e-3)
    assert not {"relax.matmul", "relax.nn.softmax"} & {
        pk.ir.op_name(b.value) for block in after["main"].body.blocks for b in block.bindings}
    tol = FLOAT32 if dtype == "float32" else FLOAT16
    pk.assert_same_numerics(mod, after, rtol=tol.rtol, atol=tol.atol)
