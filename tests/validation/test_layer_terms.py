"""Korthikanti 2022 Table 4 split into the planner's terms, and the candidate costs of the 2022
Megatron-LM that the A100 fraction absorbs (validation/layer_terms.py, docs/VALIDATION.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from blueprinting.api import plan_spec
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.model import Datatype
from blueprinting.validation.layer_terms import (
    a100_microbenchmark_system,
    candidate_costs,
    layer_terms,
    markdown_tables,
    table4_runs,
)
from blueprinting.validation.predictor import prediction_from_report
from blueprinting.validation.published import PublishedRun

A100 = system_preset("dgx-a100-80gb")
FITTED = a100_microbenchmark_system(A100)
# 22B layer (h = 6144, s = 2048, b = 4) on t = 8 in fp16: the numbers the costs are built from.
H, TOKENS, T, E = 6144, 4 * 2048, 8, 2
HBM_RATE = 2039e9 * 0.83  # datasheet x BabelStream Triad (presets.py)


@pytest.fixture(scope="module")
def runs() -> tuple[PublishedRun, ...]:
    return table4_runs()


def _run(runs: tuple[PublishedRun, ...], suffix: str) -> PublishedRun:
    (run,) = [r for r in runs if r.id == f"korthikanti2022_t4_22B_layer_{suffix}"]
    return run


@pytest.mark.parametrize("system", [A100, FITTED], ids=["preset", "fits"])
def test_the_terms_add_up_to_the_planners_layer_times(
    runs: tuple[PublishedRun, ...], system: SystemSpec
) -> None:
    """Conservation: terms less the hidden TP time are the figures ``blueprinting validate``
    compares (the ``plan --json`` block times, read by the validation predictor)."""
    assert len(runs) == 5
    for run in runs:
        spec = run.training_spec()
        forward, backward = layer_terms(spec, system)
        predicted = prediction_from_report(plan_spec(spec, system).to_json_dict())
        assert forward.total_s == pytest.approx(predicted.layer_forward_s, rel=1e-12), run.id
        assert backward.total_s == pytest.approx(predicted.layer_backward_s, rel=1e-12)
        assert forward.tp_comm_hidden_s == 0.0
        assert 0.0 < backward.tp_comm_hidden_s <= backward.tp_comm_s


def test_the_microbenchmark_fits_leave_the_backward_a_millisecond_short(
    runs: tuple[PublishedRun, ...],
) -> None:
    """On the cuBLASLt and NVLink fits the forward times are within 1.4% and every backward
    time is 1.0-1.2 ms (5.5-9.0%) short: what the 0.72 absorbs is backward time."""
    gaps = {}
    for run in runs:
        forward, backward = layer_terms(run.training_spec(), FITTED)
        assert run.measured.layer_forward_ms is not None
        assert run.measured.layer_backward_ms is not None
        assert abs(forward.total_s * 1e3 / run.measured.layer_forward_ms - 1) < 0.014
        gaps[run.id.removeprefix("korthikanti2022_t4_22B_layer_")] = (
            run.measured.layer_backward_ms - backward.total_s * 1e3
        )
    expected = {
        "none_nosp": 1.068,
        "none_sp": 1.011,
        "full_nosp": 1.073,
        "selective_nosp": 1.172,
        "selective_sp": 1.116,
    }
    assert gaps == pytest.approx(expected, abs=0.001)


def test_candidate_costs_from_their_sources(runs: tuple[PublishedRun, ...]) -> None:
    """Each candidate cost by hand: the 16-bit main_grad add (6 B per weight, 12 h^2 / t
    weights), the QKV and fc1 bias reductions (read b*s x 3h/t and b*s x 4h/t), and 24 of 108
    SMs for the hidden backward TP time (two 96 MiB all-reduces on the NVLink fit)."""
    spec = _run(runs, "none_nosp").training_spec()
    costs = candidate_costs(spec, FITTED)
    assert costs.gradient_accumulation_s == pytest.approx(6 * 12 * H * H / T / HBM_RATE, rel=1e-12)
    assert costs.bias_gradient_s == pytest.approx(
        TOKENS * (3 * H + 4 * H) // T * E / HBM_RATE, rel=1e-12
    )
    all_reduce = 47e-6 + 2 * 7 / 8 * TOKENS * H * E / (300e9 * 0.69)
    assert costs.nccl_sm_share_s == pytest.approx(24 / 108 * 2 * all_reduce, rel=1e-12)
    assert costs.total_s == pytest.approx(0.652e-3, abs=1e-6)
    # bf16 needs --accumulate-allreduce-grads-in-fp32, which keeps the fused weight-gradient
    # GEMM accumulating into main_grad: no separate add.
    bf16 = replace(spec, model=replace(spec.model, datatype=Datatype.BF16))
    assert candidate_costs(bf16, FITTED).gradient_accumulation_s == 0.0
    assert candidate_costs(bf16, FITTED).bias_gradient_s == costs.bias_gradient_s


def test_with_the_candidates_the_fits_meet_table_4s_gate(runs: tuple[PublishedRun, ...]) -> None:
    """Fits alone: max 9.0% (backward); fits + candidates: max 3.9%, every figure within the
    issue's 10% (reported in docs/VALIDATION.md; neither is adopted: Narayanan T1 worsens)."""
    alone, with_costs = [], []
    for run in runs:
        spec = run.training_spec()
        forward, backward = layer_terms(spec, FITTED)
        extra = candidate_costs(spec, FITTED).total_s
        assert run.measured.layer_forward_ms is not None
        assert run.measured.layer_backward_ms is not None
        for predicted, added, ms in (
            (forward.total_s, 0.0, run.measured.layer_forward_ms),
            (backward.total_s, extra, run.measured.layer_backward_ms),
        ):
            alone.append(abs(predicted * 1e3 / ms - 1))
            with_costs.append(abs((predicted + added) * 1e3 / ms - 1))
    assert max(alone) == pytest.approx(0.0897, abs=5e-4)
    assert max(with_costs) == pytest.approx(0.0394, abs=5e-4)
    assert sum(with_costs) / len(with_costs) == pytest.approx(0.0223, abs=5e-4)


def test_markdown_tables_list_every_figure(runs: tuple[PublishedRun, ...]) -> None:
    text = markdown_tables(runs)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    # two headers, 5 runs x 2 figures x 2 systems, 5 runs x 2 systems of candidate costs
    assert len(rows) == 2 + 20 + 10
    assert "| none_nosp bwd | fits | 7.78 | 0.96 | 0.87 | 1.22 | 1.80 (1.80) | 10.83 | 11.9" in text
