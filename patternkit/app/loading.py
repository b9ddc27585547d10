"""Loading the job's input: a model spec to an ``IRModule``, and its entry function.

A model is a built-in name, a zoo spec, a ``.py`` file defining an ``IRModule``, an
``.onnx`` file (imported after the rewrites of :mod:`patternkit.models.onnx_fixups`,
which work around TVM 0.27 importer bugs without changing what the graph computes, and
are logged) or a ``.pt2`` file saved by ``torch.export.save`` (imported with
``from_exported_program``, then the rewrites of :mod:`patternkit.models.torch_fixups`).
A ``.pt2`` file's weights are bound as constants unless the spec asks otherwise, spelt
as a zoo model spells it (``model.pt2?keep_params=true``, ``patternkit run model.pt2
--keep-params``): as constants there is nothing for ``--train`` to differentiate, as
parameters the job draws them like any input.  Its entry function is the one the user
names, else ``main``, else the only public function: importers and hand-written modules
do not all call it ``main`` (``forward``), and a guess among several would check the
wrong function.  A torch zoo model's import is read from the user's cache when an
earlier run kept it (:mod:`patternkit.models.import_cache`; ``PATTERNKIT_IMPORT_CACHE=0``
turns it off).
"""

from __future__ import annotations

import importlib
import logging
import re
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast
from urllib.parse import parse_qsl

import tvm
from tvm import relax

from ..errors import PatternkitError, first_line
from ..models import BUILTIN_MODELS, ZooError, import_cache, zoo_model
from ..models.zoo import PREFIX as ZOO_PREFIX, Option

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "resnet18"


