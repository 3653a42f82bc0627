"""Inference analysis per replica: prefill, decode, the ForwardOnly pipeline, memory, bounds.

Every step's work comes from the inference block algebra
(:mod:`blueprinting.synthesizer.dialects.transformer.inference`); each op is costed exactly as a
training task (:mod:`blueprinting.synthesizer.stages.portable_plan.passes`, Calculon's per-layer
model, Isaev et al. SC'23, Section 3.1): matrix FLOPs on the matrix engine with the GEMM's
shape-aware efficiency, vector FLOPs on the vector engine, HBM bytes at the memory efficiency,
combined by the system's processing mode (roofline max by default). TP collectives are on the
critical path (no GEMM/communication overlap), on the TP group's link. Replicas are placed as the
data dimension of the rank layout (they only decide which ranks share a node; they never
communicate).

Decisions (README, "infer --json", repeats them with units):

* **Stage time** of a step on stage ``s`` = blocks_s x (ops + TP collectives of one block) +
  the embedding on stage 0 + the final norm, LM head and logits gather on the last stage.
* **Microbatches**: a p-stage ForwardOnly pipeline splits the batch into ``m = min(p, b)``
  microbatches of ``ceil(b / m)`` sequences (p = 1: one microbatch, the whole batch).
* **Prefill latency** (= time to first token; no queueing, no tokenization): ``m`` identical
  microbatches through ``p`` stages and ``p - 1`` P2P links (a permutation flow shop):
  ``sum_s T_s + (p - 1) P2P + (m - 1) max(max_s T_s, P2P)``; with m = 1 this is the sum over
  stages plus the P2P hops. The P2P message is ``b_mb * prompt * h`` (/ t under sequence
  parallelism).
* **Decode**: the prefill emits token 1; decode step ``j = 1 .. g - 1`` feeds token ``j`` with
  ``prompt + j - 1`` cached tokens (context ``prompt + j``). A step's round (every sequence gets
  one token) is ``max(m max_s T_s, sum_s T_s + (p - 1) P2P + P2P_back)``: stages pipeline the
  microbatches, but a microbatch's next token needs its previous one to have left the last
  stage (``P2P_back``: the sampled token ids, 8 bytes per sequence, back to stage 0).
  ``decode_latency_per_token_s.mean`` averages the rounds over the ``g - 1`` steps,
  ``.final`` is the last one (context ``prompt + g - 1``). With ``g = 1`` there is no decode
  step: both report the step that would come next (cache = prompt). Beyond
  ``MAX_EXACT_DECODE_STEPS`` (4,096) steps the rounds are costed at that many evenly spaced
  steps, the first and the last included (:func:`decode_contexts`): the mean is theirs and the
  total is the mean times ``g - 1``, so a generation of 2**40 tokens answers at once.
* **Throughput**: a static batch: ``b * g`` tokens per ``prefill + sum of decode rounds``,
  per replica; times ``replicas`` for the deployment.
* **Bounds** (speed of light, per phase): the work of one pass of the whole batch through all
  stages on the replica's critical path: ``compute_s = matrix FLOPs / matrix peak + vector
  FLOPs / vector peak`` (datasheet peaks), ``hbm_s = bytes / HBM bandwidth`` (datasheet),
  ``tp_comm_s`` = the modelled TP collectives; the decode bounds are the mean over the decode
  steps. With their FLOPs and bytes (weights, KV cache, activations) they let one compare the
  modelled figure with both rooflines term by term.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeAlias, final

import numpy as np
import numpy.typing as npt

from blueprinting.errors import ConfigError
from blueprinting.hardware.collectives import CollectiveKind as LinkCollective
from blueprinting.hardware.efficiency import GemmShapeColumns
from blueprinting.hardware.polymorphic import IntColumn
from blueprinting.hardware.system import CommGroup, ParallelDim, SystemSpec
from blueprinting.inference.memory import (
    InferenceMemory,
    max_batch_that_fits,
    memory_per_gpu,
    microbatch_size,
)
from blueprinting.limits import MAX_EXACT_DECODE_STEPS, stage_limit_problem
from blueprinting.mapping.flat_keys import inference_to_mapping
from blueprinting.mapping.transformer import InferenceSpec
from blueprinting.synthesizer.dialects.transformer.inference import (
    CONTEXT_DEPENDENT,
    AttentionOpFigures,
    InferenceCollective,
    InferenceOp,
    InferenceStepWork,
    activation_bytes,
    decode_attention_columns,
    decode_attention_ops,
    experts_touched,
)
from blueprinting.synthesizer.dialects.transformer.inference_derivation import (
    LocalInferencePlan,
    derive_inference_plan,
)
from blueprinting.synthesizer.stages.portable_plan.passes import (
    gemm_work_times,
    work_time,
    work_times,
)

JsonScalar = int | float | str | bool | None
JsonValue = JsonScalar | list["JsonValue"] | dict[str, "JsonValue"]

TOKEN_ID_BYTES = 8
"""Sampled token ids travel as int64 (Megatron-LM feeds int64 token ids)."""


# --------------------------------------------------------------------------------------------
# One stage, one step
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StepCost:
    """One step's cost on one or more stages (fields add over stages)."""

    ops_s: float = 0.0
    tp_comm_s: float = 0.0
    matrix_flops: int = 0
    vector_flops: int = 0
    weight_bytes: int = 0
    #: the part of ``weight_bytes`` that is routed experts' weights
    expert_weight_bytes: int = 0
    kv_cache_bytes: int = 0
    activation_bytes: int = 0

    @property
    def time_s(self) -> float:
        return self.ops_s + self.tp_comm_s

    @property
    def flops(self) -> int:
        return self.matrix_flops + self.vector_flops

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_cache_bytes + self.activation_bytes

    def __add__(self, other: StepCost) -> StepCost:
        return StepCost(
            ops_s=self.ops_s + other.ops_s,
            tp_comm_s=self.tp_comm_s + other.tp_comm_s,
            matrix_flops=self.matrix_flops + other.matrix_flops,
            vector_flops=self.vector_flops + other.vector_flops,
            weight_bytes=self.weight_bytes + other.weight_bytes,
            expert_weight_bytes=self.expert_weight_bytes + other.expert_weight_bytes,
            kv_cache_bytes=self.kv_cache_bytes + other.kv_cache_bytes,
            activation_bytes=self.activation_bytes + other.activation_bytes,
        )

    def times(self, count: int) -> StepCost:
        return StepCost(
            ops_s=self.ops_s * count,
            tp_comm_s=self.tp_comm_s * count,
            matrix_flops=self.matrix_flops * count,
            vector_flops=self.vector_flops * count,
            weight_bytes=self.weight_bytes * count,
            expert_weight_bytes=self.expert_weight_bytes * count,
            kv_cache_bytes=self.kv_cache_bytes * count,
            activation_bytes=self.activation_bytes * count,
        )


