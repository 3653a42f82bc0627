"""Attention as implemented (issue #19, part 1): the kernel sum type at the boundary, its laws,
the fused kernel's work and time, and what each kernel stores for backward."""

from __future__ import annotations

import dataclasses

import pytest

from blueprinting.analysis.memory import (
    MemoryPeak,
    attention_core_bytes,
    layer_activation_bytes,
)
from blueprinting.api import plan
from blueprinting.errors import ConfigError, InvalidStrategyError
from blueprinting.hardware.attention import A100_FLASH_ATTENTION_2, H100_FLASH_ATTENTION_2
from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.flat_keys import from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AttentionBackend,
    FusedAttention,
    RecomputeModule,
    SelectiveRecompute,
    TrainingSpec,
    UnfusedAttention,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    OpKind,
    SemanticOpName,
    block_ops,
    local_dims,
)
from blueprinting.synthesizer.stages.portable_plan.passes import work_time

GPT3 = model_preset("gpt3-175b")
KEYS = {"tensor_model_parallel_size": 8, "data_parallel_size": 1, "global_batch_size": 8}


def test_the_default_is_megatron_cores_fused_kernel_and_the_flags_round_trip() -> None:
    spec = from_mapping(KEYS, model=GPT3)
    assert spec.mapping.attention == FusedAttention(backend=AttentionBackend.AUTO)
    assert "--attention-backend" not in to_megatron_args(spec)  # auto is Megatron's default
    unfused = from_mapping({**KEYS, "attention_backend": "unfused"}, model=GPT3)
    assert unfused.mapping.attention == UnfusedAttention()
    assert to_mapping(unfused)["attention_backend"] == "unfused"
    args = to_megatron_args(unfused)
    assert args[args.index("--attention-backend") + 1] == "unfused"
    flash = from_mapping({**KEYS, "use_flash_attn": True}, model=GPT3)
    assert flash.mapping.attention == FusedAttention(backend=AttentionBackend.FLASH)
    assert from_mapping(to_mapping(unfused), model=GPT3).mapping == unfused.mapping


def test_bad_attention_keys_are_all_reported_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as raised:
        from_mapping({**KEYS, "attention_backend": "flsh"}, model=GPT3)
    assert "did you mean 'flash'" in str(raised.value)
    with pytest.raises(ConfigError, match="use_flash_attn = true selects attention_backend"):
        from_mapping({**KEYS, "use_flash_attn": True, "attention_backend": "local"}, model=GPT3)
    with pytest.raises(ConfigError, match="FusedAttention backend must be one of"):
        FusedAttention(backend=AttentionBackend.LOCAL)


def test_fused_kernels_refuse_fp32_and_wide_heads_by_name() -> None:
    fp32 = dataclasses.replace(GPT3, datatype=Datatype.FP32)
    with pytest.raises(InvalidStrategyError) as raised:
        plan(from_mapping(KEYS, model=fp32), system="dgx-a100-80gb")
    laws = {v.law for v in raised.value.violations}
    assert laws == {"fused_attention_support"}
    # unfused attention plans the same model
    plan(from_mapping({**KEYS, "attention_backend": "unfused"}, model=fp32), system="dgx-a100-80gb")


def test_the_fused_op_does_the_causal_work_in_flash_attentions_convention() -> None:
    dims = local_dims(GPT3, 1, tp=8, sequence_parallel=True)
    fused = [op for op in block_ops(GPT3, dims, attention=FusedAttention())]
    core = [op for op in fused if op.kind is OpKind.FUSED_ATTENTION]
    assert [op.name for op in core] == [SemanticOpName.CORE_ATTENTION]
    op = core[0]
    # 12 heads per rank, s = 2048, d = 128: 4 d pairs forward, 10 d backward, pairs = s^2 / 2.
    pairs = 12 * 2048 * 2048 // 2
    assert op.forward.matrix_flops == 4 * 128 * pairs == 12_884_901_888
    assert op.activation_grad.matrix_flops == 10 * 128 * pairs
    assert op.weight_grad.is_empty
    unfused = block_ops(GPT3, dims, attention=UnfusedAttention())
    assert {op.name for op in unfused} - {op.name for op in fused} == {
        SemanticOpName.ATTENTION_SCORES,
        SemanticOpName.SOFTMAX,
        SemanticOpName.ATTENTION_DROPOUT,
        SemanticOpName.ATTENTION_OVER_VALUES,
    }
    # On A100 the kernel runs at FA2's measured 155 TFLOP/s at s = 2048, d = 128 (a table point):
    # time = FLOPs / rate exactly (the HBM traffic is far below the compute time).
    a100 = system_preset("dgx-a100-80gb")
    assert op.attention is not None
    forward_s = work_time(op.forward, op.gemm, a100, GPT3.datatype, op.attention)
    assert forward_s == pytest.approx(12_884_901_888 / 155e12, rel=1e-12)


