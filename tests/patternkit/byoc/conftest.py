"""Helpers for the external-compiler tests."""

from __future__ import annotations

import pytest
import tvm


def run_flow(mod: tvm.IRModule, *passes: tvm.transform.Pass) -> tvm.IRModule:
    """Run ``passes`` in a ``Sequential`` on ``mod`` inside ``PassContext(opt_level=3)``.

    The context must still be open when the passes run (Relay's BYOC flow built and ran
    its ``Sequential`` in the same ``with`` block); a ``Sequential`` built inside the
    context and called after it closed runs at the default opt level.
    """
    with tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(list(passes))(mod)


@pytest.fixture
def flow():
    """``flow(mod, *passes)``: the passes run on ``mod`` as Relay's BYOC flow ran them."""
    return run_flow
