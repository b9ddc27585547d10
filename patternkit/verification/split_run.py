"""``run_split``: run the pieces :func:`patternkit.engine.splitting.graph_split` cut, in order.

Cutting a function is an IR transform (the engine's); running the pieces builds each for
``llvm`` and chains their outputs through the VM, which is this layer's job (the same
:func:`~patternkit.verification.numeric.build` every numeric check uses).  A split is
right when ``run_split`` gives what the uncut function gives on the same inputs.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tvm

from ..engine.splitting import SPLIT_INPUTS, SPLIT_OUTPUTS
from ..ir import compat as C
from .numeric import build, flatten


def run_split(modules: Sequence[tvm.IRModule],
              inputs: Sequence[np.ndarray] | dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run the pieces of :func:`~patternkit.engine.splitting.graph_split` in order.

    ``inputs`` are the original function's arguments, in its parameter order (or a dict
    by parameter name), handed to every piece that reads them.  Returns the last piece's
    outputs as numpy arrays.
    """
    if isinstance(inputs, dict):
        env: dict[str, Any] = dict(inputs)
    else:
        env = dict(zip([str(n) for n in modules[0]["main"].attrs[SPLIT_INPUTS]], inputs))
    outputs: list = []
    for mod in modules:
        main = mod["main"]
        args = [C.to_tensor(np.asarray(env[C.var_name(p)])) if not isinstance(
            env[C.var_name(p)], tvm.runtime.Tensor) else env[C.var_name(p)] for p in main.params]
        result = build(mod)["main"](*args)
        names = [str(n) for n in main.attrs[SPLIT_OUTPUTS]]
        values = [result] if len(names) == 1 else list(result)
        env.update(zip(names, values))
        outputs = values
    return [x for v in outputs for x in flatten(v)]


__all__ = ["run_split"]
