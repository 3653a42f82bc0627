"""Small strategies the HTML report tests render (fast: a 1.7B model, a few microbatches), and
a small sweep whose cells are computed without Ray."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from blueprinting.cli.main import main
from blueprinting.sweep.cell import SweepRow, evaluate_cell
from blueprinting.sweep.definition import definition_from_mapping
from blueprinting.sweep.store import SweepStore

#: gpt-1.7b, TP2 PP4 v2 DP2, 8 microbatches: an interleaved schedule of 400-odd commands.
PLAN_ARGS = (
    "--model",
    "gpt-1.7b",
    "--gpus",
    "16",
    "--set",
    "tensor_model_parallel_size=2",
    "--set",
    "pipeline_model_parallel_size=4",
    "--set",
    "num_virtual_stages_per_pipeline_rank=2",
    "--set",
    "global_batch_size=16",
    "--set",
    "micro_batch_size=1",
)
SEARCH_ARGS = ("--model", "gpt-1.7b", "--gpus", "16", "--global-batch", "64", "--top", "5")


def run_with_html(
    capsys: pytest.CaptureFixture[str], command: str, args: tuple[str, ...], out: Path
) -> dict[str, Any]:
    """Run ``command ARGS --json --html OUT`` and return the JSON it printed: the page and the
    JSON come from one run, so they must agree exactly."""
    code = main([command, *args, "--json", "--html", str(out)])
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert isinstance(document, dict)
    return document


def embedded_json(page: str) -> object:
    """The ``<script id="report-json">`` object of a page."""
    found = re.search(r'<script type="application/json" id="report-json">(.*?)</script>', page)
    assert found is not None
    return json.loads(found.group(1))


def without_plotly(page: str) -> str:
    """The page less the inlined Plotly bundle (whose code holds attribution URLs of map tiles
    that a page without maps never loads)."""
    head, _, rest = page.partition("<script>\n")
    _, _, tail = rest.partition("\n</script>\n</head>")
    assert tail, "the Plotly bundle is the first script of the head"
    return head + tail


#: A sweep of twelve cells: gpt-1.7b has a strategy at 8 and 16 GPUs on both systems and none at
#: 7 (no lawful one); llama3-405b fits on none of them. Only dgx-h100 has a price.
SWEEP_GRID: dict[str, object] = {
    "model": ["gpt-1.7b", "llama3-405b"],
    "system": ["dgx-h100", "dgx-a100-40gb"],
    "gpus": [7, 8, 16],
    "global_batch": [16],
    "max_micro_batch": 2,
    "train_tokens": 10**9,
    "price": {"dgx-h100": 2.5},
}
SWEEP_ARGS = (
    *("--model", "gpt-1.7b", "llama3-405b"),
    *("--system", "dgx-h100", "dgx-a100-40gb"),
    *("--gpus", "7", "8", "16"),
    *("--global-batch", "16", "--max-micro-batch", "2", "--train-tokens", "1000000000"),
    *("--price", "dgx-h100=2.5"),
)


@cache
def sweep_rows() -> tuple[SweepRow, ...]:
    """The grid's rows, each cell evaluated in this process (``evaluate_cell``, no Ray)."""
    definition = definition_from_mapping(SWEEP_GRID, source="test")
    return tuple(evaluate_cell(cell, definition.options) for cell in definition.cells())


def computed_sweep_folder(out: Path) -> Path:
    """An output folder that already holds every row of ``SWEEP_GRID``, written as a run would
    (``SweepStore``), so ``sweep`` computes nothing and starts no Ray."""
    definition = definition_from_mapping(SWEEP_GRID, source="test")
    with SweepStore(out, definition.options) as store:
        store.start_csv(definition.price)
        store.append(sweep_rows(), definition.price)
        store.finish([c.key for c in definition.cells()], definition.price)
    return out


def run_sweep_with_html(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    *extra: str,
) -> tuple[dict[str, Any], Path]:
    """``sweep SWEEP_ARGS --out FOLDER --json --html PAGE`` on a folder holding every cell;
    starting Ray fails the test. Returns the printed JSON and the page's path."""

    def no_ray(engine: object) -> None:
        raise AssertionError(f"the sweep started Ray ({engine}) with every cell computed")

    monkeypatch.setattr("blueprinting.sweep.runner.ray_session", no_ray)
    out = computed_sweep_folder(tmp_path / "sweep")
    page = tmp_path / "sweep.html"
    document = run_with_html(capsys, "sweep", (*SWEEP_ARGS, *extra, "--out", str(out)), page)
    return document, page
