"""External compilers: pattern tables, composites, annotation, partitioning, reports.

The Relay BYOC flow on Relax: a :class:`~patternkit.byoc.table.PatternTable` names the
subgraphs a compiler takes, ``MergeComposite`` (:mod:`~patternkit.byoc.merge`) wraps
them in ``Composite`` functions, ``AnnotateTarget`` and ``PartitionGraph``
(:mod:`~patternkit.byoc.external`) lift them into ``Codegen`` functions,
:mod:`~patternkit.byoc.offload` says what stayed on the host and why, and
:mod:`~patternkit.byoc.splitting` cuts a graph into runnable pieces (Relay's
``graph_split``), and :mod:`~patternkit.byoc.table_verification` checks numerically that
each entry of a table keeps a model's outputs, and
:mod:`~patternkit.byoc.table_coverage` counts how much of a model a table offloads.
"""

from .external import (AnnotateTarget, PartitionGraph, annotation_table, external_functions,
                       inline_external, partition_graph)
from .merge import (CompositeLog, FormedComposite, MergeComposite, SkippedComposite,
                    composite_counts, composite_functions, merge_composite)
from .offload import HostOp, OffloadReport, offload_report
from .splitting import GraphSplitError, graph_split, run_split
from .table import CompositeEntry, PatternTable, PatternTableError, pattern_table
from .table_coverage import CoverageReport, OpRecord, coverage
from .table_verification import EntryFailure, TableVerification, verify_table

__all__ = [
    "PatternTable", "PatternTableError", "CompositeEntry", "pattern_table",
    "MergeComposite", "merge_composite", "CompositeLog", "FormedComposite",
    "SkippedComposite", "composite_counts", "composite_functions",
    "AnnotateTarget", "PartitionGraph", "annotation_table", "partition_graph",
    "inline_external", "external_functions", "offload_report", "OffloadReport", "HostOp",
    "graph_split", "run_split", "GraphSplitError",
    "verify_table", "TableVerification", "EntryFailure", "coverage", "CoverageReport",
    "OpRecord",
]
