"""``blueprinting plan``: iteration time, breakdown, memory and MFU of one training strategy.

``blueprinting plan FILE [--set KEY=VALUE ...] [--json]`` reads a strategy file;
``blueprinting plan --model NAME --system NAME --gpus N --set KEY=VALUE ...`` needs no file.
"""

from __future__ import annotations

import argparse
import json
import sys

from blueprinting.analysis.evaluate import PlanOptions
from blueprinting.analysis.flops import FlopsConvention
from blueprinting.analysis.iteration import BubbleSource
from blueprinting.analysis.report import IterationReport
from blueprinting.errors import ConfigError
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.transformer import TrainingSpec


def add_strategy_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``plan`` and ``simulate`` share."""
    parser.add_argument("file", metavar="FILE", nargs="?", help="strategy file (.toml/.json/.yaml)")
    parser.add_argument("--model", help="model preset (without FILE)")
    parser.add_argument(
        "--system",
        help="system preset or system file (.toml/.json, e.g. from `blueprinting calibrate "
        "--out`); replaces the file's [system]",
    )
    parser.add_argument("--gpus", type=int, help="number of GPUs = world_size (without FILE)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a flat key (repeatable); system.KEY=... addresses [system]",
    )
    parser.add_argument(
        "--flops-convention",
        choices=[str(c) for c in FlopsConvention],
        default=str(FlopsConvention.MEGATRON_LEGACY),
        help="how model/hardware FLOPs are counted (default: %(default)s)",
    )
    parser.add_argument(
        "--bubble",
        choices=[str(b) for b in BubbleSource],
        default=str(BubbleSource.SIMULATED),
        help="pipeline bubble the total uses: the simulated schedule (falls back to the "
        "contract where Megatron-LM would not run it) or the seed's analytic contract "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--no-simulate",
        action="store_true",
        help="skip the concrete schedule simulation (purely analytic report; implies the "
        "contract bubble)",
    )
    parser.add_argument(
        "--no-megatron-rules",
        action="store_true",
        help="check only the planner's laws, not Megatron-LM's start-up rules",
    )
    parser.add_argument(
        "--train-tokens",
        type=float,
        default=300e9,
        help="tokens for the time-to-train figure (default: 300e9, GPT-3's)",
    )
    parser.add_argument(
        "--all-stages", action="store_true", help="print memory for every pipeline stage"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write the report as one self-contained HTML file (opens with no network)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_strategy_arguments(parser)


def load_training(args: argparse.Namespace) -> tuple[TrainingSpec, SystemSpec]:
    """The spec and system named by FILE or by --model/--gpus, with --set and --system."""
    from blueprinting.api import build_spec
    from blueprinting.hardware.presets import system_preset
    from blueprinting.hardware.system_mapping import (
        is_system_file,
        system_from_mapping,
        system_section_for,
    )
    from blueprinting.mapping.config_file import (
        apply_overrides,
        load_config,
        route_section_overrides,
    )

    overrides: list[str] = list(args.overrides)
    if args.file is not None:
        if args.model is not None or args.gpus is not None:
            raise ConfigError(["give either FILE or --model/--gpus, not both"])
        config = load_config(args.file, overrides=overrides)
        if config.training is None:
            raise ConfigError(
                ["this file holds an [inference] spec; use `blueprinting infer`"],
                source=config.source,
            )
        section = config.system_section(args.system)
        return config.training, system_from_mapping(section, source=config.source)
    if args.model is None:
        raise ConfigError(["give a strategy FILE, or --model (with --gpus and --set keys)"])
    system_name = args.system or "dgx-a100-80gb"
    system = system_section_for(system_name)
    # Without a file there is no [model] table: model.* stays a flat key.
    flat_overrides = route_section_overrides(overrides, system)
    flat = apply_overrides({}, flat_overrides)
    spec = build_spec(model=args.model, gpus=args.gpus, settings=flat)
    if len(flat_overrides) < len(overrides) or is_system_file(system_name):
        # some system.* override was applied, or the system is a file's section
        return spec, system_from_mapping(system, source=system_name)
    return spec, system_preset(system_name)


def options_from(args: argparse.Namespace, bubble: BubbleSource | None = None) -> PlanOptions:
    """The analysis options of the parsed arguments; ``bubble`` overrides ``--bubble``."""
    return PlanOptions(
        flops_convention=FlopsConvention(args.flops_convention),
        bubble_source=BubbleSource(args.bubble) if bubble is None else bubble,
        megatron_rules=not args.no_megatron_rules,
        train_tokens=int(args.train_tokens),
        simulate=not getattr(args, "no_simulate", False),
    )


def print_report(report: IterationReport, *, as_json: bool, all_stages: bool = False) -> None:
    if as_json:
        json.dump(report.to_json_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    from rich.console import Console

    from blueprinting.report.plan_text import render_plan

    render_plan(report, Console(), all_stages=all_stages)


def run(args: argparse.Namespace) -> int:
    from blueprinting.api import plan_spec
    from blueprinting.cli.output_paths import check_output_paths

    check_output_paths(("--html", args.html))
    spec, system = load_training(args)
    report = plan_spec(spec, system, options_from(args))
    print_report(report, as_json=bool(args.json), all_stages=bool(args.all_stages))
    if args.html is not None:
        from blueprinting.report.html.page import write_html
        from blueprinting.report.html.plan import render_plan_html

        write_html(render_plan_html(report), args.html)
    return 0
