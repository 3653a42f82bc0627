"""``blueprinting check`` and ``blueprinting presets``: golden outputs and exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from blueprinting.cli.main import main

REPO = Path(__file__).resolve().parents[2]
GPT3 = str(REPO / "examples" / "gpt3-175b-selene.toml")
LLAMA = str(REPO / "examples" / "llama2-70b-h100.toml")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err.replace(str(REPO) + "/", "")


def test_check_lawful_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "check", GPT3) == (
        0,
        "ok: gpt3-175b: TP8(rs+ag) PP8(1F1B x3) DP16(dist-opt) recompute=selective  "
        "[world_size=1024 global_batch=1536 micro_batch=1 microbatches=96]\n",
        "",
    )
    assert _run(capsys, "check", LLAMA) == (
        0,
        "ok: llama2-70b: TP8(rs+ag) PP4(1F1B x5) DP16(dist-opt) recompute=selective  "
        "[world_size=512 global_batch=1024 micro_batch=1 microbatches=64]\n",
        "",
    )


def test_check_lists_every_violation(capsys: pytest.CaptureFixture[str]) -> None:
    overrides = (
        "pipeline_model_parallel_size=5",
        "world_size=1600",
        "global_batch_size=1000",
        "num_attention_heads=100",
        "microbatch_group_size_per_vp_stage=30",
    )
    code, out, err = _run(capsys, "check", GPT3, *(x for o in overrides for x in ("--set", o)))
    assert (code, out) == (1, "")
    assert err == (
        "checking gpt3-175b: TP8(rs+ag) PP5(1F1B x3 N30) DP40(dist-opt) recompute=selective: "
        "6 law(s) violated:\n"
        "  - [planner] blocks_per_pipeline_stage: blocks_per_pipeline_stage = 96 / 5 is not "
        "integral; Megatron-LM runs it uneven with decoder_first_pipeline_num_layers = 21 and "
        "decoder_last_pipeline_num_layers = 21 (21/18/18/18/21)\n"
        "  - [planner] blocks_per_virtual_chunk: blocks_per_virtual_chunk = 96 / (5 * 3) is not "
        "integral; Megatron-LM runs it with pipeline_model_parallel_layout = "
        "'Et*6|(t*7|)*7(t*6|)*6t*5L' (the embedding, the loss one layer each, spread evenly; "
        "it sets v, in place of the virtual stage count)\n"
        "  - [planner] attention_heads_per_tensor_rank: attention_heads_per_tensor_rank = "
        "100 / 8 is not integral\n"
        "  - [planner] query_groups_vs_tensor: num_query_groups = 100 is not divisible by t = 8 "
        "(Megatron-Core splits the K/V heads over the TP ranks: attention.py "
        "divide(num_query_groups, t))\n"
        "  - [planner] hidden_per_head: kv_channels = 12288 / 100 is not integral\n"
        "  - [megatron] microbatch_group_bounds: p <= N <= m fails: 5 <= 30 <= 25\n"
    )


def test_check_without_megatron_rules(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        capsys,
        "check",
        GPT3,
        "--set",
        "num_virtual_stages_per_pipeline_rank=4",
        "--set",
        "global_batch_size=80",
        "--no-megatron-rules",
    )
    assert (code, err) == (0, "")
    assert out == (
        "ok: gpt3-175b: TP8(rs+ag) PP8(1F1B x4) DP16(dist-opt) recompute=selective  "
        "[world_size=1024 global_batch=80 micro_batch=1 microbatches=5] (planner laws only)\n"
    )
    code, _, err = _run(
        capsys,
        "check",
        GPT3,
        "--set",
        "num_virtual_stages_per_pipeline_rank=4",
        "--set",
        "global_batch_size=80",
    )
    assert code == 1
    assert "[megatron] microbatch_group_bounds: p <= N <= m fails: 8 <= 8 <= 5" in err


def test_check_unknown_key_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "check", GPT3, "--set", "tensor_parallel_size=4") == (
        2,
        "",
        "invalid configuration in examples/gpt3-175b-selene.toml:\n"
        "  - unknown key 'tensor_parallel_size' (did you mean 'tensor_model_parallel_size'?)\n",
    )


def test_check_world_size_law_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "check", GPT3, "--set", "world_size=1000") == (
        1,
        "",
        "checking degrees t=8 p=8 world_size=1000: 1 law(s) violated:\n"
        "  - [planner] world_size: d = world_size / (t * p) = 1000 / (8 * 8) is not integral\n",
    )


def test_check_malformed_file_exits_2_without_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[training\nx = "')
    code, out, err = _run(capsys, "check", str(bad))
    assert (code, out) == (2, "")
    assert err.startswith(f"invalid configuration in {bad}:\n  - malformed toml: ")
    assert "Traceback" not in err
    code, _, err = _run(capsys, "check", str(tmp_path / "missing.toml"))
    assert code == 2
    assert err == (
        f"invalid configuration in {tmp_path / 'missing.toml'}:\n"
        "  - cannot read file: No such file or directory\n"
    )


def test_check_expert_parallelism_of_a_dense_model_breaks_a_law(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _run(capsys, "check", GPT3, "--set", "expert_model_parallel_size=2") == (
        1,
        "",
        "checking gpt3-175b: TP8(rs+ag) PP8(1F1B x3) DP16(dist-opt) EP2xETP1(alltoall) "
        "recompute=selective: 1 law(s) violated:\n"
        "  - [planner] expert_parallel_needs_moe: expert_model_parallel_size = 2 and "
        "expert_tensor_parallel_size = 1 need a mixture-of-experts model; 'gpt3-175b' has "
        "dense feed-forward layers (Megatron-LM arguments.py l.1655-1658: the experts must be "
        "set for ep > 1)\n",
    )


def test_check_deepseek_v3_with_p15_and_ep48_lists_both_laws_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 13, "Done when": 61 layers over 15 stages and 256 experts over 48 ranks in one
    report, with the two world-size laws the layout also breaks."""
    code, out, err = _run(
        capsys,
        "check",
        "--model",
        "deepseek-v3",
        "--gpus",
        "2048",
        "--system",
        "dgx-h800",
        "--set",
        "pipeline_model_parallel_size=15",
        "--set",
        "expert_model_parallel_size=48",
        "--set",
        "global_batch_size=15360",
    )
    assert (code, out) == (1, "")
    assert err == (
        "checking degrees t=1 p=15 world_size=2048: 4 law(s) violated:\n"
        "  - [planner] world_size: d = world_size / (t * p) = 2048 / (1 * 15) is not integral\n"
        "  - [planner] blocks_per_pipeline_stage: blocks_per_pipeline_stage = 61 / 15 is not "
        "integral; Megatron-LM runs it uneven with decoder_first_pipeline_num_layers = 5 "
        "(5/4/4/4/4/4/4/4/4/4/4/4/4/4/4)\n"
        "  - [planner] experts_per_expert_rank: num_experts = 256 is not divisible by "
        "expert_model_parallel_size = 48: an expert rank would hold 5.33333 experts "
        "(Megatron-LM arguments.py l.1655-1658, moe_layer.py l.184-187)\n"
        "  - [planner] expert_world_size: world_size = 2048 is not divisible by etp * ep * p = "
        '1 * 48 * 15 = 720 (Megatron-LM parallel_state.py l.874-884: "not divisible by '
        'expert_tensor_model_pipeline_parallel size"): the expert grid etp x ep x expert-dp '
        "does not tile the ranks of a pipeline stage\n"
    )


