"""``AnnotateTarget`` and ``PartitionGraph``: lift composites into external functions.

:mod:`~patternkit.byoc.partition.external` holds the passes (Relay's BYOC workflow on
Relax) and their inverse, :func:`inline_external`;
:mod:`~patternkit.byoc.partition.regions` merges adjacent composites of one compiler into
one ``Codegen`` function around what TVM 0.27's ``MergeCompositeFunctions`` does not do;
:mod:`~patternkit.byoc.partition.region_splits` says which composites that merging kept
apart to avoid a cycle, and through which host path.
"""

from .external import (
    AnnotateTarget,
    PartitionGraph,
    annotation_table,
    external_functions,
    inline_external,
    partition_graph,
)

__all__ = ["AnnotateTarget", "PartitionGraph", "annotation_table", "partition_graph",
           "inline_external", "external_functions"]
