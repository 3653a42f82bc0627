"""The ``sweep --html`` page: the sweep's figures (per model, the best tokens/s or cost against
the GPU count, one line per system; the best MFU over the grid as a heatmap), every row as a
sortable table, the Megatron-LM flags of each best strategy, and what ran the cells; all from the
``sweep --json`` object.

A point's "best" is picked by ``sweep.plot.best_records``, the function ``--plot`` uses, over the
``rows`` records themselves; a heatmap cell with no ``ok`` row is grey and names, on hover, why
each of its rows has no strategy.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from blueprinting.report.html.figures import _layout
from blueprinting.report.html.page import (
    JsonObject,
    Shown,
    figure,
    fraction,
    gib,
    integer,
    number,
    objects,
    plain,
    render,
    report_json,
    seconds,
    strings,
    text,
)
from blueprinting.sweep.cell import CellStatus
from blueprinting.sweep.definition import PlotMetric
from blueprinting.sweep.plot import MAX_ANNOTATED, Point, best_records, metric_key

if TYPE_CHECKING:
    from blueprinting.analysis.report import JsonValue

#: Per-model panels side by side before the next row of panels.
MAX_PANEL_COLUMNS = 3

#: A heatmap cell with no strategy: the colour of ``--plot``'s masked cells.
NO_STRATEGY_GREY = "#dddddd"

Record = Mapping[str, "JsonValue"]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TableCell:
    """One cell of the rows table: ``shown`` when the JSON holds a value there, else empty
    (sorted last either way)."""

    shown: Shown | None
    numeric: bool


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SweepTableRow:
    index: int
    status: str
    cells: tuple[TableCell, ...]
    """The cell's own columns (``CELL_COLUMNS``)."""
    figures: tuple[TableCell, ...]
    """The best strategy's (``FIGURE_COLUMNS``), empty without one."""
    best: Shown | None
    """The best strategy's text (status ``ok``)."""
    reason: str | None
    """Why there is none (any other status)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FlagsBlock:
    index: int
    cell: str
    strategy: str
    flags: str


#: (header, record key, numeric): the columns before the strategy.
CELL_COLUMNS = (
    ("model", "model", False),
    ("system", "system", False),
    ("GPUs", "gpus", True),
    ("global batch", "global_batch", True),
    ("seq length", "seq_length", True),
    ("status", "status", False),
)
#: The columns after it (the best strategy's figures).
FIGURE_COLUMNS = (
    "iteration time",
    "tokens / s",
    "MFU",
    "reserved peak",
    "GPU-hours",
    "cost USD",
)


def _optional_number(record: Record, key: str) -> float | None:
    value = record[key]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"sweep row {key!r} is not a number: {value!r}")
    return float(value)


def _amount(key: str, value: float) -> Shown:
    # GPU-hours and dollars span 0.01 (a small model, few tokens) to 10**7: whole units from a
    # thousand up, four significant digits below.
    return plain(key, value, ",.0f" if abs(value) >= 1000 else ".4g")


def _figure_cells(at: str, record: JsonObject) -> tuple[TableCell, ...]:
    if record["status"] != str(CellStatus.OK):
        return tuple(TableCell(shown=None, numeric=True) for _ in FIGURE_COLUMNS)
    cost = _optional_number(record, "cost_usd")
    shown: tuple[Shown | None, ...] = (
        seconds(f"{at}.iteration_time_s", number(record, "iteration_time_s")),
        plain(f"{at}.tokens_per_second", number(record, "tokens_per_second"), ",.0f"),
        fraction(f"{at}.mfu", number(record, "mfu")),
        gib(f"{at}.memory_reserved_peak_bytes", integer(record, "memory_reserved_peak_bytes")),
        _amount(f"{at}.gpu_hours", number(record, "gpu_hours")),
        None if cost is None else _amount(f"{at}.cost_usd", cost),
    )
    return tuple(TableCell(shown=s, numeric=True) for s in shown)


def _table_row(index: int, record: JsonObject) -> SweepTableRow:
    at = f"rows[{index}]"
    head = tuple(
        TableCell(
            shown=Shown(key=f"{at}.{key}", value=str(record[key]), label=str(record[key])),
            numeric=numeric,
        )
        for _, key, numeric in CELL_COLUMNS
    )
    ok = record["status"] == str(CellStatus.OK)
    strategy = text(record, "strategy_text") if ok else None
    return SweepTableRow(
        index=index,
        status=text(record, "status"),
        cells=head,
        figures=_figure_cells(at, record),
        best=None
        if strategy is None
        else Shown(key=f"{at}.strategy_text", value=strategy, label=strategy),
        reason=None if ok else text(record, "reason"),
    )


def _axes(records: Sequence[Record]) -> tuple[list[str], list[str], list[int]]:
    """Models, systems and GPU counts in grid order: the rows are in grid order, so the order
    values first appear in is the sweep's."""
    models: list[str] = []
    systems: list[str] = []
    gpus: list[int] = []
    for record in records:
        for values, value in (
            (models, str(record["model"])),
            (systems, str(record["system"])),
        ):
            if value not in values:
                values.append(value)
        count = int(str(record["gpus"]))
        if count not in gpus:
            gpus.append(count)
    return models, systems, gpus


