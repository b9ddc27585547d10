"""``--executor`` and ``--ray-address`` on a campaign's command line.

Why: where a campaign's units run is one choice the command line makes before any unit
runs: here (``--jobs N`` processes, the default) or on a Ray cluster
(:class:`patternkit.testing.ray_executor.RayExecutor`).  Choosing Ray builds the
executor at once, so a missing Ray or an address where no cluster answers is a one-line
error before a record folder is touched.
"""

from __future__ import annotations

import argparse

from ...errors import PatternkitError

__all__ = ["add_executor_options", "executor_options"]


def add_executor_options(parser: argparse.ArgumentParser) -> None:
    """``--executor {local,ray}`` and ``--ray-address`` on a campaign's parser."""
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="where units run: here (--jobs processes; the default) or as "
                             "Ray tasks on a cluster's long-lived workers (needs --out or "
                             "--resume, and the [ray] extra)")
    parser.add_argument("--ray-address", metavar="HOST:PORT", default=None,
                        help="the Ray cluster for --executor ray (default: $RAY_ADDRESS, "
                             "else a local Ray on this machine's CPUs)")


def executor_options(args: argparse.Namespace) -> dict:
    """``executor=`` for a recorded campaign from the options (``{}``: the local one).

    With ``--executor ray``, ``--jobs N`` (N > 1) sets the number of Ray workers
    (default: the cluster's CPUs).

    Raises
    ------
    PatternkitError
        ``--ray-address`` without ``--executor ray``; Ray without ``--out``/``--resume``;
        Ray not installed; no Ray cluster at the address.
    """
    if args.executor != "ray":
        if args.ray_address:
            raise PatternkitError("--ray-address is for --executor ray")
        return {}
    if not (getattr(args, "out", None) or getattr(args, "resume", None)):
        raise PatternkitError("--executor ray records its units: give --out DIR "
                              "(or --resume DIR)")
    from ...testing.ray_executor import RayExecutor

    jobs = getattr(args, "jobs", 1) or 1
    return {"executor": RayExecutor(args.ray_address, workers=jobs if jobs > 1 else None)}
