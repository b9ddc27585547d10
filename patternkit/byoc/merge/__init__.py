"""``MergeComposite``: wrap what a table's entries match in ``Composite`` functions.

Two semantics, chosen per table: Relay's (:mod:`~patternkit.byoc.merge.composites`, each
match becomes a local function where it was) and TVM's ``FuseOpsByPattern``
(:mod:`~patternkit.byoc.merge.tvm_fusion` plans every entry over one index per function,
:mod:`~patternkit.byoc.merge.fused_functions` emits the plan as private global functions,
which :mod:`~patternkit.byoc.merge.global_functions` shares and names as TVM's
``BlockBuilder`` does, and :mod:`~patternkit.byoc.merge.check_view` shows each entry's
check the function as the earlier entries rewrote it).  Either way a
:class:`CompositeLog` records what formed and what was skipped, and why.
"""

from .composites import (
    CompositeLog,
    FormedComposite,
    MergeComposite,
    SkippedComposite,
    composite_counts,
    composite_functions,
    merge_composite,
)

__all__ = ["MergeComposite", "merge_composite", "CompositeLog", "FormedComposite",
           "SkippedComposite", "composite_counts", "composite_functions"]
