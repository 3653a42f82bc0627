"""Hugging Face config.json import of the MoE model types: each fixture equals its preset."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from blueprinting.errors import ConfigError
from blueprinting.mapping.config_file import model_from_hf_config
from blueprinting.mapping.model import SlidingWindow
from blueprinting.mapping.presets import model_preset

_HF = Path(__file__).parent / "data" / "hf"
_PRESETS = sorted(path.stem for path in _HF.glob("*.json"))

# The presets' seq_length is the pre-training context; config.json says it only through YaRN's
# original_max_position_embeddings (DeepSeek, Kimi, gpt-oss) and otherwise gives the longest
# context (Qwen3: 40,960; Mixtral: 32,768 and 65,536, which the presets keep).
_HF_SEQ = {"qwen3-30b-a3b": 40960, "qwen3-235b-a22b": 40960}


def test_fixtures_cover_every_moe_preset() -> None:
    assert (
        sorted(
            [
                "deepseek-v3",
                "deepseek-v2-lite",
                "kimi-k2",
                "mixtral-8x7b",
                "mixtral-8x22b",
                "qwen3-30b-a3b",
                "qwen3-235b-a22b",
                "gpt-oss-20b",
                "gpt-oss-120b",
            ]
        )
        == _PRESETS
    )


@pytest.mark.parametrize("name", _PRESETS)
def test_imported_model_equals_the_preset(name: str) -> None:
    imported = model_from_hf_config(_HF / f"{name}.json", name=name)
    preset = model_preset(name)
    expected = replace(
        preset,
        seq_length=_HF_SEQ.get(name, preset.seq_length),
        published_parameters=None,
        published_active_parameters=None,
        # the Hugging Face model's own dropout (none), where the preset keeps Megatron's 0.1
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )
    assert imported == expected


def test_model_type_errors_are_collected() -> None:
    config = json.loads((_HF / "gpt-oss-20b.json").read_text())
    broken = {
        **config,
        "num_local_experts": 2,
        "layer_types": ["sliding_attention", "full_attention", "full_attention"] * 8,
    }
    with pytest.raises(ConfigError) as error:
        model_from_hf_config(broken)
    assert error.value.problems == (
        "layer_types: full attention on layers "
        + str([i for i in range(24) if i % 3 != 0])
        + " is not every 2-th layer (window_attn_skip_freq cannot say it)",
        "moe_router_topk = 4 exceeds num_experts = 2",
    )


def test_gpt_oss_window_without_layer_types_is_everywhere() -> None:
    config = json.loads((_HF / "gpt-oss-20b.json").read_text())
    del config["layer_types"]
    assert model_from_hf_config(config).attention_window == SlidingWindow(size=128)


def test_qwen3_sparse_step_and_dense_layers() -> None:
    config = json.loads((_HF / "qwen3-30b-a3b.json").read_text())
    model = model_from_hf_config({**config, "decoder_sparse_step": 2, "mlp_only_layers": [1]})
    assert [model.is_moe_layer(i) for i in range(6)] == [False, False, False, True, False, True]
