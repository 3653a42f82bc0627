"""``blueprinting validate``: score the cost model against published measured runs (issue #5).

Runs every row of ``tests/validation/fixtures/published_runs.toml`` (Narayanan et al. 2021
Table 1; Korthikanti et al. 2022 Tables 4-5, text, Figures 1 and 7) through
``blueprinting.api.plan`` and prints measured vs predicted per row, the rows' alternative
readings where a source is ambiguous (never gated), and the issue's gates. Then the measured
memory of ``tests/validation/fixtures/measured_memory.toml`` (Megatron-LM functional tests, a
Megatron-Core 0.14 tutorial on 8 H100s; issue 19): both predicted peaks per run, the fit verdicts
against the outcomes, the runs not planned and why, and the memory gates. Then the dense runs of
2024-2026 of ``tests/validation/fixtures/modern_runs.toml`` (Megatron-Bridge Llama 3 / 3.1 on
DGX-H100, DGX-B200, DGX-GB200; NeMo 24.07; NeMo long-sequence context parallel; issue 12): measured
vs predicted iteration time per run (or the planner's message where it cannot plan it), the
|error| by GPU generation and by precision recipe, and the gates. Then the mixture-of-experts
runs of ``tests/validation/fixtures/modern_moe_runs.toml`` (Megatron-Bridge DeepSeek-V3,
Qwen3-30B-A3B, GPT-OSS-120B; Megatron-MoE-ModelZoo Mixtral 8x22B; issue 13): the same per run
with its expert grid and dispatcher, the |error| by model, GPU generation and dispatcher, and the
issue 13 gates. ``--json`` prints the same as one object (the memory part under ``memory``, the
dense runs under ``modern``, the MoE runs under ``moe``).
Exit status: 0 when every gate passes, 1 when one fails, 2 when the cost model or a fixture is
missing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blueprinting.errors import UnsupportedError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fixture",
        type=Path,
        default=None,
        help="published-runs TOML (default: tests/validation/fixtures/published_runs.toml)",
    )
    parser.add_argument(
        "--memory-fixture",
        type=Path,
        default=None,
        help="measured-memory TOML (default: tests/validation/fixtures/measured_memory.toml)",
    )
    parser.add_argument(
        "--modern-fixture",
        type=Path,
        default=None,
        help="modern dense-runs TOML (default: tests/validation/fixtures/modern_runs.toml)",
    )
    parser.add_argument(
        "--moe-fixture",
        type=Path,
        default=None,
        help="modern MoE-runs TOML (default: tests/validation/fixtures/modern_moe_runs.toml)",
    )
    parser.add_argument(
        "--summary-only", action="store_true", help="print only the gates, not every row"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print gates, rows and alternative readings as one JSON object",
    )


def run(args: argparse.Namespace) -> int:
    from blueprinting.report.memory_validation_text import (
        render_memory_exclusions,
        render_memory_gates,
        render_memory_rows,
    )
    from blueprinting.report.modern_validation_text import (
        render_modern_gates,
        render_modern_rows,
        render_modern_summaries,
    )
    from blueprinting.report.moe_validation_text import (
        render_moe_gates,
        render_moe_rows,
        render_moe_summaries,
    )
    from blueprinting.report.validation_text import (
        render_alternatives,
        render_gates,
        render_rows,
    )
    from blueprinting.validation import measured_memory, modern, modern_moe
    from blueprinting.validation.comparison import compare_published, to_json_dict
    from blueprinting.validation.predictor import PlanCache, api_predictor
    from blueprinting.validation.published import default_fixture_path, load_published_runs

    try:
        # One cache for the four fixtures: they share strategies (issue #18).
        plans = PlanCache()
        predict = api_predictor(plans)
        predict_memory = measured_memory.api_memory_predictor(plans)
        predict_modern = modern.api_modern_predictor(plans)
    except UnsupportedError as error:
        print(f"error: the cost model is not available: {error}", file=sys.stderr)
        return 2
    fixture: Path = args.fixture if args.fixture is not None else default_fixture_path()
    if not fixture.is_file():
        print(f"error: published-runs fixture not found: {fixture}", file=sys.stderr)
        return 2
    memory_fixture: Path = (
        args.memory_fixture
        if args.memory_fixture is not None
        else measured_memory.default_fixture_path()
    )
    if not memory_fixture.is_file():
        print(f"error: measured-memory fixture not found: {memory_fixture}", file=sys.stderr)
        return 2
    modern_fixture: Path = (
        args.modern_fixture if args.modern_fixture is not None else modern.default_fixture_path()
    )
    if not modern_fixture.is_file():
        print(f"error: modern-runs fixture not found: {modern_fixture}", file=sys.stderr)
        return 2
    moe_fixture: Path = (
        args.moe_fixture if args.moe_fixture is not None else modern_moe.default_moe_fixture_path()
    )
    if not moe_fixture.is_file():
        print(f"error: MoE-runs fixture not found: {moe_fixture}", file=sys.stderr)
        return 2
    table = compare_published(predict, load_published_runs(fixture))
    memory = measured_memory.compare_measured_memory(
        predict_memory, measured_memory.load_measured_memory(memory_fixture)
    )
    dense = modern.compare_modern_runs(predict_modern, modern.load_modern_runs(modern_fixture))
    moe = modern_moe.compare_moe_runs(predict_modern, modern_moe.load_moe_runs(moe_fixture))
    passed = table.passed and memory.passed and dense.passed and moe.passed
    if args.json:
        import json

        document = to_json_dict(table)
        document["passed"] = passed
        document["memory"] = measured_memory.memory_to_json_dict(memory)
        document["modern"] = modern.modern_to_json_dict(dense)
        document["moe"] = modern_moe.moe_to_json_dict(moe)
        print(json.dumps(document, indent=2))
        return 0 if passed else 1

    from rich.console import Console

    # the tables print fixture text (run ids, labels, notes) as written, never as rich markup
    console = Console(markup=False)
    if not args.summary_only:
        console.print(render_rows(table))
        alternatives = render_alternatives(table)
        if alternatives is not None:
            console.print(alternatives)
    console.print(render_gates(table))
    if not args.summary_only:
        console.print(render_memory_rows(memory))
        console.print(render_memory_exclusions(memory))
    console.print(render_memory_gates(memory))
    if not args.summary_only:
        console.print(render_modern_rows(dense))
    console.print(render_modern_summaries(dense))
    console.print(render_modern_gates(dense))
    if not args.summary_only:
        console.print(render_moe_rows(moe))
    console.print(render_moe_summaries(moe))
    console.print(render_moe_gates(moe))
    return 0 if passed else 1
