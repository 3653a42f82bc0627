"""The sweep's figure (``--plot FILE.png|svg``): one panel per model with the best tokens/s (or
the cost to train) against the GPU count, one line per system; below them a heatmap of the best
MFU over the grid (rows: model x system, columns: GPU counts).

"Best" is over the axes a panel does not show (global batches, sequence lengths): the highest
tokens/s, the lowest cost, the highest MFU among a point's cells whose status is ``ok``. A point
with no such cell is left out of a line and shown grey (with "-") in the heatmap. matplotlib is
imported lazily with the Agg backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from blueprinting.sweep.cell import BestStrategy, SweepRow
from blueprinting.sweep.definition import PlotMetric, SweepDefinition

PLOT_SUFFIXES = (".png", ".svg")

#: Heatmap cells annotated with their value up to this many (beyond, the colours alone).
MAX_ANNOTATED = 400


def _best(
    rows: Sequence[SweepRow], definition: SweepDefinition, metric: PlotMetric | str
) -> dict[tuple[str, str, int], float]:
    """(model, system, gpus) -> the best value of ``metric`` ("mfu" for the heatmap)."""
    best: dict[tuple[str, str, int], float] = {}
    for row in rows:
        if not isinstance(row.outcome, BestStrategy):
            continue
        c, figures = row.cell, row.outcome
        if metric == PlotMetric.TOKENS_PER_SECOND:
            value, higher = figures.tokens_per_second, True
        elif metric == PlotMetric.COST:
            price = definition.price(c.system)
            if price is None:
                continue
            value, higher = figures.gpu_hours * price, False
        else:
            value, higher = figures.mfu, True
        key = (c.model, c.system, c.gpus)
        if key not in best or (value > best[key] if higher else value < best[key]):
            best[key] = value
    return best


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
    curve = _best(rows, definition, metric)
    mfu = _best(rows, definition, "mfu")
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
