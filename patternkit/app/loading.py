"""Loading the job's input: a model spec to an ``IRModule``, and its entry function.

A model is a built-in name, a zoo spec, a ``.py`` file defining an ``IRModule``, an
``.onnx`` file (imported after the rewrites of :mod:`patternkit.models.onnx_fixups`,
which work around TVM 0.27 importer bugs without changing what the graph computes, and
are logged) or a ``.pt2`` file saved by ``torch.export.save`` (imported with
``from_exported_program``, then the rewrites of :mod:`patternkit.models.torch_fixups`).  Its entry function is the one the user names, else ``main``, else the
only public function: importers and hand-written modules do not all call it ``main``
(``forward``), and a guess among several would check the wrong function.
"""

from __future__ import annotations

import logging
import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
from tvm import relax

from ..errors import PatternkitError
from ..models import BUILTIN_MODELS, ZooError, zoo_model
from ..models.zoo import PREFIX as ZOO_PREFIX

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "resnet18"


class JobError(PatternkitError):
    """Bad input to the main job: a model that cannot be loaded, an unknown pattern..."""


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model: the module, how to name it, the zoo build it came from, and what
    was rewritten in the source before TVM imported it (the ONNX fix-ups)."""

    mod: tvm.IRModule
    description: str
    zoo: Any = None  # a patternkit.models.ZooModel for zoo specs: input ranges, sizes
    import_fixups: tuple[str, ...] = ()


def load(spec: str | Path | None = None) -> LoadedModel:
    """Load a built-in name, a zoo spec, a ``.py`` or an ``.onnx`` file (default resnet18).

    A zoo spec's description is its canonical text (``zoo:gpt2?batch=dynamic``).
    """
    if spec is None:
        spec = DEFAULT_MODEL
    text = str(spec)
    if text in BUILTIN_MODELS:
        return LoadedModel(BUILTIN_MODELS[text](), f"builtin:{text}")
    if text.startswith(ZOO_PREFIX):
        try:
            model = zoo_model(text)
        except ZooError as err:
            raise JobError(str(err)) from err
        fixups = model.metadata.get("onnx_fixups") or model.metadata.get("import_fixups", ())
        return LoadedModel(model.mod, model.name, model, tuple(fixups))
    path = Path(text)
    if path.suffix not in (".py", ".onnx", ".pt2"):
        raise JobError(f"unknown model {text!r}: give a built-in name "
                       f"({', '.join(sorted(BUILTIN_MODELS))}), a zoo:NAME spec "
                       f"(patternkit list --models), a .py file, an .onnx file or a .pt2 "
                       f"file (torch.export.save)")
    if not path.is_file():
        raise JobError(f"model file not found: {path}")
    if path.suffix == ".py":
        return LoadedModel(_load_python(path), str(path))
    mod, fixups = _load_exported_program(path) if path.suffix == ".pt2" else _load_onnx(path)
    return LoadedModel(mod, str(path), import_fixups=fixups)


def load_model(spec: str | Path | None = None) -> tuple[tvm.IRModule, str]:
    """``(module, description)``; see :func:`load`."""
    loaded = load(spec)
    return loaded.mod, loaded.description


def entry_function(mod: tvm.IRModule, func: str | None = None) -> str:
    """The name of the function the job checks: ``func``, else ``main``, else the only public one.

    Raises
    ------
    JobError
        ``func`` is not a Relax function of ``mod``, or ``func`` is not given and the module
        has no ``main`` and not exactly one public Relax function (an empty module, say).
    """
    relax_funcs = {gv.name_hint: f for gv, f in mod.functions.items()
                   if isinstance(f, relax.Function)}
    if func is not None:
        if func not in relax_funcs:
            raise JobError(f"the model has no Relax function {func!r} "
                           f"(it has: {', '.join(sorted(relax_funcs)) or 'none'})")
        return func
    if "main" in relax_funcs:
        return "main"
    public = sorted(name for name, f in relax_funcs.items()
                    if f.attrs is not None and "global_symbol" in f.attrs)
    if len(public) == 1:
        return public[0]
    if not public:
        raise JobError("the model has no public Relax function to run (an empty module?)")
    raise JobError(f"the model has no 'main' and several public functions "
                   f"({', '.join(public)}): choose one with --func")


def _load_python(path: Path) -> tvm.IRModule:
    try:
        namespace = runpy.run_path(str(path))
    except Exception as err:
        raise JobError(f"{path}: running the file failed: {type(err).__name__}: {err}") from err
    modules = {k: v for k, v in namespace.items() if isinstance(v, tvm.IRModule)}
    for preferred in ("mod", "Module", "module"):
        if preferred in modules:
            return modules[preferred]
    if len(modules) == 1:
        return next(iter(modules.values()))
    if not modules:
        raise JobError(f"{path} defines no tvm.IRModule (name one `mod`)")
    raise JobError(f"{path} defines several IRModules ({', '.join(sorted(modules))}); "
                   f"name the one to use `mod`")


def _load_onnx(path: Path) -> tuple[tvm.IRModule, tuple[str, ...]]:
    """``(module, the fix-ups applied before from_onnx)``."""
    try:
        import onnx
        from tvm.relax.frontend.onnx import from_onnx
    except ImportError as err:
        raise JobError("loading .onnx needs the onnx extra: pip install 'patternkit[onnx]'") from err
    from ..models.onnx_fixups import prepare_for_tvm

    try:
        model = onnx.load(str(path))
    except Exception as err:
        raise JobError(f"{path}: not a loadable ONNX model: {type(err).__name__}: {err}") from err
    try:
        fixups = tuple(prepare_for_tvm(model))
    except Exception as err:  # onnx's shape inference refusing the graph, say
        logger.warning("%s: imported without the fix-ups for TVM's importer: %s: %s", path,
                       type(err).__name__, err)
        model, fixups = onnx.load(str(path)), ()
    else:
        if fixups:
            logger.info("%s: before from_onnx: %s", path, "; ".join(fixups))
    try:
        return from_onnx(model), fixups
    except Exception as err:
        raise JobError(f"{path}: not a loadable ONNX model: {type(err).__name__}: {err}") from err


def _load_exported_program(path: Path) -> tuple[tvm.IRModule, tuple[str, ...]]:
    """``(module, the fix-ups applied after from_exported_program)`` of a ``.pt2`` file."""
    try:
        import torch
    except ImportError as err:
        raise JobError("loading .pt2 needs the torch extra: pip install 'patternkit[torch]'"
                       ) from err
    from ..models.importing import from_torch
    from ..models.zoomodel import ZooImportError

    try:
        program = torch.export.load(str(path))
    except Exception as err:
        raise JobError(f"{path}: not a program saved by torch.export.save: "
                       f"{type(err).__name__}: {err}") from err
    try:
        mod, _, fixups = from_torch(program, False, "main", str(path), {})
    except ZooImportError as err:
        raise JobError(str(err)) from err
    if fixups:
        logger.info("%s: after from_exported_program: %s", path, "; ".join(fixups))
    return mod, tuple(fixups)
