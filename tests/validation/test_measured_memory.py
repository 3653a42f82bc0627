"""The measured-memory fixture, its loader, its exclusions and the issue 19 gates.

Figures come from ``shared/reference/measured_memory.json`` (Megatron-LM functional-test golden
values, Megatron-Core 0.11 to 0.20; Megatron-LM's activation offloading README; the vuiseng9
Megatron-Core 0.14 tutorial on 8 H100s); the fixture must carry each one unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from blueprinting.errors import ConfigError, UnsupportedError
from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.flat_keys import (
    MODEL_KEYS,
    SHARED_KEYS,
    TRAINING_KEYS,
    FlatValue,
    canonical_key,
    from_mapping,
    to_mapping,
)
from blueprinting.mapping.precision import HighPrecision
from blueprinting.mapping.transformer import AttentionBackend, NoTpCommOverlap
from blueprinting.report.memory_validation_text import (
    render_memory_exclusions,
    render_memory_gates,
    render_memory_rows,
)
from blueprinting.validation.measured_memory import (
    MEDIAN_ERROR_LIMIT,
    ExclusionReason,
    FigureKind,
    MeasuredMemoryRun,
    MemoryGate,
    MemoryPrediction,
    MemoryValidation,
    PredictedPeak,
    ReportedStage,
    api_memory_predictor,
    compare_measured_memory,
    load_measured_memory,
    memory_to_json_dict,
    prediction_from_report,
)
from tests.reference import shared_reference

RUNS = load_measured_memory()
BY_ID = {run.id: run for run in RUNS}
INCLUDED = [run for run in RUNS if run.included]
_ACCEPTED = {*SHARED_KEYS, *TRAINING_KEYS, *MODEL_KEYS}
_MIB = 2**20


def _reference_records() -> dict[str, Mapping[str, object]]:
    reference = shared_reference()
    if reference is None or not (reference / "measured_memory.json").is_file():
        pytest.skip("shared/reference/measured_memory.json not found (set BLUEPRINTING_SHARED)")
    records = json.loads((reference / "measured_memory.json").read_text(encoding="utf-8"))
    return {str(record["id"]): record for record in records}


# --------------------------------------------------------------------------------------------
# The fixture
# --------------------------------------------------------------------------------------------
def test_fixture_holds_every_record_once() -> None:
    assert len(RUNS) == 83
    assert len(BY_ID) == 83
    # + the two GB200 runs the dgx-gb200 preset plans, + the four cp runs cp now plans, + the
    # 14 MoE / MLA / MTP runs the MoE model plans (issue 13), + the one whose moe_act /
    # mla_up_proj recompute is modelled since, + the FP8 cp run whose quantized activations
    # are modelled since
    assert len(INCLUDED) == 77


def test_exclusion_counts() -> None:
    validation = compare_measured_memory(lambda run: MemoryPrediction(), RUNS)
    assert len(validation.excluded) == 6
    assert validation.exclusion_counts == {
        ExclusionReason.TP_COMM_OVERLAP: 1,
        ExclusionReason.ACTIVATION_OFFLOAD: 4,
        ExclusionReason.INCOMPLETE_CONFIGURATION: 2,
    }


def test_units_are_converted_exactly() -> None:
    golden = BY_ID["mlm_ft_gpt3_7b_tp1_pp4_memory_speed_dev_dgx_a100"]
    assert golden.measured.max_allocated_mib == 57686.87
    assert golden.measured.figure_bytes(FigureKind.MAX_ALLOCATED) == 57686.87 * _MIB
    assert golden.measured.figure_bytes(FigureKind.NVIDIA_SMI) is None
    assert golden.stage is ReportedStage.LAST
    assert golden.attention_backend is AttentionBackend.AUTO
    tutorial = BY_ID["vuiseng9_101-gpt2xl-dp1-gbs1-bf16"]
    # gpustat's MB is a MiB (wookayin/gpustat core.py: MB = 1024 * 1024)
    assert tutorial.measured.figure_bytes(FigureKind.NVIDIA_SMI) == 33321 * 2**20
    assert tutorial.stage is ReportedStage.MOST_LOADED
    readme = BY_ID["mlm_fgoffload_readme_dsv3proxy_baseline"]
    assert readme.measured.figure_bytes(FigureKind.MAX_RESERVED) == 74306.0 * _MIB
    assert readme.measured.max_allocated_mib_per_stage == (65203.93, 52228.15, 45200.83, 48166.26)


def test_every_fixture_figure_matches_the_shared_reference() -> None:
    records = _reference_records()
    assert set(records) == set(BY_ID)
    pairs = (
        ("max_allocated_MB", "max_allocated_mib"),
        ("allocated_MB", "allocated_mib"),
        ("max_reserved_MB", "max_reserved_mib"),
        ("reserved_MB", "reserved_mib"),
        ("nvidia_smi_MB", "nvidia_smi_mb"),
        ("oom", "oom"),
    )
    for run_id, record in records.items():
        run = BY_ID[run_id]
        measured = record["measured"]
        hardware = record["hardware"]
        assert isinstance(measured, dict) and isinstance(hardware, dict)
        for source_key, key in pairs:
            assert getattr(run.measured, key) == measured[source_key], (run_id, key)
        assert run.num_gpus == hardware["num_gpus"], run_id
        per_stage = record.get("measured_per_stage", [])
        assert isinstance(per_stage, list)
        assert run.measured.max_allocated_mib_per_stage == tuple(
            stage["max_allocated_MB"] for stage in per_stage
        )
        assert run.measured.max_reserved_mib_per_stage == tuple(
            stage["max_reserved_MB"] for stage in per_stage
        )
        assert run.complete is record["complete"]


def test_included_runs_are_configured_as_the_reference_records_them() -> None:
    records = _reference_records()
    for run in INCLUDED:
        record = records[run.id]
        strategy, model = record["strategy"], record["model"]
        assert isinstance(strategy, dict) and isinstance(model, dict)
        keys = to_mapping(run.training_spec())
        expected: dict[str, FlatValue] = {
            "tensor_model_parallel_size": strategy["tp"],
            "pipeline_model_parallel_size": strategy["pp"],
            "data_parallel_size": strategy["dp"],
            "micro_batch_size": strategy["micro_batch_size"],
            "global_batch_size": strategy["global_batch_size"],
            "sequence_parallel": strategy["sequence_parallel"],
            "use_distributed_optimizer": strategy["distributed_optimizer"],
            "overlap_grad_reduce": strategy["overlap_grad_reduce"],
            "num_layers": model["num_layers"],
            "hidden_size": model["hidden_size"],
            "num_attention_heads": model["num_attention_heads"],
            "seq_length": model["seq_length"],
            "padded_vocab_size": model["padded_vocab_size"],
            "untie_embeddings_and_output_weights": not model["tied_embeddings"],
            "add_bias_linear": model["bias_linear"],
            "normalization": model["normalization"],
            "position_embedding_type": model["position_embedding"],
            "swiglu": model["activation"] == "swiglu",
        }
        if model.get("ffn_hidden_size") is not None:
            expected["ffn_hidden_size"] = model["ffn_hidden_size"]
        if (model.get("num_query_groups") or model["num_attention_heads"]) != model[
            "num_attention_heads"
        ]:
            expected["num_query_groups"] = model["num_query_groups"]
        got = {key: keys.get(key) for key in expected}
        assert got == expected, run.id
        assert keys.get("num_virtual_stages_per_pipeline_rank", 1) == (strategy["vp"] or 1)
        assert keys.get("recompute_granularity") == strategy["recompute_granularity"], run.id


# --------------------------------------------------------------------------------------------
# The loader
# --------------------------------------------------------------------------------------------
_BROKEN = """
[[run]]
id = "broken"
source = "a blog"
provenance = "nowhere"
megatron_core = "0.14"
system = "dgx-h100"
gpu = "H100"
transformer_impl = "transformer_engine"
attention_backend = "flashy"
stage = "middle"
excluded = ["tp_comm_overlap", "quantum"]

