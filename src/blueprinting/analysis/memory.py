"""Memory per GPU: weights, gradients, optimizer states, activations and buffers, per stage.

Sources
-------
- Bytes per parameter (Adam, mixed precision): Megatron-LM ``docs/user-guide/features/
  dist_optimizer.md``: bf16 params + fp32 grads: 18 B (6 + 12/d with the distributed optimizer);
  fp16: 20 B (4 + 16/d); fp32: 16 B (8 + 8/d). :class:`PrecisionRecipe` spells out where each byte
  lives, :func:`precision_recipe` derives it from ``model.datatype`` and the strategy's gradient
  reduction datatype (``grad_reduce_dtype``: bf16 gradients give fp16's 20 B row).
- Optimizer sharding (Rajbhandari et al. 2020, ZeRO, Section 5): the distributed optimizer (ZeRO-1)
  shards fp32 main params, fp32 main grads (fp16 only) and Adam moments over d; ZeRO-2 also the
  gradients; ZeRO-3 also the parameters.
- Activations: Korthikanti et al. 2022 (arXiv:2205.05198), Section 4 and Table 2, generalized per op
  (:func:`layer_activation_bytes`), times the in-flight microbatches of the schedule
  (``schedules.md`` section 5, checked against Megatron-LM ``schedules.py``).
- Megatron-LM's own estimate (``megatron/training/theoretical_memory_usage.py``) is
  :func:`megatron_theoretical_memory`, kept apart so reports can show both.

Choices (each one a documented approximation)
---------------------------------------------
- Parameters are counted per TP rank exactly: column/row-parallel GEMM weights and column-parallel
  biases are split over t; row-parallel biases and norms are replicated (Megatron-LM
  ``tensor_parallel/layers.py``); KV heads are replicated when t > query groups. Megatron's estimate
  divides everything by t.
- The first stage holds the word embedding (vocab-parallel, / t) and learned positions (replicated);
  the last stage holds the final norm and the LM head when untied, or, when tied and p > 1, the copy
  of the word embedding Megatron keeps there (``LanguageModule.setup_embeddings_and_output_layer``);
  that copy has gradients and optimizer states like any parameter.
- ZeRO-3 (``ShardedParameters``): each rank keeps 1/d of every parameter, plus the other (d-1)/d of
  the FSDP units being used: one unit, two with ``overlap_param_gather`` (the prefetched next unit).
  The unit is the largest of a block, the embedding and the LM head on the stage. The local shard is
  taken to alias its slot of the gathered unit, so d = 1 gives the unsharded figure exactly.
  Transient full-size gradient buckets before the reduce-scatter are not counted.
- Activations use Korthikanti's accounting: activations in the datatype's bytes, dropout masks
  1 byte, the s x s softmax stored (no flash attention); selective recomputation drops exactly the
  s x s terms. Full recomputation stores each checkpointed block input (``2 s b h`` bytes, / t
  with sequence parallelism). Both add the working set of what they rebuild in backward: the s x s
  tensors of one block (selective), the activations of the group being recomputed less its
  checkpoint (full: ``num_layers`` blocks for ``uniform``, one block for ``block``). The stored
  figures are exact in Korthikanti's terms; the working set is not in the paper's figures. With it,
  none >= selective >= full(num_layers = 1) holds on every stage; a ``uniform`` group of several
  blocks rebuilds their s x s tensors at once and can exceed selective on short stages (real).
- "other": token ids (int64) and the embedding dropout mask per in-flight microbatch on the first
  stage (Megatron's estimate counts the same two), and on the last stage the LM-head input plus the
  fp32 logits ``[s*b, V/t]`` kept by the vocab-parallel cross entropy for its backward.
- Fused attention (:class:`FusedAttention`, Megatron-Core's default) stores no ``s x s``
  tensor, only the kernel's fp32 softmax statistics; :class:`UnfusedAttention` stores
  Korthikanti's ``s x s`` terms (:func:`attention_core_bytes`).
- The peaks (:class:`StageOverheads`, :class:`MemoryBreakdown`): the step's transient working
  set (a block's backward gradients, the last stage's 16-bit logits), cuBLAS workspaces, the
  caching allocator's reserve, the CUDA context and NCCL's buffers per communicator, each with
  its source. Not counted: checkpoint and optimizer-step temporaries, pinned host memory.

Differences from Calculon (``calculon_oracle.md``, "stats — memory per GPU")
----------------------------------------------------------------------------
Calculon (caa4b11) keeps fp32 weight gradients for one block only and low-precision gradients for
the rest, so weights + optimizer come out 5.5-10.8% below 18 B/param; it models no embedding, LM
head, loss, biases, GQA or SwiGLU; its ``optimizer_sharding`` shards gradients too (ZeRO-2 in our
terms); it adds the working activations of one block to the stored ones and an activation-gradient
buffer; its in-flight factor is ``min(m, p) * (1 + (p-1)/(v*p))`` for every schedule (schedules.md
section 5 shows where that is wrong); and its selective recompute without sequence parallelism
under-counts by ``2 b s h`` bytes per block (its known bug 2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING, assert_never, cast, final

from blueprinting.analysis.precision_memory import (
    param_gather_bytes,
    saved_input_bytes,
    weight_extra_bytes,
)
from blueprinting.analysis.rank_parameters import (
    block_linear_weights_per_rank,
    block_parameters_per_rank,
    kv_width_per_rank,
    moe_block_linear_weights_per_rank,
    moe_block_parameters_per_rank,
)
from blueprinting.analysis.stage_layout import chunk_layer_counts, chunk_layer_starts
from blueprinting.hardware.polymorphic import Count, maximum, minimum, where

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
from blueprinting.errors import ConfigError, UnsupportedError
from blueprinting.hardware.system import (
    BulkCollectives,
    Communicator,
    CommunicatorUse,
    PeerSends,
    RuntimeMemory,
    ScalarCollectives,
    members_in_domain,
)
from blueprinting.mapping.model import (
    Datatype,
    EmbeddingTying,
    MlpActivation,
    MultiLatentAttention,
    Normalization,
    PositionEmbedding,
    StandardAttention,
    TransformerModelSpec,
)
from blueprinting.mapping.precision import (
    HighPrecision,
    TrainingPrecision,
    high_precision_layers,
    projection_saves_original_input,
)
from blueprinting.mapping.transformer import (
    ActivationOffload,
    AllGatherKV,
    AttentionKernel,
    CombinedOneForwardOneBackward,
    ContextParallel,
    CpCommunication,
    DispatcherType,
    DistributedOptimizer,
    DualPipe,
    DualPipeV,
    ExpertParallel,
    ForwardOnly,
    FullRecompute,
    FusedAttention,
    GradReduceDtype,
    HeadAllToAll,
    HierarchicalAllToAllRing,
    InterleavedOneForwardOneBackward,
    LayerCpuOffload,
    NoActivationOffload,
    NoOptimizerSharding,
    NoRecompute,
    OneForwardOneBackward,
    OptimizerSharding,
    PipelineParallel,
    PipelineSchedule,
    RecomputeMethod,
    RecomputeModule,
    RecomputePolicy,
    RingExchange,
    SelectiveRecompute,
    ShardedGradients,
    ShardedParameters,
    SingleStage,
    TransformerTrainingMappingSpec,
    UnfusedAttention,
    ZeroBubbleH1,
    dispatcher_type,
    grad_reduce_datatype,
    loss_stage,
    model_copies,
    shared_expert_overlaps,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    SOFTMAX_STATISTIC_BYTES,
    EagerPasses,
    eager_passes,
    mla_gathered_width,
    received_rows,
)

#: the default of the activation functions' ``precision``: no recipe
_HIGH_PRECISION = HighPrecision()

TOKEN_ID_BYTES = 8
"""Megatron-LM feeds int64 token ids to the embedding."""

DROPOUT_MASK_BYTES = 1
"""Korthikanti et al. 2022, Section 4.1: dropout masks take one byte per element."""


def dropout_mask_bytes(dropout: bool) -> int:
    """A dropout's mask bytes per element: none when its probability is 0 (PyTorch returns the
    input unchanged and stores nothing)."""
    return DROPOUT_MASK_BYTES if dropout else 0


LOGITS_BYTES = 4
"""The vocab-parallel cross entropy works on fp32 logits (Megatron-LM ``cross_entropy.py``)."""


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


# --------------------------------------------------------------------------------------------
# The compositions on integers or on columns of them
# --------------------------------------------------------------------------------------------
# The plan evaluates what follows on Python integers (exact at any size), the search
# (search/evaluate_vectorized.py) on int64 columns, one row per candidate: each formula once.
# The callers differ only in how they pick a variant: a ``match`` on the spec's sum type, or
# ``numpy.select`` over the rows' variant codes.


def _plain_ints(*values: object) -> bool:
    return all(type(value) is int for value in values)


def ceil_div(numerator: Count, denominator: Count) -> Count:
    """The integer ceiling of ``numerator / denominator`` (both non-negative, the denominator
    positive), exact on Python integers and on int64 columns."""
    return cast("Count", -(-numerator // denominator))  # type: ignore[redundant-cast]


def sequence_rows(
    tokens: Count, tensor: Count, sequence_parallel: bool | npt.NDArray[np.bool_]
) -> Count:
    """Rows of a token-wise tensor on one TP rank: ``s / t`` (rounded up) under sequence
    parallelism, all ``s`` without it."""
    return where(sequence_parallel, ceil_div(tokens, tensor), tokens + tensor * 0)


def state_bytes(
    count: Count,
    *,
    recipe: PrecisionRecipe,
    level: Count,
    degree: Count,
    gathered: Count,
) -> tuple[Count, Count, Count]:
    """(weights, gradients, optimizer states) bytes of ``count`` parameters whose states shard
    over ``degree`` ranks at sharding ``level`` (:func:`sharding_level`: 1 optimizer states,
    2 and gradients, 3 and parameters), ``gathered`` of them held whole (ZeRO-3)."""
    weights = count * recipe.param
    gradients = count * recipe.grad
    optimizer = count * recipe.optimizer
    return (
        where(
            level >= 3,
            ceil_div((count - gathered) * recipe.param, degree) + gathered * recipe.param,
            weights,
        ),
        where(level >= 2, ceil_div(gradients, degree), gradients),
        where(level >= 1, ceil_div(optimizer, degree), optimizer),
    )


def gathered_whole(
    level: Count, total: Count, largest_unit: Count, prefetch: bool | npt.NDArray[np.bool_]
) -> Count:
    """Parameters ZeRO-3 (sharding level 3) holds unsharded at once: the unit being computed,
    and the next one when the gather is prefetched; none at the other levels."""
    units = where(prefetch, largest_unit * 2, largest_unit)
    return where(level >= 3, minimum(total, units), total * 0)


def plain_stored_bytes(
    layer_microbatches: Count,
    moe_layer_microbatches: Count,
    per_layer: Count,
    moe_per_layer: Count,
) -> Count:
    """What a stage stores for backward without full recomputation: every in-flight
    (microbatch, block) pair its block's bytes (``per_layer``: all of them without
    recomputation, the kept ones under selective recompute), a MoE block its excess over a
    dense one on top (``moe_per_layer - per_layer``)."""
    return cast(  # type: ignore[redundant-cast]
        "Count",
        layer_microbatches * per_layer + moe_layer_microbatches * (moe_per_layer - per_layer),
    )


def uniform_stored_bytes(
    microbatches: Count, layers: Count, group: Count, checkpoint: Count
) -> Count:
    """Full recompute, ``uniform`` method, one chunk of ``layers`` blocks with ``microbatches``
    in flight: one checkpoint per group of ``group`` blocks (Megatron-LM
    ``--recompute-method uniform``)."""
    return cast("Count", microbatches * ceil_div(layers, group) * checkpoint)  # type: ignore[redundant-cast]


def block_stored_bytes(
    microbatches: Count, layers: Count, group: Count, checkpoint: Count, full: Count
) -> Count:
    """Full recompute, ``block`` method, one chunk: the first ``group`` blocks keep only their
    checkpoint, the rest store everything (Megatron-LM ``--recompute-method block``)."""
    kept = minimum(group, layers) * checkpoint + maximum(layers - group, layers * 0) * full
    return microbatches * kept


def selective_working_bytes(
    has_blocks: bool | npt.NDArray[np.bool_], full: Count, kept: Count
) -> Count:
    """Selective recompute's working set in backward: the recomputed attention core of one
    block (its s x s tensors), where the stage holds blocks."""
    return where(has_blocks, full - kept, full * 0)


def uniform_working_bytes(group: Count, full: Count, checkpoint: Count) -> Count:
    """Full uniform recompute's working set: the recomputed group's activations less its first
    input, the checkpoint already counted as stored (``group``: blocks in the group, 0 on a
    stage without blocks)."""
    return where(group > 0, group * full - checkpoint, full * 0)


def block_working_bytes(
    has_blocks: bool | npt.NDArray[np.bool_], full: Count, checkpoint: Count
) -> Count:
    """Full block recompute's working set: one recomputed block less its checkpoint."""
    return where(has_blocks, full - checkpoint, full * 0)


