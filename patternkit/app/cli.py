"""The ``patternkit`` command line: ``run``, ``coverage``, ``list``, ``viz``, ``verify``,
``merge`` (:mod:`patternkit.app.campaign`), ``fuzz``, ``bisect``.

Each command is a thin shell over :mod:`patternkit.app.job` (``run``, which returns a
typed :class:`~patternkit.app.report.JobReport`), :mod:`patternkit.app.coverage`,
:mod:`patternkit.app.verify` or the visualiser, so everything is also one Python call
away.  Exit codes: 0 success, 1 a check failed, 2 bad input (a one-line error;
``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import PatternkitError, first_line, tvm_error_line
from .campaign import add_merge_command, add_record_options, record_options
from .campaign.executor_options import add_executor_options, executor_options
from .console import Console
from .explore import add_explore_command, add_run_options, explore_run
from .progress import Progress

if TYPE_CHECKING:  # the report loads TVM; the command line loads it only when a command runs
    from .report import RoundTripEntry


def _progress(args: argparse.Namespace) -> Progress:
    """The command's progress (:mod:`.progress`: live on a terminal), one per command."""
    if getattr(args, "progress", None) is None:
        args.progress = Progress(_stream(args), quiet=getattr(args, "quiet", False))
    return args.progress


def _stream(args: argparse.Namespace):
    """Where the command's own lines go: the console's stream (see :mod:`.console`)."""
    console = getattr(args, "console", None)
    return console.stream if console is not None else sys.stderr


