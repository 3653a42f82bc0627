"""Model FLOPs and hardware FLOPs per training iteration, under named conventions.

Every figure says which convention produced it, because the published ones differ:

``megatron-legacy``
    Narayanan et al. 2021 (SC'21, arXiv:2104.04473), Section 5.1, Eq. (3):
    ``F = 96 B s L h^2 (1 + s/(6h) + V/(16 L h))``. Eq. (3) counts four passes over every block
    (forward, recompute forward, two backward GEMMs) and three over the LM head: it is the hardware
    FLOPs of a run with full recomputation. Without recomputation the same derivation gives
    ``72 B s L h^2 (1 + s/(6h) + V/(12 L h))`` (Korthikanti et al. 2022, Appendix A, "model FLOPs").
    Both literal formulas assume GPT: MHA, ffn = 4h, kv_channels = h / heads, the attention score
    and attention-over-values GEMMs over the full s x s matrix. :func:`narayanan_eq3_flops` and
    :func:`narayanan_model_flops` are those literal formulas. The convention applied to a general
    model is the per-op count below with the full (non-causal) score matrix; it is what
    Megatron-LM's ``num_floating_point_operations`` computed before 2025-03 (GQA, SwiGLU,
    kv_channels, ffn), and it reduces exactly to the literal formulas for a GPT-shaped model.
``megatron-causal``
    Current Megatron-LM ``megatron/training/training.py`` ``num_floating_point_operations``
    (``transformer_flops``): the same per-op count, but QK^T and attention-over-V count only the
    non-masked half of the s x s matrix (causal mask); about 1.4% below the legacy figure for
    GPT-3 175B.
``megatron-bridge``
    NVIDIA-NeMo/Megatron-Bridge ``src/megatron/bridge/training/utils/flop_utils.py``
    ``num_floating_point_operations`` (26.06 and later; read at 0494433b): ``megatron-causal``
    except that sliding-window layers count their exact causal context, ``W - W (W - 1) / (2 s)``
    keys per query on average with ``W = window + 1`` (full layers: ``s / 2``). It is the
    convention of the model TFLOP/s in Megatron-Bridge's performance tables from 26.06 on. For
    a model without sliding windows it equals ``megatron-causal``. (Earlier releases, up to
    26.04.01, counted a gated MLP as three GEMMs only with a SiLU activation, so gpt-oss's
    gated quick-GELU experts as two, and ignored the window; shared reference
    ``modern_runs.md``.)
``6nd``
    Kaplan et al. 2020 (arXiv:2001.08361), Section 2.1: ``C = 6 N D`` with N parameters and D
    tokens. Kaplan's N excludes embeddings; here N is ``model.active_parameters`` (all
    parameters of a dense model, the usual reading since Hoffmann et al. 2022; for a mixture of
    experts the top-k routed experts instead of all, MTP depths excluded), so the LM head GEMM is
    counted, and the input embedding lookup, which costs no FLOPs, is too.
``6nd-attn``
    6ND plus Kaplan's attention term (Kaplan et al. 2020, Table 1): forward
    ``2 L n_ctx d_attn`` per token, times 3 for training. With ``d_attn = heads * kv_channels``
    this equals the causal per-op count of QK^T and attention-over-V.

Mixtures of experts, multi-head latent attention and multi-token prediction follow Megatron-LM
``megatron/training/training.py`` ``num_floating_point_operations`` (l.845-861, 1094-1135,
1255-1300 @d98e8a64; shared reference ``modern_parallelism.md`` sections 2.5, 2.10, 2.11), which
Megatron-Bridge's counter repeats (:class:`ModelForwardFlops`): each MoE layer computes its
top-k routed experts and its shared experts, never all E; the router GEMM is omitted; MLA counts
its down/up projections with the LoRA norms (``2 x`` the weights of section 2.10) and a causal
core of ``s n (d_n + d_r + d_v)`` per token; each MTP depth adds one decoder layer of the last
layer's kind, its ``eh_proj`` (2h -> h) and three norms, and one more LM-head GEMM.

The per-op count (:class:`ForwardFlopsPerToken`) counts the GEMMs and batched matmuls only,
2 FLOPs per multiply-add, backward = 2x forward (data and weight gradients). It ignores biases,
norms, softmax, activation functions, dropout, residual adds, the optimizer step and the input
embedding lookup, as Eq. (3) and Megatron-LM do.

Hardware FLOPs add the recomputed forward work (Korthikanti et al. 2022, arXiv:2205.05198,
Section 5): full recomputation re-runs the forward of every recomputed block; selective
recomputation re-runs the attention core (QK^T and attention over V, ``4 b s^2 h`` per layer
forward for MHA with the full matrix). Note: Korthikanti's Appendix A hardware-FLOPs formula
for selective recompute, ``72 B s L h^2 (1 + s/(3h) + V/(12 L h))``
(:func:`korthikanti_selective_hfu_flops`, which reproduces the paper's Table 5 HFU), counts 3x
the attention-core forward as recompute, not 1x; the per-op count gives ``1 + 2s/(9h)`` in place
of ``1 + s/(3h)``.

MFU and HFU follow Chowdhery et al. 2022 (PaLM), Appendix B / Korthikanti et al. 2022, Section 6:
FLOPs per iteration / (iteration time * GPUs * peak FLOP/s per GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never, final

from blueprinting.analysis.stage_layout import chunk_layer_counts, fully_recomputed_blocks
from blueprinting.errors import ConfigError
from blueprinting.mapping.model import (
    FullAttention,
    MlpActivation,
    MultiLatentAttention,
    SlidingWindow,
    StandardAttention,
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import (
    FullRecompute,
    NoRecompute,
    RecomputeModule,
    SelectiveRecompute,
    TransformerTrainingMappingSpec,
)
from blueprinting.synthesizer.dialects.transformer.inference import attended_pairs


class FlopsConvention(StrEnum):
    """Which FLOP count a figure uses (see the module docstring for sources)."""

    MEGATRON_LEGACY = "megatron-legacy"
    MEGATRON_CAUSAL = "megatron-causal"
    MEGATRON_BRIDGE = "megatron-bridge"
    SIX_ND = "6nd"
    SIX_ND_ATTENTION = "6nd-attn"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardFlopsPerToken:
    """Forward FLOPs of one token (one position of one sequence), per op, for the whole model
    width (no parallelism). Block terms are per block; ``logits`` is the LM head once."""

    qkv_projection: int
    attention_scores: int
    attention_over_values: int
    output_projection: int
    mlp: int
    logits: int

    @property
    def attention_core(self) -> int:
        """QK^T and attention over V: what selective recomputation re-runs."""
        return self.attention_scores + self.attention_over_values

    @property
    def block(self) -> int:
        return self.qkv_projection + self.attention_core + self.output_projection + self.mlp


def forward_flops_per_token(model: TransformerModelSpec, *, causal: bool) -> ForwardFlopsPerToken:
    """Per-op forward GEMM FLOPs per token, general in GQA, SwiGLU, kv_channels and ffn.

    q = heads * kv_channels, k = v = query_groups * kv_channels, u = MLP up width (2f for SwiGLU):
    QKV ``2 h (q + 2k)``, QK^T ``2 s q``, attention over V ``2 s q``, output projection ``2 q h``,
    MLP ``2 h u + 2 f h``, LM head ``2 h V`` (padded vocabulary, as Megatron-LM counts it).
    ``causal`` halves QK^T and attention over V (only the unmasked half is computed).
    """
    h = model.hidden_size
    s = model.seq_length
    q = model.query_projection_size
    score = s * q if causal else 2 * s * q
    return ForwardFlopsPerToken(
        qkv_projection=2 * h * (q + 2 * model.kv_projection_size),
        attention_scores=score,
        attention_over_values=score,
        output_projection=2 * q * h,
        mlp=2 * h * model.mlp_up_width + 2 * model.ffn_hidden_size * h,
        logits=2 * h * model.padded_vocab_size,
    )


class _Core(StrEnum):
    """How a per-op convention counts QK^T and attention over V."""

    FULL_MATRIX = "full"
    CAUSAL = "causal"
    CAUSAL_WINDOWED = "causal-windowed"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ModelForwardFlops:
    """Forward FLOPs of one sequence of ``seq_length`` tokens through the whole model (no
    parallelism), per part, summed over the decoder layers and the MTP depths."""

    attention_projections: int
    attention_core: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    #: MTP depths' ``eh_proj`` and norms (their decoder layers are in the parts above)
    mtp_projections: int
    #: the LM head, once per MTP depth more
    logits: int

    @property
    def total(self) -> int:
        return (
            self.attention_projections
            + self.attention_core
            + self.dense_mlp
            + self.routed_experts
            + self.shared_experts
            + self.mtp_projections
            + self.logits
        )


def _mlp_forward_per_token(model: TransformerModelSpec, ffn: int) -> int:
    """``2 h u + 2 f h``: the up (2f wide with SwiGLU) and down GEMMs of an MLP of width f."""
    up = 2 * ffn if model.activation is MlpActivation.SWIGLU else ffn
    return 2 * model.hidden_size * up + 2 * ffn * model.hidden_size


def _core_width(model: TransformerModelSpec) -> int:
    """``n (d_qk + d_v)``: the per-token, per-key multiply-adds of QK^T plus attention over V
    (GQA: ``2 q``, q = heads * kv_channels; MLA: ``n (d_n + d_r + d_v)``)."""
    match model.self_attention:
        case StandardAttention():
            return 2 * model.query_projection_size
        case MultiLatentAttention() as mla:
            return model.num_attention_heads * (mla.qk_dim + mla.v_head_dim)
        case _ as unreachable:
            assert_never(unreachable)


def _layer_core_per_sequence(model: TransformerModelSpec, core: _Core, *, windowed: bool) -> int:
    """QK^T and attention over V of one layer for one sequence: ``c s^2`` causal (each query
    sees s / 2 keys on average, as Megatron-LM counts it), ``2 c s^2`` over the full matrix, and
    for a windowed layer under ``megatron-bridge`` ``c (2 s W - W (W - 1))`` (the exact causal
    sum of ``min(t, W)`` keys, W = window + 1), with c = :func:`_core_width`."""
    s = model.seq_length
    width = _core_width(model)
    match core:
        case _Core.FULL_MATRIX:
            return 2 * width * s * s
        case _Core.CAUSAL:
            return width * s * s
        case _Core.CAUSAL_WINDOWED:
            window = model.attention_window
            match window:
                case FullAttention():
                    return width * s * s
                case SlidingWindow(keys=keys):
                    if not windowed or keys >= s:
                        return width * s * s
                    # twice the window's exact causal pairs, as serving counts them
                    return 2 * width * attended_pairs(s, 0, keys)
                case _ as unreachable:
                    assert_never(unreachable)
        case _ as unreachable:
            assert_never(unreachable)


def _attention_core_per_sequence(model: TransformerModelSpec, layers: int, core: _Core) -> int:
    """:func:`_layer_core_per_sequence` summed over layers ``0 .. layers - 1`` (the MTP depths
    after the decoder's), the windowed and full layers counted in closed form."""
    window = model.attention_window
    windowed = 0
    match window:
        case FullAttention():
            pass
        case SlidingWindow():
            windowed = window.windowed_layers_in(layers)
        case _ as unreachable:
            assert_never(unreachable)
    return windowed * _layer_core_per_sequence(model, core, windowed=True) + (
        layers - windowed
    ) * _layer_core_per_sequence(model, core, windowed=False)


def _core_of(convention: FlopsConvention) -> _Core:
    match convention:
        case FlopsConvention.MEGATRON_LEGACY:
            return _Core.FULL_MATRIX
        case FlopsConvention.MEGATRON_BRIDGE:
            return _Core.CAUSAL_WINDOWED
        case (
            FlopsConvention.MEGATRON_CAUSAL
            | FlopsConvention.SIX_ND
            | FlopsConvention.SIX_ND_ATTENTION
        ):
            return _Core.CAUSAL
        case _ as unreachable:
            assert_never(unreachable)


def model_forward_flops(
    model: TransformerModelSpec, convention: FlopsConvention, *, mtp: bool = True
) -> ModelForwardFlops:
    """Per-op forward FLOPs of one sequence (module docstring): every decoder layer's attention
    and its dense MLP or its top-k routed plus shared experts, then, with ``mtp``, each MTP
    depth as one more layer of the last layer's kind with its projection and LM head. The
    attention core follows ``convention`` (full matrix for ``megatron-legacy``, windows only for
    ``megatron-bridge``, causal otherwise)."""
    s = model.seq_length
    h = model.hidden_size
    depths = model.mtp_num_layers if mtp else 0
    layers = model.num_layers + depths
    core = _core_of(convention)
    last = model.num_layers - 1
    moe = model.moe
    # the MTP depths are built like the last decoder layer
    dense_layers = layers - model.moe_layers_in(0, model.num_layers)
    dense_layers -= depths if model.is_moe_layer(last) else 0
    moe_layers = layers - dense_layers
    routed = (
        0 if moe is None else moe.top_k * _mlp_forward_per_token(model, moe.expert_ffn_hidden_size)
    )
    shared = (
        0
        if moe is None or moe.shared_expert_ffn_hidden_size == 0
        else _mlp_forward_per_token(model, moe.shared_expert_ffn_hidden_size)
    )
    return ModelForwardFlops(
        attention_projections=s * layers * 2 * sum(model.attention_projection_parameters),
        attention_core=_attention_core_per_sequence(model, layers, core),
        dense_mlp=s * dense_layers * _mlp_forward_per_token(model, model.ffn_hidden_size),
        routed_experts=s * moe_layers * routed,
        shared_experts=s * moe_layers * shared,
        # Megatron-LM counts the three MTP norms as 3h multiply-adds beside eh_proj's 2h^2.
        mtp_projections=s * depths * 2 * (3 * h + 2 * h * h),
        logits=s * (1 + depths) * 2 * h * model.padded_vocab_size,
    )


def model_flops_per_token(model: TransformerModelSpec, convention: FlopsConvention) -> float:
    """Training (forward + backward) model FLOPs per token, as Megatron-Bridge's tables imply
    them (model TFLOP/s per GPU / tokens/s per GPU)."""
    return model_flops_per_iteration(model, 1, convention) / model.seq_length


def _recomputable_forward_per_token(
    model: TransformerModelSpec, convention: FlopsConvention
) -> tuple[int, int, int]:
    """(one block's forward, its attention-core forward, its MLP forward) per token, in the
    convention's own terms: 6ND's block is 2 * block parameters and has no separate attention
    core; every convention counts the MLP as its GEMMs, ``2 (h u + f h)`` = 2 * MLP weights.
    Layers that differ (dense and MoE layers, windowed and full attention) give their mean over
    the decoder layers, rounded down (exact when the layers are alike)."""
    ops = model_forward_flops(model, _per_op(convention), mtp=False)
    per_layer = model.seq_length * model.num_layers
    mlp = (ops.dense_mlp + ops.routed_experts + ops.shared_experts) // per_layer
    match convention:
        case (
            FlopsConvention.MEGATRON_LEGACY
            | FlopsConvention.MEGATRON_CAUSAL
            | FlopsConvention.MEGATRON_BRIDGE
        ):
            block = (ops.total - ops.logits) // per_layer
            return block, ops.attention_core // per_layer, mlp
        case FlopsConvention.SIX_ND:
            return 2 * _mean_active_layer_parameters(model), 0, mlp
        case FlopsConvention.SIX_ND_ATTENTION:
            core = ops.attention_core // per_layer
            return 2 * _mean_active_layer_parameters(model) + core, core, mlp
        case _ as unreachable:
            assert_never(unreachable)


def _per_op(convention: FlopsConvention) -> FlopsConvention:
    """The per-op convention whose attention core a convention uses (6ND-attn: causal)."""
    match convention:
        case FlopsConvention.SIX_ND | FlopsConvention.SIX_ND_ATTENTION:
            return FlopsConvention.MEGATRON_CAUSAL
        case (
            FlopsConvention.MEGATRON_LEGACY
            | FlopsConvention.MEGATRON_CAUSAL
            | FlopsConvention.MEGATRON_BRIDGE
        ):
            return convention
        case _ as unreachable:
            assert_never(unreachable)


def _mean_active_layer_parameters(model: TransformerModelSpec) -> int:
    return model.layers_active_parameters // model.num_layers


def tokens_per_iteration(model: TransformerModelSpec, global_batch: int) -> int:
    """Tokens per optimizer step: global batch (sequences) * sequence length."""
    return global_batch * model.seq_length


def model_flops_per_iteration(
    model: TransformerModelSpec, global_batch: int, convention: FlopsConvention
) -> int:
    """FLOPs of one iteration without recomputation (the MFU numerator): 3x the forward
    (backward = data and weight gradients)."""
    tokens = tokens_per_iteration(model, global_batch)
    match convention:
        case (
            FlopsConvention.MEGATRON_LEGACY
            | FlopsConvention.MEGATRON_CAUSAL
            | FlopsConvention.MEGATRON_BRIDGE
        ):
            return 3 * global_batch * model_forward_flops(model, convention).total
        case FlopsConvention.SIX_ND:
            return 6 * model.active_parameters * tokens
        case FlopsConvention.SIX_ND_ATTENTION:
            core = model_forward_flops(model, convention, mtp=False).attention_core
            return 6 * model.active_parameters * tokens + 3 * global_batch * core
        case _ as unreachable:
            assert_never(unreachable)


def recomputed_blocks_per_microbatch(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> int:
    """Blocks whose forward runs twice per microbatch under full recomputation, summed over
    every model chunk (:func:`~blueprinting.analysis.stage_layout.fully_recomputed_blocks`:
    all of them for ``uniform``, the first ``num_layers`` of each chunk for ``block``)."""
    recompute = mapping.parallelism.recompute
    match recompute:
        case NoRecompute() | SelectiveRecompute():
            return 0
        case FullRecompute(method=method, num_layers=n):
            chunks = chunk_layer_counts(model, mapping.parallelism.pipeline)
            return sum(
                fully_recomputed_blocks(method, n, count) for stage in chunks for count in stage
            )
        case _ as unreachable:
            assert_never(unreachable)


def recompute_flops_per_iteration(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    convention: FlopsConvention,
) -> int:
    """The forward work recomputation adds to one iteration (Korthikanti et al. 2022, Sec. 5)."""
    tokens = tokens_per_iteration(model, mapping.batch.global_batch_size)
    block, core, mlp = _recomputable_forward_per_token(model, convention)
    recompute = mapping.parallelism.recompute
    match recompute:
        case NoRecompute():
            return 0
        case SelectiveRecompute(modules=modules):
            # the norms' and activations' FLOPs (layernorm, moe_act) are not GEMM FLOPs: no
            # convention counts them
            if model.moe is None:
                per_layer = (core if RecomputeModule.CORE_ATTN in modules else 0) + (
                    mlp if RecomputeModule.MLP in modules else 0
                )
                return tokens * model.num_layers * per_layer + _mla_up_recompute(
                    model, modules, tokens
                )
            return _moe_model_selective_flops(model, convention, modules, tokens)
        case FullRecompute():
            return tokens * recomputed_blocks_per_microbatch(model, mapping) * block
        case _ as unreachable:
            assert_never(unreachable)


def _mla_up_recompute(
    model: TransformerModelSpec, modules: frozenset[RecomputeModule], tokens: int
) -> int:
    """``mla_up_proj``: MLA's up-projection GEMMs once more per token and layer, ``2 (q_in n
    d_qk + c_kv n (d_n + d_v))`` (q_in = the q latent, or h without Q compression; shared
    reference section 2.10)."""
    mla = model.self_attention
    if RecomputeModule.MLA_UP_PROJ not in modules or not isinstance(mla, MultiLatentAttention):
        return 0
    n = model.num_attention_heads
    q_in = model.hidden_size if mla.q_lora_rank is None else mla.q_lora_rank
    up = q_in * n * mla.qk_dim + mla.kv_lora_rank * n * (mla.qk_head_dim + mla.v_head_dim)
    return tokens * model.num_layers * 2 * up


def _moe_model_selective_flops(
    model: TransformerModelSpec,
    convention: FlopsConvention,
    modules: frozenset[RecomputeModule],
    tokens: int,
) -> int:
    """Selective recomputation of a model with MoE layers, summed over its layers (per-op
    convention; 6ND counts the same GEMMs, 2 FLOPs per weight and token): ``core_attn`` every
    layer's attention core, ``mlp`` the dense layers' MLPs only (Megatron-Core's
    ``transformer_layer.py`` leaves a ``MoELayer`` out of the ``mlp`` module), ``moe`` the
    routed and shared experts, ``shared_experts`` the shared experts, ``mla_up_proj`` MLA's up
    projections (:func:`_mla_up_recompute`). The router GEMM is in no convention's count."""
    ops = model_forward_flops(model, _per_op(convention), mtp=False)
    sequences = tokens // model.seq_length
    total = 0
    if RecomputeModule.CORE_ATTN in modules and convention is not FlopsConvention.SIX_ND:
        # 6ND has no attention-core term to recompute
        total += ops.attention_core
    if RecomputeModule.MLP in modules:
        total += ops.dense_mlp
    if RecomputeModule.MOE in modules:
        total += ops.routed_experts + ops.shared_experts
    elif RecomputeModule.SHARED_EXPERTS in modules:
        total += ops.shared_experts
    return sequences * total + _mla_up_recompute(model, modules, tokens)


def hardware_flops_per_iteration(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    convention: FlopsConvention,
) -> int:
    """FLOPs the GPUs execute in one iteration: model FLOPs plus recomputed forwards (the HFU
    numerator). Under ``megatron-legacy`` with uniform full recomputation of a GPT-shaped model
    this is exactly Narayanan et al. 2021 Eq. (3)."""
    return model_flops_per_iteration(
        model, mapping.batch.global_batch_size, convention
    ) + recompute_flops_per_iteration(model, mapping, convention)


def _require_positive_numbers(**values: float) -> None:
    problems = [
        f"{key} must be a positive finite number, got {value!r}"
        for key, value in values.items()
        if not (math.isfinite(value) and value > 0)
    ]
    if problems:
        raise ConfigError(problems, source="FLOPs utilization")


def achieved_flops_per_gpu(flops: float, iteration_time_s: float, world_size: int) -> float:
    """FLOP/s per GPU, as Megatron-LM logs ``throughput per GPU`` (training.py, FLOPs /
    (iteration time * world size))."""
    _require_positive_numbers(iteration_time_s=iteration_time_s, world_size=world_size)
    return flops / (iteration_time_s * world_size)


def mfu(
    model_flops: float, iteration_time_s: float, world_size: int, peak_flops_per_gpu: float
) -> float:
    """Model FLOPs utilization (fraction, not percent): model FLOPs / (time * GPUs * peak)."""
    _require_positive_numbers(
        iteration_time_s=iteration_time_s,
        world_size=world_size,
        peak_flops_per_gpu=peak_flops_per_gpu,
    )
    return model_flops / (iteration_time_s * world_size * peak_flops_per_gpu)


def hfu(
    hardware_flops: float, iteration_time_s: float, world_size: int, peak_flops_per_gpu: float
) -> float:
    """Hardware FLOPs utilization (fraction): hardware FLOPs / (time * GPUs * peak)."""
    return mfu(hardware_flops, iteration_time_s, world_size, peak_flops_per_gpu)


def implied_iteration_time_s(flops: float, world_size: int, flops_per_gpu: float) -> float:
    """Iteration time implied by a published FLOP/s-per-GPU figure: F / (n * FLOP/s)."""
    _require_positive_numbers(world_size=world_size, flops_per_gpu=flops_per_gpu)
    return flops / (world_size * flops_per_gpu)


def iterations_to_train(model: TransformerModelSpec, global_batch: int, tokens: int) -> int:
    """Optimizer steps needed to consume ``tokens`` tokens (the last step may be partial)."""
    per_iteration = tokens_per_iteration(model, global_batch)
    return -(-tokens // per_iteration)


def time_to_train_s(
    model: TransformerModelSpec, global_batch: int, tokens: int, iteration_time_s: float
) -> float:
    """Seconds to consume ``tokens`` tokens at a steady ``iteration_time_s`` (whole steps)."""
    _require_positive_numbers(iteration_time_s=iteration_time_s)
    return iterations_to_train(model, global_batch, tokens) * iteration_time_s


# Literal paper formulas (GPT only: MHA, ffn = 4h, kv_channels = h / heads, full s x s scores).
def narayanan_eq3_flops(
    *, batch: int, seq_length: int, num_layers: int, hidden_size: int, vocab_size: int
) -> int:
    """Narayanan et al. 2021 Eq. (3), ``96 B s L h^2 (1 + s/(6h) + V/(16 L h))``, expanded to
    ``96 B s L h^2 + 16 B s^2 L h + 6 B s h V`` so that it stays an exact integer."""
    b, s, layers, h, v = batch, seq_length, num_layers, hidden_size, vocab_size
    return 96 * b * s * layers * h * h + 16 * b * s * s * layers * h + 6 * b * s * h * v


def narayanan_model_flops(
    *, batch: int, seq_length: int, num_layers: int, hidden_size: int, vocab_size: int
) -> int:
    """Eq. (3) without the recompute forward (Korthikanti et al. 2022, Appendix A, model FLOPs):
    ``72 B s L h^2 (1 + s/(6h) + V/(12 L h)) = 72 B s L h^2 + 12 B s^2 L h + 6 B s h V``."""
    b, s, layers, h, v = batch, seq_length, num_layers, hidden_size, vocab_size
    return 72 * b * s * layers * h * h + 12 * b * s * s * layers * h + 6 * b * s * h * v


def korthikanti_selective_hfu_flops(
    *, batch: int, seq_length: int, num_layers: int, hidden_size: int, vocab_size: int
) -> int:
    """Korthikanti et al. 2022, Appendix A, hardware FLOPs with selective recomputation, as the
    paper states it: ``72 B s L h^2 (1 + s/(3h) + V/(12 L h))``. Reproduces Table 5's HFU; it
    exceeds the per-op count (see the module docstring)."""
    b, s, layers, h, v = batch, seq_length, num_layers, hidden_size, vocab_size
    return 72 * b * s * layers * h * h + 24 * b * s * s * layers * h + 6 * b * s * h * v
