"""``patternkit verify``: fuzz the guard of every library rule on llvm.

A thin face over :func:`patternkit.testing.fuzz.verify_rules` with the job's policy for
low-precision sites: a float16 site that misses its tolerance is measured against
itself recomputed in float64 before it counts as a failure.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["verify"]


def verify(rules: Any = None, *, budget: int | None = None, seed: int = 0, jobs: int = 1,
           shard: tuple[int, int] | None = None, progress: Callable[[str], None] | None = None,
           **options: Any) -> Any:
    """Fuzz the guard of every library rule (or of ``rules``); a ``CampaignReport``.

    Each rule is checked on its own example and on instances drawn from its
    ``example_space()``: see :func:`patternkit.testing.fuzz.verify_rules` for the
    parameters.
    Rewrites are held to ``rule.tolerance(dtype)``; composites, which only wrap bindings
    in functions, must give bit-identical results.
    With ``out=DIR`` (and ``resume=True``) the campaign is recorded unit by unit in DIR
    and shards by a stable hash of (rule, instance): :mod:`patternkit.app.campaign`.
    """
    from functools import partial

    from ..testing.fuzz import verify_rules
    from ..training.precision import as_float64

    # a float16 site that misses is measured against itself in float64 (picklable: jobs)
    options.setdefault("widen", partial(as_float64, name="site"))
    if options.get("out") is not None:  # recorded unit by unit: patternkit.app.campaign
        from .campaign import verify_recorded
        return verify_recorded(rules, budget=budget, seed=seed, jobs=jobs, shard=shard,
                               progress=progress, **options)
    if options.pop("db", None) is not None:
        raise ValueError("db keeps the counterexamples of a recorded campaign: give out too")
    options.pop("out", None), options.pop("resume", None)
    return verify_rules(rules, budget=budget, seed=seed, jobs=jobs, shard=shard,
                       progress=progress, **options)
