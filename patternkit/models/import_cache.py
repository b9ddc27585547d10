"""A torch zoo model's Relax import kept on disk, so the next run skips the exporter.

Exporting a torch model and importing it (``torch.export``, ``run_decompositions``,
``from_exported_program``) is most of the time a zoo model takes to load: 6.3 of 8.5 s
of CPU for a 12-layer GPT-2, more than the rewrites, checks and reports of
``patternkit run`` together.  The result only depends on the spec and on the code that
made it, so it is kept, in the user's cache folder.

A Relax module cannot be serialised in TVM 0.27 (``save_json`` crashes on Relax
expressions, ``docs/tvm-bugs.md``), so an entry is the module's TVMScript text, its
tensor constants in an ``.npz`` file (the printer's ``metadata[...]`` references read
them back), and what else the import found (its fix-ups, the softmax calls of the
traced program, the weights kept as parameters) with the rest of the model's description
(inputs, sizes, family counts, metadata), so that a hit builds no torch module: the zoo
builds it only if something reads the model's ``source`` or reference
(:class:`patternkit.models.zoomodel.Deferred`).

* **Never stale**: an entry's key is the canonical spec and the versions of Python,
  numpy, torch, transformers and TVM, plus a digest of every source file of patternkit
  itself (any change to the package, the importer's fix-ups included, makes a new key).
* **Never wrong**: an entry holds the structural hash of the module it was written from
  (constants by value); reading parses the text and gives the module only if its hash
  is the same.  Else the model is imported again and the entry is replaced by a note
  that this spec's text does not read back, so no later run pays for the parse again
  (writing parses nothing: a miss costs the printing, 0.1 s for GPT-2's 12 layers).
* **Asked for**: only inside :func:`using` (the job's loader, :mod:`patternkit.app.loading`,
  uses it), never when ``PATTERNKIT_IMPORT_CACHE=0``; the folder is
  ``PATTERNKIT_IMPORT_CACHE_DIR``, else ``$XDG_CACHE_HOME/patternkit/imports``
  (``~/.cache/patternkit/imports``).  A folder that cannot be written costs the saving,
  never the run.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import tempfile
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

logger = logging.getLogger(__name__)

#: ``0`` turns the cache off everywhere.
SWITCH = "PATTERNKIT_IMPORT_CACHE"
#: The cache folder, when not the default.
FOLDER = "PATTERNKIT_IMPORT_CACHE_DIR"
#: Bumped when an entry's layout changes (2: the model's description).
LAYOUT = 2

_ACTIVE: ContextVar[bool] = ContextVar("patternkit_import_cache", default=False)
_META = re.compile(r'metadata\["ir\.GenericConst"\]\[(\d+)\]')
_NON_FINITE = re.compile(r'R\.const\("(-?inf|nan)", ')
_IMPORT_COMMENT = re.compile(r"^# from (\S+) import (\S+)(?: as (\S+))?$")


@dataclass(frozen=True)
class Imported:
    """What a torch zoo model's import gave: the module, the weights it kept as
    parameters (name -> array), what the converters and fix-ups changed, the softmax
    calls of the traced program (for the model's family counts), and the rest of the
    model as JSON values (:func:`patternkit.models.zoomodel.description`: inputs, sizes,
    families, metadata), so that a hit needs no torch module.
    """

    mod: tvm.IRModule
    params: dict[str, np.ndarray]
    fixups: list[str]
    softmax: int
    description: dict[str, Any] | None = None


@contextlib.contextmanager
def using(on: bool = True) -> Iterator[None]:
    """Within the block, zoo builds read and write the cache (unless switched off)."""
    token = _ACTIVE.set(on)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    """Whether a zoo build now reads and writes the cache."""
    return _ACTIVE.get() and os.environ.get(SWITCH, "1") != "0"


def folder() -> Path:
    """The cache folder (not created)."""
    given = os.environ.get(FOLDER)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "patternkit" / "imports"


def key(spec_text: str) -> str:
    """The entry name of ``spec_text`` under today's versions and patternkit's sources."""
    parts = [f"layout={LAYOUT}", spec_text, platform.python_version(), np.__version__,
             tvm.__version__, _version("torch"), _version("transformers"), _sources_digest()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def read(spec_text: str) -> Imported | None:
    """The cached import of ``spec_text``, or ``None`` (off, missing, or not the module
    it was written from: then the entry is dropped).
    """
    if not active():
        return None
    entry = folder() / key(spec_text)
    if _unusable(entry).exists():
        return None
    try:
        meta = json.loads((entry / "meta.json").read_text())
        text = (entry / "module.py").read_text()
        with np.load(entry / "constants.npz") as saved:
            constants = {name: saved[name] for name in saved.files}
        with np.load(entry / "params.npz") as saved:
            params = {name: saved[name] for name in meta["params"]}
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - a damaged entry is a miss, never a failure
        logger.warning("import cache: %s unreadable (%s: %s); importing again", entry,
                       type(err).__name__, err)
        _drop(entry)
        return None
    mod = _parse(text, constants)
    if mod is None or str(tvm_ffi.structural_hash(mod)) != meta["structural_hash"]:
        logger.warning("import cache: %s does not give back the module it was written "
                       "from; importing again (and not keeping this model)", entry)
        _drop(entry)
        with contextlib.suppress(OSError):
            _unusable(entry).write_text(spec_text + "\n")
        return None
    return Imported(mod, params, list(meta["fixups"]), int(meta["softmax"]),
                    meta.get("description"))


def write(spec_text: str, imported: Imported) -> bool:
    """Keep ``imported`` for ``spec_text``; whether it was kept (not when the cache is off,
    the module's text is known not to read back to it, or the folder cannot be written).
    """
    entry = folder() / key(spec_text)
    if not active() or _unusable(entry).exists():
        return False
    text, constants = _text_of(imported.mod)
    if text is None:
        return False
    meta = {"spec": spec_text, "structural_hash": str(tvm_ffi.structural_hash(imported.mod)),
            "fixups": list(imported.fixups), "softmax": imported.softmax,
            "params": list(imported.params), "description": imported.description}
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=entry.parent))
        (staging / "module.py").write_text(text)
        arrays: dict[str, Any] = {"constants": constants, "params": imported.params}
        for name, saved in arrays.items():
            np.savez(staging / f"{name}.npz", **saved)
        (staging / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            staging.rename(entry)  # atomic: a reader sees a whole entry or none
        except OSError:  # another run kept the same entry first
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as err:
        logger.warning("import cache: cannot write %s (%s)", entry, err)
        return False
    return True


# -- the module as text, and back -------------------------------------------------------------
def _text_of(mod: tvm.IRModule) -> tuple[str | None, dict[str, np.ndarray]]:
    """``(TVMScript of mod with its tensor constants read from _weights, the constants)``;
    ``(None, {})`` when the printer numbered constants the module walk does not find, or
    a constant's dtype has no name in an ``.npz`` file (bfloat16).
    """
    text = mod.script()
    constants = _constants_in_print_order(mod, text)
    indices = {int(i) for i in _META.findall(text)}
    if indices and max(indices) >= len(constants):
        return None, {}
    arrays = {f"c{i}": constants[i].value.numpy() for i in sorted(indices)}
    if any(a.dtype.kind not in "biuf" for a in arrays.values()):  # bfloat16: npz has no name
        return None, {}
    # each constant once, by name: a constant the module uses twice is one object again
    text = _META.sub(lambda m: f'_weights["c{m.group(1)}"]', text)
    return _NON_FINITE.sub(r'R.const(float("\1"), ', text), arrays


def _parse(text: str, constants: dict[str, np.ndarray]) -> tvm.IRModule | None:
    """The module of a :func:`_text_of` text, or ``None`` when it does not parse."""
    names: dict[str, Any] = {"_weights": {name: relax.const(array, str(array.dtype))
                                          for name, array in constants.items()}}
    body = []
    for line in text.splitlines():
        found = _IMPORT_COMMENT.match(line)
        if found:
            module, name, alias = found.groups()
            names[alias or name] = getattr(__import__(module, fromlist=[name]), name)
        elif not line.startswith("# "):
            body.append(line)
    try:
        return tvm.script.from_source("\n".join(body), extra_vars=names)
    except Exception as err:  # noqa: BLE001 - the parser's errors share no base class
        logger.debug("import cache: the text does not parse: %s", err)
        return None


def _constants_in_print_order(mod: tvm.IRModule, text: str) -> list:
    """Tensor constants in the order the printer numbers them: functions as printed,
    bindings in order, arguments left to right, each constant once.
    """
    funcs = {gv.name_hint: f for gv, f in mod.functions.items()}
    found: list = []
    seen: set = set()

    def visit(expr: Any) -> None:
        if isinstance(expr, tvm.ir.GenericConst) and expr.value.ndim > 0:  # scalars: inline
            if expr.__hash__() not in seen:
                seen.add(expr.__hash__())
                found.append(expr)

    for name in re.findall(r"^    def (\w+)\(", text, flags=re.M):
        if isinstance(funcs.get(name), relax.Function):
            relax.analysis.post_order_visit(funcs[name], visit)
    return found


# -- the key's parts -----------------------------------------------------------------------
def _version(package: str) -> str:
    try:
        from importlib.metadata import version

        return f"{package}={version(package)}"
    except Exception:  # noqa: BLE001 - not installed
        return f"{package}=none"


@functools.cache
def _sources_digest() -> str:
    """A digest of every Python file of the patternkit package (once per process)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _drop(entry: Path) -> None:
    shutil.rmtree(entry, ignore_errors=True)


def _unusable(entry: Path) -> Path:
    """The note that ``entry``'s model does not read back from its text."""
    return entry.with_suffix(".unusable")
