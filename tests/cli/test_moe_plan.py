"""Issue 13's done-when: DeepSeek-V3 as its technical report trained it (2,048 H800, PP16 x
EP64, ZeRO-1 DP, FP8), planned from the preset; the MoE search refused by name."""

from __future__ import annotations

import json

import pytest

from blueprinting.cli.main import main

_DSV3 = [
    "--model",
    "deepseek-v3",
    "--system",
    "dgx-h800",
    "--gpus",
    "2048",
    "--set",
    "pipeline_model_parallel_size=16",
    "--set",
    "expert_model_parallel_size=64",
    "--set",
    "global_batch_size=15360",
    "--set",
    "use_distributed_optimizer=true",
    "--set",
    "fp8=e4m3",
]


def test_deepseek_v3_as_written_names_the_61_layers_on_16_stages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", *_DSV3]) == 1
    err = capsys.readouterr().err
    assert "blocks_per_pipeline_stage = 61 / 16 is not integral" in err


def test_deepseek_v3_plans_with_the_uneven_first_stage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", *_DSV3, "--set", "decoder_first_pipeline_num_layers=1", "--set"]
    assert main([*args, "moe_token_dispatcher_type=alltoall", "--json", "--no-simulate"]) == 0
    report = json.loads(capsys.readouterr().out)
    terms = report["time_breakdown_s"]
    assert terms["ep_comm_exposed"] > 0
    assert report["ep_comm"]["expert_model_parallel_size"] == 64
    assert report["ep_comm"]["expert_data_parallel_size"] == 2  # 2048 / (1 x 64 x 16)
    assert report["ep_comm"]["moe_layers_on_critical_stage"] == 4
    expert = report["memory_bytes"]["expert"]
    assert expert["weights"] > 0 and expert["dense_weights"] > 0
    # 4 MoE layers of 256 / 64 experts, 3 x 7168 x 2048 weights each, bf16
    assert expert["weights"] == 4 * (256 // 64) * 3 * 7168 * 2048 * 2
    # the distributed optimizer's 12 bytes per expert parameter over expert-dp 2
    assert expert["optimizer_states"] == 4 * (256 // 64) * 3 * 7168 * 2048 * 12 // 2
    flags = " ".join(report["megatron_args"])
    assert "--expert-model-parallel-size 64" in flags
    assert "--moe-token-dispatcher-type alltoall" in flags


def test_search_ranks_moe_strategies(capsys: pytest.CaptureFixture[str]) -> None:
    """Mixtral 8x7B on 16 H100: the expert grid is an axis; every listed strategy is re-planned
    by the scalar planner (search --json), and ep and the dispatcher come from the flags."""
    args = ["search", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--gpus", "16"]
    flags = ["--global-batch", "8", "--max-micro-batch", "1", "--top", "3", "--json"]
    dispatch = ["--expert-parallel", "2", "8", "--dispatcher", "alltoall", "flex-deepep"]
    assert main([*args, *flags, *dispatch]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["ranked"]) == 3
    for entry in out["ranked"]:
        assert " ep=2 " in entry["strategy_text"] or " ep=8 " in entry["strategy_text"]
        assert "dispatcher=" in entry["strategy_text"]
    assert out["rejections"]["experts_per_expert_rank"] == 0
    assert main([*args, *flags, "--dispatcher", "flex-deepep+overlap", "alltoal"]) == 2
    err = capsys.readouterr().err
    assert "--dispatcher: unknown dispatcher 'alltoal'" in err and "alltoall" in err