class JobError(PatternkitError):
    """Bad input to the main job: a model that cannot be loaded, an unknown pattern..."""


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model: the module, how to name it, the zoo build it came from, what
    was rewritten in the source before TVM imported it (the ONNX fix-ups), and the
    weights a ``.pt2`` file's import kept as parameters (name -> array, the values it
    was saved with).
    """

    mod: tvm.IRModule
    description: str
    zoo: Any = None  # a patternkit.models.ZooModel for zoo specs: input ranges, sizes
    import_fixups: tuple[str, ...] = ()
    params: dict = field(default_factory=dict)


#: The options a model file's spec takes after ``?``, by suffix (``model.pt2?keep_params=true``).
FILE_OPTIONS = {
    ".pt2": {"keep_params": Option(False, "weights as entry-function parameters")},
}


def keep_params_spec(spec: str | Path | None) -> str:
    """``spec`` asking for its weights as parameters: ``keep_params=true`` added to a zoo
    spec's or a ``.pt2`` file's options (what ``patternkit run --keep-params`` does).

    Raises
    ------
    JobError
        ``spec`` is a built-in model, a ``.py`` or an ``.onnx`` file: their weights are
        what the module says, there is no import to ask.
    """
    text = str(spec if spec is not None else DEFAULT_MODEL)
    if not (text.startswith(ZOO_PREFIX) or _split_options(text)[0].suffix == ".pt2"):
        raise JobError(f"keep_params applies to zoo models and .pt2 files, not to {text!r} "
                       f"(a built-in model's, a .py or an .onnx file's weights are what "
                       f"the module makes them)")
    return text + ("&" if "?" in text else "?") + "keep_params=true"


def _split_options(text: str) -> tuple[Path, dict[str, str]]:
    """``(path, raw options)`` of a file spec ``path[?key=value&...]``.  A file whose
    name holds a ``?`` is taken as it is.
    """
    if "?" not in text or Path(text).is_file():
        return Path(text), {}
    name, _, query = text.partition("?")
    try:
        return Path(name), dict(parse_qsl(query, keep_blank_values=True, strict_parsing=True))
    except ValueError as err:
        raise JobError(f"{text}: options after '?' are key=value pairs joined by '&' "
                       f"({err})") from None


def _file_options(path: Path, raw: dict[str, str], text: str) -> dict[str, Any]:
    """The typed options of a file spec, every known one with its default."""
    known = FILE_OPTIONS.get(path.suffix, {})
    unknown = sorted(set(raw) - set(known))
    if unknown:
        takes = (f"it takes {', '.join(f'{k}=' for k in known)}" if known
                 else f"a {path.suffix} file takes none")
        raise JobError(f"{text}: unknown option {', '.join(map(repr, unknown))} ({takes})")
    options = {}
    for key, option in known.items():
        try:
            options[key] = option.parse(raw.get(key, option.default))
        except ValueError as err:
            raise JobError(f"{text}: option {key}: {err}") from None
    return options


def load(spec: str | Path | None = None, *, keep_params: bool | None = None) -> LoadedModel:
    """Load a built-in name, a zoo spec, a ``.py``, an ``.onnx`` or a ``.pt2`` file
    (default resnet18).

    A zoo spec's description is its canonical text (``zoo:gpt2?batch=dynamic``); a
    ``.pt2`` file's is its path, with ``?keep_params=true`` when its weights are kept.
    ``keep_params`` (a zoo model's and a ``.pt2`` file's option; ``None``: as the spec
    says) imports the weights as parameters of the entry function instead of constants.
    """
    if spec is None:
        spec = DEFAULT_MODEL
    text = str(spec)
    if keep_params:
        keep_params_spec(text)  # only a zoo model or a .pt2 file has weights to keep
    if text in BUILTIN_MODELS:
        # the table mixes builders mypy joins to `function`; each builds with its defaults
        build = cast(Callable[[], tvm.IRModule], BUILTIN_MODELS[text])
        return LoadedModel(build(), f"builtin:{text}")
    if text.startswith(ZOO_PREFIX):
        try:
            with import_cache.using():  # the export and import kept from the last run
                model = zoo_model(text, **({} if keep_params is None else
                                           {"keep_params": keep_params}))
        except ZooError as err:
            raise JobError(str(err)) from err
        fixups = model.metadata.get("onnx_fixups") or model.metadata.get("import_fixups", ())
        return LoadedModel(model.mod, model.name, model, tuple(fixups))
    path, raw = _split_options(text)
    if path.suffix not in (".py", ".onnx", ".pt2"):
        raise JobError(f"unknown model {text!r}: give a built-in name "
                       f"({', '.join(sorted(BUILTIN_MODELS))}), a zoo:NAME spec "
                       f"(patternkit list --models), a .py file, an .onnx file or a .pt2 "
                       f"file (torch.export.save)")
    if not path.is_file():
        raise JobError(f"model file not found: {path}")
    if path.stat().st_size == 0:  # else each frontend names a symptom (an IR version of 0)
        raise JobError(f"{path} is empty (0 bytes): was the export or copy interrupted?")
    options = _file_options(path, raw, text)
    if keep_params is not None and path.suffix == ".pt2":
        options["keep_params"] = keep_params
    if path.suffix == ".py":
        return LoadedModel(_load_python(path), str(path))
    if path.suffix == ".onnx":
        mod, fixups = _load_onnx(path)
        return LoadedModel(mod, str(path), import_fixups=fixups)
    mod, params, fixups = _load_exported_program(path, options["keep_params"])
    return LoadedModel(mod, str(path) + ("?keep_params=true" if options["keep_params"] else ""),
                       import_fixups=fixups, params=params)


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
        raise JobError("loading .onnx needs the onnx extra: "
                       "pip install 'patternkit[onnx]'") from err
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


#: What torch logs when a saved program's outputs (or inputs) are a class its pytree
#: registry does not know, e.g. ``transformers.modeling_outputs.BaseModelOutput``.
_UNREGISTERED = re.compile(r"Deserializing ([\w.]+) in pytree is not registered")

#: Modules a ``.pt2`` file may name for its pytree classes that are imported to register
#: them (importing a module runs its code: only these packages' modules, never the file's).
_PYTREE_PACKAGES = ("transformers.",)


def _read_exported_program(torch: Any, path: Path) -> Any:
    """``torch.export.load(path)``, registering the pytree classes the file names.

    A Hugging Face model returns a ``ModelOutput``, which ``torch.export.save`` records by
    its class name; loading the file in a process that has not imported that class fails
    with an error that only says to look at torch's log.  The class's module is imported
    (from :data:`_PYTREE_PACKAGES` only) and the load tried again; any other failure is
    reported with the line of torch's log that says what went wrong.
    """
    tried: set[str] = set()
    while True:
        records: list[logging.LogRecord] = []
        handler = _Collect(records)
        torch_export_log = logging.getLogger("torch.export")
        torch_export_log.addHandler(handler)
        try:
            return torch.export.load(str(path))
        except Exception as err:
            logged = "\n".join(_record_text(record) for record in records)
            found = _UNREGISTERED.search(f"{logged}\n{err}")
            module = found.group(1).rsplit(".", 1)[0] if found else ""
            if (found and module not in tried
                    and module.startswith(_PYTREE_PACKAGES) and _imported(module)):
                tried.add(module)
                logger.info("%s: imported %s for its pytree class %s", path, module,
                            found.group(1))
                continue
            if found:
                raise JobError(
                    f"{path}: torch.export.load cannot read it here: {found.group(0)} (the "
                    f"program returns or takes a class this process has not imported: "
                    f"import the module that defines it first, or export a function that "
                    f"returns plain tensors)") from err
            raise JobError(f"{path}: not a program saved by torch.export.save: "
                           f"{first_line(err)}") from err
        finally:
            torch_export_log.removeHandler(handler)


class _Collect(logging.Handler):
    """Keeps the records it is handed (torch logs why a load failed, then raises a
    generic error).
    """

    def __init__(self, records: list[logging.LogRecord]):
        super().__init__(logging.WARNING)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _record_text(record: logging.LogRecord) -> str:
    """A log record's message and the traceback it carries (torch logs the error that
    stopped a load as the record's exception, with a message that does not say it).
    """
    text = record.getMessage()
    if record.exc_info:
        text += "\n" + logging.Formatter().formatException(record.exc_info)
    return text


def _imported(module: str) -> bool:
    """Import ``module``; ``False`` when it cannot be."""
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - not installed, or broken: the load's error stands
        return False
    return True


def _load_exported_program(path: Path, keep_params: bool = False
                           ) -> tuple[tvm.IRModule, dict, tuple[str, ...]]:
    """``(module, kept weights, the fix-ups applied after from_exported_program)`` of a
    ``.pt2`` file; the weights are parameters after the inputs when ``keep_params``.
    """
    try:
        import torch
    except ImportError as err:
        raise JobError("loading .pt2 needs the torch extra: pip install 'patternkit[torch]'"
                       ) from err
    from ..models.importing import from_torch
    from ..models.zoomodel import ZooImportError

    program = _read_exported_program(torch, path)
    try:
        mod, params, fixups = from_torch(program, keep_params, "main", str(path), {})
    except ZooImportError as err:
        raise JobError(str(err)) from err
    if fixups:
        logger.info("%s: after from_exported_program: %s", path, "; ".join(fixups))
    return mod, params, tuple(fixups)