def test_check_deepseek_v3_as_trained(capsys: pytest.CaptureFixture[str]) -> None:
    """PP16 x EP64 on 2048 H800 with a 16-stage layout for the 61 layers: lawful; the
    dispatcher options contradicting their variant are refused by name."""
    layout = "Et*3|" + "t*4|" * 14 + "t*2L"
    args = [
        "check",
        "--model",
        "deepseek-v3",
        "--gpus",
        "2048",
        "--system",
        "dgx-h800",
        "--set",
        "pipeline_model_parallel_size=16",
        "--set",
        f"pipeline_model_parallel_layout={layout}",
        "--set",
        "expert_model_parallel_size=64",
        "--set",
        "global_batch_size=15360",
        "--set",
        "use_distributed_optimizer=true",
        "--set",
        "moe_token_dispatcher_type=alltoall",
        "--set",
        "moe_grouped_gemm=true",
    ]
    code, out, err = _run(capsys, *args)
    assert (code, err) == (0, "")
    assert out.startswith("ok: deepseek-v3: TP1(ar) PP16(1F1B layout(")
    assert "DP128(dist-opt) EP64xETP1(alltoall) recompute=none" in out
    code, out, err = _run(capsys, *args, "--set", "moe_flex_dispatcher_backend=hybrdep")
    assert (code, out) == (2, "")
    assert err == (
        "invalid configuration:\n"
        "  - moe_flex_dispatcher_backend must be one of deepep, hybridep, ncclep, got "
        "'hybrdep' (did you mean 'hybridep'?)\n"
    )
    code, out, err = _run(capsys, *args, "--set", "moe_flex_dispatcher_backend=hybridep")
    assert (code, out) == (2, "")
    assert err == (
        "invalid configuration:\n"
        "  - moe_flex_dispatcher_backend = hybridep is read only with "
        "moe_token_dispatcher_type = flex, got alltoall (Megatron-LM transformer_config.py "
        "l.1743-1791)\n"
    )


