"""The dense modern runs (issue 12 item 7): fixture, loader, recipes, scoring and the gates.

The fixture ``tests/validation/fixtures/modern_runs.toml`` transcribes the 79 dense records of
``shared/reference/modern_runs.json``; :func:`test_fixture_matches_the_shared_reference` checks
it against that file when it is present (skipped on a clone without ``shared/``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from blueprinting.analysis.flops import FlopsConvention
from blueprinting.errors import BlueprintingError, ConfigError
from blueprinting.validation.modern import (
    MAX_ERROR_LIMIT,
    MEDIAN_ERROR_LIMIT,
    GpuGeneration,
    ModernExclusion,
    ModernGate,
    ModernRun,
    ModernSource,
    ModernValidation,
    PrecisionRecipe,
    api_modern_predictor,
    compare_modern_runs,
    default_fixture_path,
    load_modern_runs,
    modern_to_json_dict,
    planner_message,
    precision_recipe,
    release_order,
    software_release,
)
from blueprinting.validation.modern_moe import MOE_SOURCES
from tests.reference import shared_reference

_RUNS = load_modern_runs()
_BY_ID = {run.id: run for run in _RUNS}


@pytest.fixture(scope="module")
def planned() -> ModernValidation:
    """Every fixture run through ``blueprinting.api.plan_spec`` (about a second)."""
    return compare_modern_runs(api_modern_predictor(), _RUNS)


# --------------------------------------------------------------------------------------------
# The fixture and the loader
# --------------------------------------------------------------------------------------------
def test_fixture_holds_every_dense_run_once() -> None:
    assert len(_RUNS) == 79
    assert len(_BY_ID) == 79
    dense_sources = [source for source in ModernSource if source not in MOE_SOURCES]
    counts = {source: sum(1 for r in _RUNS if r.source is source) for source in dense_sources}
    assert counts == {
        ModernSource.MEGATRON_BRIDGE: 50,
        ModernSource.NEMO_24_07: 12,
        ModernSource.NEMO_LONG_SEQUENCE: 17,
    }
    assert {run.system for run in _RUNS} == {"dgx-h100", "dgx-b200", "dgx-gb200"}
    assert all(run.provenance and run.framework for run in _RUNS)


def test_a_megatron_bridge_row_reads_exactly() -> None:
    run = _BY_ID["mbridge_26.04.01_DGX-H100_LLAMA3_70B_64gpu_FP8_14"]
    assert run.model_preset == "llama3-70b"
    assert run.system == "dgx-h100" and run.generation is GpuGeneration.HOPPER
    assert run.num_gpus == 64
    assert (run.tensor_parallel, run.pipeline_parallel, run.context_parallel) == (4, 8, 1)
    assert run.data_parallel == 2
    assert run.recipe is PrecisionRecipe.FP8_TENSORWISE
    assert run.measured.tokens_per_s_per_gpu == 1664
    assert run.measured.model_tflops_per_gpu == 731
    keys = run.strategy_keys
    assert keys["virtual_pipeline_model_parallel_size"] == 5
    assert keys["sequence_parallel"] is True
    assert keys["use_distributed_optimizer"] is True
    assert keys["overlap_grad_reduce"] is True and keys["overlap_param_gather"] is True
    assert keys["fp8_format"] == "hybrid" and keys["fp8_recipe"] == "tensorwise"
    assert keys["fp8_param_gather"] is True
    # gbs x seq / (tokens/s/GPU x GPUs) = 256 x 8192 / (1664 x 64)
    assert run.measured_iteration_time_s() == pytest.approx(256 * 8192 / (1664 * 64), rel=1e-15)


def test_the_gb200_nvfp4_and_mxfp8_rows_carry_megatrons_keys() -> None:
    nvfp4 = _BY_ID["mbridge_26.04.01_DGX-GB200_LLAMA3_70B_64gpu_NVFP4_13"]
    assert nvfp4.generation is GpuGeneration.BLACKWELL
    assert nvfp4.recipe is PrecisionRecipe.NVFP4
    assert nvfp4.strategy_keys["fp4_format"] == "e2m1"
    assert nvfp4.strategy_keys["fp4_recipe"] == "nvfp4"
    assert "fp8_format" not in nvfp4.strategy_keys
    mxfp8 = _BY_ID["mbridge_26.04.01_DGX-GB200_LLAMA3_70B_64gpu_MXFP8_12"]
    assert mxfp8.recipe is PrecisionRecipe.MXFP8
    assert mxfp8.strategy_keys["fp8_format"] == "e4m3"
    assert mxfp8.strategy_keys["reuse_grad_buf_for_mxfp8_param_ag"] is True


#: NeMo container -> the Megatron-Bridge release branch whose performance configs the row's
#: recipe is read from (the fixture header).
_RELEASE_BRANCHES = {
    "25.09": "r0.1.0 @684a68616597c8097b17e089f91f86383d9e7b74",
    "25.11": "r0.2.0 @0465189601951c14ad592bd8eefbb673929e25bc",
    "26.02": "r0.3.0 @8301abfc0d5667cf7c681fb5d2c7d08c7db98c99",
    "26.02.01": "r0.3.0 @8301abfc0d5667cf7c681fb5d2c7d08c7db98c99",
    # the release tag: r0.4.0 changed two NVFP4 recipes after the 26.04 table (the fixture rows)
    "26.04": "v0.4.0 @0fbfe7d3e970fbd75c1281d71cee586ce1f3df5e",
    "26.04.01": "r0.4.0 @3743c703d187300568ca2bc5c0b30d4a205dbe53",
    "26.06": "r0.5.0 @f83545d981f32310d96c3614008a99389d7ccc71",
}


def _bridge_runs() -> list[ModernRun]:
    return [run for run in _RUNS if run.source is ModernSource.MEGATRON_BRIDGE]


def test_every_megatron_bridge_row_names_its_release_config() -> None:
    runs = _bridge_runs()
    assert len(runs) == 50
    for run in runs:
        container = run.framework.rsplit(" ", 1)[-1]
        expected = (
            f"NVIDIA-NeMo/Megatron-Bridge {_RELEASE_BRANCHES[container]}: scripts/performance/"
        )
        assert run.recipe_source.startswith(expected), run.id
        assert run.unkeyed_settings, run.id


def test_fp8_current_scaling_rows_keep_every_layer_in_fp8() -> None:
    """get_precision_config("fp8_cs") turns the recipe's BF16 first / last layers off in every
    release (utils/helpers.py r0.1.0 / r0.2.0, utils/precision.py r0.3.0-r0.5.0)."""
    tensorwise = [run for run in _bridge_runs() if run.recipe is PrecisionRecipe.FP8_TENSORWISE]
    assert len(tensorwise) == 32
    for run in tensorwise:
        assert run.strategy_keys["first_last_layers_bf16"] is False, run.id
        assert "num_layers_at_start_in_bf16" not in run.strategy_keys, run.id
        assert "num_layers_at_end_in_bf16" not in run.strategy_keys, run.id


def test_the_recipes_cuda_graphs_and_nvfp4_settings_are_transcribed() -> None:
    graphs = {
        run.id: (
            run.strategy_keys.get("cuda_graph_impl"),
            run.strategy_keys.get("cuda_graph_scope"),
            run.strategy_keys.get("enable_cuda_graph"),
        )
        for run in _bridge_runs()
        if {"cuda_graph_impl", "enable_cuda_graph"} & set(run.strategy_keys)
    }
    assert graphs.pop("mbridge_25.09_DGX-B200_LLAMA3_8B_8gpu_na_76") == (None, None, True)
    for run_id in (
        "mbridge_25.11_DGX-B200_LLAMA3_8B_8gpu_FP8-CS_68",
        "mbridge_25.11_DGX-GB200_LLAMA3_8B_8gpu_FP8-CS_65",
    ):
        assert graphs.pop(run_id) == ("local", "full_iteration", None)
    nvfp4 = {run.id for run in _bridge_runs() if run.recipe is PrecisionRecipe.NVFP4}
    assert len(nvfp4) == 9
    assert graphs == dict.fromkeys(nvfp4, ("none", None, None))
    for run_id in nvfp4:
        keys = _BY_ID[run_id].strategy_keys
        later = _BY_ID[run_id].recipe_source.split()[1] in {"r0.4.0", "r0.5.0"}
        assert keys.get("fp4_param_gather") is (True if later else None), run_id
        gb200_405b = "GB200_LLAMA3.1_405B" in run_id
        assert keys["overlap_param_gather"] is (not (later and gb200_405b)), run_id


def test_a_preset_whose_layout_differs_keeps_the_tables_layout() -> None:
    run = _BY_ID["mbridge_25.11_DGX-H100_LLAMA3_8B_8gpu_FP8-CS_70"]
    assert run.strategy_keys["use_megatron_fsdp"] is True
    assert "recompute_granularity" not in run.strategy_keys
    assert any("recompute_num_layers: 5" in item for item in run.unkeyed_settings)
    assert any("differs from the table's in fsdp" in item for item in run.unkeyed_settings)


def test_the_nemo_2407_rows_read_from_the_launcher_only_where_the_layout_matches() -> None:
    read = {run.id for run in _RUNS if run.source is ModernSource.NEMO_24_07 and run.recipe_source}
    assert read == {
        "nemo2407_GPT3-5B_64gpu",
        "nemo2407_LLAMA2-7B_8gpu",
        "nemo2407_LLAMA2-70B_64gpu",
        "nemo2407_LLAMA3-8B_8gpu",
    }
    for run_id in read:
        assert _BY_ID[run_id].recipe_source.startswith(
            "NVIDIA/NeMo-Framework-Launcher 24.07 @8325688d8345a5513660f0f8390f0482a721c009: "
        )
    assert _BY_ID["nemo2407_LLAMA2-70B_64gpu"].strategy_keys["tp_comm_overlap"] is True


def test_a_long_sequence_cp_row_reads_exactly() -> None:
    run = _BY_ID["nemo_longseq_llama2_7b_h100_s512k"]
    assert run.seq_length == 524288
    assert (run.tensor_parallel, run.pipeline_parallel, run.context_parallel) == (8, 1, 16)
    assert run.data_parallel == 4
    assert run.strategy_keys["cp_comm_type"] == "p2p"
    assert run.recipe is PrecisionRecipe.FP8_DELAYED
    assert run.measured.tokens_per_s_per_gpu is None
    assert run.flops_convention is FlopsConvention.MEGATRON_LEGACY


def _nemo_llama_flops(run: ModernRun) -> float:
    """NeMo's ``llama2`` model-FLOPs expression (nemo/utils/flops_formulas.py) without its causal
    halving, written out independently of analysis/flops.py."""
    model = run.base_model()
    s, layers, h = run.seq_length, model.num_layers, model.hidden_size
    groups, heads, ffn = model.num_query_groups, model.num_attention_heads, model.ffn_hidden_size
    vocab = model.vocab_size
    return (
        run.global_batch_size
        * s
        * layers
        * h
        * h
        * (12 + 12 * groups / heads + 18 * ffn / h + 12 * s / h + 6 * vocab / (layers * h))
    )


def test_a_tflops_only_row_is_timed_with_the_named_convention() -> None:
    run = _BY_ID["nemo_longseq_llama2_7b_h100_s4k"]
    expected = _nemo_llama_flops(run) / (768e12 * 4)
    assert run.measured_iteration_time_s() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "run_id",
    [
        "nemo2407_LLAMA2-7B_8gpu",
        "nemo2407_LLAMA2-13B_16gpu",
        "nemo2407_LLAMA2-70B_64gpu",
        "nemo2407_LLAMA3-8B_8gpu",
        "nemo2407_LLAMA3-70B_64gpu",
    ],
)
def test_the_nemo_pages_count_model_flops_over_the_full_score_matrix(run_id: str) -> None:
    """Why the long-sequence rows use megatron-legacy: the 24.07 page prints tokens/s and model
    TFLOP/s, and their ratio is the full-matrix count to 0.3% (the causal count is 6-10% lower)."""
    run = _BY_ID[run_id]
    tokens = run.global_batch_size * run.seq_length
    assert run.measured.tokens_per_s_per_gpu is not None
    assert run.measured.model_tflops_per_gpu is not None
    implied = run.measured.model_tflops_per_gpu * 1e12 / run.measured.tokens_per_s_per_gpu
    assert implied == pytest.approx(_nemo_llama_flops(run) / tokens, rel=0.003)


@pytest.mark.parametrize(
    ("keys", "recipe"),
    [
        ({"bf16": True}, PrecisionRecipe.BF16),
        ({"fp16": True}, PrecisionRecipe.FP16),
        ({"bf16": True, "fp8_format": "hybrid"}, PrecisionRecipe.FP8_DELAYED),
        ({"fp8": "hybrid", "fp8_recipe": "delayed"}, PrecisionRecipe.FP8_DELAYED),
        ({"fp8_format": "hybrid", "fp8_recipe": "tensorwise"}, PrecisionRecipe.FP8_TENSORWISE),
        ({"fp8_format": "e4m3", "fp8_recipe": "blockwise"}, PrecisionRecipe.FP8_BLOCKWISE),
        ({"fp8_format": "e4m3", "fp8_recipe": "mxfp8"}, PrecisionRecipe.MXFP8),
        ({"fp4_format": "e2m1"}, PrecisionRecipe.NVFP4),
        ({"fp4": "e2m1", "fp4_recipe": "nvfp4"}, PrecisionRecipe.NVFP4),
    ],
)
def test_precision_recipe_reads_megatrons_keys(
    keys: dict[str, str | bool], recipe: PrecisionRecipe
) -> None:
    assert precision_recipe(keys) is recipe


def test_an_unknown_recipe_is_named() -> None:
    with pytest.raises(ConfigError, match="fp8_recipe 'mxfp4' is not one of delayed"):
        precision_recipe({"fp8_format": "e4m3", "fp8_recipe": "mxfp4"})


def test_a_malformed_fixture_reports_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        "[[run]]\n"
        'id = "a"\nsource = "nemo_24.07_perf_summary"\nsystem = "dgx-a100-80gb"\n'
        'num_gpus = 0\nrecipe_source = 3\nunkeyed_settings = "cpu offloading"\n'
        '[run.strategy]\nfp8_format = "hybrid"\nfp8_recipe = "mxfp4"\n'
        "tensor_model_parallel_size = 1\nglobal_batch_size = 8\n"
        "[run.measured]\nmodel_tflops_per_gpu = 500\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_modern_runs(path)
    text = "\n".join(raised.value.problems)
    assert "system 'dgx-a100-80gb' is not one of" in text
    assert "num_gpus must be positive" in text
    assert "fp8_recipe 'mxfp4'" in text
    assert "needs model_tflops_per_gpu, a flops_convention and a model preset" in text
    assert "run 'a'.recipe_source must be a string, got 3" in text
    assert "run 'a'.unkeyed_settings must be a list of strings" in text


def test_an_empty_system_name_is_refused_by_name(tmp_path: Path) -> None:
    """Fuzz seed 1302 case 35387: ``system = ""`` passed the loader and failed in scoring."""
    path = tmp_path / "empty.toml"
    path.write_text(
        "[[run]]\n"
        'id = "a"\nsource = "nemo_24.07_perf_summary"\nsystem = ""\nnum_gpus = 8\n'
        "[run.strategy]\ntensor_model_parallel_size = 1\nglobal_batch_size = 8\n"
        "[run.measured]\ntokens_per_s_per_gpu = 500\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_modern_runs(path)
    assert any(
        problem.startswith("run 'a'.system '' is not one of dgx-b200, ")
        for problem in raised.value.problems
    )


def test_fixture_matches_the_shared_reference() -> None:
    reference = shared_reference()
    if reference is None:
        pytest.skip("shared/reference is absent (a fresh clone): nothing to compare with")
    records = {
        record["id"]: record
        for record in json.loads((reference / "modern_runs.json").read_text())
        if record["source_key"] in {source.value for source in ModernSource}
        and ModernSource(record["source_key"]) not in MOE_SOURCES
    }
    assert set(records) == set(_BY_ID)
    for run_id, record in records.items():
        run = _BY_ID[run_id]
        strategy, measured = record["strategy"], record["measured"]
        assert run.source.value == record["source_key"], run_id
        assert run.num_gpus == record["hardware"]["n_gpus"], run_id
        assert run.tensor_parallel == strategy["t"], run_id
        assert run.pipeline_parallel == strategy["p"], run_id
        assert run.context_parallel == strategy["cp"], run_id
        assert run.data_parallel == strategy["d"], run_id
        assert run.global_batch_size == strategy["global_batch"], run_id
        assert run.seq_length == record["model"]["s"], run_id
        if strategy["micro_batch"] is not None:
            assert run.strategy_keys["micro_batch_size"] == strategy["micro_batch"], run_id
        assert run.measured.tokens_per_s_per_gpu == measured.get("tokens_per_s_per_gpu"), run_id
        assert run.measured.model_tflops_per_gpu == measured.get("model_tflops_per_gpu"), run_id
        assert run.notes == tuple(record["notes"]), run_id
        model = run.base_model() if run.model_preset is not None else None
        if model is not None:
            assert (model.num_layers, model.hidden_size) == (
                record["model"]["L"],
                record["model"]["h"],
            ), run_id


# --------------------------------------------------------------------------------------------
# Scoring (a stand-in predictor: exact arithmetic)
# --------------------------------------------------------------------------------------------
def _stand_in(run: ModernRun) -> float:
    """10% slow on Hopper, 20% fast on Blackwell; FP4 runs refused."""
    if run.recipe is PrecisionRecipe.NVFP4:
        raise ConfigError(["unknown key 'fp4_format'"])
    factor = 1.1 if run.generation is GpuGeneration.HOPPER else 0.8
    return factor * run.measured_iteration_time_s()


def test_scoring_splits_the_error_by_generation_and_recipe() -> None:
    validation = compare_modern_runs(_stand_in, _RUNS)
    by_group = {(s.axis.value, s.group): s for s in validation.summaries}
    hopper = by_group[("generation", "hopper")]
    assert hopper.planned == hopper.rows == 34
    assert hopper.median_abs_error == pytest.approx(0.1, rel=1e-12)
    blackwell = by_group[("generation", "blackwell")]
    # 9 NVFP4 rows refused, the 2 inconsistent long-sequence rows excluded
    assert (blackwell.rows, blackwell.planned) == (45, 34)
    assert blackwell.max_abs_error == pytest.approx(0.2, rel=1e-12)
    nvfp4 = by_group[("recipe", "nvfp4")]
    assert (nvfp4.rows, nvfp4.planned, nvfp4.median_abs_error) == (9, 0, None)
    not_planned = validation.not_planned_rows
    assert {row.not_planned for row in not_planned} == {
        "unknown key 'fp4_format'",
        "excluded (inconsistent_layout): the reference flags its layout inconsistent",
    }
    assert validation.gate(ModernGate.MAX_ERROR).passed is True  # 0.2 <= 0.2
    assert validation.gate(ModernGate.MEDIAN_ERROR).passed is False  # 0.2 > 0.08
    # the gates count the 77 compared rows: 68 planned, the 9 NVFP4 ones not
    every = validation.gate(ModernGate.ALL_PLANNED)
    assert every.count == 77
    assert every.value == pytest.approx(68 / 77)
    # Through the JSON text, as a user of --json reads it.
    document = json.loads(json.dumps(modern_to_json_dict(validation)))
    assert document["planned_runs"] == 68 and document["not_planned_runs"] == 11
    (row,) = [r for r in document["rows"] if r["run"] == "nemo2407_LLAMA2-7B_8gpu"]
    assert (row["t"], row["p"], row["cp"], row["d"]) == (1, 1, 1, 8)
    assert row["recipe"] == "fp8-delayed" and row["generation"] == "hopper"
    assert row["relative_error"] == pytest.approx(0.1, rel=1e-12)


@pytest.mark.parametrize(
    ("framework", "release"),
    [
        ("Megatron-Bridge / Megatron-Core, NeMo container 26.02.01", "26.02.01"),
        ("Megatron-Bridge / Megatron-Core, NeMo container 25.09", "25.09"),
        ("NeMo 24.07 container (Megatron-core)", "24.07"),
        ("NeMo 24.03.01 (Megatron-Core)", "24.03.01"),
        ("NeMo 25.04.rc2 (Megatron-Core)", "25.04.rc2"),
        ("Megatron-Core", None),
    ],
)
def test_the_release_is_read_from_the_framework(framework: str, release: str | None) -> None:
    assert software_release(framework) == release


def test_releases_sort_in_time() -> None:
    releases = ["26.02.01", "25.04", "26.02", "25.04.rc2", "25.04.01", "24.07"]
    assert sorted(releases, key=release_order) == [
        "24.07",
        "25.04.rc2",
        "25.04",
        "25.04.01",
        "26.02",
        "26.02.01",
    ]


def test_every_dense_row_names_its_release() -> None:
    releases = {run.release for run in _RUNS}
    assert None not in releases
    assert sorted({r for r in releases if r is not None}, key=release_order) == [
        "24.03.01",
        "24.07",
        "25.04.rc2",
        "25.09",
        "25.11",
        "26.02",
        "26.02.01",
        "26.04",
        "26.04.01",
        "26.06",
    ]


def test_scoring_splits_the_error_by_release() -> None:
    """A stand-in 10% fast on the 26.x containers and exact before: the release split shows
    it group by group, oldest first, with the row counts of the fixture."""

    def stand_in(run: ModernRun) -> float:
        factor = 0.9 if (run.release or "").startswith("26.") else 1.0
        return factor * run.measured_iteration_time_s()

    validation = compare_modern_runs(stand_in, _RUNS)
    releases = [s for s in validation.summaries if s.axis.value == "release"]
    assert [(s.group, s.rows) for s in releases] == [
        ("24.03.01", 9),
        ("24.07", 12),
        ("25.04.rc2", 8),
        ("25.09", 8),
        ("25.11", 8),
        ("26.02", 8),
        ("26.02.01", 7),
        ("26.04", 7),
        ("26.04.01", 8),
        ("26.06", 4),
    ]
    by_group = {s.group: s for s in releases}
    assert by_group["25.11"].median_abs_error == 0.0
    assert by_group["26.04"].mean_error == pytest.approx(-0.1, rel=1e-12)
    document = json.loads(json.dumps(modern_to_json_dict(validation)))
    assert {row["release"] for row in document["rows"]} == {s.group for s in releases}


# --------------------------------------------------------------------------------------------
# The planner on the runs (held out: no efficiency is fitted on them)
# --------------------------------------------------------------------------------------------
#: The runs left out of the comparison, and why: two NeMo long-sequence B200 rows whose GPU
#: count and global batch disagree (the reference flags that table as inconsistent: d = 16 with
#: 8 or 4 sequences per step, which Megatron-LM refuses at start-up).
EXCLUDED = {
    "nemo_longseq_llama3_8b_b200_s512k": ModernExclusion.INCONSISTENT_LAYOUT,
    "nemo_longseq_llama3_8b_b200_s1024k": ModernExclusion.INCONSISTENT_LAYOUT,
}


def test_which_runs_are_excluded_and_why(planned: ModernValidation) -> None:
    """Every compared run plans; the excluded ones say so, and would not plan as printed."""
    assert len(planned.planned_rows) == 77
    assert {run.id: run.excluded for run in _RUNS if run.excluded} == EXCLUDED
    refused = {row.run_id: row.not_planned for row in planned.not_planned_rows}
    assert set(refused) == set(EXCLUDED)
    for run_id, reason in EXCLUDED.items():
        assert refused[run_id].startswith(f"excluded ({reason})")
        with pytest.raises(BlueprintingError) as raised:
            api_modern_predictor()(_BY_ID[run_id])
        assert planner_message(raised.value).startswith("[planner] local_batch")
    assert planned.gate(ModernGate.ALL_PLANNED).passed


def test_an_exclusion_that_does_not_hold_is_refused(tmp_path: Path) -> None:
    """A reason the run does not meet is a fixture error naming the rule and the values."""
    text = default_fixture_path().read_text()
    run_id = "nemo_longseq_llama3_8b_b200_s256k"  # d = 16, gbs 16: it plans
    start = text.index(f'id = "{run_id}"')
    cut = text.index("dp_table = 4\n", start) + len("dp_table = 4\n")
    bad = tmp_path / "modern.toml"
    bad.write_text(text[:cut] + 'excluded = "inconsistent_layout"\n' + text[cut:])
    with pytest.raises(ConfigError) as raised:
        load_modern_runs(bad)
    message = "; ".join(raised.value.problems)
    assert run_id in message and "divides over micro_batch_size x d = 1 x 16" in message
    typo = tmp_path / "typo.toml"
    typo.write_text(
        text.replace('excluded = "inconsistent_layout"', 'excluded = "inconsistent"', 1)
    )
    with pytest.raises(ConfigError):
        load_modern_runs(typo)


def test_a_known_regression_names_its_source(tmp_path: Path) -> None:
    """``known_regression`` needs an ``exclusion_reason`` (where the publisher says so), and a
    reason needs an exclusion; the excluded row's note is its reason."""
    text = default_fixture_path().read_text()
    run_id = "nemo_longseq_llama3_8b_b200_s256k"
    start = text.index(f'id = "{run_id}"')
    cut = text.index("dp_table = 4\n", start) + len("dp_table = 4\n")
    bare = tmp_path / "bare.toml"
    bare.write_text(text[:cut] + 'excluded = "known_regression"\n' + text[cut:])
    with pytest.raises(ConfigError) as raised:
        load_modern_runs(bare)
    assert raised.value.problems == (
        f"run {run_id!r}: excluded = known_regression needs an exclusion_reason quoting where "
        "the source names the regression",
    )
    stray = tmp_path / "stray.toml"
    stray.write_text(text[:cut] + 'exclusion_reason = "a footnote"\n' + text[cut:])
    with pytest.raises(ConfigError) as raised:
        load_modern_runs(stray)
    assert raised.value.problems == (f"run {run_id!r}: exclusion_reason without excluded",)
    sourced = tmp_path / "sourced.toml"
    sourced.write_text(
        text[:cut]
        + 'excluded = "known_regression"\nexclusion_reason = "the footnote, line 9"\n'
        + text[cut:]
    )
    run = next(r for r in load_modern_runs(sourced) if r.id == run_id)
    # inconsistent_layout's reason is its rule: a free-text reason there is refused, not dropped
    layout_id = "nemo_longseq_llama3_8b_b200_s512k"
    at = text.index('excluded = "inconsistent_layout"', text.index(f'id = "{layout_id}"'))
    reasoned = tmp_path / "reasoned.toml"
    reasoned.write_text(text[:at] + 'exclusion_reason = "why"\n' + text[at:])
    with pytest.raises(ConfigError) as raised:
        load_modern_runs(reasoned)
    assert raised.value.problems == (
        f"run {layout_id!r}: exclusion_reason is for known_regression; inconsistent_layout is "
        "checked by its rule",
    )
    assert run.excluded is ModernExclusion.KNOWN_REGRESSION
    assert run.exclusion_message() == "excluded (known_regression): the footnote, line 9"


