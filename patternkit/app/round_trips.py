"""The job's fuse/defuse round trips, run in a thread while the job builds and checks.

The round trips (``DefuseOps(FuseOps(x)) == x`` on the model as it was, and undoing the
job's own ``MergeComposite`` + ``PartitionGraph``) read the modules the job made before it
builds, and nothing the build makes: on a 12-layer GPT-2 they are 0.5-0.7 s of the job,
most of it in TVM's passes, which let other Python threads run.  So the job starts them
before its build (:func:`start_round_trips`) and reads their results where it used to
run them: the results, the report and the order of its sections are the same; only
their timings, taken in the thread, overlap the build's.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import tvm

from ..verification.roundtrip import RoundTripResult, check_roundtrip

__all__ = ["RoundTrip", "round_trips", "start_round_trips"]


class RoundTrip(NamedTuple):
    """One round trip: the report's name for it, its timing's name, result and seconds."""

    name: str
    step: str
    result: RoundTripResult
    seconds: float


def round_trips(before: tvm.IRModule, rewritten: tvm.IRModule,
                partitioned: tvm.IRModule | None, entry: str) -> list[RoundTrip]:
    """``FuseOps`` on ``before``; and, when the job partitioned ``rewritten`` into
    ``partitioned``, that partition undone.  In this order.
    """
    def timed(name: str, step: str, *args, **options) -> RoundTrip:
        start = time.perf_counter()
        result = check_roundtrip(*args, func_name=entry, raise_on_failure=False, **options)
        return RoundTrip(name, step, result, round(time.perf_counter() - start, 3))

    done = [timed("FuseOps", "roundtrip_fuseops", before)]
    if partitioned is not None:
        def partitioned_above(mod: tvm.IRModule) -> tvm.IRModule:
            # the module the composites step partitioned: the round trip undoes what the
            # job ran, not a second run of MergeComposite + PartitionGraph
            assert mod is rewritten
            return partitioned

        done.append(timed("MergeComposite+PartitionGraph", "roundtrip_composites",
                          rewritten, partitioned_above))
    return done


def start_round_trips(before: tvm.IRModule, rewritten: tvm.IRModule,
                      partitioned: tvm.IRModule | None, entry: str) -> Future[list[RoundTrip]]:
    """:func:`round_trips` in a thread of its own; an error is raised by ``result()``."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="patternkit-round-trips")
    try:
        return pool.submit(round_trips, before, rewritten, partitioned, entry)
    finally:
        pool.shutdown(wait=False)  # the thread ends with its one task
