"""The per-GPU memory table that the ``plan`` and ``infer`` text reports share.

rich is imported inside the function so that importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

GIB = 1024**3


def memory_table(
    stage: int,
    rows: Sequence[tuple[str, float]],
    total: float,
    peaks: Sequence[tuple[str, Sequence[tuple[str, float]], float]] = (),
) -> Table:
    """Categories in GiB, then a bold total, for the most loaded pipeline stage; then, per
    peak, the parts it adds and the bold peak (``peaks``: (name, parts, value))."""
    from rich.table import Table

    table = Table(title=f"Memory per GPU, pipeline stage {stage} (most loaded)")
    table.add_column("category")
    table.add_column("GiB", justify="right")
    for name, size in rows:
        table.add_row(name, f"{size / GIB:.2f}")
    table.add_row("[bold]total[/bold]", f"[bold]{total / GIB:.2f}[/bold]")
    for name, parts, value in peaks:
        for part, size in parts:
            table.add_row(f"  + {part}", f"{size / GIB:.2f}")
        table.add_row(f"[bold]{name}[/bold]", f"[bold]{value / GIB:.2f}[/bold]")
    return table


def fit_verdict(fits: bool) -> str:
    return "[green]fits[/green]" if fits else "[red]does NOT fit[/red]"
