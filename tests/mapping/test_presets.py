"""Model presets: names, lookup errors, inference round trip over lawful specs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from blueprinting.errors import ConfigError
from blueprinting.mapping.flat_keys import inference_from_mapping, inference_to_mapping
from blueprinting.mapping.presets import MODEL_PRESETS, model_preset
from blueprinting.mapping.transformer import InferenceSpec
from tests.strategies import lawful_inference_specs


def test_preset_names_are_the_issue_list() -> None:
    assert list(MODEL_PRESETS) == [
        "gpt-1.7b",
        "gpt-3.6b",
        "gpt-7.5b",
        "gpt-18b",
        "gpt-39b",
        "gpt-76b",
        "gpt-145b",
        "gpt-310b",
        "gpt-530b",
        "gpt-1008b",
        "megatron-22b",
        "gpt3-175b",
        "mt-nlg-530b",
        "megatron-1t",
        "bloom-176b",
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
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


def test_unknown_preset_suggests_the_closest_name() -> None:
    with pytest.raises(ConfigError) as error:
        model_preset("lama2-7b")
    assert error.value.problems == ("unknown model preset 'lama2-7b' (did you mean 'llama2-7b'?)",)
    with pytest.raises(ConfigError) as nothing_close:
        model_preset("zzz")
    assert nothing_close.value.problems == ("unknown model preset 'zzz'",)


def test_gpt3_architecture() -> None:
    model = model_preset("gpt3-175b")
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (96, 12288, 96)
    # 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)), Narayanan et al. 2021, Eq. 2
    assert model.num_parameters == 174_615_846_912


@settings(max_examples=100, deadline=None)
@given(lawful_inference_specs())
def test_inference_from_mapping_inverts_inference_to_mapping(spec: InferenceSpec) -> None:
    assert inference_from_mapping(inference_to_mapping(spec)) == spec
