"""``blueprinting sweep``: one full ``search`` per cell of models x systems x GPU counts x global
batches (x sequence lengths), on Ray.

``blueprinting sweep [SWEEP.toml] --model M ... --system S ... --gpus N ... --global-batch B ...
[--seq-length S ...] [--train-tokens T] [--price SYSTEM=USD_PER_GPU_HOUR ...] --out DIR
[--address HOST:PORT] [--workers N] [--json] [--plot FILE.png|svg] [--plot-metric ...]
[--html FILE]``

Flags override the file: a list flag replaces the file's list, ``--price`` adds to or replaces
the file's price of that system. Everything is validated before Ray starts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from blueprinting.errors import ConfigError
from blueprinting.mapping.pipeline_layout import PipelineLayouts
from blueprinting.report.memory_table import GIB
from blueprinting.sweep.definition import (
    PlotMetric,
    SweepDefinition,
    definition_from_mapping,
    parse_price,
    read_sweep_file,
)

if TYPE_CHECKING:
    from blueprinting.sweep.engine import Engine
    from blueprinting.sweep.runner import SweepOutcome

#: Rows the text output lists (the files hold all).
MAX_ROWS_PRINTED = 60


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", type=Path, help="a SWEEP.toml (flags override it)")
    for flag, kind, what in (
        ("--model", str, "model preset(s)"),
        ("--system", str, "system preset(s)"),
        ("--gpus", int, "GPU count(s)"),
        ("--global-batch", int, "global batch size(s)"),
        ("--seq-length", int, "sequence length(s) (default: each model's preset)"),
    ):
        parser.add_argument(flag, type=kind, nargs="+", action="extend", help=f"{what}; repeatable")
    parser.add_argument("--train-tokens", type=int, help="tokens for GPU-hours and cost (300B)")
    parser.add_argument("--memory-headroom-gib", type=float, help="HBM kept free per GPU (0)")
    parser.add_argument("--max-micro-batch", type=int, help="largest micro-batch size tried")
    parser.add_argument(
        "--allow-cross-node-tp", action="store_true", default=None, help="TP groups span nodes"
    )
    parser.add_argument(
        "--no-megatron-rules",
        action="store_true",
        default=None,
        help="apply only the planner's laws, not Megatron-LM's start-up rules",
    )
    parser.add_argument("--flops-convention", help="how model FLOPs are counted (megatron-legacy)")
    parser.add_argument(
        "--precision",
        nargs="+",
        metavar="RECIPE",
        help="recipes every cell's search crosses, as search --precision (default: the model's "
        "datatype)",
    )
    parser.add_argument(
        "--pipeline-layouts",
        choices=[choice.value for choice in PipelineLayouts],
        help="stage layouts every cell's search enumerates, as search --pipeline-layouts "
        "(default: even)",
    )
    parser.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="SYSTEM=USD_PER_GPU_HOUR",
        help="price of a system's GPU-hour, for the cost column; repeatable",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder (resumable)")
    parser.add_argument("--address", help="join the Ray cluster at this address")
    parser.add_argument("--workers", type=int, help="cells in flight (default: every CPU)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", type=Path, metavar="FILE", help="draw the figure (.png, .svg)")
    parser.add_argument(
        "--plot-metric",
        choices=[str(m) for m in PlotMetric],
        default=str(PlotMetric.TOKENS_PER_SECOND),
        help="the per-model panels' y axis of --plot and --html (default: %(default)s)",
    )
    parser.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write a self-contained HTML report (figures, sortable rows, flags)",
    )


def _merged(args: argparse.Namespace, problems: list[str]) -> dict[str, object]:
    data: dict[str, object] = {} if args.file is None else read_sweep_file(args.file)
    for key in ("model", "system", "gpus", "global_batch", "seq_length"):
        value = getattr(args, key)
        if value is not None:
            data[key] = list(value)
    for key in (
        "train_tokens",
        "memory_headroom_gib",
        "max_micro_batch",
        "flops_convention",
        "pipeline_layouts",
    ):
        value = getattr(args, key)
        if value is not None:
            data[key] = value
    if args.precision is not None:
        data["precision"] = list(args.precision)
    if args.allow_cross_node_tp:
        data["allow_cross_node_tp"] = True
    if args.no_megatron_rules:
        data["megatron_rules"] = False
    if args.price:
        prices = data.get("price", {})
        merged = dict(prices) if isinstance(prices, dict) else {}
        for text in args.price:
            parsed = parse_price(text)
            if isinstance(parsed, str):
                problems.append(parsed)
            else:
                merged[parsed[0]] = parsed[1]
        data["price"] = merged
    return data


def definition_and_engine(args: argparse.Namespace) -> tuple[SweepDefinition, Engine]:
    """The validated sweep and engine, or one :class:`ConfigError` naming every problem."""
    from blueprinting.sweep.engine import LocalRay, RayCluster
    from blueprinting.sweep.plot import PLOT_SUFFIXES

    problems: list[str] = []
    source = "sweep" if args.file is None else str(args.file)
    data = _merged(args, problems)
    if args.workers is not None and args.workers < 1:
        problems.append(f"--workers must be >= 1, got {args.workers}")
    if args.out.exists() and not args.out.is_dir():
        problems.append(f"--out {str(args.out)!r} exists and is not a folder")
    if args.plot is not None and args.plot.suffix.lower() not in PLOT_SUFFIXES:
        problems.append(
            f"--plot {str(args.plot)!r}: the figure is written as {' or '.join(PLOT_SUFFIXES)}"
        )
    if args.html is not None and not args.html.parent.is_dir():
        # Checked before Ray starts: the page is written only once every cell is computed.
        problems.append(
            f"--html {args.html}: cannot write the file: folder {str(args.html.parent)!r} "
            "does not exist"
        )
    definition: SweepDefinition | None = None
    try:
        definition = definition_from_mapping(data, source=source)
    except ConfigError as error:
        problems.extend(error.problems)
    if definition is not None and args.plot_metric == PlotMetric.COST:
        unpriced = [s for s in definition.systems if definition.price(s) is None]
        if unpriced:
            problems.append(
                f"--plot-metric cost needs a --price for every system; none for {unpriced}"
            )
    if problems or definition is None:
        raise ConfigError(problems, source=source)
    engine: Engine = (
        LocalRay(workers=args.workers)
        if args.address is None
        else RayCluster(address=args.address, workers=args.workers)
    )
    return definition, engine


def _print_text(outcome: SweepOutcome, written: list[Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    from blueprinting.sweep.cell import BestStrategy

    # cell reasons and output paths print as written, never as rich markup
    console = Console(width=None if sys.stdout.isatty() else 220, markup=False)
    table = Table(title=f"{len(outcome.rows)} cells")
    for name in (
        "cell",
        "status",
        "best strategy",
        "iter s",
        "tokens/s",
        "MFU",
        "peak GiB",
        "GPU-hours",
        "cost USD",
        "fit/legal",
    ):
        table.add_column(name, justify="left" if name in ("cell", "best strategy") else "right")
    for row in outcome.rows[:MAX_ROWS_PRINTED]:
        best = row.outcome
        price = outcome.definition.price(row.cell.system)
        if isinstance(best, BestStrategy):
            cost = "" if price is None else f"{best.gpu_hours * price:,.0f}"
            figures = (
                best.strategy_text,
                f"{best.iteration_time_s:.3f}",
                f"{best.tokens_per_second:,.0f}",
                f"{best.mfu:.3f}",
                f"{best.memory_reserved_peak_bytes / GIB:.1f}",
                f"{best.gpu_hours:,.0f}",
                cost,
            )
        else:
            figures = (row.reason or "", "", "", "", "", "", "")
        table.add_row(
            str(row.cell),
            str(row.status),
            *figures,
            f"{row.candidates_fit:,}/{row.candidates_valid:,}",
        )
    console.print(table)
    if len(outcome.rows) > MAX_ROWS_PRINTED:
        console.print(f"... {len(outcome.rows) - MAX_ROWS_PRINTED:,} more rows in the files")
    engine = outcome.engine
    where = (
        "nothing to compute (every cell was in the folder)"
        if engine is None
        else f"on Ray {engine.ray_version} ({engine.mode}, {engine.address}, "
        f"{engine.workers} workers)"
    )
    console.print(
        f"{outcome.computed_cells} of {len(outcome.rows)} cells computed in "
        f"{outcome.seconds:.1f} s {where}; wrote {', '.join(str(p) for p in written)}",
        highlight=False,
        soft_wrap=True,
    )


def _run(definition: SweepDefinition, engine: Engine, out: Path) -> SweepOutcome:
    """The sweep, with a progress bar on a terminal."""
    from blueprinting.sweep.runner import run_sweep

    if not sys.stderr.isatty():
        return run_sweep(definition, out, engine)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from blueprinting.sweep.cell import SweepRow

    columns = (BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    # On stderr: stdout may be a file or carry --json.
    console = Console(stderr=True)
    with Progress("{task.description}", *columns, console=console, transient=True) as bar:
        task = bar.add_task("cells", total=None)

        def tick(done: int, total: int, last: SweepRow | None) -> None:
            label = "cells" if last is None else f"{last.cell} {last.status}"
            bar.update(task, completed=done, total=total, description=label)

        return run_sweep(definition, out, engine, progress=tick)


def run(args: argparse.Namespace) -> int:
    from blueprinting.sweep.plot import plot_sweep
    from blueprinting.sweep.store import CSV_NAME, PARQUET_NAME

    definition, engine = definition_and_engine(args)
    try:
        outcome = _run(definition, engine, args.out)
    except KeyboardInterrupt:
        print(
            f"sweep interrupted: the finished cells' rows are kept in {args.out}; run the same "
            "command again to compute the rest",
            file=sys.stderr,
        )
        return 130
    written = [args.out / PARQUET_NAME, args.out / CSV_NAME]
    if args.plot is not None:
        written.append(
            plot_sweep(outcome.rows, definition, args.plot, PlotMetric(args.plot_metric))
        )
    document = outcome.to_json()
    if args.html is not None:
        from blueprinting.report.html.page import write_html
        from blueprinting.report.html.sweep import render_sweep_html

        page = render_sweep_html(document, PlotMetric(args.plot_metric))
        written.append(write_html(page, args.html))
    if args.json:
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    _print_text(outcome, written)
    return 0
