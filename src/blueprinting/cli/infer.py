"""``blueprinting infer FILE``: prefill, decode, throughput and memory of a serving strategy.

``blueprinting infer FILE [--set KEY=VALUE ...] [--system NAME] [--json]`` reads a file with an
``[inference]`` section; ``--search [--latency-target-ms X] [--objective throughput|latency]``
ranks (t, ep, p, replicas, batch) on the file's GPU count instead (ep for MoE models).
"""

from __future__ import annotations

import argparse
import json
import sys

from blueprinting.errors import ConfigError
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.transformer import InferenceSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="strategy file with an [inference] section")
    parser.add_argument("--system", help="system preset (overrides the file's [system] preset)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a flat key (repeatable); system.KEY=... addresses [system]",
    )
    parser.add_argument(
        "--no-megatron-rules",
        action="store_true",
        help="check only the planner's laws, not Megatron-LM's start-up rules",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--search",
        action="store_true",
        help="rank (t, ep, p, replicas, batch) on the file's number of GPUs (ep: MoE models)",
    )
    parser.add_argument(
        "--objective",
        choices=["throughput", "latency"],
        default="throughput",
        help="search ranking: deployment tokens/s or mean decode latency (default: %(default)s)",
    )
    parser.add_argument(
        "--latency-target-ms",
        type=float,
        help="search: keep strategies whose mean decode latency per token is at most this",
    )
    parser.add_argument("--top", type=int, default=10, help="search: rows shown (default 10)")


def load_inference(args: argparse.Namespace) -> tuple[InferenceSpec, SystemSpec]:
    from blueprinting.hardware.system_mapping import system_from_mapping
    from blueprinting.mapping.config_file import load_config

    config = load_config(args.file, overrides=list(args.overrides))
    if config.inference is None:
        raise ConfigError(
            ["this file holds a [training] spec; use `blueprinting plan`"], source=config.source
        )
    section = config.system_section(args.system)
    return config.inference, system_from_mapping(section, source=config.source)


def _search(args: argparse.Namespace, spec: InferenceSpec, system: SystemSpec) -> int:
    from blueprinting.inference.search import Objective, SearchOptions, search_inference

    target_ms: float | None = args.latency_target_ms
    options = SearchOptions(
        objective=Objective(args.objective),
        latency_target_s=None if target_ms is None else target_ms / 1e3,
        top=args.top,
        megatron=not args.no_megatron_rules,
    )
    if args.json or not sys.stderr.isatty():
        reports = search_inference(spec, system, options)
    else:
        from rich.progress import Progress

        # many layouts or long generations take seconds (README, Input limits)
        with Progress(transient=True) as bar:
            task = bar.add_task("costing layouts", total=None)

            def tick(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            reports = search_inference(spec, system, options, progress=tick)
    if args.json:
        json.dump([r.to_json_dict() for r in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if reports else 1
    from rich.console import Console
    from rich.markup import escape

    from blueprinting.report.infer_text import render_search

    target = "" if target_ms is None else f", decode <= {target_ms:g} ms/token"
    title = (
        f"{escape(spec.model.name)} on {spec.mapping.world_size} x "
        f"{escape(system.accelerator.name)}: best by {options.objective}{target}"
    )
    # A ranked table is wide: outside a terminal, do not squeeze it to 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    if not reports:
        console.print(f"{title}: no strategy meets the target")
        return 1
    render_search(reports, console, title=title)
    return 0


def run(args: argparse.Namespace) -> int:
    from blueprinting.inference.analysis import analyze_inference

    spec, system = load_inference(args)
    if args.search:
        return _search(args, spec, system)
    report = analyze_inference(spec, system, megatron=not args.no_megatron_rules)
    if args.json:
        json.dump(report.to_json_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console

    from blueprinting.report.infer_text import render_inference

    render_inference(report, Console())
    return 0
