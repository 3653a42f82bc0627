"""Inference: the forward block algebra, prefill / decode formulas pinned to hand computations,
the pipeline formulas, KV-cache memory, and the refusal of training-only constructs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from blueprinting.analysis.memory import block_parameters_per_rank
from blueprinting.errors import ConfigError, InvalidStrategyError
from blueprinting.hardware.efficiency import ConstantEfficiency
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import ComputeEngineSpec, SystemSpec
from blueprinting.inference.analysis import (
    analyze_inference,
    decode_round,
    pipeline_fill_latency,
)
from blueprinting.inference.memory import kv_cache_bytes, max_batch_that_fits, memory_per_gpu
from blueprinting.mapping.flat_keys import inference_from_mapping
from blueprinting.mapping.model import (
    Datatype,
    EmbeddingTying,
    MlpActivation,
    Normalization,
    PositionEmbedding,
    TransformerModelSpec,
)
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    DataParallel,
    InferenceSpec,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    PipelineParallel,
    PipelineSchedule,
    TransformerInferenceParallelism,
    ZeroBubbleH1,
)
from blueprinting.synthesizer.dialects.transformer.inference import (
    InferenceStepDims,
    inference_step_work,
    kv_groups_per_rank,
)
from blueprinting.synthesizer.dialects.transformer.inference_derivation import (
    derive_inference_plan,
)

TINY = TransformerModelSpec(
    name="tiny-gqa",
    num_layers=4,
    hidden_size=64,
    num_attention_heads=8,
    num_query_groups=2,
    kv_channels=8,
    ffn_hidden_size=128,
    seq_length=4096,
    vocab_size=256,
    padded_vocab_size=256,
    activation=MlpActivation.SWIGLU,
    normalization=Normalization.RMSNORM,
    position_embedding=PositionEmbedding.ROPE,
    embeddings=EmbeddingTying.UNTIED,
    add_bias_linear=False,
)


def _spec(model: TransformerModelSpec, **keys: int | str | bool) -> InferenceSpec:
    base: dict[str, object] = {"batch_size": 1, "prompt_length": 16, "generated_tokens": 8}
    base.update(keys)
    return inference_from_mapping(base, model=model)


def _ideal(system: SystemSpec) -> SystemSpec:
    """The preset with every efficiency 1: op times are exactly FLOPs/peak or bytes/bandwidth."""
    one = ConstantEfficiency(fraction=1.0)
    acc = system.accelerator

    def engine(spec: ComputeEngineSpec) -> ComputeEngineSpec:
        return ComputeEngineSpec(rates=tuple(replace(r, efficiency=one) for r in spec.rates))

    accelerator = replace(
        acc,
        matrix=engine(acc.matrix),
        vector=engine(acc.vector),
        hbm=replace(acc.hbm, efficiency=one),
    )
    return replace(system, accelerator=accelerator)


# ---- the algebra ---------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_block_weight_bytes_are_the_rank_parameters(tp: int) -> None:
    """Every parameter of a block is read exactly once per step (t = 4, 8 > groups replicate
    the KV heads, as Megatron does)."""
    step = inference_step_work(
        TINY,
        InferenceStepDims(batch=3, new_tokens=1, cached_tokens=20),
        tp=tp,
        sequence_parallel=False,
        kv_datatype=Datatype.BF16,
    )
    assert sum(op.weight_bytes for op in step.block) == 2 * block_parameters_per_rank(TINY, tp)


def test_groups_per_rank_replicate_beyond_the_group_count() -> None:
    assert [kv_groups_per_rank(TINY, t) for t in (1, 2, 4, 8)] == [2, 1, 1, 1]


def test_prefill_flops_by_hand() -> None:
    """Prefill of b sequences of P tokens, t = 1: every GEMM 2 * (b P) * weights; causal
    attention 2 x 2 d heads b P (P + 1) / 2; the LM head on the last token only."""
    b, p = 2, 16
    step = inference_step_work(
        TINY,
        InferenceStepDims(batch=b, new_tokens=p, cached_tokens=0),
        tp=1,
        sequence_parallel=False,
        kv_datatype=Datatype.BF16,
    )
    h, d, heads, groups, f = 64, 8, 8, 2, 128
    gemm_weights = h * (heads + 2 * groups) * d + heads * d * h + h * 2 * f + f * h
    attention = 2 * 2 * d * heads * b * p * (p + 1) // 2
    assert sum(op.work.matrix_flops for op in step.block) == 2 * b * p * gemm_weights + attention
    assert sum(op.work.matrix_flops for op in step.last_stage) == 2 * b * h * 256


def test_decode_kv_cache_reads_by_hand() -> None:
    """A decode step on c0 cached tokens reads K and V of c0 + 1 positions per group."""
    b, c0 = 3, 99
    for tp, groups_per_rank in ((1, 2), (2, 1), (8, 1)):
        step = inference_step_work(
            TINY,
            InferenceStepDims(batch=b, new_tokens=1, cached_tokens=c0),
            tp=tp,
            sequence_parallel=False,
            kv_datatype=Datatype.FP8,
        )
        kv = sum(op.kv_cache_bytes for op in step.block)
        assert kv == 2 * b * groups_per_rank * 8 * (c0 + 1) * 1
        heads = 8 // tp
        flops = sum(op.work.matrix_flops for op in step.block if op.kv_cache_bytes)
        assert flops == 2 * 2 * 8 * heads * b * (c0 + 1)


# ---- analysis by hand ----------------------------------------------------------------------
def test_decode_at_batch_one_is_the_hbm_bound() -> None:
    """t = p = 1, batch 1, ideal efficiencies: every op is memory-bound (intensity ~1 FLOP/byte
    against a machine balance of ~295), so a decode step takes exactly its bytes / bandwidth:
    weights once, the KV cache of the context, the activations."""
    system = _ideal(system_preset("dgx-h100"))
    spec = _spec(TINY)
    report = analyze_inference(spec, system)
    bandwidth = 3350e9
    bounds = report.decode_bounds
    # weights: blocks + final norm + LM head + one embedding row, bf16
    weights = 2 * (4 * TINY.block_parameters + 64 + 64 * 256 + 64)
    assert bounds.weight_bytes == weights
    # KV cache: mean context over the g - 1 = 7 steps: 16 + j, j = 1..7 -> mean 20
    assert bounds.kv_cache_bytes == pytest.approx(4 * 2 * 2 * 8 * 20 * 2)
    # the fused softmax touches no HBM: its 5 FLOPs per (query, key) pair run on the vector
    # engine, 4 layers x 8 heads x mean context 20
    softmax_s = 5 * 4 * 8 * 20 / 133.8e12
    total = bounds.weight_bytes + bounds.kv_cache_bytes + bounds.activation_bytes
    assert bounds.hbm_s == pytest.approx(total / bandwidth, rel=1e-12)
    assert report.decode_round_mean_s == pytest.approx(total / bandwidth + softmax_s, rel=1e-12)
    assert report.decode_round_final_s > report.decode_round_mean_s


def test_prefill_of_a_long_prompt_is_compute_bound_by_hand() -> None:
    """A 4096-token prefill of a wide model at ideal efficiency: the GEMMs are compute-bound, so
    the GEMM part of the prefill is exactly FLOPs / peak."""
    wide = replace(
        TINY,
        hidden_size=2048,
        kv_channels=128,
        num_attention_heads=16,
        num_query_groups=4,
        ffn_hidden_size=8192,
        padded_vocab_size=2048,
        vocab_size=2048,
    )
    system = _ideal(system_preset("dgx-h100"))
    spec = _spec(wide, prompt_length=4096, generated_tokens=1)
    report = analyze_inference(spec, system)
    bounds = report.prefill_bounds
    h, d, heads, groups, f, tokens = 2048, 128, 16, 4, 8192, 4096
    gemm_weights = h * (heads + 2 * groups) * d + heads * d * h + h * 2 * f + f * h
    attention = 4 * d * heads * tokens * (tokens + 1) // 2
    matrix = 4 * (2 * tokens * gemm_weights + attention) + 2 * h * 2048
    assert bounds.matrix_flops == matrix
    assert bounds.compute_s == pytest.approx(matrix / 989e12 + bounds.vector_flops / 133.8e12)
    # the modelled prefill is at least the compute bound and exceeds it only by the
    # memory-bound element-wise ops
    assert report.prefill_latency_s >= bounds.compute_s
    assert report.decode_steps == 0
    assert report.decode_total_s == 0.0


def test_pipeline_formulas() -> None:
    assert pipeline_fill_latency((1.0, 2.0, 3.0), 1, 0.5) == 7.0
    assert pipeline_fill_latency((1.0, 2.0, 3.0), 2, 0.5) == 10.0
    assert pipeline_fill_latency((2.0,), 1, 0.0) == 2.0
    assert decode_round((1.0, 2.0, 3.0), 3, 0.5, 0.1) == 9.0
    assert decode_round((1.0, 2.0, 3.0), 1, 0.5, 0.1) == pytest.approx(7.1)
    assert decode_round((2.0,), 1, 0.0, 0.0) == 2.0


def test_pipeline_stages_add_latency() -> None:
    system = system_preset("dgx-h100")
    one = analyze_inference(_spec(TINY, batch_size=4), system)
    two = analyze_inference(_spec(TINY, batch_size=4, pipeline_model_parallel_size=2), system)
    assert two.microbatches == 2
    assert two.microbatch_size == 2
    assert two.decode_round_mean_s > 0
    assert two.memory.weights < one.memory.weights


# ---- Llama 2 70B at TP8 on a DGX H100 ------------------------------------------------------
def test_llama2_70b_tp8_dgx_h100() -> None:
    model = model_preset("llama2-70b")
    spec = _spec(
        model,
        tensor_model_parallel_size=8,
        batch_size=1,
        prompt_length=2048,
        generated_tokens=256,
    )
    system = system_preset("dgx-h100")
    report = analyze_inference(spec, system)
    # weights per GPU: 80 blocks / 8 + embedding / 8 + LM head / 8 + final norm, bf16
    params = 80 * block_parameters_per_rank(model, 8) + 2 * 4000 * 8192 + 8192
    assert report.memory.weights == 2 * params
    assert report.memory.kv_cache == 2 * 80 * 1 * 128 * (2048 + 256) * 1 * 2
    decode = report.decode_bounds
    # decode at batch 1 is memory-bound: modelled = bytes / (0.9 bandwidth) + TP collectives
    ops = decode.modelled_s - decode.tp_comm_s
    assert ops == pytest.approx(decode.hbm_s / 0.9, rel=0.02)
    assert decode.compute_s < decode.hbm_s / 20
    # 2 all-reduces per block and 1 for the embedding, the logits all-gather: latency-bound
    assert decode.tp_comm_s == pytest.approx(162 * 10e-6, rel=0.05)
    assert report.decode_round_mean_s == pytest.approx(7.1e-3, rel=0.05)
    prefill = report.prefill_bounds
    assert prefill.compute_s > prefill.hbm_s
    assert report.prefill_latency_s == pytest.approx(0.087, rel=0.1)


# ---- memory --------------------------------------------------------------------------------
def test_max_batch_that_fits_is_the_boundary() -> None:
    model = model_preset("llama2-70b")
    spec = _spec(model, tensor_model_parallel_size=8, prompt_length=2048, generated_tokens=256)
    plan = derive_inference_plan(spec.model, spec.mapping)
    capacity = 80e9
    largest = max_batch_that_fits(plan, capacity=capacity)
    assert memory_per_gpu(plan, batch=largest, capacity=capacity).fits
    assert not memory_per_gpu(plan, batch=largest + 1, capacity=capacity).fits
    assert kv_cache_bytes(plan, 0, 16) == 16 * 2 * 80 * 128 * 2304 * 2


def test_weights_that_do_not_fit_give_zero() -> None:
    model = model_preset("llama2-70b")
    spec = _spec(model, prompt_length=128, generated_tokens=8)
    plan = derive_inference_plan(spec.model, spec.mapping)
    assert max_batch_that_fits(plan, capacity=80e9) == 0


# ---- training-only constructs are refused --------------------------------------------------
@pytest.mark.parametrize(
    "schedule",
    [
        OneForwardOneBackward(),
        InterleavedOneForwardOneBackward(virtual_stages=2),
        ZeroBubbleH1(),
    ],
)
def test_training_schedules_are_refused(schedule: PipelineSchedule) -> None:
    spec = _spec(TINY, pipeline_model_parallel_size=2)
    parallelism = replace(
        spec.mapping.parallelism, pipeline=PipelineParallel(degree=2, schedule=schedule)
    )
    mapping = replace(spec.mapping, parallelism=parallelism)
    with pytest.raises(InvalidStrategyError) as caught:
        derive_inference_plan(TINY, mapping)
    (violation,) = caught.value.violations
    assert violation.law == "inference_schedule"
    assert "is a training schedule; inference runs the static ForwardOnly pipeline" in (
        violation.message
    )


def test_data_parallel_replicas_are_refused() -> None:
    spec = _spec(TINY)
    parallelism = TransformerInferenceParallelism(
        tensor=spec.mapping.parallelism.tensor,
        pipeline=spec.mapping.parallelism.pipeline,
        replicas=DataParallel(degree=2),  # type: ignore[arg-type]
    )
    mapping = replace(spec.mapping, parallelism=parallelism)
    with pytest.raises(InvalidStrategyError) as caught:
        derive_inference_plan(TINY, mapping)
    (violation,) = caught.value.violations
    assert violation.law == "inference_replicas"
    assert violation.message == (
        "DataParallel is not an inference replica dimension; DataParallel synchronizes "
        "gradients, serving replicas are ReplicaParallel"
    )


@pytest.mark.parametrize(
    "key",
    [
        "data_parallel_size",
        "micro_batch_size",
        "num_virtual_stages_per_pipeline_rank",
        "use_distributed_optimizer",
        "recompute_granularity",
    ],
)
def test_training_keys_are_refused_by_name(key: str) -> None:
    value: object = "full" if key == "recompute_granularity" else 2
    if key == "use_distributed_optimizer":
        value = True
    with pytest.raises(ConfigError) as caught:
        inference_from_mapping(
            {"batch_size": 1, "prompt_length": 8, "generated_tokens": 2, key: value}, model=TINY
        )
    assert any(key in p and "training-only key" in p for p in caught.value.problems)


def test_laws_are_reported_all_at_once() -> None:
    spec = _spec(TINY, tensor_model_parallel_size=3, pipeline_model_parallel_size=3)
    with pytest.raises(InvalidStrategyError) as caught:
        derive_inference_plan(spec.model, spec.mapping)
    laws = {v.law for v in caught.value.violations}
    assert {"attention_heads_per_tensor_rank", "blocks_per_pipeline_stage"} <= laws
