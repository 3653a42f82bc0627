"""The table every validation gate set renders (memory, modern runs): one row per gate."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from rich.table import Table


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GateRow:
    """A gate as shown: its name, rows scored, the value reached and the limit (as text), the
    least value the rows allow any predictor ("-" where none is derived), how many rows fail
    it, and whether it passes."""

    gate: str
    count: int
    reached: str
    limit: str
    failing: int
    passed: bool
    floor: str = "-"


def render_gate_table(title: str, rows: Iterable[GateRow], caption: str | None = None) -> Table:
    from rich.table import Table

    out = Table(title=title, caption=caption, caption_justify="left")
    for column in ("gate", "rows", "reached", "limit", "floor", "failing", "result"):
        out.add_column(column)
    for row in rows:
        out.add_row(
            row.gate,
            str(row.count),
            row.reached,
            row.limit,
            row.floor,
            str(row.failing),
            "PASS" if row.passed else "FAIL",
        )
    return out
