"""``patternkit explore MODEL`` and ``patternkit run --explore``: a model in Model Explorer.

Both draw the pipeline the job runs -- the model as loaded, after the rewrite, and
partitioned for the compiler -- with :func:`patternkit.viz.explorer.explore`, write the
graphs and overlays to a folder, and serve them with Model Explorer's own server on
localhost until Ctrl+C (``--no-serve``: write only).

The job returns its report, not its intermediate modules, so :func:`explore_pipeline`
replays the job's rewrite and partitioning (both deterministic, and fast beside the
job's builds; a zoo model is built once per process) to draw them; the slow results --
the per-site validation verdicts -- come from the job's report.
"""

from __future__ import annotations

import argparse
import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the command line builds its parser without loading TVM
    from ..viz.explorer import Explorer

#: ``patternkit explore``'s output folder; ``run --explore`` writes into ``<out>/explorer``.
DEFAULT_FOLDER = "patternkit-explorer"


def explore_pipeline(model: Any, *, patterns: Any = None, compiler: str = "ccompiler",
                     tables: str | None = None, sites: Any = None,
                     fold: bool = True) -> Explorer:
    """The job's pipeline on ``model`` drawn for Model Explorer (see the module docstring).

    Parameters
    ----------
    model : str, Path or tvm.IRModule
        As :func:`patternkit.app.job.run` takes it.
    patterns, compiler, tables
        As :func:`patternkit.app.job.run` takes them.
    sites : SiteValidation or SiteReport, optional
        The job's per-site validation (``report.sites``), shown on the rewritten model.
    fold : bool
        Group repeated layers.
    """
    import tvm

    from ..byoc.merge import CompositeLog, merge_composite
    from ..byoc.partition import partition_graph
    from ..byoc.reports.offload import explain_offload
    from ..byoc.tables import PatternTable
    from ..engine.driver import RewriteLog, rewrite
    from ..viz.explorer import explore
    from .loading import load
    from .rules import resolve_rules

    before = model if isinstance(model, tvm.IRModule) else load(model).mod
    chosen = resolve_rules(patterns)
    rules = chosen.rewrite_rules()
    log = RewriteLog()
    rewritten = rewrite(rules, before, log=log) if rules else before
    table: Any = chosen.composites().for_compiler(compiler)
    table_compiler: str | None = compiler
    if tables:
        table, table_compiler = PatternTable.from_tvm(tables), None
    after = offload = None
    if table:
        table = PatternTable(table, table_compiler)
        merge_log = CompositeLog()
        merged = merge_composite(rewritten, table, log=merge_log)
        offload = explain_offload(merged, merge_log, table)
        if offload.composites:  # else nothing to partition: the rewritten model is "after"
            after = partition_graph(merged, table_compiler)
    if after is None:
        return explore(before, rewritten, log=log, sites=sites, fold=fold)
    return explore(before, after, rewritten=rewritten, log=log, offload=offload, sites=sites,
                   fold=fold)


def show(explorer: Explorer, folder: Path, args: argparse.Namespace,
         say: Callable[[str], None]) -> None:
    """Write ``explorer`` to ``folder``; unless ``--no-serve``, serve it until Ctrl+C."""
    explorer.write(folder)
    say(f"Model Explorer graphs in {folder}/ (drawn in {explorer.seconds:.2f} s)")
    if args.no_serve:
        return
    server = explorer.serve(port=args.port)
    # Ctrl+C may come as soon as the address is out, before wait() takes it over: the
    # whole serving phase ends the same way, with the server stopped and exit code 0.
    try:
        print(f"Model Explorer at {server.url}", flush=True)
        print("press Ctrl+C to stop", flush=True)
        if not args.no_browser:
            webbrowser.open_new_tab(server.url)
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def add_serving_options(parser: argparse.ArgumentParser) -> None:
    """``--port``, ``--no-browser``, ``--no-serve`` (shared by ``explore`` and ``run``)."""
    parser.add_argument("--port", type=int, default=None,
                        help="Model Explorer's port on localhost (default: a free one)")
    parser.add_argument("--no-browser", action="store_true",
                        help="print Model Explorer's address without opening a browser")
    parser.add_argument("--no-serve", action="store_true",
                        help="write the Model Explorer graphs without serving them")


def cmd_explore(args: argparse.Namespace) -> int:
    """``patternkit explore MODEL``."""
    patterns = [p.strip() for p in args.patterns.split(",") if p.strip()] \
        if args.patterns else None
    explorer = explore_pipeline(args.model, patterns=patterns, compiler=args.compiler,
                                tables=args.table, fold=not args.full)
    show(explorer, Path(args.out), args, print)
    return 0


def add_explore_command(sub: Any) -> None:
    """The ``explore`` subcommand."""
    cmd = sub.add_parser("explore", help="open a model, rewritten and partitioned, in "
                                         "Google's Model Explorer ([explorer] extra)")
    cmd.add_argument("model", nargs="?", default=None,
                     help="built-in model name (default resnet18), zoo spec, .py, .onnx or "
                          ".pt2 file")
    cmd.add_argument("--patterns", help="as for run (default: the whole library)")
    cmd.add_argument("--compiler", default="ccompiler", help="external compiler name")
    cmd.add_argument("--table", default=None,
                     help="partition with TVM's registered pattern tables (cutlass,...)")
    cmd.add_argument("--full", action="store_true",
                     help="do not group repeated layers")
    cmd.add_argument("--out", default=DEFAULT_FOLDER, help="folder for the graphs")
    add_serving_options(cmd)
    cmd.set_defaults(handler=cmd_explore)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """``run --explore`` and the serving options."""
    parser.add_argument("--explore", action="store_true",
                        help="also open the run in Google's Model Explorer (the graphs in "
                             "OUT/explorer, served until Ctrl+C; [explorer] extra)")
    add_serving_options(parser)


def explore_run(args: argparse.Namespace, report: Any) -> None:
    """``patternkit run --explore``: the run's pipeline, with its site verdicts, in Model
    Explorer (``<out>/explorer``).
    """
    from .loading import keep_params_spec

    patterns = [p.strip() for p in args.patterns.split(",") if p.strip()] \
        if args.patterns else None
    model = keep_params_spec(args.model) if args.keep_params else args.model
    explorer = explore_pipeline(model, patterns=patterns, compiler=args.compiler,
                                tables=args.table, sites=report.sites)
    show(explorer, Path(args.out) / "explorer", args, print)