def op_time(op: InferenceOp, system: SystemSpec, plan: LocalInferencePlan) -> float:
    """One op's time, by the rule that costs a training compute task."""
    return work_time(op.work, op.gemm, system, plan.model.datatype)


def _summed(ops: Sequence[InferenceOp], *, ops_s: float, tp_comm_s: float) -> StepCost:
    """The cost of ``ops`` with their times given: the op counts summed (exact in integers),
    the one place a StepCost is composed from op objects."""
    return StepCost(
        ops_s=ops_s,
        tp_comm_s=tp_comm_s,
        matrix_flops=sum(op.work.matrix_flops for op in ops),
        vector_flops=sum(op.work.vector_flops for op in ops),
        weight_bytes=sum(op.weight_bytes for op in ops),
        expert_weight_bytes=sum(op.expert_weight_bytes for op in ops),
        kv_cache_bytes=sum(op.kv_cache_bytes for op in ops),
        activation_bytes=sum(op.activation_bytes for op in ops),
    )


def _step_sums(columns: list[list[float]]) -> tuple[list[float], float]:
    """Each step's time (the built-in ``sum`` of its op times, op j of the step in column j)
    and the steps' total added one after the other: the order the op-by-op loop of
    :func:`_attention_costs` adds them in, so both paths give the same floats."""
    step_s = [sum(row) for row in zip(*columns, strict=True)]
    total_s = 0.0
    for seconds in step_s:
        total_s += seconds
    return step_s, total_s