[run.model]
num_layers = 2
hidden_size = [1]

[run.strategy]
num_layers = 2
tensor_model_parallel_size = 1

[run.measured]
max_allocated_mb = 1.0
oom = "no"

[[run]]
id = "broken"
source = "vuiseng9_tutorial"
provenance = "p"
megatron_core = "0.14"
system = "dgx-h100"
gpu = "H100"
num_gpus = 1
transformer_impl = "transformer_engine"
attention_backend = "auto"
stage = "unknown"

[run.model]
num_layers = 2

[run.strategy]
micro_batch_size = 1

[run.measured]
nvidia_smi_mb = -3
"""


def test_loader_reports_every_problem_at_once(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text(_BROKEN, encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_measured_memory(path)
    assert raised.value.source == str(path)
    assert raised.value.problems == (
        "run 'broken'.model.hidden_size must be an integer, boolean, number or string",
        "run 'broken': key(s) in both model and strategy: num_layers",
        "run 'broken'.measured has unknown keys: max_allocated_mb",
        "run 'broken'.measured.oom must be a boolean, got 'no'",
        "run 'broken'.num_gpus must be an integer, got None",
        "run 'broken'.source: unknown value 'a blog'",
        "run 'broken'.attention_backend: unknown value 'flashy'",
        "run 'broken'.stage: unknown value 'middle'",
        "run 'broken'.excluded: unknown reason 'quantum' (one of "
        + ", ".join(reason.value for reason in ExclusionReason)
        + ")",
        "run 'broken'.excluded names tp_comm_overlap but the run sets none of tp_comm_overlap",
        "run 'broken'.measured.nvidia_smi_mb must be positive, got -3.0",
        "duplicate run ids: broken",
    )


def test_unreadable_fixture_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[[run]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="malformed toml"):
        load_measured_memory(path)
    path.write_text("schema_version = 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"expected \[\[run\]\] tables"):
        load_measured_memory(path)


# --------------------------------------------------------------------------------------------
# Exclusions are true; everything else plans
# --------------------------------------------------------------------------------------------
def _accepted_keys(run: MeasuredMemoryRun, extra: frozenset[str]) -> dict[str, FlatValue]:
    """The run's keys ``from_mapping`` accepts, plus those of ``extra``."""
    return {
        key: value
        for key, value in run.flat_keys().items()
        if canonical_key(key) in _ACCEPTED or canonical_key(key) in extra
    }


