"""The published-runs fixture, its loader and the comparison engine (issue #5).

Figures come from ``shared/reference/published_runs.json`` (Narayanan et al. 2021 Table 1,
Korthikanti et al. 2022 Tables 4-5, text, and Figures 1/7 as read by Calculon); the fixture must
carry each one unchanged.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from blueprinting.errors import ConfigError, UnsupportedError
from blueprinting.mapping.model import Datatype
from blueprinting.report.validation_text import render_alternatives, render_gates, render_rows
from blueprinting.validation.comparison import (
    ACTIVATION_MEMORY_MAX_LIMIT,
    LAYER_TIME_MAX_LIMIT,
    THROUGHPUT_MAE_LIMIT,
    THROUGHPUT_MAX_LIMIT,
    Metric,
    MetricFamily,
    Prediction,
    ValidationTable,
    compare_published,
    to_json_dict,
)
from blueprinting.validation.published import (
    MEASURED_KEYS,
    FlopsConvention,
    PublishedRun,
    SourceTable,
    load_published_runs,
    padded_vocab_size,
)

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "published_runs.toml"

# GPT-3 175B by Narayanan 2021 Eq. 2 with biases: 96 blocks of (12h^2 + 13h), h = 12288, plus
# word (51200 h) and position (2048 h) embeddings and the final LayerNorm (2h).
NUM_PARAMS_175B = 96 * (12 * 12288**2 + 13 * 12288) + 51200 * 12288 + 2048 * 12288 + 2 * 12288


def _shared_reference() -> Path | None:
    env = os.environ.get("BLUEPRINTING_SHARED")
    if env:
        candidate = Path(env) / "reference"
        return candidate if candidate.is_dir() else None
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "reference"
        if candidate.is_dir():
            return candidate
    return None


def _source_rows() -> list[Mapping[str, object]]:
    reference = _shared_reference()
    if reference is None or not (reference / "published_runs.json").is_file():
        pytest.skip("shared/reference/published_runs.json not found (set BLUEPRINTING_SHARED)")
    rows: list[Mapping[str, object]] = json.loads(
        (reference / "published_runs.json").read_text(encoding="utf-8")
    )
    return rows


@pytest.fixture(scope="module")
def runs() -> tuple[PublishedRun, ...]:
    return load_published_runs(FIXTURE)


def _get(mapping: object, key: str) -> object:
    assert isinstance(mapping, dict)
    return mapping[key]


# --------------------------------------------------------------------------------------------
# Fixture against the shared source
# --------------------------------------------------------------------------------------------
def test_fixture_has_every_source_row_in_order(runs: tuple[PublishedRun, ...]) -> None:
    source = _source_rows()
    assert [run.id for run in runs] == [row["id"] for row in source]
    assert len(runs) == 55


def test_every_carried_figure_equals_the_source(runs: tuple[PublishedRun, ...]) -> None:
    for run, row in zip(runs, _source_rows(), strict=True):
        assert run.source_table == row["source_key"], run.id
        model = row["model"]
        assert run.model.name == _get(model, "name")
        assert run.model.num_layers == _get(model, "L"), run.id
        assert run.model.hidden_size == _get(model, "h"), run.id
        assert run.model.num_attention_heads == _get(model, "a"), run.id
        assert run.model.ffn_hidden_size == _get(model, "ffn"), run.id
        assert run.model.seq_length == _get(model, "s"), run.id
        assert run.model.vocab_size == _get(model, "V"), run.id
        assert run.params_b == _get(model, "params_b"), run.id
        hardware = row["hardware"]
        assert run.num_gpus == _get(hardware, "n_gpus"), run.id
        assert run.peak_tflops_16bit == _get(hardware, "peak_tflops_16bit"), run.id
        assert run.gpu == _get(hardware, "gpu"), run.id
        measured = row["measured"]
        assert isinstance(measured, dict)
        carried = {key: getattr(run.measured, key) for key in MEASURED_KEYS}
        assert {k: v for k, v in carried.items() if v is not None} == {
            k: v for k, v in measured.items() if v is not None
        }, run.id
        assert run.notes == tuple(row["notes"]), run.id  # type: ignore[arg-type]
        derived = row["derived"]
        assert isinstance(derived, dict)
        assert run.implied_iteration_time_s == derived.get("implied_iteration_time_s"), run.id
        source = row["source"]
        assert isinstance(source, dict)
        assert str(source["table"]) in run.provenance, run.id
        assert run.id in run.provenance


def test_every_carried_strategy_key_equals_the_source(runs: tuple[PublishedRun, ...]) -> None:
    for run, row in zip(runs, _source_rows(), strict=True):
        strategy = row["strategy"]
        assert isinstance(strategy, dict)
        keys = run.strategy_keys
        assert keys["tensor_model_parallel_size"] == strategy["t"], run.id
        assert keys["pipeline_model_parallel_size"] == strategy["p"], run.id
        assert keys["data_parallel_size"] == strategy["d"], run.id
        assert keys["micro_batch_size"] == strategy["micro_batch"], run.id
        assert keys["global_batch_size"] == strategy["global_batch"], run.id
        assert keys["sequence_parallel"] == strategy["sp"], run.id
        virtual = keys.get("num_virtual_stages_per_pipeline_rank", 1)
        if strategy["v"] is not None:
            assert virtual == strategy["v"], run.id
        elif virtual != 1:
            assert any("num_virtual_stages_per_pipeline_rank" in a for a in run.assumptions)
        recompute = str(strategy["recompute"])
        granularity = keys.get("recompute_granularity")
        if recompute.startswith("full"):
            assert granularity == "full", run.id
            assert keys["recompute_method"] == "uniform", run.id
            assert keys["recompute_num_layers"] == 1, run.id
        elif recompute.startswith("selective"):
            assert granularity == "selective", run.id
            assert "recompute_method" not in keys, run.id
        else:
            assert recompute == "none", run.id
            assert granularity is None, run.id
        assert keys["use_distributed_optimizer"] == bool(strategy["distributed_optimizer"])
        assert keys["fp16"] is True
        assert run.model.datatype == Datatype.FP16


def test_counts_per_source_table(runs: tuple[PublishedRun, ...]) -> None:
    counts = {table: sum(1 for run in runs if run.source_table == table) for table in SourceTable}
    assert counts == {
        SourceTable.NARAYANAN2021_TABLE1: 10,
        SourceTable.KORTHIKANTI2022_TABLE5: 8,
        SourceTable.KORTHIKANTI2022_TABLE4: 5,
        SourceTable.KORTHIKANTI2022_TEXT: 4,
        SourceTable.CALCULON_FIG1: 8,
        SourceTable.CALCULON_FIG7: 20,
    }


# --------------------------------------------------------------------------------------------
# Model construction and conventions
# --------------------------------------------------------------------------------------------
def test_gpt_models_match_published_parameter_counts(runs: tuple[PublishedRun, ...]) -> None:
    """Narayanan 2021 Table 1 names each model by its parameter count (Eq. 2, 0.1B rounding)."""
    for run in runs:
        if run.source_table is SourceTable.NARAYANAN2021_TABLE1:
            assert run.params_b is not None
            assert abs(run.model.num_parameters / 1e9 - run.params_b) <= 0.05, run.id


def test_gpt_model_shape(runs: tuple[PublishedRun, ...]) -> None:
    run = next(r for r in runs if r.id == "korthikanti2022_t5_175B_seqsel")
    model = run.model
    assert model.kv_channels == 128
    assert model.num_query_groups == 96
    assert model.padded_vocab_size == 51200
    assert model.add_bias_linear is True
    # Narayanan Eq. 2 with biases, learned positions and tied embeddings.
    assert model.num_parameters == NUM_PARAMS_175B


def test_padded_vocab_size_follows_megatron() -> None:
    assert padded_vocab_size(51200, 8) == 51200
    assert padded_vocab_size(50257, 1) == 50304
    assert padded_vocab_size(50257, 8) == 51200
    assert padded_vocab_size(32000, 3) == 32256


def test_eq3_reproduces_the_implied_iteration_times(runs: tuple[PublishedRun, ...]) -> None:
    """Narayanan Eq. (3) / (n * TFLOP/s) gives the source's implied iteration time to 0.01 s."""
    checked = 0
    for run in runs:
        if run.implied_iteration_time_s is None:
            continue
        assert run.measured.flops_convention is FlopsConvention.NARAYANAN2021_EQ3
        assert run.measured.tflops_per_gpu is not None
        flops = FlopsConvention.NARAYANAN2021_EQ3.iteration_flops(run.model, run.global_batch_size)
        time_s = flops / (run.num_gpus * run.measured.tflops_per_gpu * 1e12)
        assert round(time_s, 2) == pytest.approx(run.implied_iteration_time_s, abs=0.0051), run.id
        checked += 1
    assert checked == 10


