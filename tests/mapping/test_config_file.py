"""Strategy files (TOML/JSON/YAML), overrides and Hugging Face config.json models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blueprinting.errors import ConfigError
from blueprinting.mapping.config_file import (
    apply_overrides,
    load_config,
    model_from_hf_config,
    parse_value,
)
from blueprinting.mapping.model import (
    Datatype,
    EmbeddingTying,
    MlpActivation,
    Normalization,
)
from blueprinting.mapping.presets import model_preset

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

LLAMA2_7B_HF = {
    "_name_or_path": "meta-llama/Llama-2-7b-hf",
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 32000,
}


def test_example_gpt3_file() -> None:
    config = load_config(EXAMPLES / "gpt3-175b-selene.toml")
    assert str(config) == "gpt3-175b: TP8(rs+ag) PP8(1F1B x3) DP16(dist-opt) recompute=selective"
    assert config.inference is None
    assert dict(config.system) == {"preset": "dgx-a100-80gb"}
    assert config.training is not None
    assert config.training.model.published_parameters == 175_000_000_000


def test_example_llama_file() -> None:
    config = load_config(EXAMPLES / "llama2-70b-h100.toml")
    assert str(config) == "llama2-70b: TP8(rs+ag) PP4(1F1B x5) DP16(dist-opt) recompute=selective"
    assert dict(config.system) == {"preset": "dgx-h100"}


def test_json_and_yaml_files_and_overrides(tmp_path: Path) -> None:
    data = {
        "model": {"preset": "llama3-8b"},
        "training": {"tensor-model-parallel-size": 2, "world_size": 16},
        "system": {"preset": "dgx-h100", "nodes": 2},
    }
    json_file = tmp_path / "s.json"
    json_file.write_text(json.dumps(data))
    yaml_file = tmp_path / "s.yaml"
    yaml_file.write_text(
        "model:\n  preset: llama3-8b\ntraining:\n  tensor-model-parallel-size: 2\n"
        "  world_size: 16\nsystem:\n  preset: dgx-h100\n  nodes: 2\n"
    )
    from_json = load_config(json_file)
    from_yaml = load_config(yaml_file)
    assert from_json.training == from_yaml.training
    assert str(from_json) == "llama3-8b: TP2(ar) PP1(single) DP8(no-shard) recompute=none"
    changed = load_config(
        json_file,
        overrides=[
            "pipeline_model_parallel_size=2",
            "model.preset=llama2-7b",
            "system.nodes=4",
        ],
    )
    assert str(changed) == "llama2-7b: TP2(ar) PP2(1F1B) DP4(no-shard) recompute=none"
    assert dict(changed.system) == {"preset": "dgx-h100", "nodes": 4}


def test_model_keys_override_the_preset(tmp_path: Path) -> None:
    file = tmp_path / "s.toml"
    file.write_text(
        '[model]\npreset = "gpt3-175b"\nnum_layers = 48\n\n[training]\ndata_parallel_size = 2\n'
    )
    config = load_config(file)
    assert config.training is not None
    assert config.training.model.num_layers == 48
    assert config.training.model.hidden_size == 12288
    assert config.training.model.published_parameters is None


def test_file_problems_are_reported_together(tmp_path: Path) -> None:
    file = tmp_path / "s.toml"
    file.write_text(
        '[model]\npreset = "gpt3-17b"\n\n[trainig]\nx = 1\n\n[sytem]\npreset = "dgx-h100"\n'
    )
    with pytest.raises(ConfigError) as error:
        load_config(file)
    assert error.value.problems == (
        "unknown section [trainig] (did you mean 'training'?)",
        "unknown section [sytem] (did you mean 'system'?)",
        "the file needs exactly one of [training] or [inference]",
        "unknown model preset 'gpt3-17b' (did you mean 'gpt3-175b'?)",
    )
    assert error.value.source == str(file)


def test_malformed_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="malformed toml"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read file"):
        load_config(tmp_path / "absent.toml")
    other = tmp_path / "s.ini"
    other.write_text("")
    with pytest.raises(ConfigError, match=r"unknown file type '\.ini'"):
        load_config(other)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="top level"):
        load_config(listing)


def test_inference_file(tmp_path: Path) -> None:
    file = tmp_path / "i.toml"
    file.write_text(
        '[model]\npreset = "llama2-70b"\n\n[inference]\ntensor_model_parallel_size = 8\n'
        "replicas = 2\nbatch_size = 4\nprompt_length = 2048\ngenerated_tokens = 128\n"
        'kv_cache_datatype = "float8"\n'
    )
    config = load_config(file)
    assert config.training is None
    assert config.inference is not None
    assert str(config) == "llama2-70b: TP8(ar) PP1(single) R2"
    assert config.inference.mapping.workload.kv_cache_datatype is Datatype.FP8


def test_parse_value() -> None:
    assert [parse_value(x) for x in ("8", "-2", "0.5", "TRUE", "false", "optim", " 3 ")] == [
        8,
        -2,
        0.5,
        True,
        False,
        "optim",
        3,
    ]


def test_apply_overrides() -> None:
    assert apply_overrides({"a-b": 1}, ["a-b=2", "--c=x", "d=true"]) == {
        "a_b": 2,
        "c": "x",
        "d": True,
    }
    with pytest.raises(ConfigError) as error:
        apply_overrides({}, ["novalue", "=3"])
    assert error.value.problems == (
        "override 'novalue' is not of the form key=value",
        "override '=3' is not of the form key=value",
    )


def test_hf_config_reproduces_the_llama2_7b_preset(tmp_path: Path) -> None:
    model = model_from_hf_config(LLAMA2_7B_HF)
    assert model.name == "meta-llama/Llama-2-7b-hf"
    assert model.num_parameters == model_preset("llama2-7b").num_parameters == 6_738_415_616
    assert model.activation is MlpActivation.SWIGLU
    assert model.normalization is Normalization.RMSNORM
    assert model.embeddings is EmbeddingTying.UNTIED
    assert model.datatype is Datatype.FP16
    # transformers' configs default their dropout to 0.0, and Megatron-Bridge passes it on
    assert (model.attention_dropout, model.hidden_dropout) == (0.0, 0.0)
    with pytest.raises(ConfigError) as error:
        model_from_hf_config({**LLAMA2_7B_HF, "attention_dropout": 1.5})
    assert error.value.problems == ("attention_dropout must be a probability in [0, 1), got 1.5",)
    folder = tmp_path / "Llama-2-7b-hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**LLAMA2_7B_HF, "num_key_value_heads": 8}))
    from_file = model_from_hf_config(folder / "config.json", name="llama-gqa")
    assert (from_file.name, from_file.num_query_groups) == ("llama-gqa", 8)


def test_hf_config_in_a_strategy_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B_HF))
    file = tmp_path / "s.toml"
    file.write_text(
        '[model]\nhf_config = "config.json"\n\n[training]\ntensor_model_parallel_size = 4\n'
        "data_parallel_size = 2\n"
    )
    config = load_config(file)
    assert (
        str(config) == "meta-llama/Llama-2-7b-hf: TP4(ar) PP1(single) DP2(no-shard) recompute=none"
    )


def test_hf_config_errors() -> None:
    with pytest.raises(ConfigError) as error:
        model_from_hf_config({"hidden_size": "big", "torch_dtype": "int8"})
    assert error.value.problems == (
        "hidden_size must be a positive integer, got 'big'",
        "num_attention_heads is required",
        "torch_dtype must be one of bfloat16, float16, float32, got 'int8'",
        "vocab_size is required",
        "num_hidden_layers is required",
        "intermediate_size is required",
        "max_position_embeddings is required",
    )
