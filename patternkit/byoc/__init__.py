"""External compilers: pattern tables, composites, partitioning, and reports on them.

The Relay BYOC flow on Relax, one subpackage per step:

* :mod:`~patternkit.byoc.tables`: a :class:`PatternTable` names the subgraphs a compiler
  takes (patternkit's own entries, or TVM's registered tables);
* :mod:`~patternkit.byoc.merge`: ``MergeComposite`` wraps them in ``Composite``
  functions (Relay's semantics or TVM's ``FuseOpsByPattern``'s);
* :mod:`~patternkit.byoc.partition`: ``AnnotateTarget`` and ``PartitionGraph`` lift them
  into ``Codegen`` functions, ``inline_external`` undoes it;
* :mod:`~patternkit.byoc.reports`: what stayed on the host and why (offload), how much
  of a model a table offloads (coverage), and whether each entry keeps a model's
  numbers (verification).

``graph_split`` (Relay's pipeline splitting, which is not BYOC) lives in
:mod:`patternkit.engine.splitting` and ``run_split``, which runs its pieces, in
:mod:`patternkit.verification.split_run`; both are still exported here.
"""

from ..engine.splitting import GraphSplitError, graph_split
from ..verification.split_run import run_split
from .merge import (
    CompositeLog,
    FormedComposite,
    MergeComposite,
    SkippedComposite,
    composite_counts,
    composite_functions,
    merge_composite,
)
from .partition import (
    AnnotateTarget,
    PartitionGraph,
    annotation_table,
    external_functions,
    inline_external,
    partition_graph,
)
from .reports import (
    CoverageReport,
    EntryFailure,
    HostOp,
    OffloadReport,
    OpRecord,
    TableVerification,
    coverage,
    explain_offload,
    offload_report,
    verify_table,
)
from .tables import CompositeEntry, PatternTable, PatternTableError, pattern_table

__all__ = [
    "PatternTable", "PatternTableError", "CompositeEntry", "pattern_table",
    "MergeComposite", "merge_composite", "CompositeLog", "FormedComposite",
    "SkippedComposite", "composite_counts", "composite_functions",
    "AnnotateTarget", "PartitionGraph", "annotation_table", "partition_graph",
    "inline_external", "external_functions", "offload_report", "explain_offload",
    "OffloadReport", "HostOp",
    "graph_split", "run_split", "GraphSplitError",
    "verify_table", "TableVerification", "EntryFailure", "coverage", "CoverageReport",
    "OpRecord",
]
