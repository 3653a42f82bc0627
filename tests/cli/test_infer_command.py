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
    assert "largest batch that fits: 274" in out


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
