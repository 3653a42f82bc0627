"""The ``simulate --html`` page: the plan's sections, the simulated iteration and its
difference from the plan, the contract comparison, the per-rank table and the timeline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from blueprinting.report.html.figures import time_breakdown_figure
from blueprinting.report.html.page import (
    Figure,
    JsonObject,
    Shown,
    figure,
    integer,
    number,
    numbers,
    obj,
    plain,
    render,
    seconds,
    seconds_label,
    strings,
)
from blueprinting.report.html.plan import plan_context, shown_json
from blueprinting.report.html.timeline import (
    MAX_TIMELINE_COMMANDS,
    TimelineSelection,
    timeline_figure,
)

if TYPE_CHECKING:
    from blueprinting.analysis.simulation_report import SimulationReport


def selection_note(selection: TimelineSelection) -> str:
    zero = (
        f"; {selection.zero_length:,} zero-length commands have no bar"
        if selection.zero_length
        else ""
    )
    if selection.gap_start_s is None or selection.gap_end_s is None:
        return f"All {selection.commands:,} commands of the simulation are drawn{zero}."
    return (
        f"{selection.drawn:,} of {selection.commands:,} commands are drawn, to keep this file "
        f"small: the earliest- and the latest-starting halves; the commands starting "
        f"between {seconds_label(selection.gap_start_s)} and "
        f"{seconds_label(selection.gap_end_s)} are left out{zero}. "
        "blueprinting simulate --trace OUT.json writes every command."
    )


def _rank_rows(simulation: JsonObject) -> list[list[str]]:
    columns = (
        "busy_s_per_rank",
        "idle_s_per_rank",
        "comm_busy_s_per_rank",
    )
    values = [numbers(simulation, key) for key in columns]
    inflight = strings(simulation, "peak_inflight_per_rank")
    return [
        [str(rank), *(f"{column[rank]:.6g}" for column in values), inflight[rank]]
        for rank in range(len(inflight))
    ]


def render_simulation_html(
    report: SimulationReport, *, max_timeline_commands: int = MAX_TIMELINE_COMMANDS
) -> str:
    """The page of one simulation, from ``report.to_json_dict()`` (the ``simulate --json``
    object) and, for the timeline, the simulation result that object summarizes."""
    document = report.to_json_dict()
    plan = plan_context(document)
    simulation = obj(document, "simulation")
    figures: list[Figure] = []
    summary: list[tuple[str, Shown]] = []
    note = ""
    comparison = simulation["contract_comparison"]
    if report.result is not None:
        terms = obj(simulation, "iteration_terms_s")
        figures.append(
            figure(
                "fig-time-compared",
                "Plan and simulation, term by term",
                "The plan's time_breakdown_s against the simulation's iteration_terms_s "
                "(makespan, then what runs after the last command).",
                time_breakdown_figure(
                    [("plan", obj(document, "time_breakdown_s")), ("simulation", terms)]
                ),
            )
        )
        timeline, selection = timeline_figure(report.result, max_timeline_commands)
        note = selection_note(selection)
        figures.append(
            figure(
                "fig-timeline",
                "Schedule timeline of every pipeline rank",
                "One bar per command (drag to zoom, double-click to reset, hover for the "
                "command); later interleaved chunks are lighter.",
                timeline,
            )
        )
        summary = [
            (
                "simulated iteration time",
                seconds("simulation.iteration_time_s", number(simulation, "iteration_time_s")),
            ),
            (
                "plan - simulation",
                seconds("simulation.plan_difference_s", number(simulation, "plan_difference_s")),
            ),
            ("makespan", seconds("simulation.makespan_s", number(simulation, "makespan_s"))),
            (
                "pipeline flush",
                seconds("simulation.pipeline_flush_s", number(simulation, "pipeline_flush_s")),
            ),
            ("bubble", seconds("simulation.bubble_s", number(simulation, "bubble_s"))),
            (
                "commands",
                plain("simulation.commands", integer(simulation, "commands"), ","),
            ),
        ]
    return render(
        "simulate.html.j2",
        title=f"simulate {plan['model']} on {plan['system']}: {plan['summary']}",
        kind="simulate",
        plan=plan,
        report_json=plan["report_json"],
        schedule=str(simulation["schedule"]),
        simulation_figures=figures,
        summary=summary,
        reasons=strings(simulation, "plan_difference_reasons") if report.result is not None else [],
        comparison=[(k, shown_json(v)) for k, v in comparison.items() if k != "explanation"]
        if isinstance(comparison, dict)
        else [],
        explanation=strings(comparison, "explanation") if isinstance(comparison, dict) else [],
        ranks=_rank_rows(simulation) if report.result is not None else [],
        deadlock=strings(simulation, "deadlock") if simulation["deadlock"] is not None else [],
        refusals=strings(simulation, "megatron_refusals"),
        timeline_note=note,
    )
