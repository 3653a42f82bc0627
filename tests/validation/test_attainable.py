"""The least max |error| a gate's rows allow any predictor (``validation/attainable.py``)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from blueprinting.errors import ConfigError
from blueprinting.report.modern_validation_text import unattainable_note
from blueprinting.report.moe_validation_text import render_moe_gates
from blueprinting.validation.attainable import MeasuredInput, max_error_floor
from blueprinting.validation.modern import (
    ModernMeasured,
    ModernRun,
    gates_json,
    load_modern_runs,
)
from blueprinting.validation.modern_moe import (
    MOE_MAX_ERROR_LIMIT,
    MoeGate,
    MoeSummaryAxis,
    compare_moe_runs,
    load_moe_runs,
    moe_to_json_dict,
)

_QWEN_H100 = "mbridge_26.02{}_pretrain_qwen3_30b_a3b_h100_n16_fp8_gbs1024"


def _rows(groups: list[list[float]]) -> list[MeasuredInput]:
    return [
        MeasuredInput(run_id=f"g{g}r{r}", inputs=g, measured_s=seconds)
        for g, times in enumerate(groups)
        for r, seconds in enumerate(times)
    ]


def test_two_runs_of_one_input_set_the_floor_at_their_spread() -> None:
    floor = max_error_floor(_rows([[28.0, 52.0], [10.0], [5.0, 5.0]]))
    assert floor is not None
    assert floor.value == pytest.approx(24.0 / 80.0, rel=1e-15)
    assert floor.runs == ("g0r0", "g0r1") and floor.measured_s == (28.0, 52.0)
    assert floor.prediction_s is not None
    assert floor.prediction_s == pytest.approx(2 * 28.0 * 52.0 / 80.0, rel=1e-15)
    # the harmonic mean misses both ends by exactly the floor
    assert floor.prediction_s / 28.0 - 1 == pytest.approx(floor.value, rel=1e-12)
    assert 1 - floor.prediction_s / 52.0 == pytest.approx(floor.value, rel=1e-12)


def test_runs_with_distinct_inputs_allow_a_perfect_prediction() -> None:
    floor = max_error_floor(_rows([[3.0], [4.0], [7.0, 7.0]]))
    assert floor is not None
    assert floor.value == 0.0 and floor.runs == () and floor.prediction_s is None
    assert max_error_floor([]) is None


def test_extreme_measurements_neither_overflow_nor_vanish() -> None:
    """Ratios, not products: a floor and a prediction for any finite positive times."""
    floor = max_error_floor(_rows([[1e-303, 3e-303], [1e308, 1.7e308]]))
    assert floor is not None and floor.prediction_s is not None
    assert floor.value == pytest.approx(0.5, rel=1e-12)
    assert floor.prediction_s == pytest.approx(1.5e-303, rel=1e-12)
    json.dumps({"floor": floor.value, "prediction": floor.prediction_s}, allow_nan=False)


def test_a_measurement_that_is_not_finite_and_positive_is_refused_with_every_run_named() -> None:
    rows = [
        MeasuredInput(run_id="a", inputs=0, measured_s=0.0),
        MeasuredInput(run_id="b", inputs=0, measured_s=-1.0),
        MeasuredInput(run_id="c", inputs=0, measured_s=math.inf),
        MeasuredInput(run_id="d", inputs=0, measured_s=2.0),
    ]
    with pytest.raises(ConfigError) as raised:
        max_error_floor(rows)
    assert list(raised.value.problems) == [
        "run 'a': measured_s must be finite and > 0, got 0.0",
        "run 'b': measured_s must be finite and > 0, got -1.0",
        "run 'c': measured_s must be finite and > 0, got inf",
    ]


_TIMES = st.floats(min_value=0.01, max_value=1e4, allow_nan=False, allow_infinity=False)
_GROUPS = st.lists(st.lists(_TIMES, min_size=1, max_size=5), min_size=1, max_size=6)


@given(groups=_GROUPS, data=st.data())
def test_no_prediction_per_input_beats_the_floor(
    groups: list[list[float]], data: st.DataObject
) -> None:
    floor = max_error_floor(_rows(groups))
    assert floor is not None
    predictions = [data.draw(_TIMES) for _ in groups]
    worst = max(
        abs(predictions[g] / seconds - 1) for g, times in enumerate(groups) for seconds in times
    )
    assert worst >= floor.value * (1 - 1e-12)


@given(groups=_GROUPS)
def test_the_harmonic_means_attain_the_floor(groups: list[list[float]]) -> None:
    floor = max_error_floor(_rows(groups))
    assert floor is not None
    worst = 0.0
    for times in groups:
        lo, hi = min(times), max(times)
        prediction = 2 * lo * hi / (lo + hi)
        worst = max(worst, *(abs(prediction / seconds - 1) for seconds in times))
    assert worst == pytest.approx(floor.value, rel=1e-9, abs=1e-15)


# --------------------------------------------------------------------------------------------
# The fixtures (a stand-in predictor: the floor reads inputs and measurements only)
# --------------------------------------------------------------------------------------------
def _any_prediction(run: ModernRun) -> float:
    return 1.0


def test_the_moe_max_gate_is_out_of_reach_of_any_predictor() -> None:
    """The two Qwen3-30B-A3B H100 FP8 rows of NeMo 26.02 and 26.02.01 carry the same recipe
    (the same table layout and keys) and measure 51.27 and 28.94 s: no prediction gets both
    within 25%."""
    validation = compare_moe_runs(_any_prediction, load_moe_runs())
    gate = validation.gate(MoeGate.MAX_ERROR)
    assert gate.floor is not None and not gate.attainable
    assert set(gate.floor.runs) == {_QWEN_H100.format(""), _QWEN_H100.format(".01")}
    lo, hi = sorted(gate.floor.measured_s)
    # global batch 1024 x 4096 tokens over 16 GPUs at 9,058 and 5,113 tokens/s per GPU
    assert lo == pytest.approx(1024 * 4096 / (9058 * 16), rel=1e-12)
    assert hi == pytest.approx(1024 * 4096 / (5113 * 16), rel=1e-12)
    assert gate.floor.value == pytest.approx((hi - lo) / (hi + lo), rel=1e-12)
    assert round(gate.floor.value, 4) == 0.2784 > MOE_MAX_ERROR_LIMIT
    (document,) = (g for g in gates_json(validation.gates) if g["name"] == str(MoeGate.MAX_ERROR))
    assert document["attainable_floor"] == gate.floor.value
    assert document["floor_runs"] == list(gate.floor.runs)
    assert document["floor_prediction_s"] == gate.floor.prediction_s
    json.dumps(document)
    note = unattainable_note(gate)
    assert note is not None and "floor 27.8% > 25%" in note and _QWEN_H100.format("") in note
    console = Console(width=400, record=True)
    console.print(render_moe_gates(validation))
    assert "unattainable on these rows, floor 27.8% > 25%" in console.export_text()


def test_the_dense_max_gate_is_within_reach() -> None:
    """The dense rows' widest same-input spread is the Llama 3 70B GB200 NVFP4 recipe of NeMo
    26.02, 26.02.01 and 26.04 (7.35, 7.19 and 6.69 s): a floor of 4.7%, under the 20% limit."""
    from blueprinting.validation.modern import ModernGate, compare_modern_runs

    validation = compare_modern_runs(_any_prediction, load_modern_runs())
    gate = validation.gate(ModernGate.MAX_ERROR)
    assert gate.floor is not None and gate.attainable
    # the fixture's 4,458 (26.02) and 4,898 (26.04) tokens/s per GPU on the same batch: the
    # times' spread is the throughputs' spread
    assert gate.floor.value == pytest.approx((4898 - 4458) / (4898 + 4458), rel=1e-12)
    assert len(gate.floor.runs) == 3 and all("LLAMA3_70B_64gpu_NVFP4" in r for r in gate.floor.runs)
    assert unattainable_note(gate) is None


def test_runs_that_plan_alike_share_a_group_whatever_their_keys_spell() -> None:
    """``ModernRun.inputs`` keys on the built spec: a stated default (Megatron's etp = t) and an
    alias spelling fall in one group with the run that leaves them out."""
    (base,) = [r for r in load_moe_runs() if r.id == _QWEN_H100.format("")]
    keys = dict(base.strategy_keys)
    keys.pop("expert_tensor_parallel_size", None)
    plain = replace(base, id="plain", strategy_keys=keys)
    stated = replace(
        base,
        id="stated",
        strategy_keys={**keys, "expert_tensor_parallel_size": 1},
        measured=ModernMeasured(tokens_per_s_per_gpu=4000.0),
    )
    assert plain.inputs == stated.inputs
    validation = compare_moe_runs(_any_prediction, [plain, stated])
    gate = validation.gate(MoeGate.MAX_ERROR)
    assert gate.floor is not None and gate.floor.runs == ("plain", "stated")
    assert gate.floor.value == pytest.approx((5113 - 4000) / (5113 + 4000), rel=1e-12)


def test_a_row_whose_graph_keys_do_not_read_is_left_not_planned_not_fatal() -> None:
    """A user fixture with a misspelt ``cuda_graph_impl``: that row is not planned, with the
    adapter's did-you-mean, and the split groups it as ``unread``; the rest is scored."""
    runs = load_moe_runs()
    bad = replace(runs[0], strategy_keys={**runs[0].strategy_keys, "cuda_graph_impl": "loacl"})

    def plans(run: ModernRun) -> float:
        run.training_spec()
        return run.measured_iteration_time_s()

    validation = compare_moe_runs(plans, [bad, *runs[1:]])
    (row,) = [r for r in validation.rows if r.run_id == bad.id]
    assert row.cuda_graphs is None and not row.planned
    assert "did you mean 'local'?" in row.row.not_planned
    groups = {s.group: s for s in validation.summaries if s.axis is MoeSummaryAxis.CUDA_GRAPHS}
    assert (groups["unread"].rows, groups["unread"].planned) == (1, 0)
    assert list(groups)[-1] == "unread"
    document = json.loads(json.dumps(moe_to_json_dict(validation), allow_nan=False))
    (entry,) = [r for r in document["rows"] if r["run"] == bad.id]
    assert entry["cuda_graphs"] is None


def test_a_gate_with_no_planned_row_has_no_floor() -> None:
    def refuses(run: ModernRun) -> float:
        raise ConfigError([f"{run.id}: refused"])

    validation = compare_moe_runs(refuses, load_moe_runs())
    gate = validation.gate(MoeGate.MAX_ERROR)
    assert gate.count == 0 and gate.floor is None and gate.attainable
