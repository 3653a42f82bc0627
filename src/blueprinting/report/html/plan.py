"""The ``plan --html`` page, and the plan sections ``simulate --html`` shares."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

from blueprinting.report.html.figures import memory_stage_figure, time_breakdown_figure
from blueprinting.report.html.page import (
    Figure,
    JsonObject,
    Shown,
    figure,
    fraction,
    gib,
    integer,
    number,
    obj,
    objects,
    plain,
    render,
    report_json,
    seconds,
    seconds_label,
    strings,
    text,
)

if TYPE_CHECKING:
    from blueprinting.analysis.report import IterationReport, JsonValue


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LawRow:
    name: str
    ruleset: str
    formula: str
    status: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TermRow:
    name: str
    shown: Shown
    share: str


def headline(document: JsonObject) -> list[tuple[str, Shown]]:
    """The figures a reader looks for first, each with its JSON key."""
    memory = obj(document, "memory_bytes")
    train = obj(document, "time_to_train")
    return [
        ("iteration time", seconds("iteration_time_s", number(document, "iteration_time_s"))),
        (
            "tokens / s",
            plain("tokens_per_second", number(document, "tokens_per_second"), ",.0f"),
        ),
        (
            "model TFLOP/s per GPU",
            plain("tflops_per_gpu", number(document, "tflops_per_gpu"), ".1f"),
        ),
        ("MFU", fraction("mfu", number(document, "mfu"))),
        ("HFU", fraction("hfu", number(document, "hfu"))),
        (
            f"memory (stage {integer(memory, 'stage')}, stored)",
            gib("memory_bytes.total", integer(memory, "total")),
        ),
        ("reserved peak", gib("memory_bytes.reserved_peak", integer(memory, "reserved_peak"))),
        ("HBM capacity", gib("memory_bytes.capacity", integer(memory, "capacity"))),
        ("headroom", gib("memory_bytes.headroom", integer(memory, "headroom"))),
        ("days to train", plain("time_to_train.days", number(train, "days"), ".2f")),
    ]


def term_rows(terms: JsonObject, total: float) -> list[TermRow]:
    rows = []
    for name in terms:
        value = number(terms, name)
        share = f"{100 * value / total:.1f}%" if total > 0 else "-"
        rows.append(TermRow(name=name, shown=seconds(name, value), share=share))
    return rows


def law_rows(document: JsonObject) -> list[LawRow]:
    """Every named law with its formula. A plan exists only for a strategy that keeps every
    planner law; the Megatron-LM rules hold unless ``megatron_refusals`` lists one."""
    from blueprinting.errors import RuleSet
    from blueprinting.mapping.law_names import Law

    refused = bool(strings(document, "megatron_refusals"))
    rows = []
    for law in Law:
        if law.ruleset is RuleSet.PLANNER:
            status = "holds"
        else:
            status = "see refusals" if refused else "holds"
        rows.append(
            LawRow(name=str(law), ruleset=str(law.ruleset), formula=law.formula, status=status)
        )
    return rows


def shown_json(value: JsonValue) -> str:
    """A JSON scalar as a table cell: seconds rounded to 6 significant digits."""
    if isinstance(value, float):
        return seconds_label(value)
    return "null" if value is None else str(value)


def plan_context(document: JsonObject) -> dict[str, object]:
    """What the plan sections of a page show (``templates/plan_sections.html.j2``)."""
    breakdown = obj(document, "time_breakdown_s")
    total = number(document, "iteration_time_s")
    memory = obj(document, "memory_bytes")
    stages = objects(document, "memory_bytes_per_stage")
    bubble = obj(document, "bubble")
    strategy = obj(document, "strategy")
    figures: list[Figure] = [
        figure(
            "fig-time",
            "Time breakdown of one iteration",
            "time_breakdown_s of the critical stage; the terms sum to iteration_time_s.",
            time_breakdown_figure([("plan", breakdown)]),
        ),
        figure(
            "fig-memory",
            "Memory per GPU of each pipeline stage",
            "memory_bytes_per_stage: Korthikanti et al. 2022's five categories (their sum is "
            "total), then the transient working set, workspaces, allocator reserve, CUDA "
            "context and NCCL buffers up to reserved_peak; the dashed line is the HBM capacity.",
            memory_stage_figure(stages, integer(memory, "capacity")),
        ),
    ]
    return {
        "document": document,
        "report_json": report_json(document),
        "model": text(document, "model"),
        "system": text(document, "system"),
        "summary": text(document, "summary"),
        "world_size": integer(document, "world_size"),
        "microbatch_count": integer(document, "microbatch_count"),
        "headline": headline(document),
        "fits": bool(document["fits_in_memory"]),
        "terms": term_rows(breakdown, total),
        "iteration": seconds("iteration_time_s", total),
        "figures": figures,
        "bubble": [
            (key, shown_json(bubble[key]))
            for key in ("used", "contract_s", "simulated_s", "simulated_p2p_exposed_s")
        ],
        "bubble_note": bubble["simulation_note"],
        "laws": law_rows(document),
        "refusals": strings(document, "megatron_refusals"),
        "flags": shlex.join(strings(document, "megatron_args")),
        "strategy": sorted(strategy.items()),
        "flops_convention": text(document, "flops_convention"),
    }


def render_plan_html(report: IterationReport) -> str:
    """The page of one plan, from ``report.to_json_dict()`` (the ``plan --json`` object)."""
    document = report.to_json_dict()
    context = plan_context(document)
    return render(
        "plan.html.j2",
        title=f"{context['model']} on {context['system']}: {context['summary']}",
        kind="plan",
        plan=context,
        report_json=context["report_json"],
    )
