"""The mixture-of-experts part of ``blueprinting validate``: per-run rows, the error by model,
GPU generation and dispatcher, and the issue 13 gates.

rich is imported inside the functions so that importing this module stays cheap. Times are
seconds per iteration; errors are (predicted - measured) / measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, assert_never

from blueprinting.validation.modern_moe import MoeGate, MoeGateResult, MoeValidation

if TYPE_CHECKING:
    from rich.table import Table


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _percent(value: float | None, *, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100.0 * value:+.1f}%" if signed else f"{100.0 * value:.1f}%"


def render_moe_rows(validation: MoeValidation) -> Table:
    """One line per MoE run: layout (t/p/cp/ep/vp, etp), dispatcher, recipe, measured and
    predicted iteration time and the error, or the planner's message where it is not planned."""
    from rich.table import Table

    out = Table(title="MoE runs: iteration time, measured vs predicted (s)")
    numeric = {"gpus", "t/p/cp/ep/vp", "etp", "measured", "predicted", "error"}
    for column in (
        "run",
        "model",
        "system",
        "gpus",
        "t/p/cp/ep/vp",
        "etp",
        "dispatcher",
        "recipe",
        "measured",
        "predicted",
        "error",
        "not planned",
    ):
        out.add_column(column, justify="right" if column in numeric else "left", overflow="fold")
    for moe in validation.rows:
        row = moe.row
        out.add_row(
            row.run_id,
            row.model,
            row.system,
            str(row.num_gpus),
            f"{row.tensor_parallel}/{row.pipeline_parallel}/{row.context_parallel}/"
            f"{moe.expert_parallel}/{moe.virtual_pipeline}",
            str(moe.expert_tensor_parallel),
            str(moe.dispatcher),
            str(row.recipe),
            _seconds(row.measured_s),
            _seconds(row.predicted_s),
            _percent(row.relative_error),
            row.not_planned,
        )
    out.caption = f"{len(validation.planned_rows)} of {len(validation.rows)} runs planned"
    return out


def render_moe_summaries(validation: MoeValidation) -> Table:
    """|error| over the planned MoE runs: all, per model, per GPU generation, per dispatcher."""
    from rich.table import Table

    out = Table(title="MoE runs: |error| by model, GPU generation and dispatcher")
    for column in ("split", "group", "runs", "planned", "median |err|", "max |err|", "mean err"):
        out.add_column(column, justify="left" if column in {"split", "group"} else "right")
    for summary in validation.summaries:
        out.add_row(
            str(summary.axis),
            summary.group,
            str(summary.rows),
            str(summary.planned),
            _percent(summary.median_abs_error, signed=False),
            _percent(summary.max_abs_error, signed=False),
            _percent(summary.mean_error),
        )
    return out


def _gate_value(result: MoeGateResult) -> tuple[str, str]:
    match result.gate:
        case MoeGate.MEDIAN_ERROR | MoeGate.MAX_ERROR:
            return _percent(result.value, signed=False), f"<= {100.0 * result.limit:.0f}%"
        case MoeGate.ALL_PLANNED:
            return f"{result.count - len(result.failing)}/{result.count}", "all"
        case _ as unreachable:
            assert_never(unreachable)


def render_moe_gates(validation: MoeValidation) -> Table:
    """The issue 13 item 7 gates."""
    from blueprinting.report.gate_table import GateRow, render_gate_table

    return render_gate_table(
        "MoE-run gates (issue 13)",
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
