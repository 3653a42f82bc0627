"""The mixture-of-experts part of ``blueprinting validate``: per-run rows, the error by model,
GPU generation and dispatcher, and the issue 13 gates.

rich is imported inside the functions so that importing this module stays cheap. Times are
seconds per iteration; errors are (predicted - measured) / measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blueprinting.report.modern_validation_text import (
    percent_text,
    render_error_summaries,
    render_iteration_gates,
    seconds_text,
)
from blueprinting.validation.modern_moe import MoeValidation

if TYPE_CHECKING:
    from rich.table import Table


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
        "note",
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
            seconds_text(row.measured_s),
            seconds_text(row.predicted_s),
            percent_text(row.relative_error),
            row.note,
        )
    out.caption = f"{len(validation.planned_rows)} of {len(validation.rows)} runs planned"
    return out


def render_moe_summaries(validation: MoeValidation) -> Table:
    """|error| over the planned MoE runs: all, per model, per GPU generation, per dispatcher,
    per CUDA-graph capture, per container release."""
    return render_error_summaries(
        "MoE runs: |error| by model, GPU generation, dispatcher, CUDA graphs and release",
        validation.summaries,
    )


def render_moe_gates(validation: MoeValidation) -> Table:
    """The issue 13 item 7 gates."""
    return render_iteration_gates("MoE-run gates (issue 13)", validation.gates)
