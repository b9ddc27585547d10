"""The ``patternkit`` command line.

``patternkit run`` is the main job: it loads a model (the built-in one by default),
applies the pattern library, partitions, checks the numbers on the llvm VM, and writes
what it did to an output folder.  Every step is one call in :mod:`patternkit.job`, so
notebooks and scripts never need to shell out.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .errors import PatternkitError


def _run(args: argparse.Namespace) -> int:
    from .job import run

    report = run(out_dir=args.out, seed=args.seed, quiet=args.quiet)
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="patternkit", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="rewrite, partition and verify the built-in model")
    run.add_argument("--out", default="patternkit-out", help="output folder")
    run.add_argument("--seed", type=int, default=0, help="seed for weights and inputs")
    run.add_argument("--quiet", action="store_true", help="print nothing but errors")
    run.set_defaults(handler=_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except (PatternkitError, OSError) as err:
        if args.debug:
            raise
        print(f"patternkit: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