@pytest.mark.parametrize(
    ("run_id", "reason"),
    [(run.id, reason) for run in RUNS for reason in run.excluded],
)
def test_each_exclusion_is_true(run_id: str, reason: ExclusionReason) -> None:
    """The reason alone stops Blueprinting: its keys, added to the run's accepted keys, are
    refused by name; a missing preset or model key is refused as such."""
    run = BY_ID[run_id]
    match reason:
        case ExclusionReason.NO_SYSTEM_PRESET:
            with pytest.raises(ConfigError, match="unknown system"):
                system_preset(run.system)
        case ExclusionReason.INCOMPLETE_CONFIGURATION:
            with pytest.raises(ConfigError, match="model key\\(s\\) missing"):
                from_mapping(_accepted_keys(run, frozenset()))
        case ExclusionReason.TP_COMM_OVERLAP:
            # Planned since issue 20 (time only): the memory model holds no userbuffer
            # allocation yet, so the run stays out of the memory gates.
            keys = _accepted_keys(run, reason.keys)
            assert "tp_comm_overlap" in {canonical_key(key) for key in keys}
            assert from_mapping(keys).mapping.tp_comm_overlap != NoTpCommOverlap()
        case ExclusionReason.FP8_RECIPE:
            # Parsed since issue 12 item 4 (the precision recipe) and in the memory model since
            # its quantized activations (issue 19): no run of the fixture names it any more.
            keys = _accepted_keys(run, reason.keys)
            assert "fp8_recipe" in {canonical_key(key) for key in keys}
            try:
                assert from_mapping(keys).mapping.precision != HighPrecision()
            except (ConfigError, UnsupportedError) as other:  # another reason (e.g. CP)
                assert "fp8" not in str(other), str(other)
        case _:
            keys = _accepted_keys(run, reason.keys)
            named = reason.keys & {canonical_key(key) for key in keys}
            assert named, f"{run_id} sets no key of {reason}"
            with pytest.raises((ConfigError, UnsupportedError)) as raised:
                from_mapping(keys)
            assert any(key in str(raised.value) for key in named), str(raised.value)


