"""The HTML reports without a browser: deterministic bytes, the embedded JSON equals the
command's, nothing outside the inlined bundle points at the network, the timeline cap,
``memory_bytes_per_stage`` (the memory figure's JSON), and the sweep page from rows computed
without Ray."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from blueprinting.analysis.report import JsonValue
from blueprinting.analysis.simulation_report import simulation_report
from blueprinting.api import plan
from blueprinting.cli.main import main
from blueprinting.report.html.plan import render_plan_html
from blueprinting.report.html.simulate import render_simulation_html, selection_note
from blueprinting.report.html.sweep import render_sweep_html
from blueprinting.report.html.timeline import select_commands
from blueprinting.sweep.definition import PlotMetric, definition_from_mapping
from tests.report.html_cases import (
    PLAN_ARGS,
    SEARCH_ARGS,
    SWEEP_GRID,
    embedded_json,
    run_sweep_with_html,
    run_with_html,
    sweep_rows,
    without_plotly,
)

SETTINGS = {
    "tensor_model_parallel_size": 2,
    "pipeline_model_parallel_size": 4,
    "num_virtual_stages_per_pipeline_rank": 2,
    "global_batch_size": 16,
    "micro_batch_size": 1,
}


@pytest.fixture(scope="module")
def small_simulation():  # type: ignore[no-untyped-def]
    return simulation_report(plan(model="gpt-1.7b", gpus=16, settings=SETTINGS))


@pytest.mark.parametrize(
    ("command", "args"),
    [("plan", PLAN_ARGS), ("simulate", PLAN_ARGS), ("search", SEARCH_ARGS)],
)
def test_page_is_deterministic_and_carries_the_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, args: tuple[str, ...]
) -> None:
    first = run_with_html(capsys, command, args, tmp_path / "a.html")
    second = run_with_html(capsys, command, args, tmp_path / "b.html")
    page = (tmp_path / "a.html").read_text(encoding="utf-8")
    if command != "search":  # the search's own wall time differs between runs
        assert page == (tmp_path / "b.html").read_text(encoding="utf-8")
        assert first == second
    assert embedded_json(page) == first
    rest = without_plotly(page)
    assert re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", rest) is None
    assert "<link" not in rest
    assert re.search(r"<script[^>]*\ssrc=", page) is None
    assert f'data-report-kind="{command}"' in page


def test_same_report_renders_the_same_bytes(small_simulation) -> None:  # type: ignore[no-untyped-def]
    assert render_plan_html(small_simulation.plan) == render_plan_html(small_simulation.plan)
    assert render_simulation_html(small_simulation) == render_simulation_html(small_simulation)


def test_timeline_cap_keeps_warm_up_and_cool_down(small_simulation) -> None:  # type: ignore[no-untyped-def]
    result = small_simulation.result
    assert result is not None
    positive = np.flatnonzero(result.end_s > result.start_s)
    everything, complete = select_commands(result, limit=len(positive))
    assert complete.complete and complete.gap_start_s is None
    assert everything.tolist() == positive.tolist()
    chosen, selection = select_commands(result, limit=40)
    assert selection.drawn == len(chosen) == 40
    assert selection.commands == len(result.dag) == 248
    assert not selection.complete
    first = int(positive[np.argmin(result.start_s[positive])])
    last = int(positive[np.argmax(result.start_s[positive])])
    assert first in chosen and last in chosen
    assert selection.gap_start_s is not None and selection.gap_end_s is not None
    left_out = np.setdiff1d(positive, chosen)
    starts = result.start_s[left_out]
    assert (starts >= selection.gap_start_s).all() and (starts <= selection.gap_end_s).all()
    note = selection_note(selection)
    assert note.startswith("40 of 248 commands are drawn")
    page = render_simulation_html(small_simulation, max_timeline_commands=40)
    assert "40 of 248 commands are drawn" in page
    assert "All 248 commands" not in page
    full = render_simulation_html(small_simulation)
    assert "All 248 commands of the simulation are drawn" in full


def test_memory_bytes_per_stage_adds_up(small_simulation) -> None:  # type: ignore[no-untyped-def]
    document = small_simulation.plan.to_json_dict()
    stages = document["memory_bytes_per_stage"]
    assert isinstance(stages, list) and len(stages) == 4
    totals = document["memory_total_bytes_per_stage"]
    peaks = document["memory_reserved_peak_bytes_per_stage"]
    for index, stage in enumerate(stages):
        assert isinstance(stage, dict)
        assert stage["stage"] == index
        stored = sum(
            int(str(stage[k]))
            for k in ("weights", "gradients", "optimizer_states", "activations", "other")
        )
        overheads = sum(
            int(str(stage[k]))
            for k in ("transient", "workspace", "allocator_reserve", "cuda_context", "nccl_buffers")
        )
        assert isinstance(totals, list) and isinstance(peaks, list)
        assert stored == stage["total"] == totals[index]
        assert stored + overheads == stage["reserved_peak"] == peaks[index]
    memory = document["memory_bytes"]
    assert isinstance(memory, dict)
    loaded = stages[int(str(memory["stage"]))]
    assert isinstance(loaded, dict)
    assert all(loaded[k] == memory[k] for k in loaded if k != "stage")


def test_unwritable_html_path_is_a_config_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "missing" / "plan.html"
    assert main(["plan", *PLAN_ARGS, "--no-simulate", "--html", str(target)]) == 2
    err = capsys.readouterr().err
    # refused before any work (cli/output_paths.py), naming the missing folder
    assert f"--html {target}: cannot write the file: folder '{target.parent}' does not exist" in err
    assert "Traceback" not in err


def test_search_html_does_not_go_with_explain(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*("search", *SEARCH_ARGS), "--explain", "tp=1 pp=1", "--html", "x.html"])
    assert code == 2
    assert "--html writes the ranked list; it does not go with --explain" in capsys.readouterr().err


def _no_network_references(page: str) -> None:
    rest = without_plotly(page)
    assert re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", rest) is None
    assert "<link" not in rest
    assert re.search(r"<script[^>]*\ssrc=", page) is None


def _figure_spec(page: str, fig_id: str) -> dict[str, Any]:
    found = re.search(rf'<script type="application/json" id="{fig_id}-spec">(.*?)</script>', page)
    assert found is not None
    spec = json.loads(found.group(1))
    assert isinstance(spec, dict)
    return spec


def test_sweep_page_from_a_computed_folder(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    document, path = run_sweep_with_html(capsys, monkeypatch, tmp_path)
    page = path.read_text(encoding="utf-8")
    assert embedded_json(page) == document
    definition = definition_from_mapping(SWEEP_GRID, source="test")
    assert document["engine"] is None
    assert (document["cells"], document["computed_cells"]) == (12, 0)
    # The page's rows are --json's, which are the evaluated cells' records.
    assert document["rows"] == [r.record(definition.price(r.cell.system)) for r in sweep_rows()]
    # Deterministic: the same object renders the same bytes, those the command wrote.
    assert render_sweep_html(document) == render_sweep_html(document) == page
    _no_network_references(page)
    assert 'data-report-kind="sweep"' in page
    assert "every cell was already in the output folder (Ray was not started)" in page
    rows = document["rows"]
    statuses = [r["status"] for r in rows]
    assert statuses.count("ok") == 4
    assert statuses.count("no-lawful-strategy") == 2
    assert statuses.count("no-fitting-strategy") == 6
    for index, row in enumerate(rows):
        at = f"rows[{index}]"
        if row["status"] == "ok":
            time_s = row["iteration_time_s"]
            shown = f'data-key="{at}.iteration_time_s" data-value="{time_s!r}">{time_s:.6g} s<'
            assert shown in page
            assert (f'data-key="{at}.cost_usd"' in page) is (row["system"] == "dgx-h100")
            assert shlex.join(row["megatron_args"]) in page
        else:
            assert f'data-key="{at}.iteration_time_s"' not in page
            assert f'<td class="reason" data-value="{row["reason"]}">{row["reason"]}</td>' in page
    # The panels' points: per (model, system) the tokens/s of its ok rows, by GPU count.
    curves = _figure_spec(page, "fig-curves")["data"]
    assert [(t["name"], t["x"], t["y"]) for t in curves[:2]] == [
        (
            system,
            [r["gpus"] for r in rows if (r["model"], r["system"], r["status"]) == key],
            [r["tokens_per_second"] for r in rows if (r["model"], r["system"], r["status"]) == key],
        )
        for system in ("dgx-h100", "dgx-a100-40gb")
        for key in [("gpt-1.7b", system, "ok")]
    ]
    assert all(t["x"] == [] for t in curves[2:])  # llama3-405b fits nowhere
    heat, grey = _figure_spec(page, "fig-mfu")["data"]
    mfu = {(r["model"], r["system"], r["gpus"]): r["mfu"] for r in rows}
    assert heat["z"] == [[mfu[m, s, n] for n in (7, 8, 16)] for m, s in _grid_lines()]
    assert grey["z"] == [
        [0 if mfu[m, s, n] is None else None for n in (7, 8, 16)] for m, s in _grid_lines()
    ]
    assert grey["text"][2][1] == f"B=16 s=8192: {rows[7]['reason']}"


def _grid_lines() -> list[tuple[str, str]]:
    return [(m, s) for m in ("gpt-1.7b", "llama3-405b") for s in ("dgx-h100", "dgx-a100-40gb")]


def test_sweep_page_cost_panels_take_the_cost_column() -> None:
    definition = definition_from_mapping(SWEEP_GRID, source="test")
    rows: list[JsonValue] = [r.record(definition.price(r.cell.system)) for r in sweep_rows()]
    document: dict[str, JsonValue] = {
        "engine": None,
        "cells": 12,
        "computed_cells": 0,
        "seconds": 0.5,
        "out": "out",
        "rows": rows,
    }
    page = render_sweep_html(document, PlotMetric.COST)
    h100, a100 = _figure_spec(page, "fig-curves")["data"][:2]
    costs = [r["cost_usd"] for r in rows if isinstance(r, dict) and r["status"] == "ok"]
    assert h100["y"] == costs[:2] and a100["y"] == []  # no price for dgx-a100-40gb
    assert "cost to train 1,000,000,000 tokens, USD" in page