def embedding_buffer_bytes(
    microbatches: Count,
    *,
    micro_batch: Count,
    tokens: Count,
    rows: Count,
    hidden: int,
    dropout: bool,
) -> Count:
    """The first stage's embedding buffers of ``microbatches`` in flight: the int64 token ids
    and the embedding dropout's mask (module docstring)."""
    per_sample = TOKEN_ID_BYTES * tokens + dropout_mask_bytes(dropout) * rows * hidden
    return cast("Count", microbatches * micro_batch * per_sample)  # type: ignore[redundant-cast]


def logits_buffer_bytes(
    microbatches: Count,
    *,
    micro_batch: Count,
    tokens: Count,
    vocab_shard: Count,
    rows: Count,
    hidden: int,
    activation: int,
) -> Count:
    """The loss stage's stored logits of ``microbatches`` in flight: fp32 logits of the
    vocabulary shard and the final norm's output (module docstring)."""
    per_sample = LOGITS_BYTES * tokens * vocab_shard + activation * rows * hidden
    return cast("Count", microbatches * micro_batch * per_sample)  # type: ignore[redundant-cast]


# --------------------------------------------------------------------------------------------
# Precision
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionRecipe:
    """Bytes per parameter held for mixed-precision Adam, and bytes per stored activation.

    ``param`` and ``grad`` live with the model (DDP buffers); ``main_param``, ``main_grad`` (an
    optimizer-side fp32 gradient copy, fp16 only) and ``moments`` (Adam's two fp32 moments together)
    live in the optimizer and are what the distributed optimizer shards.
    """

    name: str
    param: int
    grad: int
    main_param: int
    main_grad: int
    moments: int
    activation: int

    def __post_init__(self) -> None:
        values = (
            ("param", self.param),
            ("grad", self.grad),
            ("main_param", self.main_param),
            ("main_grad", self.main_grad),
            ("moments", self.moments),
            ("activation", self.activation),
        )
        bad = [f"{k} must be a non-negative integer, got {v!r}" for k, v in values if v < 0]
        if bad:
            raise ConfigError(bad, source=f"precision recipe {self.name!r}")

    @property
    def optimizer(self) -> int:
        """Optimizer-side bytes per parameter (what the distributed optimizer shards)."""
        return self.main_param + self.main_grad + self.moments

    @property
    def total(self) -> int:
        """Bytes per parameter without sharding (18 for bf16)."""
        return self.param + self.grad + self.optimizer


_BF16_RECIPE = PrecisionRecipe(
    name=str(Datatype.BF16), param=2, grad=4, main_param=4, main_grad=0, moments=8, activation=2
)
_FP8_RECIPE = PrecisionRecipe(
    name=str(Datatype.FP8), param=2, grad=4, main_param=4, main_grad=0, moments=8, activation=2
)
_FP16_RECIPE = PrecisionRecipe(
    name=str(Datatype.FP16), param=2, grad=2, main_param=4, main_grad=4, moments=8, activation=2
)
_FP32_RECIPE = PrecisionRecipe(
    name=str(Datatype.FP32), param=4, grad=4, main_param=0, main_grad=0, moments=8, activation=4
)


def precision_recipe(
    datatype: Datatype, grad_reduce: GradReduceDtype = GradReduceDtype.DEFAULT
) -> PrecisionRecipe:
    """Megatron-LM's recipe for a training datatype (dist_optimizer.md table) and gradient
    reduction datatype (:class:`~blueprinting.mapping.transformer.GradReduceDtype`, resolved by
    :func:`~blueprinting.mapping.transformer.grad_reduce_datatype`).

    bf16: bf16 params, fp32 grads (``accumulate_allreduce_grads_in_fp32``), fp32 main params, two
    fp32 moments: 2 + 4 + 4 + 8 = 18 = 6 + 12/d. fp16: fp16 params and grads, fp32 main params and
    main grads, two fp32 moments: 2 + 2 + (4 + 4 + 8) = 20 = 4 + 16/d. fp32: 4 + 4 + 8 = 16 = 8 +
    8/d. fp8: Megatron-LM (Transformer Engine) keeps bf16 weights and fp32 optimizer state and runs
    only the GEMMs in fp8, so the bf16 recipe; ``activation`` is the 2 bytes of the tensors that
    stay bf16 (the linears' quantized inputs are :func:`layer_activation_bytes`' ``precision``).

    The gradient buffer holds the reduction's datatype (``grad``: 2 or 4 bytes). A 16-bit buffer
    gets an fp32 copy in the optimizer: Megatron-Core's ``_copy_model_grads_to_main_grads`` sets
    ``main_param.grad = main_grad.float()`` (``megatron/core/optimizer/optimizer.py`` l.1092-1100;
    the distributed optimizer on its shard, ``distrib_optimizer.py`` l.2756-2792 @d98e8a64), a
    view when the buffer is fp32 already. That copy (``main_grad``, 4 bytes) is made at the step
    and freed by ``zero_grad(set_to_none=True)`` at the start of the next ``train_step``
    (``megatron/training/training.py`` l.3039-3044), so it is not live during the backward that
    sets the peak; it is counted in the optimizer states nonetheless, as the dist_optimizer.md
    fp16 row (20 B = 4 + 16/d) counts it: an upper bound of 4/d bytes per parameter on the
    backward peak. bf16 with a bf16 reduction is then fp16's row: 2 + 2 + (4 + 4 + 8). (The
    Adam step's traffic reads ``grad``, not the copy: :mod:`~blueprinting.analysis.optimizer_step`.)
    """
    recipe = _base_recipe(datatype)
    grad = grad_reduce_datatype(datatype, grad_reduce).bytes
    if grad == recipe.grad:
        return recipe
    return replace(recipe, grad=grad, main_grad=FP32_BYTES if grad < FP32_BYTES else 0)


def _base_recipe(datatype: Datatype) -> PrecisionRecipe:
    match datatype:
        case Datatype.BF16:
            return _BF16_RECIPE
        case Datatype.FP8:
            return _FP8_RECIPE
        case Datatype.FP16:
            return _FP16_RECIPE
        case Datatype.FP32:
            return _FP32_RECIPE
        case _ as unreachable:
            assert_never(unreachable)


FP32_BYTES = 4
"""Bytes of an fp32 value: the main parameters, main gradients and Adam moments."""


