"""Whole-plan invariants on real presets: the breakdown sums to the total, memory categories sum
to the memory total, MFU/HFU/TFLOP/s agree with FLOPs and time, and the JSON carries every key the
README documents."""

from __future__ import annotations

import json

import pytest

from blueprinting.api import build_spec, plan, plan_spec
from blueprinting.errors import ConfigError, InvalidStrategyError

GPT3 = {
    "tensor_model_parallel_size": 8,
    "pipeline_model_parallel_size": 8,
    "num_virtual_stages_per_pipeline_rank": 3,
    "sequence_parallel": True,
    "recompute_granularity": "selective",
    "use_distributed_optimizer": True,
    "global_batch_size": 1536,
}

README_KEYS = {
    "iteration_time_s",
    "time_breakdown_s",
    "bubble",
    "model_flops_per_iteration",
    "hardware_flops_per_iteration",
    "flops_convention",
    "tflops_per_gpu",
    "mfu",
    "hfu",
    "tokens_per_second",
    "memory_bytes",
    "fits_in_memory",
    "strategy",
    "megatron_args",
}


@pytest.mark.parametrize(
    ("model", "system", "gpus", "settings"),
    [
        ("gpt3-175b", "dgx-a100-80gb", 1024, GPT3),
        (
            "llama2-70b",
            "dgx-h100",
            512,
            {
                "tensor_model_parallel_size": 8,
                "pipeline_model_parallel_size": 4,
                "global_batch_size": 1024,
                "recompute_granularity": "full",
                "recompute_method": "uniform",
                "recompute_num_layers": 1,
            },
        ),
        ("llama3-8b", "dgx-h100", 64, {"tensor_model_parallel_size": 2, "global_batch_size": 256}),
    ],
)
def test_report_invariants(model: str, system: str, gpus: int, settings: dict[str, object]) -> None:
    report = plan(model=model, system=system, gpus=gpus, settings=settings)
    parts = report.breakdown.as_dict()
    assert report.iteration_time_s == sum(parts.values())
    assert all(value >= 0 for value in parts.values())
    memory = report.memory
    categories = (
        memory.weights,
        memory.gradients,
        memory.optimizer_states,
        memory.activations,
        memory.other,
    )
    assert memory.total == sum(categories)
    assert memory.total == max(stage.total for stage in report.memory_per_stage)
    world = report.world_size
    assert report.mfu == pytest.approx(
        report.model_flops_per_iteration
        / (report.iteration_time_s * world * report.peak_flops_per_gpu),
        rel=1e-12,
    )
    assert report.tflops_per_gpu * 1e12 == pytest.approx(
        report.mfu * report.peak_flops_per_gpu, rel=1e-12
    )
    assert report.hfu >= report.mfu
    assert report.tokens_per_second == pytest.approx(
        report.tokens_per_iteration / report.iteration_time_s
    )
    as_json = json.loads(json.dumps(report.to_json_dict()))
    assert as_json.keys() >= README_KEYS
    assert set(as_json["time_breakdown_s"]) == set(parts)
    assert as_json["memory_bytes"]["total"] == memory.total


def test_gpt3_175b_plan_reports_the_selene_strategy() -> None:
    report = plan(model="gpt3-175b", system="dgx-a100-80gb", gpus=1024, settings=GPT3)
    assert str(report.spec.mapping) == "TP8(rs+ag) PP8(1F1B x3) DP16(dist-opt) recompute=selective"
    assert report.spec.mapping.microbatch_count == 96
    # Seed's contract for p = 8 with 96 mod 8 = 0: exactly (p - 1) chunks.
    assert report.bubble.n_bubble == 7
    assert report.bubble.chunk_time_s == pytest.approx(
        report.plan.forward_chunk_s() + report.plan.backward_chunk_s()
    )
    assert "--tensor-model-parallel-size" in report.megatron_args
    # 30.4 GiB per GPU against 80 GB: the strategy fits with headroom.
    assert report.memory.fits
    assert report.memory.headroom > 40 * 2**30


def test_plan_refuses_an_illegal_strategy_with_every_law() -> None:
    with pytest.raises(InvalidStrategyError) as caught:
        plan(
            model="gpt3-175b",
            gpus=1008,
            settings={
                "tensor_model_parallel_size": 8,
                "pipeline_model_parallel_size": 7,
                "global_batch_size": 1000,
            },
        )
    laws = {violation.law for violation in caught.value.violations}
    assert "blocks_per_pipeline_stage" in laws  # 96 / 7
    assert "microbatch_count" in laws or "local_batch" in laws  # 1000 / 18


def test_plan_spec_and_plan_agree() -> None:
    spec = build_spec(model="gpt3-175b", gpus=1024, settings=GPT3)
    assert (
        plan_spec(spec, "dgx-a100-80gb").iteration_time_s
        == plan(spec, system="dgx-a100-80gb").iteration_time_s
    )


def test_plan_needs_a_model_or_a_spec() -> None:
    with pytest.raises(ConfigError):
        plan()


@pytest.mark.parametrize(
    "settings",
    [
        GPT3,
        {
            "tensor_model_parallel_size": 4,
            "pipeline_model_parallel_size": 4,
            "global_batch_size": 512,
            "recompute_granularity": "full",
            "recompute_method": "block",
            "recompute_num_layers": 2,
        },
    ],
)
def test_memoized_plan_equals_the_pass_pipeline(settings: dict[str, object]) -> None:
    """evaluate.portable_plan memoizes the block-level stages; it must equal running the
    derivation and the PortablePlanIR passes afresh on the real mapping."""
    from blueprinting.analysis.evaluate import portable_plan
    from blueprinting.hardware.presets import system_preset
    from blueprinting.synthesizer.dialects.transformer.training_derivation import (
        derive_training_block,
    )
    from blueprinting.synthesizer.stages.portable_plan.passes import (
        PlanContext,
        build_portable_plan,
    )

    spec = build_spec(model="gpt3-175b", gpus=1024, settings=settings)
    system = system_preset("dgx-a100-80gb")
    fresh = build_portable_plan(
        derive_training_block(spec.model, spec.mapping), PlanContext(spec=spec, system=system)
    )
    assert portable_plan(spec, system) == fresh
