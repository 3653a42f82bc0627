"""Sweeps on a real local Ray instance (no mocks), one instance shared by the module.

A small sweep's rows equal the single searches' (``blueprinting search --json``); a driver
SIGKILLed mid-run and resumed gives the rows of an uninterrupted run, computing only the cells
the kill left; a cell whose worker process dies is retried.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blueprinting.cli.main import main
from blueprinting.sweep.cell import BestStrategy, CellStatus, SweepRow, evaluate_cell
from blueprinting.sweep.definition import (
    Cell,
    CellSearchOptions,
    SweepDefinition,
    definition_from_mapping,
)
from blueprinting.sweep.engine import LocalRay, RayCluster
from blueprinting.sweep.runner import SweepOutcome, run_sweep
from blueprinting.sweep.store import CSV_NAME, PARQUET_NAME

#: Six cells: two models x 7, 8, 16 GPUs; 7 GPUs has no lawful strategy for either.
GRID: dict[str, object] = {
    "model": ["gpt-1.7b", "llama2-7b"],
    "system": ["dgx-h100"],
    "gpus": [7, 8, 16],
    "global_batch": [16],
    "max_micro_batch": 2,
    "train_tokens": 10**9,
    "price": {"dgx-h100": 2.5},
}

#: How long a test waits for a subprocess's rows before failing.
WAIT_S = 120.0


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=96 * 1024 * 1024,
        log_to_driver=False,
    )
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def definition() -> SweepDefinition:
    return definition_from_mapping(GRID, source="test")


@pytest.fixture(scope="module")
def uninterrupted(
    ray_address: str, definition: SweepDefinition, tmp_path_factory: pytest.TempPathFactory
) -> SweepOutcome:
    return run_sweep(definition, tmp_path_factory.mktemp("whole"), LocalRay(workers=2))


def test_rows_equal_the_single_searches(
    uninterrupted: SweepOutcome, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.parquet as pq

    outcome = uninterrupted
    assert outcome.engine is not None
    assert outcome.engine.mode == "existing"
    assert outcome.computed_cells == 6
    assert [r.cell.gpus for r in outcome.rows] == [7, 8, 16, 7, 8, 16]
    assert [r.status for r in outcome.rows] == [
        CellStatus.NO_LAWFUL_STRATEGY,
        CellStatus.OK,
        CellStatus.OK,
    ] * 2
    for row in outcome.rows:
        c = row.cell
        argv = [
            "search",
            "--model",
            c.model,
            "--system",
            c.system,
            "--gpus",
            str(c.gpus),
            "--global-batch",
            str(c.global_batch),
            "--max-micro-batch",
            "2",
            "--train-tokens",
            str(10**9),
            "--top",
            "1",
            "--json",
        ]
        code = main(argv)
        captured = capsys.readouterr()
        if row.status is CellStatus.NO_LAWFUL_STRATEGY:
            assert code == 2
            assert "no candidate of the space satisfies the laws" in captured.err
            continue
        assert code == 0
        search = json.loads(captured.out)
        (first,) = search["ranked"]
        best = row.outcome
        assert isinstance(best, BestStrategy)
        assert best.strategy_text == first["strategy_text"]
        assert list(best.megatron_args) == first["megatron_args"]
        assert best.iteration_time_s == first["iteration_time_s"]
        assert best.tokens_per_second == first["tokens_per_second"]
        assert best.mfu == first["mfu"]
        assert best.memory_reserved_peak_bytes == first["memory_bytes"]["reserved_peak"]
        assert best.time_to_train_s == first["time_to_train"]["seconds"]
        assert best.gpu_hours == first["time_to_train"]["seconds"] * c.gpus / 3600
        counts = (row.candidates_enumerated, row.candidates_valid, row.candidates_fit)
        assert counts == (
            search["candidates_enumerated"],
            search["candidates_valid"],
            search["candidates_fit"],
        )
    # The files hold the same rows, in grid order, and the parts are gone.
    records = [r.record(2.5) for r in outcome.rows]
    assert pq.read_table(outcome.out / PARQUET_NAME).to_pylist() == records
    with (outcome.out / CSV_NAME).open(encoding="utf-8") as stream:
        lines = list(csv.DictReader(stream))
    assert [(x["model"], int(x["gpus"]), x["status"]) for x in lines] == [
        (r.cell.model, r.cell.gpus, str(r.status)) for r in outcome.rows
    ]
    assert lines[1]["cost_usd"] == repr(records[1]["cost_usd"])
    assert list((outcome.out / "parts").iterdir()) == []


#: The driver the kill test SIGKILLs: a sweep whose cells after the first ``fast`` block until a
#: release file appears (bounded), so the kill lands at a known point.
DRIVER = """
import json, sys, time
from pathlib import Path
from blueprinting.sweep.cell import evaluate_cell
from blueprinting.sweep.definition import definition_from_mapping
from blueprinting.sweep.engine import RayCluster
from blueprinting.sweep.runner import run_sweep