def _hover_cell(record: Record) -> str:
    return f"B={record['global_batch']} s={record['seq_length']}"


def curves_figure(
    records: Sequence[Record],
    models: Sequence[str],
    systems: Sequence[str],
    gpus: Sequence[int],
    *,
    metric: PlotMetric,
    train_tokens: int,
) -> Any:
    """One panel per model: the best value of ``metric`` against the GPU count (log 2), one line
    per system, each point a record of ``rows`` (hover: its cell and strategy)."""
    import plotly.colors
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    key, higher = metric_key(metric)
    best = best_records(records, key, higher=higher)
    columns = min(len(models), MAX_PANEL_COLUMNS)
    panel_rows = math.ceil(len(models) / columns)
    fig = make_subplots(
        rows=panel_rows,
        cols=columns,
        subplot_titles=list(models),
        horizontal_spacing=0.07,
        vertical_spacing=0.18 if panel_rows > 1 else 0.0,
    )
    # The legend above the panels' titles.
    fig.update_layout(
        _layout(height=150 + 340 * panel_rows, margin={"l": 80, "r": 20, "t": 100, "b": 50})
    )
    fig.update_layout(legend={"y": 0.98, "yanchor": "top", "yref": "container"})
    palette = plotly.colors.qualitative.Plotly
    unit = "tokens/s" if metric is PlotMetric.TOKENS_PER_SECOND else "USD"
    for i, model in enumerate(models):
        row, col = divmod(i, columns)
        for j, system in enumerate(systems):
            points = [best[(model, system, n)] for n in gpus if (model, system, n) in best]
            fig.add_trace(
                go.Scatter(
                    name=system,
                    legendgroup=system,
                    showlegend=i == 0,
                    mode="lines+markers",
                    line={"color": palette[j % len(palette)]},
                    x=[p["gpus"] for p in points],
                    y=[p[key] for p in points],
                    customdata=[[_hover_cell(p), str(p["strategy_text"])] for p in points],
                    hovertemplate=(
                        f"%{{x}} GPUs, %{{customdata[0]}}: %{{y:,.6g}} {unit}"
                        f"<br>%{{customdata[1]}}<extra>{system}</extra>"
                    ),
                ),
                row=row + 1,
                col=col + 1,
            )
        if not any((model, system, n) in best for system in systems for n in gpus):
            axis = "" if i == 0 else str(i + 1)
            fig.update_xaxes(showticklabels=False, showgrid=False, row=row + 1, col=col + 1)
            fig.update_yaxes(showticklabels=False, showgrid=False, row=row + 1, col=col + 1)
            fig.add_annotation(
                text="no cell of this model has a strategy (see the rows)",
                xref=f"x{axis} domain",
                yref=f"y{axis} domain",
                x=0.5,
                y=0.5,
                showarrow=False,
                font={"color": "#888888"},
            )
    ylabel = (
        "best tokens/s"
        if metric is PlotMetric.TOKENS_PER_SECOND
        else f"cost to train {train_tokens:,} tokens, USD"
    )
    # Every panel spans the sweep's GPU counts, an empty one too.
    span = (math.log10(min(gpus)), math.log10(max(gpus)))
    pad = 0.08 * max(span[1] - span[0], 1.0)
    fig.update_xaxes(
        type="log",
        range=[span[0] - pad, span[1] + pad],
        tickvals=list(gpus),
        ticktext=[str(n) for n in gpus],
        title_text="GPUs",
    )
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text=ylabel, col=1)
    return fig