def test_every_excluded_run_fails_to_plan() -> None:
    for run in RUNS:
        if run.included:
            continue
        if run.excluded == (ExclusionReason.NO_SYSTEM_PRESET,):
            with pytest.raises(ConfigError):
                system_preset(run.system)
            continue
        planned = {ExclusionReason.TP_COMM_OVERLAP, ExclusionReason.FP8_RECIPE}
        if set(run.excluded) <= planned:
            continue  # planned for time, kept out of the memory gates (see above)
        with pytest.raises((ConfigError, UnsupportedError)):
            run.training_spec()


def test_every_included_run_plans_on_its_preset() -> None:
    predict = api_memory_predictor()
    for run in INCLUDED:
        prediction = predict(run)
        assert prediction.fits_in_memory is not None, run.id
        assert prediction.allocated_peak_bytes is not None, run.id
        assert prediction.reserved_peak_bytes is not None, run.id


# --------------------------------------------------------------------------------------------
# Reading predictions and scoring
# --------------------------------------------------------------------------------------------
_REPORT: Mapping[str, object] = {
    "memory_bytes": {"allocated_peak": 50.0, "reserved_peak": 60.0, "total": 1.0},
    "memory_allocated_peak_bytes_per_stage": [10.0, 20.0, 30.0],
    "memory_reserved_peak_bytes_per_stage": [11.0, 21.0, 31.0],
    "memory_total_bytes_per_stage": [1.0, 1.0, 1.0],
    "fits_in_memory": False,
}


@pytest.mark.parametrize(
    ("stage", "allocated", "reserved"),
    [
        (ReportedStage.FIRST, 10.0, 11.0),
        (ReportedStage.LAST, 30.0, 31.0),
        (ReportedStage.MOST_LOADED, 50.0, 60.0),
        (ReportedStage.UNKNOWN, 50.0, 60.0),
    ],
)
def test_prediction_reads_both_peaks_on_the_reported_stage(
    stage: ReportedStage, allocated: float, reserved: float
) -> None:
    assert prediction_from_report(_REPORT, stage) == MemoryPrediction(
        allocated_peak_bytes=allocated, reserved_peak_bytes=reserved, fits_in_memory=False
    )


def test_figure_kinds_compare_with_the_right_peak() -> None:
    assert FigureKind.MAX_ALLOCATED.peak is PredictedPeak.ALLOCATED
    assert FigureKind.MAX_RESERVED.peak is PredictedPeak.RESERVED
    assert FigureKind.NVIDIA_SMI.peak is PredictedPeak.RESERVED


def _constant(allocated: float, reserved: float, fits: bool) -> MemoryValidation:
    prediction = MemoryPrediction(
        allocated_peak_bytes=allocated, reserved_peak_bytes=reserved, fits_in_memory=fits
    )
    return compare_measured_memory(lambda run: prediction, RUNS)


