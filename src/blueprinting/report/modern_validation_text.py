"""The modern-runs part of ``blueprinting validate``: per-run rows, error summaries and gates.

rich is imported inside the functions so that importing this module stays cheap. Times are
seconds per iteration; errors are (predicted - measured) / measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, assert_never

from blueprinting.validation.modern import (
    AxisT,
    ErrorSummary,
    GateKind,
    GateResult,
    GateT,
    ModernValidation,
)

if TYPE_CHECKING:
    from rich.table import Table


def seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def percent_text(value: float | None, *, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100.0 * value:+.1f}%" if signed else f"{100.0 * value:.1f}%"


def render_modern_rows(validation: ModernValidation) -> Table:
    """One line per dense run: layout, recipe, measured and predicted iteration time and the
    error, or the planner's message where it is not planned."""
    from rich.table import Table

    out = Table(title="Modern dense runs: iteration time, measured vs predicted (s)")
    numeric = {"gpus", "t/p/cp/d", "measured", "predicted", "error"}
    for column in (
        "run",
        "model",
        "system",
        "gpus",
        "t/p/cp/d",
        "recipe",
        "measured",
        "predicted",
        "error",
        "note",
    ):
        out.add_column(column, justify="right" if column in numeric else "left", overflow="fold")
    for row in validation.rows:
        out.add_row(
            row.run_id,
            row.model,
            row.system,
            str(row.num_gpus),
            f"{row.tensor_parallel}/{row.pipeline_parallel}/{row.context_parallel}/"
            f"{row.data_parallel}",
            str(row.recipe),
            seconds_text(row.measured_s),
            seconds_text(row.predicted_s),
            percent_text(row.relative_error),
            row.note,
        )
    planned = len(validation.planned_rows)
    out.caption = f"{planned} of {len(validation.rows)} runs planned"
    return out


def render_error_summaries(title: str, summaries: Sequence[ErrorSummary[AxisT]]) -> Table:
    """|error| over the planned runs, one line per group of the summaries."""
    from rich.table import Table

    out = Table(title=title)
    for column in ("split", "group", "runs", "planned", "median |err|", "max |err|", "mean err"):
        out.add_column(column, justify="left" if column in {"split", "group"} else "right")
    for summary in summaries:
        out.add_row(
            str(summary.axis),
            summary.group,
            str(summary.rows),
            str(summary.planned),
            percent_text(summary.median_abs_error, signed=False),
            percent_text(summary.max_abs_error, signed=False),
            percent_text(summary.mean_error),
        )
    return out


def render_modern_summaries(validation: ModernValidation) -> Table:
    """|error| over the planned runs: all, per GPU generation, per precision recipe, per
    container release."""
    return render_error_summaries(
        "Modern dense runs: |error| by GPU generation, precision recipe and release",
        validation.summaries,
    )


def _gate_value(result: GateResult[GateT]) -> tuple[str, str]:
    match result.kind:
        case GateKind.MEDIAN_ERROR | GateKind.MAX_ERROR:
            return percent_text(result.value, signed=False), f"<= {100.0 * result.limit:.0f}%"
        case GateKind.ALL_PLANNED:
            return f"{result.count - len(result.failing)}/{result.count}", "all"
        case _ as unreachable:
            assert_never(unreachable)


def unattainable_note(result: GateResult[GateT]) -> str | None:
    """Why no predictor can pass ``result`` on its rows (None where its floor allows it)."""
    floor = result.floor
    if floor is None or result.attainable or floor.prediction_s is None:
        return None
    measured = ", ".join(
        f"{run} {seconds:.2f} s" for run, seconds in zip(floor.runs, floor.measured_s, strict=True)
    )
    return (
        f"{result.gate}: unattainable on these rows, floor {100.0 * floor.value:.1f}% > "
        f"{100.0 * result.limit:.0f}%. Runs with the same inputs were measured at {measured}; "
        f"one prediction serves them all, and the best, {floor.prediction_s:.2f} s, misses the "
        f"outermost by {100.0 * floor.value:.1f}%."
    )


def render_iteration_gates(title: str, gates: Sequence[GateResult[GateT]]) -> Table:
    """Iteration-time gates: value reached, limit, the floor the rows allow, rows failing,
    verdict; a caption says why a gate no predictor can pass is unattainable."""
    from blueprinting.report.gate_table import GateRow, render_gate_table

    notes = [note for result in gates if (note := unattainable_note(result)) is not None]
    return render_gate_table(
        title,
        (
            GateRow(
                gate=str(result.gate),
                count=result.count,
                reached=_gate_value(result)[0],
                limit=_gate_value(result)[1],
                floor="-"
                if result.floor is None
                else percent_text(result.floor.value, signed=False),
                failing=len(result.failing),
                passed=result.passed,
            )
            for result in gates
        ),
        caption="\n".join(notes) if notes else None,
    )


def render_modern_gates(validation: ModernValidation) -> Table:
    """The issue 12 item 7 gates."""
    return render_iteration_gates("Modern dense-run gates (issue 12)", validation.gates)