def _cost(
    ops: tuple[InferenceOp, ...],
    collectives: tuple[InferenceCollective, ...],
    system: SystemSpec,
    plan: LocalInferencePlan,
    tp_group: CommGroup,
) -> StepCost:
    return _summed(
        ops,
        ops_s=sum(op_time(op, system, plan) for op in ops),
        tp_comm_s=sum(
            system.collective_time(LinkCollective(c.kind.value), c.bytes, tp_group)
            for c in collectives
        ),
    )


def stage_costs(
    step: InferenceStepWork, plan: LocalInferencePlan, system: SystemSpec, tp_group: CommGroup
) -> tuple[StepCost, ...]:
    """The step's cost on each pipeline stage, stage 0 first: its dense and MoE layers, each
    with its attention core: the full one, or on the stage's sliding-window layers the
    step's ``windowed_attention`` (a step stripped of its attention, as the decode path's
    fixed part, has none)."""
    windows = bool(step.windowed_attention)

    def outside_attention(ops: tuple[InferenceOp, ...]) -> tuple[InferenceOp, ...]:
        return tuple(op for op in ops if op.name not in CONTEXT_DEPENDENT)

    block = _cost(outside_attention(step.block), step.block_collectives, system, plan, tp_group)
    moe_block = _cost(
        outside_attention(step.moe_block), step.block_collectives, system, plan, tp_group
    )
    # attention has no collective: the TP group does not enter these two
    attention = _cost(
        tuple(op for op in step.block if op.name in CONTEXT_DEPENDENT), (), system, plan, tp_group
    )
    windowed = _cost(step.windowed_attention, (), system, plan, tp_group)
    first = _cost(step.first_stage, step.first_stage_collectives, system, plan, tp_group)
    last = _cost(step.last_stage, step.last_stage_collectives, system, plan, tp_group)
    out = []
    for stage, blocks in enumerate(plan.stage_blocks):
        moe = plan.moe_blocks(stage)
        local = plan.windowed_blocks(stage) if windows else 0
        cost = (
            block.times(blocks - moe)
            + moe_block.times(moe)
            + attention.times(blocks - local)
            + windowed.times(local)
        )
        if stage == 0:
            cost = cost + first
        if stage == plan.pp - 1:
            cost = cost + last
        out.append(cost)
    return tuple(out)


