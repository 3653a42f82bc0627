"""One cell: the row of each outcome, and the record the output files hold read back exactly."""

from __future__ import annotations

import math

import pytest

from blueprinting.report.memory_table import GIB
from blueprinting.sweep.cell import (
    BestStrategy,
    CellStatus,
    NoFittingStrategy,
    NoLawfulStrategy,
    SearchRefused,
    SweepRow,
    evaluate_cell,
    row_from_record,
)
from blueprinting.sweep.definition import Cell, CellSearchOptions

OPTIONS = CellSearchOptions(train_tokens=10**9, max_micro_batch=2)


def _cell(model: str, system: str, gpus: int, batch: int, seq: int) -> Cell:
    return Cell(model=model, system=system, gpus=gpus, global_batch=batch, seq_length=seq)


def test_no_lawful_strategy_says_which_laws() -> None:
    # 7 GPUs: t = 1 (gcd(7, 8)); p = 7 does not divide 24 layers, d = 7 does not divide B = 16.
    row = evaluate_cell(_cell("gpt-1.7b", "dgx-h100", 7, 16, 2048), OPTIONS)
    assert row.status is CellStatus.NO_LAWFUL_STRATEGY
    assert (row.candidates_enumerated, row.candidates_valid, row.candidates_fit) == (2868, 0, 0)
    assert row.reason == (
        "no strategy satisfies the laws: all 2,868 enumerated candidates are rejected, most "
        "often by microbatch_count (2,520), local_batch (2,520), schedule_matches_pipeline "
        "(2,352) and 6 more law(s)"
    )


def test_no_fitting_strategy_gives_the_smallest_peak() -> None:
    row = evaluate_cell(_cell("llama3-405b", "dgx-a100-40gb", 8, 8, 8192), OPTIONS)
    assert row.status is CellStatus.NO_FITTING_STRATEGY
    assert isinstance(row.outcome, NoFittingStrategy)
    assert row.candidates_valid > 0
    assert row.candidates_fit == 0
    # the A100 40GB's NVML total, 40,960 MiB, less the driver's 620 MiB reserve
    # (presets.NVML_TOTAL_MIB, DRIVER_RESERVED_MIB), no headroom asked
    assert row.outcome.memory_limit_bytes == (40_960 - 620) * 2**20
    assert row.outcome.smallest_peak_bytes > 800 * GIB
    assert row.reason is not None
    assert row.reason.startswith("no lawful strategy fits in memory: the smallest reserved peak")


def test_best_strategy_gpu_hours_and_cost() -> None:
    row = evaluate_cell(_cell("gpt-1.7b", "dgx-h100", 8, 16, 2048), OPTIONS)
    best = row.outcome
    assert isinstance(best, BestStrategy)
    # 10^9 tokens / (16 x 2048 tokens per iteration) = 30,517.6 -> 30,518 whole iterations.
    assert best.time_to_train_s == pytest.approx(30_518 * best.iteration_time_s, rel=1e-15)
    assert best.gpu_hours == pytest.approx(best.time_to_train_s * 8 / 3600, rel=1e-15)
    record = row.record(2.5)
    assert record["cost_usd"] == pytest.approx(2.5 * best.gpu_hours, rel=1e-15)
    assert record["tokens_per_second"] == pytest.approx(16 * 2048 / best.iteration_time_s)
    assert row.record(None)["cost_usd"] is None


@pytest.mark.parametrize(
    "outcome",
    [
        BestStrategy(
            strategy_text="tp=1 pp=1 dp=8",
            megatron_args=("--tensor-model-parallel-size", "1"),
            iteration_time_s=0.1 + 0.2,
            tokens_per_second=math.pi * 1e5,
            mfu=0.61,
            memory_reserved_peak_bytes=2**35 + 1,
            memory_limit_bytes=2**36,
            time_to_train_s=1e6 / 3,
            gpu_hours=1e3 / 7,
        ),
        NoLawfulStrategy(reason="no strategy satisfies the laws"),
        NoFittingStrategy(smallest_peak_bytes=2**40, memory_limit_bytes=2**36),
        SearchRefused(reason="search space too large"),
    ],
)
def test_record_reads_back_to_the_row(
    outcome: BestStrategy | NoLawfulStrategy | NoFittingStrategy | SearchRefused,
) -> None:
    row = SweepRow(
        cell=_cell("gpt-1.7b", "dgx-h100", 8, 16, 2048),
        train_tokens=10**9,
        candidates_enumerated=3,
        candidates_valid=2,
        candidates_fit=1,
        outcome=outcome,
    )
    assert row_from_record(row.record(1.5)) == row
