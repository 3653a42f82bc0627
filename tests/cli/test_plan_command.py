"""`blueprinting plan`: text and JSON outputs, overrides, and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blueprinting.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt3-175b-selene.toml"


def test_plan_json_from_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["world_size"] == 1024
    assert data["iteration_time_s"] == pytest.approx(sum(data["time_breakdown_s"].values()))
    assert data["strategy"]["tensor_model_parallel_size"] == 8


def test_set_overrides_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--json", "--set", "tensor_model_parallel_size=4"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["strategy"]["tensor_model_parallel_size"] == 4
    assert data["world_size"] == 1024


def test_plan_without_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--model",
            "gpt3-175b",
            "--system",
            "dgx-a100-80gb",
            "--gpus",
            "1024",
            "--set",
            "tensor_model_parallel_size=8",
            "--set",
            "pipeline_model_parallel_size=16",
            "--set",
            "global_batch_size=1536",
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"] == "TP8(ar) PP16(1F1B) DP8(no-shard) recompute=none"


def test_text_report_names_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    for needle in ("Iteration time", "pipeline_bubble", "Memory per GPU", "MFU", "megatron-lm"):
        assert needle in out


def test_illegal_override_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--set", "pipeline_model_parallel_size=7"]) == 1
    err = capsys.readouterr().err
    # Every law at once: d = 1024 / 56 is not integral, and neither are 96 / 7 and 96 / 21.
    assert "d = world_size / (t * p) = 1024 / (8 * 7) is not integral" in err
    assert "blocks_per_pipeline_stage = 96 / 7 is not integral" in err
    assert "blocks_per_virtual_chunk = 96 / (7 * 3) is not integral" in err
    args = ["plan", str(EXAMPLE), "--set", "num_virtual_stages_per_pipeline_rank=5"]
    assert main(args) == 1
    assert "blocks_per_virtual_chunk" in capsys.readouterr().err  # 96 / (8 * 5)


def test_unknown_key_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--set", "tensor_model_paralel_size=4"]) == 2
    assert "tensor_model_parallel_size" in capsys.readouterr().err


def test_no_simulate_gives_the_analytic_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--json", "--no-simulate"]) == 0
    bubble = json.loads(capsys.readouterr().out)["bubble"]
    assert bubble["simulated_s"] is None
    assert bubble["used"] == "contract"
    assert "simulation turned off" in bubble["simulation_note"]


def test_nested_system_override_reaches_the_memory_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", str(EXAMPLE), "--json", "--set", "system.accelerator.hbm.capacity_bytes=20e9"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_bytes"]["capacity"] == 20_000_000_000
    assert data["fits_in_memory"] is False  # 30.4 GiB per GPU does not fit in 20 GB


def test_unknown_system_preset_is_reported_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--system", "dgx-z100"]) == 2
    err = capsys.readouterr().err
    assert "unknown system 'dgx-z100' (did you mean 'dgx-h100'?)" in err
    assert "missing key" not in err


def test_a_strategy_megatron_refuses_gets_no_flags_and_the_reasons(
    capsys: pytest.CaptureFixture[str],
) -> None:
    zb = ["--set", "num_virtual_stages_per_pipeline_rank=1", "--set", "pipeline_schedule=zb-h1"]
    assert main(["plan", str(EXAMPLE), *zb]) == 1
    assert "megatron_schedule_supported" in capsys.readouterr().err
    assert main(["plan", str(EXAMPLE), *zb, "--no-megatron-rules", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["megatron_args"] == []
    assert len(data["megatron_refusals"]) == 1
    assert data["megatron_refusals"][0].startswith("[megatron] megatron_schedule_supported")


def test_names_with_rich_markup_print_as_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A model named with square brackets (fuzz seed 1342 case 2130: "[/ ]#]cb") prints as
    written in the text reports of plan and simulate, not read as rich markup."""
    strategy = tmp_path / "s.json"
    strategy.write_text(
        json.dumps(
            {
                "model": {"preset": "gpt-1.7b", "model_name": "[/bold]#]cb"},
                "training": {
                    "tensor_model_parallel_size": 8,
                    "world_size": 1024,
                    "micro_batch_size": 1,
                    "global_batch_size": 1536,
                },
                "system": {"preset": "dgx-a100-40gb"},
            }
        )
    )
    for command in ("plan", "simulate"):
        assert main([command, str(strategy)]) == 0
        assert "[/bold]#]cb on 1024 x" in capsys.readouterr().out


def test_the_text_report_splits_dp_comm_exposed(capsys: pytest.CaptureFixture[str]) -> None:
    """The data-parallel line: link time, its unhidden part, and the compute the hidden part
    slows; the last two sum to dp_comm_exposed (JSON ``dp_comm``)."""
    argv = [
        *("--model", "llama3-70b", "--system", "dgx-h100", "--gpus", "64"),
        *("--set", "tensor_model_parallel_size=4", "--set", "global_batch_size=128"),
        *("--set", "use_distributed_optimizer=true", "--set", "overlap_grad_reduce=true"),
        *("--set", "overlap_param_gather=true"),
    ]
    assert main(["plan", *argv, "--json"]) == 0
    dp = json.loads(capsys.readouterr().out)["dp_comm"]
    assert main(["plan", *argv]) == 0
    text = " ".join(capsys.readouterr().out.split())
    unhidden = dp["exposed_s"] - dp["sm_contention_s"]
    assert (
        f"data parallel: collectives {dp['link_s']:.4f} s on the link, {unhidden:.4f} s of them "
        f"exposed; {dp['sm_contention_s']:.4f} s the compute their hidden part slows" in text
    )
