"""Inference: the forward block algebra, prefill / decode formulas pinned to hand computations,
the pipeline formulas, KV-cache memory, and the refusal of training-only constructs."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from blueprinting.analysis.rank_parameters import block_parameters_per_rank
from blueprinting.errors import ConfigError, InvalidStrategyError
from blueprinting.hardware.efficiency import ConstantEfficiency
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import ComputeEngineSpec, SystemSpec
from blueprinting.inference.analysis import (
    analyze_inference,
    decode_contexts,
    decode_round,
    pipeline_fill_latency,
)
from blueprinting.inference.memory import kv_cache_bytes, max_batch_that_fits, memory_per_gpu
from blueprinting.limits import MAX_EXACT_DECODE_STEPS
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
    # TINY's block: QKV h (q + 2k) = 64 (64 + 2 x 16) = 6144, output 64 x 64 = 4096, SwiGLU up
    # 64 x 256 = 16384, down 128 x 64 = 8192, two RMSNorms 2 x 64 = 128: 34,944 (no biases).
    block = 6144 + 4096 + 16384 + 8192 + 128
    assert block == TINY.block_parameters == 34_944
    # One stage: 4 blocks, the word embedding and the untied LM head (256 x 64 each), the final
    # norm (64); bf16.
    assert one.memory.weights == 2 * (4 * block + 2 * 256 * 64 + 64) == 345_216
    # Two stages: 2 blocks each; stage 0 adds the embedding, stage 1 the LM head and the final
    # norm, so stage 1 is the most loaded (KV cache and activations are the same on both).
    assert two.memory.stage == 1
    assert two.memory.weights == 2 * (2 * block + 256 * 64 + 64) == 172_672
    # KV cache: 2 (K, V) x layers x 2 groups x 8 channels x (16 + 8) tokens x 4 sequences x 2 B.
    assert one.memory.kv_cache == 2 * 4 * 2 * 8 * 24 * 4 * 2 == 24_576
    assert two.memory.kv_cache == 2 * 2 * 2 * 8 * 24 * 4 * 2 == 12_288
    # Activations: the residual stream (tokens x h x 2 B) plus the largest op, the SwiGLU
    # activation (reads 2f = 256, writes f = 128 per token): tokens x (128 + 768) bytes, with
    # 4 x 16 tokens on one stage and microbatches of 2 x 16 on two.
    assert one.memory.activations == 64 * (128 + 768) == 57_344
    assert two.memory.activations == 32 * (128 + 768) == 28_672
    # Latency: the two-stage pipeline pays P2P hops on the intra-node link (10 us latency +
    # bytes / (450 GB/s x 0.82)). Prefill of m = 2 microbatches of 2 x 16 tokens: T0 + T1 + P2P
    # + max(T0, T1, P2P) >= 2 P2P with P2P = 10 us + 2 x 16 x 64 x 2 B / 369 GB/s.
    link = 450e9 * 0.82
    prefill_p2p = 10e-6 + 2 * 16 * 64 * 2 / link
    assert two.prefill_latency_s > 2 * prefill_p2p
    assert two.prefill_latency_s > one.prefill_latency_s
    # A decode round is at least the hidden state forward (2 x 64 x 2 B) plus the sampled
    # token ids back (2 x 8 B): two hops, where one stage has none.
    decode_hops = (10e-6 + 2 * 64 * 2 / link) + (10e-6 + 2 * 8 / link)
    assert two.decode_round_mean_s > decode_hops
    assert two.decode_round_mean_s > one.decode_round_mean_s
    assert one.decode_round_mean_s < 10e-6


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
    # decode at batch 1 is memory-bound: modelled = bytes / (0.89 bandwidth) + TP collectives
    ops = decode.modelled_s - decode.tp_comm_s
    assert ops == pytest.approx(decode.hbm_s / 0.89, rel=0.02)
    assert decode.compute_s < decode.hbm_s / 20
    # 2 all-reduces per block and 1 for the embedding, the logits all-gather: latency-bound
    assert decode.tp_comm_s == pytest.approx(162 * 10e-6, rel=0.05)
    assert report.decode_round_mean_s == pytest.approx(7.1e-3, rel=0.05)
    prefill = report.prefill_bounds
    assert prefill.compute_s > prefill.hbm_s
    assert report.prefill_latency_s == pytest.approx(0.087, rel=0.1)

    # --- decode, by hand (p = 1, one microbatch: the round is one step of the stage) ----------
    h, q, kv, up, f, vocab = 8192, 1024, 128, 7168, 3584, 4000  # widths per rank (t = 8)
    # Bytes read per step: every block's weights, the final norm and the LM head, but only one
    # row of the embedding (not the whole table the memory holds).
    block_bytes = 2 * (h * (q + 2 * kv) + q * h + h * up + f * h + 2 * h)
    weights = 80 * block_bytes + 2 * h + 2 * h * vocab + 2 * h
    assert weights == 17_180_950_528
    assert weights == report.memory.weights - 2 * vocab * h + 2 * h
    assert decode.weight_bytes == weights
    # KV cache: step j = 1..255 reads K and V of 2048 + j positions (one group per rank):
    # mean 2048 + 128 = 2176 positions x 2 x 128 channels x 2 B x 80 layers.
    kv_bytes = 80 * 2 * 128 * 2176 * 2
    assert kv_bytes == 89_128_960
    assert decode.kv_cache_bytes == kv_bytes
    # Activations per block (one token, 2 B): norms read + write h (2 x 32768); QKV reads h,
    # writes q + 2k (16384 + 2560); QK^T reads q (2048); attention-over-V writes q (2048);
    # output projection reads q, writes h (2048 + 16384); residual adds read 2h, write h
    # (2 x 49152); MLP up reads h, writes u (16384 + 14336); SwiGLU reads u, writes f
    # (14336 + 7168); MLP down reads f, writes h (7168 + 16384). Plus the embedding (8 B token
    # id + a row), the final norm and the LM head (reads h, writes V/t).
    per_block = 2 * 32768 + 18944 + 2048 + 2048 + 18432 + 2 * 49152 + 30720 + 21504 + 23552
    assert per_block == 281_088
    activations = 80 * per_block + (8 + 2 * h) + 2 * 2 * h + (2 * h + 2 * vocab)
    assert activations == 22_560_584
    assert decode.activation_bytes == activations
    bandwidth = 3350e9
    assert decode.hbm_s == pytest.approx((weights + kv_bytes + activations) / bandwidth, rel=1e-12)
    # Modelled: every op is HBM-bound at batch 1 (a 1-row GEMM reaches 0.80 x 1/129 of 989
    # TFLOP/s = 6.13 TFLOP/s against 2 FLOPs per 2 B at 0.89 x 3.35 TB/s = 2.98 TB/s), except
    # the fused softmax, which touches no HBM: 5 FLOPs per (query, key) pair on the vector
    # engine, 8 heads x 2176 keys x 80 layers at 0.9 x 133.8 TFLOP/s. TP collectives on NVLink
    # (latency 10 us, 450 GB/s x 0.82): 2 x 80 + 1 all-reduces of h x 2 B (wire factor 2 x 7/8)
    # and one all-gather of the V x 2 B logits (7/8). HBM 0.89, NVLink 0.82, GEMM 0.80: the
    # preset's microbenchmark fractions (presets.py).
    link = 450e9 * 0.82
    tp_comm = 161 * (10e-6 + 2 * h * 2 * 7 / 8 / link) + (10e-6 + 2 * 32000 * 7 / 8 / link)
    assert decode.tp_comm_s == pytest.approx(tp_comm, rel=1e-12)
    softmax = 5 * 8 * 2176 * 80 / (133.8e12 * 0.9)
    expected = (weights + kv_bytes + activations) / (bandwidth * 0.89) + softmax + tp_comm
    assert expected == pytest.approx(7.4327e-3, rel=1e-4)
    assert decode.modelled_s == pytest.approx(expected, rel=1e-9)
    assert report.decode_round_mean_s == pytest.approx(expected, rel=1e-9)

    # --- prefill, by hand -------------------------------------------------------------------
    # Matrix FLOPs (t = 8): per block 2 P x GEMM weights per rank + causal attention
    # 4 d (a/t) P (P + 1) / 2; the LM head on the last token only.
    tokens = 2048
    gemm_weights = h * (q + 2 * kv) + q * h + h * up + f * h
    per_block_flops = 2 * tokens * gemm_weights + 4 * 128 * 8 * tokens * (tokens + 1) // 2
    assert per_block_flops == 446_680_793_088
    matrix = 80 * per_block_flops + 2 * h * vocab
    assert prefill.matrix_flops == matrix == 35_734_528_983_040
    # TP collectives: the same 161 all-reduces, now of P x h x 2 B, and the logits all-gather.
    prefill_comm = 161 * (10e-6 + tokens * h * 2 * 2 * 7 / 8 / link) + (
        10e-6 + 2 * 32000 * 7 / 8 / link
    )
    assert prefill.tp_comm_s == pytest.approx(prefill_comm, rel=1e-12)
    # On an ideal system (every accelerator efficiency 1; links unchanged) the block GEMMs are
    # compute-bound (>= 600 FLOP/B against a balance of 295), the element-wise ops, the
    # embedding and the 1-row LM head are HBM-bound, and the fused softmax is vector work over
    # the P (P + 1) / 2 causal pairs: the prefill is exactly
    #   block GEMMs / 989 TFLOP/s + softmax / 133.8 TFLOP/s + element-wise bytes / 3.35 TB/s
    #   + TP collectives.
    ideal = analyze_inference(spec, _ideal(system))
    softmax_flops = 80 * 5 * 8 * tokens * (tokens + 1) // 2
    row = tokens * h * 2  # one h-wide activation of the prompt, bf16
    # per block: 2 norms (read + write + h weights), 2 residual adds (3 rows), SwiGLU
    # (reads u, writes f per token)
    elementwise = 80 * (2 * (2 * row + 2 * h) + 2 * 3 * row + tokens * (up + f) * 2)
    elementwise += (8 * tokens + 2 * row) + (2 * row + 2 * h)  # embedding, final norm
    elementwise += 2 * h * vocab + 2 * h + 2 * vocab  # LM head weights, last input, logits
    assert elementwise == 30_569_193_280
    ideal_prefill = (
        80 * per_block_flops / 989e12
        + softmax_flops / 133.8e12
        + elementwise / bandwidth
        + prefill_comm
    )
    assert ideal.prefill_latency_s == pytest.approx(ideal_prefill, rel=1e-9)
    # The real efficiencies only slow it down.
    assert report.prefill_latency_s > ideal.prefill_latency_s


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


def test_decode_contexts_are_every_step_up_to_the_limit() -> None:
    assert decode_contexts(2048, 1) == [2048]
    assert decode_contexts(2048, 4) == [2048, 2049, 2050]
    steps = MAX_EXACT_DECODE_STEPS
    assert decode_contexts(10, steps + 1) == list(range(10, 10 + steps))


def test_decode_contexts_beyond_the_limit_are_evenly_spaced_with_both_ends() -> None:
    generated = 2**40
    contexts = decode_contexts(7, generated)
    assert len(contexts) == MAX_EXACT_DECODE_STEPS
    assert contexts[0] == 7
    assert contexts[-1] == 7 + generated - 2  # the last step's cache: prompt + g - 2
    assert contexts == sorted(set(contexts))


def test_a_huge_generation_answers_at_once_from_sampled_steps() -> None:
    """Issue #18: 2**40 generated tokens cost 4,096 steps, not 2**40."""
    system = system_preset("dgx-h100")
    model = model_preset("llama2-7b")
    spec = _spec(model, prompt_length=16, generated_tokens=2**40)
    start = time.perf_counter()
    report = analyze_inference(spec, system)
    assert time.perf_counter() - start < 5.0
    assert report.decode_steps == 2**40 - 1
    assert report.decode_total_s == report.decode_round_mean_s * (2**40 - 1)
    exact = analyze_inference(_spec(model, prompt_length=16, generated_tokens=64), system)
    # The first sampled step is the exact run's first step: the mean grows with the context.
    assert report.decode_round_mean_s > exact.decode_round_mean_s
    assert exact.decode_total_s == pytest.approx(exact.decode_round_mean_s * 63, rel=1e-12)