AttentionCache: TypeAlias = dict[
    tuple[int, bool, int, tuple[int, ...], int | None],
    tuple["npt.NDArray[np.float64]", "StepCost"],
]
"""One block's decode attention over a list of cache lengths, by (t, sequence parallel, batch,
cache lengths, the sliding window's keys or None): each step's time and the steps' costs
summed. Valid for one model, system and KV-cache datatype only: a search over the layouts of
one spec shares one."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeCosts:
    """The decode steps on a list of cache lengths: per step, the slowest stage's time and the
    sum of the stages' times; ``totals_sum``: the whole steps' costs (every stage) summed over
    the steps."""

    slowest_stage_s: tuple[float, ...]
    stages_sum_s: tuple[float, ...]
    totals_sum: StepCost


def _attention_costs(
    plan: LocalInferencePlan,
    system: SystemSpec,
    tp_group: CommGroup,
    *,
    batch: int,
    cached: list[int],
    keys: int | None = None,
) -> tuple[npt.NDArray[np.float64], StepCost]:
    """One block's attention on each cache length (over a sliding window of ``keys`` keys
    where given): the times, and the costs summed. Op j of every step is timed by one call of
    the cost rule on a column (``work_times``, equal to :func:`op_time` element by element); a
    column it cannot take is timed op by op."""
    figures = decode_attention_columns(
        plan.model,
        batch=batch,
        contexts=cached,
        tp=plan.tp,
        sequence_parallel=plan.sequence_parallel,
        kv_datatype=plan.workload.kv_cache_datatype,
        keys=keys,
    )
    if figures is not None:
        return _attention_column_costs(figures, system, plan, len(cached))
    steps = decode_attention_ops(
        plan.model,
        batch=batch,
        contexts=cached,
        tp=plan.tp,
        sequence_parallel=plan.sequence_parallel,
        kv_datatype=plan.workload.kv_cache_datatype,
        keys=keys,
    )
    columns = _op_time_columns(steps, system, plan)
    if columns is None:
        times = np.empty(len(cached), dtype=np.float64)
        summed = StepCost()
        for i, ops in enumerate(steps):
            # Attention has no collective: the TP group (placement) does not enter its cost.
            attention = _cost(ops, (), system, plan, tp_group)
            times[i] = attention.time_s
            summed = summed + attention
        return times, summed
    # What the loop above gives, in its order: a step's ops_s is the built-in ``sum`` of its
    # op times (compensated from Python 3.12 on), the steps' add one after the other, and the
    # integer counts add exactly in any order; no collective, so tp_comm_s is 0.
    step_s, total_s = _step_sums(columns)
    summed = _summed([op for ops in steps for op in ops], ops_s=total_s, tp_comm_s=0.0)
    return np.array(step_s, dtype=np.float64), summed


def _attention_column_costs(
    figures: tuple[AttentionOpFigures[IntColumn], ...],
    system: SystemSpec,
    plan: LocalInferencePlan,
    steps: int,
) -> tuple[npt.NDArray[np.float64], StepCost]:
    """:func:`_attention_costs` from the ops' figures on columns
    (:func:`decode_attention_columns`): the same times and sums, in the same order, without an
    op object per step. Each op is one GEMM call over its batch (or has no GEMM shape) and
    carries no weights, as :class:`AttentionOpFigures` says."""

    def column(x: IntColumn | int) -> IntColumn:
        return np.broadcast_to(np.asarray(x, dtype=np.int64), (steps,))

    ones = np.ones(steps, dtype=np.float64)
    columns: list[list[float]] = []
    matrix_flops = vector_flops = kv_cache_bytes = moved = 0
    for f in figures:
        matrix, vector = column(f.matrix_flops), column(f.vector_flops)
        traffic = column(f.bytes_read) + column(f.bytes_written)
        shape = None if f.gemm is None else GemmShapeColumns.of_dims(*f.gemm)
        times = gemm_work_times(
            matrix.astype(np.float64),
            vector.astype(np.float64),
            traffic.astype(np.float64),
            calls=ones,
            shape=shape,
            system=system,
            datatype=plan.model.datatype,
        )
        columns.append(times.tolist())
        # Python ints: a sum over thousands of steps may pass int64's range
        matrix_flops += sum(matrix.tolist())
        vector_flops += sum(vector.tolist())
        kv_cache_bytes += sum(column(f.kv_cache_bytes).tolist())
        moved += sum(traffic.tolist())
    step_s, total_s = _step_sums(columns)
    # the figures' sums, not op objects' (there are none on this path): what _summed would
    # give for the ops these figures describe, which carry no weights
    summed = StepCost(
        ops_s=total_s,
        tp_comm_s=0.0,
        matrix_flops=matrix_flops,
        vector_flops=vector_flops,
        weight_bytes=0,
        expert_weight_bytes=0,
        kv_cache_bytes=kv_cache_bytes,
        activation_bytes=activation_bytes(moved, 0, 0, kv_cache_bytes),
    )
    return np.array(step_s, dtype=np.float64), summed


def _op_time_columns(
    steps: list[tuple[InferenceOp, ...]], system: SystemSpec, plan: LocalInferencePlan
) -> list[list[float]] | None:
    """:func:`op_time` of op j of every step, for each j; None where the steps differ in
    their ops or the rule cannot take a column (``work_times``)."""
    if not steps or any(len(ops) != len(steps[0]) for ops in steps):
        return None
    columns: list[list[float]] = []
    for j in range(len(steps[0])):
        times = work_times(
            [ops[j].work for ops in steps],
            [ops[j].gemm for ops in steps],
            system,
            plan.model.datatype,
        )
        if times is None:
            return None
        columns.append(times.tolist())
    return columns


def decode_stage_costs(
    plan: LocalInferencePlan,
    system: SystemSpec,
    tp_group: CommGroup,
    *,
    batch: int,
    cached: list[int],
    attention_cache: AttentionCache | None = None,
) -> DecodeCosts:
    """:func:`stage_costs` of the decode steps on each cache length in ``cached``. Only the
    attention ops depend on the context, so the rest of the step is costed once and each step
    adds one block's attention times the stage's full-attention layers, and a sliding-window
    layer's times its windowed ones. ``attention_cache`` (see :data:`AttentionCache`) keeps
    the attention costs across calls."""
    first = plan.decode(batch, cached[0])
    fixed = replace(
        first,
        block=tuple(op for op in first.block if op.name not in CONTEXT_DEPENDENT),
        moe_block=tuple(op for op in first.moe_block if op.name not in CONTEXT_DEPENDENT),
        windowed_attention=(),
    )
    fixed_costs = stage_costs(fixed, plan, system, tp_group)

    def attention_of(keys: int | None) -> tuple[npt.NDArray[np.float64], StepCost]:
        key = (plan.tp, plan.sequence_parallel, batch, tuple(cached), keys)
        memo = attention_cache.get(key) if attention_cache is not None else None
        if memo is None:
            memo = _attention_costs(plan, system, tp_group, batch=batch, cached=cached, keys=keys)
            if attention_cache is not None:
                attention_cache[key] = memo
        return memo

    attention_s, attention_sum = attention_of(None)
    windowed = tuple(plan.windowed_blocks(stage) for stage in range(len(plan.stage_blocks)))
    windowed_total = sum(windowed)
    window_s, window_sum = attention_s * 0.0, StepCost()
    if windowed_total:
        window_s, window_sum = attention_of(plan.model.window_keys)
    full_total = sum(plan.stage_blocks) - windowed_total
    # A stage's time is fixed_s + full x attention_s + windowed x window_s: only its distinct
    # (fixed_s, full, windowed) triples (first, middle, last stages) can be the slowest.
    kinds = {
        (cost.time_s, blocks - local, local)
        for cost, blocks, local in zip(fixed_costs, plan.stage_blocks, windowed, strict=True)
    }
    slowest = np.max(
        [fixed_s + attention_s * full + window_s * local for fixed_s, full, local in kinds],
        axis=0,
    )
    sums = (
        sum(cost.time_s for cost in fixed_costs)
        + attention_s * full_total
        + window_s * windowed_total
    )
    return DecodeCosts(
        slowest_stage_s=tuple(slowest.tolist()),
        stages_sum_s=tuple(sums.tolist()),
        totals_sum=_total(fixed_costs).times(len(cached))
        + attention_sum.times(full_total)
        + window_sum.times(windowed_total),
    )


def decode_contexts(prompt: int, generated: int) -> list[int]:
    """The cache lengths of the decode steps costed: ``prompt + j - 1`` for steps ``j = 1 ..
    g - 1`` (``[prompt]`` when ``g = 1``). Beyond ``MAX_EXACT_DECODE_STEPS`` steps, that many
    evenly spaced steps, the first and the last included."""
    steps = generated - 1
    if steps < 1:
        return [prompt]
    if steps <= MAX_EXACT_DECODE_STEPS:
        return [prompt + j for j in range(steps)]
    last = MAX_EXACT_DECODE_STEPS - 1
    return [prompt + (k * (steps - 1)) // last for k in range(MAX_EXACT_DECODE_STEPS)]


def _total(costs: tuple[StepCost, ...]) -> StepCost:
    total = StepCost()
    for cost in costs:
        total = total + cost
    return total


# --------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------
def pipeline_fill_latency(stage_times: tuple[float, ...], microbatches: int, p2p_s: float) -> float:
    """``m`` identical microbatches through the stages and the ``p - 1`` links between them:
    ``sum_s T_s + (p - 1) P2P + (m - 1) max(max_s T_s, P2P)`` (permutation flow shop with
    identical jobs: the bottleneck repeats once per extra job)."""
    links = len(stage_times) - 1
    bottleneck = max(*stage_times, p2p_s) if links else max(stage_times)
    return sum(stage_times) + links * p2p_s + (microbatches - 1) * bottleneck


def decode_round(
    stage_times: tuple[float, ...], microbatches: int, p2p_s: float, back_s: float
) -> float:
    """One decode round: ``max(m max_s T_s, sum_s T_s + (p - 1) P2P + P2P_back)``; p = 1: T_0."""
    return _decode_round(
        max(stage_times),
        sum(stage_times),
        stages=len(stage_times),
        microbatches=microbatches,
        p2p_s=p2p_s,
        back_s=back_s,
    )


def _decode_round(
    slowest_s: float, sum_s: float, *, stages: int, microbatches: int, p2p_s: float, back_s: float
) -> float:
    """:func:`decode_round` from the slowest stage's time and the sum of the stages' times."""
    if stages == 1:
        return microbatches * slowest_s
    recurrence = sum_s + (stages - 1) * p2p_s + back_s
    return max(microbatches * slowest_s, recurrence)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseBounds:
    """Speed-of-light figures of one phase (module docstring); ``modelled_s`` is the modelled
    time of the same single pass (ops plus TP collectives, no P2P)."""

    compute_s: float
    hbm_s: float
    tp_comm_s: float
    modelled_s: float
    matrix_flops: float
    vector_flops: float
    weight_bytes: float
    kv_cache_bytes: float
    activation_bytes: float
    #: the part of ``weight_bytes`` that is routed experts' weights
    expert_weight_bytes: float = 0.0

    def to_json_dict(self) -> dict[str, JsonValue]:
        return {
            "compute_s": self.compute_s,
            "hbm_s": self.hbm_s,
            "tp_comm_s": self.tp_comm_s,
            "modelled_s": self.modelled_s,
            "flops": {"matrix": self.matrix_flops, "vector": self.vector_flops},
            "bytes": {
                "weights": self.weight_bytes,
                "expert_weights": self.expert_weight_bytes,
                "kv_cache": self.kv_cache_bytes,
                "activations": self.activation_bytes,
            },
        }


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertServing:
    """How a MoE model's experts are served: the layout and the routed experts one step's tokens
    touch (expected, uniform routing) in one MoE layer, over the replica, for one microbatch's
    prefill and decode step."""

    expert_parallel_size: int
    expert_tensor_parallel_size: int
    experts_per_rank: int
    moe_layers: int
    num_experts: int
    top_k: int
    prefill_tokens: int
    prefill_experts_touched: float
    decode_tokens: int
    decode_experts_touched: float

    def to_json_dict(self) -> dict[str, JsonValue]:
        return {
            "expert_parallel_size": self.expert_parallel_size,
            "expert_tensor_parallel_size": self.expert_tensor_parallel_size,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "experts_per_rank": self.experts_per_rank,
            "moe_layers": self.moe_layers,
            "experts_touched_per_layer": {
                "prefill": self.prefill_experts_touched,
                "prefill_tokens": self.prefill_tokens,
                "decode": self.decode_experts_touched,
                "decode_tokens": self.decode_tokens,
            },
        }


def _bounds(total: StepCost, n: int, system: SystemSpec, plan: LocalInferencePlan) -> PhaseBounds:
    """Mean over ``n`` passes of the whole batch through every stage whose costs sum to
    ``total``."""
    accelerator = system.accelerator
    datatype = plan.model.datatype
    matrix_peak = accelerator.matrix.rate(datatype).peak_flop_per_s
    vector_peak = accelerator.vector.rate(datatype).peak_flop_per_s
    bandwidth = accelerator.hbm.bandwidth_bytes_per_s
    matrix = total.matrix_flops / n
    vector = total.vector_flops / n
    weights = total.weight_bytes / n
    experts = total.expert_weight_bytes / n
    kv = total.kv_cache_bytes / n
    activations = total.activation_bytes / n
    return PhaseBounds(
        compute_s=matrix / matrix_peak + vector / vector_peak,
        hbm_s=(weights + kv + activations) / bandwidth,
        tp_comm_s=total.tp_comm_s / n,
        modelled_s=total.time_s / n,
        matrix_flops=matrix,
        vector_flops=vector,
        weight_bytes=weights,
        kv_cache_bytes=kv,
        activation_bytes=activations,
        expert_weight_bytes=experts,
    )


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceReport:
    """One serving strategy, evaluated per replica and for the deployment."""

    spec: InferenceSpec
    system: SystemSpec
    microbatches: int
    microbatch_size: int
    prefill_latency_s: float
    decode_steps: int
    decode_round_mean_s: float
    decode_round_final_s: float
    decode_total_s: float
    memory: InferenceMemory
    max_batch_that_fits: int
    prefill_bounds: PhaseBounds
    decode_bounds: PhaseBounds
    strategy_keys: dict[str, int | bool | str | float]
    #: None for a dense model
    experts: ExpertServing | None = None

    @property
    def time_to_first_token_s(self) -> float:
        return self.prefill_latency_s

    @property
    def request_latency_s(self) -> float:
        """Prefill plus every decode round: when the batch's last token is out."""
        return self.prefill_latency_s + self.decode_total_s

    @property
    def replicas(self) -> int:
        return self.spec.mapping.replica_degree

    @property
    def gpus_per_replica(self) -> int:
        return self.spec.mapping.tensor_degree * self.spec.mapping.pipeline_degree

    @property
    def tokens_per_second_per_replica(self) -> float:
        workload = self.spec.mapping.workload
        return workload.batch_size * workload.generated_tokens / self.request_latency_s

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_second_per_replica * self.replicas

    @property
    def decode_tokens_per_second_per_replica(self) -> float:
        """Steady decode rate: ``b`` tokens per mean round."""
        return self.spec.mapping.workload.batch_size / self.decode_round_mean_s

    @property
    def attention_window(self) -> dict[str, JsonValue] | None:
        """The model's sliding-window layers as served (None: every layer attends its whole
        context): the keys a windowed query attends at most, and how many layers are windowed."""
        model = self.spec.model
        keys = model.window_keys
        if keys is None:
            return None
        return {
            "window_keys": keys,
            "windowed_layers": model.windowed_layers_in(0, model.num_layers),
            "layers": model.num_layers,
        }

    def to_json_dict(self) -> dict[str, JsonValue]:
        """The ``infer --json`` object (README documents each key and unit)."""
        memory = self.memory
        workload = self.spec.mapping.workload
        strategy: dict[str, JsonValue] = dict(self.strategy_keys)
        return {
            "model": self.spec.model.name,
            "system": self.system.name,
            "summary": str(self.spec.mapping),
            "world_size": self.spec.mapping.world_size,
            "gpus_per_replica": self.gpus_per_replica,
            "replicas": self.replicas,
            "workload": {
                "batch_size": workload.batch_size,
                "prompt_length": workload.prompt_length,
                "generated_tokens": workload.generated_tokens,
                "kv_cache_datatype": workload.kv_cache_datatype.value,
            },
            "microbatches": self.microbatches,
            "microbatch_size": self.microbatch_size,
            "prefill_latency_s": self.prefill_latency_s,
            "time_to_first_token_s": self.time_to_first_token_s,
            "decode_steps": self.decode_steps,
            "decode_latency_per_token_s": {
                "mean": self.decode_round_mean_s,
                "final": self.decode_round_final_s,
            },
            "request_latency_s": self.request_latency_s,
            "tokens_per_second_per_replica": self.tokens_per_second_per_replica,
            "tokens_per_second": self.tokens_per_second,
            "decode_tokens_per_second_per_replica": self.decode_tokens_per_second_per_replica,
            "memory_bytes": {
                "weights": memory.weights,
                "dense_weights": memory.dense_weights,
                "expert_weights": memory.expert_weights,
                "kv_cache": memory.kv_cache,
                "activations": memory.activations,
                "total": memory.total,
                "capacity": memory.capacity,
                "headroom": memory.headroom,
                "stage": memory.stage,
            },
            "fits_in_memory": memory.fits,
            "attention_window": self.attention_window,
            "max_batch_that_fits": self.max_batch_that_fits,
            "bounds": {
                "prefill": self.prefill_bounds.to_json_dict(),
                "decode": self.decode_bounds.to_json_dict(),
            },
            "experts": None if self.experts is None else self.experts.to_json_dict(),
            "strategy": strategy,
        }


