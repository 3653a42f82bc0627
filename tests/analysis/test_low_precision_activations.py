"""Activations a low-precision recipe keeps quantized: each Transformer Engine linear's input for
its weight gradient (shared reference ``modern_parallelism.md`` section 3.3 "Activations";
``analysis/precision_memory.saved_input_bytes``, ``analysis/memory.layer_activation_bytes``).
Expected values are written from the per-tensor terms, not from the code's own helpers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from blueprinting.analysis.memory import (
    layer_activation_bytes,
    moe_ffn_activation_bytes,
    stage_activations,
)
from blueprinting.analysis.precision_memory import saved_input_bytes
from blueprinting.mapping.flat_keys import from_mapping
from blueprinting.mapping.model import (
    DenseFeedForward,
    MultiLatentAttention,
    TransformerModelSpec,
)
from blueprinting.mapping.precision import (
    Fp4Precision,
    Fp8Precision,
    Fp8Recipe,
    HighPrecision,
    TrainingPrecision,
)
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AllToAllDispatcher,
    AttentionKernel,
    ExpertParallel,
    FusedAttention,
    RecomputeModule,
    UnfusedAttention,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    EagerPasses,
    mla_gathered_width,
    received_rows,
)
from tests.synthesizer.moe_models import mixtral_like

GPT3 = model_preset("gpt3-175b")  # s 2048, h 12288, 96 heads, GELU 4h
DELAYED = Fp8Precision(recipe=Fp8Recipe.DELAYED)
MXFP8 = Fp8Precision(recipe=Fp8Recipe.MXFP8)
BLOCKWISE = Fp8Precision(recipe=Fp8Recipe.BLOCKWISE)
NVFP4 = Fp4Precision()
FUSED = FusedAttention()


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        (HighPrecision(), 2000),
        (DELAYED, 1000),
        (Fp8Precision(recipe=Fp8Recipe.TENSORWISE), 1000),
        # one FP32 scale per 1 x 128 block: 8 blocks
        (BLOCKWISE, 1000 + 4 * 8),
        # one E8M0 byte per 32: 32 blocks (31.25 rounded up)
        (MXFP8, 1000 + 32),
        # packed E2M1 and one E4M3 byte per 16: 63 blocks
        (NVFP4, 500 + 63),
    ],
)
def test_a_saved_input_takes_the_recipes_columnwise_bytes(
    precision: TrainingPrecision, expected: int
) -> None:
    assert saved_input_bytes(precision, 1000, 2) == expected


def _layer(
    precision: TrainingPrecision,
    attention: AttentionKernel = FUSED,
    recomputed: frozenset[RecomputeModule] = frozenset(),
    model: TransformerModelSpec = GPT3,
) -> int:
    return layer_activation_bytes(
        model,
        micro_batch=1,
        tensor_degree=8,
        sequence_parallel=True,
        attention=attention,
        recomputed=recomputed,
        activation_bytes=2,
        precision=precision,
    )


# GPT-3 175B on t = 8 with sequence parallelism: 256 rows of h = 12288 per rank; the attention
# output q = 1536 and the MLP's f = 6144 per rank over s = 2048 tokens
ROWS_H = 256 * 12288
S_Q = 2048 * 1536
S_F = 2048 * 6144


def test_fp8_keeps_the_two_norm_outputs_and_the_fc2_input_at_one_byte() -> None:
    """Delayed FP8 with the fused kernel: the QKV and FC1 inputs (the norms' outputs) and the FC2
    input drop to 1 B; the output projection adds its 1 B copy of the attention output, which
    the fused kernel keeps at 2 B for its own backward."""
    saved = _layer(HighPrecision()) - _layer(DELAYED)
    assert saved == 2 * ROWS_H - S_Q + S_F == 15_728_640


def test_unfused_attention_does_not_keep_its_output_so_the_copy_replaces_it() -> None:
    saved = _layer(HighPrecision(), UnfusedAttention()) - _layer(DELAYED, UnfusedAttention())
    assert saved == 2 * ROWS_H + S_Q + S_F == 22_020_096


@pytest.mark.parametrize(
    ("precision", "kept"),
    [
        (MXFP8, lambda n: n + n // 32),
        (BLOCKWISE, lambda n: n + 4 * (n // 128)),
        (NVFP4, lambda n: n // 2 + n // 16),
    ],
)
def test_every_recipe_prices_the_same_tensors(
    precision: TrainingPrecision, kept: Callable[[int], int]
) -> None:
    """The norms' outputs and the FC2 input drop to the recipe's bytes; the attention output is
    kept once, at 2 B: Megatron-Core has the output projection save its original input under
    every recipe but delayed scaling (attention.py ``set_save_original_input``)."""
    high = _layer(HighPrecision())
    expected = high - 2 * (2 * ROWS_H - kept(ROWS_H)) - (2 * S_F - kept(S_F))
    assert _layer(precision) == expected


TENSORWISE = Fp8Precision(recipe=Fp8Recipe.TENSORWISE)


def test_current_scaling_keeps_the_attention_output_once() -> None:
    """Against delayed scaling, tensorwise FP8 drops the output projection's 1 B copy of the
    attention output (its linear keeps the fused kernel's 2 B tensor instead)."""
    assert _layer(DELAYED) - _layer(TENSORWISE) == S_Q == 3_145_728


def test_unfused_attention_under_current_scaling_keeps_the_projection_input_at_two_bytes() -> None:
    """The unfused core keeps its softmax and V, not its output: the projection's saved original
    input is the only copy, 2 B an element, where delayed scaling keeps 1 B."""
    unfused = UnfusedAttention()
    assert _layer(TENSORWISE, unfused) - _layer(DELAYED, unfused) == S_Q
    saved = _layer(HighPrecision(), unfused) - _layer(TENSORWISE, unfused)
    assert saved == 2 * ROWS_H + S_F == 18_874_368


def test_recomputed_modules_store_nothing_quantized() -> None:
    """Selective recompute of the MLP and the norms drops those terms at any precision: what is
    left differs by the attention output's copy alone."""
    modules = frozenset({RecomputeModule.MLP, RecomputeModule.LAYERNORM})
    assert _layer(DELAYED, recomputed=modules) - _layer(HighPrecision(), recomputed=modules) == S_Q


def test_mla_quantizes_its_input_twice_and_its_latents_once() -> None:
    """DeepSeek-V3's MLA: the input norm's output feeds the query and the KV down projections,
    each keeping its own 1 B copy (2 B in all, as the shared bf16 copy); the up projections'
    latent inputs drop to 1 B; the core output gains the projection's 1 B copy."""
    model = replace(
        model_preset("deepseek-v3"),
        feed_forward=DenseFeedForward(),
        num_layers=4,
        mtp_num_layers=0,
        published_parameters=None,
        published_active_parameters=None,
    )
    mla = model.self_attention
    assert isinstance(mla, MultiLatentAttention)
    s, t = model.seq_length, 8
    heads = model.num_attention_heads // t
    latent_inputs = s * mla_gathered_width(model)
    rows_h = s // t * model.hidden_size
    f = model.ffn_hidden_size // t
    saved = _layer(HighPrecision(), model=model) - _layer(DELAYED, model=model)
    core_output = s * heads * mla.v_head_dim
    # the MLP input's 1 B, the latents', less the core output's copy, and FC2's input
    assert saved == rows_h + latent_inputs - core_output + s * f


def test_a_moe_ffn_keeps_its_expert_inputs_quantized() -> None:
    model = mixtral_like(layers=4, seq=4096)
    moe = model.moe
    assert moe is not None
    experts = ExpertParallel(degree=8, dispatcher=AllToAllDispatcher())

    def ffn(precision: TrainingPrecision) -> int:
        return moe_ffn_activation_bytes(
            model,
            micro_batch=1,
            tensor_degree=1,
            sequence_parallel=False,
            experts=experts,
            activation_bytes=2,
            recomputed=frozenset(),
            eager=EagerPasses(),
            precision=precision,
        )

    received = received_rows(moe, moe.top_k * 4096)
    # the FC1 input (h wide) and the activation output (F wide) at 1 B; the FC1 output stays
    assert ffn(HighPrecision()) - ffn(DELAYED) == received * (
        model.hidden_size + moe.expert_ffn_hidden_size
    )


def test_the_shared_experts_keep_the_routers_copy_of_their_input() -> None:
    """Transformer Engine's FC1 keeps the tensor it was handed, the rank's s/t rows before its
    own all-gather (``linear.py`` ``saved_inputmat = inputmat``), which the router keeps too: no
    bytes in bf16 nor under current scaling (Megatron's ``save_original_input`` on the shared
    FC1); delayed scaling adds its 1 B copy of those rows. Under shared-expert overlap Megatron
    gathers the input first, and the whole sequence is kept (2 B; 1 B under delayed)."""
    base = mixtral_like(layers=4, seq=4096)
    assert base.moe is not None
    shared_width = 4096
    model = replace(
        base, feed_forward=replace(base.moe, shared_expert_ffn_hidden_size=shared_width)
    )
    t, s, h = 2, 4096, model.hidden_size

    def ffn(precision: TrainingPrecision, *, overlap: bool = False, shared: bool = True) -> int:
        experts = ExpertParallel(
            degree=8, dispatcher=AllToAllDispatcher(shared_expert_overlap=overlap)
        )
        recomputed = frozenset() if shared else frozenset({RecomputeModule.SHARED_EXPERTS})
        return moe_ffn_activation_bytes(
            model,
            micro_batch=1,
            tensor_degree=t,
            sequence_parallel=True,
            experts=experts,
            activation_bytes=2,
            recomputed=recomputed,
            eager=EagerPasses(),
            precision=precision,
        )

    def shared_terms(precision: TrainingPrecision, overlap: bool = False) -> int:
        return ffn(precision, overlap=overlap) - ffn(precision, overlap=overlap, shared=False)

    f = shared_width // t
    # the SwiGLU FC1 output (2 f wide, 2 B) and the activation output (f wide)
    outputs = s * 2 * (2 * f) + s * 2 * f
    assert shared_terms(HighPrecision()) == outputs
    assert shared_terms(TENSORWISE) == s * 2 * (2 * f) + s * f
    assert shared_terms(DELAYED) == s // t * h + s * 2 * (2 * f) + s * f
    assert shared_terms(HighPrecision(), overlap=True) == s * h * 2 + outputs
    assert shared_terms(TENSORWISE, overlap=True) == s * h * 2 + s * 2 * (2 * f) + s * f
    assert shared_terms(DELAYED, overlap=True) == s * h + s * 2 * (2 * f) + s * f


_LLAMA3_8B = model_preset("llama3-8b")  # 32 layers
_PIPELINED_FP8: dict[str, object] = {
    "world_size": 8,
    "tensor_model_parallel_size": 2,
    "pipeline_model_parallel_size": 4,
    "sequence_parallel": True,
    "micro_batch_size": 1,
    "global_batch_size": 16,
    "fp8": "hybrid",
    "fp8_recipe": "tensorwise",
}


def _base_layer_extras(**keys: object) -> tuple[int, list[int]]:
    """(one layer's stores at bf16 less at the recipe, what each of the 4 stages stores more
    with the first layer and the last two at bf16) for Llama 3 8B on t 2, p 4 with ``keys``."""
    model = _LLAMA3_8B
    plain = from_mapping({**_PIPELINED_FP8, **keys}, model=model).mapping
    based = from_mapping(
        {
            **_PIPELINED_FP8,
            **keys,
            "first_last_layers_bf16": True,
            "num_layers_at_end_in_bf16": 2,
        },
        model=model,
    ).mapping

    def per_layer(precision: TrainingPrecision) -> int:
        return layer_activation_bytes(
            model,
            micro_batch=1,
            tensor_degree=2,
            sequence_parallel=True,
            attention=plain.attention,
            recomputed=frozenset(),
            activation_bytes=2,
            precision=precision,
        )

    extra = [
        stage_activations(model, based, stage).layers_stored
        - stage_activations(model, plain, stage).layers_stored
        for stage in range(4)
    ]
    return per_layer(HighPrecision()) - per_layer(plain.precision), extra


def test_the_base_precision_layers_store_as_without_a_recipe() -> None:
    """``first_last_layers_bf16``: the first layer sits on stage 0, the last on the last stage,
    each over its chunk's in-flight microbatches (1F1B: p on stage 0, 1 on the last)."""
    excess, extra = _base_layer_extras()
    assert excess > 0
    # one base-precision layer on stage 0 (4 microbatches in flight), two on stage 3 (one)
    assert extra == [4 * excess, 0, 0, 2 * excess]


def test_the_block_method_stores_the_base_precision_layers_it_does_not_checkpoint() -> None:
    """Full recompute, ``block`` method, 1 layer: the first layer of each chunk keeps only its
    checkpoint, so the base-precision first layer stores nothing extra; the last two, past it,
    store as without a recipe."""
    excess, extra = _base_layer_extras(
        recompute_granularity="full", recompute_method="block", recompute_num_layers=1
    )
    assert extra == [0, 0, 0, 2 * excess]
