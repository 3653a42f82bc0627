"""Memory per GPU of a serving replica: weights, KV cache, activations; the largest batch.

Sources and choices
-------------------
- Weights: the same per-TP-rank parameter count as training
  (:func:`blueprinting.analysis.rank_parameters.block_parameters_per_rank`: column/row-parallel
  splits over t, KV heads replicated when t > groups, norms and row-parallel biases replicated),
  in the model's datatype. Stage 0 adds the word embedding (/ t) and learned positions; the last
  stage the final norm and, when untied or when p > 1, the LM head (Megatron keeps a copy of a
  tied embedding on the last stage). No gradients and no optimizer states.
- KV cache (Pope et al. 2022, Section 2.1; Kwon et al. 2023, vLLM, Section 2.2), GQA-aware
  (Ainslie et al. 2023)::

      kv_cache = 2 * layers_per_stage * groups_per_rank * kv_channels
                 * (prompt_length + generated_tokens) * batch * kv_bytes

  with ``groups_per_rank = max(1, groups / t)`` (Megatron-LM replicates KV heads when
  t > groups). It is sized for the whole request, as a serving engine reserves it. A
  sliding-window layer keeps only the last ``W = window + 1`` tokens' keys and values (the
  keys its next query attends; vLLM's ``SlidingWindowSpec`` frees the blocks that fall out of
  the window, up to its block rounding, which is not modelled): its term has
  ``min(prompt_length + generated_tokens, W)`` in place of the whole context.
- Activations: a forward-only pass frees each block's activations when the next block starts, so
  the working set is the residual stream of one microbatch's prefill (``b_mb * prompt * h``
  elements) plus the largest op's activation inputs and outputs in that prefill (weights and KV
  cache excluded; attention is fused, so no ``s x s`` scores). Decode steps need less.
- MoE and MLA models: every routed expert's weights are resident, ``E / ep`` experts per rank at
  their ``F / (t / ep)`` slice; attention, dense layers, shared experts (TP-sharded), the
  replicated router and norms as training counts them per rank (MLA's down projections
  replicated on every TP rank): :func:`stage_weights`. ``expert_weights`` is the
  routed-expert part, ``dense_weights`` the rest. The KV cache of
  MLA stores the latent (:func:`~blueprinting.synthesizer.dialects.transformer.inference.
  kv_cache_bytes_per_token`). Multi-token-prediction layers are not loaded (a serving engine
  runs them only as speculative-decoding drafts, which is not modelled).
- Not counted: CUDA context, allocator fragmentation and paging slack, NCCL buffers, sampling
  temporaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from blueprinting.analysis.memory import stage_parameter_counts
from blueprinting.analysis.rank_parameters import moe_block_parameters_per_rank
from blueprinting.mapping.transformer import ExpertParallel
from blueprinting.synthesizer.dialects.transformer.inference import (
    InferenceStepWork,
    kv_cache_bytes_per_token,
)
from blueprinting.synthesizer.dialects.transformer.inference_derivation import (
    LocalInferencePlan,
)

#: The largest batch :func:`max_batch_that_fits` tries (2**24 sequences).
MAX_BATCH_SEARCHED = 1 << 24


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceMemory:
    """Bytes on one GPU of pipeline stage ``stage``."""

    stage: int
    weights: int
    kv_cache: int
    activations: int
    capacity: float
    #: the part of ``weights`` that is routed experts
    expert_weights: int = 0

    @property
    def dense_weights(self) -> int:
        """Every weight but the routed experts' (attention, dense and shared MLPs, router,
        norms, embeddings)."""
        return self.weights - self.expert_weights

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def headroom(self) -> float:
        return self.capacity - self.total


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StageWeights:
    """Weight bytes one GPU of a stage holds: in all, and of that the routed experts."""

    total: int
    experts: int = 0


def stage_weights(plan: LocalInferencePlan, stage: int) -> StageWeights:
    """Weight bytes on one GPU of ``stage``: training's per-rank count
    (:func:`blueprinting.analysis.memory.stage_parameter_counts`) of the same blocks, each MoE
    layer with its dense part (attention, shared experts, router, norms) and every local
    expert resident; serving's expert grid is ep x (t / ep) of the stage's TP group
    (:func:`~blueprinting.analysis.rank_parameters.moe_block_parameters_per_rank`)."""
    model = plan.model
    e = model.datatype.bytes
    counts = stage_parameter_counts(
        model,
        tensor_degree=plan.tp,
        pipeline_degree=plan.pp,
        stage=stage,
        blocks=plan.stage_blocks[stage],
    )
    moe = plan.moe_blocks(stage)
    grid = ExpertParallel(degree=plan.ep, tensor_degree=max(1, plan.tp // plan.ep))
    dense, routed = moe_block_parameters_per_rank(model, plan.tp, grid)
    params = counts.total + moe * (dense + routed - counts.block_parameters)
    return StageWeights(total=params * e, experts=moe * routed * e)


def kv_cache_bytes(plan: LocalInferencePlan, stage: int, batch: int) -> int:
    """``2 * layers_per_stage * groups_per_rank * kv_channels * (prompt + generated) * batch *
    kv_bytes``, a sliding-window layer's context capped at its window's keys."""
    workload = plan.workload
    context = workload.prompt_length + workload.generated_tokens
    per_token = kv_cache_bytes_per_token(plan.model, plan.tp, workload.kv_cache_datatype)
    windowed = plan.windowed_blocks(stage)
    keys = plan.model.window_keys
    kept = (plan.stage_blocks[stage] - windowed) * context
    if keys is not None:
        kept += windowed * min(context, keys)
    return per_token * kept * batch


def activation_bytes(plan: LocalInferencePlan, stage: int, microbatch: int) -> int:
    """Residual stream plus the largest op's activations in one microbatch's prefill."""
    return _activation_bytes(plan, stage, plan.prefill(microbatch))


def _activation_bytes(plan: LocalInferencePlan, stage: int, step: InferenceStepWork) -> int:
    moe = plan.moe_blocks(stage)
    ops = list(step.block) if plan.stage_blocks[stage] > moe else []
    if moe:
        ops.extend(step.moe_block)
    if stage == 0:
        ops.extend(step.first_stage)
    if stage == plan.pp - 1:
        ops.extend(step.last_stage)
    largest = max((op.activation_bytes for op in ops), default=0)
    model = plan.model
    residual = step.dims.tokens * model.hidden_size * model.datatype.bytes
    return residual + largest


def stage_memory(
    plan: LocalInferencePlan, stage: int, *, batch: int, microbatch: int, capacity: float
) -> InferenceMemory:
    return _stage_memory(plan, stage, batch=batch, step=plan.prefill(microbatch), capacity=capacity)


def _stage_memory(
    plan: LocalInferencePlan,
    stage: int,
    *,
    batch: int,
    step: InferenceStepWork,
    capacity: float,
    weights: StageWeights | None = None,
) -> InferenceMemory:
    held = stage_weights(plan, stage) if weights is None else weights
    return InferenceMemory(
        stage=stage,
        weights=held.total,
        expert_weights=held.experts,
        kv_cache=kv_cache_bytes(plan, stage, batch),
        activations=_activation_bytes(plan, stage, step),
        capacity=capacity,
    )


def microbatch_size(pp: int, batch: int) -> tuple[int, int]:
    """(microbatches, sequences per microbatch): ``m = min(p, b)`` microbatches of ``ceil(b /
    m)`` sequences keep every stage of a ForwardOnly pipeline busy; p = 1 runs the batch whole."""
    count = min(pp, batch)
    return count, -(-batch // count)


def stage_weight_bytes(plan: LocalInferencePlan) -> tuple[StageWeights, ...]:
    """Weight bytes of one GPU of each stage, stage 0 first (independent of the batch)."""
    return tuple(stage_weights(plan, stage) for stage in range(plan.pp))


def memory_per_gpu(
    plan: LocalInferencePlan,
    *,
    batch: int,
    capacity: float,
    weights: tuple[StageWeights, ...] | None = None,
) -> InferenceMemory:
    """The most loaded stage's memory (largest total; the earliest stage on ties). ``weights``:
    :func:`stage_weight_bytes` of ``plan`` when the caller has it already."""
    _, size = microbatch_size(plan.pp, batch)
    step = plan.prefill(size)  # the same prefill on every stage: derived once
    per_stage = stage_weight_bytes(plan) if weights is None else weights
    # A stage's memory is set by its weights, blocks, MoE blocks and whether it is the first
    # or the last: stages alike in these hold the same bytes, and the earliest of them is the
    # one a tie picks, so only it is evaluated (a deep pipeline has three kinds of stage).
    earliest: dict[tuple[StageWeights, int, int, bool, bool], int] = {}
    for stage, w in enumerate(per_stage):
        signature = (w, plan.stage_blocks[stage], plan.moe_blocks(stage), stage == 0)
        earliest.setdefault((*signature, stage == plan.pp - 1), stage)
    stages = [
        _stage_memory(plan, stage, batch=batch, step=step, capacity=capacity, weights=w)
        for stage, w in ((stage, per_stage[stage]) for stage in earliest.values())
    ]
    return max(stages, key=lambda memory: (memory.total, -memory.stage))


def max_batch_that_fits(plan: LocalInferencePlan, *, capacity: float) -> int:
    """The largest batch whose most loaded stage fits in ``capacity``; 0 if not even one
    sequence fits. Memory grows with the batch, so a doubling then bisection finds it."""

    weights = stage_weight_bytes(plan)

    def fits(batch: int) -> bool:
        return memory_per_gpu(plan, batch=batch, capacity=capacity, weights=weights).fits

    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= MAX_BATCH_SEARCHED and fits(high):
        low, high = high, 2 * high
    if high > MAX_BATCH_SEARCHED:
        return low
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low
