"""Recorded campaigns on the command line: ``verify``/``fuzz --out/--resume/--db``, ``merge``.

Why: a campaign's results are data (:mod:`patternkit.testing.campaign`: one JSON line per
unit), so shards run on separate machines, a killed run goes on where it stopped, and
``patternkit merge`` folds the shards' folders into one report.  This module holds the
command line's side: the options, the one-line errors, the ``merge`` command.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from ...errors import PatternkitError

__all__ = ["verify_recorded", "fuzz_recorded", "add_record_options", "record_options",
           "add_merge_command"]


def verify_recorded(rules: Any = None, *, out: str | Path, resume: bool = False,
                    budget: int | None = None, seed: int = 0, jobs: int = 1,
                    shard: tuple[int, int] | None = None,
                    progress: Callable[[str], None] | None = None, **options: Any) -> Any:
    """Verify ``rules`` (default: the library's) unit by unit, recorded in ``out``.

    See :func:`patternkit.testing.campaign.run_verify_campaign`.
    """
    from ...testing.campaign import check_library_rules, run_verify_campaign
    from ...testing.fuzz import default_budget

    if rules is None:
        from patternkit.patterns import LIBRARY
        rules = LIBRARY
    rules = list(rules)
    budget = default_budget("verify") if budget is None else budget
    if progress is not None:
        progress(f"verifying {len(rules)} rule(s), {budget} instance(s) each, recorded in "
                 f"{out} ...")
    if jobs > 1:
        try:
            check_library_rules(rules)
        except ValueError as err:
            raise PatternkitError(str(err)) from None
    return run_verify_campaign(rules, out, budget=budget, seed=seed, shard=shard,
                               resume=resume, jobs=jobs, **options)


def add_record_options(parser: argparse.ArgumentParser) -> None:
    """``--out DIR`` and ``--resume DIR`` on a campaign's parser."""
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="record one JSON line per unit in DIR (patternkit merge folds "
                             "shards' folders)")
    parser.add_argument("--resume", metavar="DIR", default=None,
                        help="go on with the campaign recorded in DIR, skipping its units")
    parser.add_argument("--db", metavar="DIR", default=None,
                        help="keep failing units' shrunk reproducers in DIR (Hypothesis's "
                             "directory database) and replay them first next time")


def record_options(args: argparse.Namespace) -> dict:
    """``out``/``resume``/``db`` for :func:`patternkit.app.verify.verify` from the options."""
    if args.out and args.resume:
        raise PatternkitError("give --out DIR or --resume DIR, not both")
    db = getattr(args, "db", None)
    if db and not (args.out or args.resume):
        raise PatternkitError(f"--db {db} keeps the counterexamples of a recorded campaign: "
                              f"give --out DIR (or --resume DIR) too")
    found: dict[str, Any] = {"db": db} if db else {}
    if args.resume:
        return {"out": args.resume, "resume": True, **found}
    return {"out": args.out, **found} if args.out else {}


def fuzz_recorded(target: str, *, out: str | Path, resume: bool = False,
                  db: str | Path | None = None, budget: int | None = None, seed: int = 0,
                  jobs: int = 1, shard: tuple[int, int] | None = None,
                  strategy: str = "ops", executor: Any = None,
                  progress: Callable[[str], None] | None = None, **options: Any) -> Any:
    """``patternkit fuzz TARGET --out DIR``: program by program, recorded in ``out``.

    ``target`` is a name (``roundtrip`` for the round-trip campaign); see
    :func:`patternkit.testing.campaign.run_fuzz_campaign` and
    :func:`~patternkit.testing.campaign.run_roundtrip_campaign`.
    """
    from ...testing.campaign import (
        local_executor,
        process_executor,
        run_fuzz_campaign,
        run_roundtrip_campaign,
    )
    from ...testing.fuzz import default_budget

    if executor is None:
        executor = process_executor(jobs) if jobs > 1 else local_executor
    common = dict(seed=seed, shard=shard, resume=resume, db=db, executor=executor,
                  **options)
    if target == "roundtrip":
        budget = default_budget("roundtrip") if budget is None else budget
        if progress is not None:
            progress(f"round trips of {budget} graph(s), recorded in {out} ...")
        return run_roundtrip_campaign(out, budget=budget, **common)
    budget = default_budget("fuzz") if budget is None else budget
    if progress is not None:
        progress(f"fuzzing {target} on {budget} program(s), recorded in {out} ...")
    try:
        return run_fuzz_campaign(target, out, budget=budget, strategy=strategy, **common)
    except ValueError as err:
        if isinstance(err, PatternkitError):
            raise
        raise PatternkitError(str(err)) from None


def _cmd_merge(args: argparse.Namespace) -> int:
    from ...testing.campaign import merge_folders

    for folder in args.folders:
        if not Path(folder).is_dir():
            raise PatternkitError(f"merge: no folder {folder}")
    report, missing = merge_folders(args.folders)
    if args.quiet:
        for target in report.targets:
            print(target.summary())
    else:
        print(report)
    if missing:
        print(f"incomplete: {missing} unit(s) of the campaign are in none of the folders")
        return 1
    return 0 if report.ok else 1


def add_merge_command(sub: Any) -> None:
    """The ``merge`` subcommand."""
    cmd = sub.add_parser("merge", help="fold the record folders of a campaign's shards into "
                                       "one report")
    cmd.add_argument("folders", nargs="+", help="folders written by verify/fuzz --out")
    cmd.add_argument("--quiet", action="store_true", help="one line per target")
    cmd.set_defaults(handler=_cmd_merge)
