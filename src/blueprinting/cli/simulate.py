"""``blueprinting simulate``: run the strategy's pipeline schedule, compare with the contract.

``blueprinting simulate FILE|--model.. [--set KEY=VALUE ...] [--json] [--trace OUT.json]
[--plot OUT.png|OUT.svg]`` takes the inputs of ``plan``; it prints the plan, then the contract and
simulated bubbles with their difference explained term by term, and a per-rank table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from blueprinting.cli.plan import add_strategy_arguments, load_training, options_from, print_report
from blueprinting.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_strategy_arguments(parser)
    parser.add_argument(
        "--trace",
        metavar="OUT.json",
        help="write a Chrome trace-event file (open in Perfetto or chrome://tracing)",
    )
    parser.add_argument(
        "--plot", metavar="OUT.png|OUT.svg", help="draw the timeline of every pipeline rank"
    )


def run(args: argparse.Namespace) -> int:
    from blueprinting.analysis.simulation_report import simulation_report
    from blueprinting.api import plan_spec
    from blueprinting.cli.output_paths import check_output_paths
    from blueprinting.simulator import plot_timeline, write_chrome_trace

    check_output_paths(("--html", args.html), ("--trace", args.trace), ("--plot", args.plot))
    if args.plot is not None and Path(args.plot).suffix.lower() not in {".png", ".svg"}:
        raise ConfigError([f"--plot {args.plot}: the file name must end in .png or .svg"])
    spec, system = load_training(args)
    report = simulation_report(plan_spec(spec, system, options_from(args)))
    if args.json:
        json.dump(report.to_json_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from rich.console import Console

        from blueprinting.report.simulation_text import render_simulation

        print_report(report.plan, as_json=False, all_stages=bool(args.all_stages))
        render_simulation(report, Console())
    if args.html is not None:
        from blueprinting.report.html.page import write_html
        from blueprinting.report.html.simulate import render_simulation_html

        write_html(render_simulation_html(report), args.html)
    if report.result is None:
        if args.trace is not None or args.plot is not None:
            print("error: the schedule deadlocks; no trace or plot written", file=sys.stderr)
        return 1
    if args.trace is not None:
        write_chrome_trace(report.result, args.trace)
    if args.plot is not None:
        plot_timeline(report.result, args.plot)
    return 0
