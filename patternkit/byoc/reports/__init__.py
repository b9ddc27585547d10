"""What a pattern table does to a model, told to the user.

:mod:`~patternkit.byoc.reports.offload`: what the compiler gets and why each other op
stays on the host; :mod:`~patternkit.byoc.reports.table_coverage`: the same counted per
op call, with the external regions ``PartitionGraph`` forms;
:mod:`~patternkit.byoc.reports.table_verification`: whether each entry of a table keeps
a model's numbers on the CPU.
"""

from .offload import HostOp, OffloadReport, explain_offload, offload_report
from .table_coverage import CoverageReport, OpRecord, coverage
from .table_verification import EntryFailure, TableVerification, verify_table

__all__ = ["offload_report", "explain_offload", "OffloadReport", "HostOp", "coverage",
           "CoverageReport", "OpRecord", "verify_table", "TableVerification", "EntryFailure"]
