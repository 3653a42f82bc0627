"""MoE presets against their owners' published total and active parameter counts."""

from __future__ import annotations

import pytest

from blueprinting.mapping.model import ActiveCount
from blueprinting.mapping.presets import (
    MODEL_PRESETS,
    PUBLISHED_ACTIVE_COUNT,
    PUBLISHED_ACTIVE_ROUNDING,
    PUBLISHED_ROUNDING,
    model_preset,
)

MOE_PRESETS = (
    "deepseek-v3",
    "deepseek-v2-lite",
    "kimi-k2",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "gpt-oss-20b",
    "gpt-oss-120b",
)

# Two owners print an active count that is our count cut off, not rounded, at the printed digit:
# Qwen3-30B-A3B's 3.35B as "3.3B" and DeepSeek-V2-Lite's 2.45B as "2.4B" (rounding would print
# 3.4B and 2.5B; no choice of embedding matrices makes either round to the printed figure).
_ACTIVE_TRUNCATED = frozenset({"qwen3-30b-a3b", "deepseek-v2-lite"})


def _printed(count: int, half_unit: int, *, truncated: bool = False) -> int:
    """``count`` as its owner prints it: to the unit of the last printed digit."""
    unit = 2 * half_unit
    return (count // unit if truncated else (count + half_unit) // unit) * unit


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_total_parameters_match_the_published_figure(name: str) -> None:
    model = MODEL_PRESETS[name]
    assert model.published_parameters is not None
    assert _printed(model.num_parameters, PUBLISHED_ROUNDING[name]) == model.published_parameters


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_active_parameters_match_under_the_owner_convention(name: str) -> None:
    model = MODEL_PRESETS[name]
    assert model.published_active_parameters is not None
    counted = model.active_parameters_as(PUBLISHED_ACTIVE_COUNT[name])
    printed = _printed(
        counted, PUBLISHED_ACTIVE_ROUNDING[name], truncated=name in _ACTIVE_TRUNCATED
    )
    assert printed == model.published_active_parameters


def test_owner_conventions() -> None:
    """gpt-oss counts the unembedding only (model card Table 1); DeepSeek's 37B and Kimi's 32B
    fit one of embedding / head (both: 37.55B and 32.86B round to 38B and 33B); Mixtral's
    12.9B and Qwen3-235B's 22B count both (head only: 12.75B -> 12.7B)."""
    assert {n for n, c in PUBLISHED_ACTIVE_COUNT.items() if c is ActiveCount.HEAD_ONLY} == {
        "gpt-oss-20b",
        "gpt-oss-120b",
        "deepseek-v3",
        "deepseek-v2-lite",
        "kimi-k2",
    }
    assert set(PUBLISHED_ACTIVE_COUNT) == set(MOE_PRESETS)


def test_exact_counts() -> None:
    """Megatron's per-part formula evaluated (checkpoint counts where known: Mixtral 8x7B's
    safetensors hold 46,702,792,704 parameters, Qwen3-30B-A3B's 30,532,122,624)."""
    counts = {
        name: (MODEL_PRESETS[name].num_parameters, MODEL_PRESETS[name].active_parameters)
        for name in MOE_PRESETS
    }
    assert counts == {
        "deepseek-v3": (671_026_419_200, 37_552_297_472),
        "deepseek-v2-lite": (15_706_484_224, 2_661_150_208),
        "kimi-k2": (1_026_408_232_448, 32_861_500_928),
        "mixtral-8x7b": (46_702_792_704, 12_879_925_248),
        "mixtral-8x22b": (140_620_634_112, 39_152_031_744),
        "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704),
        "qwen3-235b-a22b": (235_093_634_560, 22_190_763_520),
        "gpt-oss-20b": (20_914_757_184, 4_187_440_704),
        "gpt-oss-120b": (116_829_156_672, 5_711_982_912),
    }


def test_deepseek_v3_mla_per_layer() -> None:
    """Shared reference section 2.10: Q 48.8M, KV 20.9M, O 117.4M per layer."""
    q, kv, o = model_preset("deepseek-v3").attention_projection_parameters
    assert (q, kv, o) == (48_760_320, 20_906_496, 117_440_512)
    assert [round(x / 1e5) / 10 for x in (q, kv, o)] == [48.8, 20.9, 117.4]


def test_deepseek_v3_mtp_and_layer_kinds() -> None:
    """3 dense + 58 MoE layers; the MTP depth is one MoE layer plus eh_proj and three norms
    (11.6B, section 2.11), outside the 671B."""
    model = model_preset("deepseek-v3")
    assert (model.num_dense_layers, model.num_moe_layers) == (3, 58)
    assert model.mtp_parameters == 11_610_068_224
    assert model.mtp_parameters == (2 * 7168 * 7168 + 3 * 7168 + model.moe_block_parameters)


def test_gpt_oss_sinks_and_biases() -> None:
    """Per layer: Q/K/V/O weights and biases, 64 sinks; each expert 2880 x 5760 + 5760 and
    2880 x 2880 + 2880; router 2880 x 128 + 128."""
    model = model_preset("gpt-oss-120b")
    assert model.attention_parameters == (
        2880 * 4096 + 4096 + 2 * (2880 * 512 + 512) + 4096 * 2880 + 2880 + 64
    )
    assert model.expert_parameters == 2880 * 5760 + 5760 + 2880 * 2880 + 2880
    assert model.router_parameters == 2880 * 128 + 128