def _input_range(text: str) -> tuple[str, tuple[int, int]]:
    """``name=lo:hi`` -> ``(name, (lo, hi))`` (``lo <= v < hi``), for ``--input-range``."""
    name, eq, bounds = text.partition("=")
    lo, colon, hi = bounds.partition(":")
    try:
        if not (name and eq and colon):
            raise ValueError
        low, high = int(lo), int(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected NAME=LOW:HIGH (integers, LOW <= value < HIGH), found {text!r}") from None
    if low >= high:
        raise argparse.ArgumentTypeError(f"{text!r}: LOW must be below HIGH")
    return name, (low, high)


def _cmd_run(args: argparse.Namespace) -> int:
    from .job import run
    from .loading import keep_params_spec

    patterns = [p.strip() for p in args.patterns.split(",") if p.strip()] if args.patterns else None
    model = keep_params_spec(args.model) if args.keep_params else args.model
    report = run(model, patterns=patterns, compiler=args.compiler, out_dir=args.out,
                 seed=args.seed, draw=not args.no_draw, func=args.func,
                 input_ranges=dict(args.input_range or ()), train=args.train,
                 full_drawing=args.full_drawing, progress=_progress(args), tables=args.table)
    _progress(args).close()  # before the results print
    if not args.quiet:
        composites = sum(report.offload.composites.values())
        numeric_ = report.numeric
        wide = numeric_.float64
        print(f"{report.verdict}: {report.model}: "
              f"rewrites {report.rewrites or '{}'}, {composites} composite(s), "
              f"{len(report.offload.host_ops)} op(s) on the host; numeric max abs error "
              f"{_figure(numeric_.max_abs_error):.3g}"
              + (f" ({numeric_.dtype}: from float64, imported "
                 f"{wide.get('imported', float('nan')):.3g}, rewritten "
                 f"{wide.get('rewritten', float('nan')):.3g})"
                 if wide else "")
              + f"{' (REFUSED: inputs out of bounds)' if numeric_.refused else ''}; "
              f"evidence: {report.evidence}; "
              f"round trips {_roundtrip_summary(report.roundtrip)}; "
              + (f"{len(report.near_misses.misses)} near miss(es) (a family's shape its rules "
                 f"declined, listed with the reason); " if report.near_misses
                 and report.near_misses.misses else "")
              + (f"gradients {_training_summary(report.training)}; " if args.train else "")
              + f"report in {args.out}/report.md")
        for site in report.sites.report.sites if report.sites.report is not None else ():
            if site.status == "fail":
                print(f"FAIL {site.rule} in {site.function} at {site.binding}: "
                      f"{site.reason}")
    if args.explore:
        explore_run(args, report)
    from .report import EXIT_CODES

    return EXIT_CODES[report.verdict]


def _training_summary(training: dict) -> str:
    """``ok``, ``FAILED``, or ``NOT RUN (why)`` when there was nothing to check: a model
    without a floating-point parameter is not a failed gradient check.
    """
    if "ok" not in training or "reason" in training:
        return f"NOT RUN ({training.get('reason', 'not checked')})"
    return "ok" if training["ok"] else "FAILED"


def _figure(value: float | None) -> float:
    return float("nan") if value is None else value


def _roundtrip_summary(roundtrip: Mapping[str, RoundTripEntry]) -> str:
    """``ok``, or which round trips failed, and where the fusion itself was at fault."""
    failed = [name + (" (the fusion's own output is not well formed)"
                      if entry.fusion_ill_formed else "")
              for name, entry in roundtrip.items() if not entry.ok]
    not_run = [name for name, entry in roundtrip.items() if entry.not_run is not None]
    if failed:
        return f"FAILED: {', '.join(failed)}"
    return f"NOT RUN: {', '.join(not_run)}" if not_run else "ok"


def _cmd_coverage(args: argparse.Namespace) -> int:
    from .campaign.coverage_campaign import coverage_recorded

    tables = [t.strip() for t in args.table.split(",") if t.strip()]
    out = args.resume or args.out  # recorded unit by unit: patternkit.app.campaign
    report, rows = coverage_recorded(args.models, tables, out, resume=bool(args.resume),
                                     jobs=args.jobs, tick=_progress(args).tick,
                                     shard=_shard(args), **executor_options(args))
    _progress(args).close()
    for failure in report.failures:  # a model that did not load
        print(f"{failure.target}: {failure.error}")
    if not args.quiet:
        for r in rows:
            print(f"{r['model']}  {r['table']:<12} {r['stage']:<15} {r['share']:>5.0%} of "
                  f"{r['op_calls']} op calls, {r['regions']} region(s)")
        print(f"report in {out}/coverage.md")
    return 1 if report.failures else 0


def _cmd_list(args: argparse.Namespace) -> int:
    if args.models:
        return _list_models()
    from patternkit.patterns import catalog

    entries = catalog()
    width = max(len(e.name) for e in entries)
    for e in entries:
        print(f"{e.name:<{width}}  {e.kind:<9}  {e.summary}")
    return 0


def _list_models() -> int:
    from ..models import BUILTIN_MODELS, ZOO  # lists without importing transformers or onnx

    print("built-in models (Relax, no extras needed):")
    for name in BUILTIN_MODELS:
        print(f"  {name}")
    print("zoo models (zoo:NAME?option=value&...; needs the torch / onnx extras):")
    for entry in ZOO.values():
        print(f"  zoo:{entry.name}  {entry.summary}")
        for key, option in entry.options.items():
            choices = f" ({'|'.join(map(str, option.choices))})" if option.choices else ""
            default = str(option.default).lower() if isinstance(option.default, bool) \
                else option.default
            print(f"      {key}={default}{choices}  {option.help}")
    return 0


VIZ_FORMATS = ("svg", "png", "pdf", "dot", "json", "plain")


def _cmd_viz(args: argparse.Namespace) -> int:
    from tvm import relax

    from .drawings import fitted_drawing
    from .loading import JobError, entry_function, load_model
    from .rules import resolve_rules

    mod, _ = load_model(args.model)
    target = Path(args.output)
    fmt = args.format or target.suffix.lstrip(".") or "svg"
    if fmt not in VIZ_FORMATS:
        raise JobError(f"unknown drawing format {fmt!r}: one of {', '.join(VIZ_FORMATS)}")
    options: dict[str, Any] = {}
    if args.func is not None:
        options["functions"] = [entry_function(mod, args.func)]
    if args.focus is not None:
        options["focus"] = args.focus
        options["radius"] = args.context if args.context is not None else 2
    if args.collapse is not None:
        options["collapse"] = args.collapse.split(",") if "," in args.collapse \
            else args.collapse
    if args.highlight is not None:
        rules = list(resolve_rules([args.highlight]))
        if len(rules) != 1:
            raise JobError(f"--highlight takes one rule; {args.highlight!r} names {len(rules)}")
        options["highlight"] = rules[0]
    other = load_model(args.diff)[0] if args.diff is not None else None
    relax_names = {gv.name_hint for gv, f in mod.functions.items()
                   if isinstance(f, relax.Function)}
    func = args.func or ("main" if "main" in relax_names else None)
    graph, how = fitted_drawing(mod, func=func, options=options, full=args.full, other=other,
                                context=None if args.focus else args.context,
                                layout=fmt not in ("dot", "json"))
    path = graph.render(target, format=fmt)
    if not args.quiet:
        print(f"wrote {path}" + (f" ({how}; --full draws every node)" if how else ""))
    return 0


def _shard(args: argparse.Namespace) -> tuple[int, int] | None:
    from ..testing.fuzz import parse_shard

    try:
        return parse_shard(args.shard) if args.shard else None
    except ValueError as err:
        raise PatternkitError(str(err)) from None


def _campaign_options(args: argparse.Namespace) -> dict:
    return dict(budget=args.budget, seed=args.seed, jobs=args.jobs, shard=_shard(args),
                tick=_progress(args).tick)


def _print_campaign(report, quiet: bool, progress: Progress) -> int:
    progress.close()  # before the results print
    if not report.targets and report.shard is not None:  # the stable hash gave it no unit
        print(f"shard {report.shard[0]}/{report.shard[1]} holds none of the campaign's units")
        return 0
    if quiet:
        for target in report.targets:
            print(target.summary())
    else:
        print(report)
    return 0 if report.ok else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify

    rules = None
    if args.rules:
        from patternkit.patterns import LIBRARY
        unknown = [name for name in args.rules if name not in LIBRARY.names]
        if unknown:
            raise PatternkitError(f"no library rule {', '.join(unknown)} "
                                  f"(see patternkit list)")
        rules = [LIBRARY[name] for name in args.rules]
    report = verify(rules, progress=_progress(args), **_campaign_options(args),
                    **record_options(args), **executor_options(args))
    return _print_campaign(report, args.quiet, _progress(args))


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from ..testing.fuzz import fuzz_pass, fuzz_roundtrip

    options = _campaign_options(args)
    executor = executor_options(args)  # a refused --executor is an error before any work
    if record_options(args):  # recorded unit by unit: patternkit.app.campaign
        from .campaign import fuzz_recorded
        report = fuzz_recorded(args.target, strategy=args.strategy, progress=_progress(args),
                               **options, **record_options(args), **executor)
    elif args.target == "roundtrip":
        report = fuzz_roundtrip(**options)
    else:
        resolve_transform(args.target)  # a bad name is an error here, not in a worker
        report = fuzz_pass(args.target, strategy=args.strategy, **options)
    return _print_campaign(report, args.quiet, _progress(args))


def _cmd_bisect(args: argparse.Namespace) -> int:
    from ..testing.bisection import bisect
    from .loading import load_model

    mod, _ = load_model(args.model)
    steps = [resolve_transform(name) for name in args.steps.split(",")] if args.steps else None
    if steps is None:
        from patternkit.patterns import LIBRARY
        steps = LIBRARY
    found = bisect(mod, steps)
    if found is None:
        print(f"PASS: no step of the pipeline changes the numbers of {args.model}")
        return 0
    print(found)
    if args.draw:
        path = found.drawing().render(Path(args.draw), format=Path(args.draw).suffix[1:] or "svg")
        print(f"wrote {path}")
    return 1


def resolve_transform(name: str):
    """A rule or pass by name (see :func:`patternkit.testing.fuzz.resolve_target`)."""
    from ..testing.fuzz import resolve_target

    try:
        return resolve_target(name)
    except ValueError as err:
        raise PatternkitError(str(err)) from None


def _add_campaign_options(parser: argparse.ArgumentParser, budget_help: str) -> None:
    parser.add_argument("--budget", type=int, default=None, help=budget_help)
    parser.add_argument("--seed", type=int, default=0, help="seed of the instances (default 0)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="check only shard K of N of the instances")
    parser.add_argument("--quiet", action="store_true", help="one line per target")


def build_parser() -> argparse.ArgumentParser:
    """The ``patternkit`` parser: one subcommand per command, each with its handler."""
    parser = argparse.ArgumentParser(prog="patternkit",
                                     description="Relay-style pattern rewriting on TVM Relax")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks on errors, and TVM's and torch's own log "
                             "(held back otherwise)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="rewrite, partition and verify a model",
                         epilog="exit status: 0 PASS, 1 FAIL, 2 bad input, 3 NOT RUN "
                                "(nothing failed and nothing could be judged: the model as "
                                "imported does not build for llvm, or its outputs are no "
                                "evidence and no rewrite site stood in), 4 internal error "
                                "(a bug to report).  patternkit --debug "
                                "run ... shows "
                                "tracebacks and the TVM/torch log a run holds back")
    run.add_argument("model", nargs="?", default=None,
                     help="built-in model name (default resnet18), a zoo spec "
                          "(zoo:gpt2?batch=dynamic; see list --models), a .py file defining "
                          "an IRModule, an .onnx file or a .pt2 file (torch.export.save)")
    run.add_argument("--patterns",
                     help="comma-separated library names, rules.py:NAME or rules.py (every "
                          "rule the file defines: rule objects, by-example and from_rewriter "
                          "rules, rule classes built without arguments); 'library' is the "
                          "whole library, so library,rules.py applies the file's rules with "
                          "the library (rules.py alone: instead of it); default: the whole "
                          "library")
    run.add_argument("--func", help="entry function (default: main, else the only public one)")
    run.add_argument("--input-range", action="append", type=_input_range, metavar="NAME=LO:HI",
                     help="draw integer input NAME in [LO, HI) (repeatable); default: the "
                          "size of the table it indexes")
    run.add_argument("--train", action="store_true",
                     help="also differentiate the model (sum loss, every float parameter) "
                          "and check the gradients against finite differences")
    run.add_argument("--keep-params", action="store_true",
                     help="import the weights of a .pt2 file or a zoo model as parameters "
                          "of the entry function instead of constants (what --train "
                          "differentiates); the same as ?keep_params=true on the spec")
    run.add_argument("--full-drawing", action="store_true",
                     help="draw every node (default: repeated layers once, composites "
                          "collapsed, when the full layout would be slow)")
    run.add_argument("--compiler", default="ccompiler", help="external compiler name")
    run.add_argument("--table", default=None,
                     help="partition with TVM's registered pattern tables instead of the "
                          "library's composites (comma-separated: cutlass,tensorrt)")
    run.add_argument("--out", default="patternkit-out", help="output folder")
    run.add_argument("--seed", type=int, default=0, help="seed for the random inputs")
    run.add_argument("--no-draw", action="store_true", help="skip the SVG drawings")
    run.add_argument("--quiet", action="store_true",
                     help="print nothing but errors (and warnings about your own rules)")
    run.set_defaults(handler=_cmd_run)
    add_run_options(run)

    cov = sub.add_parser("coverage", help="how much of a model TVM's pattern tables offload")
    cov.add_argument("models", nargs="+", help="built-in model names, .py or .onnx files")
    cov.add_argument("--table", required=True,
                     help="comma-separated registered prefixes (cutlass,tensorrt)")
    cov.add_argument("--out", default="patternkit-coverage",
                     help="output folder (with one JSON line per model: patternkit merge)")
    cov.add_argument("--resume", metavar="DIR", default=None,
                     help="go on with the coverage recorded in DIR, skipping its models")
    cov.add_argument("--shard", default=None, metavar="K/N",
                     help="measure only shard K of N of the models (by a stable hash)")
    cov.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    add_executor_options(cov)
    cov.add_argument("--quiet", action="store_true")
    cov.set_defaults(handler=_cmd_coverage)

    lst = sub.add_parser("list", help="the pattern library: names, kinds, one-line docs")
    lst.add_argument("--models", action="store_true",
                     help="list the built-in and zoo models and their options instead")
    lst.set_defaults(handler=_cmd_list)

    viz = sub.add_parser("viz", help="draw a model")
    viz.add_argument("model", help="built-in model name, zoo spec, .py or .onnx file")
    viz.add_argument("-o", "--output", default="graph.svg",
                     help="output file; its suffix gives the format unless --format does")
    viz.add_argument("--format", choices=VIZ_FORMATS,
                     help="svg, png, pdf (Graphviz), dot (the DOT text), json (the graph "
                          "model), plain (Graphviz' layout as text)")
    viz.add_argument("--func", help="draw only this function (and what it calls)")
    viz.add_argument("--focus", help="draw only the nodes around this variable")
    viz.add_argument("--context", type=int, metavar="HOPS",
                     help="hops kept around --focus, or around the changes with --diff")
    viz.add_argument("--collapse", metavar="auto|all|none|GLOB[,GLOB...]",
                     help="draw composite, codegen and fused functions as single boxes: auto "
                          "(the default: whole kinds at a time, the largest first, until at "
                          "most 150 nodes remain), all, none, or those whose composite or "
                          "function name matches one of the comma-separated globs "
                          "('dnnl.*,fused_*')")
    viz.add_argument("--full", action="store_true",
                     help="every node as Graphviz lays it out: no folding of repeated layers, "
                          "no columns or scaling to fit 10,000 px a side, no auto-collapse "
                          "(unless --collapse says), a 120 s layout timeout")
    viz.add_argument("--diff", metavar="OTHER", help="draw what changed from MODEL to OTHER")
    viz.add_argument("--highlight", metavar="RULE",
                     help="outline the matches of a library rule (or rules.py:NAME)")
    viz.add_argument("--quiet", action="store_true")
    viz.set_defaults(handler=_cmd_viz)

    add_explore_command(sub)

    ver = sub.add_parser("verify", help="fuzz the guard of every library rule on llvm")
    ver.add_argument("rules", nargs="*", help="library rule names (default: all)")
    _add_campaign_options(ver, "instances per rule (default 8; 200 with "
                               "HYPOTHESIS_PROFILE=long)")
    add_record_options(ver)
    add_executor_options(ver)
    ver.set_defaults(handler=_cmd_verify)
    add_merge_command(sub)

    fuzz = sub.add_parser("fuzz", help="differential-test a pass or rule on random programs")
    fuzz.add_argument("target", help="a relax.transform pass (FoldBatchnormToConv2D), a "
                                     "library rule, module:callable, or 'roundtrip' "
                                     "(DefuseOps after FuseOps)")
    _add_campaign_options(fuzz, "instances (default 300; roundtrip 300; more with "
                                "HYPOTHESIS_PROFILE=long)")
    fuzz.add_argument("--strategy", choices=("ops", "networks"), default="ops",
                      help="the random programs: grown from every operator's typing rule "
                           "(ops, the default) or network-like (networks)")
    add_record_options(fuzz)
    add_executor_options(fuzz)
    fuzz.set_defaults(handler=_cmd_fuzz)

    bis = sub.add_parser("bisect", help="the first rewrite or pass that changes the numbers")
    bis.add_argument("model", help="built-in model name, .py or .onnx file")
    bis.add_argument("--steps", help="comma-separated rules / passes, in order "
                                     "(default: the library's rules)")
    bis.add_argument("--draw", metavar="FILE", help="draw the failing step (svg, png, pdf)")
    bis.set_defaults(handler=_cmd_bisect)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names (default ``sys.argv[1:]``); the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    with Console(quiet=getattr(args, "quiet", False), debug=args.debug) as console:
        args.console = console
        try:
            with _progress(args):  # ends the live display, also when the command fails
                return args.handler(args)
        except (PatternkitError, OSError) as err:
            if args.debug:
                raise
            print(f"patternkit: error: {first_line(err)}", file=console.stream)
            return 2
        except Exception as err:  # noqa: BLE001 - a fault of patternkit's or TVM's, not input
            if args.debug:
                raise
            print(f"patternkit: internal error: {type(err).__name__}: {tvm_error_line(err, 300)} "
                  f"(patternkit --debug {args.command} ... shows the traceback; a bug to "
                  f"report)", file=console.stream)
            return INTERNAL_ERROR


#: The exit status of a command that stopped on an error neither of the input nor a check's
#: verdict: a bug in patternkit, or a TVM error no step expected (1 is a FAIL).
INTERNAL_ERROR = 4


if __name__ == "__main__":
    sys.exit(main())