def test_the_planned_runs_stay_within_todays_bounds(planned: ModernValidation) -> None:
    """Regression bound, not the issue gate (no efficiency is fitted on these runs). Today:
    median |error| 10.8% over 77 runs, nearly all predicted fast (mean -9.7%; Blackwell median
    12.7%, Hopper 6.1%). Ring collectives across NVLink domains use every member's NIC
    (``SystemSpec.collective_time``): the Megatron-FSDP Llama 3.1 405B run on two GB200 racks
    went from +297% (its ZeRO-3 gathers and fp32 gradient reduce-scatters flat on one NIC) to
    -21.9%, GPT-3 20B from +45% to -20.7%; the recipes' quantization kernels
    (``PhaseCost.quantize_s``) then moved every low-precision row slower (median 15.0% ->
    12.5%), the cast rates fitted on TE's B300 benchmark and the MXFP8 GEMM fit on the cuBLAS
    MXFP8 squares to 11.6% (max 29.9%), the block-scaled NVFP4 GEMM figures (GB200: B200's
    torchao fit; B300 / GB300: TE's B300 GEMMs) to 10.8% (max 25.4%, Blackwell median 12.7%).
    Transcribing each Megatron-Bridge row's release config (the FP8-CS rows' BF16 first / last
    layers off, the presets' CUDA graphs, NVFP4 parameter gathers) and the matching NeMo 24.07
    launcher configs moved them faster still: median 11.4%, max 25.5% (the B200 405B 25.11
    row), Hopper median 6.8%, Blackwell 12.7%, mean -10.7%. Blackwell's GEMMs at their
    shape-resolved fits instead of MAMF's best shape (B200 fp8 0.76 -> the MXFP8 fit; GB200 bf16
    0.73 -> B200's torch.mm fit): median 10.6%, max 25.0% (the GB200 70B NVFP4 26.02 row; the
    B200 405B rows -25.9% -> -11.3%), Blackwell 11.6%, mean -9.7%; with GB200's bf16, MXFP8
    and NVFP4 fits moved from B200's by the measured MAMF ceilings (presets.transferred_fit):
    median 8.8%, max 23.0% (the GB200 70B NVFP4 26.02 row), Blackwell 9.2%, mean -9.0%. With a
    LayerNormLinear's input cast in a pass of its own under every recipe but delayed scaling
    (TE normalization.cpp writes it quantized only for a Float8Quantizer), on the rank's s/t rows
    under sequence parallelism: median 8.4%, max 22.4%, Blackwell 9.0%, mean -8.8%. With the
    sequence-parallel all-gathers of TE linears carrying the quantized tensor (TE
    ``gather_along_first_dim``), each row-parallel output gradient cast on the rank's s/t rows
    and, for per-tensor FP8 on Hopper, the transposes TE makes after a rowwise gather: median
    9.3%, max 25.3% (the GB200 70B NVFP4 26.02 row, t2 without userbuffer overlap), Hopper
    8.9%, Blackwell 9.5%, mean -9.9%: the bytes the model had charged in bf16 hid part of what
    it still misses. With the shared experts' gathered input and the delayed-scaling norm's
    Hopper transpose costed, and MXFP8's second (columnwise) output-gradient gather through
    userbuffers hidden as the first: median 9.5%, max 25.3%, Blackwell 10.0%, mean -10.0%; with
    the TP amax all-reduces of current scaling and NVFP4 under SP: max 24.7%, mean -9.9%."""
    errors = {row.run_id: abs(row.relative_error or 0.0) for row in planned.planned_rows}
    assert statistics.median(errors.values()) <= 0.1
    fsdp = "mbridge_25.09_DGX-GB200_LLAMA3.1_405B_128gpu_na_75"
    assert errors[fsdp] <= 0.22
    assert errors["mbridge_25.11_DGX-B200_LLAMA3.1_405B_128gpu_FP8-CS_69"] <= 0.12
    assert max(errors.values()) <= 0.26
    hopper = [
        errors[row.run_id] for row in planned.planned_rows if row.generation is GpuGeneration.HOPPER
    ]
    assert statistics.median(hopper) <= 0.095


