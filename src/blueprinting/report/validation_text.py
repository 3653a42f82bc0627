"""The ``blueprinting validate`` text report: rows, alternative readings and gates.

rich is imported inside the functions so that importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from blueprinting.validation.comparison import ValidationTable, error_stats, time_rows
from blueprinting.validation.published import SourceTable

if TYPE_CHECKING:
    from rich.table import Table


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:+.1f}%"


def _abs_percent(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}%"


def _columns(out: Table, columns: Sequence[str], *, numeric: set[str]) -> Table:
    # Ids and metric names fold rather than truncate: a row must stay identifiable.
    for column in columns:
        out.add_column(column, justify="right" if column in numeric else "left", overflow="fold")
    return out


def render_rows(table: ValidationTable) -> Table:
    """Per-row comparison as a ``rich`` table."""
    from rich.table import Table

    out = _columns(
        Table(title="Published runs: measured vs predicted"),
        ("run", "metric", "unit", "measured", "predicted", "error", "gate", "note"),
        numeric={"measured", "predicted", "error"},
    )
    for row in table.rows:
        out.add_row(
            row.run_id,
            str(row.metric),
            row.metric.unit,
            f"{row.measured:.4g}",
            "-" if row.predicted is None else f"{row.predicted:.4g}",
            _percent(row.relative_error),
            "yes" if row.gated else "info",
            row.note,
        )
    return out


def render_alternatives(table: ValidationTable) -> Table | None:
    """The alternative readings beside the primary ones (``None`` when the fixture has none)."""
    if not table.alternatives:
        return None
    from rich.table import Table

    out = _columns(
        Table(
            title="Ambiguous sources: the other reading of a run (information, never gated)",
            caption_justify="left",
        ),
        ("run", "reading", "metric", "measured", "primary", "error", "alt.", "error"),
        numeric={"measured", "primary", "error", "alt."},
    )
    for row in table.alternatives:
        out.add_row(
            row.run_id,
            row.label,
            str(row.metric),
            f"{row.measured:.4g}",
            "-" if row.primary is None else f"{row.primary:.4g}",
            _percent(row.primary_error),
            "-" if row.predicted is None else f"{row.predicted:.4g}",
            _percent(row.relative_error),
        )
    for reason in dict.fromkeys(
        f"{row.run_id} [{row.label}]: {row.reason}" for row in table.alternatives
    ):
        out.caption = reason if out.caption is None else f"{out.caption}\n{reason}"
    return out


def render_gates(table: ValidationTable) -> Table:
    """Gates, then the time figures of each source table, then every family, as information."""
    from rich.table import Table

    out = Table(title="Accuracy gates (issue #5)")
    for column in ("gate", "rows", "MAE", "limit", "max", "limit", "missing", "result"):
        out.add_column(column)
    for result in table.gates:
        limit = result.gate.mae_limit
        out.add_row(
            result.gate.name,
            str(result.count),
            _abs_percent(result.mae),
            "-" if limit is None else _abs_percent(limit),
            _abs_percent(result.max_error),
            _abs_percent(result.gate.max_limit),
            str(len(result.missing)),
            "PASS" if result.passed else "FAIL",
        )
    for source in SourceTable:
        stats = error_stats(row.relative_error for row in time_rows(table.rows, {source}))
        if stats.count:
            out.add_row(
                f"times of {source}",
                str(stats.count),
                _abs_percent(stats.mae),
                "-",
                _abs_percent(stats.max_error),
                "-",
                "-",
                "info",
            )
    for summary in table.families:
        out.add_row(
            f"all rows: {summary.family}",
            str(summary.count),
            _abs_percent(summary.mae),
            "-",
            _abs_percent(summary.max_error),
            "-",
            str(summary.missing),
            "info",
        )
    return out