def test_scoring_with_a_constant_predictor() -> None:
    validation = _constant(60e9, 70e9, True)
    assert len(validation.rows) == 73
    assert len(validation.fits) == 77
    (row,) = [r for r in validation.rows if r.run_id == "vuiseng9_101-gpt2xl-dp1-gbs1-bf16"]
    assert row.kind is FigureKind.NVIDIA_SMI
    assert row.predicted_bytes == 70e9
    assert row.relative_error == (70e9 - 33321 * 2**20) / (33321 * 2**20)
    (golden,) = [
        r for r in validation.rows if r.run_id == "mlm_ft_gpt3_7b_tp1_pp4_memory_speed_dev_dgx_a100"
    ]
    assert golden.predicted_bytes == 60e9
    median, oom, ran = validation.gates
    assert (median.gate, oom.gate, ran.gate) == (
        MemoryGate.MEDIAN_ERROR,
        MemoryGate.OOM_PREDICTED,
        MemoryGate.RAN_PREDICTED,
    )
    assert oom.count == 4 and oom.value == 0.0 and not oom.passed
    assert ran.count == 73 and ran.value == 1.0 and ran.passed
    assert median.count == 73 and median.limit == MEDIAN_ERROR_LIMIT


def test_a_run_that_fails_to_plan_fails_the_gates() -> None:
    def predict(run: MeasuredMemoryRun) -> MemoryPrediction:
        raise UnsupportedError("no cost model here")

    validation = compare_measured_memory(predict, RUNS)
    assert {row.note for row in validation.rows} == {"no cost model here"}
    assert not any(result.passed for result in validation.gates)
    assert len(validation.gates[0].failing) == 73


def test_json_and_text_renderings() -> None:
    validation = _constant(60e9, 70e9, True)
    document = memory_to_json_dict(validation)
    assert set(document) == {
        "passed",
        "gates",
        "rows",
        "fits",
        "excluded",
        "excluded_counts",
        "excluded_runs",
    }
    assert document["excluded_runs"] == 6
    assert document["excluded_counts"] == {
        str(reason): count for reason, count in validation.exclusion_counts.items()
    }
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render_memory_rows(validation))
    console.print(render_memory_exclusions(validation))
    console.print(render_memory_gates(validation))
    text = console.export_text()
    assert "vuiseng9_121-gpt2xl-dp1-gbs16-oom" in text
    assert "fits/OOM WRONG" in text
    assert "6 runs not planned" in text
    assert "out-of-memory runs predicted not to fit │ 4    │ 0/4" in text


# --------------------------------------------------------------------------------------------
# THE GATE (issue 19)
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def validation() -> MemoryValidation:
    return compare_measured_memory(api_memory_predictor(), RUNS)


def test_gate_median_error_of_the_peaks(validation: MemoryValidation) -> None:
    result = validation.gates[0]
    assert result.gate is MemoryGate.MEDIAN_ERROR
    assert result.failing == ()
    assert result.count == 73
    assert result.value is not None and result.value <= MEDIAN_ERROR_LIMIT


