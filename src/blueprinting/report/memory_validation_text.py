"""The measured-memory part of ``blueprinting validate``: per-run rows, exclusions and gates.

rich is imported inside the functions so that importing this module stays cheap. Memory is shown
in GiB (2**30 bytes) whatever the source's unit; the ``figure`` column names that unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, assert_never

from blueprinting.validation.measured_memory import (
    FitRow,
    MemoryGate,
    MemoryGateResult,
    MemoryValidation,
)

if TYPE_CHECKING:
    from rich.table import Table

_GIB = float(2**30)


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / _GIB:.2f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:+.1f}%"


def _columns(out: Table, columns: Sequence[str], *, numeric: set[str]) -> Table:
    for column in columns:
        out.add_column(column, justify="right" if column in numeric else "left", overflow="fold")
    return out


def _verdict(row: FitRow | None) -> str:
    if row is None:
        return "-"
    predicted = "-" if row.predicted_fits is None else ("fits" if row.predicted_fits else "OOM")
    outcome = "OOM" if row.oom else "ran"
    return f"{predicted}/{outcome} {'ok' if row.agrees else 'WRONG'}"


def render_memory_rows(validation: MemoryValidation) -> Table:
    """One line per included run: its figure (or its outcome only), both predicted peaks
    ("alloc.", "reserved"), the error of the one the figure is compared with and the verdict
    (predicted "fits"/"OOM" against the outcome "ran"/"OOM")."""
    from rich.table import Table

    out = _columns(
        Table(title="Measured memory: measured vs predicted (GiB per GPU)"),
        (
            "run",
            "figure",
            "stage",
            "measured",
            "alloc.",
            "reserved",
            "error",
            "verdict",
            "note",
        ),
        numeric={"measured", "alloc.", "reserved", "error"},
    )
    fits = {row.run_id: row for row in validation.fits}
    shown: set[str] = set()
    for row in validation.rows:
        shown.add(row.run_id)
        out.add_row(
            row.run_id,
            str(row.kind),
            str(row.stage),
            _gib(row.measured_bytes),
            _gib(row.predicted_allocated_bytes),
            _gib(row.predicted_reserved_bytes),
            _percent(row.relative_error),
            _verdict(fits.get(row.run_id)),
            row.note,
        )
    for fit in validation.fits:
        if fit.run_id not in shown:
            out.add_row(
                fit.run_id, "outcome only", "-", "-", "-", "-", "-", _verdict(fit), fit.note
            )
    return out


def render_memory_exclusions(validation: MemoryValidation) -> Table:
    """Runs Blueprinting cannot plan today, with their reasons, then the count per reason."""
    from rich.table import Table

    out = _columns(
        Table(title="Measured memory: runs not planned (reasons)"),
        ("run", "reasons"),
        numeric=set(),
    )
    for run in validation.excluded:
        out.add_row(run.run_id, ", ".join(str(reason) for reason in run.reasons))
    counts = ", ".join(f"{reason} {count}" for reason, count in validation.exclusion_counts.items())
    out.caption = f"{len(validation.excluded)} runs not planned; runs per reason: {counts}"
    return out


def _gate_value(result: MemoryGateResult) -> tuple[str, str]:
    match result.gate:
        case MemoryGate.MEDIAN_ERROR:
            value = "-" if result.value is None else f"{100.0 * result.value:.1f}%"
            return value, f"<= {100.0 * result.limit:.0f}%"
        case MemoryGate.OOM_PREDICTED | MemoryGate.RAN_PREDICTED:
            agreeing = result.count - len(result.failing)
            return f"{agreeing}/{result.count}", "all"
        case _ as unreachable:
            assert_never(unreachable)


def render_memory_gates(validation: MemoryValidation) -> Table:
    """The issue 19 gates: median |error| of the peaks, then the two fit-verdict gates."""
    from blueprinting.report.gate_table import GateRow, render_gate_table

    return render_gate_table(
        "Memory gates (issue 19)",
        (
            GateRow(
                gate=str(result.gate),
                count=result.count,
                reached=_gate_value(result)[0],
                limit=_gate_value(result)[1],
                failing=len(result.failing),
                passed=result.passed,
            )
            for result in validation.gates
        ),
    )
