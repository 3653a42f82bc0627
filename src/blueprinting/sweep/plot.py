"""The sweep's figure (``--plot FILE.png|svg``): one panel per model with the best tokens/s (or
the cost to train) against the GPU count, one line per system; below them a heatmap of the best
MFU over the grid (rows: model x system, columns: GPU counts).

"Best" is over the axes a panel does not show (global batches, sequence lengths): the highest
tokens/s, the lowest cost, the highest MFU among a point's cells whose status is ``ok``. A point
with no such cell is left out of a line and shown grey (with "-") in the heatmap. The points are
picked by ``best_records`` from the rows' records, which ``sweep --html`` draws from too.
matplotlib is imported lazily with the Agg backend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, assert_never

from blueprinting.sweep.cell import CellStatus, SweepRow
from blueprinting.sweep.definition import PlotMetric, SweepDefinition

if TYPE_CHECKING:
    from blueprinting.analysis.report import JsonValue

PLOT_SUFFIXES = (".png", ".svg")

#: Heatmap cells annotated with their value up to this many (beyond, the colours alone).
MAX_ANNOTATED = 400


#: Point -> the best record there: (model, system, GPU count).
Point = tuple[str, str, int]


def best_records(
    records: Sequence[Mapping[str, JsonValue]], key: str, *, higher: bool
) -> dict[Point, Mapping[str, JsonValue]]:
    """The record with the best ``key`` (the highest if ``higher``, else the lowest) at each
    point, among the records whose status is ``ok`` and whose ``key`` is set (``cost_usd`` is
    unset for a system without a price); the first such record wins a tie.

    ``records`` are :meth:`SweepRow.record` objects (the rows of ``sweep --json``): ``--plot``
    and the ``--html`` page pick their points with this one function."""
    best: dict[Point, Mapping[str, JsonValue]] = {}
    for record in records:
        value = record[key]
        if record["status"] != str(CellStatus.OK) or not isinstance(value, int | float):
            continue
        point = (str(record["model"]), str(record["system"]), int(str(record["gpus"])))
        if point in best:
            held = best[point][key]
            assert isinstance(held, int | float)
            if not (value > held if higher else value < held):
                continue
        best[point] = record
    return best


def metric_key(metric: PlotMetric) -> tuple[str, bool]:
    """The record key a metric plots and whether higher is better."""
    match metric:
        case PlotMetric.TOKENS_PER_SECOND:
            return "tokens_per_second", True
        case PlotMetric.COST:
            return "cost_usd", False
        case _ as unreachable:
            assert_never(unreachable)


def _best(
    records: Sequence[Mapping[str, JsonValue]], key: str, *, higher: bool
) -> dict[Point, float]:
    out: dict[Point, float] = {}
    for point, record in best_records(records, key, higher=higher).items():
        value = record[key]
        assert isinstance(value, int | float)
        out[point] = float(value)
    return out


def plot_sweep(
    rows: Sequence[SweepRow],
    definition: SweepDefinition,
    path: Path,
    metric: PlotMetric = PlotMetric.TOKENS_PER_SECOND,
) -> Path:
    """Draw the figure to ``path`` (its suffix picks PNG or SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    models, systems, gpus = definition.models, definition.systems, definition.gpus
    records = [row.record(definition.price(row.cell.system)) for row in rows]
    key, higher = metric_key(metric)
    curve = _best(records, key, higher=higher)
    mfu = _best(records, "mfu", higher=True)
    width = max(4.2 * len(models), 8.0)
    heat_rows = len(models) * len(systems)
    fig = plt.figure(figsize=(width, 4.0 + 0.32 * heat_rows + 1.2), layout="constrained")
    grid = fig.add_gridspec(2, len(models), height_ratios=(4.0, 0.32 * heat_rows + 1.2))
    ylabel = "best tokens/s" if metric is PlotMetric.TOKENS_PER_SECOND else "cost to train, USD"
    for i, model in enumerate(models):
        ax = fig.add_subplot(grid[0, i])
        for system in systems:
            points = [(n, curve[(model, system, n)]) for n in gpus if (model, system, n) in curve]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=system)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(gpus, [str(n) for n in gpus])
        ax.set_title(model)
        ax.set_xlabel("GPUs")
        if i == 0:
            ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:  # a model with no strategy anywhere has no line to name
            ax.legend(fontsize=7)
    tokens = definition.options.train_tokens
    if metric is PlotMetric.COST:
        fig.suptitle(f"cost to train {tokens:,} tokens (best strategy per point)")
    else:
        fig.suptitle("best throughput per point (each point: one full strategy search)")

    heat = fig.add_subplot(grid[1, :])
    labels = [f"{m} / {s}" for m in models for s in systems]
    values = np.array(
        [[mfu.get((m, s, n), math.nan) for n in gpus] for m in models for s in systems]
    )
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    image = heat.imshow(np.ma.masked_invalid(values), aspect="auto", cmap=cmap)
    heat.set_xticks(range(len(gpus)), [str(n) for n in gpus])
    heat.set_yticks(range(len(labels)), labels, fontsize=8)
    heat.set_xlabel("GPUs")
    heat.set_title("best MFU over the grid")
    fig.colorbar(image, ax=heat, label="MFU")
    if values.size <= MAX_ANNOTATED:
        low, high = image.get_clim()
        for r in range(values.shape[0]):
            for c in range(values.shape[1]):
                v = float(values[r, c])
                # Dark text on the light end of the colour map, white on the dark end.
                light = math.isnan(v) or (v - low) > 0.5 * (high - low)
                heat.text(
                    c,
                    r,
                    "-" if math.isnan(v) else f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="k" if light else "w",
                )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
