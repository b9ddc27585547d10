"""``before.py`` / ``after.py``: TVMScript files that load again with ``patternkit run``.

``IRModule.script()`` alone does not re-run:

* its imports are comments, so ``I`` is undefined, and so is ``TypeVar`` for a
  module-level symbolic dimension: the file gets real imports;
* tensor constants print as ``metadata["ir.GenericConst"][i]``, which the parser cannot
  read (and ``show_meta=True`` crashes on them in TVM 0.27): they go to
  ``<name>.weights.npz`` next to the file and are read back with
  ``R.const(_weights["c<i>"])`` at the same places;
* a scalar infinity or NaN prints as a string, ``R.const("-inf", "float32")``, which the
  parser refuses ("value has to be scalar or Tensor"), and the torch importer writes one
  into every sdpa attention mask: it is written ``R.const(float("-inf"), "float32")``.

The module is bound to ``mod``.  The written file is parsed again and compared
structurally with the module; if that fails (a constant the text does not show in
traversal order) the file says so in its first line rather than pretend.

Parsing a 12-layer GPT-2 back costs about a second of Python a file, so the job writes
both files in a thread (:func:`start_writing`) while it builds and checks: the builds
run in TVM's C++ with Python's lock released.
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

logger = logging.getLogger(__name__)

_IMPORT_COMMENT = re.compile(r"^# (from \S+ import \S.*|import \S+)$")
_META = re.compile(r'metadata\["ir\.GenericConst"\]\[(\d+)\]')
_NON_FINITE = re.compile(r'R\.const\("(-?inf|nan)", ')
_HEADER = '''"""{title}: written by patternkit; `patternkit run {name}` loads it again."""
from pathlib import Path

import numpy as np
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

_weights = {weights}

'''


def _constants_in_print_order(mod: tvm.IRModule, text: str) -> list:
    """Tensor constants in the order the printer numbers them: functions as printed,
    bindings in order, arguments left to right, each constant once.
    """
    order = re.findall(r"^    def (\w+)\(", text, flags=re.M)
    funcs = {gv.name_hint: f for gv, f in mod.functions.items()}
    found: list = []
    seen: set = set()

    def visit(expr):
        if isinstance(expr, tvm.ir.GenericConst) and expr.value.ndim > 0:  # scalars print inline
            key = expr.__hash__()
            if key not in seen:
                seen.add(key)
                found.append(expr)

    for name in order:
        func = funcs.get(name)
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def write_script(path: Path, mod: tvm.IRModule) -> str:
    """Write ``mod`` to ``path`` (and its weights beside it); return the file's name."""
    text = mod.script()
    indices = sorted({int(i) for i in _META.findall(text)})
    weights_file = path.with_suffix(".weights.npz")
    if indices:
        constants = _constants_in_print_order(mod, text)
        arrays = {f"c{i}": constants[i].value.numpy() for i in indices if i < len(constants)}
        np.savez(weights_file, **arrays)

        def const(match: re.Match) -> str:
            # with its dtype: R.const of an int64 array makes an int32 constant
            key = f"c{match.group(1)}"
            dtype = f', "{arrays[key].dtype}"' if key in arrays else ""
            return f'R.const(_weights["{key}"]{dtype})'

        text = _META.sub(const, text)
        weights = f'np.load(Path(__file__).with_name("{weights_file.name}"))'
    else:
        weights = "{}"
    # The printer writes its imports as comments (the TVM ones, and ``typing.TypeVar`` for
    # module-level symbolic dimensions): make them real.
    body = "\n".join(line[2:] if _IMPORT_COMMENT.match(line) else line
                     for line in text.splitlines())
    body = _NON_FINITE.sub(r'R.const(float("\1"), ', body)
    source = _HEADER.format(title=path.stem, name=path.name, weights=weights) + body
    source += "\n\nmod = Module\n" if "class Module" in body else "\n"
    path.write_text(source)
    if not _reloads(path, mod):
        path.write_text("# NOTE: this file does not load back to the same module\n" + source)
        logger.warning("%s does not parse back to the module it was written from", path)
    return path.name


def start_writing(out: Path, modules: dict[str, tvm.IRModule]) -> Future[list[str]]:
    """:func:`write_script` of each ``name -> module`` to ``out/<name>.py``, in a thread
    of its own; ``result()`` is the files' names in order (or raises what writing raised).
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="patternkit-scripts")
    try:
        return pool.submit(lambda: [write_script(out / f"{name}.py", mod)
                                    for name, mod in modules.items()])
    finally:
        pool.shutdown(wait=False)  # the thread ends with its one task


def _reloads(path: Path, mod: tvm.IRModule) -> bool:
    import runpy

    try:
        again = runpy.run_path(str(path)).get("mod")
    except Exception as err:  # any parse failure means: does not reload
        logger.debug("reloading %s failed: %s", path, err)
        return False
    return isinstance(again, tvm.IRModule) and tvm_ffi.structural_equal(again, mod)