def _expert_serving(plan: LocalInferencePlan, microbatch: int, prompt: int) -> ExpertServing | None:
    moe = plan.model.moe
    if moe is None:
        return None
    prefill_tokens = microbatch * prompt
    return ExpertServing(
        expert_parallel_size=plan.ep,
        expert_tensor_parallel_size=plan.expert_tensor_degree,
        experts_per_rank=moe.num_experts // plan.ep,
        moe_layers=plan.model.num_moe_layers,
        num_experts=moe.num_experts,
        top_k=moe.top_k,
        prefill_tokens=prefill_tokens,
        prefill_experts_touched=experts_touched(moe.num_experts, moe.top_k, prefill_tokens),
        decode_tokens=microbatch,
        decode_experts_touched=experts_touched(moe.num_experts, moe.top_k, microbatch),
    )


def _p2p(plan: LocalInferencePlan, system: SystemSpec, size: int) -> float:
    if plan.pp == 1:
        return 0.0
    group = system.comm_group(
        ParallelDim.PIPELINE, tensor=plan.tp, pipeline=plan.pp, data=plan.replicas
    )
    return system.collective_time(LinkCollective.P2P, size, group)


def analyze_inference(
    spec: InferenceSpec,
    system: SystemSpec,
    *,
    megatron: bool = True,
    max_batch: int | None = None,
    attention_cache: AttentionCache | None = None,
) -> InferenceReport:
    """Check ``spec`` against every law, then evaluate it on ``system`` (module docstring).

    ``max_batch``: the largest batch that fits, when the caller has it already (it does not
    depend on the batch size, so a search over batches computes it once per layout);
    ``attention_cache``: see :data:`AttentionCache` (a search shares one)."""
    plan = derive_inference_plan(spec.model, spec.mapping, megatron=megatron)
    too_many = stage_limit_problem(plan.pp)
    if too_many is not None:
        raise ConfigError([too_many])
    workload = plan.workload
    batch, prompt, generated = (
        workload.batch_size,
        workload.prompt_length,
        workload.generated_tokens,
    )
    tp_group = system.comm_group(
        ParallelDim.TENSOR, tensor=plan.tp, pipeline=plan.pp, data=plan.replicas
    )
    count, size = microbatch_size(plan.pp, batch)
    model = plan.model
    activation = size * model.hidden_size * model.datatype.bytes
    sp_divisor = plan.tp if plan.sequence_parallel else 1

    prefill_stages = stage_costs(plan.prefill(size), plan, system, tp_group)
    prefill_latency = pipeline_fill_latency(
        tuple(c.time_s for c in prefill_stages),
        count,
        _p2p(plan, system, activation * prompt // sp_divisor),
    )
    decode_p2p = _p2p(plan, system, activation)
    decode_back = _p2p(plan, system, size * TOKEN_ID_BYTES)
    cached = decode_contexts(prompt, generated)
    per_microbatch = decode_stage_costs(
        plan, system, tp_group, batch=size, cached=cached, attention_cache=attention_cache
    )
    rounds = [
        _decode_round(
            slowest,
            total,
            stages=plan.pp,
            microbatches=count,
            p2p_s=decode_p2p,
            back_s=decode_back,
        )
        for slowest, total in zip(
            per_microbatch.slowest_stage_s, per_microbatch.stages_sum_s, strict=True
        )
    ]
    whole_batch = (
        per_microbatch
        if size == batch
        else decode_stage_costs(
            plan, system, tp_group, batch=batch, cached=cached, attention_cache=attention_cache
        )
    )
    decode_mean = sum(rounds) / len(rounds)
    prefill_whole = _total(
        prefill_stages
        if size == batch
        else stage_costs(plan.prefill(batch), plan, system, tp_group)
    )
    capacity = system.accelerator.hbm.capacity_bytes
    return InferenceReport(
        experts=_expert_serving(plan, size, prompt),
        spec=spec,
        system=system,
        microbatches=count,
        microbatch_size=size,
        prefill_latency_s=prefill_latency,
        decode_steps=generated - 1,
        decode_round_mean_s=decode_mean,
        decode_round_final_s=rounds[-1],
        # Exactly the sum of the rounds when every step is costed; else the sampled mean x steps.
        decode_total_s=(
            0.0
            if generated <= 1
            else sum(rounds)
            if len(rounds) == generated - 1
            else decode_mean * (generated - 1)
        ),
        memory=memory_per_gpu(plan, batch=batch, capacity=capacity),
        max_batch_that_fits=(
            max_batch_that_fits(plan, capacity=capacity) if max_batch is None else max_batch
        ),
        prefill_bounds=_bounds(prefill_whole, 1, system, plan),
        decode_bounds=_bounds(whole_batch.totals_sum, len(cached), system, plan),
        strategy_keys=inference_to_mapping(spec),
    )
