"""Pattern tables: the ordered entries an external compiler takes, patternkit's or TVM's.

:class:`~patternkit.byoc.tables.table.PatternTable` validates a list of
``(name, pattern[, check])`` entries once and keeps its order as the priority;
:mod:`~patternkit.byoc.tables.tvm_tables` reads the tables TVM registers
(``tvm.relax.backend.pattern_registry``) into entries; and
:mod:`~patternkit.byoc.tables.check_context` builds what a TVM entry's check expects to
receive (a ``PatternCheckContext``), so TVM's checks run unchanged on patternkit's matches.
"""

from .table import CompositeEntry, PatternTable, PatternTableError, pattern_table

__all__ = ["PatternTable", "PatternTableError", "CompositeEntry", "pattern_table"]