def test_model_flops_reproduce_korthikanti_mfu(runs: tuple[PublishedRun, ...]) -> None:
    """Korthikanti 2022 Section 6.3 model FLOPs over time and 312 TFLOP/s give Table 5's MFU
    to the 0.2 point the source notes."""
    checked = 0
    for run in runs:
        if run.measured.mfu_pct is None or run.measured.iteration_time_s is None:
            continue
        assert run.measured.mfu_convention is FlopsConvention.KORTHIKANTI2022_MODEL_FLOPS
        flops = FlopsConvention.KORTHIKANTI2022_MODEL_FLOPS.iteration_flops(
            run.model, run.global_batch_size
        )
        mfu = 100 * flops / (run.measured.iteration_time_s * run.num_gpus * 312e12)
        assert mfu == pytest.approx(run.measured.mfu_pct, abs=0.2), run.id
        checked += 1
    assert checked == 5


# --------------------------------------------------------------------------------------------
# Loader errors
# --------------------------------------------------------------------------------------------
def test_loader_reports_every_problem_at_once(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        """
[[run]]
id = "x"
source_table = "nowhere"
baseline_run = "missing"
[run.model]
name = "m"
num_layers = 0
hidden_size = 64
num_attention_heads = 4
ffn_hidden_size = 256
seq_length = 128
vocab_size = 1000
[run.strategy]
tensor_model_parallel_size = 1
global_batch_size = "8"
[run.measured]
iteration_time_s = "fast"
speed = 3
""",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_published_runs(bad)
    problems = "\n".join(info.value.problems)
    assert "source_table must be one of" in problems
    assert "global_batch_size must be an integer" in problems
    assert "iteration_time_s must be a number" in problems
    assert "unknown keys: speed" in problems
    assert "num_layers must be a positive integer" in problems


def test_alternative_readings_are_loaded(runs: tuple[PublishedRun, ...]) -> None:
    with_alternatives = {run.id: run for run in runs if run.alternatives}
    assert sorted(with_alternatives) == [
        "korthikanti2022_t5_1T_full",
        "korthikanti2022_t5_1T_seqsel",
        "narayanan2021_t1_1008.0B",
    ]
    for run in with_alternatives.values():
        (alternative,) = run.alternatives
        assert alternative.label == "v=2"
        assert dict(alternative.strategy) == {"num_virtual_stages_per_pipeline_rank": 2}
        assert "num_virtual_stages_per_pipeline_rank" not in run.strategy_keys  # primary: v = 1
        variant = run.under(alternative)
        assert variant.id == f"{run.id}[v=2]"
        assert variant.strategy_keys["num_virtual_stages_per_pipeline_rank"] == 2
        assert {
            k: v
            for k, v in variant.strategy_keys.items()
            if k != "num_virtual_stages_per_pipeline_rank"
        } == dict(run.strategy_keys)
        assert variant.measured == run.measured
        assert variant.alternatives == ()
        assert variant.assumptions[-1].startswith("v=2: ")


def test_loader_reports_every_bad_alternative(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        """
[[run]]
id = "x"
source_table = "korthikanti2022_table5"
provenance = "p"
system = "dgx-a100-80gb"
gpu = "A100"
num_gpus = 8
peak_tflops_16bit = 312.0
[run.model]
name = "m"
num_layers = 4
hidden_size = 64
num_attention_heads = 4
ffn_hidden_size = 256
seq_length = 128
vocab_size = 1000
[run.strategy]
tensor_model_parallel_size = 1
pipeline_model_parallel_size = 2
global_batch_size = 8
[run.measured]
iteration_time_s = 1.0
[[run.alternative]]
label = "same"
reason = "r"
strategy = { pipeline_model_parallel_size = 2 }
[[run.alternative]]
label = "same"
reason = "r"
strategy = {}
[[run.alternative]]
reason = 3
strategy = { pipeline_model_parallel_size = [1] }
""",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_published_runs(bad)
    problems = "\n".join(info.value.problems)
    assert (
        "alternative[0].strategy repeats the run's own value of pipeline_model_parallel_size"
        in (problems)
    )
    assert "alternative[1].strategy must change at least one key" in problems
    assert "alternative[2].label must be a string" in problems
    assert "alternative[2].reason must be a string" in problems
    assert "alternative[2].strategy.pipeline_model_parallel_size must be an integer" in problems
    assert "alternative labels must be distinct" in problems


def test_training_spec_is_built_by_the_flat_key_adapter(runs: tuple[PublishedRun, ...]) -> None:
    spec = runs[0].training_spec()
    assert spec.model == runs[0].model
    assert spec.mapping.world_size == 32


def test_training_specs_of_every_run() -> None:
    for run in load_published_runs(FIXTURE):
        spec = run.training_spec()
        assert spec.mapping.tensor_degree == run.strategy_keys["tensor_model_parallel_size"]
        assert spec.mapping.batch.global_batch_size == run.global_batch_size


# --------------------------------------------------------------------------------------------
# Comparison engine on a synthetic predictor
# --------------------------------------------------------------------------------------------
def _synthetic(run: PublishedRun) -> Prediction:
    """Off by known factors: TFLOP/s +2% (time / 1.02), T5 times +4%/-8% (full/seqsel),
    layers +5%, activation GiB -3%, Fig. 7 activations = 0.5 x baseline."""
    m = run.measured
    time_s: float | None = None
    if m.tflops_per_gpu is not None and m.flops_convention is not None:
        flops = m.flops_convention.iteration_flops(run.model, run.global_batch_size)
        time_s = flops / (run.num_gpus * m.tflops_per_gpu * 1e12) / 1.02
    elif m.iteration_time_s is not None:
        time_s = m.iteration_time_s * (1.04 if run.id.endswith("_full") else 0.92)
    activations: float | None = None
    if m.memory_activations_GiB is not None:
        activations = m.memory_activations_GiB * 0.97 * 2**30
    elif run.source_table is SourceTable.CALCULON_FIG7:
        activations = 2.0**30 if run.id.endswith("_none") else 2.0**29
    return Prediction(
        iteration_time_s=time_s,
        layer_forward_s=None if m.layer_forward_ms is None else m.layer_forward_ms * 1.05e-3,
        layer_backward_s=None if m.layer_backward_ms is None else m.layer_backward_ms * 1.05e-3,
        activation_memory_bytes=activations,
    )


def test_engine_arithmetic_on_a_synthetic_predictor(runs: tuple[PublishedRun, ...]) -> None:
    table = compare_published(_synthetic, runs)
    by_key = {(row.run_id, row.metric): row for row in table.rows}

    tflops = by_key[("narayanan2021_t1_1.7B", Metric.TFLOPS_PER_GPU)]
    assert tflops.measured == 137.0
    assert tflops.predicted == pytest.approx(137.0 * 1.02, rel=1e-12)
    assert tflops.relative_error == pytest.approx(0.02, rel=1e-9)
    assert tflops.gated

    full = by_key[("korthikanti2022_t5_22B_full", Metric.ITERATION_TIME)]
    assert full.relative_error == pytest.approx(0.04, rel=1e-9)
    seqsel = by_key[("korthikanti2022_t5_22B_seqsel", Metric.ITERATION_TIME)]
    assert seqsel.relative_error == pytest.approx(-0.08, rel=1e-9)

    # MFU follows the predicted time with Korthikanti's model FLOPs: 1.1 s * 0.92.
    mfu = by_key[("korthikanti2022_t5_22B_seqsel", Metric.MFU)]
    flops = 72 * 4 * 2048 * 48 * 6144**2 * (1 + 2048 / (6 * 6144) + 51200 / (12 * 48 * 6144))
    assert mfu.predicted == pytest.approx(100 * flops / (1.1 * 0.92 * 8 * 312e12), rel=1e-12)
    assert not mfu.gated

    layer = by_key[("korthikanti2022_t4_22B_layer_none_nosp", Metric.LAYER_BACKWARD)]
    assert layer.predicted == pytest.approx(11.9 * 1.05, rel=1e-12)
    memory = by_key[("calculon_fig1_22B_none", Metric.ACTIVATION_MEMORY)]
    assert memory.predicted == pytest.approx(59.25 * 0.97, rel=1e-12)
    pct = by_key[("calculon_fig7_22B_seq", Metric.ACTIVATION_MEMORY_PCT)]
    assert pct.predicted == 50.0
    assert pct.relative_error == pytest.approx((50.0 - 66.84) / 66.84, rel=1e-12)
    baseline = by_key[("calculon_fig7_22B_none", Metric.ACTIVATION_MEMORY_PCT)]
    assert baseline.predicted == 100.0
    assert baseline.relative_error == 0.0

    not_predicted = by_key[("calculon_fig1_22B_none", Metric.STATIC_MEMORY)]
    assert not_predicted.predicted is None
    assert not_predicted.note == "not predicted"

    gates = {result.gate.family: result for result in table.gates}
    throughput = gates[MetricFamily.THROUGHPUT]
    # 10 rows at 2%, four T5 rows at 4% and four at 8%.
    assert throughput.count == 18
    assert throughput.mae == pytest.approx((10 * 0.02 + 4 * 0.04 + 4 * 0.08) / 18, rel=1e-9)
    assert throughput.max_error == pytest.approx(0.08, rel=1e-9)
    assert throughput.missing == ()
    assert throughput.passed  # MAE 3.8% <= 5% and max 8% <= 10%
    layer_gate = gates[MetricFamily.LAYER_TIME]
    assert layer_gate.count == 10
    assert layer_gate.max_error == pytest.approx(0.05, rel=1e-9)
    assert layer_gate.passed
    memory_gate = gates[MetricFamily.ACTIVATION_MEMORY]
    assert memory_gate.count == 28
    assert not memory_gate.passed
    assert not table.passed


def test_alternatives_are_scored_beside_their_run_and_never_gated(
    runs: tuple[PublishedRun, ...],
) -> None:
    """A predictor that reads the interleaving degree: v = 2 predicts 6% less time."""

    def by_schedule(run: PublishedRun) -> Prediction:
        # _synthetic reads the "_full" suffix of the id; a variant's id is "<id>[<label>]".
        base = _synthetic(replace(run, id=run.id.partition("[")[0])).iteration_time_s
        if base is None:
            return _synthetic(run)
        interleaved = run.strategy_keys.get("num_virtual_stages_per_pipeline_rank") == 2
        return Prediction(iteration_time_s=base * (0.94 if interleaved else 1.0))

    primary_only = compare_published(by_schedule, [replace(run, alternatives=()) for run in runs])
    table = compare_published(by_schedule, runs)
    assert table.rows == primary_only.rows
    assert table.gates == primary_only.gates
    assert primary_only.alternatives == ()

    rows = {(row.run_id, row.metric): row for row in table.alternatives}
    assert sorted(rows) == [
        ("korthikanti2022_t5_1T_full", Metric.ITERATION_TIME),
        ("korthikanti2022_t5_1T_seqsel", Metric.ITERATION_TIME),
        ("korthikanti2022_t5_1T_seqsel", Metric.MFU),
        ("narayanan2021_t1_1008.0B", Metric.TFLOPS_PER_GPU),
    ]
    full = rows[("korthikanti2022_t5_1T_full", Metric.ITERATION_TIME)]
    assert full.measured == 94.42
    assert full.primary == pytest.approx(94.42 * 1.04, rel=1e-12)
    assert full.primary_error == pytest.approx(0.04, rel=1e-9)
    assert full.predicted == pytest.approx(94.42 * 1.04 * 0.94, rel=1e-12)
    assert full.relative_error == pytest.approx(1.04 * 0.94 - 1, rel=1e-9)
    assert full.label == "v=2" and "Calculon" in full.reason
    tflops = rows[("narayanan2021_t1_1008.0B", Metric.TFLOPS_PER_GPU)]
    assert tflops.predicted == pytest.approx(163.0 * 1.02 / 0.94, rel=1e-12)

    rendered = render_alternatives(table)
    assert rendered is not None and rendered.row_count == 4
    assert render_alternatives(primary_only) is None
    document = json.loads(json.dumps(to_json_dict(table)))
    assert document["passed"] is table.passed
    assert len(document["rows"]) == len(table.rows)
    assert [row["run"] for row in document["alternatives"]] == [
        row.run_id for row in table.alternatives
    ]
    assert document["alternatives"][0]["relative_error"] == table.alternatives[0].relative_error
    assert [gate["name"] for gate in document["gates"]] == [g.gate.name for g in table.gates]


def test_gate_limits_are_the_issue_thresholds() -> None:
    assert (THROUGHPUT_MAE_LIMIT, THROUGHPUT_MAX_LIMIT) == (0.05, 0.10)
    assert LAYER_TIME_MAX_LIMIT == 0.10
    assert ACTIVATION_MEMORY_MAX_LIMIT == 0.05


def test_a_perfect_predictor_passes_every_gate(runs: tuple[PublishedRun, ...]) -> None:
    def perfect(run: PublishedRun) -> Prediction:
        m = run.measured
        time_s = m.iteration_time_s
        if m.tflops_per_gpu is not None and m.flops_convention is not None:
            flops = m.flops_convention.iteration_flops(run.model, run.global_batch_size)
            time_s = flops / (run.num_gpus * m.tflops_per_gpu * 1e12)
        activations = m.memory_activations_GiB
        if m.activation_memory_pct_of_tp_baseline is not None:
            activations = m.activation_memory_pct_of_tp_baseline
        return Prediction(
            iteration_time_s=time_s,
            layer_forward_s=None if m.layer_forward_ms is None else m.layer_forward_ms / 1e3,
            layer_backward_s=None if m.layer_backward_ms is None else m.layer_backward_ms / 1e3,
            activation_memory_bytes=None if activations is None else activations * 2**30,
        )

    table = compare_published(perfect, runs)
    assert table.passed
    for result in table.gates:
        assert result.max_error is not None
        assert result.max_error < 1e-12


def test_a_predictor_error_marks_the_run_not_predicted(runs: tuple[PublishedRun, ...]) -> None:
    def refuses(run: PublishedRun) -> Prediction:
        raise UnsupportedError(f"no model for {run.id}")

    table = compare_published(refuses, runs[:1])
    assert [row.note for row in table.rows] == ["no model for narayanan2021_t1_1.7B"]
    assert table.gates[0].missing == ("narayanan2021_t1_1.7B:tflops_per_gpu",)
    assert not table.gates[0].passed


def test_rendering_lists_every_row_and_gate(runs: tuple[PublishedRun, ...]) -> None:
    table = compare_published(_synthetic, runs)
    rows = render_rows(table)
    assert rows.row_count == len(table.rows)
    gates = render_gates(table)
    # Gates, one "times of <table>" row per table with a time figure, one row per family.
    timed = {
        row.source_table
        for row in table.rows
        if row.metric.family in {MetricFamily.THROUGHPUT, MetricFamily.LAYER_TIME}
        and row.relative_error is not None
    }
    assert gates.row_count == len(table.gates) + len(timed) + len(MetricFamily)


# --------------------------------------------------------------------------------------------
# The real cost model
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_table(runs: tuple[PublishedRun, ...]) -> ValidationTable:
    from blueprinting.validation.predictor import api_predictor

    # No skip: a cost model that cannot be imported must fail these tests, not hide as skips.
    return compare_published(api_predictor(), runs)


def _errors(table: ValidationTable, source: SourceTable, family: MetricFamily) -> list[float]:
    errors = [
        row.relative_error
        for row in table.rows
        if row.source_table == source and row.metric.family == family
    ]
    assert all(error is not None for error in errors), "every row must be predicted"
    return [abs(error) for error in errors if error is not None]


def test_every_published_row_is_predicted(real_table: ValidationTable) -> None:
    assert [row.run_id for row in real_table.rows if row.predicted is None] == []
    assert math.isfinite(sum(abs(r.relative_error or 0.0) for r in real_table.rows))


def test_per_layer_times_meet_the_issue_gate(real_table: ValidationTable) -> None:
    """Korthikanti 2022 Table 4, the subset the A100 GEMM fraction is fitted on (presets.py):
    every forward/backward time within 10% (the fit, on the A100 NVLink fit, reaches 3.7%)."""
    (result,) = [r for r in real_table.gates if r.gate.family == MetricFamily.LAYER_TIME]
    assert result.passed, (result.mae, result.max_error)
    assert result.count == 10
    assert result.max_error is not None and result.max_error <= 0.04


def test_activation_memory_meets_the_issue_gate(real_table: ValidationTable) -> None:
    """Korthikanti Figures 1 and 7 (Calculon's reading): within 5% (reached: 1.1%, the full
    recompute rows of Fig. 7, read off a bar chart; Fig. 1 is exact)."""
    (result,) = [r for r in real_table.gates if r.gate.family == MetricFamily.ACTIVATION_MEMORY]
    assert result.passed, (result.mae, result.max_error)
    assert result.count == 28
    assert max(_errors(real_table, SourceTable.CALCULON_FIG1, MetricFamily.ACTIVATION_MEMORY)) < (
        1e-3
    )


# Held-out rows (not used by the fit). Bounds are the achieved figures rounded up, so that a
# change that makes the model worse fails here; the issue's tighter joint gate is the xfail below.
HELD_OUT_BOUNDS: dict[SourceTable, tuple[float, float]] = {
    # Narayanan: costed with the SC'21 code's synchronous TP backward all-reduce (predictor.py).
    # Reached with the A100 NVLink fit and the fraction refitted on it (0.75); before (0.78 /
    # 10 us NVLink, 0.72): Narayanan MAE 3.5%, max 6.9%; Korthikanti T5 MAE 5.1%, max 10.4%.
    SourceTable.NARAYANAN2021_TABLE1: (0.04, 0.08),  # reached: MAE 3.2%, max 7.9%
    SourceTable.KORTHIKANTI2022_TABLE5: (0.05, 0.08),  # reached: MAE 4.1%, max 7.2%
}


@pytest.mark.parametrize("source", list(HELD_OUT_BOUNDS))
def test_held_out_throughput_does_not_regress(
    real_table: ValidationTable, source: SourceTable
) -> None:
    errors = _errors(real_table, source, MetricFamily.THROUGHPUT)
    mae_bound, max_bound = HELD_OUT_BOUNDS[source]
    assert len(errors) in (8, 10)
    assert sum(errors) / len(errors) <= mae_bound
    assert max(errors) <= max_bound


def test_the_1t_rows_under_their_other_reading(real_table: ValidationTable) -> None:
    """Interleaving the three 1T runs (v = 2, see the fixture's reasons) moves them in line with
    the rest of their tables; the gates keep the fixture's primary reading (v = 1). Errors are
    the achieved figures, rounded outward by 0.5 point."""
    from blueprinting.api import plan_spec
    from blueprinting.hardware.presets import system_preset
    from blueprinting.mapping.transformer import virtual_stages_of

    rows = {
        (row.run_id, row.metric): row
        for row in real_table.alternatives
        if row.metric.family is MetricFamily.THROUGHPUT
    }
    expected = {  # primary (v = 1) and alternative (v = 2) relative errors, reached
        "narayanan2021_t1_1008.0B": (-0.010, 0.038),
        "korthikanti2022_t5_1T_full": (0.072, 0.022),
        "korthikanti2022_t5_1T_seqsel": (0.065, 0.012),
    }
    assert {run_id for run_id, _ in rows} == set(expected)
    for (run_id, _), row in rows.items():
        primary, alternative = expected[run_id]
        assert row.primary_error == pytest.approx(primary, abs=0.005)
        assert row.relative_error == pytest.approx(alternative, abs=0.005)
        assert row.relative_error is not None and abs(row.relative_error) <= THROUGHPUT_MAX_LIMIT

    (run,) = [r for r in load_published_runs(FIXTURE) if r.id == "korthikanti2022_t5_1T_seqsel"]
    spec = run.under(run.alternatives[0]).training_spec()
    assert virtual_stages_of(spec.mapping.parallelism.pipeline.schedule) == 2
    direct = plan_spec(spec, system_preset("dgx-a100-80gb")).iteration_time_s
    assert rows[(run.id, Metric.ITERATION_TIME)].predicted == direct


def test_cost_model_meets_the_issue_throughput_gate(real_table: ValidationTable) -> None:
    """Issue #5's joint gate (Narayanan T1 + Korthikanti T5: MAE <= 5%, max <= 10%), met since the
    A100 presets take the NVLink sweep fit (47 us, 0.69: microbenchmarks.md 4.2) and the GEMM
    fraction refitted on Table 4 with it (0.75): MAE 3.6%, max 7.9% (Narayanan's 76.1B TFLOP/s per
    GPU, +7.9%; Korthikanti T5 1T full +7.2%). Before, at 0.78 / 10 us and 0.72, the max was 10.4%
    (Korthikanti T5 1T full, too slow: p = 64 with 2 blocks per stage makes the LM head on the
    last stage the critical stage)."""
    (result,) = [r for r in real_table.gates if r.gate.family == MetricFamily.THROUGHPUT]
    assert result.passed, (result.mae, result.max_error)


def test_a_measured_figure_errors_are_relative_to_must_be_nonzero(tmp_path: Path) -> None:
    """Fuzz seed 1271 case 449: a published figure of 0 reached the relative error as a
    ZeroDivisionError. Every measured figure must be finite and, being a magnitude, positive
    (the two changes in percent may be negative, not 0); all are reported at once."""
    text = FIXTURE.read_text()
    first = text.index("tflops_per_gpu = 137.0")
    bad = (
        text[:first]
        + "tflops_per_gpu = 0\npct_of_peak = -44.0\noverhead_vs_baseline_pct = 0.0\n"
        + text[text.index("aggregate_pflops", first) :]
    )
    path = tmp_path / "published.toml"
    path.write_text(bad)
    with pytest.raises(ConfigError) as raised:
        load_published_runs(path)
    problems = " | ".join(raised.value.problems)
    assert "measured.tflops_per_gpu must be a positive finite number, got 0.0" in problems
    assert "measured.pct_of_peak must be a positive finite number, got -44.0" in problems
    assert "measured.overhead_vs_baseline_pct must be a finite non-zero number, got 0.0" in problems


def test_a_run_of_no_gpus_is_refused(tmp_path: Path) -> None:
    """Fuzz seed 1272 case 41418: ``num_gpus = 0`` reached the TFLOP/s per GPU (calibrate) as a
    ZeroDivisionError."""
    text = FIXTURE.read_text()
    path = tmp_path / "published.toml"
    path.write_text(text.replace("num_gpus = ", "num_gpus = 0 #", 1))
    with pytest.raises(ConfigError) as raised:
        load_published_runs(path)
    assert "num_gpus must be a positive integer, got 0" in " | ".join(raised.value.problems)
