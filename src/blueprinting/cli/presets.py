"""``blueprinting presets``: list the built-in model presets (computed against published
parameter counts; MoE presets with their experts / top-k and active parameters, counted with
the embedding matrices their owners count) and system presets (datasheet peaks, memory, links,
GPUs per node and per NVLink domain)."""

from __future__ import annotations

import argparse

from blueprinting.hardware.presets import SYSTEM_PRESETS
from blueprinting.hardware.system import Engine
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.presets import MODEL_PRESETS, PUBLISHED_ACTIVE_COUNT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "kind",
        nargs="?",
        choices=("all", "models", "systems"),
        default="all",
        help="which presets to list (default: all)",
    )


def _billions(count: int) -> str:
    return f"{count / 1e9:,.2f}B"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        # Piped output has no width to adapt to; keep every column readable.
        console = Console(width=190)
    kind = str(args.kind)
    if kind in ("all", "models"):
        table = Table(title="Model presets")
        for column in ("name", "layers", "hidden", "heads", "groups", "ffn", "seq", "vocab"):
            table.add_column(column, justify="left" if column == "name" else "right", no_wrap=True)
        table.add_column("params", justify="right", no_wrap=True)
        table.add_column("published", justify="right", no_wrap=True)
        table.add_column("delta", justify="right", no_wrap=True)
        table.add_column("E/k", justify="right", no_wrap=True)
        table.add_column("active", justify="right", no_wrap=True)
        table.add_column("pub. active", justify="right", no_wrap=True)
        for name, model in MODEL_PRESETS.items():
            published = model.published_parameters
            delta = (
                "" if published is None else f"{100 * (model.num_parameters / published - 1):+.2f}%"
            )
            moe = model.moe
            shape = "" if moe is None else f"{moe.num_experts}/{moe.top_k}"
            active = model.published_active_parameters
            # the active count under the owner's convention, comparable with its figure
            convention = PUBLISHED_ACTIVE_COUNT.get(name)
            ours_active = (
                ""
                if moe is None
                else _billions(
                    model.active_parameters
                    if convention is None
                    else model.active_parameters_as(convention)
                )
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
                shape,
                ours_active,
                "" if active is None else _billions(active),
            )
        console.print(table)
    if kind in ("all", "systems"):
        system_table = Table(title="System presets")
        for column in (
            "name",
            "accelerator",
            "GPUs/node",
            "NVLink domain",
            "bf16 TFLOP/s",
            "HBM GiB",
            "HBM TB/s",
            "intra-node GB/s",
            "scale-out GB/s",
        ):
            left = column in ("name", "accelerator")
            system_table.add_column(column, justify="left" if left else "right", no_wrap=True)
        for name, system in SYSTEM_PRESETS.items():
            accelerator = system.accelerator
            peak = accelerator.engine(Engine.MATRIX).rate(Datatype.BF16).peak_flop_per_s
            system_table.add_row(
                name,
                accelerator.name,
                str(system.gpus_per_node),
                str(system.node.domain_size),
                f"{peak / 1e12:,.0f}",
                f"{accelerator.hbm.capacity_bytes / 2**30:,.1f}",
                f"{accelerator.hbm.bandwidth_bytes_per_s / 1e12:.2f}",
                f"{system.node.link.bandwidth_bytes_per_s / 1e9:,.0f}",
                f"{system.scale_out.bandwidth_bytes_per_s / 1e9:,.0f}",
            )
        console.print(system_table)
    return 0
