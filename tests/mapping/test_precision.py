"""Precision recipes (issue 12 item 4): flat keys both ways, did-you-mean, the precision laws.

Names and rules: Megatron-LM ``transformer_config.py`` l.584-690, ``arguments.py`` l.1051-1109
@d98e8a64 as summarized in ``shared/reference/modern_parallelism.md`` 3.1 and 3.4.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blueprinting.errors import ConfigError, InvalidStrategyError, UnsupportedError
from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.flat_keys import from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import (
    Fp4Precision,
    Fp8Format,
    Fp8Precision,
    Fp8Recipe,
    GemmFormat,
    HighPrecision,
    PrecisionChoice,
    TrainingPrecision,
    gemm_format,
)
from blueprinting.mapping.presets import model_preset

MODEL = replace(model_preset("llama3-8b"), published_parameters=None)
BASE: dict[str, object] = {
    "world_size": 16,
    "tensor_model_parallel_size": 2,
    "global_batch_size": 32,
    "use_distributed_optimizer": True,
    "bf16": True,
}

RECIPES: list[TrainingPrecision] = [
    HighPrecision(),
    *(
        Fp8Precision(recipe=r, format=f, param_gather=g)
        for r in Fp8Recipe
        for f in Fp8Format
        for g in (False, True)
    ),
    Fp4Precision(),
    Fp4Precision(param_gather=True),
]


@pytest.mark.parametrize("precision", RECIPES, ids=str)
def test_round_trip_through_flat_keys(precision: TrainingPrecision) -> None:
    spec = from_mapping(BASE, model=MODEL)
    spec = replace(spec, mapping=replace(spec.mapping, precision=precision))
    assert from_mapping(to_mapping(spec)) == spec


def test_measured_run_spellings_parse() -> None:
    # How Megatron-Bridge recipes (modern_runs.json) set them: config fields, dashes, the
    # --fp8-format alias.
    spec = from_mapping({**BASE, "fp8_format": "hybrid", "fp8_recipe": "mxfp8"}, model=MODEL)
    assert spec.mapping.precision == Fp8Precision(recipe=Fp8Recipe.MXFP8, format=Fp8Format.HYBRID)
    assert spec.model.datatype is Datatype.BF16
    spec = from_mapping(
        {**BASE, "--fp8-format": "e4m3", "--fp8-recipe": "blockwise", "--fp8-param-gather": True},
        model=MODEL,
    )
    assert spec.mapping.precision == Fp8Precision(
        recipe=Fp8Recipe.BLOCKWISE, format=Fp8Format.E4M3, param_gather=True
    )
    for fp4 in ("e2m1", True):
        spec = from_mapping({**BASE, "fp4": fp4, "fp4_recipe": "nvfp4"}, model=MODEL)
        assert spec.mapping.precision == Fp4Precision()
    spec = from_mapping({**BASE, "fp4_format": "e2m1", "fp4_param_gather": True}, model=MODEL)
    assert spec.mapping.precision == Fp4Precision(param_gather=True)


def test_old_inputs_keep_working() -> None:
    # fp8 = "hybrid" alone (the old key) is the delayed recipe on a bf16 base; fp8 = true means
    # TE's default format, hybrid; fp16 with fp8 keeps the fp16 base.
    spec = from_mapping({**BASE, "fp8": "hybrid"}, model=MODEL)
    assert spec.model.datatype is Datatype.BF16
    assert spec.mapping.precision == Fp8Precision()
    assert from_mapping({**BASE, "fp8": True}, model=MODEL).mapping.precision == Fp8Precision()
    fp16 = from_mapping({**BASE, "bf16": False, "fp16": True, "fp8": "e4m3"}, model=MODEL)
    assert fp16.model.datatype is Datatype.FP16
    assert from_mapping(BASE, model=MODEL).mapping.precision == HighPrecision()


def test_megatron_flags() -> None:
    spec = from_mapping(
        {**BASE, "fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param_gather": True},
        model=MODEL,
    )
    args = to_megatron_args(spec)
    assert args[-6:] == [
        "--bf16",
        "--fp8-format",
        "hybrid",
        "--fp8-recipe",
        "tensorwise",
        "--fp8-param-gather",
    ]
    spec = from_mapping({**BASE, "fp4": "e2m1"}, model=MODEL)
    assert to_megatron_args(spec)[-5:] == [
        "--bf16",
        "--fp4-format",
        "e2m1",
        "--fp4-recipe",
        "nvfp4",
    ]
    assert to_megatron_args(from_mapping(BASE, model=MODEL))[-1] == "--bf16"


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"fp8": "hybird"},
            "fp8 must be a boolean or one of 'e4m3', 'hybrid', got 'hybird' "
            "(did you mean 'hybrid'?)",
        ),
        (
            {"fp8": "e4m3", "fp8_recipe": "mxfp9"},
            "fp8_recipe must be one of delayed, tensorwise, blockwise, mxfp8, custom, got "
            "'mxfp9' (did you mean 'mxfp8'?)",
        ),
        (
            {"fp4": "e2m2"},
            "fp4 must be a boolean or 'e2m1', got 'e2m2' (did you mean 'e2m1'?)",
        ),
        (
            {"fp8": "e4m3", "fp4": "e2m1"},
            "fp8 = 'e4m3' and fp4 = 'e2m1' are both set: Megatron-LM runs one low-precision "
            "format (arguments.py l.1100-1101)",
        ),
        ({"fp8_recipe": "delayed"}, "fp8_recipe = 'delayed' needs fp8 (--fp8-format) set"),
        (
            {"fp8_param_gather": True},
            "fp8_param_gather = true needs fp8 (--fp8-format) set "
            "(transformer_config.py l.1566-1579)",
        ),
    ],
)
def test_bad_values_are_refused_by_name(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        from_mapping({**BASE, **keys}, model=MODEL)
    assert refused.value.problems == (message,)


def test_custom_recipe_is_not_modelled() -> None:
    with pytest.raises(UnsupportedError, match="fp8_recipe = custom"):
        from_mapping({**BASE, "fp8": "e4m3", "fp8_recipe": "custom"}, model=MODEL)


@pytest.mark.parametrize("key", ["fp8_dot_product_attention", "fp8_multi_head_attention"])
def test_fp8_attention_is_named_and_refused_as_not_modelled(key: str) -> None:
    """Megatron's FP8 attention switches are known keys: false (Megatron's default) plans as if
    unset; true is refused as not modelled, naming the key, never as an unknown key."""
    fp8 = {**BASE, "fp8": "hybrid", "fp8_recipe": "mxfp8"}
    assert from_mapping({**fp8, key: False}, model=MODEL) == from_mapping(fp8, model=MODEL)
    with pytest.raises(UnsupportedError) as caught:
        from_mapping({**fp8, key: True}, model=MODEL)
    assert str(caught.value).startswith(
        f"{key} = true (Transformer Engine's FP8 attention) is not modelled: cuDNN's FP8 "
        "attention rates are published for Blackwell only"
    )


def _laws(precision: TrainingPrecision, system: str) -> list[tuple[str, str]]:
    spec = from_mapping(BASE, model=MODEL)
    mapping = replace(spec.mapping, precision=precision)
    support = system_preset(system).accelerator.support
    return [(v.law, v.message) for v in check_training(spec.model, mapping, accelerator=support)]


def test_mxfp8_and_nvfp4_on_hopper_are_refused_naming_both() -> None:
    assert _laws(Fp8Precision(recipe=Fp8Recipe.MXFP8), "dgx-h100") == [
        (
            "precision_recipe_accelerator",
            "fp8_recipe = mxfp8 needs mxfp8 GEMMs, which accelerator H100-SXM5-80GB does not run "
            "(its low-precision GEMM formats: fp8, fp8_blockwise; MXFP8 and NVFP4 need Blackwell "
            "SM 10.0/10.3, FP8 SM 8.9+)",
        )
    ]
    ((law, message),) = _laws(Fp4Precision(), "dgx-h200")
    assert law == "precision_recipe_accelerator"
    assert "fp4_recipe = nvfp4" in message and "H200-SXM5-141GB" in message
    # FP8 of any kind on A100: no FP8 tensor cores
    ((law, message),) = _laws(Fp8Precision(), "dgx-a100-80gb")
    assert "fp8_recipe = delayed" in message and "A100-SXM4-80GB" in message
    assert "formats: none" in message


@pytest.mark.parametrize(
    ("precision", "system"),
    [
        (Fp4Precision(), "dgx-b200"),
        (Fp4Precision(), "dgx-gb200"),
        (Fp8Precision(recipe=Fp8Recipe.MXFP8), "dgx-gb300"),
        (Fp8Precision(recipe=Fp8Recipe.BLOCKWISE), "dgx-h100"),
        (Fp8Precision(recipe=Fp8Recipe.TENSORWISE), "dgx-h800"),
        (HighPrecision(), "dgx-a100-80gb"),
    ],
    ids=str,
)
def test_recipes_their_accelerators_run_are_accepted(
    precision: TrainingPrecision, system: str
) -> None:
    assert _laws(precision, system) == []


def test_param_gather_needs_a_sharded_optimizer() -> None:
    spec = from_mapping(
        {**BASE, "use_distributed_optimizer": False, "fp8": "hybrid", "fp8_param_gather": True},
        model=MODEL,
    )
    (violation,) = check_training(spec.model, spec.mapping)
    assert violation.law == "low_precision_param_gather_needs_sharded_optimizer"
    with pytest.raises(InvalidStrategyError):
        to_megatron_args(spec)


@given(st.sampled_from(RECIPES), st.sampled_from(sorted(["dgx-h100", "dgx-b200", "dgx-a100-80gb"])))
def test_accelerator_law_holds_exactly_when_the_format_is_listed(
    precision: TrainingPrecision, system: str
) -> None:
    needed = gemm_format(precision)
    formats = system_preset(system).accelerator.support.formats
    refused = any(law == "precision_recipe_accelerator" for law, _ in _laws(precision, system))
    assert refused == (needed is not None and needed not in formats)


def test_named_choices() -> None:
    assert PrecisionChoice("mxfp8").precision == Fp8Precision(recipe=Fp8Recipe.MXFP8)
    assert gemm_format(PrecisionChoice("fp8-tensorwise").precision) is GemmFormat.FP8
    assert gemm_format(PrecisionChoice("nvfp4").precision) is GemmFormat.NVFP4
    assert gemm_format(PrecisionChoice("bf16").precision) is None
