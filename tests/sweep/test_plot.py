"""The sweep figure's points (``best_records``, shared by ``--plot`` and ``--html``) and the
figure itself, from rows computed without Ray."""

from __future__ import annotations

from pathlib import Path

from blueprinting.analysis.report import JsonValue
from blueprinting.sweep.definition import PlotMetric, definition_from_mapping
from blueprinting.sweep.plot import best_records, metric_key, plot_sweep
from tests.report.html_cases import SWEEP_GRID, sweep_rows


def _record(
    batch: int, status: str, tokens: float | None, cost: float | None
) -> dict[str, JsonValue]:
    return {
        "model": "m",
        "system": "s",
        "gpus": 8,
        "global_batch": batch,
        "status": status,
        "tokens_per_second": tokens,
        "cost_usd": cost,
    }


def test_best_record_per_point_over_the_hidden_axes() -> None:
    records = [
        _record(16, "ok", 100.0, 9.0),
        _record(32, "ok", 300.0, None),  # a system without a price: no cost
        _record(64, "no-fitting-strategy", None, None),
        _record(128, "ok", 300.0, 7.0),  # ties the tokens/s of B=32: the first one stays
        _record(256, "ok", 200.0, 7.5),
    ]
    fastest = best_records(records, "tokens_per_second", higher=True)
    assert list(fastest) == [("m", "s", 8)]
    assert fastest["m", "s", 8]["global_batch"] == 32
    cheapest = best_records(records, "cost_usd", higher=False)
    assert cheapest["m", "s", 8]["global_batch"] == 128
    assert best_records(records[2:3], "tokens_per_second", higher=True) == {}
    assert metric_key(PlotMetric.TOKENS_PER_SECOND) == ("tokens_per_second", True)
    assert metric_key(PlotMetric.COST) == ("cost_usd", False)


def test_plot_draws_the_rows(tmp_path: Path) -> None:
    definition = definition_from_mapping(SWEEP_GRID, source="test")
    path = plot_sweep(sweep_rows(), definition, tmp_path / "figure" / "sweep.svg")
    drawing = path.read_text(encoding="utf-8")
    assert drawing.startswith("<?xml")
    for label in ("gpt-1.7b", "llama3-405b", "best MFU over the grid", "best tokens/s"):
        assert label in drawing
