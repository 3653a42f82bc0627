"""Timeline picture of a simulation, in the style of Narayanan et al. 2021 (Figures 3 and 4):
one row per pipeline rank, forward and backward passes in distinct colours, microbatch numbers
on the boxes, bubbles left blank. matplotlib is imported lazily with the Agg backend.
"""

from __future__ import annotations

from pathlib import Path

from blueprinting.simulator.commands import _B, _BI, _DP, _F, _W
from blueprinting.simulator.engine import SimulationResult

_COLOURS = {
    _F: "#4c8be0",
    _B: "#7bc96f",
    _BI: "#7bc96f",
    _W: "#f2b447",
    _DP: "#b48ad6",
}
# Interleaved chunks get lighter shades so chunk boundaries stay visible.
_CHUNK_ALPHA = (1.0, 0.7, 0.5, 0.35)


def plot_timeline(result: SimulationResult, path: str | Path, *, max_labels: int = 400) -> Path:
    """Draw the compute streams (and DP reduction) to ``path`` (.png or .svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    dag = result.dag
    p = dag.pipeline_degree
    span = max(result.makespan_s, 1e-30)
    fig_w = 12.0
    fig, ax = plt.subplots(figsize=(fig_w, 0.5 * p + 1.3))
    labelled = sum(len(dag.programs[2 * r]) for r in range(p)) <= max_labels
    kinds, chunks, micro = dag.kind.tolist(), dag.chunk.tolist(), dag.microbatch.tolist()
    starts, durations = result.start_s.tolist(), dag.duration_s.tolist()
    # Outlines only while boxes are few: thousands of outlined slivers read as a black band.
    edge = 0.4 if labelled else 0.0
    for r in range(p):
        y = p - 1 - r
        # One broken_barh call per (kind, chunk) and rank: one artist each, not one per box.
        groups: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for c in dag.programs[2 * r].tolist():
            width = durations[c]
            if width <= 0.0:
                continue
            code = kinds[c]
            groups.setdefault((code, chunks[c]), []).append((starts[c], width))
            if labelled and width / span > 0.008:
                ax.text(
                    starts[c] + width / 2,
                    y,
                    str(micro[c] + 1),
                    ha="center",
                    va="center",
                    fontsize=7,
                )
        for (code, chunk), boxes in groups.items():
            ax.broken_barh(
                boxes,
                (y - 0.4, 0.8),
                facecolors=_COLOURS[code],
                alpha=_CHUNK_ALPHA[min(chunk, len(_CHUNK_ALPHA) - 1)],
                edgecolor="black",
                linewidth=edge,
            )
        reductions = [
            (starts[c], durations[c])
            for c in dag.programs[2 * r + 1].tolist()
            if kinds[c] == _DP and durations[c] > 0.0
        ]
        if reductions:
            ax.broken_barh(
                reductions,
                (y - 0.4, 0.8),
                facecolors=_COLOURS[_DP],
                edgecolor="black",
                linewidth=0.4,
            )
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"rank {r}" for r in range(p - 1, -1, -1)])
    ax.set_xlim(0.0, span)
    ax.set_xlabel("time (s)")
    ax.set_title(
        f"{dag.schedule}: p={p}, m={dag.costs.microbatch_count}, "
        f"bubble {result.bubble_s:.4g} s of {result.pipeline_flush_s:.4g} s"
    )
    handles = [
        Patch(facecolor=_COLOURS[_F], label="forward"),
        Patch(facecolor=_COLOURS[_B], label="backward"),
    ]
    if _W in kinds:
        handles.append(Patch(facecolor=_COLOURS[_W], label="weight grad"))
    if _DP in kinds:
        handles.append(Patch(facecolor=_COLOURS[_DP], label="DP reduce"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(handles))
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