def training_recipe(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> PrecisionRecipe:
    """:func:`precision_recipe` of a training strategy: the model's datatype and the strategy's
    gradient reduction datatype (``DataParallel.grad_reduce_dtype``)."""
    return precision_recipe(model.datatype, mapping.parallelism.data.grad_reduce_dtype)


# --------------------------------------------------------------------------------------------
# Parameters per stage
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StageParameters:
    """Parameters held by one TP rank of one pipeline stage."""

    stage: int
    blocks: int
    block_parameters: int
    embedding: int
    output_layer: int
    final_norm: int
    #: of ``blocks``, the MoE ones, each holding ``moe_dense_parameters`` (attention, shared
    #: experts, router, norms) and ``expert_parameters`` (its routed experts' share)
    moe_blocks: int = 0
    moe_dense_parameters: int = 0
    expert_parameters: int = 0
    #: the multi-token-prediction depths on the loss stage: dense and routed-expert parts
    mtp_dense: int = 0
    mtp_expert: int = 0

    @property
    def expert_total(self) -> int:
        """Routed-expert parameters: reduced and sharded over expert-dp, not d x cp."""
        return self.moe_blocks * self.expert_parameters + self.mtp_expert

    @property
    def dense_total(self) -> int:
        """Everything else: reduced and sharded over d x cp."""
        return (
            (self.blocks - self.moe_blocks) * self.block_parameters
            + self.moe_blocks * self.moe_dense_parameters
            + self.mtp_dense
            + self.embedding
            + self.output_layer
            + self.final_norm
        )

    @property
    def total(self) -> int:
        return self.dense_total + self.expert_total

    @property
    def largest_unit(self) -> int:
        """The largest FSDP unit on the stage (a block, the embedding or the LM head)."""
        block = self.block_parameters if self.blocks > self.moe_blocks else 0
        moe = self.moe_dense_parameters + self.expert_parameters if self.moe_blocks else 0
        return max(block, moe, self.embedding, self.output_layer)


def stage_parameters(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec, stage: int
) -> StageParameters:
    """Parameters per TP rank on pipeline stage ``stage`` (0 = first)."""
    return _stage_parameters(model, mapping, stage, _parameter_layout_of(model, mapping))


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _ParameterLayout:
    """Where one strategy's parameters sit: the layers of every chunk of every stage (MoE ones
    apart) and a dense and a MoE block's parameters per rank. It reads the TP degree, the
    pipeline and the expert grid only, so strategies differing elsewhere share it."""

    chunks: tuple[tuple[int, ...], ...]
    moe_chunks: tuple[tuple[int, ...], ...]
    block_parameters: int
    moe_parameters: tuple[int, int]


def _parameter_layout_of(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> _ParameterLayout:
    parallelism = mapping.parallelism
    return _parameter_layout(
        model, mapping.tensor_degree, parallelism.pipeline, parallelism.experts
    )


@lru_cache(maxsize=4096)
def _parameter_layout(
    model: TransformerModelSpec,
    tensor_degree: int,
    pipeline: PipelineParallel,
    experts: ExpertParallel,
) -> _ParameterLayout:
    """:class:`_ParameterLayout` memoized by the values it reads (issue 18: the vectorized search
    asks for the stage parameters of thousands of strategies; a Qwen3-30B-A3B search over 4 and
    1,536 GPUs computed every strategy's activation invariants to read its parameters)."""
    chunks = chunk_layer_counts(model, pipeline)
    moe_chunks = tuple(tuple(0 for _ in row) for row in chunks)
    if model.moe is not None:
        starts = chunk_layer_starts(model, pipeline)
        moe_chunks = tuple(
            tuple(model.moe_layers_in(a, n) for a, n in zip(row_starts, row, strict=True))
            for row_starts, row in zip(starts, chunks, strict=True)
        )
    return _ParameterLayout(
        chunks=chunks,
        moe_chunks=moe_chunks,
        block_parameters=block_parameters_per_rank(model, tensor_degree),
        moe_parameters=moe_block_parameters_per_rank(model, tensor_degree, experts),
    )


def _stage_parameters(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    stage: int,
    layout: _ParameterLayout,
) -> StageParameters:
    _check_stage(stage, mapping.pipeline_degree)
    counts = stage_parameter_counts(
        model,
        tensor_degree=mapping.tensor_degree,
        pipeline_degree=mapping.pipeline_degree,
        stage=stage,
        blocks=sum(layout.chunks[stage]),
        block_parameters=layout.block_parameters,
        loss_at=loss_stage(mapping.parallelism.pipeline.schedule, mapping.pipeline_degree),
    )
    if model.moe is None:
        return counts
    dense, routed = layout.moe_parameters
    mtp_dense = mtp_expert = 0
    if model.mtp_num_layers and counts.output_layer + counts.final_norm > 0:
        # MTP depths sit on the loss stage (Megatron-LM's default placement); each has the
        # last decoder layer's kind, an eh_proj (2h -> h, column-parallel) and three norms
        last_moe = model.mtp_layer_is_moe
        h, t = model.hidden_size, mapping.tensor_degree
        extra = 2 * h * _ceil_div(h, t) + 3 * model.norm_parameters
        layer = dense if last_moe else layout.block_parameters
        mtp_dense = model.mtp_num_layers * (layer + extra)
        mtp_expert = model.mtp_num_layers * (routed if last_moe else 0)
    return replace(
        counts,
        moe_blocks=sum(layout.moe_chunks[stage]),
        moe_dense_parameters=dense,
        expert_parameters=routed,
        mtp_dense=mtp_dense,
        mtp_expert=mtp_expert,
    )


def stage_parameter_counts(
    model: TransformerModelSpec,
    *,
    tensor_degree: int,
    pipeline_degree: int,
    stage: int,
    blocks: int,
    block_parameters: int | None = None,
    loss_at: int | None = None,
) -> StageParameters:
    """Parameters per TP rank of stage ``stage`` holding ``blocks`` blocks: the blocks, the
    word (and learned position) embedding on the first stage, the final norm and the LM head on
    the last (Megatron-LM keeps a copy of tied embeddings there when p > 1). Training and
    serving share it; ``block_parameters`` defaults to :func:`block_parameters_per_rank`;
    ``loss_at`` is the stage with the LM head (default the last; DualPipeV's is the first)."""
    p = pipeline_degree
    t = tensor_degree
    _check_stage(stage, p)
    word = _ceil_div(model.padded_vocab_size, t) * model.hidden_size
    embedding = 0
    if stage == 0:
        match model.position_embedding:
            case PositionEmbedding.LEARNED_ABSOLUTE:
                embedding = word + model.seq_length * model.hidden_size
            case PositionEmbedding.ROPE | PositionEmbedding.YARN | PositionEmbedding.NONE:
                embedding = word
            case _ as unreachable:
                assert_never(unreachable)
    output_layer = 0
    final_norm = 0
    if stage == (p - 1 if loss_at is None else loss_at):
        final_norm = model.norm_parameters
        match model.embeddings:
            case EmbeddingTying.UNTIED:
                output_layer = word
            case EmbeddingTying.TIED:
                output_layer = word if p > 1 else 0
            case _ as unreachable_tying:
                assert_never(unreachable_tying)
    return StageParameters(
        stage=stage,
        blocks=blocks,
        block_parameters=(
            block_parameters_per_rank(model, t) if block_parameters is None else block_parameters
        ),
        embedding=embedding,
        output_layer=output_layer,
        final_norm=final_norm,
    )


def _check_stage(stage: int, pipeline_degree: int) -> None:
    if not 0 <= stage < pipeline_degree:
        raise ConfigError(
            [f"stage must be in [0, {pipeline_degree}), got {stage!r}"], source="memory analysis"
        )


# --------------------------------------------------------------------------------------------
# Activations
# --------------------------------------------------------------------------------------------
def layer_activation_bytes(
    model: TransformerModelSpec,
    *,
    micro_batch: int,
    tensor_degree: int,
    sequence_parallel: bool,
    attention: AttentionKernel,
    recomputed: frozenset[RecomputeModule],
    activation_bytes: int,
    precision: TrainingPrecision = _HIGH_PRECISION,
    moe: bool = False,
) -> int:
    """Bytes one block stores for its backward, for one microbatch on one TP rank.

    ``recomputed``: the modules selective recomputation re-runs in backward, whose own saved
    tensors are therefore not stored (empty: everything is stored). ``core_attn``: the attention
    core's tensors, with :class:`UnfusedAttention` the ``s x s`` terms below, with
    :class:`FusedAttention` only the kernel's fp32 softmax statistics ``4 (a/t) s`` bytes
    (FlashAttention-2, Dao 2023, Algorithm 1: one log-sum-exp per query row and head; its
    output is the output projection's input, counted in ``split``). ``mlp``: the activation
    function's input and output ``x (u + f)`` (the MLP's input is the checkpoint, kept).
    ``mla_up_proj``: MLA's up-projected Q, K and V ``x s (a/t) (2 d_qk + d_v)`` (the latents,
    its checkpointed inputs, stay).
    ``layernorm``: the two norms' outputs, the QKV and MLP-up GEMM inputs ``2 x h`` per row
    (Megatron-Core recomputes a separate norm module; Transformer Engine's fused
    ``LayerNormLinear`` has none to recompute).

    Korthikanti et al. 2022, Section 4.1, per op (``x`` = activation bytes, masks 1 byte; widths
    per TP rank: q = heads*kv_channels/t, k = v = K width, u = MLP up width/t, f = ffn/t):

    - h-wide, replicated over TP unless sequence parallel (then s/t rows): the two norm inputs,
      the QKV GEMM input and the MLP-up GEMM input (``4 x h``), attention and MLP dropout masks
      (``2 h``);
    - split over TP: Q and K (QK^T inputs), V, the output-projection input (``x (2q + 2k)``), the
      activation-function input and output (``x (u + f)``);
    - s x s (dropped by selective recompute): softmax output, its dropout mask and dropout output
      (``(2x + 1) (a/t) s``).

    GPT shapes (q = k = h, u = f = 4h, x = 2) give ``s b h (10 + 24/t + 5 a s/(h t))`` without
    sequence parallelism and ``s b h (34 + 5 a s / h) / t`` with it (Table 2); SwiGLU's up width
    2f and GQA's narrower K/V enter through u and k, matching Megatron-LM's
    ``18 + 4 ffn/h`` for GELU with q = k = h.

    Under a low-precision ``precision`` (shared reference section 3.3 "Activations") each
    Transformer Engine linear keeps its input quantized for the weight gradient
    (:func:`~blueprinting.analysis.precision_memory.saved_input_bytes`, written ``Q(n)``) where
    the high-precision copy was the linear's alone: the QKV and MLP-up inputs (the fused norms'
    outputs, ``Q(h)`` per row each; MLA's input norm feeds two down projections, ``2 Q(h)``), the
    MLP-down input ``Q(f)`` (the activation function keeps its input, the FC1 output, at ``x``),
    and MLA's up projections' latent inputs. The attention output is the output projection's
    input, kept once at ``x q`` under every recipe but delayed scaling: Megatron-Core has the
    projection save its original input, the tensor a fused kernel keeps for its own backward
    (:func:`~blueprinting.mapping.precision.projection_saves_original_input`). Under delayed
    scaling a fused kernel keeps it at ``x`` and the projection adds its quantized copy
    (``x q + Q(q)``); the unfused core keeps its softmax and V, not its output, so the
    projection's ``Q(q)`` replaces it. Q, K, V, the softmax statistics and the norms'
    inputs stay at ``x`` (attention runs in high precision). ``moe``: the layer's MLP is a MoE
    feed-forward, whose input the router keeps at ``x`` (its expert GEMMs' inputs are
    :func:`moe_ffn_activation_bytes`').
    """
    t = tensor_degree
    s = model.seq_length
    h = model.hidden_size
    x = activation_bytes

    def kept(elements: int) -> int:
        return saved_input_bytes(precision, elements, x)

    low = not isinstance(precision, HighPrecision)
    rows = _ceil_div(s, t) if sequence_parallel else s
    up = _ceil_div(model.mlp_up_width, t)
    f = _ceil_div(model.ffn_hidden_size, t)
    # with the two dropout masks (none at hidden_dropout = 0)
    norm_inputs = rows * (2 * x * h + 2 * dropout_mask_bytes(model.has_hidden_dropout) * h)
    attention_input = kept(rows * h)
    attention_split = 0
    match model.self_attention:
        case StandardAttention():
            q = _ceil_div(model.query_projection_size, t)
            kv = kv_width_per_rank(model, t)
            attention_split = s * x * (q + 2 * kv) + _projection_input(
                s * q, x, precision, attention
            )
        case MultiLatentAttention() as mla:
            # Q, K (nope + rope), V and the core output per head, plus the latents: the
            # up projections' gathered input and the latent norms' input; mla_up_proj
            # discards the up projections' outputs Q, K, V (CheckpointWithoutOutput) and keeps
            # the core output
            heads = _ceil_div(model.num_attention_heads, t)
            latent = (mla.q_lora_rank or 0) + mla.kv_lora_rank
            qkv = (
                0 if RecomputeModule.MLA_UP_PROJ in recomputed else 2 * mla.qk_dim + mla.v_head_dim
            )
            attention_split = s * x * heads * qkv
            attention_split += _projection_input(
                s * heads * mla.v_head_dim, x, precision, attention
            )
            attention_split += kept(s * mla_gathered_width(model)) + rows * x * latent
            if low:
                # the query and the KV down projections each quantize the shared norm output
                attention_input *= 2
        case _ as unreachable:
            assert_never(unreachable)
    mlp_input = rows * x * h if moe else kept(rows * h)
    norm_outputs = 0 if RecomputeModule.LAYERNORM in recomputed else attention_input + mlp_input
    mlp_split = 0 if RecomputeModule.MLP in recomputed else s * x * up + kept(s * f)
    core = 0
    if RecomputeModule.CORE_ATTN not in recomputed:
        core = attention_core_bytes(model, tensor_degree=t, attention=attention, activation_bytes=x)
    return micro_batch * (norm_inputs + norm_outputs + attention_split + mlp_split + core)


#: Per (token, expert) bytes a MoE layer keeps from its router: the scores / probabilities
#: and the fused permutation's int64 row map (shared reference sections 2.8 and 7: ``T E 10``).
ROUTER_BYTES_PER_SCORE = 10


def _keeps_original_input(precision: TrainingPrecision) -> bool:
    """Whether the attention output projection and the shared experts' FC1 keep their
    high-precision input: no recipe, or one whose linears Megatron-Core has save it
    (:func:`~blueprinting.mapping.precision.projection_saves_original_input`)."""
    return isinstance(precision, HighPrecision) or projection_saves_original_input(precision)


def _projection_input(
    elements: int, x: int, precision: TrainingPrecision, attention: AttentionKernel
) -> int:
    """The attention output, the output projection's input, as stored (:func:
    `layer_activation_bytes`): ``x`` bytes an element in high precision, and under a recipe
    whose projection saves its original input (:func:`projection_saves_original_input`: every
    recipe but delayed scaling), where a fused kernel's own copy is the same tensor; under
    delayed scaling the projection's quantized copy, beside the fused kernel's ``x`` copy."""
    if _keeps_original_input(precision):
        return elements * x
    quantized = saved_input_bytes(precision, elements, x)
    match attention:
        case FusedAttention():
            return elements * x + quantized
        case UnfusedAttention():
            return quantized
        case _ as unreachable:
            assert_never(unreachable)


def moe_ffn_activation_bytes(
    model: TransformerModelSpec,
    *,
    micro_batch: int,
    tensor_degree: int,
    sequence_parallel: bool,
    experts: ExpertParallel,
    activation_bytes: int,
    recomputed: frozenset[RecomputeModule],
    eager: EagerPasses,
    precision: TrainingPrecision = _HIGH_PRECISION,
) -> int:
    """Bytes a MoE layer's feed-forward stores for its backward on one rank for one
    micro-batch (shared reference section 2.8, after Megatron-LM PR 6782's reasoning: EP does
    not divide activations, the rank keeps the rows its experts received): router ``T E 10``,
    the FC1 input ``R' h x``, the FC1 output ``R' up x`` and the activation output
    ``R' F' x`` with ``R'`` the received rows (``k T etp (1 + gamma)``) and ``F' = F/etp``; the
    shared experts' gathered input (t > 1), FC1 output and activation output. ``model`` is the
    cp rank's sequence (:func:`local_sequence_model`). The unpermute's input is not kept
    (Megatron-Core v0.13 moved the probability multiply into the activation).

    ``recomputed`` (the selective modules): ``moe_act`` drops the activation output
    ``R' F' x`` (FC2's input; ``moe/experts.py`` discards the checkpointed activation's output
    and keeps its input, the FC1 output; section 2.8's table says the FC1 output, the code
    says otherwise); ``shared_experts`` the shared experts' three terms; ``moe`` everything
    here (the layer's input, the pre-MLP norm's output, is the checkpoint, counted with the
    norms).

    ``eager`` (``training.eager_passes``): the eager clamp before the GLU stores a second
    ``R' up x`` without ``moe_act`` recompute (the clamps keep the FC1 output, the GLU saves
    the concatenated copy: ``training._clamp_op``); the other eager chains store nothing new.

    Under a low-precision ``precision`` the expert and shared-expert GEMMs' inputs are kept
    quantized (:func:`~blueprinting.analysis.precision_memory.saved_input_bytes`, as
    :func:`layer_activation_bytes`' linears): the FC1 input ``Q(R' h)`` and the activation
    output ``Q(R' F')``, and the shared experts' activation output. The FC1 outputs stay at
    ``x``.

    The shared experts' FC1 input: Transformer Engine's linear saves the tensor it was handed,
    before its own sequence-parallel all-gather (``pytorch/module/linear.py`` @d0067d0d
    ``saved_inputmat = inputmat``, the local rows; the Wgrad gathers them again). That is the
    pre-MLP norm's output the router keeps (counted with the norms), so it adds nothing in high
    precision, nor under a recipe whose FC1 saves its original input (Megatron-Core
    ``shared_experts.py`` l.147-161 @d98e8a64: FP8 but delayed scaling, and FP4, unless the
    shared experts are recomputed: :func:`~blueprinting.mapping.precision.
    projection_saves_original_input`'s rule); delayed scaling adds its quantized copy of the
    rank's rows, ``Q(T h)``. Under ``--moe-shared-expert-overlap`` Megatron gathers the input
    itself and hands TE the gathered ``m`` rows (``linear.parallel_mode = None``): at t > 1
    they are kept at ``x`` (``Q(m h)`` under delayed scaling)."""
    moe = model.moe
    assert moe is not None
    t, x = tensor_degree, activation_bytes

    def kept(elements: int) -> int:
        return saved_input_bytes(precision, elements, x)

    s, h = model.seq_length, model.hidden_size
    tokens = micro_batch * (_ceil_div(s, t) if sequence_parallel else s)
    u = experts.tensor_degree
    received = received_rows(moe, moe.top_k * tokens * u)
    f = moe.expert_ffn_hidden_size // u
    up = 2 * f if model.activation is MlpActivation.SWIGLU else f
    if RecomputeModule.MOE in recomputed:
        return 0
    act_recomputed = RecomputeModule.MOE_ACT in recomputed
    act_out = 0 if act_recomputed else f
    clamp_copy = up if eager.activation_clamp and not act_recomputed else 0
    routed = (
        tokens * moe.num_experts * ROUTER_BYTES_PER_SCORE
        + kept(received * h)
        + received * x * (up + clamp_copy)
        + kept(received * act_out)
    )
    shared = 0
    if moe.shared_expert_ffn_hidden_size and RecomputeModule.SHARED_EXPERTS not in recomputed:
        m = micro_batch * s
        fs = _ceil_div(moe.shared_expert_ffn_hidden_size, t)
        ups = 2 * fs if model.activation is MlpActivation.SWIGLU else fs
        shared = _shared_input_bytes(
            precision,
            gathered=t > 1 and shared_expert_overlaps(experts.dispatcher),
            local_rows=tokens,
            gathered_rows=m,
            hidden=h,
            activation_bytes=x,
        )
        shared += m * x * ups + kept(m * fs)
    return routed + shared


def _shared_input_bytes(
    precision: TrainingPrecision,
    *,
    gathered: bool,
    local_rows: int,
    gathered_rows: int,
    hidden: int,
    activation_bytes: int,
) -> int:
    """What the shared experts' FC1 keeps of its input beyond the router's copy of the pre-MLP
    norm's output (:func:`moe_ffn_activation_bytes`): ``gathered``, Megatron handed it the
    all-gathered rows (shared-expert overlap at t > 1)."""
    rows = gathered_rows if gathered else local_rows
    if _keeps_original_input(precision):
        return rows * hidden * activation_bytes if gathered else 0
    return saved_input_bytes(precision, rows * hidden, activation_bytes)


def attention_core_bytes(
    model: TransformerModelSpec,
    *,
    tensor_degree: int,
    attention: AttentionKernel,
    activation_bytes: int,
) -> int:
    """What the attention core alone saves for its backward, per sequence on one TP rank
    (:func:`layer_activation_bytes`): unfused, the softmax output, its dropout mask and the
    dropout output ``(2x + 1) (a/t) s^2``, or the softmax output alone ``x (a/t) s^2`` at
    ``attention_dropout = 0`` (it is also the input of ``A V``); fused, the softmax statistics
    ``4 (a/t) s``."""
    s = model.seq_length
    heads = _ceil_div(model.num_attention_heads, tensor_degree)
    match attention:
        case UnfusedAttention():
            if not model.has_attention_dropout:
                return s * s * heads * activation_bytes
            return s * s * heads * (2 * activation_bytes + DROPOUT_MASK_BYTES)
        case FusedAttention():
            return s * heads * SOFTMAX_STATISTIC_BYTES
        case _ as unreachable:
            assert_never(unreachable)


def backward_working_bytes(
    model: TransformerModelSpec,
    *,
    micro_batch: int,
    tensor_degree: int,
    sequence_parallel: bool,
    attention: AttentionKernel,
    activation_bytes: int,
) -> int:
    """The gradients one block's backward holds at once beyond what is stored, per TP rank:
    the MLP's two internal gradients (of the activation function's input and output,
    ``x s (u + f)``), the residual-stream gradient coming in and going out (``2 x rows h``),
    with sequence parallelism the re-gathered ``s x h`` input of a column-parallel GEMM for its
    weight gradient (Megatron-LM ``tensor_parallel/layers.py``), and with unfused attention the
    gradient of the ``s x s`` scores (``x (a/t) s^2``). The largest transient of the step on a
    stage with blocks; Korthikanti et al. 2022 count stored activations only."""
    t = tensor_degree
    s = model.seq_length
    h = model.hidden_size
    x = activation_bytes
    rows = _ceil_div(s, t) if sequence_parallel else s
    up = _ceil_div(model.mlp_up_width, t)
    f = _ceil_div(model.ffn_hidden_size, t)
    working = x * s * (up + f) + 2 * x * rows * h
    if sequence_parallel:
        working += x * s * h
    match attention:
        case UnfusedAttention():
            working += x * s * s * _ceil_div(model.num_attention_heads, t)
        case FusedAttention():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    return micro_batch * working


def local_sequence_model(model: TransformerModelSpec, cp: int) -> TransformerModelSpec:
    """``model`` as one cp rank's per-token stores see it: s/cp tokens (the activation
    functions here read ``seq_length`` only as a token count on the fused path)."""
    if cp == 1:
        return model
    return replace(model, seq_length=model.seq_length // cp)


def context_transient_bytes(
    model: TransformerModelSpec, *, micro_batch: int, tensor_degree: int, context: ContextParallel
) -> int:
    """What a cp rank's attention holds beyond its stored activations for one layer at a
    time (``model`` is :func:`local_sequence_model`'s, s/cp tokens): p2p keeps every K/V chunk
    it receives until the layer's forward ends (TE ``p2p_comm_buffers``, context_parallel.py
    l.1685-1720), all_gather the gathered full-sequence K/V, both ``cp M_kv``; a2a the
    re-laid-out Q, K, V and O (the same size as before it, ``M_q + M_kv + M_o``); a2a+p2p the
    ring level's ``p2p M_kv`` plus that. Read from code, not measured (section 1.5)."""
    cp = context.degree
    if cp == 1:
        return 0
    kv_heads = max(1, model.num_query_groups // tensor_degree)
    heads = _ceil_div(model.num_attention_heads, tensor_degree)
    e = model.datatype.bytes
    tokens = micro_batch * model.seq_length
    kv = tokens * kv_heads * 2 * model.kv_channels * e
    q_and_o = 2 * tokens * heads * model.kv_channels * e
    match context.communication:
        case RingExchange() | AllGatherKV():
            return cp * kv
        case HeadAllToAll():
            return q_and_o + kv
        case HierarchicalAllToAllRing(p2p_size=ring):
            return ring * kv + q_and_o + kv
        case _ as unreachable:
            assert_never(unreachable)


def logits_transient_bytes(
    model: TransformerModelSpec, *, micro_batch: int, tensor_degree: int, activation_bytes: int
) -> int:
    """The last stage's 16-bit logits ``[s b, V/t]``: the LM head's output before the
    vocab-parallel cross entropy casts it to fp32 in forward, and the logits' gradient cast
    back for the LM head's backward (the fp32 logits themselves are stored: ``other``)."""
    vocab = _ceil_div(model.padded_vocab_size, tensor_degree)
    return micro_batch * model.seq_length * vocab * activation_bytes


def checkpoint_bytes(
    model: TransformerModelSpec,
    *,
    micro_batch: int,
    tensor_degree: int,
    sequence_parallel: bool,
    activation_bytes: int,
) -> int:
    """A full-recompute checkpoint: the block input ``s b h`` elements (Korthikanti et al. 2022,
    Section 5: ``2 s b h`` bytes per layer), s/t rows with sequence parallelism."""
    s = model.seq_length
    rows = _ceil_div(s, tensor_degree) if sequence_parallel else s
    return micro_batch * rows * model.hidden_size * activation_bytes


def one_f_one_b_in_flight(*, pipeline: Count, stage: Count, microbatches: Count) -> Count:
    """Microbatches in flight at non-interleaved 1F1B's peak on rank ``stage``:
    ``min(p - r, m)`` (schedules.md section 5), on numbers or columns."""
    return minimum(pipeline - stage, microbatches)


def interleaved_peak(
    *,
    pipeline: Count,
    stage: Count,
    virtual: Count,
    group: Count,
    microbatches: Count,
) -> Count:
    """Chunk forwards in flight at interleaved 1F1B's peak on rank ``stage``:
    ``min(2 (p - r - 1) + (v - 1) N + 1, m v)`` (schedules.md section 5; combined 1F1B's too,
    :func:`in_flight_microbatches`)."""
    return minimum(2 * (pipeline - stage - 1) + (virtual - 1) * group + 1, microbatches * virtual)


def paired_forward_bytes(
    *,
    in_flight: Count,
    microbatches: Count,
    virtual: Count,
    moe_blocks: Count,
    layer: Count,
    moe_layer: Count,
) -> Count:
    """:attr:`StageActivations.paired_forward` of a combined 1F1B rank holding blocks: one
    layer's stores (``layer``, or ``moe_layer`` where the stage holds MoE blocks: what a layer
    keeps under the stage's recompute) when its warm-up, ``in_flight`` chunk forwards, leaves
    chunk forwards to pair with backwards; 0 otherwise (:func:`in_flight_microbatches`). On a
    plan's numbers or a search's columns."""
    runs = (in_flight < microbatches * virtual) * 1
    return cast(  # type: ignore[redundant-cast]
        "Count", runs * where(moe_blocks > 0, moe_layer, layer)
    )


def interleaved_group_reached(
    *, index: int, group: Count, microbatches: Count, virtual: Count, peak: Count
) -> bool | npt.NDArray[np.bool_]:
    """Whether group ``index`` of the interleaved schedule table still counts toward the
    in-flight peak: it holds microbatches and starts before the peak (later groups lie beyond
    it). On a plan's numbers or a search's columns (``&`` of two comparisons)."""
    return cast(
        "bool | npt.NDArray[np.bool_]",
        (index * group < microbatches) & (index * group * virtual < peak),
    )


def interleaved_slot(
    *,
    peak: Count,
    microbatches: Count,
    group: Count,
    virtual: Count,
    index: int,
    chunk: Count,
) -> Count:
    """Microbatches of group ``index`` (N at a time, the last the remainder) whose forward
    through ``chunk`` is in flight at ``peak``: Megatron-LM's schedule table fills (group 0,
    chunk 0), (group 0, chunk 1), ..., (group 1, chunk 0), ... in order, so a slot holds what
    the ``peak`` leaves after the slots before it, full: ``clip(peak - before, 0, members)``."""
    members = maximum(minimum(group, microbatches - group * index), group * 0)
    before = minimum(group * index, microbatches) * virtual + chunk * members
    return minimum(members, maximum(peak - before, peak * 0))


def in_flight_microbatches(
    schedule: PipelineSchedule, *, pipeline_degree: int, stage: int, microbatches: int
) -> tuple[int, ...]:
    """Forwards whose backward has not run yet, per model chunk, at rank ``stage``'s peak.

    schedules.md section 5: non-interleaved 1F1B rank r peaks at ``min(p - r, m)`` microbatches;
    interleaved rank r at ``min(2 (p - r - 1) + (v - 1) N + 1, m v)`` chunk forwards, which are the
    first entries of Megatron-LM's schedule table (groups of N microbatches, each group through
    chunk 0, then chunk 1, ...; the last group holds the remainder). Without pipelining one
    microbatch is in flight.
    """
    p = pipeline_degree
    m = microbatches
    match schedule:
        case SingleStage():
            return (1,)
        case OneForwardOneBackward():
            return (one_f_one_b_in_flight(pipeline=p, stage=stage, microbatches=m),)
        case (
            InterleavedOneForwardOneBackward(virtual_stages=v, microbatch_group_size=group)
            | CombinedOneForwardOneBackward(virtual_stages=v, microbatch_group_size=group)
        ):
            n = p if group is None else group
            # Combined 1F1B runs one more warm-up forward (Megatron ``schedules.py`` l.966-970)
            # where interleaving runs its first steady forward alone: the same chunks stored
            # when its first paired step begins. A paired step then runs the forward of layer i
            # with the backward of layer L - 1 - i (``model_chunk_schedule_plan.py`` l.518-562,
            # ``pop_layer``; ``combined_1f1b.py`` l.51-64 for p = 1: "1st microbatch backward +
            # 2nd microbatch forward"), freeing a layer as it stores one: one layer more at
            # most, counted apart (StageActivations.paired_forward).
            peak = interleaved_peak(pipeline=p, stage=stage, virtual=v, group=n, microbatches=m)
            counts = [0] * v
            index = 0
            while interleaved_group_reached(
                index=index, group=n, microbatches=m, virtual=v, peak=peak
            ):
                for chunk in range(v):
                    counts[chunk] += interleaved_slot(
                        peak=peak, microbatches=m, group=n, virtual=v, index=index, chunk=chunk
                    )
                index += 1
            return tuple(counts)
        case ZeroBubbleH1():
            # Deferring W passes keeps 1F1B's worst-case count on every rank (Qi et al. 2023,
            # Section 3.1; schedules.md section 6).
            return (min(p, m),)
        case DualPipe():
            # Both directions' chunks hold a whole stage's blocks: p + 1 stage-microbatches at
            # the peak on every rank (DualPipe README table; equal to the simulated peak, rank r
            # holding p - r forward-direction and r + 1 reverse-direction chunks).
            return (min(p + 1, m),)
        case DualPipeV():
            # 2p + 1 chunks of L / (2p) blocks on every rank: 2p - r of chunk 0, r + 1 of chunk 1
            # (the README's PP + 1 with PP = 2p stages; equal to the simulated peak).
            return (min(2 * p - stage, m), min(stage + 1, m))
        case ForwardOnly():
            raise UnsupportedError(
                "checking training memory: ForwardOnly is an inference schedule; "
                "use OneForwardOneBackward or InterleavedOneForwardOneBackward"
            )
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StageActivations:
    """Activation bytes on one TP rank of one stage at its peak.

    ``layers_stored``: what the in-flight blocks keep for backward (Korthikanti's figures);
    ``recompute_working``: what recomputation rebuilds for the block(s) in backward beyond what is
    stored (selective: one block's s x s tensors; full: the group's activations less its
    checkpoint), 0 without recomputation; ``embedding`` and
    ``logits``: first / last stage buffers (see the module docstring).
    """

    stage: int
    in_flight: tuple[int, ...]
    layers_stored: int
    recompute_working: int
    embedding: int
    logits: int
    #: the loss stage's multi-token-prediction depths (:func:`mtp_stored_bytes`; 0 elsewhere)
    mtp: int = 0
    #: what layer-wise CPU offloading keeps in pinned host memory per microbatch (the offloaded
    #: layers' stores; not part of the GPU's figures)
    host_offloaded: int = 0
    #: combined 1F1B: the layer a paired step's forward stores before its paired backward
    #: layer frees one (one layer of the stage's largest kind; 0 on other schedules and on a
    #: rank whose warm-up runs every chunk forward)
    paired_forward: int = 0

    @property
    def on_gpu(self) -> int:
        """The activation bytes the GPU holds at the peak (``MemoryBreakdown.activations``):
        the stored blocks, the recompute working set, the MTP depths and the paired forward;
        ``embedding`` and ``logits`` are the breakdown's ``other``."""
        return self.layers_stored + self.recompute_working + self.mtp + self.paired_forward


def stage_activations(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec, stage: int
) -> StageActivations:
    """Peak activation memory of one TP rank on pipeline stage ``stage``."""
    return _stage_activations(model, mapping, stage, _StageInvariants.of(model, mapping))


def _stage_activations(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    stage: int,
    inv: _StageInvariants,
) -> StageActivations:
    p = mapping.pipeline_degree
    t = mapping.tensor_degree
    _check_stage(stage, p)
    b = mapping.batch.micro_batch_size
    sp = mapping.sequence_parallel
    x = inv.recipe.activation
    in_flight = in_flight_microbatches(
        mapping.parallelism.pipeline.schedule,
        pipeline_degree=p,
        stage=stage,
        microbatches=mapping.microbatch_count,
    )
    chunks = inv.parameters.chunks[stage]
    moe_chunks = inv.parameters.moe_chunks[stage]
    checkpoint = inv.checkpoint
    pairs = tuple(zip(in_flight, chunks, strict=True))
    # a MoE layer stores more than a dense one: its excess over the dense layer, per chunk
    moe_pairs = tuple(zip(in_flight, moe_chunks, strict=True))
    stored: int
    working = 0
    recompute = mapping.parallelism.recompute
    # layer-wise CPU offloading (p = 1, no recompute: laws) keeps the first layers' stores on
    # the host; at most L - N layers' stores are on the GPU at once (TE cpu_offload.py: a
    # layer's copy is freed by the forward of layer L - N + i and reloaded from the backward of
    # layer L - 1 - N + i)
    offloaded = offloaded_layers(mapping.parallelism.offload)
    offloaded_moe = model.moe_layers_in(0, offloaded) if offloaded else 0
    host = 0
    base = inv.base_precision

    def base_excess(*, kept: bool, checkpointed: int = 0, skip: int = 0) -> int:
        if base is None:
            return 0
        return base.excess(
            model,
            inv,
            stage=stage,
            chunks=chunks,
            in_flight=in_flight,
            kept=kept,
            checkpointed=checkpointed,
            skip=skip,
        )

    match recompute:
        case NoRecompute():
            stored = plain_stored_bytes(
                sum(count * layers for count, layers in pairs) - offloaded,
                sum(c * n for c, n in moe_pairs) - offloaded_moe,
                inv.layer_full,
                inv.moe_layer_full,
            ) + base_excess(kept=False, skip=offloaded)
            host = plain_stored_bytes(offloaded, offloaded_moe, inv.layer_full, inv.moe_layer_full)
            if offloaded:
                host += base_excess(kept=False) - base_excess(kept=False, skip=offloaded)
        case SelectiveRecompute():
            stored = plain_stored_bytes(
                sum(count * layers for count, layers in pairs),
                sum(c * n for c, n in moe_pairs),
                inv.layer_kept,
                inv.moe_layer_kept,
            ) + base_excess(kept=True)
            full_layer, kept_layer = inv.layer_full, inv.layer_kept
            if base is not None and base.holds(model, stage=stage, chunks=chunks):
                full_layer, kept_layer = base.layer_full, base.layer_kept
            working = selective_working_bytes(max(chunks) > 0, full_layer, kept_layer)
        case FullRecompute(method=method, num_layers=n):
            # a recomputed group's working set: MoE layers' when the stage has any, the
            # base-precision ones' when it holds one
            full = inv.moe_layer_full if any(moe_chunks) else inv.layer_full
            if base is not None and base.holds(model, stage=stage, chunks=chunks):
                full = base.moe_layer_full if any(moe_chunks) else base.layer_full
            match method:
                case RecomputeMethod.UNIFORM:
                    stored = sum(
                        uniform_stored_bytes(count, layers, n, checkpoint)
                        for count, layers in pairs
                    )
                    working = uniform_working_bytes(min(n, max(chunks)), full, checkpoint)
                case RecomputeMethod.BLOCK:
                    # beyond the first n layers of each chunk (checkpoints only) every layer
                    # stores everything: the recipe's stores, the base-precision ones their own
                    plain = inv.moe_layer_full if any(moe_chunks) else inv.layer_full
                    stored = sum(
                        block_stored_bytes(count, layers, n, checkpoint, plain)
                        for count, layers in pairs
                    ) + base_excess(kept=False, checkpointed=n)
                    working = block_working_bytes(max(chunks) > 0, full, checkpoint)
                case _ as unreachable:
                    assert_never(unreachable)
        case _ as unreachable:
            assert_never(unreachable)

    s = model.seq_length // mapping.context_degree  # a cp rank's tokens
    h = model.hidden_size
    rows = sequence_rows(s, t, sp)
    embedding = 0
    if stage == 0:
        embedding = embedding_buffer_bytes(
            in_flight[0],
            micro_batch=b,
            tokens=s,
            rows=rows,
            hidden=h,
            dropout=model.has_hidden_dropout,
        )
    logits = mtp = 0
    if stage == loss_stage(mapping.parallelism.pipeline.schedule, p):
        vocab = ceil_div(model.padded_vocab_size, t)
        logits = logits_buffer_bytes(
            in_flight[-1],
            micro_batch=b,
            tokens=s,
            vocab_shard=vocab,
            rows=rows,
            hidden=h,
            activation=x,
        )
        if model.mtp_num_layers:
            head = logits_buffer_bytes(
                1, micro_batch=b, tokens=s, vocab_shard=vocab, rows=rows, hidden=h, activation=x
            )
            mtp = mtp_stored_bytes(
                in_flight[-1],
                depths=model.mtp_num_layers,
                depth=_mtp_depth(model, recompute, inv, micro_batch=b, rows=rows),
                head=head,
            )
    paired = 0
    schedule = mapping.parallelism.pipeline.schedule
    if isinstance(schedule, CombinedOneForwardOneBackward) and max(chunks) > 0:
        layer, moe_layer = _forward_layer_stores(recompute, inv)
        paired = paired_forward_bytes(
            in_flight=sum(in_flight),
            microbatches=mapping.microbatch_count,
            virtual=len(in_flight),
            moe_blocks=sum(moe_chunks),
            layer=layer,
            moe_layer=moe_layer,
        )
    return StageActivations(
        stage=stage,
        in_flight=in_flight,
        layers_stored=stored,
        recompute_working=working,
        embedding=embedding,
        logits=logits,
        mtp=mtp,
        host_offloaded=host,
        paired_forward=paired,
    )


def _forward_layer_stores(recompute: RecomputePolicy, inv: _StageInvariants) -> tuple[int, int]:
    """(dense, MoE) bytes one layer's forward stores under ``recompute``: all of it, the kept
    tensors under selective recompute, the checkpoint under full recompute."""
    match recompute:
        case NoRecompute():
            return inv.layer_full, inv.moe_layer_full
        case SelectiveRecompute():
            return inv.layer_kept, inv.moe_layer_kept
        case FullRecompute():
            return inv.checkpoint, inv.checkpoint
        case _ as unreachable:
            assert_never(unreachable)


def offloaded_layers(offload: ActivationOffload) -> int:
    """The layers whose stored activations an offloading policy moves to host memory."""
    match offload:
        case NoActivationOffload():
            return 0
        case LayerCpuOffload(num_layers=layers):
            return layers
        case _ as unreachable:
            assert_never(unreachable)


def _mtp_depth(
    model: TransformerModelSpec,
    recompute: RecomputePolicy,
    inv: _StageInvariants,
    *,
    micro_batch: int,
    rows: int,
) -> int:
    """One MTP depth's stored bytes per microbatch under the stage's recompute: its decoder
    layer has the last decoder layer's kind (Megatron-LM builds it from the last layer's spec)."""
    moe = model.mtp_layer_is_moe
    selective = uniform = False
    match recompute:
        case NoRecompute():
            pass
        case SelectiveRecompute():
            selective = True
        case FullRecompute(method=method):
            match method:
                case RecomputeMethod.UNIFORM:
                    uniform = True
                case RecomputeMethod.BLOCK:
                    pass
                case _ as unreachable:
                    assert_never(unreachable)
        case _ as unreachable:
            assert_never(unreachable)
    return mtp_depth_stored_bytes(
        selective=selective,
        uniform=uniform,
        full_layer=inv.moe_layer_full if moe else inv.layer_full,
        kept_layer=inv.moe_layer_kept if moe else inv.layer_kept,
        micro_batch=micro_batch,
        rows=rows,
        hidden=model.hidden_size,
        activation=inv.recipe.activation,
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _BasePrecisionLayers:
    """What the layers ``--first-last-layers-bf16`` keeps in the base precision store (the
    recipe's quantized linear inputs do not apply to them), and where they sit: the first and
    last ``first_last`` decoder layers, in the chunks starting at ``chunk_starts[stage][chunk]``."""

    first_last: tuple[int, int]
    chunk_starts: tuple[tuple[int, ...], ...]
    layer_full: int
    layer_kept: int
    moe_layer_full: int
    moe_layer_kept: int

    def in_span(self, model: TransformerModelSpec, start: int, count: int) -> tuple[int, int]:
        """(dense, MoE) base-precision layers among layers ``start .. start + count - 1``."""
        first, last = self.first_last
        end = start + count
        dense = moe = 0
        for lo, hi in ((0, first), (model.num_layers - last, model.num_layers)):
            a, b = max(lo, start), min(hi, end)
            if a < b:
                n_moe = model.moe_layers_in(a, b - a)
                dense += b - a - n_moe
                moe += n_moe
        return dense, moe

    def holds(self, model: TransformerModelSpec, *, stage: int, chunks: tuple[int, ...]) -> bool:
        """Whether the stage's chunks hold a base-precision layer."""
        return any(
            self.in_span(model, start, count) != (0, 0)
            for start, count in zip(self.chunk_starts[stage], chunks, strict=True)
        )

    def excess(
        self,
        model: TransformerModelSpec,
        inv: _StageInvariants,
        *,
        stage: int,
        chunks: tuple[int, ...],
        in_flight: tuple[int, ...],
        kept: bool,
        checkpointed: int = 0,
        skip: int = 0,
    ) -> int:
        """What the stage's base-precision layers store beyond the recipe's stores, over their
        chunks' in-flight microbatches (``kept``: the selective modules recomputed;
        ``checkpointed``: the first ``checkpointed`` layers of each chunk keep only their
        checkpoint, the rest store everything, a full recompute's block method;
        ``skip``: the first ``skip`` decoder layers store on the host, CPU offloading)."""
        if kept:
            dense_excess = self.layer_kept - inv.layer_kept
            moe_excess = self.moe_layer_kept - inv.moe_layer_kept
        else:
            dense_excess = self.layer_full - inv.layer_full
            moe_excess = self.moe_layer_full - inv.moe_layer_full
        total = 0
        for start, count, flight in zip(self.chunk_starts[stage], chunks, in_flight, strict=True):
            lo = max(start + min(count, checkpointed), skip)
            dense, moe = self.in_span(model, lo, max(0, start + count - lo))
            total += flight * (dense * dense_excess + moe * moe_excess)
        return total


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _StageInvariants:
    """What every stage of one strategy shares: computed once per plan, not once per stage
    (a plan evaluates every stage; a sweep evaluates many plans)."""

    recipe: PrecisionRecipe
    parameters: _ParameterLayout
    layer_full: int
    layer_kept: int
    #: what a MoE layer stores (all / with the selective modules)
    moe_layer_full: int
    moe_layer_kept: int
    checkpoint: int
    backward_working: int
    logits_transient: int
    #: the base-precision first and last layers' stores (None without such layers)
    base_precision: _BasePrecisionLayers | None = None

    @classmethod
    def of(
        cls, model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
    ) -> _StageInvariants:
        t = mapping.tensor_degree
        b = mapping.batch.micro_batch_size
        sp = mapping.sequence_parallel
        recipe = training_recipe(model, mapping)
        x = recipe.activation
        context = mapping.parallelism.context
        # Every store per token scales with the cp rank's s/cp tokens (modern_parallelism.md
        # section 1.5; the s x s unfused core never meets cp: cp_needs_fused_attention).
        full_model = model
        model = local_sequence_model(model, context.degree)

        attention = mapping.attention
        eager = eager_passes(model, mapping.fusions)

        recompute = mapping.parallelism.recompute
        modules = recompute.modules if isinstance(recompute, SelectiveRecompute) else frozenset()

        def layer(
            *,
            recomputed: frozenset[RecomputeModule],
            precision: TrainingPrecision = mapping.precision,
            moe: bool = False,
        ) -> int:
            return layer_activation_bytes(
                model,
                micro_batch=b,
                tensor_degree=t,
                sequence_parallel=sp,
                attention=attention,
                recomputed=recomputed,
                activation_bytes=x,
                precision=precision,
                moe=moe,
            )

        experts = mapping.parallelism.experts
        # the layout of the full-length model: parameters do not read the sequence
        parameters = _parameter_layout_of(full_model, mapping)
        moe_full = moe_kept = 0
        moe_base = (0, 0)
        if model.moe is not None:

            def ffn(
                recomputed: frozenset[RecomputeModule],
                precision: TrainingPrecision = mapping.precision,
            ) -> int:
                return moe_ffn_activation_bytes(
                    model,
                    micro_batch=b,
                    tensor_degree=t,
                    sequence_parallel=sp,
                    experts=experts,
                    activation_bytes=x,
                    recomputed=recomputed,
                    eager=eager,
                    precision=precision,
                )

            def moe_layer(
                recomputed: frozenset[RecomputeModule],
                precision: TrainingPrecision = mapping.precision,
            ) -> int:
                # the MoE layer's attention and norms as a dense layer's, its MLP replaced
                attention_part = layer(
                    recomputed=recomputed | {RecomputeModule.MLP}, precision=precision, moe=True
                )
                return attention_part + ffn(recomputed, precision)

            moe_full = moe_layer(frozenset())
            moe_kept = moe_layer(modules)
            moe_base = (
                moe_layer(frozenset(), _HIGH_PRECISION),
                moe_layer(modules, _HIGH_PRECISION),
            )
        base = None
        if high_precision_layers(mapping.precision) != (0, 0):
            # --first-last-layers-bf16: those layers store as without a recipe
            base = _BasePrecisionLayers(
                first_last=high_precision_layers(mapping.precision),
                chunk_starts=chunk_layer_starts(full_model, mapping.parallelism.pipeline),
                layer_full=layer(recomputed=frozenset(), precision=_HIGH_PRECISION),
                layer_kept=layer(recomputed=modules, precision=_HIGH_PRECISION),
                moe_layer_full=moe_base[0],
                moe_layer_kept=moe_base[1],
            )
        return cls(
            recipe=recipe,
            parameters=parameters,
            layer_full=layer(recomputed=frozenset()),
            layer_kept=layer(recomputed=modules),
            moe_layer_full=moe_full,
            moe_layer_kept=moe_kept,
            base_precision=base,
            checkpoint=checkpoint_bytes(
                model, micro_batch=b, tensor_degree=t, sequence_parallel=sp, activation_bytes=x
            ),
            backward_working=backward_working_bytes(
                model,
                micro_batch=b,
                tensor_degree=t,
                sequence_parallel=sp,
                attention=attention,
                activation_bytes=x,
            )
            + context_transient_bytes(model, micro_batch=b, tensor_degree=t, context=context),
            logits_transient=logits_transient_bytes(
                model, micro_batch=b, tensor_degree=t, activation_bytes=x
            ),
        )


def moe_layer_bytes(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> tuple[int, int]:
    """(all, with the selective modules recomputed) bytes a MoE layer stores on one rank for
    one micro-batch (0, 0 for a dense model): what :func:`stage_activations` counts per MoE
    layer, for the vectorized search."""
    inv = _StageInvariants.of(model, mapping)
    return inv.moe_layer_full, inv.moe_layer_kept


# --------------------------------------------------------------------------------------------
# The breakdown
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StageOverheads:
    """What one GPU of a stage holds beyond its parameters, optimizer and stored activations.

    Inside the caching allocator: ``transient``, the largest working set of the step on top of
    the stored activations (:func:`backward_working_bytes` on a stage with blocks, the last
    stage's 16-bit logits :func:`logits_transient_bytes`, whichever is larger: the LM head's
    backward finishes before the last block's begins); ``workspace``, cuBLAS / cuBLASLt
    workspaces; ``allocator_reserve``, what the caching allocator holds cached and free at the
    peak. Outside it: ``cuda_context`` and ``nccl_buffers`` (one set per communicator the rank
    runs collectives on, :func:`communicators`).

    The reserve is a model with this basis: PyTorch's ``CUDACachingAllocator`` never returns a
    segment to the driver during training (only ``empty_cache`` does) and serves a request from
    a cached block only if one is large enough, splitting it; the transient working set is
    requested in other sizes (gradients of ``u``- and ``h``-wide tensors) than the stored
    activations freed around it, layer after layer, so its blocks stay cached beside the live
    ones: the reserve at the peak is taken as one transient working set.
    """

    transient: int
    workspace: int
    allocator_reserve: int
    cuda_context: int
    nccl_buffers: int
    peak: MemoryPeak


_RING_EXCHANGE = RingExchange()


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertGrid:
    """A MoE model's expert grid as its communicators see it: ETP x EP x expert-dp within each
    pipeline stage, ranks ordered etp, ep, edp, pp (Megatron-Core ``parallel_state.py``
    l.858-906 @d98e8a64), and the token dispatcher."""

    tensor: int
    expert: int
    dispatcher: DispatcherType


def communicators(
    *,
    tensor: int,
    pipeline: int,
    data: int,
    stage: int,
    tied: bool,
    context: int = 1,
    nvlink_domain: int | None = None,
    experts: ExpertGrid | None = None,
    virtual_stages: int = 1,
    cp_communication: CpCommunication = _RING_EXCHANGE,
) -> tuple[Communicator, ...]:
    """The NCCL communicators a rank of ``stage`` runs collectives on (PyTorch creates a
    communicator lazily, at a group's first collective), each with its members in the rank's
    NVLink domain of ``nvlink_domain`` consecutive ranks (None: the whole job in one domain)
    and its use: the world (start-up barriers, loss and timer reductions), TP, DP (gradient
    reduction, the distributed optimizer's gathers), PP (send / receive with the stage's one or
    two neighbours: Megatron-Core's batched P2P on the pipeline group; with ``virtual_stages``
    > 1 the first and last stages pass chunks to each other as well, ``p2p_communication.py``'s
    ring of ``(rank +- 1) % p``), the model-parallel
    group (the gradient-norm all-reduce across t x p) when both t and p exceed 1, and, with tied
    embeddings and p > 1, the two-rank embedding group of the first and last stage
    (Megatron-Core ``parallel_state.py``). Under context parallelism the gradients reduce over
    the d x cp group instead of the dp one, and the K/V exchanges run on the cp group as
    ``cp_communication`` says (TE's context-parallel attention): p2p sends to the next and
    receives from the previous cp rank, all_gather gathers over the group, a2a is an all-to-all
    over it, a2a+p2p an all-to-all inside groups of ``a2a_size`` and the ring over ``p2p_size``
    of them (Megatron-Core's hierarchical cp groups; the full cp group is not counted there). Ranks
    are numbered tp, cp, dp, pp from fastest to slowest (Megatron-Core's default order). A
    system's ``rank_layout`` other than that default moves the time model's links
    (:func:`~blueprinting.hardware.system.place_group`) but not this split of NVLink and network
    buffers: a known limit of the memory model.

    A MoE model (``experts``) adds its expert grid's communicators: the ETP group (bulk) when
    etp > 1, the expert-dp group (the routed experts' gradients, bulk) when it has more than one
    rank, and the dispatch: the alltoall dispatcher's all-to-all over EP (every other member a
    send / receive peer, NVIDIA/nccl #1685's case), the allgather dispatcher's gathers over
    ETP x EP (bulk); the flex dispatchers' DeepEP / HybridEP buffers are not NCCL's and are not
    counted."""
    t, p, d, c = tensor, pipeline, data, context
    world = t * c * p * d
    domain = world if nvlink_domain is None else nvlink_domain

    def placed(size: int, stride: int, use: CommunicatorUse) -> Communicator:
        inside = members_in_domain(size=size, stride=stride, world=world, domain=domain)
        return Communicator(size=size, in_domain=inside, use=use)

    bulk, scalar = BulkCollectives(), ScalarCollectives()
    found = [placed(world, 1, scalar), placed(t, 1, bulk), placed(d * c, t, bulk)]
    if p > 1:
        ends = stage in (0, p - 1) and virtual_stages == 1
        neighbours = 1 if p == 2 or ends else 2
        found.append(placed(p, t * c * d, PeerSends(peers=neighbours)))
    if c > 1:
        found.extend(_context_communicators(cp_communication, c, t, placed))
    if t > 1 and p > 1:
        # t adjacent ranks of each of p stages t x c x d apart
        stages_inside = members_in_domain(size=p, stride=t * c * d, world=world, domain=domain)
        tp_inside = members_in_domain(size=t, stride=1, world=world, domain=domain)
        found.append(Communicator(size=t * p, in_domain=tp_inside * stages_inside, use=scalar))
    if tied and p > 1 and stage in (0, p - 1):
        found.append(placed(2, (p - 1) * t * c * d, bulk))
    if experts is not None:
        found.extend(_expert_communicators(experts, world=world, pipeline=p, placed=placed))
    return tuple(comm for comm in found if comm.size > 1)


def _context_communicators(
    communication: CpCommunication,
    c: int,
    t: int,
    placed: Callable[[int, int, CommunicatorUse], Communicator],
) -> list[Communicator]:
    match communication:
        case RingExchange():
            return [placed(c, t, PeerSends(peers=min(2, c - 1)))]
        case AllGatherKV():
            return [placed(c, t, BulkCollectives())]
        case HeadAllToAll():
            return [placed(c, t, PeerSends(peers=c - 1))]
        case HierarchicalAllToAllRing(a2a_size=a2a, p2p_size=ring):
            found = []
            if a2a > 1:
                found.append(placed(a2a, t, PeerSends(peers=a2a - 1)))
            if ring > 1:
                found.append(placed(ring, t * a2a, PeerSends(peers=min(2, ring - 1))))
            return found
        case _ as unreachable:
            assert_never(unreachable)


def _expert_communicators(
    experts: ExpertGrid,
    *,
    world: int,
    pipeline: int,
    placed: Callable[[int, int, CommunicatorUse], Communicator],
) -> list[Communicator]:
    etp, ep = experts.tensor, experts.expert
    edp = world // (etp * ep * pipeline)
    bulk = BulkCollectives()
    found = [placed(etp, 1, bulk), placed(edp, etp * ep, bulk)]
    match experts.dispatcher:
        case DispatcherType.ALLTOALL:
            if ep > 1:
                found.append(placed(ep, etp, PeerSends(peers=ep - 1)))
        case DispatcherType.ALLGATHER:
            found.append(placed(etp * ep, 1, bulk))
        case DispatcherType.FLEX:
            pass
        case _ as unreachable:
            assert_never(unreachable)
    return found


def nccl_buffer_bytes(
    runtime: RuntimeMemory,
    *,
    tensor: int,
    pipeline: int,
    data: int,
    stage: int,
    tied: bool,
    context: int = 1,
    nvlink_domain: int | None = None,
    experts: ExpertGrid | None = None,
    virtual_stages: int = 1,
    cp_communication: CpCommunication = _RING_EXCHANGE,
) -> int:
    """NCCL's device buffers on one rank: one set per communicator of :func:`communicators`
    (:meth:`RuntimeMemory.nccl_bytes`)."""
    found = communicators(
        tensor=tensor,
        pipeline=pipeline,
        data=data,
        stage=stage,
        tied=tied,
        context=context,
        nvlink_domain=nvlink_domain,
        experts=experts,
        virtual_stages=virtual_stages,
        cp_communication=cp_communication,
    )
    return sum(runtime.nccl_bytes(comm) for comm in found)


def pipeline_chunks(schedule: PipelineSchedule) -> int:
    """Model chunks per pipeline rank that pass activations round the ``(rank +- 1) % p``
    ring (Megatron-Core's interleaved and combined 1F1B); 1 for every other schedule (DualPipe
    and DualPipeV hold two chunks, but an end rank's chunks both talk to its one neighbour)."""
    match schedule:
        case (
            InterleavedOneForwardOneBackward(virtual_stages=v)
            | CombinedOneForwardOneBackward(virtual_stages=v)
        ):
            return v
        case (
            SingleStage()
            | OneForwardOneBackward()
            | ForwardOnly()
            | ZeroBubbleH1()
            | DualPipe()
            | DualPipeV()
        ):
            return 1
        case _ as unreachable:
            assert_never(unreachable)


def expert_grid(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> ExpertGrid | None:
    """The :class:`ExpertGrid` of a MoE model's strategy; None for a dense model."""
    if model.moe is None:
        return None
    return ExpertGrid(
        tensor=mapping.expert_tensor_degree,
        expert=mapping.expert_degree,
        dispatcher=dispatcher_type(mapping.parallelism.experts.dispatcher),
    )


class MemoryPeak(StrEnum):
    """Where in the iteration a stage's peak falls (:class:`StageOverheads`): at the first
    backward after the schedule's warm-up, when every in-flight microbatch is stored, with one
    block's backward gradients live (``block_backward``) or, on the last stage when larger, the
    16-bit logits and their gradient of the loss's backward (``loss_backward``); ``stored``: no
    transient on top of the stored state (a stage without blocks or logits)."""

    STORED = "stored"
    BLOCK_BACKWARD = "block_backward"
    LOSS_BACKWARD = "loss_backward"
    #: the optimizer step, when its fp32 copy of 16-bit gradients outweighs the stored
    #: activations and buffers freed before it (:func:`step_copy_excess`)
    OPTIMIZER_STEP = "optimizer_step"


#: :class:`MemoryPeak` by the index :func:`peak_phase_index` returns.
PEAK_PHASES: tuple[MemoryPeak, ...] = (
    MemoryPeak.STORED,
    MemoryPeak.BLOCK_BACKWARD,
    MemoryPeak.LOSS_BACKWARD,
    MemoryPeak.OPTIMIZER_STEP,
)


def peak_phase_index(*, working: Count, logits: Count, step: Count) -> Count:
    """The index into :data:`PEAK_PHASES` of the transient that sets the peak (the one
    comparison, on integers or arrays of them); ``step``: :func:`step_copy_excess`."""
    if _plain_ints(working, logits, step):
        # plain integers stay Python's: a plan's byte counts may pass int64 (numpy would not)
        if step > working and step > logits:
            return cast("Count", 3)  # type: ignore[redundant-cast]
        return cast("Count", 2 if logits > working else (1 if working > 0 else 0))  # type: ignore[redundant-cast]
    import numpy as np

    backward = np.where(logits > working, 2, np.where(working > 0, 1, 0))
    return cast("Count", np.where((step > working) & (step > logits), 3, backward))


def step_copy_excess(*, copy: Count, activations: Count, other: Count) -> Count:
    """What the optimizer step holds beyond the backward's state, as a transient on top of
    ``total``: its fp32 copy of 16-bit gradients (``copy``, :func:`step_copy_bytes`) less the
    stored activations and buffers freed before it (negative when the backward's peak is the
    larger: the copy is then never live at the peak)."""
    return copy - activations - other


def persistent_recipe(recipe: PrecisionRecipe) -> PrecisionRecipe:
    """``recipe`` without the step's fp32 gradient copy (:func:`step_copy_bytes`): the bytes a
    parameter holds from one iteration to the next."""
    return recipe if recipe.main_grad == 0 else replace(recipe, main_grad=0)


def step_copy_bytes(
    count: Count, *, recipe: PrecisionRecipe, level: Count, degree: Count, gathered: Count
) -> Count:
    """The optimizer's fp32 copy of ``count`` parameters' 16-bit gradients (``recipe.main_grad``
    bytes each, sharded as the optimizer states): Megatron-Core makes it at the step
    (``main_param.grad = main_grad.float()``, ``optimizer.py`` l.1092-1100, the distributed
    optimizer on its shard, ``distrib_optimizer.py`` l.2756-2792 @d98e8a64) and
    ``zero_grad(set_to_none=True)`` frees it at the start of the next ``train_step``
    (``training.py`` l.3039-3044), before the forward: live at the step only, not during the
    backward. Megatron's table (dist_optimizer.md, fp16's 20 B = 4 + 16/d) counts it among the
    optimizer states; :class:`MemoryBreakdown` counts it at the step (``optimizer_step_copy``)."""
    copy_only = replace(recipe, param=0, grad=0, main_param=0, moments=0)
    return state_bytes(count, recipe=copy_only, level=level, degree=degree, gathered=gathered)[2]


def overhead_parts(
    *,
    working: Count,
    logits: Count,
    nccl_buffers: Count,
    runtime: RuntimeMemory,
    step: Count,
) -> tuple[Count, Count, Count, Count, Count]:
    """(transient, workspace, allocator_reserve, cuda_context, nccl_buffers) of
    :class:`StageOverheads` from a stage's backward working set (0 without blocks), its logits
    transient (0 off the last stage), the optimizer step's excess (:func:`step_copy_excess`)
    and its NCCL buffers: the one composition, on integers (the plan) or arrays of them (the
    search)."""
    if _plain_ints(working, logits, step):
        # plain integers stay Python's: a plan's byte counts may pass int64 (numpy would not)
        biggest = max(cast(int, working), cast(int, logits), cast(int, step))  # type: ignore[redundant-cast]
        transient = cast("Count", biggest)  # type: ignore[redundant-cast]
    else:
        import numpy as np

        transient = cast("Count", np.maximum(np.maximum(working, logits), step))
    zero = working * 0
    return (
        transient,
        zero + runtime.workspace_bytes,
        working,
        zero + runtime.cuda_context_bytes,
        nccl_buffers,
    )


def stage_overheads(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    *,
    stage: int,
    runtime: RuntimeMemory,
    nvlink_domain: int | None = None,
) -> StageOverheads:
    """:class:`StageOverheads` of one GPU on ``stage`` (``nvlink_domain``: the GPUs of one
    NVLink domain as the job is placed, None for one domain holding the job)."""
    return _stage_overheads(
        model,
        mapping,
        stage,
        runtime,
        _StageInvariants.of(model, mapping),
        nvlink_domain=nvlink_domain,
    )


def _stage_overheads(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    stage: int,
    runtime: RuntimeMemory,
    inv: _StageInvariants,
    *,
    nvlink_domain: int | None,
    step: int = 0,
) -> StageOverheads:
    _check_stage(stage, mapping.pipeline_degree)
    has_blocks = sum(inv.parameters.chunks[stage]) > 0
    working = inv.backward_working if has_blocks else 0
    schedule = mapping.parallelism.pipeline.schedule
    logits = inv.logits_transient if stage == loss_stage(schedule, mapping.pipeline_degree) else 0
    parts = overhead_parts(
        working=working,
        logits=logits,
        nccl_buffers=nccl_buffer_bytes(
            runtime,
            tensor=mapping.tensor_degree,
            pipeline=mapping.pipeline_degree,
            data=mapping.data_degree,
            stage=stage,
            tied=model.embeddings is EmbeddingTying.TIED,
            context=mapping.context_degree,
            nvlink_domain=nvlink_domain,
            experts=expert_grid(model, mapping),
            virtual_stages=pipeline_chunks(mapping.parallelism.pipeline.schedule),
            cp_communication=mapping.parallelism.context.communication,
        ),
        runtime=runtime,
        step=step,
    )
    transient, workspace, reserve, context, nccl = (int(part) for part in parts)
    return StageOverheads(
        transient=transient,
        workspace=workspace,
        allocator_reserve=reserve,
        cuda_context=context,
        nccl_buffers=nccl,
        peak=PEAK_PHASES[int(peak_phase_index(working=working, logits=logits, step=step))],
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Bytes per GPU (one TP rank of pipeline stage ``stage``) by category, and its two peaks.

    ``total`` is the exact sum of the five categories Korthikanti et al. 2022 count (weights,
    gradients, optimizer states, stored activations, other buffers). The peaks add the memory
    that accounting leaves out (:class:`StageOverheads`):

    - ``allocated_peak = total + transient + workspace``: what ``torch.cuda.max_memory_allocated``
      would report;
    - ``allocator_reserved_peak = allocated_peak + allocator_reserve``: what
      ``torch.cuda.max_memory_reserved`` would report;
    - ``reserved_peak = allocator_reserved_peak + cuda_context + nccl_buffers``: the device
      memory nvidia-smi would show at the peak, what decides an out-of-memory failure.

    ``fits`` is ``reserved_peak <= capacity``; ``headroom = capacity - reserved_peak`` (negative
    when it does not fit).
    """

    weights: int
    gradients: int
    optimizer_states: int
    activations: int
    other: int
    total: int
    transient: int
    workspace: int
    allocator_reserve: int
    cuda_context: int
    nccl_buffers: int
    allocated_peak: int
    allocator_reserved_peak: int
    reserved_peak: int
    capacity: int
    fits: bool
    headroom: int
    stage: int = 0
    peak: MemoryPeak = MemoryPeak.STORED
    #: the routed experts' share of weights, gradients and optimizer states (0: dense model);
    #: the rest is the dense part (attention, dense MLPs, shared experts, router, embeddings)
    expert_weights: int = 0
    expert_gradients: int = 0
    expert_optimizer_states: int = 0
    #: the optimizer's fp32 copy of 16-bit gradients (:func:`step_copy_bytes`): not in
    #: ``optimizer_states`` (it is made at the step and freed before the next forward); the
    #: step's peak holds it in place of the activations and buffers (``peak`` optimizer_step)
    optimizer_step_copy: int = 0

    def __post_init__(self) -> None:
        parts = (self.weights, self.gradients, self.optimizer_states, self.activations, self.other)
        problems = []
        if not (
            0 <= self.expert_weights <= self.weights
            and 0 <= self.expert_gradients <= self.gradients
            and 0 <= self.expert_optimizer_states <= self.optimizer_states
        ):
            problems.append("the expert parts exceed their categories")
        if self.total != sum(parts):
            problems.append(f"total {self.total} is not the sum of its categories {sum(parts)}")
        if self.allocated_peak != self.total + self.transient + self.workspace:
            problems.append("allocated_peak != total + transient + workspace")
        if self.allocator_reserved_peak != self.allocated_peak + self.allocator_reserve:
            problems.append("allocator_reserved_peak != allocated_peak + allocator_reserve")
        if self.reserved_peak != (
            self.allocator_reserved_peak + self.cuda_context + self.nccl_buffers
        ):
            problems.append(
                "reserved_peak != allocator_reserved_peak + cuda_context + nccl_buffers"
            )
        if self.headroom != self.capacity - self.reserved_peak:
            problems.append(f"headroom {self.headroom} != capacity - reserved_peak")
        if self.fits != (self.reserved_peak <= self.capacity):
            problems.append(f"fits={self.fits} contradicts reserved_peak <= capacity")
        if problems:
            raise ConfigError(problems, source="MemoryBreakdown")

    def fits_with(self, headroom_bytes: int) -> bool:
        """Whether the device peak leaves at least ``headroom_bytes`` free."""
        return self.reserved_peak + headroom_bytes <= self.capacity


def peak_bytes(
    *,
    total: Count,
    transient: Count,
    workspace: Count,
    allocator_reserve: Count,
    cuda_context: Count,
    nccl_buffers: Count,
) -> tuple[Count, Count, Count]:
    """(``allocated_peak``, ``allocator_reserved_peak``, ``reserved_peak``) from the parts
    (:class:`MemoryBreakdown`): the one composition, on integers (the plan) or on arrays of
    them (the search)."""
    allocated = total + transient + workspace
    allocator_reserved = allocated + allocator_reserve
    return allocated, allocator_reserved, allocator_reserved + cuda_context + nccl_buffers


def assemble_breakdown(
    *,
    weights: int,
    gradients: int,
    optimizer_states: int,
    activations: int,
    other: int,
    overheads: StageOverheads,
    capacity: int,
    stage: int,
    expert: tuple[int, int, int] = (0, 0, 0),
    optimizer_step_copy: int = 0,
) -> MemoryBreakdown:
    """The one composition of the parts into the peaks (the plan and the search both use it);
    ``expert``: the routed experts' (weights, gradients, optimizer states) within the first
    three; ``optimizer_step_copy``: :func:`step_copy_bytes`, outside the optimizer states."""
    total = weights + gradients + optimizer_states + activations + other
    allocated, allocator_reserved, reserved = peak_bytes(
        total=total,
        transient=overheads.transient,
        workspace=overheads.workspace,
        allocator_reserve=overheads.allocator_reserve,
        cuda_context=overheads.cuda_context,
        nccl_buffers=overheads.nccl_buffers,
    )
    return MemoryBreakdown(
        weights=weights,
        gradients=gradients,
        optimizer_states=optimizer_states,
        activations=activations,
        other=other,
        total=total,
        transient=overheads.transient,
        workspace=overheads.workspace,
        allocator_reserve=overheads.allocator_reserve,
        cuda_context=overheads.cuda_context,
        nccl_buffers=overheads.nccl_buffers,
        allocated_peak=allocated,
        allocator_reserved_peak=allocator_reserved,
        reserved_peak=reserved,
        capacity=capacity,
        fits=reserved <= capacity,
        headroom=capacity - reserved,
        stage=stage,
        peak=overheads.peak,
        expert_weights=expert[0],
        expert_gradients=expert[1],
        expert_optimizer_states=expert[2],
        optimizer_step_copy=optimizer_step_copy,
    )


def low_precision_weight_extra(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    blocks: int,
    param_bytes: int,
    moe_blocks: int = 0,
) -> int:
    """The weight bytes the precision recipe adds on a stage of ``blocks`` blocks, ``moe_blocks``
    of them MoE layers (:func:`~blueprinting.analysis.precision_memory.weight_extra_bytes`
    over its Transformer Engine linear weights, :func:`stage_linear_weights`). Under ZeRO-3
    (``ShardedParameters``) TE's cached copies belong to the gathered units: not modelled, 0."""
    if isinstance(mapping.parallelism.data.optimizer_sharding, ShardedParameters):
        return 0
    dense, expert = stage_linear_weights(model, mapping, blocks, moe_blocks)
    return weight_extra_bytes(mapping.precision, dense + expert, param_bytes)


def stage_linear_weights(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    blocks: int,
    moe_blocks: int,
) -> tuple[int, int]:
    """(dense, routed-expert) TE linear weight elements of a stage's blocks on one rank."""
    t = mapping.tensor_degree
    moe_dense, moe_expert = moe_block_linear_weights_per_rank(model, t, mapping.parallelism.experts)
    dense = (blocks - moe_blocks) * block_linear_weights_per_rank(model, t) + moe_blocks * moe_dense
    return dense, moe_blocks * moe_expert


def stage_param_gather_bytes(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    params: StageParameters,
    param_bytes: int,
) -> tuple[int, int]:
    """The DP parameter all-gather's bytes of a stage under the precision recipe
    (:func:`~blueprinting.analysis.precision_memory.param_gather_bytes`): (dense parameters
    over d x cp, routed experts over expert-dp)."""
    dense, expert = stage_linear_weights(model, mapping, params.blocks, params.moe_blocks)
    return (
        param_gather_bytes(mapping.precision, params.dense_total, dense, param_bytes),
        param_gather_bytes(mapping.precision, params.expert_total, expert, param_bytes),
    )


def stage_memory(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    *,
    stage: int,
    capacity_bytes: int,
    runtime: RuntimeMemory | None = None,
    nvlink_domain: int | None = None,
) -> MemoryBreakdown:
    """Memory of one GPU on pipeline stage ``stage`` against an HBM capacity in bytes
    (``runtime``: the system's :class:`RuntimeMemory`, its defaults when not given;
    ``nvlink_domain``: the GPUs of one NVLink domain as the job is placed,
    ``NodeSpec.placed_domain_size``, None for one domain holding the job)."""
    _check_capacity(capacity_bytes)
    return _stage_memory(
        model,
        mapping,
        stage,
        capacity_bytes,
        runtime=runtime if runtime is not None else RuntimeMemory(),
        inv=_StageInvariants.of(model, mapping),
        nvlink_domain=nvlink_domain,
    )


def _check_capacity(capacity_bytes: int) -> None:
    if type(capacity_bytes) is not int or capacity_bytes < 1:
        raise ConfigError(
            [f"capacity_bytes must be a positive integer, got {capacity_bytes!r}"],
            source="memory analysis",
        )


def _stage_memory(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    stage: int,
    capacity_bytes: int,
    *,
    runtime: RuntimeMemory,
    inv: _StageInvariants,
    nvlink_domain: int | None,
) -> MemoryBreakdown:
    recipe = inv.recipe
    params = _stage_parameters(model, mapping, stage, inv.parameters)
    count, experts = params.dense_total, params.expert_total
    if model_copies(mapping.parallelism.pipeline.schedule) == 2:
        # DualPipe: rank r also holds stage p - 1 - r of the reverse direction (weights,
        # gradients and optimizer states), so the end ranks hold the embedding and the LM head.
        mirror = _stage_parameters(
            model, mapping, mapping.pipeline_degree - 1 - stage, inv.parameters
        )
        count += mirror.dense_total
        experts += mirror.expert_total
    # the distributed optimizer shards dense parameters over d x cp, routed experts over
    # expert-dp = W / (etp ep p) (shared reference section 2.7)
    d, de = mapping.dense_gradient_degree, mapping.expert_data_degree
    sharding = mapping.parallelism.data.optimizer_sharding
    # ZeRO-3 keeps the units being gathered whole (the dense ones first: the largest unit of a
    # MoE stage is a MoE block, its dense part before its experts)
    level = sharding_level(sharding)
    gathered = gathered_whole(level, count + experts, params.largest_unit, gathers_ahead(sharding))
    dense_gathered, expert_gathered = min(count, gathered), max(0, gathered - count)
    held = persistent_recipe(recipe)
    dense = state_bytes(count, recipe=held, level=level, degree=d, gathered=dense_gathered)
    expert_parts = state_bytes(
        experts, recipe=held, level=level, degree=de, gathered=expert_gathered
    )
    # the optimizer's fp32 copy of 16-bit gradients lives at the step only (step_copy_bytes)
    dense_copy = step_copy_bytes(
        count, recipe=recipe, level=level, degree=d, gathered=dense_gathered
    )
    expert_copy = step_copy_bytes(
        experts, recipe=recipe, level=level, degree=de, gathered=expert_gathered
    )
    weights, gradients, optimizer = (x + y for x, y in zip(dense, expert_parts, strict=True))
    weights += low_precision_weight_extra(
        model, mapping, params.blocks, recipe.param, params.moe_blocks
    )
    acts = _stage_activations(model, mapping, stage, inv)
    activations = acts.on_gpu
    other = acts.embedding + acts.logits
    copy = dense_copy + expert_copy
    return assemble_breakdown(
        weights=weights,
        gradients=gradients,
        optimizer_states=optimizer,
        activations=activations,
        other=other,
        overheads=_stage_overheads(
            model,
            mapping,
            stage,
            runtime,
            inv,
            nvlink_domain=nvlink_domain,
            step=step_copy_excess(copy=copy, activations=activations, other=other),
        ),
        capacity=capacity_bytes,
        stage=stage,
        expert=expert_parts,
        optimizer_step_copy=copy,
    )


MTP_HIDDEN_TENSORS = 5
"""What one multi-token-prediction depth stores beside its decoder layer and its output head,
in tensors of ``rows x hidden`` per sample: the inputs of ``enorm`` and ``hnorm``, the
``eh_proj`` linear's input (the two normed halves concatenated, 2 hidden wide) and the input of
its ``final_layernorm`` (NVIDIA/Megatron-LM ``megatron/core/transformer/
multi_token_prediction.py`` @00611e6e, ``_concat_embeddings`` and ``_postprocess``)."""

MTP_CHECKPOINT_TENSORS = 2
"""Under full recomputation (``uniform``, the only method Megatron-LM recomputes MTP with; it
skips ``block``) an MTP depth keeps only the two inputs of its checkpointed projection and
layer, ``hidden_states`` and ``decoder_input`` (same file, ``_checkpointed_forward``)."""


def mtp_depth_bytes(
    *, layer: Count, micro_batch: Count, rows: Count, hidden: int, activation: int
) -> Count:
    """What one MTP depth stores for one microbatch outside its output head: its decoder
    layer's stored bytes (``layer``: under the stage's recompute) and the
    :data:`MTP_HIDDEN_TENSORS` beside it."""
    return layer + micro_batch * MTP_HIDDEN_TENSORS * activation * rows * hidden


def mtp_checkpoint_bytes(*, micro_batch: Count, rows: Count, hidden: int, activation: int) -> Count:
    """One MTP depth's stored bytes for one microbatch under full uniform recomputation."""
    return micro_batch * MTP_CHECKPOINT_TENSORS * activation * rows * hidden


def mtp_depth_stored_bytes(
    *,
    selective: bool | npt.NDArray[np.bool_],
    uniform: bool | npt.NDArray[np.bool_],
    full_layer: Count,
    kept_layer: Count,
    micro_batch: Count,
    rows: Count,
    hidden: int,
    activation: int,
) -> Count:
    """One MTP depth's stored bytes per microbatch under the stage's recompute, on a plan's
    numbers or a search's columns: the checkpoint under full uniform recompute; else its layer
    as the stage keeps it, the kept one under selective recompute and the whole one without
    recompute or under the block method (Megatron-LM warns and does not recompute MTP there)."""
    layer = where(selective, kept_layer, full_layer)
    return where(
        uniform,
        mtp_checkpoint_bytes(
            micro_batch=micro_batch, rows=rows, hidden=hidden, activation=activation
        ),
        mtp_depth_bytes(
            layer=layer, micro_batch=micro_batch, rows=rows, hidden=hidden, activation=activation
        ),
    )


def mtp_stored_bytes(microbatches: Count, *, depths: int, depth: Count, head: Count) -> Count:
    """The loss stage's MTP activations: every in-flight microbatch of its last chunk holds
    each of the ``depths`` depths' stored bytes (``depth``) and its own output head's logits
    (``head``: :func:`logits_buffer_bytes` of one microbatch; Megatron-LM's
    ``process_mtp_loss`` runs the shared output layer and the loss once per depth)."""
    return cast("Count", microbatches * depths * (depth + head))  # type: ignore[redundant-cast]


def sharding_level(sharding: OptimizerSharding) -> int:
    """How far ``sharding`` spreads the states over the data-parallel ranks
    (:func:`state_bytes`): 0 not at all, 1 the optimizer states (the distributed optimizer),
    2 and the gradients, 3 and the parameters (ZeRO-3)."""
    match sharding:
        case NoOptimizerSharding():
            return 0
        case DistributedOptimizer():
            return 1
        case ShardedGradients():
            return 2
        case ShardedParameters():
            return 3
        case _ as unreachable:
            assert_never(unreachable)


def gathers_ahead(sharding: OptimizerSharding) -> bool:
    """Whether ZeRO-3 prefetches the next unit's parameters (:func:`gathered_whole`)."""
    return isinstance(sharding, ShardedParameters) and sharding.overlap_param_gather


def memory_per_stage(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    *,
    capacity_bytes: int,
    runtime: RuntimeMemory | None = None,
    nvlink_domain: int | None = None,
) -> tuple[MemoryBreakdown, ...]:
    """:func:`stage_memory` for every pipeline stage, stage 0 first."""
    _check_capacity(capacity_bytes)
    inv = _StageInvariants.of(model, mapping)
    chosen = runtime if runtime is not None else RuntimeMemory()
    return tuple(
        _stage_memory(
            model,
            mapping,
            stage,
            capacity_bytes,
            runtime=chosen,
            inv=inv,
            nvlink_domain=nvlink_domain,
        )
        for stage in range(mapping.pipeline_degree)
    )


def memory_per_gpu(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    *,
    capacity_bytes: int,
    runtime: RuntimeMemory | None = None,
    nvlink_domain: int | None = None,
) -> MemoryBreakdown:
    """Memory of the most loaded pipeline stage (the earliest one on ties): the plan fits only if
    this fits."""
    return most_loaded(
        memory_per_stage(
            model,
            mapping,
            capacity_bytes=capacity_bytes,
            runtime=runtime,
            nvlink_domain=nvlink_domain,
        )
    )


def most_loaded(stages: tuple[MemoryBreakdown, ...]) -> MemoryBreakdown:
    """The stage with the largest device peak ``reserved_peak`` (the earliest one on ties)."""
    return max(stages, key=lambda breakdown: (breakdown.reserved_peak, -breakdown.stage))


# --------------------------------------------------------------------------------------------
# Megatron-LM's estimate
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronMemoryEstimate:
    """Megatron-LM's theoretical memory for its most loaded (first) stage, in bytes (floats, as
    Megatron computes them). Label it "Megatron's estimate" beside :func:`memory_per_gpu`."""

    weights_and_optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights_and_optimizer + self.activations


def megatron_theoretical_memory(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> MegatronMemoryEstimate:
    """Megatron-LM ``theoretical_memory_usage.py`` (``report_theoretical_memory``), restated.

    Weights and optimizer: its parameter count (no biases, no position embeddings, ``2h^2 (1 + g/a)
    q/h`` attention, ``2 h f (3/2 if SwiGLU)`` MLP, norms) on the most loaded shard,
    ``(blocks / p + embedding) / t`` (+ the LM head when untied and p = 1), times 18 bytes, or
    ``6 + 12/d`` with the distributed optimizer (any sharding variant here; Megatron hard-codes
    the bf16 figures whatever the datatype).
    Activations: with sequence parallelism and selective recompute, ``s b h (18 + 4 ffn/h)`` per
    layer for all L layers, plus ``8 s b p`` token ids and ``s b h p`` embedding dropout, times the
    interleaving factor ``1 + (p-1)/(p v)`` when v > 1 or ``min(1, m/p)`` when v = 1 and p > 1,
    plus ``4 s b h (1 + V/h)`` output terms when p = 1, all / t. Every other case (including no
    recompute and full recompute) uses ``s b h (10 + 24/t)`` per layer, the same embedding terms
    and factors, ``2 (s b V / t + s b h)`` output terms when p = 1, times a 1.05 overhead, not / t.
    """
    h = model.hidden_size
    s = model.seq_length
    b = mapping.batch.micro_batch_size
    t = mapping.tensor_degree
    p = mapping.pipeline_degree
    d = mapping.data_degree
    v = mapping.virtual_stages
    m = mapping.microbatch_count
    vocab = model.padded_vocab_size
    ffn = model.ffn_hidden_size

    gated = 1.5 if model.activation is MlpActivation.SWIGLU else 1.0
    norm = 1 if model.normalization is Normalization.RMSNORM else 2
    heads = model.num_attention_heads
    q_ratio = model.query_projection_size / h
    attention = 2 * h * h * (1 + model.num_query_groups / heads) * q_ratio
    layer = 2 * h * (ffn * gated + norm) + attention
    blocks = layer * model.num_layers + norm * h
    embedding = h * vocab
    shard = (blocks / p + embedding) / t
    if model.embeddings is EmbeddingTying.UNTIED and p == 1:
        shard += embedding / t
    sharded = not isinstance(mapping.parallelism.data.optimizer_sharding, NoOptimizerSharding)
    bytes_per_parameter = 6 + 12 / d if sharded else 18.0
    weights_and_optimizer = shard * bytes_per_parameter

    selective_sp = mapping.sequence_parallel and isinstance(
        mapping.parallelism.recompute, SelectiveRecompute
    )
    per_layer = s * b * h * ((18 + 4 * ffn / h) if selective_sp else (10 + 24 / t))
    activations = per_layer * model.num_layers + 8 * s * b * p + s * b * h * p
    if v > 1:
        activations *= 1 + (p - 1) / (p * v)
    elif p > 1:
        activations *= min(1.0, m / p)
    if selective_sp:
        if p == 1:
            activations += s * b * h * 4 * (1 + vocab / h)
        activations /= t
    else:
        if p == 1:
            activations += (s * b * vocab / t + s * b * h) * 2
        activations *= 1.05
    return MegatronMemoryEstimate(
        weights_and_optimizer=weights_and_optimizer, activations=activations
    )
