"""Memory per GPU pinned to hand-computed values and to Korthikanti et al. 2022's figures."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.analysis.memory import (
    MemoryBreakdown,
    checkpoint_bytes,
    in_flight_microbatches,
    layer_activation_bytes,
    megatron_theoretical_memory,
    memory_per_gpu,
    memory_per_stage,
    precision_recipe,
    stage_activations,
    stage_memory,
    stage_parameters,
)
from blueprinting.analysis.rank_parameters import block_parameters_per_rank
from blueprinting.analysis.stage_layout import chunk_layer_counts, stage_layer_counts
from blueprinting.errors import ConfigError, InvalidStrategyError, UnsupportedError
from blueprinting.mapping.model import (
    Datatype,
    EmbeddingTying,
    MlpActivation,
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import (
    AllReduce,
    AttentionKernel,
    BatchSpec,
    DataParallel,
    DistributedOptimizer,
    ForwardOnly,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    NoRecompute,
    OneForwardOneBackward,
    OptimizerSharding,
    PipelineParallel,
    PipelineSchedule,
    RecomputeMethod,
    RecomputeModule,
    RecomputePolicy,
    ReduceScatterAllGather,
    SelectiveRecompute,
    ShardedGradients,
    ShardedParameters,
    SingleStage,
    TensorParallel,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    UnevenStages,
    UnfusedAttention,
)
from tests.reference import shared_reference
from tests.synthesizer.models import LLAMA2_70B

GIB = 2**30


def gpt(*, layers: int, hidden: int, heads: int, seq: int = 2048) -> TransformerModelSpec:
    return TransformerModelSpec(
        name="gpt",
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=heads,
        kv_channels=hidden // heads,
        ffn_hidden_size=4 * hidden,
        seq_length=seq,
        vocab_size=51200,
        padded_vocab_size=51200,
    )


GPT3_175B = gpt(layers=96, hidden=12288, heads=96)


def training(
    *,
    t: int = 1,
    p: int = 1,
    d: int = 1,
    microbatches: int = 1,
    micro_batch: int = 1,
    v: int = 1,
    sp: bool = False,
    recompute: RecomputePolicy | None = None,
    sharding: OptimizerSharding | None = None,
    schedule: PipelineSchedule | None = None,
    attention: AttentionKernel | None = None,
) -> TransformerTrainingMappingSpec:
    """Korthikanti's unfused attention unless ``attention`` is given: the figures of Table 2,
    Fig. 1 and Fig. 7 store the s x s scores."""
    if schedule is None:
        if p == 1:
            schedule = SingleStage()
        elif v == 1:
            schedule = OneForwardOneBackward()
        else:
            schedule = InterleavedOneForwardOneBackward(virtual_stages=v)
    return TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(
                degree=t, communication=ReduceScatterAllGather() if sp else AllReduce()
            ),
            pipeline=PipelineParallel(degree=p, schedule=schedule),
            data=DataParallel(
                degree=d, optimizer_sharding=NoOptimizerSharding() if sharding is None else sharding
            ),
            recompute=NoRecompute() if recompute is None else recompute,
        ),
        batch=BatchSpec(
            global_batch_size=d * micro_batch * microbatches, micro_batch_size=micro_batch
        ),
        attention=UnfusedAttention() if attention is None else attention,
    )


# --- precision -----------------------------------------------------------------------------------
def test_precision_recipes_match_megatron_bytes_per_parameter() -> None:
    bf16 = precision_recipe(Datatype.BF16)
    assert (bf16.param + bf16.grad, bf16.optimizer, bf16.total) == (6, 12, 18)
    fp16 = precision_recipe(Datatype.FP16)
    assert (fp16.param + fp16.grad, fp16.optimizer, fp16.total) == (4, 16, 20)
    fp32 = precision_recipe(Datatype.FP32)
    assert (fp32.param + fp32.grad, fp32.optimizer, fp32.total) == (8, 8, 16)
    fp8 = precision_recipe(Datatype.FP8)
    assert (fp8.param, fp8.grad, fp8.optimizer, fp8.activation) == (2, 4, 12, 2)


# --- parameters ----------------------------------------------------------------------------------
def test_block_parameters_per_rank() -> None:
    h = 12288
    assert block_parameters_per_rank(GPT3_175B, 1) == GPT3_175B.block_parameters
    assert block_parameters_per_rank(LLAMA2_70B, 1) == LLAMA2_70B.block_parameters
    # t = 8: 12h^2/8 weights, column biases (3h + 4h)/8, row biases 2h and LayerNorms 4h replicated.
    assert block_parameters_per_rank(GPT3_175B, 8) == 12 * h * h // 8 + 7 * h // 8 + 2 * h + 4 * h
    assert block_parameters_per_rank(GPT3_175B, 8) == 226_576_896
    # Llama-2 70B t = 8: Q 8192/8, K and V one group of 128 each, up 2*28672/8, down 28672/8.
    q, kv, up, f, h2 = 1024, 128, 7168, 3584, 8192
    expected = h2 * (q + 2 * kv) + q * h2 + h2 * up + f * h2 + 2 * h2
    assert block_parameters_per_rank(LLAMA2_70B, 8) == expected == 106_971_136
    # t = 16 > 8 groups: each rank keeps one whole KV group (replicated), not half of one.
    q16 = 512
    expected16 = h2 * (q16 + 2 * 128) + q16 * h2 + h2 * 3584 + 1792 * h2 + 2 * h2
    assert block_parameters_per_rank(LLAMA2_70B, 16) == expected16


def test_stage_parameters_gpt3_tied_embedding_copy_on_last_stage() -> None:
    mapping = training(t=8, p=8, d=1, microbatches=64)
    bp = block_parameters_per_rank(GPT3_175B, 8)
    first = stage_parameters(GPT3_175B, mapping, 0)
    # 12 blocks, word embedding 51200*12288/8, learned positions 2048*12288 replicated.
    assert first.total == 12 * bp + 51200 * 12288 // 8 + 2048 * 12288
    middle = stage_parameters(GPT3_175B, mapping, 3)
    assert middle.total == 12 * bp
    last = stage_parameters(GPT3_175B, mapping, 7)
    # Megatron keeps a copy of the tied word embedding on the last stage, plus the final norm.
    assert last.total == 12 * bp + 51200 * 12288 // 8 + 2 * 12288
    single = stage_parameters(GPT3_175B, training(), 0)
    assert single.total == GPT3_175B.num_parameters


def test_stage_parameters_llama_untied_single_stage_is_the_whole_model() -> None:
    assert stage_parameters(LLAMA2_70B, training(), 0).total == LLAMA2_70B.num_parameters


def test_uneven_stage_layout() -> None:
    model = gpt(layers=10, hidden=64, heads=4)
    pipeline = PipelineParallel(
        degree=4,
        schedule=OneForwardOneBackward(),
        layout=UnevenStages(first_stage_layers=1, last_stage_layers=3),
    )
    assert stage_layer_counts(model, pipeline) == (1, 3, 3, 3)
    only_last = PipelineParallel(
        degree=3, schedule=OneForwardOneBackward(), layout=UnevenStages(last_stage_layers=2)
    )
    assert stage_layer_counts(model, only_last) == (4, 4, 2)
    interleaved = PipelineParallel(
        degree=4, schedule=InterleavedOneForwardOneBackward(virtual_stages=2)
    )
    assert chunk_layer_counts(gpt(layers=16, hidden=64, heads=4), interleaved) == ((2, 2),) * 4
    too_many = PipelineParallel(
        degree=2,
        schedule=OneForwardOneBackward(),
        layout=UnevenStages(first_stage_layers=8, last_stage_layers=8),
    )
    with pytest.raises(InvalidStrategyError, match="checking the uneven stage layout"):
        stage_layer_counts(model, too_many)


# --- activations per layer: Korthikanti et al. 2022, Table 2 -------------------------------------
# GPT-3 175B, b = 1: s b h = 2048 * 12288 = 25,165,824; 5 a s / h = 5*96*2048/12288 = 80.
SBH = 2048 * 12288


def _layer(t: int, *, sp: bool, scores: bool, model: TransformerModelSpec = GPT3_175B) -> int:
    return layer_activation_bytes(
        model,
        micro_batch=1,
        tensor_degree=t,
        sequence_parallel=sp,
        attention=UnfusedAttention(),  # Korthikanti's figures store the s x s scores
        recomputed=frozenset() if scores else frozenset({RecomputeModule.CORE_ATTN}),
        activation_bytes=2,
    )


def test_korthikanti_table2_per_layer_formulas() -> None:
    assert SBH == 25_165_824
    # No parallelism: sbh (34 + 5as/h) = 114 sbh.
    assert _layer(1, sp=False, scores=True) == SBH * (34 + 80)
    # TP (t = 8): sbh (10 + 24/t + 5as/(ht)) = sbh (10 + 3 + 10) = 23 sbh.
    assert _layer(8, sp=False, scores=True) == SBH * 23
    # TP + SP: sbh (34 + 5as/h) / t = 114/8 sbh = 14.25 sbh.
    assert _layer(8, sp=True, scores=True) * 8 == SBH * 114
    # Selective, TP: sbh (10 + 24/t) = 13 sbh; TP + SP: 34 sbh / t.
    assert _layer(8, sp=False, scores=False) == SBH * 13
    assert _layer(8, sp=True, scores=False) * 8 == SBH * 34
    # Full recompute: 2 sbh per layer, / t with SP.
    assert checkpoint_bytes(
        GPT3_175B, micro_batch=1, tensor_degree=8, sequence_parallel=False, activation_bytes=2
    ) == (2 * SBH)
    assert checkpoint_bytes(
        GPT3_175B, micro_batch=1, tensor_degree=8, sequence_parallel=True, activation_bytes=2
    ) == (2 * SBH // 8)


def test_general_per_layer_count_matches_megatron_18_plus_4ffn_over_h() -> None:
    # Megatron's theoretical_memory_usage: SP + selective, s b h (18 + 4 ffn/h) / t, for MHA GELU
    # with any ffn; here ffn = 3h: (18 + 12) sbh / t.
    model = TransformerModelSpec(
        name="ffn3h",
        num_layers=2,
        hidden_size=1024,
        num_attention_heads=16,
        num_query_groups=16,
        kv_channels=64,
        ffn_hidden_size=3072,
        seq_length=512,
        vocab_size=1000,
        padded_vocab_size=1024,
    )
    assert _layer(4, sp=True, scores=False, model=model) * 4 == 512 * 1024 * 30


def test_llama_per_layer_gqa_swiglu() -> None:
    # Llama-2 70B, t = 8, SP, selective, b = 1, s = 4096, h = 8192: per token per rank
    # 10h/8 (norm/GEMM inputs + masks, sequence-sharded) + 2 (2q + 2k + u + f) with
    # q = 1024, k = 128, u = 7168, f = 3584: 2 * 13056 = 26112; 10*8192/8 = 10240.
    s = 4096
    assert _layer(8, sp=True, scores=False, model=LLAMA2_70B) == s * (10240 + 26112)


# --- in-flight microbatches: schedules.md section 5 ----------------------------------------------
def test_in_flight_non_interleaved() -> None:
    one_f_one_b = OneForwardOneBackward()
    counts = [
        in_flight_microbatches(one_f_one_b, pipeline_degree=4, stage=r, microbatches=8)
        for r in range(4)
    ]
    assert counts == [(4,), (3,), (2,), (1,)]
    few = [
        in_flight_microbatches(one_f_one_b, pipeline_degree=4, stage=r, microbatches=2)
        for r in range(4)
    ]
    assert few == [(2,), (2,), (2,), (1,)]
    assert in_flight_microbatches(SingleStage(), pipeline_degree=1, stage=0, microbatches=8) == (1,)


def test_in_flight_interleaved_matches_schedule_table() -> None:
    # p=4, v=2, m=8, N=4 (schedules.md example): rank 0 runs 11 forwards before B0.1:
    # F0.0-F3.0 (chunk 0), F0.1-F3.1 (chunk 1), F4.0-F6.0 (chunk 0) -> (7, 4).
    schedule = InterleavedOneForwardOneBackward(virtual_stages=2)
    assert in_flight_microbatches(schedule, pipeline_degree=4, stage=0, microbatches=8) == (7, 4)
    # rank 3: min(0 + 4 + 1, 16) = 5 -> F0.0-F3.0, F0.1.
    assert in_flight_microbatches(schedule, pipeline_degree=4, stage=3, microbatches=8) == (4, 1)
    # m = p = 4: min(2*3 + 4 + 1, 8) = 8, the true peak is p chunks of each... all 8 forwards.
    assert in_flight_microbatches(schedule, pipeline_degree=4, stage=0, microbatches=4) == (4, 4)
    with pytest.raises(UnsupportedError, match="ForwardOnly is an inference schedule"):
        in_flight_microbatches(ForwardOnly(), pipeline_degree=4, stage=0, microbatches=4)


# --- published activation memory (Korthikanti et al. 2022 Fig. 1 / Fig. 7 via Calculon) ----------
# Provenance: /work/shared/reference/published_runs.json rows calculon_fig1_* (per-GPU activation
# memory, GiB, first pipeline stage; Calculon's validation.py reading of Korthikanti Fig. 1) and
# calculon_fig7_* (activation memory as % of the TP-only baseline, Korthikanti Fig. 7).
# (name, L, h, heads, t, p, v, micro batch, global batch, GiB none, GiB SP+selective)
FIG1: tuple[tuple[str, int, int, int, int, int, int, int, int, float, float], ...] = (
    ("22B", 48, 6144, 64, 8, 1, 1, 4, 4, 59.25, 9.5625),
    ("175B", 96, 12288, 96, 8, 8, 3, 1, 64, 66.84375, 12.3515625),
    ("530B", 105, 20480, 128, 8, 35, 3, 1, 280, 114.0234375, 23.076171875),
    ("1T", 128, 25600, 160, 8, 64, 1, 1, 512, 131.25, 26.5625),
)
# (name, % with SP, % selective, % SP + selective, % full), baseline = TP only, no recompute.
FIG7: dict[str, tuple[float, float, float, float]] = {
    "22B": (66.84, 49.42, 16.18, 7.64),
    "175B": (62.04, 56.53, 18.49, 8.71),
    "530B": (58.31, 62.04, 20.27, 9.42),
    "1T": (58.31, 62.04, 20.27, 9.42),
}


def _fig_mapping(
    row: tuple[str, int, int, int, int, int, int, int, int, float, float],
    *,
    sp: bool,
    recompute: RecomputePolicy,
) -> tuple[TransformerModelSpec, TransformerTrainingMappingSpec]:
    _, layers, hidden, heads, t, p, v, micro, global_batch, _, _ = row
    model = gpt(layers=layers, hidden=hidden, heads=heads)
    mapping = training(
        t=t,
        p=p,
        v=v,
        micro_batch=micro,
        microbatches=global_batch // micro,
        sp=sp,
        recompute=recompute,
    )
    return model, mapping


@pytest.mark.parametrize("row", FIG1, ids=[row[0] for row in FIG1])
def test_korthikanti_fig1_activation_memory(
    row: tuple[str, int, int, int, int, int, int, int, int, float, float],
) -> None:
    for sp, recompute, published in (
        (False, NoRecompute(), row[9]),
        (True, SelectiveRecompute(), row[10]),
    ):
        model, mapping = _fig_mapping(row, sp=sp, recompute=recompute)
        acts = stage_activations(model, mapping, 0)
        assert acts.layers_stored / GIB == pytest.approx(published, rel=0.05)
        # With the embedding buffers still within 5%.
        with_buffers = acts.layers_stored + acts.embedding + acts.logits
        assert with_buffers / GIB == pytest.approx(published, rel=0.05)


def test_korthikanti_fig1_175b_is_exact_in_layers() -> None:
    # rank 0, p=8, v=3, m=64: min(2*7 + 2*8 + 1, 192) = 31 chunks of 4 layers = 124 layers,
    # Megatron's 96 * (1 + 7/24) = 124; 124 * 23 sbh = 66.84375 GiB exactly.
    model, mapping = _fig_mapping(FIG1[1], sp=False, recompute=NoRecompute())
    acts = stage_activations(model, mapping, 0)
    assert acts.in_flight == (15, 8, 8)
    assert acts.layers_stored == 124 * 23 * SBH
    assert acts.layers_stored / GIB == 66.84375


@pytest.mark.parametrize("row", FIG1, ids=[row[0] for row in FIG1])
def test_korthikanti_fig7_percentages(
    row: tuple[str, int, int, int, int, int, int, int, int, float, float],
) -> None:
    def stored(sp: bool, recompute: RecomputePolicy) -> int:
        model, mapping = _fig_mapping(row, sp=sp, recompute=recompute)
        return stage_activations(model, mapping, 0).layers_stored

    baseline = stored(False, NoRecompute())
    ours = (
        stored(True, NoRecompute()),
        stored(False, SelectiveRecompute()),
        stored(True, SelectiveRecompute()),
        stored(False, FullRecompute()),
    )
    for value, published in zip(ours, FIG7[row[0]], strict=True):
        assert 100 * value / baseline == pytest.approx(published, rel=0.05)


def test_fixture_matches_shared_published_runs() -> None:
    reference = shared_reference()
    if reference is None:
        pytest.skip("shared/reference/published_runs.json not found (set BLUEPRINTING_SHARED)")
    rows = {row["id"]: row for row in json.loads((reference / "published_runs.json").read_text())}
    for name, layers, hidden, heads, t, p, v, micro, global_batch, none, seqsel in FIG1:
        for suffix, value in (("none", none), ("seqsel", seqsel)):
            row = rows[f"calculon_fig1_{name}_{suffix}"]
            assert (row["model"]["L"], row["model"]["h"], row["model"]["a"]) == (
                layers,
                hidden,
                heads,
            )
            strategy = row["strategy"]
            assert (strategy["t"], strategy["p"], strategy["v"]) == (t, p, v)
            assert (strategy["micro_batch"], strategy["global_batch"]) == (micro, global_batch)
            assert row["measured"]["memory_activations_GiB"] == value
        for suffix, value in zip(("seq", "sel", "seqsel", "full"), FIG7[name], strict=True):
            measured = rows[f"calculon_fig7_{name}_{suffix}"]["measured"]
            assert measured["activation_memory_pct_of_tp_baseline"] == value


# --- the breakdown -------------------------------------------------------------------------------
def test_gpt3_breakdown_by_hand() -> None:
    # GPT-3 175B, t=8, p=8, d=16, v=1, m=32, b=1, SP + selective, distributed optimizer, bf16.
    mapping = training(
        t=8,
        p=8,
        d=16,
        microbatches=32,
        sp=True,
        recompute=SelectiveRecompute(),
        sharding=DistributedOptimizer(),
    )
    bp = 226_576_896
    params = 12 * bp + 51200 * 12288 // 8 + 2048 * 12288  # stage 0
    assert params == 2_718_922_752 + 78_643_200 + 25_165_824 == 2_822_731_776
    breakdown = stage_memory(GPT3_175B, mapping, stage=0, capacity_bytes=80 * 10**9)
    assert breakdown.weights == 2 * params
    assert breakdown.gradients == 4 * params
    assert breakdown.optimizer_states == 12 * params // 16
    # 8 microbatches in flight x 12 layers x 34 sbh / 8, plus one layer's s x s tensors
    # recomputed in backward (5 a s^2 b / t = 80 sbh / 8).
    assert breakdown.activations == 8 * 12 * 34 * SBH // 8 + 80 * SBH // 8
    # 8 in flight x (int64 token ids 8 s b + embedding dropout mask s b h / t).
    assert breakdown.other == 8 * (8 * 2048 + 2048 * 12288 // 8)
    assert breakdown.total == sum(
        (
            breakdown.weights,
            breakdown.gradients,
            breakdown.optimizer_states,
            breakdown.activations,
            breakdown.other,
        )
    )
    assert breakdown.total == 29_598_050_816
    # By hand: (2 + 4 + 12/16) P = 27 P / 4, 96 x 34 / 8 + 10 = 418 sbh, 8 x 3,162,112 other.
    assert 27 * params // 4 + 418 * SBH + 8 * (8 * 2048 + 2048 * 12288 // 8) == 29_598_050_816
    assert breakdown.fits
    # The peaks (StageOverheads), by hand. A block's backward gradients: x s (u + f)/t + 2 x rows h
    # + x s h (SP re-gather) + x (a/t) s^2 (unfused scores' gradient), x = 2, rows = s/t = 256:
    working = 2 * 2048 * (2 * 49152 // 8) + 2 * 2 * 256 * 12288 + 2 * 2048 * 12288
    working += 2 * 2048 * 2048 * 96 // 8
    assert working == 213_909_504
    assert breakdown.transient == working  # stage 0 holds no logits
    assert breakdown.allocator_reserve == working
    assert breakdown.workspace == 64 * 2**20
    assert breakdown.allocated_peak == 29_598_050_816 + working + 64 * 2**20
    assert breakdown.allocator_reserved_peak == breakdown.allocated_peak + working
    # NCCL (no NVLink domain given: every group over NVLink, RuntimeMemory's A100 defaults):
    # world (1024), TP (8), DP (16) and model parallel (64) rings of 24 channels x (2 + 10 MiB),
    # stage 0's one pipeline neighbour over 32 P2P channels x 12 MiB; tied embeddings add the
    # first-last embedding pair's ring on stage 0.
    ring, neighbour = 24 * 12 * 2**20, 32 * 12 * 2**20
    pair = ring if GPT3_175B.embeddings is EmbeddingTying.TIED else 0
    nccl = 4 * ring + neighbour + pair
    assert breakdown.nccl_buffers == nccl
    assert breakdown.cuda_context == 512 * 2**20
    assert breakdown.reserved_peak == breakdown.allocator_reserved_peak + 512 * 2**20 + nccl
    assert breakdown.headroom == 80 * 10**9 - breakdown.reserved_peak
    # Most loaded: stage 0 (embedding + 8 microbatches in flight).
    assert memory_per_gpu(GPT3_175B, mapping, capacity_bytes=80 * 10**9) == breakdown
    stages = memory_per_stage(GPT3_175B, mapping, capacity_bytes=80 * 10**9)
    assert [s.stage for s in stages] == list(range(8))
    last = stages[7]
    # Last stage: 1 microbatch in flight, fp32 logits [s b, V/t] and the LM-head input.
    assert last.other == 4 * 2048 * 51200 // 8 + 2 * 2048 * 12288 // 8
    # Last stage: 12 blocks, the tied word-embedding copy (51200 h / 8) and the final LayerNorm
    # (2h); 1F1B rank 7 holds min(p - 7, m) = 1 microbatch: 12 x 34 / 8 + 10 = 61 sbh.
    last_params = 12 * bp + 51200 * 12288 // 8 + 2 * 12288
    assert last_params == 2_797_590_528
    assert (last.weights, last.gradients) == (2 * last_params, 4 * last_params)
    assert last.optimizer_states == 12 * last_params // 16
    assert last.activations == 61 * SBH


def test_does_not_fit() -> None:
    mapping = training(t=8, p=8, d=1, microbatches=64, v=3)
    breakdown = memory_per_gpu(GPT3_175B, mapping, capacity_bytes=80 * 10**9)
    assert not breakdown.fits
    assert breakdown.headroom < 0
    assert breakdown.headroom == breakdown.capacity - breakdown.reserved_peak
    # By hand, stage 0 (most loaded: the embedding and the deepest in-flight count). Parameters
    # as in test_gpt3_breakdown_by_hand (12 blocks: 3 chunks of 4 layers); d = 1, no sharding:
    # 2 + 4 + 12 = 18 bytes per parameter.
    params = 2_822_731_776
    assert breakdown.stage == 0
    assert breakdown.weights == 2 * params
    assert breakdown.gradients == 4 * params
    assert breakdown.optimizer_states == 12 * params
    # No SP, no recompute: 23 sbh per layer (Table 2, t = 8); rank 0 holds 31 chunk forwards
    # of 4 layers (test_korthikanti_fig1_175b_is_exact_in_layers) = 124 layers, nothing rebuilt.
    assert breakdown.activations == 124 * 23 * SBH == 71_772_930_048
    # 15 chunk-0 forwards in flight x (8 s token-id bytes + s h dropout-mask bytes, not / t
    # without SP).
    assert breakdown.other == 15 * (8 * 2048 + SBH) == 377_733_120
    total = 18 * params + 71_772_930_048 + 377_733_120
    assert total == 122_959_835_136
    assert breakdown.total == total
    assert breakdown.reserved_peak > total
    assert breakdown.headroom == 80 * 10**9 - breakdown.reserved_peak < -42_959_835_136


def test_zero3_weights_and_gathered_unit() -> None:
    mapping1 = training(t=8, p=8, d=1, microbatches=8, sharding=ShardedParameters())
    mapping4 = training(t=8, p=8, d=4, microbatches=8, sharding=ShardedParameters())
    b1 = stage_memory(GPT3_175B, mapping1, stage=3, capacity_bytes=10**12)
    b4 = stage_memory(GPT3_175B, mapping4, stage=3, capacity_bytes=10**12)
    params = 12 * 226_576_896
    assert b1.weights == 2 * params
    # (P - unit) / 4 persistent shards + the whole gathered unit (one block).
    assert b4.weights == 2 * (params - 226_576_896) // 4 + 2 * 226_576_896
    assert b4.gradients == 4 * params // 4
    prefetch = training(
        t=8, p=8, d=4, microbatches=8, sharding=ShardedParameters(overlap_param_gather=True)
    )
    b4p = stage_memory(GPT3_175B, prefetch, stage=3, capacity_bytes=10**12)
    assert b4p.weights == 2 * (params - 2 * 226_576_896) // 4 + 4 * 226_576_896


def test_full_recompute_uniform_and_block() -> None:
    # GPT-3, t=8, p=8, 1F1B, m=8: rank 0 holds 8 microbatches x 12 blocks; no SP.
    checkpoint = 2 * SBH
    full = 23 * SBH
    uniform = training(t=8, p=8, microbatches=8, recompute=FullRecompute())
    acts = stage_activations(GPT3_175B, uniform, 0)
    assert acts.layers_stored == 8 * 12 * checkpoint
    assert acts.recompute_working == full - checkpoint
    grouped = training(
        t=8,
        p=8,
        microbatches=8,
        recompute=FullRecompute(method=RecomputeMethod.UNIFORM, num_layers=5),
    )
    acts = stage_activations(GPT3_175B, grouped, 0)
    assert acts.layers_stored == 8 * 3 * checkpoint  # ceil(12 / 5) = 3 checkpoints
    assert acts.recompute_working == 5 * full - checkpoint
    block = training(
        t=8,
        p=8,
        microbatches=8,
        recompute=FullRecompute(method=RecomputeMethod.BLOCK, num_layers=4),
    )
    acts = stage_activations(GPT3_175B, block, 0)
    assert acts.layers_stored == 8 * (4 * checkpoint + 8 * full)
    assert acts.recompute_working == full - checkpoint


def test_megatron_theoretical_memory_by_hand() -> None:
    # GPT-3 175B, t=8, p=8, v=3, d=1, b=1, m=64, SP + selective, no distributed optimizer.
    h, s, v_, layers = 12288, 2048, 51200, 96
    mapping = training(t=8, p=8, v=3, microbatches=64, sp=True, recompute=SelectiveRecompute())
    estimate = megatron_theoretical_memory(GPT3_175B, mapping)
    layer = 2 * h * (4 * h + 2) + 2 * h * h * 2  # MLP + norms, attention (MHA, q = h)
    shard = ((layer * layers + 2 * h) / 8 + h * v_) / 8
    assert estimate.weights_and_optimizer == pytest.approx(shard * 18, rel=1e-12)
    acts = (s * h * 34 * layers + 8 * s * 8 + s * h * 8) * (1 + 7 / 24) / 8
    assert estimate.activations == pytest.approx(acts, rel=1e-12)
    # Here the interleaving factor is schedule-exact: our layers_stored is its layer term.
    ours = stage_activations(GPT3_175B, mapping, 0).layers_stored
    assert ours == pytest.approx(s * h * 34 * layers * (1 + 7 / 24) / 8, rel=1e-12)
    assert estimate.total == estimate.weights_and_optimizer + estimate.activations
    # Without SP + selective it switches to (10 + 24/t) sbh, a 1.05 overhead, and min(1, m/p).
    plain = training(t=8, p=8, d=2, microbatches=4, sharding=DistributedOptimizer())
    other = megatron_theoretical_memory(GPT3_175B, plain)
    assert other.weights_and_optimizer == pytest.approx(shard * (6 + 12 / 2), rel=1e-12)
    per_layer = s * h * (10 + 24 / 8)
    expected = (per_layer * layers + 8 * s * 8 + s * h * 8) * (4 / 8) * 1.05
    assert other.activations == pytest.approx(expected, rel=1e-12)


def test_invalid_inputs() -> None:
    mapping = training(t=8, p=8, microbatches=8)
    with pytest.raises(ConfigError, match="capacity_bytes must be a positive integer"):
        stage_memory(GPT3_175B, mapping, stage=0, capacity_bytes=0)
    with pytest.raises(ConfigError, match=r"stage must be in \[0, 8\)"):
        stage_memory(GPT3_175B, mapping, stage=8, capacity_bytes=1)
    with pytest.raises(ConfigError, match="is not the sum of its categories"):
        MemoryBreakdown(
            weights=1,
            gradients=1,
            optimizer_states=1,
            activations=1,
            other=1,
            total=6,
            transient=0,
            workspace=0,
            allocator_reserve=0,
            cuda_context=0,
            nccl_buffers=0,
            allocated_peak=6,
            allocator_reserved_peak=6,
            reserved_peak=6,
            capacity=10,
            fits=True,
            headroom=4,
        )


# --- properties ----------------------------------------------------------------------------------
@st.composite
def small_models(draw: st.DrawFn) -> TransformerModelSpec:
    heads = draw(st.sampled_from([4, 8, 16]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4, 8, 16) if heads % g == 0]))
    head_dim = draw(st.sampled_from([16, 32, 64]))
    return TransformerModelSpec(
        name="small",
        num_layers=draw(st.integers(1, 24)),
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=head_dim,
        ffn_hidden_size=draw(st.sampled_from([2, 3, 4])) * heads * head_dim,
        seq_length=draw(st.sampled_from([128, 256, 1024])),
        vocab_size=1024,
        padded_vocab_size=1024,
        activation=draw(st.sampled_from(list(MlpActivation))),
        embeddings=draw(st.sampled_from(list(EmbeddingTying))),
        datatype=draw(st.sampled_from(list(Datatype))),
    )


@settings(max_examples=150, deadline=None)
@given(
    model=small_models(),
    t=st.sampled_from([1, 2, 4]),
    p=st.integers(1, 6),
    v=st.integers(1, 3),
    microbatches=st.integers(1, 16),
    micro_batch=st.integers(1, 4),
    sp=st.booleans(),
)
def test_activations_non_increasing_none_selective_full(
    *,
    model: TransformerModelSpec,
    t: int,
    p: int,
    v: int,
    microbatches: int,
    micro_batch: int,
    sp: bool,
) -> None:
    v = v if p > 1 else 1
    sp = sp and t > 1

    def activations(recompute: RecomputePolicy) -> list[int]:
        mapping = training(
            t=t,
            p=p,
            v=v,
            microbatches=microbatches,
            micro_batch=micro_batch,
            sp=sp,
            recompute=recompute,
        )
        return [s.activations for s in memory_per_stage(model, mapping, capacity_bytes=10**15)]

    none = activations(NoRecompute())
    selective = activations(SelectiveRecompute())
    full = activations(FullRecompute())
    for stage in range(p):
        assert none[stage] >= selective[stage] >= full[stage]


BYTES_PER_PARAMETER = {
    Datatype.BF16: (2, 4, 12),
    Datatype.FP8: (2, 4, 12),
    Datatype.FP16: (2, 2, 16),
    Datatype.FP32: (4, 4, 8),
}


@settings(max_examples=150, deadline=None)
@given(
    model=small_models(),
    t=st.sampled_from([1, 2, 4]),
    p=st.integers(1, 4),
    microbatches=st.integers(1, 8),
    degrees=st.lists(st.integers(1, 64), min_size=2, max_size=2, unique=True).map(sorted),
    sharding=st.sampled_from(
        [
            NoOptimizerSharding(),
            DistributedOptimizer(),
            ShardedGradients(),
            ShardedParameters(),
            ShardedParameters(overlap_param_gather=True),
        ]
    ),
)
def test_memory_non_increasing_in_data_degree(
    *,
    model: TransformerModelSpec,
    t: int,
    p: int,
    microbatches: int,
    degrees: list[int],
    sharding: OptimizerSharding,
) -> None:
    small, large = degrees
    totals = []
    for d in (small, large):
        mapping = training(t=t, p=p, d=d, microbatches=microbatches, sharding=sharding)
        breakdown = memory_per_gpu(model, mapping, capacity_bytes=10**15)
        parts = (
            breakdown.weights,
            breakdown.gradients,
            breakdown.optimizer_states,
            breakdown.activations,
            breakdown.other,
        )
        assert breakdown.total == sum(parts)
        # Independently of the recipe code: Megatron's dist_optimizer.md bytes per parameter as
        # (param, grad, optimizer side): bf16 / fp8 (2, 4, 12), fp16 (2, 2, 16), fp32 (4, 4, 8);
        # no sharding keeps all of it, the distributed optimizer divides the last by d. fp16's
        # 16 holds the fp32 gradient copy made at the step (4), counted apart.
        count = stage_parameters(model, mapping, breakdown.stage).total
        param, grad, optimizer = BYTES_PER_PARAMETER[model.datatype]
        step_copy = 4 if grad == 2 else 0
        states = breakdown.optimizer_states + breakdown.optimizer_step_copy
        if isinstance(sharding, NoOptimizerSharding | DistributedOptimizer):
            assert (breakdown.weights, breakdown.gradients) == (param * count, grad * count)
        if isinstance(sharding, NoOptimizerSharding):
            assert states == optimizer * count
            assert breakdown.optimizer_step_copy == step_copy * count
        elif isinstance(sharding, DistributedOptimizer):
            assert breakdown.optimizer_states == -(-(optimizer - step_copy) * count // d)
            assert breakdown.optimizer_step_copy == -(-step_copy * count // d)
        totals.append(breakdown.total)
    assert totals[1] <= totals[0]
    if isinstance(sharding, NoOptimizerSharding):
        assert totals[1] == totals[0]
