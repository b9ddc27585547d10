"""TVMScript's decorators given a cheaper ``inspect.stack`` for the test session.

``@I.ir_module``, ``@R.function`` and ``@T.prim_func`` call ``inspect.stack()`` to find
the class they are in and the variables around them.  ``inspect.stack`` reads a source
line for every frame of the stack, and finds each frame's module by scanning
``sys.modules`` again for every frame that belongs to no module file (an import's
frozen frames): with torch and transformers loaded that is thousands of modules a frame.
Under pytest's deep stacks it was two thirds of collecting the suite (392 decorators,
20,000 frames, about 35 s of each worker's start).

:func:`install` hands those three modules an ``inspect`` whose ``stack`` reads each
frame's lines from ``linecache`` directly (what ``inspect`` does once it has found the
file) and gives the same frames, names, lines and positions; everything else is the
real ``inspect``.  The tests only: patternkit itself changes nothing of TVM or Python.
"""

from __future__ import annotations

import dis
import importlib
import inspect
import linecache
import sys
import types

#: The modules whose decorators call ``inspect.stack()`` (apache-tvm 0.27.0.post1).
PARSER_ENTRIES = ("tvm.script.parser.ir.entry", "tvm.relax.script.parser.entry",
                  "tvm.tirx.script.parser.entry")


def stack(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack(context)`` of the caller, each frame's lines read by ``linecache``."""
    infos = []
    frame = sys._getframe(1)
    while frame is not None:
        infos.append(_frame_info(frame, context))
        frame = frame.f_back
    return infos


def _frame_info(frame: types.FrameType, context: int) -> inspect.FrameInfo:
    positions = inspect._get_code_position(frame.f_code, frame.f_lasti)  # as inspect does
    lineno = positions[0] if positions[0] is not None else frame.f_lineno
    positions = (lineno, *positions[1:])
    filename = frame.f_code.co_filename
    lines = linecache.getlines(filename, frame.f_globals) if context > 0 else []
    if lines:
        start = max(0, min(lineno - 1 - context // 2, len(lines) - context))
        code_context, index = lines[start:start + context], lineno - 1 - start
    else:
        code_context, index = None, None
    return inspect.FrameInfo(frame, filename, lineno, frame.f_code.co_name, code_context,
                             index, positions=dis.Positions(*positions))


def install() -> None:
    """Give :data:`PARSER_ENTRIES` the cheaper ``stack`` (a module missing is left alone)."""
    cheap = types.ModuleType("inspect")
    cheap.__dict__.update(inspect.__dict__)
    cheap.stack = stack  # type: ignore[attr-defined]
    for name in PARSER_ENTRIES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "inspect", None) is inspect:
            module.inspect = cheap  # type: ignore[attr-defined]
