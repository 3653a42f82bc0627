"""The ``search --html`` page: the Pareto front of iteration time against memory, the sortable
table of the listed strategies and their Megatron-LM flags, from the ``search --json`` object."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import final

from blueprinting.report.html.figures import pareto_figure
from blueprinting.report.html.page import (
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
    strings,
    text,
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RankedRow:
    """One listed strategy: ``cells`` in column order, each sortable by its ``value``."""

    rank: int
    strategy: str
    summary: str
    cells: tuple[Shown, ...]
    flags: str


COLUMNS = (
    "iteration time",
    "tokens / s",
    "MFU",
    "memory (stored)",
    "reserved peak",
    "bubble",
    "TP exposed",
    "PP exposed",
    "DP exposed",
)


def _row(entry: JsonObject) -> RankedRow:
    rank = integer(entry, "rank")
    memory = obj(entry, "memory_bytes")
    terms = obj(entry, "time_breakdown_s")
    at = f"ranked[{rank - 1}]"
    return RankedRow(
        rank=rank,
        strategy=text(entry, "strategy_text"),
        summary=text(entry, "summary"),
        cells=(
            seconds(f"{at}.iteration_time_s", number(entry, "iteration_time_s")),
            plain(f"{at}.tokens_per_second", number(entry, "tokens_per_second"), ",.0f"),
            fraction(f"{at}.mfu", number(entry, "mfu")),
            gib(f"{at}.memory_bytes.total", integer(memory, "total")),
            gib(f"{at}.memory_bytes.reserved_peak", integer(memory, "reserved_peak")),
            *(
                seconds(f"{at}.time_breakdown_s.{name}", number(terms, name))
                for name in ("pipeline_bubble", "tp_comm_exposed", "pp_comm_exposed")
            ),
            seconds(f"{at}.time_breakdown_s.dp_comm_exposed", number(terms, "dp_comm_exposed")),
        ),
        flags=shlex.join(strings(entry, "megatron_args")),
    )


def render_search_html(document: JsonObject) -> str:
    """The page of one search, from the ``search --json`` object."""
    ranked = objects(document, "ranked")
    front = objects(document, "pareto_front")
    rejections = obj(document, "rejections")
    figures = [
        figure(
            "fig-pareto",
            "Pareto front: iteration time against memory",
            "pareto_front: every fitting candidate that no other beats on both iteration time "
            "and the most loaded stage's memory (vectorized figures, contract bubble); the "
            "points are the listed strategies, re-planned by the scalar planner.",
            pareto_figure(front, ranked),
        )
    ]
    return render(
        "search.html.j2",
        title=f"search {text(document, 'model')} on {text(document, 'system')}",
        kind="search",
        document=document,
        report_json=report_json(document),
        model=text(document, "model"),
        system=text(document, "system"),
        objective=text(document, "objective"),
        counts=[
            (
                "enumerated",
                plain("candidates_enumerated", integer(document, "candidates_enumerated"), ","),
            ),
            ("legal", plain("candidates_valid", integer(document, "candidates_valid"), ",")),
            ("fit in memory", plain("candidates_fit", integer(document, "candidates_fit"), ",")),
            ("search time", seconds("seconds", number(document, "seconds"))),
        ],
        figures=figures,
        columns=COLUMNS,
        rows=[_row(entry) for entry in ranked],
        front=front,
        rejections=[(k, v) for k, v in rejections.items() if v],
    )
