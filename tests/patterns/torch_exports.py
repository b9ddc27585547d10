"""Shared by the pattern tests: a torch model as patternkit imports it, and a module run
on llvm.

Several families check a model written by hand in torch end to end: exported with
``torch.export`` (its batch dimension dynamic when asked), imported by patternkit's
importer, rewritten, built on llvm and compared with torch.  These two helpers are that
route, so each test states only its model and what it expects.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tvm

from patternkit.models.importing import from_torch
from patternkit.verification.numeric import build as build_for_checks


def import_torch_export(model: Any, x: Any, *, dynamic_batch: bool = False,
                        text: str = "model") -> tvm.IRModule:
    """``model(x)`` exported by ``torch.export`` and imported by patternkit (weights as
    constants, entry ``main``); with ``dynamic_batch`` the batch dimension of ``x`` is a
    symbolic ``batch`` in [2, 64]."""
    import torch

    dynamic = {"x": {0: torch.export.Dim("batch", min=2, max=64)}} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (x,), dynamic_shapes=dynamic)
    mod, _, _ = from_torch(program, keep_params=False, entry="main", text=text, seconds={})
    return mod


def run_on_llvm(mod: tvm.IRModule, *inputs: np.ndarray) -> np.ndarray:
    """``mod["main"](*inputs)`` built by ``relax.build`` for llvm, as a numpy array."""
    vm = build_for_checks(mod)
    return vm["main"](*(tvm.runtime.tensor(value) for value in inputs)).numpy()