def test_measured_rates_interpolate_in_log_sequence_length_and_clamp() -> None:
    rate = H100_FLASH_ATTENTION_2.flop_per_s
    assert rate(seq_length=4096, head_dim=128) == 294e12
    # halfway in log2 between 4096 (294) and 8192 (308)
    assert rate(seq_length=5793, head_dim=128) == pytest.approx(301e12, rel=1e-3)
    assert rate(seq_length=131072, head_dim=128) == 328e12  # beyond the table: the last point
    # below the table: the shortest row's rate, at the short-kernel fraction (0.45 at 256)
    assert rate(seq_length=512, head_dim=64) == 141e12
    assert rate(seq_length=256, head_dim=64) == 0.45 * 141e12
    assert A100_FLASH_ATTENTION_2.flop_per_s(seq_length=2048, head_dim=96) == pytest.approx(
        (140 + 155) / 2 * 1e12
    )


def test_what_each_kernel_stores_for_backward() -> None:
    """Korthikanti's s x s terms (2x + 1) (a/t) s^2 against FlashAttention's fp32 log-sum-exp
    4 (a/t) s, per sequence on one TP rank; the rest of the block is the same."""
    unfused = attention_core_bytes(
        GPT3, tensor_degree=8, attention=UnfusedAttention(), activation_bytes=2
    )
    fused = attention_core_bytes(
        GPT3, tensor_degree=8, attention=FusedAttention(), activation_bytes=2
    )
    assert unfused == 5 * 12 * 2048 * 2048 == 251_658_240
    assert fused == 4 * 12 * 2048 == 98_304

    def layer(attention: FusedAttention | UnfusedAttention) -> int:
        return layer_activation_bytes(
            GPT3,
            micro_batch=1,
            tensor_degree=8,
            sequence_parallel=True,
            attention=attention,
            recomputed=frozenset(),
            activation_bytes=2,
        )

    assert layer(UnfusedAttention()) - layer(FusedAttention()) == unfused - fused


def test_the_fused_plan_is_faster_and_smaller_than_the_unfused_one() -> None:
    keys = {
        "tensor_model_parallel_size": 8,
        "pipeline_model_parallel_size": 16,
        "global_batch_size": 1536,
        "sequence_parallel": True,
    }
    fused = plan(model="gpt3-175b", system="dgx-a100-80gb", gpus=1024, settings=keys)
    unfused = plan(
        model="gpt3-175b",
        system="dgx-a100-80gb",
        gpus=1024,
        settings={**keys, "attention_backend": "unfused"},
    )
    assert fused.iteration_time_s < unfused.iteration_time_s
    assert fused.memory.activations < unfused.memory.activations
    # The same model FLOPs: the convention counts the model, not the kernel.
    assert fused.model_flops_per_iteration == unfused.model_flops_per_iteration


# --- Megatron's --recompute-modules (issue #19, part 1) ------------------------------------------
def _selective(modules: str) -> TrainingSpec:
    return from_mapping(
        {
            **KEYS,
            "sequence_parallel": True,
            "recompute_granularity": "selective",
            "recompute_modules": modules,
        },
        model=GPT3,
    )


