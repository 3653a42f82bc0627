"""The Megatron-Bridge recipe keys the modern runs set: Megatron-FSDP, the embedding / loss
accounted in the pipeline split, the first and last layers kept at bf16 under a low-precision
recipe, and MXFP8's param gather through the grad buffer."""

from __future__ import annotations

import pytest

from blueprinting.analysis.evaluate import portable_plan
from blueprinting.api import build_spec
from blueprinting.errors import ConfigError, UnsupportedError
from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.flat_keys import from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.precision import Fp8Precision, Fp8Recipe, HighPrecision
from blueprinting.mapping.transformer import FlexibleStages, LayoutStage, TrainingSpec

BASE = {
    "tensor_model_parallel_size": 4,
    "pipeline_model_parallel_size": 4,
    "global_batch_size": 64,
    "sequence_parallel": True,
    "use_distributed_optimizer": True,
}


def _spec(**keys: object) -> TrainingSpec:
    return build_spec(model="llama3-70b", gpus=64, settings={**BASE, **keys})


def test_accounted_embedding_and_loss_are_the_flexible_layout() -> None:
    # Llama 3.1 405B as Megatron-Bridge splits it: 126 layers + E + L over 16 stages
    spec = build_spec(
        model="llama3-405b",
        gpus=128,
        settings={
            "tensor_model_parallel_size": 8,
            "pipeline_model_parallel_size": 16,
            "global_batch_size": 16,
            "account_for_embedding_in_pipeline_split": True,
            "account_for_loss_in_pipeline_split": True,
        },
    )
    layout = spec.mapping.parallelism.pipeline.layout
    # 126 + 2 = 128 units, 8 per stage: E + 7 blocks, 14 x 8 blocks, 7 blocks + L
    assert layout == FlexibleStages(
        stages=(
            LayoutStage(embedding=True, decoder_layers=7),
            *(LayoutStage(decoder_layers=8) for _ in range(14)),
            LayoutStage(decoder_layers=7, loss=True),
        )
    )
    assert from_mapping(to_mapping(spec)).mapping == spec.mapping
    with pytest.raises(ConfigError) as error:
        _spec(account_for_embedding_in_pipeline_split=True)  # 81 units over 4 stages
    assert "81 is not divisible by the virtual stages p * v = 4 * 1" in str(error.value)
    with pytest.raises(ConfigError) as error:
        _spec(
            account_for_loss_in_pipeline_split=True,
            decoder_first_pipeline_num_layers=19,
        )
    assert "one way to make stages uneven" in str(error.value)


