"""The HTML reports without a browser: deterministic bytes, the embedded JSON equals the
command's, nothing outside the inlined bundle points at the network, the timeline cap, and
``memory_bytes_per_stage`` (the memory figure's JSON)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from blueprinting.analysis.simulation_report import simulation_report
from blueprinting.api import plan
from blueprinting.cli.main import main
from blueprinting.report.html.plan import render_plan_html
from blueprinting.report.html.simulate import render_simulation_html, selection_note
from blueprinting.report.html.timeline import select_commands
from tests.report.html_cases import (
    PLAN_ARGS,
    SEARCH_ARGS,
    embedded_json,
    run_with_html,
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
    assert f"--html {target}: cannot write the file: No such file or directory" in err
    assert "Traceback" not in err


def test_search_html_does_not_go_with_explain(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*("search", *SEARCH_ARGS), "--explain", "tp=1 pp=1", "--html", "x.html"])
    assert code == 2
    assert "--html writes the ranked list; it does not go with --explain" in capsys.readouterr().err
