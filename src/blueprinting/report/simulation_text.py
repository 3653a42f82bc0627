"""The ``blueprinting simulate`` text report: contract vs simulated bubble, per-rank table.

rich is imported inside the function so that importing this module stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blueprinting.analysis.simulation_report import SimulationReport

if TYPE_CHECKING:
    from rich.console import Console


def render_simulation(report: SimulationReport, console: Console) -> None:
    from rich.table import Table

    plan = report.plan
    mapping = plan.spec.mapping
    schedule = mapping.parallelism.pipeline.schedule
    console.print(
        f"[bold]simulated schedule[/bold] {schedule}: p={mapping.pipeline_degree}, "
        f"v={plan.plan.virtual_stages}, m={mapping.microbatch_count}"
    )
    for refusal in report.megatron_refusals:
        console.print(
            f"[yellow]Megatron-LM refuses this schedule[/yellow] ({refusal}); simulated as a "
            "hypothetical",
        )
    if report.stuck is not None:
        console.print(f"[red]deadlock[/red]: {len(report.stuck)} stream(s) stuck at:")
        for command in report.stuck:
            console.print(f"  {command}", markup=False)
        return

    comparison = report.comparison
    if comparison is not None:
        bubbles = Table(title="Pipeline bubble: seed's contract vs simulation")
        bubbles.add_column("figure")
        bubbles.add_column("seconds", justify="right")
        bubbles.add_row("contract", f"{comparison.contract_s:.6f}")
        bubbles.add_row("simulated (P2P free)", f"{comparison.simulated_s:.6f}")
        bubbles.add_row("contract - simulated", f"{comparison.difference_s:+.6f}")
        bubbles.add_row("  interleaving term", f"{comparison.interleaving_term_s:+.6f}")
        bubbles.add_row("  P2P inside T_chunk", f"{comparison.p2p_in_chunk_s:+.6f}")
        bubbles.add_row("  imbalance correction", f"{-comparison.imbalance_correction_s:+.6f}")
        bubbles.add_row("  schedule residual", f"{comparison.schedule_residual_s:+.6f}")
        console.print(bubbles)
        if plan.bubble_simulated_p2p_exposed_s is not None:
            console.print(
                f"simulated P2P delay of the pipeline flush: "
                f"{plan.bubble_simulated_p2p_exposed_s:.6f} s"
            )
        for line in report.explanation:
            console.print(f"- {line}", markup=False)

    result = report.result
    if result is None:
        return
    # One row per rank, as fixed-width text: rich's table measures every cell, which cost
    # 0.1 s of the p = 64 report (issue 14: simulate within 2x of plan --no-simulate).
    names = ("rank", "busy s", "idle s", "comm busy s", "peak in-flight")
    rows = [
        (
            str(r),
            f"{result.busy_s_per_rank[r]:.4f}",
            f"{result.idle_s_per_rank[r]:.4f}",
            f"{result.comm_busy_s_per_rank[r]:.4f}",
            str(result.peak_inflight_per_rank[r]),
        )
        for r in range(result.dag.pipeline_degree)
    ]
    widths = [max(len(name), *(len(row[i]) for row in rows)) for i, name in enumerate(names)]

    def rank_line(cells: tuple[str, ...]) -> str:
        return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True))

    console.print(
        "\n".join(
            [
                "Per pipeline rank (full simulation: compute, P2P, DP buckets)",
                rank_line(names),
                "  ".join("-" * width for width in widths),
                *(rank_line(row) for row in rows),
            ]
        ),
        markup=False,
        highlight=False,
    )
    console.print(
        f"makespan {result.makespan_s:.4f} s (pipeline flush {result.pipeline_flush_s:.4f} s, "
        f"then DP reduction); bubble of the busiest rank {result.bubble_s:.4f} s "
        f"({100 * result.bubble_fraction:.2f}% of its work); {len(result.dag):,} commands"
    )
    agreement = report.iteration
    if agreement is not None:
        console.print(
            f"iteration time {agreement.iteration_time_s:.4f} s = makespan "
            f"{agreement.makespan_s:.4f} s + parameter all-gather "
            f"{agreement.param_gather_exposed_s:.4f} s + optimizer step "
            f"{agreement.optimizer_s:.4f} s (the last two are not simulated commands); plan "
            f"{agreement.plan_iteration_time_s:.4f} s, difference {agreement.difference_s:+.4f} s"
        )
        for line in agreement.reasons:
            console.print(f"- {line}", markup=False)