def test_recompute_modules_round_trip_through_keys_and_flags() -> None:
    spec = _selective("mlp, core_attn")
    assert spec.mapping.parallelism.recompute == SelectiveRecompute(
        modules=frozenset({RecomputeModule.CORE_ATTN, RecomputeModule.MLP})
    )
    assert str(spec.mapping.parallelism.recompute) == "selective(core_attn+mlp)"
    assert to_mapping(spec)["recompute_modules"] == "core_attn mlp"
    args = to_megatron_args(spec)
    at = args.index("--recompute-modules")
    assert args[at + 1 : at + 3] == ["core_attn", "mlp"]
    assert from_mapping(to_mapping(spec), model=GPT3).mapping == spec.mapping
    # the default module set is Megatron's default: no flag
    assert "--recompute-modules" not in to_megatron_args(_selective("core_attn"))


def test_bad_recompute_modules_are_reported() -> None:
    with pytest.raises(ConfigError) as raised:
        from_mapping({**KEYS, "recompute_modules": "mlpp"}, model=GPT3)
    text = str(raised.value)
    assert "recompute_modules needs recompute_granularity = selective" in text
    assert "did you mean 'mlp'" in text


def test_recomputing_the_mlp_stores_less_and_recomputes_its_gemms() -> None:
    """GPT-3 175B, t = 8, SP, b = 1: the MLP module drops the activation function's input and
    output, x s (u + f) / t = 2 * 2048 * 2 * 6144 bytes per layer, and re-runs the MLP's
    forward GEMMs 2 (h u + f h) = 16 h^2 FLOPs per token per layer."""
    core = _selective("core_attn")
    both = _selective("core_attn mlp")
    saved = 2 * 2048 * (6144 + 6144)
    a = plan(core, system="dgx-a100-80gb")
    b = plan(both, system="dgx-a100-80gb")
    # stage 0 of p = 1: L layers x 1 microbatch in flight store less; the recomputed MLP's
    # activations are rebuilt for one layer in backward (the working set grows by as much).
    assert a.memory.activations - b.memory.activations == 96 * saved - saved
    h = 12288
    tokens = 8 * 2048
    extra = b.hardware_flops_per_iteration - a.hardware_flops_per_iteration
    assert extra == tokens * 96 * 16 * h * h
    assert b.plan.block.recompute.critical_path_s > a.plan.block.recompute.critical_path_s


def test_the_peak_falls_where_the_larger_transient_is() -> None:
    """A small block with a wide vocabulary (h = 64, s = 128, V = 65536, t = 1, bf16, fused):
    one block's backward gradients x s (u + f) + 2 x s h = 2*128*512 + 4*128*64 = 163,840 bytes,
    the last stage's 16-bit logits x s V = 2*128*65536 = 16,777,216: the loss's backward sets
    the last stage's peak, a block's backward the first stage's."""
    small = dataclasses.replace(
        GPT3,
        name="wide-vocab",
        num_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=4,
        kv_channels=16,
        ffn_hidden_size=256,
        seq_length=128,
        vocab_size=65536,
        padded_vocab_size=65536,
        published_parameters=None,
    )
    spec = from_mapping(
        {"pipeline_model_parallel_size": 2, "data_parallel_size": 1, "global_batch_size": 4},
        model=small,
    )
    report = plan(spec, system="dgx-h100")
    first, last = report.memory_per_stage
    assert (first.peak, first.transient) == (MemoryPeak.BLOCK_BACKWARD, 163_840)
    assert (last.peak, last.transient) == (MemoryPeak.LOSS_BACKWARD, 16_777_216)
    memory = report.to_json_dict()["memory_bytes"]
    assert isinstance(memory, dict)
    assert memory["peak_at"] == report.memory.peak.value


def test_peaks_past_int64_stay_exact_python_integers() -> None:
    """A micro batch of 2^40 sequences (found by the CLI fuzz test): every part is a Python
    int past 2^63 and the composition neither overflows nor rounds."""
    from blueprinting.analysis.memory import memory_per_stage

    spec = from_mapping(
        {"data_parallel_size": 1, "micro_batch_size": 2**40, "global_batch_size": 2**40},
        model=GPT3,
    )
    (stage,) = memory_per_stage(GPT3, spec.mapping, capacity_bytes=80 * 10**9)
    assert type(stage.transient) is int and stage.transient > 2**63
    assert stage.reserved_peak == (
        stage.total
        + stage.transient
        + stage.workspace
        + stage.allocator_reserve
        + stage.cuda_context
        + stage.nccl_buffers
    )
    assert not stage.fits
