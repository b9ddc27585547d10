"""From an exported program or an ONNX graph to the Relax module a zoo entry hands out.

Both frontends are called as a user would call them; what follows is the same for both:
weights kept as parameters are detached into numpy arrays (``keep_params=true``), the
entry function is renamed when asked, and the result must be well formed.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import detach_params

from ..errors import first_line
from ..ir import var_name
from .zoomodel import ZooImportError

MAIN = "main"


def timed(seconds: dict[str, float], step: str, fn: Callable, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)``, adding its wall-clock time to ``seconds[step]``."""
    start = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        seconds[step] = seconds.get(step, 0.0) + time.perf_counter() - start


def failure(what: str, text: str, err: BaseException) -> ZooImportError:
    """A one-line :class:`ZooImportError` naming the step and the frontend's error."""
    first = first_line(err) if str(err).strip() else ""
    return ZooImportError(f"{text}: {what} failed in TVM {tvm.__version__}: "
                          f"{type(err).__name__}: {first}")


def constant_inputs(program: Any) -> list[str]:
    """``name=value`` of each user input ``program`` takes as a constant, not a tensor
    (``model(x, return_dict=False)`` exported with the flag as a keyword argument).
    """
    found = []
    for spec in getattr(getattr(program, "graph_signature", None), "input_specs", ()):
        arg = spec.arg
        if type(arg).__name__ == "ConstantArgument" and str(spec.kind).endswith("USER_INPUT"):
            found.append(f"{arg.name}={arg.value!r}")
    return found


def rename_entry(mod: tvm.IRModule, entry: str) -> tvm.IRModule:
    """A copy of ``mod`` whose ``main`` is called ``entry`` (global symbol included)."""
    if entry == MAIN:
        return mod
    functions = {}
    for gv, func in mod.functions.items():
        if gv.name_hint == MAIN:
            functions[tvm.ir.GlobalVar(entry)] = func.with_attr("global_symbol", entry)
        else:
            functions[gv] = func
    return tvm.IRModule(functions, attrs=mod.attrs)


def finish(mod: tvm.IRModule, keep_params: bool, entry: str,
           text: str) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """Detach kept weights, rename the entry function, check well-formedness."""
    params: dict[str, np.ndarray] = {}
    if keep_params:
        mod, detached = detach_params(mod)
        values = detached.get(MAIN, [])
        weights = mod[MAIN].params[len(mod[MAIN].params) - len(values):]
        params = {var_name(v): t.numpy() for v, t in zip(weights, values)}
    mod = rename_entry(mod, entry)
    if not relax.analysis.check_well_formed(mod):
        raise ZooImportError(f"{text}: the imported module is not well formed")
    return mod, params


def from_torch(program, keep_params: bool, entry: str, text: str, seconds: dict[str, float]
               ) -> tuple[tvm.IRModule, dict[str, np.ndarray], list[str]]:
    """``from_exported_program(program, unwrap_unit_return_tuple=True)`` with the
    converters of :mod:`.low_precision` (a float16 model stays float16), the rewrites of
    :mod:`.torch_fixups`, then :func:`finish`.  The third item says what the converters
    and the rewrites changed.
    """
    from tvm.relax.frontend.torch import from_exported_program

    from .low_precision import LowPrecisionConverters
    from .torch_converters import TorchConverters
    from .torch_fixups import prepare_torch_import

    converters, others = LowPrecisionConverters(), TorchConverters()
    try:
        mod = timed(seconds, "import", from_exported_program, program,
                    keep_params_as_input=keep_params, unwrap_unit_return_tuple=True,
                    custom_convert_map={**converters.convert_map(), **others.convert_map()})
    except Exception as err:
        constants = constant_inputs(program)
        if constants:
            raise ZooImportError(
                f"{text}: the program takes {', '.join(constants)} as input(s), which "
                f"from_exported_program (TVM {tvm.__version__}) cannot import: it takes "
                f"tensors only; export a function that fixes them (a wrapper module), or "
                f"leave them out ({type(err).__name__}: {first_line(err)})") from err
        raise failure("from_exported_program", text, err) from err
    mod, fixups = prepare_torch_import(mod)
    return (*finish(mod, keep_params, entry, text),
            converters.notes() + others.notes() + fixups)


def from_onnx_model(model, keep_params: bool, entry: str, text: str,
                    seconds: dict[str, float]) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """``from_onnx(model)`` (input shapes and dtypes from the graph), then :func:`finish`."""
    from tvm.relax.frontend.onnx import from_onnx

    try:
        mod = timed(seconds, "import", from_onnx, model, keep_params_in_input=keep_params)
    except Exception as err:
        invalid = exporter_fault(model)
        if invalid is not None:
            raise ZooImportError(f"{text}: the exported ONNX graph is not valid ({invalid}), "
                                 f"so from_onnx fails on it too") from err
        raise failure("from_onnx", text, err) from err
    return finish(mod, keep_params, entry, text)


def exporter_fault(model) -> str | None:
    """Why onnx's own checker refuses ``model`` (``None``: it accepts it, or cannot tell).

    Asked only after ``from_onnx`` failed, so the error names the exporter, not TVM, when
    the graph itself is wrong: the TorchScript exporter writes GPT-J's ``stack(...,
    dim=-1).flatten(-2)`` with incompatible dimensions, which onnxruntime refuses too.
    """
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        first = first_line(err) if str(err).strip() else ""
        return f"onnx.checker: {type(err).__name__}: {first}"
    except Exception:  # noqa: BLE001 - a checker that cannot run decides nothing
        return None
    return None


def symbolic_dims(func: relax.Function, input_specs) -> dict[str, str]:
    """Dimension role -> name of the symbolic variable standing for it in ``func``."""
    params = {var_name(p): p for p in func.params}
    found: dict[str, str] = {}
    for spec in input_specs:
        shape = params[spec.name].ty.shape
        for axis, role in enumerate(spec.shape):
            if isinstance(role, str) and tvm.ir.is_prim_var(shape[axis]):
                found.setdefault(role, shape[axis].name)
    return found