address, out, grid, fast, release = sys.argv[1:]
definition = definition_from_mapping(json.loads(grid), source="driver")
slow = {c.key for c in definition.cells()[int(fast):]}

def evaluate(cell, options):
    deadline = time.monotonic() + 120
    while cell.key in slow and not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return evaluate_cell(cell, options)

run_sweep(definition, Path(out), RayCluster(address=address, workers=1), evaluate=evaluate)
"""


def _rows_in_parts(out: Path) -> int:
    import pyarrow.parquet as pq

    parts = out / "parts"
    if not parts.exists():
        return 0
    return sum(pq.read_metadata(p).num_rows for p in parts.glob("part-*.parquet"))


def test_killed_driver_resumes_with_the_uninterrupted_rows(
    ray_address: str, definition: SweepDefinition, uninterrupted: SweepOutcome, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    out, release, fast = tmp_path / "out", tmp_path / "release", 3
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            DRIVER,
            ray_address,
            str(out),
            json.dumps(GRID),
            str(fast),
            str(release),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while _rows_in_parts(out) < fast:
            assert driver.poll() is None, "the driver ended before it was killed"
            assert time.monotonic() < deadline, "the driver wrote no rows in time"
            time.sleep(0.05)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        release.touch()  # frees a blocked task should Ray not have ended it with its driver
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
    assert driver.returncode == -signal.SIGKILL
    assert _rows_in_parts(out) == fast
    assert not (out / PARQUET_NAME).exists()

    resumed = run_sweep(definition, out, LocalRay(workers=2))
    assert resumed.computed_cells == 6 - fast
    assert resumed.rows == uninterrupted.rows
    keys = [(r["model"], r["gpus"]) for r in pq.read_table(out / PARQUET_NAME).to_pylist()]
    assert keys == [(r.cell.model, r.cell.gpus) for r in uninterrupted.rows]  # each cell once

    again = run_sweep(definition, out, RayCluster(address=ray_address))
    assert again.computed_cells == 0
    assert again.engine is None
    assert again.rows == uninterrupted.rows


def test_a_worker_that_dies_is_retried(
    ray_address: str, uninterrupted: SweepOutcome, tmp_path: Path
) -> None:
    marker = tmp_path / "died-once"
    definition = definition_from_mapping({**GRID, "model": ["gpt-1.7b"], "gpus": [8]}, source="t")

    def dies_once(cell: Cell, options: CellSearchOptions) -> SweepRow:
        if not marker.exists():
            marker.touch()
            os._exit(1)  # the worker process dies: no exception, no row
        return evaluate_cell(cell, options)

    outcome = run_sweep(definition, tmp_path / "out", LocalRay(), evaluate=dies_once)
    assert marker.exists()
    assert outcome.computed_cells == 1
    assert outcome.rows == (uninterrupted.rows[1],)
