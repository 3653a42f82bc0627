"""The Plotly figures more than one report kind draws, each built from the JSON report's values.

Colours are fixed per term so the same term reads the same on every page. Memory is drawn in GiB
(2**30 bytes); hovering a bar shows the exact bytes of the JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from blueprinting.report.html.page import GIB, JsonObject, integer, number, obj

# Time terms: the plan's breakdown (``time_breakdown_s``) and the simulation's iteration terms
# (``simulation.iteration_terms_s``).
TIME_COLOURS = {
    "forward": "#4c8be0",
    "backward": "#7bc96f",
    "recompute": "#a0d8a0",
    "pipeline_bubble": "#d9d9d9",
    "tp_comm_exposed": "#e07b4c",
    "pp_comm_exposed": "#f2b447",
    "dp_comm_exposed": "#b48ad6",
    "optimizer": "#7f7f7f",
    "host_exposed": "#c0504d",
    "makespan": "#5aa2ae",
    "param_gather_exposed": "#c9a0e6",
}

# Memory categories, bottom to top: Korthikanti et al. 2022's five (their sum is
# ``total``), then what the peaks add (their sum with ``total`` is ``reserved_peak``).
MEMORY_PARTS = (
    ("weights", "weights", "#4c8be0"),
    ("gradients", "gradients", "#7bc96f"),
    ("optimizer_states", "optimizer states", "#f2b447"),
    ("activations", "activations (stored)", "#e07b4c"),
    ("other", "other buffers", "#9e9e9e"),
    ("transient", "transient working set", "#f4c7b0"),
    ("workspace", "workspaces", "#d6c2ea"),
    ("allocator_reserve", "allocator reserve", "#e6e6e6"),
    ("cuda_context", "CUDA context", "#c7c7c7"),
    ("nccl_buffers", "NCCL buffers", "#b0b0b0"),
)


def _layout(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "template": "plotly_white",
        "margin": {"l": 80, "r": 20, "t": 60, "b": 50},
        "legend": {
            "orientation": "h",
            "x": 0,
            "y": 1.02,
            "yanchor": "bottom",
            "traceorder": "normal",
        },
        "font": {"family": "system-ui, sans-serif", "size": 12},
    }
    base.update(extra)
    return base


def time_breakdown_figure(bars: Sequence[tuple[str, JsonObject]]) -> Any:
    """One horizontal stacked bar per (label, terms in seconds); each bar sums to its total."""
    import plotly.graph_objects as go

    labels = [label for label, _ in bars]
    names: list[str] = []
    for _, terms in bars:
        names.extend(name for name in terms if name not in names)
    fig = go.Figure(layout=_layout(barmode="stack", height=140 + 50 * len(bars)))
    for name in names:
        xs = [number(terms, name) if name in terms else 0.0 for _, terms in bars]
        fig.add_trace(
            go.Bar(
                name=name,
                orientation="h",
                y=labels,
                x=xs,
                marker={"color": TIME_COLOURS.get(name, "#444444")},
                hovertemplate=f"{name}: %{{x:.6g}} s<extra>%{{y}}</extra>",
            )
        )
    fig.update_xaxes(title_text="seconds per iteration")
    fig.update_yaxes(autorange="reversed")
    return fig


def memory_stage_figure(stages: Sequence[JsonObject], capacity: int) -> Any:
    """Stacked bytes per GPU of each pipeline stage up to its reserved peak, and the capacity."""
    import plotly.graph_objects as go

    xs = [f"stage {integer(stage, 'stage')}" for stage in stages]
    fig = go.Figure(layout=_layout(barmode="stack", height=420))
    for key, label, colour in MEMORY_PARTS:
        values = [integer(stage, key) for stage in stages]
        fig.add_trace(
            go.Bar(
                name=label,
                x=xs,
                y=[v / GIB for v in values],
                customdata=values,
                marker={"color": colour},
                hovertemplate=f"{label}: %{{y:.3f}} GiB (%{{customdata}} B)<extra>%{{x}}</extra>",
            )
        )
    fig.add_hline(
        y=capacity / GIB,
        line={"color": "#c0392b", "dash": "dash"},
        annotation_text=f"capacity {capacity / GIB:.2f} GiB",
        annotation_position="top left",
    )
    fig.update_yaxes(title_text="GiB per GPU", rangemode="tozero")
    return fig


def pareto_figure(front: Sequence[JsonObject], ranked: Sequence[JsonObject]) -> Any:
    """Iteration time against the most loaded stage's memory: the Pareto front as a line, the
    listed strategies as labelled points."""
    import plotly.graph_objects as go

    fig = go.Figure(layout=_layout(height=440))
    fig.add_trace(
        go.Scatter(
            name="Pareto front",
            mode="lines+markers",
            line={"shape": "hv", "color": "#c0392b"},
            x=[integer(p, "memory_total_bytes") / GIB for p in front],
            y=[number(p, "iteration_time_s") for p in front],
            text=[str(p["strategy_text"]) for p in front],
            hovertemplate="%{text}<br>%{y:.6g} s, %{x:.3f} GiB<extra>Pareto front</extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            name="listed (re-planned)",
            mode="markers+text",
            marker={"color": "#4c8be0", "size": 9},
            x=[integer(obj(r, "memory_bytes"), "total") / GIB for r in ranked],
            y=[number(r, "iteration_time_s") for r in ranked],
            text=[f"#{integer(r, 'rank')}" for r in ranked],
            textposition="top center",
            customdata=[str(r["strategy_text"]) for r in ranked],
            hovertemplate="%{text} %{customdata}<br>%{y:.6g} s, %{x:.3f} GiB<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="memory of the most loaded stage, GiB (memory_bytes.total)")
    fig.update_yaxes(title_text="iteration time, s")
    return fig