def test_the_verdicts_miss_exactly_the_two_runs_named(validation: MemoryValidation) -> None:
    """What the verdict gates say today, pinned so that any change shows. The tutorial's device
    figures are gpustat MiB and H100's capacity NVML's 81,559 MiB (presets.NVML_TOTAL_MIB), so
    every run that ran is predicted to fit, the closest 228 (80,600 MiB measured, 77,385
    predicted) too. Two out-of-memory runs read as fitting, both within the model's
    under-prediction of the device peak (median signed error of the tutorial rows about -8%):
    121 (gpt2-xl, mbs 16, 73,482 MiB predicted) exceeds the capacity by only about 0.2% by the
    slope of its measured siblings (mbs 1: 33,321 MiB, mbs 15: 78,500 MiB, so 3,227 MiB per
    sample and about 81,727 MiB at mbs 16), inside the table's 100 MiB reading; 281 (GPT 22B,
    t 8, 80,354 MiB predicted) lies 1.5% under the capacity, while its siblings 282 and 283
    (sequence parallel; full recompute) are both under-predicted by 2,075 MiB, enough to
    carry it over. The MLA + MTP
    functional test ``..._ep4_etp1_memory_speed`` (55.98 GiB measured) ran the unfused core
    with ``--attention-dropout 0.0 --hidden-dropout 0.0``: with those keys it stores the
    softmax output alone (x = 2 bytes per s x s score, not 2x + 1 = 5) and no dropout masks,
    and is predicted at 52.51 GiB (-6.2%; 52.98 GiB, -5.4%, while the shared experts' FC1 was
    counted keeping its all-gathered input, where Transformer Engine keeps the local rows the
    router already holds; 48.5 GiB, -13.4%, before the loss stage counted its MTP depth's layer,
    inputs and logits; 90.7 GiB, +62.1%, when the dropout keys did not exist); its
    ``selective_recompute_experimental`` twin (``moe_act mla_up_proj mlp layernorm``, 45.83 GiB
    measured) at 44.83 GiB (-2.2%; -1.2% with the gathered input; -10.2% before the MTP
    depth)."""
    oom, ran = validation.gates[1], validation.gates[2]
    assert (oom.count, oom.failing) == (
        4,
        ("vuiseng9_121-gpt2xl-dp1-gbs16-oom", "vuiseng9_281-gpt-22B-tp8-gbs4-len2048-oom"),
    )
    assert (ran.count, ran.failing) == (73, ())
    speed = next(
        row
        for row in validation.rows
        if row.run_id == "mlm_ft_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_dev_dgx_h100"
    )
    assert speed.relative_error is not None
    assert speed.relative_error == pytest.approx(-0.062, abs=0.001)


def test_the_fp8_run_is_compared_with_its_quantized_activations(
    validation: MemoryValidation,
) -> None:
    """The tensorwise-FP8 cp 2 functional test (h 512, 12 layers, t 4: fixed terms dominate):
    its allocated peak, 405.4 MiB measured, is predicted at 369.4 MiB (-8.9%) with the linears'
    inputs at 1 B and the attention output kept once, at 2 B (Megatron-Core's
    ``save_original_input`` on ``linear_proj``; 370.9 MiB, -8.5%, with the projection's 1 B copy
    beside it; the golden values postdate the change, Megatron-Core v0.14). Against the
    measurement, pinned so that any change shows; the quantized inputs themselves are checked
    term by term in tests/analysis/test_low_precision_activations.py."""
    name = "mlm_ft_gpt3_weekly_mcore_tp4_cp2_current_scaling_native_fp8_tp_sp_cp_tp_overlap"
    row = next(r for r in validation.rows if r.run_id == f"{name}_dev_dgx_h100")
    assert row.measured_bytes == 425_124_167.68  # the fixture's 405.43 MiB
    assert row.relative_error == pytest.approx(-0.0889, abs=0.0005)


@pytest.mark.xfail(
    strict=True,
    reason="issue 19 gate not met: vuiseng9_121 and vuiseng9_281 (OOM) are predicted to fit; "
    "the device peak of the tutorial rows is under-predicted by ~8% (a fixed ~2 GiB the model "
    "does not name, missed on one-GPU runs with no NCCL communicator too, and more at t = 1), "
    "against 0.2% and 1.5% margins; NCCL's sourced buffers (834 MiB on 281) leave 281 at "
    "79,876 of 81,559 MiB",
)
def test_gate_every_out_of_memory_run_predicted_not_to_fit(validation: MemoryValidation) -> None:
    result = validation.gates[1]
    assert result.gate is MemoryGate.OOM_PREDICTED
    assert result.count == 4
    assert result.failing == ()


def test_gate_every_run_that_ran_predicted_to_fit(validation: MemoryValidation) -> None:
    result = validation.gates[2]
    assert result.gate is MemoryGate.RAN_PREDICTED
    assert result.count == 73
    assert result.failing == ()