def mfu_heatmap_figure(
    records: Sequence[Record],
    models: Sequence[str],
    systems: Sequence[str],
    gpus: Sequence[int],
) -> Any:
    """The best MFU of each (model / system, GPU count); a point with no ``ok`` row is grey and
    its hover lists each of its rows' reasons."""
    import plotly.graph_objects as go

    best = best_records(records, "mfu", higher=True)
    reasons: dict[Point, list[str]] = {}
    for record in records:
        if record["status"] != str(CellStatus.OK):
            point = (str(record["model"]), str(record["system"]), int(str(record["gpus"])))
            reasons.setdefault(point, []).append(f"{_hover_cell(record)}: {record['reason']}")
    labels = [f"{m} / {s}" for m in models for s in systems]
    columns = [str(n) for n in gpus]
    points = [[(m, s, n) for n in gpus] for m in models for s in systems]
    mfu: list[list[float | None]] = []
    strategies: list[list[str]] = []
    missing: list[list[int | None]] = []
    why: list[list[str]] = []
    for line in points:
        mfu.append([_mfu(best[p]) if p in best else None for p in line])
        strategies.append(
            [
                f"{_hover_cell(best[p])}: {best[p]['strategy_text']}" if p in best else ""
                for p in line
            ]
        )
        missing.append([None if p in best else 0 for p in line])
        why.append(["" if p in best else "<br>".join(reasons.get(p, [])) for p in line])
    annotate = len(labels) * len(columns) <= MAX_ANNOTATED
    fig = go.Figure(layout=_layout(height=170 + 30 * len(labels)))
    if best:
        fig.add_trace(
            go.Heatmap(
                name="best MFU",
                x=columns,
                y=labels,
                z=mfu,
                text=strategies,
                colorscale="Viridis",
                colorbar={"title": {"text": "MFU"}},
                hoverongaps=False,
                texttemplate="%{z:.2f}" if annotate else None,
                hovertemplate="%{y}, %{x} GPUs<br>best MFU %{z:.4f}<br>%{text}<extra></extra>",
            )
        )
    if any(p not in best for line in points for p in line):
        fig.add_trace(
            go.Heatmap(
                name="no strategy",
                x=columns,
                y=labels,
                z=missing,
                text=why,
                colorscale=[[0.0, NO_STRATEGY_GREY], [1.0, NO_STRATEGY_GREY]],
                showscale=False,
                hoverongaps=False,
                texttemplate="-" if annotate else None,
                hovertemplate="%{y}, %{x} GPUs: no strategy<br>%{text}<extra></extra>",
            )
        )
    fig.update_xaxes(title_text="GPUs", type="category")
    fig.update_yaxes(type="category", autorange="reversed")
    return fig


def _mfu(record: Record) -> float:
    value = record["mfu"]
    assert isinstance(value, float)
    return value


def _engine_text(engine: JsonValue) -> str:
    if engine is None:
        return (
            "Nothing to compute: every cell was already in the output folder (Ray was not started)."
        )
    if not isinstance(engine, dict):
        raise TypeError(f"sweep JSON 'engine' is not an object: {engine!r}")
    return (
        f"Cells computed on Ray {engine['version']} ({engine['mode']}, {engine['address']}, "
        f"{engine['workers']} workers)."
    )


def render_sweep_html(
    document: JsonObject, metric: PlotMetric = PlotMetric.TOKENS_PER_SECOND
) -> str:
    """The page of one sweep, from the ``sweep --json`` object; ``metric`` is the per-model
    panels' y axis (``--plot-metric``)."""
    records = objects(document, "rows")
    models, systems, gpus = _axes(records)
    train_tokens = integer(records[0], "train_tokens") if records else 0
    rows = [_table_row(i, r) for i, r in enumerate(records)]
    statuses = [(str(s), sum(r.status == str(s) for r in rows)) for s in CellStatus]
    tokens = metric is PlotMetric.TOKENS_PER_SECOND
    what = "Best tokens/s" if tokens else "Cost to train"
    measure = "highest tokens/s" if tokens else "lowest cost"
    key, _ = metric_key(metric)
    figures = []
    if records:
        figures = [
            figure(
                "fig-curves",
                f"{what} against the GPU count",
                f"One panel per model, one line per system. Each point is the {measure} of "
                "the best row (rows[*]." + key + ") over the point's cells (global batches, "
                "sequence lengths) whose status is ok; a point without such a cell is left out "
                "of its line.",
                curves_figure(
                    records, models, systems, gpus, metric=metric, train_tokens=train_tokens
                ),
            ),
            figure(
                "fig-mfu",
                "Best MFU over the grid",
                "Rows: model / system; columns: GPU counts; each cell the highest rows[*].mfu of "
                "its ok rows. Grey: no row of that point has a strategy; hover for each row's "
                "reason.",
                mfu_heatmap_figure(records, models, systems, gpus),
            ),
        ]
    flags = [
        FlagsBlock(
            index=i,
            cell=(
                f"{r['model']} {r['system']} N={r['gpus']} B={r['global_batch']} "
                f"s={r['seq_length']}"
            ),
            strategy=str(r["strategy_text"]),
            flags=shlex.join(strings(r, "megatron_args")),
        )
        for i, r in enumerate(records)
        if r["status"] == str(CellStatus.OK)
    ]
    return render(
        "sweep.html.j2",
        title=f"sweep of {len(records):,} cells",
        kind="sweep",
        document=document,
        report_json=report_json(document),
        metric=str(metric),
        engine=_engine_text(document["engine"]),
        out=text(document, "out"),
        counts=[
            ("cells", plain("cells", integer(document, "cells"), ",")),
            ("computed now", plain("computed_cells", integer(document, "computed_cells"), ",")),
            ("run time", seconds("seconds", number(document, "seconds"))),
        ],
        statuses=[(name, count) for name, count in statuses if count],
        figures=figures,
        cell_columns=[(name, numeric) for name, _, numeric in CELL_COLUMNS],
        figure_columns=FIGURE_COLUMNS,
        rows=rows,
        flags=flags,
    )
