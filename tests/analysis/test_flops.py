"""FLOPs conventions pinned to hand-computed values (arithmetic written out beside each figure)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.analysis.flops import (
    FlopsConvention,
    achieved_flops_per_gpu,
    forward_flops_per_token,
    hardware_flops_per_iteration,
    hfu,
    implied_iteration_time_s,
    iterations_to_train,
    korthikanti_selective_hfu_flops,
    mfu,
    model_flops_per_iteration,
    narayanan_eq3_flops,
    narayanan_model_flops,
    recompute_flops_per_iteration,
    recomputed_blocks_per_microbatch,
    time_to_train_s,
    tokens_per_iteration,
)
from blueprinting.errors import ConfigError
from blueprinting.mapping.model import (
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import (
    BatchSpec,
    DataParallel,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoRecompute,
    OneForwardOneBackward,
    PipelineParallel,
    PipelineSchedule,
    RecomputeMethod,
    RecomputePolicy,
    SelectiveRecompute,
    SingleStage,
    TensorParallel,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
)
from tests.reference import shared_reference
from tests.synthesizer.models import LLAMA2_70B


def gpt(
    *, layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 51200, name: str = "gpt"
) -> TransformerModelSpec:
    return TransformerModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=heads,
        kv_channels=hidden // heads,
        ffn_hidden_size=4 * hidden,
        seq_length=seq,
        vocab_size=vocab,
        padded_vocab_size=vocab,
    )


GPT3_175B = gpt(layers=96, hidden=12288, heads=96, name="gpt3-175b")


def training(
    *,
    global_batch: int,
    micro_batch: int = 1,
    t: int = 1,
    p: int = 1,
    d: int = 1,
    schedule: PipelineSchedule | None = None,
    recompute: RecomputePolicy | None = None,
) -> TransformerTrainingMappingSpec:
    if schedule is None:
        schedule = SingleStage() if p == 1 else OneForwardOneBackward()
    return TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(degree=t),
            pipeline=PipelineParallel(degree=p, schedule=schedule),
            data=DataParallel(degree=d),
            recompute=NoRecompute() if recompute is None else recompute,
        ),
        batch=BatchSpec(global_batch_size=global_batch, micro_batch_size=micro_batch),
    )


# GPT-3 175B, B = 1536 sequences, s = 2048, L = 96, h = 12288, V = 51200 (Narayanan et al. 2021).
B, S, L, H, V = 1536, 2048, 96, 12288, 51200


def test_gpt3_per_op_forward_reduces_to_24h2_plus_4sh() -> None:
    ops = forward_flops_per_token(GPT3_175B, causal=False)
    # QKV 2h*3h, QK^T 2sh, AV 2sh, projection 2h*h, MLP 2h*4h + 2*4h*h: 24h^2 + 4sh per token.
    assert ops.qkv_projection == 6 * H * H
    assert ops.attention_scores == ops.attention_over_values == 2 * S * H
    assert ops.output_projection == 2 * H * H
    assert ops.mlp == 16 * H * H
    assert ops.block == 24 * H * H + 4 * S * H == 3_724_541_952
    assert ops.logits == 2 * H * V == 1_258_291_200
    causal = forward_flops_per_token(GPT3_175B, causal=True)
    assert causal.attention_core == 2 * S * H


def test_gpt3_megatron_legacy_model_flops() -> None:
    # 72 B s L h^2 + 12 B s^2 L h + 6 B s h V
    # = 72*1536*2048*96*12288^2 + 12*1536*2048^2*96*12288 + 6*1536*2048*12288*51200
    expected = 3_386_196_746_387_324_928
    assert expected == 72 * B * S * L * H * H + 12 * B * S * S * L * H + 6 * B * S * H * V
    assert model_flops_per_iteration(GPT3_175B, B, FlopsConvention.MEGATRON_LEGACY) == expected
    assert (
        narayanan_model_flops(batch=B, seq_length=S, num_layers=L, hidden_size=H, vocab_size=V)
        == expected
    )


def test_gpt3_eq3_is_hardware_flops_with_full_recompute() -> None:
    # Eq. 3: 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) = 96 BsLh^2 + 16 Bs^2Lh + 6 BshV
    expected = 4_510_970_753_323_106_304
    assert expected == 96 * B * S * L * H * H + 16 * B * S * S * L * H + 6 * B * S * H * V
    assert (
        narayanan_eq3_flops(batch=B, seq_length=S, num_layers=L, hidden_size=H, vocab_size=V)
        == expected
    )
    mapping = training(global_batch=B, t=8, p=8, d=24, recompute=FullRecompute())
    assert hardware_flops_per_iteration(GPT3_175B, mapping, FlopsConvention.MEGATRON_LEGACY) == (
        expected
    )


def test_gpt3_megatron_causal_halves_the_score_term() -> None:
    # 72 B s L h^2 + 6 B s^2 L h + 6 B s h V: the 12 B s^2 L h attention term halved.
    expected = 3_340_597_800_160_198_656
    assert expected == 72 * B * S * L * H * H + 6 * B * S * S * L * H + 6 * B * S * H * V
    assert model_flops_per_iteration(GPT3_175B, B, FlopsConvention.MEGATRON_CAUSAL) == expected
    legacy = model_flops_per_iteration(GPT3_175B, B, FlopsConvention.MEGATRON_LEGACY)
    # megatron_rules.md: "about 1.4% lower for GPT-3 175B".
    assert 1 - expected / legacy == pytest.approx(0.01347, abs=5e-5)


def test_gpt3_selective_recompute_adds_the_attention_core_forward() -> None:
    # One extra QK^T + AV forward per layer: 4 B s^2 h L = 4*1536*2048^2*12288*96
    extra = 4 * B * S * S * H * L
    assert extra == 30_399_297_484_750_848
    mapping = training(global_batch=B, recompute=SelectiveRecompute())
    assert recompute_flops_per_iteration(GPT3_175B, mapping, FlopsConvention.MEGATRON_LEGACY) == (
        extra
    )
    assert hardware_flops_per_iteration(GPT3_175B, mapping, FlopsConvention.MEGATRON_LEGACY) == (
        3_386_196_746_387_324_928 + extra
    )
    # Causal convention: the recomputed core is the causal half.
    assert recompute_flops_per_iteration(GPT3_175B, mapping, FlopsConvention.MEGATRON_CAUSAL) == (
        extra // 2
    )


def test_gpt3_six_nd() -> None:
    # N = 96 (12h^2 + 13h) + V h + s h + 2h = 174,615,846,912 (blocks with biases and two
    # LayerNorms, word + learned position embeddings, final LayerNorm; tied head).
    n = 96 * (12 * H * H + 13 * H) + V * H + S * H + 2 * H
    assert n == GPT3_175B.num_parameters == 174_615_846_912
    assert model_flops_per_iteration(GPT3_175B, B, FlopsConvention.SIX_ND) == 6 * n * B * S
    assert 6 * n * B * S == 3_295_763_753_248_751_616
    # + Kaplan's attention: 6 L s (heads*kv_channels) per token.
    with_attention = 6 * n * B * S + 6 * L * S * H * B * S
    assert (
        model_flops_per_iteration(GPT3_175B, B, FlopsConvention.SIX_ND_ATTENTION) == with_attention
    )


# Llama-2 70B: L=80, h=8192, 64 heads, 8 KV groups, kv_channels 128, ffn 28672 (SwiGLU),
# V=32000 untied, s=4096, B=1024 sequences (4M tokens).
def test_llama2_70b_per_op_and_conventions() -> None:
    b, s, layers, h, v = 1024, 4096, 80, 8192, 32000
    q, kv, f = 64 * 128, 8 * 128, 28672
    ops = forward_flops_per_token(LLAMA2_70B, causal=False)
    assert ops.qkv_projection == 2 * h * (q + 2 * kv) == 167_772_160
    assert ops.attention_core == 4 * s * q == 134_217_728
    assert ops.output_projection == 2 * q * h == 134_217_728
    # SwiGLU: gate + up h -> 2f, down f -> h.
    assert ops.mlp == 2 * h * 2 * f + 2 * f * h == 1_409_286_144
    assert ops.block == 1_845_493_760
    assert ops.logits == 2 * h * v == 524_288_000
    legacy = 3 * b * s * (layers * 1_845_493_760 + 524_288_000)
    assert legacy == 1_864_331_916_056_985_600
    assert model_flops_per_iteration(LLAMA2_70B, b, FlopsConvention.MEGATRON_LEGACY) == legacy
    # causal block = 1,845,493,760 - 2 s q = 1,778,384,896 (QK^T and AV each s q instead of 2 s q)
    causal = 3 * b * s * (layers * 1_778_384_896 + 524_288_000)
    assert causal == 1_796_777_921_646_428_160
    assert model_flops_per_iteration(LLAMA2_70B, b, FlopsConvention.MEGATRON_CAUSAL) == causal
    # N = 80 (h(q+2kv) + q h + 3 h f + 2h) + 2 V h + h = 68,976,648,192
    n = layers * (h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h) + 2 * v * h + h
    assert n == LLAMA2_70B.num_parameters == 68_976_648_192
    assert 6 * n * b * s == 1_735_854_188_509_790_208
    assert model_flops_per_iteration(LLAMA2_70B, b, FlopsConvention.SIX_ND) == (
        1_735_854_188_509_790_208
    )
    assert model_flops_per_iteration(LLAMA2_70B, b, FlopsConvention.SIX_ND_ATTENTION) == (
        1_803_408_182_920_347_648
    )
    assert 6 * n * b * s + 6 * layers * s * q * b * s == 1_803_408_182_920_347_648


def test_block_recompute_counts_first_layers_of_each_chunk() -> None:
    # p = 8, v = 3: 24 chunks of 4 blocks; block method with 2 -> 2 blocks per chunk = 48.
    mapping = training(
        global_batch=B,
        t=8,
        p=8,
        d=24,
        schedule=InterleavedOneForwardOneBackward(virtual_stages=3),
        recompute=FullRecompute(method=RecomputeMethod.BLOCK, num_layers=2),
    )
    assert recomputed_blocks_per_microbatch(GPT3_175B, mapping) == 48
    extra = recompute_flops_per_iteration(GPT3_175B, mapping, FlopsConvention.MEGATRON_LEGACY)
    assert extra == B * S * 48 * (24 * H * H + 4 * S * H)
    # Uniform recomputes every block regardless of num_layers.
    uniform = training(
        global_batch=B, recompute=FullRecompute(method=RecomputeMethod.UNIFORM, num_layers=4)
    )
    assert recomputed_blocks_per_microbatch(GPT3_175B, uniform) == 96
    # 6ND: a block's forward is 2 * block parameters.
    six = recompute_flops_per_iteration(GPT3_175B, mapping, FlopsConvention.SIX_ND)
    assert six == B * S * 48 * 2 * GPT3_175B.block_parameters


@settings(max_examples=200, deadline=None)
@given(
    layers=st.integers(1, 128),
    heads=st.integers(1, 128),
    head_dim=st.integers(1, 256),
    seq=st.integers(1, 8192),
    vocab=st.integers(1, 256_000),
    batch=st.integers(1, 4096),
)
def test_general_count_reduces_to_narayanan_for_gpt_shapes(
    *, layers: int, heads: int, head_dim: int, seq: int, vocab: int, batch: int
) -> None:
    """MHA, ffn = 4h, kv_channels = h / heads, tied embeddings; biases, norms, softmax, GELU,
    dropout and residuals are ignored by both counts."""
    model = gpt(layers=layers, hidden=heads * head_dim, heads=heads, seq=seq, vocab=vocab)
    kw = {
        "batch": batch,
        "seq_length": seq,
        "num_layers": layers,
        "hidden_size": heads * head_dim,
        "vocab_size": vocab,
    }
    legacy = FlopsConvention.MEGATRON_LEGACY
    assert model_flops_per_iteration(model, batch, legacy) == narayanan_model_flops(**kw)
    full = training(global_batch=batch, recompute=FullRecompute())
    assert hardware_flops_per_iteration(model, full, legacy) == narayanan_eq3_flops(**kw)


def test_utilization_and_training_time() -> None:
    assert tokens_per_iteration(GPT3_175B, B) == 1536 * 2048 == 3_145_728
    assert achieved_flops_per_gpu(1e18, 10.0, 1000) == pytest.approx(1e14)
    assert mfu(1e18, 10.0, 1000, 2e14) == pytest.approx(0.5)
    assert hfu(1.2e18, 10.0, 1000, 2e14) == pytest.approx(0.6)
    assert implied_iteration_time_s(1e18, 1000, 1e14) == pytest.approx(10.0)
    # 300e9 tokens / 3,145,728 tokens per step = 95,367.4 -> 95,368 steps.
    assert iterations_to_train(GPT3_175B, B, 300_000_000_000) == 95_368
    assert time_to_train_s(GPT3_175B, B, 300_000_000_000, 2.0) == pytest.approx(190_736.0)
    with pytest.raises(ConfigError, match="iteration_time_s must be a positive finite number"):
        mfu(1e18, 0.0, 8, 1e15)


# --- Published figures --------------------------------------------------------------------------
# Provenance: copied from /work/shared/reference/published_runs.json, rows narayanan2021_t1_*
# (Narayanan et al. 2021, Table 1; Eq. 3 FLOPs; implied time = Eq.3 F / (n * TFLOP/s)).
# (name, L, h, heads, global batch, GPUs, t, p, reported TFLOP/s per GPU, implied iteration time s)
NARAYANAN_TABLE1: tuple[tuple[str, int, int, int, int, int, int, int, int, float], ...] = (
    ("1.7B", 24, 2304, 24, 512, 32, 1, 1, 137, 3.53),
    ("3.6B", 30, 3072, 32, 512, 64, 2, 1, 138, 3.70),
    ("7.5B", 36, 4096, 32, 512, 128, 4, 1, 142, 3.70),
    ("18.4B", 40, 6144, 48, 1024, 256, 8, 1, 135, 9.40),
    ("39.1B", 48, 8192, 64, 1536, 512, 8, 2, 138, 14.45),
    ("76.1B", 60, 10240, 80, 1792, 1024, 8, 4, 140, 16.06),
    ("145.6B", 80, 12288, 96, 2304, 1536, 8, 8, 148, 24.82),
    ("310.1B", 96, 16384, 128, 2160, 1920, 8, 16, 155, 37.61),
    ("529.6B", 105, 20480, 128, 2520, 2520, 8, 35, 163, 54.08),
    ("1008.0B", 128, 25600, 160, 3072, 3072, 8, 64, 163, 102.63),
)


@pytest.mark.parametrize("row", NARAYANAN_TABLE1, ids=[row[0] for row in NARAYANAN_TABLE1])
def test_eq3_reproduces_narayanan_table1_implied_times(
    row: tuple[str, int, int, int, int, int, int, int, int, float],
) -> None:
    _, layers, hidden, heads, batch, gpus, t, p, tflops, implied = row
    model = gpt(layers=layers, hidden=hidden, heads=heads)
    mapping = training(global_batch=batch, t=t, p=p, d=gpus // (t * p), recompute=FullRecompute())
    flops = hardware_flops_per_iteration(model, mapping, FlopsConvention.MEGATRON_LEGACY)
    time = implied_iteration_time_s(flops, gpus, tflops * 1e12)
    # 1%: the published times inherit the rounding of the 3-digit TFLOP/s.
    assert time == pytest.approx(implied, rel=0.01)


# Provenance: published_runs.json korthikanti2022_t5_175B_seqsel (Korthikanti et al. 2022,
# Table 5): GPT-3 175B, 64 GPUs, global batch 64, 13.75 s, MFU 51.4%, HFU 52.8%, peak 312 TFLOP/s.
def test_korthikanti_table5_mfu_and_hfu() -> None:
    model_flops = model_flops_per_iteration(GPT3_175B, 64, FlopsConvention.MEGATRON_LEGACY)
    assert 100 * mfu(model_flops, 13.75, 64, 312e12) == pytest.approx(51.4, abs=0.1)
    paper_hfu = korthikanti_selective_hfu_flops(
        batch=64, seq_length=S, num_layers=L, hidden_size=H, vocab_size=V
    )
    assert 100 * hfu(paper_hfu, 13.75, 64, 312e12) == pytest.approx(52.8, abs=0.1)
    # The per-op count of one recomputed attention core gives less: 51.85%, not 52.8%.
    mapping = training(global_batch=64, t=8, p=8, recompute=SelectiveRecompute())
    ours = hardware_flops_per_iteration(GPT3_175B, mapping, FlopsConvention.MEGATRON_LEGACY)
    assert 100 * hfu(ours, 13.75, 64, 312e12) == pytest.approx(51.85, abs=0.01)
    # By hand, B = 64: model FLOPs 72 B s L h^2 + 12 B s^2 L h + 6 B s h V plus one attention-core
    # forward per layer, 4 B s^2 h L: 72 B s L h^2 + 16 B s^2 L h + 6 B s h V
    # = 72 B s L h^2 (1 + 2s/(9h) + V/(12 L h)).
    b = 64
    by_hand = 72 * b * S * L * H * H + 16 * b * S * S * L * H + 6 * b * S * H * V
    assert by_hand == 142_358_168_494_669_824
    assert ours == by_hand
    # HFU = F / (time x GPUs x peak) = 142,358,168,494,669,824 / (13.75 x 64 x 312e12 =
    # 2.7456e17) = 0.5184957 -> 51.84957%.
    assert 13.75 * 64 * 312e12 == 2.7456e17
    percent = 100 * 142_358_168_494_669_824 / 2.7456e17
    assert percent == pytest.approx(51.84957, abs=1e-5)
    assert 100 * hfu(ours, 13.75, 64, 312e12) == pytest.approx(percent, rel=1e-12)


def test_fixture_matches_shared_published_runs() -> None:
    reference = shared_reference()
    if reference is None:
        pytest.skip("shared/reference/published_runs.json not found (set BLUEPRINTING_SHARED)")
    rows = json.loads((reference / "published_runs.json").read_text())
    table = {row["id"]: row for row in rows if row["source_key"] == "narayanan2021_table1"}
    assert len(table) == len(NARAYANAN_TABLE1)
    for name, layers, hidden, heads, batch, gpus, t, p, tflops, implied in NARAYANAN_TABLE1:
        row = table[f"narayanan2021_t1_{name}"]
        assert (row["model"]["L"], row["model"]["h"], row["model"]["a"]) == (layers, hidden, heads)
        strategy = row["strategy"]
        assert (strategy["global_batch"], strategy["t"], strategy["p"]) == (batch, t, p)
        assert row["hardware"]["n_gpus"] == gpus
        assert row["measured"]["tflops_per_gpu"] == tflops
        assert row["derived"]["implied_iteration_time_s"] == pytest.approx(implied)
