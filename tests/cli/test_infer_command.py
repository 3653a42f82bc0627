"""``blueprinting infer``: text report, --json keys, --search, wrong file kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blueprinting.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SERVING = ROOT / "examples" / "llama2-70b-h100-serving.toml"
TRAINING = ROOT / "examples" / "llama2-70b-h100.toml"


def test_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["infer", str(SERVING)]) == 0
    out = capsys.readouterr().out
    assert "prefill latency = time to first token" in out
    assert "decode latency per token, mean" in out
    assert "largest batch that fits: 296" in out


def test_largest_batch_296_by_hand() -> None:
    """Llama 2 70B, t = 8, p = 1, prompt 2048 + 256 generated, bf16, on an 80 GB H100 (NVML's
    total 81,559 MiB less the driver's 551 MiB reserve = 81,008 MiB = 84,943,044,608 B:
    presets.NVML_TOTAL_MIB, DRIVER_RESERVED_MIB).

    Weights per GPU: 80 blocks x 106,971,136 (test_memory.py's Llama t = 8 block) + the word
    embedding and the untied LM head (32000 x 8192 / 8 each) + the final norm 8192, x 2 B =
    17,246,470,144 B. Per sequence: KV cache 2 x 80 layers x 1 group x 128 x 2304 tokens x 2 B =
    94,371,840 B; activations (one microbatch of the whole batch) the residual stream 2048 x
    8192 x 2 B plus the largest op, a residual add (reads two streams, writes one: 3 x that) =
    4 x 33,554,432 = 134,217,728 B. So total(b) = 17,246,470,144 + 228,589,568 b, and
    (84,943,044,608 - 17,246,470,144) / 228,589,568 = 296.15: 296 fits, 297 does not.
    """
    from blueprinting.hardware.presets import system_preset
    from blueprinting.inference.memory import memory_per_gpu
    from blueprinting.mapping.config_file import load_config
    from blueprinting.synthesizer.dialects.transformer.inference_derivation import (
        derive_inference_plan,
    )

    weights = 2 * (80 * 106_971_136 + 2 * 32000 * 8192 // 8 + 8192)
    assert weights == 17_246_470_144
    kv = 2 * 80 * 1 * 128 * (2048 + 256) * 2
    activations = 4 * 2048 * 8192 * 2
    per_sequence = kv + activations
    assert (kv, activations, per_sequence) == (94_371_840, 134_217_728, 228_589_568)
    capacity = (81_559 - 551) * 2**20
    assert (capacity - weights) // per_sequence == 296
    assert system_preset("dgx-h100").accelerator.hbm.capacity_bytes == capacity

    spec = load_config(SERVING).inference
    assert spec is not None
    plan = derive_inference_plan(spec.model, spec.mapping)
    for batch, fits in ((296, True), (297, False)):
        memory = memory_per_gpu(plan, batch=batch, capacity=capacity)
        assert (memory.weights, memory.kv_cache, memory.activations) == (
            weights,
            kv * batch,
            activations * batch,
        )
        assert memory.total == weights + per_sequence * batch
        assert memory.fits is fits


def test_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["infer", str(SERVING), "--json", "--set", "batch_size=1"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in (
        "prefill_latency_s",
        "time_to_first_token_s",
        "decode_latency_per_token_s",
        "tokens_per_second_per_replica",
        "tokens_per_second",
        "memory_bytes",
        "fits_in_memory",
        "max_batch_that_fits",
        "bounds",
        "strategy",
    ):
        assert key in data
    assert set(data["decode_latency_per_token_s"]) == {"mean", "final"}
    assert {"weights", "kv_cache", "activations", "total", "capacity"} <= set(data["memory_bytes"])
    assert {"compute_s", "hbm_s", "tp_comm_s"} <= set(data["bounds"]["decode"])
    assert data["time_to_first_token_s"] == data["prefill_latency_s"]
    assert data["strategy"]["tensor_model_parallel_size"] == 8
    assert data["workload"]["batch_size"] == 1


def test_search_ranks_by_throughput(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["infer", str(SERVING), "--search", "--json", "--set", "generated_tokens=16"]
    assert main([*args, "--top", "5"]) == 0
    ranked = json.loads(capsys.readouterr().out)
    assert len(ranked) == 5
    rates = [r["tokens_per_second"] for r in ranked]
    assert rates == sorted(rates, reverse=True)


def test_search_latency_target(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["infer", str(SERVING), "--search", "--json", "--set", "generated_tokens=16"]
    assert main([*args, "--latency-target-ms", "9", "--objective", "latency"]) == 0
    ranked = json.loads(capsys.readouterr().out)
    means = [r["decode_latency_per_token_s"]["mean"] for r in ranked]
    assert means and all(m <= 9e-3 for m in means)
    assert means == sorted(means)


def test_training_file_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["infer", str(TRAINING)]) == 2
    err = capsys.readouterr().err
    assert "use `blueprinting plan`" in err
    assert "Traceback" not in err


def test_training_key_in_inference_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["infer", str(SERVING), "--set", "data_parallel_size=2"]) == 2
    assert "training-only key" in capsys.readouterr().err


def test_a_bracketed_model_name_prints_as_written_in_the_search(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``infer --search``'s title carries the model name: brackets print, not read as markup."""
    serving = tmp_path / "serving.toml"
    serving.write_text(
        SERVING.read_text().replace(
            'preset = "llama2-70b"', 'preset = "llama2-70b"\nmodel_name = "[/bold]x"', 1
        )
    )
    assert main(["infer", str(serving), "--search", "--set", "generated_tokens=16"]) == 0
    assert "[/bold]x on 8 x" in capsys.readouterr().out
