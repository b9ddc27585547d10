"""What patternkit's converters for TVM's torch importer share: TVM's own converter of the
same op to fall back on, and a count of what they converted.

A converter in ``from_exported_program(custom_convert_map=...)`` replaces TVM's for every
call of its op, but patternkit's converters take only the calls TVM gets wrong (a
low-precision input, a symbolic count, a bfloat16 norm) and hand every other call back to
TVM's converter, so a model TVM imports imports exactly as without them.  TVM's table is
made per importer, and holds ours by the time a call arrives, so it is made afresh once an
import (:meth:`FallbackConverters._original`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from tvm import relax

Converter = Callable[[Any, Any], relax.Var]


class FallbackConverters:
    """Base of a ``custom_convert_map`` for one import: counts what it converted, per
    torch op (``converted``), and finds TVM's own converter of an op to fall back on.
    """

    def __init__(self) -> None:
        self.converted: Counter[str] = Counter()
        self._importer: Any = None
        self._originals: dict[str, Callable[[Any], relax.Var]] = {}

    def _original(self, importer: Any, op: str) -> Callable[[Any], relax.Var]:
        """TVM's own converter of ``op``, bound to the importer running now."""
        if importer is not self._importer:
            self._importer = importer
            self._originals = type(importer).create_convert_map(importer)
        return self._originals[op]