@pytest.mark.xfail(
    strict=True,
    reason=(
        "77 of 77 compared runs planned: median |error| 11.4% (limit 8%), max 25.5% (limit "
        "20%), 7 runs beyond 20%, all predicted fast: the B200 405B rows (-25.2%, -25.5%), "
        "the GB200 Llama 3 70B NVFP4 26.02 rows (-23.7%, -25.4%), the Megatron-FSDP 405B "
        "GB200 row (-20.9%), NeMo Llama 3 8B B200 8k (-22.8%) and Nemotron 8B (-20.9%); "
        "Blackwell median 12.7% (its attention rates rest on one in-step point: "
        "hardware/attention.py)"
    ),
)
def test_issue_gate_on_the_planned_runs(planned: ModernValidation) -> None:
    median = planned.gate(ModernGate.MEDIAN_ERROR)
    largest = planned.gate(ModernGate.MAX_ERROR)
    assert median.count == len(planned.planned_rows) > 0
    assert median.value is not None and median.value <= MEDIAN_ERROR_LIMIT
    assert largest.value is not None and largest.value <= MAX_ERROR_LIMIT


@pytest.mark.xfail(
    strict=True,
    reason=(
        "every compared dense run plans (the two long-sequence rows the reference flags "
        "inconsistent are excluded by name), but the median and max accuracy gates fail (see "
        "test_issue_gate_on_the_planned_runs)"
    ),
)
def test_full_issue_gate_every_dense_run(planned: ModernValidation) -> None:
    assert planned.gate(ModernGate.ALL_PLANNED).passed
    assert planned.passed


def test_a_zero_degree_is_refused_by_name(tmp_path: Path) -> None:
    """Fuzz seed 1305 case 830: ``context_parallel_size = 0`` passed the loader, and the
    scoring divided the GPU count by it to name the row's data-parallel size."""
    path = tmp_path / "zero.toml"
    path.write_text(
        "[[run]]\n"
        'id = "a"\nsource = "nemo_24.07_perf_summary"\nsystem = "dgx-h100"\nnum_gpus = 8\n'
        "[run.strategy]\ntensor_model_parallel_size = 0\nglobal_batch_size = 8\n"
        "pipeline_model_parallel_size = 0\ncontext_parallel_size = -2\n"
        "[run.measured]\ntokens_per_s_per_gpu = 500\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_modern_runs(path)
    assert [p for p in raised.value.problems if "must be positive" in p] == [
        "run 'a'.strategy.tensor_model_parallel_size must be positive, got 0",
        "run 'a'.strategy.pipeline_model_parallel_size must be positive, got 0",
        "run 'a'.strategy.context_parallel_size must be positive, got -2",
    ]