def test_check_refuses_an_unknown_system_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "check", GPT3)[0] == 0
    assert _run(capsys, "check", GPT3, "--set", "system.preset=dgx-a100-08gb") == (
        2,
        "",
        "invalid configuration in examples/gpt3-175b-selene.toml:\n"
        "  - system.preset: unknown system 'dgx-a100-08gb' (did you mean 'dgx-a100-80gb'?); "
        "presets: dgx-a100-40gb, dgx-a100-80gb, dgx-h100, dgx-h200, dgx-h800, dgx-b200, dgx-b300, "
        "dgx-gb200, dgx-gb300, mi300x-8\n",
    )


def test_check_refuses_what_plan_refuses_in_the_system_section(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A misspelt [system] key: check used to say ok while plan refused the file."""
    args = (GPT3, "--set", "system.gpus_per_nod=4")
    check = _run(capsys, "check", *args)
    plan = _run(capsys, "plan", *args)
    assert check[0] == plan[0] == 2
    assert "gpus_per_nod" in check[2]
    assert check[2] == plan[2]


def test_presets_lists_models(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "presets", "models")
    assert (code, err) == (0, "")
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("│")}
    assert rows["gpt3-175b"][2:] == [
        "│", "96", "│", "12288", "│", "96", "│", "96", "│", "49152", "│", "2048", "│",
        "51200", "│", "174.62B", "│", "175.00B", "│", "-0.22%", "│", "│", "│", "│",
    ]  # fmt: skip
    assert rows["llama3-405b"][-7:] == ["405.85B", "│", "+0.00%", "│", "│", "│", "│"]
    assert len(rows) == 30


def test_presets_lists_systems(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "presets", "systems")
    assert code == 0
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("│")}
    assert set(rows) == {
        "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200", "dgx-h800", "dgx-b200",
        "dgx-b300", "dgx-gb200", "dgx-gb300", "mi300x-8",
    }  # fmt: skip
    # A100 SXM datasheet: 312 TFLOP/s bf16 dense, 2.04 TB/s, 300 GB/s NVLink per direction; NVML's
    # total 81,920 MiB less the driver's 834 MiB = 79.2 GiB (presets.NVML_TOTAL_MIB,
    # DRIVER_RESERVED_MIB)
    assert rows["dgx-a100-80gb"][5:18:2] == ["8", "8", "312", "79.2", "2.04", "300", "25"]
    # GB200 NVL72: 4 GPUs per tray, 72 per NVLink domain, 2.5 PF bf16, 13.4 TB / 72, 8 TB/s,
    # 900 GB/s NVLink per direction, one 400 Gb/s NIC per GPU (modern_parallelism.md 3.6-3.7);
    # 13.4e12 / 72 bytes = 173.3 GiB.
    assert rows["dgx-gb200"][5:18:2] == ["4", "72", "2,500", "173.3", "8.00", "900", "50"]
    # H800: NVLink 400 GB/s bidirectional = 200 per direction; H100's 81,559 - 551 MiB = 79.1 GiB.
    assert rows["dgx-h800"][5:18:2] == ["8", "8", "989", "79.1", "3.35", "200", "50"]
    code, out, _ = _run(capsys, "presets")
    assert "Model presets" in out
    assert "System presets" in out


def test_presets_models_lists_the_moe_presets(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "presets", "models")
    assert code == 0
    cells = {
        row[1]: row[1:-1]
        for row in ([c.strip() for c in line.split("│")] for line in out.splitlines())
        if len(row) > 2
    }
    # E/k, active (owner's convention), published active
    assert cells["deepseek-v3"][-3:] == ["256/8", "36.63B", "37.00B"]
    assert cells["gpt-oss-120b"][-3:] == ["128/4", "5.13B", "5.13B"]
    assert cells["mixtral-8x7b"][-3:] == ["8/2", "12.88B", "12.90B"]
    assert cells["llama3-8b"][-3:] == ["", "", ""]
    rows = cells
    for name in ("deepseek-v2-lite", "kimi-k2", "mixtral-8x22b", "qwen3-30b-a3b",
                 "qwen3-235b-a22b", "gpt-oss-20b"):  # fmt: skip
        assert name in rows