def test_megatron_fsdp_key() -> None:
    spec = _spec(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params")
    assert to_mapping(spec)["use_megatron_fsdp"] is True
    assert "--use-megatron-fsdp" in to_megatron_args(spec)
    with pytest.raises(ConfigError) as error:
        _spec(use_megatron_fsdp=True)
    assert "needs data_parallel_sharding_strategy = optim_grads or optim_grads_params" in str(
        error.value
    )
    with pytest.raises(ConfigError):
        _spec(use_megatron_fsdp=False, data_parallel_sharding_strategy="optim_grads")


def test_first_and_last_layers_at_bf16() -> None:
    keys = {
        "fp8": "hybrid",
        "fp8_recipe": "tensorwise",
        "first_last_layers_bf16": True,
        "num_layers_at_start_in_bf16": 2,
        "num_layers_at_end_in_bf16": 3,
    }
    spec = _spec(**keys)
    assert spec.mapping.precision == Fp8Precision(
        recipe=Fp8Recipe.TENSORWISE, high_precision_layers=(2, 3)
    )
    assert from_mapping(to_mapping(spec)).mapping == spec.mapping
    args = to_megatron_args(spec)
    at = args.index("--first-last-layers-bf16")
    assert args[at : at + 5] == [
        "--first-last-layers-bf16",
        "--num-layers-at-start-in-bf16",
        "2",
        "--num-layers-at-end-in-bf16",
        "3",
    ]
    # Megatron-LM's defaults: one layer at each end
    assert _spec(
        fp8="hybrid", fp8_recipe="tensorwise", first_last_layers_bf16=True
    ).mapping.precision == Fp8Precision(recipe=Fp8Recipe.TENSORWISE, high_precision_layers=(1, 1))
    with pytest.raises(ConfigError) as error:
        _spec(num_layers_at_start_in_bf16=2)
    assert "need first_last_layers_bf16 = true" in str(error.value)
    with pytest.raises(ConfigError) as error:
        _spec(first_last_layers_bf16=True)
    assert "needs an fp8 or fp4 recipe" in str(error.value)


def test_base_precision_layers_cost_the_bf16_block_on_the_edge_stages() -> None:
    system = system_preset("dgx-h100")
    fp8 = {"fp8": "hybrid", "fp8_recipe": "tensorwise"}
    low = portable_plan(_spec(**fp8), system)
    high = portable_plan(_spec(), system)
    plan = portable_plan(
        _spec(
            **fp8,
            first_last_layers_bf16=True,
            num_layers_at_start_in_bf16=2,
            num_layers_at_end_in_bf16=3,
        ),
        system,
    )
    assert high.block.forward.compute_s > low.block.forward.compute_s
    delta = high.block.forward.critical_path_s - low.block.forward.critical_path_s
    assert plan.first_layers.forward.critical_path_s == pytest.approx(2 * delta, rel=1e-12)
    assert plan.last_layers.forward.critical_path_s == pytest.approx(3 * delta, rel=1e-12)
    first, last = plan.stages[0], plan.stages[-1]
    assert plan.stage_microbatch_compute_s(first) == pytest.approx(
        low.stage_microbatch_compute_s(first) + plan.first_layers.total_s, rel=1e-12
    )
    assert plan.stage_microbatch_compute_s(last) == pytest.approx(
        low.stage_microbatch_compute_s(last) + plan.last_layers.total_s, rel=1e-12
    )
    assert _spec().mapping.precision == HighPrecision()


def test_mxfp8_param_gather_through_the_grad_buffer() -> None:
    gb200 = {
        "fp8": "e4m3",
        "fp8_recipe": "mxfp8",
        "fp8_param_gather": True,
        "reuse_grad_buf_for_mxfp8_param_ag": True,
    }
    spec = _spec(**gb200)
    assert to_mapping(spec)["reuse_grad_buf_for_mxfp8_param_ag"] is True
    with pytest.raises(UnsupportedError):
        _spec(**{**gb200, "reuse_grad_buf_for_mxfp8_param_ag": False})
    with pytest.raises(ConfigError) as error:
        _spec(fp8="hybrid", reuse_grad_buf_for_mxfp8_param_ag=True)
    assert "needs fp8_recipe = mxfp8 with fp8_param_gather = true" in str(error.value)


def test_base_precision_layers_must_fit_the_model_and_its_edge_stages() -> None:
    from blueprinting.mapping.laws import check_training

    keys = {"fp8": "hybrid", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True}
    too_many = _spec(**keys, num_layers_at_start_in_bf16=60, num_layers_at_end_in_bf16=30)
    assert [v.law for v in check_training(too_many.model, too_many.mapping)] == [
        "base_precision_layers"
    ]
    # 80 layers over p = 4: 20 per stage; 21 first layers would reach rank 1
    spill = _spec(**keys, num_layers_at_start_in_bf16=21)
    with pytest.raises(UnsupportedError) as error:
        portable_plan(spill, system_preset("dgx-h100"))
    assert "decoder layers 0 .. 20 span more than one virtual pipeline stage" in str(error.value)


def test_base_precision_layers_run_where_the_layout_puts_them() -> None:
    """Megatron-Bridge's DeepSeek-V3 H100 layout ``Et|(tt|)*30mL`` (PP8 x VP4): the first layer
    sits with the embedding (rank 0, chunk 0), the last one (layer 60, a MoE layer) in virtual
    stage 30, chunk 3 of rank 6, not with the loss (virtual stage 31, rank 7, no layers)."""
    from blueprinting.synthesizer.stages.portable_plan.passes import (
        BaseLayerRun,
        base_layer_runs,
    )

    keys = {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 8,
        "virtual_pipeline_model_parallel_size": 4,
        "pipeline_model_parallel_layout": "Et|(tt|)*30mL",
        "expert_model_parallel_size": 64,
        "sequence_parallel": True,
        "global_batch_size": 8192,
        "use_distributed_optimizer": True,
        "fp8": "hybrid",
        "fp8_recipe": "tensorwise",
    }
    system = system_preset("dgx-h100")
    low = build_spec(model="deepseek-v3", gpus=1024, settings=keys)
    spec = build_spec(
        model="deepseek-v3",
        gpus=1024,
        settings={
            **keys,
            "first_last_layers_bf16": True,
            "num_layers_at_start_in_bf16": 1,
            "num_layers_at_end_in_bf16": 1,
        },
    )
    first, last = base_layer_runs(spec)
    assert first == BaseLayerRun(
        stage=0, chunk=0, dense=1, moe=0, dense_recomputed=0, moe_recomputed=0
    )
    assert last == BaseLayerRun(
        stage=6, chunk=3, dense=0, moe=1, dense_recomputed=0, moe_recomputed=0
    )
    plan, base = portable_plan(spec, system), portable_plan(low, system)
    assert [s.index for s in plan.stages if s.last_layers_chunk is not None] == [6]
    assert plan.stages[7].has_lm_head and plan.stages[7].last_layers_chunk is None
    # the last layer is a MoE layer: its extra is the MoE block's precision delta
    high = portable_plan(
        build_spec(
            model="deepseek-v3",
            gpus=1024,
            settings={k: v for k, v in keys.items() if not k.startswith("fp8")},
        ),
        system,
    )
    assert high.moe_block is not None and base.moe_block is not None
    delta = high.moe_block.forward.critical_path_s - base.moe_block.forward.critical_path_s
    assert delta > 0
    assert plan.last_layers.forward.critical_path_s == pytest.approx(delta, rel=1e-12)
    for index in (6, 7):
        extra = plan.last_layers.total_s if index == 6 else 0.0
        assert plan.stage_microbatch_compute_s(plan.stages[index]) == pytest.approx(
            base.stage_microbatch_compute_s(base.stages[index]) + extra, rel=1e-12
        )
