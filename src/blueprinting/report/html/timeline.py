"""The schedule timeline of every pipeline rank as a Plotly figure: one row per rank and stream
(compute, comm), one bar per command, hover naming the command.

A page stays small by drawing at most ``limit`` commands. Past it, the earliest-starting half and
the latest-starting half are drawn (warm-up and cool-down, where the bubbles are) and the commands
starting between are left out; :class:`TimelineSelection` says which, and the page says so.
``--trace`` writes every command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_never, final

import numpy as np

from blueprinting.simulator.commands import COMM_STREAM, KIND_BY_CODE, CommandKind
from blueprinting.simulator.engine import SimulationResult

MAX_TIMELINE_COMMANDS = 10_000
"""Commands drawn on a page; about 60 bytes each in the file."""

KIND_STYLE: dict[CommandKind, tuple[str, str]] = {
    CommandKind.FORWARD: ("forward", "#4c8be0"),
    CommandKind.BACKWARD: ("backward", "#7bc96f"),
    CommandKind.BACKWARD_INPUT: ("backward (input)", "#5fae55"),
    CommandKind.WEIGHT_GRAD: ("weight gradient", "#f2b447"),
    CommandKind.SEND_FORWARD: ("send activations", "#9cc3f0"),
    CommandKind.SEND_BACKWARD: ("send gradients", "#b9e3b0"),
    CommandKind.DP_REDUCE: ("DP reduction", "#b48ad6"),
}

# Later interleaved chunks are lighter so chunk boundaries stay visible (as simulator/plot.py).
_CHUNK_OPACITY = (1.0, 0.75, 0.55, 0.4)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineSelection:
    """``drawn`` of ``commands`` with a positive duration; when some are left out, those
    starting in ``[gap_start_s, gap_end_s)`` are (None when all are drawn)."""

    commands: int
    drawn: int
    zero_length: int
    gap_start_s: float | None
    gap_end_s: float | None

    @property
    def complete(self) -> bool:
        return self.drawn + self.zero_length == self.commands


def select_commands(
    result: SimulationResult, limit: int = MAX_TIMELINE_COMMANDS
) -> tuple[np.ndarray, TimelineSelection]:
    """Indices of the commands to draw, in command order, and what was left out."""
    start, end = result.start_s, result.end_s
    positive = np.flatnonzero(end > start)
    total = len(result.dag)
    zero = total - len(positive)
    if len(positive) <= limit:
        return positive, TimelineSelection(
            commands=total, drawn=len(positive), zero_length=zero, gap_start_s=None, gap_end_s=None
        )
    head = limit // 2
    by_start = positive[np.argsort(start[positive], kind="stable")]
    first = by_start[:head]
    last = by_start[len(by_start) - (limit - head) :]
    chosen = np.sort(np.concatenate([first, last]))
    return chosen, TimelineSelection(
        commands=total,
        drawn=len(chosen),
        zero_length=zero,
        gap_start_s=float(start[first].max()),
        gap_end_s=float(start[last].min()),
    )


def timeline_figure(
    result: SimulationResult, limit: int = MAX_TIMELINE_COMMANDS
) -> tuple[Any, TimelineSelection]:
    """The figure (zoom with the mouse; hover names the command) and its selection."""
    import plotly.graph_objects as go

    dag = result.dag
    chosen, selection = select_commands(result, limit)
    p = dag.pipeline_degree
    kinds = dag.kind[chosen]
    start = result.start_s[chosen]
    duration = result.end_s[chosen] - start
    on_comm = np.zeros(len(dag), dtype=np.int64)
    for program in dag.programs[COMM_STREAM::2]:
        on_comm[program] = 1
    row = 2 * dag.rank[chosen] + on_comm[chosen]
    chunk, micro, peer = dag.chunk[chosen], dag.microbatch[chosen], dag.peer[chosen]
    fig = go.Figure(
        layout={
            "template": "plotly_white",
            "barmode": "overlay",
            "bargap": 0.15,
            "height": min(160 + 26 * 2 * p, 2400),
            "margin": {"l": 110, "r": 20, "t": 30, "b": 50},
            "legend": {"orientation": "h", "y": -0.12},
            "font": {"family": "system-ui, sans-serif", "size": 12},
            "hovermode": "closest",
        }
    )
    for code, kind in enumerate(KIND_BY_CODE):
        mask = kinds == code
        if not mask.any():
            continue
        label, colour = KIND_STYLE[kind]
        opacity = [_CHUNK_OPACITY[min(int(c), len(_CHUNK_OPACITY) - 1)] for c in chunk[mask]]
        what = _hover(kind)
        fig.add_trace(
            go.Bar(
                name=label,
                orientation="h",
                base=start[mask].tolist(),
                x=duration[mask].tolist(),
                y=row[mask].tolist(),
                customdata=np.stack(
                    [micro[mask] + 1, chunk[mask], peer[mask], row[mask] // 2], axis=1
                ).tolist(),
                marker={"color": colour, "opacity": opacity, "line": {"width": 0}},
                hovertemplate=f"{what}<br>{_WHEN}",
            )
        )
    fig.update_yaxes(
        tickvals=list(range(2 * p)),
        ticktext=[f"rank {r} {s}" for r in range(p) for s in ("compute", "comm")],
        autorange="reversed",
        showgrid=False,
    )
    fig.update_xaxes(title_text="time in the iteration, s", rangemode="tozero")
    return fig, selection


_WHEN = "start %{base:.6f} s, duration %{x:.6g} s<extra>rank %{customdata[3]}</extra>"


def _hover(kind: CommandKind) -> str:
    label = KIND_STYLE[kind][0]
    match kind:
        case (
            CommandKind.FORWARD
            | CommandKind.BACKWARD
            | CommandKind.BACKWARD_INPUT
            | CommandKind.WEIGHT_GRAD
        ):
            return f"{kind} {label}: microbatch %{{customdata[0]}}, chunk %{{customdata[1]}}"
        case CommandKind.SEND_FORWARD | CommandKind.SEND_BACKWARD:
            return (
                f"{kind} {label}: microbatch %{{customdata[0]}}, chunk %{{customdata[1]}} "
                "to rank %{customdata[2]}"
            )
        case CommandKind.DP_REDUCE:
            return f"{label}: gradient bucket of chunk %{{customdata[1]}}"
        case _ as unreachable:
            assert_never(unreachable)
