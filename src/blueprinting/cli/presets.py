"""``blueprinting presets``: list the built-in model presets (and system presets once the
hardware module provides them), with computed against published parameter counts."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping

from blueprinting.mapping.presets import MODEL_PRESETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "kind",
        nargs="?",
        choices=("all", "models", "systems"),
        default="all",
        help="which presets to list (default: all)",
    )


def _system_presets() -> Mapping[str, object] | None:
    """``blueprinting.hardware.presets.SYSTEM_PRESETS`` when that module exists, else None."""
    try:
        module = importlib.import_module("blueprinting.hardware.presets")
    except ImportError:
        return None
    systems: object = getattr(module, "SYSTEM_PRESETS", None)
    if not isinstance(systems, Mapping):
        return None
    return {str(name): spec for name, spec in systems.items()}


def _billions(count: int) -> str:
    return f"{count / 1e9:,.2f}B"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        # Piped output has no width to adapt to; keep every column readable.
        console = Console(width=140)
    kind = str(args.kind)
    if kind in ("all", "models"):
        table = Table(title="Model presets")
        for column in ("name", "layers", "hidden", "heads", "groups", "ffn", "seq", "vocab"):
            table.add_column(column, justify="left" if column == "name" else "right", no_wrap=True)
        table.add_column("params", justify="right", no_wrap=True)
        table.add_column("published", justify="right", no_wrap=True)
        table.add_column("delta", justify="right", no_wrap=True)
        for name, model in MODEL_PRESETS.items():
            published = model.published_parameters
            delta = (
                "" if published is None else f"{100 * (model.num_parameters / published - 1):+.2f}%"
            )
            table.add_row(
                name,
                str(model.num_layers),
                str(model.hidden_size),
                str(model.num_attention_heads),
                str(model.num_query_groups),
                str(model.ffn_hidden_size),
                str(model.seq_length),
                str(model.padded_vocab_size),
                _billions(model.num_parameters),
                "" if published is None else _billions(published),
                delta,
            )
        console.print(table)
    if kind in ("all", "systems"):
        systems = _system_presets()
        if systems is None:
            if kind == "systems":
                console.print("no system presets: blueprinting.hardware.presets is not available")
            return 0
        system_table = Table(title="System presets")
        system_table.add_column("name")
        system_table.add_column("system", overflow="fold")
        for name, system in systems.items():
            system_table.add_row(name, str(system))
        console.print(system_table)
    return 0
