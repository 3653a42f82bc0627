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


# Sequence lengths (Brown et al. 2020; Touvron et al. 2023; Llama Team 2024 pre-training
# context) and dense bf16 peaks (A100 and H100 SXM datasheets), for the independent checks.
SEQUENCE = {"gpt3-175b": 2048, "llama2-70b": 4096, "llama3-8b": 8192}
PEAK_BF16 = {"dgx-a100-80gb": 312e12, "dgx-h100": 989e12}


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
    # Independent of the report's own properties: the inputs fix these.
    assert world == gpus
    global_batch = settings["global_batch_size"]
    assert isinstance(global_batch, int)
    assert report.tokens_per_iteration == global_batch * SEQUENCE[model]
    assert report.peak_flops_per_gpu == PEAK_BF16[system]
    # HFU / MFU is the FLOPs ratio (same time, GPUs and peak in both denominators).
    assert report.hfu / report.mfu == pytest.approx(
        report.hardware_flops_per_iteration / report.model_flops_per_iteration, rel=1e-12
    )


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

    # Independent figures (Narayanan et al. 2021 / Korthikanti et al. 2022 by hand).
    b_global, s, layers, h, vocab = 1536, 2048, 96, 12288, 51200
    assert report.world_size == 1024  # 8 x 8 x 16
    assert report.tokens_per_iteration == 1536 * 2048 == 3_145_728
    assert report.peak_flops_per_gpu == 312e12  # A100 bf16 dense, datasheet
    # Model FLOPs, Korthikanti et al. 2022, Appendix A: 72 B s L h^2 (1 + s/(6h) + V/(12 L h))
    # = 72 B s L h^2 + 12 B s^2 L h + 6 B s h V, with Megatron's padded vocabulary V = 51200
    # (the legacy convention counts the LM head on the padded vocabulary, as Megatron-LM does;
    # the unpadded 50257 would give 3,385,978,038,062,678,016).
    model_flops = (
        72 * b_global * s * layers * h * h
        + 12 * b_global * s * s * layers * h
        + 6 * b_global * s * h * vocab
    )
    assert model_flops == 3_386_196_746_387_324_928
    assert report.model_flops_per_iteration == model_flops
    # Selective recompute re-runs the attention core forward once per layer: QK^T and
    # attention-over-V over the full s x s matrix, 2 x 2 b s^2 h = 4 B s^2 h per layer.
    hardware_flops = model_flops + 4 * b_global * s * s * h * layers
    assert hardware_flops == 3_416_596_043_872_075_776
    assert report.hardware_flops_per_iteration == hardware_flops

    # Memory of stage 0, one GPU (t = 8, SP, selective, distributed optimizer over d = 16, bf16).
    # Parameters per TP rank (tests/analysis/test_memory.py): block 12h^2/8 + 7h/8 + 2h + 4h =
    # 226,576,896; stage 0 has 96 / 8 = 12 blocks, the word embedding 51200 h / 8 and the learned
    # positions 2048 h (replicated).
    block = 12 * h * h // 8 + 7 * h // 8 + 2 * h + 4 * h
    assert block == 226_576_896
    params = 12 * block + vocab * h // 8 + s * h
    assert params == 2_822_731_776
    memory = report.memory
    assert memory.stage == 0
    assert memory.weights == 2 * params == 5_645_463_552  # bf16
    assert memory.gradients == 4 * params == 11_290_927_104  # fp32 main grads
    assert memory.optimizer_states == 12 * params // 16 == 2_117_048_832  # 12 B / d
    # Activations (Korthikanti et al. 2022, Table 2, SP + selective: 34 s b h / t per layer;
    # s b h = 2048 * 12288 = 25,165,824). Interleaved rank 0 peaks at min(2 (p-1) + (v-1) p + 1,
    # m v) = min(14 + 16 + 1, 288) = 31 chunk forwards of 96 / 24 = 4 layers: 124 layers x 34/8
    # = 527 sbh, plus what selective recompute rebuilds of one layer's attention core in
    # backward: with Megatron-Core's default fused kernel only its fp32 softmax statistics,
    # 4 (a/t) s = 4 * 12 * 2048 bytes (no s x s tensor; unfused it would be 10 sbh).
    sbh = s * 1 * h
    assert 31 * 4 * 34 // 8 == 527
    assert memory.activations == 527 * sbh + 4 * 12 * 2048 == 13_262_487_552
    # Other: 15 of the 31 in flight are chunk-0 forwards (8 + 7 over groups of p = 8), each
    # holding int64 token ids (8 s b) and the embedding dropout mask (s b h / t, 1 byte).
    assert memory.other == 15 * (8 * s + s * h // 8) == 47_431_680
    total = 5_645_463_552 + 11_290_927_104 + 2_117_048_832 + 13_262_487_552 + 47_431_680
    assert total == 32_363_358_720
    assert memory.total == total
    # NVML's total of an A100 80GB less the driver's reserve (NVML_TOTAL_MIB, DRIVER_RESERVED_MIB)
    assert memory.capacity == (81_920 - 834) * 2**20
    # The peaks: a block's backward gradients x s (u + f)/t + 2 x (s/t) h + x s h (the SP
    # re-gather), x = 2, u = f = 4h: the transient and the allocator's reserve.
    working = 2 * s * (2 * 4 * h // 8) + 2 * 2 * (s // 8) * h + 2 * s * h
    assert working == 113_246_208
    assert memory.allocated_peak == total + working + 64 * 2**20 == 32_543_713_792
    assert memory.allocator_reserved_peak == 32_543_713_792 + working
    # Outside the allocator: the CUDA context (512 MiB) and NCCL's buffers (RuntimeMemory's
    # A100 channels: 24 ring, 32 P2P per peer; NVLink domain = the 8-GPU node). A ring channel
    # is 2 + 10 MiB over NVLink, 10 + 10 MiB on the channels a rank leaves its node by
    # (ceil(24 / members in the node)): world (1024, 8 per node) 21 x 12 + 3 x 20 = 312 MiB;
    # TP (8, in the node) 24 x 12 = 288; DP (16, stride 8: one per node) 24 x 20 = 480; model
    # parallel (t x p, 8 per node) 312; the tied-embedding pair (one per node) 480; stage 0's
    # pipeline neighbour is on another node: the two network P2P pools, 2 x 32 x 16 x 128 KiB =
    # 128 MiB.
    nccl = (312 + 288 + 480 + 312 + 480 + 128) * 2**20
    assert nccl == 2_097_152_000
    assert memory.reserved_peak == 32_656_960_000 + 512 * 2**20 + nccl == 35_290_982_912
    assert memory.headroom == (81_920 - 834) * 2**20 - 35_290_982_912 == 49_733_850_624


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
