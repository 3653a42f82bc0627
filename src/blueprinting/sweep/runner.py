"""A whole sweep: open the output folder, compute the cells it lacks on Ray, write the files.

``run_sweep`` is what ``blueprinting sweep`` calls; the definition is validated before (see
``definition.py``), so a bad sweep never starts Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, final

from blueprinting.sweep.cell import SweepRow, evaluate_cell
from blueprinting.sweep.definition import Cell, SweepDefinition
from blueprinting.sweep.engine import CellFunction, Engine, EngineInfo, ray_session, run_cells
from blueprinting.sweep.store import SweepStore

if TYPE_CHECKING:
    from blueprinting.analysis.report import JsonValue

#: ``progress(done, total, last_row)`` after each batch of finished cells.
Progress = Callable[[int, int, SweepRow | None], None]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SweepOutcome:
    """A finished sweep: every row of the grid in grid order, and what this run computed."""

    definition: SweepDefinition
    engine: EngineInfo | None
    """None when the folder already held every cell (no Ray was started)."""
    rows: tuple[SweepRow, ...]
    computed_cells: int
    seconds: float
    out: Path

    def to_json(self) -> dict[str, JsonValue]:
        """The ``sweep --json`` object."""
        rows: list[JsonValue] = [r.record(self.definition.price(r.cell.system)) for r in self.rows]
        return {
            "engine": None if self.engine is None else self.engine.to_json(),
            "cells": len(self.rows),
            "computed_cells": self.computed_cells,
            "seconds": self.seconds,
            "out": str(self.out),
            "rows": rows,
        }


def run_sweep(
    definition: SweepDefinition,
    out: Path,
    engine: Engine,
    *,
    progress: Progress | None = None,
    evaluate: CellFunction = evaluate_cell,
) -> SweepOutcome:
    """Compute every cell of ``definition`` that ``out`` does not hold yet, keeping rows as they
    finish, then write ``out``'s Parquet and CSV files whole."""
    start = time.perf_counter()
    cells = definition.cells()
    with SweepStore(out, definition.options) as store:
        missing: list[Cell] = [c for c in cells if c.key not in store.rows]
        store.start_csv(definition.price)
        done = len(cells) - len(missing)
        info: EngineInfo | None = None
        if progress is not None:
            progress(done, len(cells), None)
        if missing:
            with ray_session(engine) as info:

                def keep(rows: list[SweepRow]) -> None:
                    nonlocal done
                    store.append(rows, definition.price)
                    done += len(rows)
                    if progress is not None:
                        progress(done, len(cells), rows[-1])

                run_cells(
                    missing, definition.options, info.workers, on_rows=keep, evaluate=evaluate
                )
        store.finish([c.key for c in cells], definition.price)
        rows = tuple(store.rows[c.key] for c in cells)
    return SweepOutcome(
        definition=definition,
        engine=info,
        rows=rows,
        computed_cells=len(missing),
        seconds=time.perf_counter() - start,
        out=out,
    )
