"""PortablePlanIR passes: cost a verified DistributedTaskIR on a system, and verify the result.

``CostDistributedTasks`` times every task of the local TP block and of the first/last-stage
extras, sums them per phase along the block's critical path (tasks of one block run in dependency
order on one GPU, so the critical path is their serial sum: Megatron runs a block's kernels on one
stream), and lays the blocks out over the pipeline stages of the typed program.

Costs per task (Calculon's per-layer model, Isaev et al. SC'23, Section 3.1):

- compute task: matrix FLOPs on the matrix engine (shape-aware efficiency for GEMMs), vector FLOPs
  on the vector engine, HBM traffic ``bytes_read + bytes_written`` at the memory efficiency,
  combined by the system's processing mode (sum or roofline max);
- collective task: the TP group's link time for its kind and bytes; every forward TP collective
  is on the critical path (exposed = link time); in backward, the input-gradient reduction and the
  sequence-parallel re-gather of a column-parallel linear overlap a GEMM (Megatron-LM's async
  backward communication, :func:`_async_backward_overlap`), unless the system's
  ``async_tp_backward_comm`` is off (Megatron-LM before September 2021: every TP collective
  exposed).

The PP P2P message is one microbatch activation ``b*s*h`` (divided by t under sequence parallelism,
Megatron's scatter-gather optimization of Narayanan et al. 2021, Section 4.1) sent once per chunk
edge in forward and once in backward, on the PP group's link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, assert_never, final

from blueprinting.analysis.stage_layout import chunk_layer_counts, fully_recomputed_blocks
from blueprinting.hardware.collectives import CollectiveKind as LinkCollective
from blueprinting.hardware.efficiency import GemmShape as HardwareGemmShape
from blueprinting.hardware.system import CommGroup, Engine, ParallelDim, SystemSpec
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.transformer import (
    FullRecompute,
    NoRecompute,
    SelectiveRecompute,
    TrainingSpec,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    AttentionShape,
    CollectivePurpose,
    GemmShape,
    Partial,
    SemanticOpName,
    Work,
    activation_bytes,
)
from blueprinting.synthesizer.stages.distributed.ir import (
    CollectiveTask,
    ComputeTask,
    DistributedTaskIR,
    Phase,
    TaskGroup,
)
from blueprinting.synthesizer.stages.portable_plan.ir import (
    BlockCost,
    ExtraCost,
    PhaseCost,
    PortablePlanIR,
    StagePlan,
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PlanContext:
    """What the costing pass needs beside the IR: the typed program and the system."""

    spec: TrainingSpec
    system: SystemSpec

    def group(self, dim: ParallelDim) -> CommGroup:
        mapping = self.spec.mapping
        return self.system.comm_group(
            dim,
            tensor=mapping.tensor_degree,
            pipeline=mapping.pipeline_degree,
            data=mapping.data_degree,
        )


def recomputed_blocks(spec: TrainingSpec, blocks_in_chunk: int) -> int:
    """Blocks of a chunk whose forward is recomputed in backward: full recompute per
    :func:`~blueprinting.analysis.stage_layout.fully_recomputed_blocks`; selective recompute
    applies to every block (its cost is the attention core only)."""
    match spec.mapping.parallelism.recompute:
        case NoRecompute():
            return 0
        case SelectiveRecompute():
            return blocks_in_chunk
        case FullRecompute(method=method, num_layers=n):
            return fully_recomputed_blocks(method, n, blocks_in_chunk)
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskGroupCosts:
    """The costed task groups of a DistributedTaskIR: block, embedding and LM-head extras."""

    block: BlockCost
    embedding: ExtraCost
    lm_head: ExtraCost


def cost_task_groups(
    ir: DistributedTaskIR, system: SystemSpec, tp_group: CommGroup, datatype: Datatype
) -> TaskGroupCosts:
    """Time every task of the IR's three groups and sum them per phase (module docstring)."""

    def phase(group: TaskGroup, *phases: Phase) -> PhaseCost:
        return _phase_cost(group, phases, system, tp_group, datatype)

    backward = (Phase.BACKWARD_ACTIVATION_GRAD, Phase.BACKWARD_WEIGHT_GRAD)
    hidden_activation, hidden_weight = (
        _async_backward_overlap(ir.block, system, tp_group, datatype)
        if system.async_tp_backward_comm
        else (0.0, 0.0)
    )
    return TaskGroupCosts(
        block=BlockCost(
            forward=phase(ir.block, Phase.FORWARD),
            backward_activation=_hide(
                phase(ir.block, Phase.BACKWARD_ACTIVATION_GRAD), hidden_activation
            ),
            backward_weight=_hide(phase(ir.block, Phase.BACKWARD_WEIGHT_GRAD), hidden_weight),
            recompute=phase(ir.block, Phase.RECOMPUTE),
        ),
        embedding=ExtraCost(
            forward=phase(ir.first_stage, Phase.FORWARD), backward=phase(ir.first_stage, *backward)
        ),
        lm_head=ExtraCost(
            forward=phase(ir.last_stage, Phase.FORWARD), backward=phase(ir.last_stage, *backward)
        ),
    )


def assemble_plan(costs: TaskGroupCosts, ctx: PlanContext) -> PortablePlanIR:
    """Lay the costed block out over the typed program's pipeline stages and add the P2P."""
    p2p_bytes, p2p_s = p2p_message(ctx)
    counts = chunk_layer_counts(ctx.spec.model, ctx.spec.mapping.parallelism.pipeline)
    stages = tuple(
        StagePlan(
            index=index,
            blocks_per_chunk=per_chunk,
            recomputed_blocks_per_chunk=tuple(
                recomputed_blocks(ctx.spec, blocks) for blocks in per_chunk
            ),
            has_embedding=index == 0,
            has_lm_head=index == len(counts) - 1,
        )
        for index, per_chunk in enumerate(counts)
    )
    return PortablePlanIR(
        block=costs.block,
        embedding=costs.embedding,
        lm_head=costs.lm_head,
        stages=stages,
        p2p_forward_s=p2p_s,
        p2p_backward_s=p2p_s,
        p2p_bytes=p2p_bytes,
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CostDistributedTasks:
    """DistributedTaskIR + (typed program, system) -> PortablePlanIR."""

    name: ClassVar[str] = "cost-distributed-tasks"

    def run(self, ir: DistributedTaskIR, ctx: PlanContext) -> PortablePlanIR:
        costs = cost_task_groups(
            ir, ctx.system, ctx.group(ParallelDim.TENSOR), ctx.spec.model.datatype
        )
        return assemble_plan(costs, ctx)


def _phase_cost(
    group: TaskGroup,
    phases: tuple[Phase, ...],
    system: SystemSpec,
    tp_group: CommGroup,
    datatype: Datatype,
) -> PhaseCost:
    compute_s = comm_s = 0.0
    flops = moved = 0
    for task in group.tasks:
        if task.phase not in phases:
            continue
        match task:
            case ComputeTask():
                compute_s += _compute_time(task, system, datatype)
                flops += task.flops
                moved += task.bytes_read + task.bytes_written
            case CollectiveTask():
                comm_s += system.collective_time(
                    LinkCollective(task.kind.value), task.bytes, tp_group
                )
            case _ as unreachable:
                assert_never(unreachable)
    return PhaseCost(
        compute_s=compute_s, comm_s=comm_s, comm_exposed_s=comm_s, flops=flops, bytes_moved=moved
    )


def p2p_message(ctx: PlanContext) -> tuple[int, float]:
    """The PP activation message (bytes) and its time on the PP link (module docstring)."""
    mapping = ctx.spec.mapping
    if mapping.pipeline_degree == 1:
        return 0, 0.0
    model = ctx.spec.model
    size = activation_bytes(model, mapping.batch.micro_batch_size)
    if mapping.sequence_parallel:
        size //= mapping.tensor_degree
    group = ctx.group(ParallelDim.PIPELINE)
    return size, ctx.system.collective_time(LinkCollective.P2P, size, group)


def _async_backward_overlap(
    group: TaskGroup, system: SystemSpec, tp_group: CommGroup, datatype: Datatype
) -> tuple[float, float]:
    """TP link time hidden behind a GEMM in backward: (activation-grad phase, weight-grad phase).

    Megatron-LM's column-parallel linear backward
    (``LinearWithGradAccumulationAndAsyncCommunication`` in
    ``megatron/core/tensor_parallel/layers.py``, on by default since Korthikanti et al. 2022's
    code, with ``CUDA_DEVICE_MAX_CONNECTIONS=1``) launches the reduction of the input gradient
    (all-reduce, or reduce-scatter with sequence parallelism) asynchronously and computes the
    weight gradient meanwhile; with sequence parallelism it also launches the re-gather of the
    input for the weight gradient before the input-gradient GEMM. Each such collective is hidden up
    to the time of the GEMM it runs beside: ``hidden = min(link time, GEMM time)``.
    Collectives that a GEMM waits on (the gather of the output gradient of a row-parallel linear)
    stay exposed.
    """
    gemm_s: dict[tuple[Phase, SemanticOpName], float] = {}
    for task in group.tasks:
        if isinstance(task, ComputeTask) and task.gemm is not None:
            key = (task.phase, task.lineage.op)
            gemm_s[key] = gemm_s.get(key, 0.0) + _compute_time(task, system, datatype)
    hidden_activation = hidden_weight = 0.0
    for task in group.tasks:
        if not isinstance(task, CollectiveTask):
            continue
        op = task.lineage.op
        if task.phase is Phase.BACKWARD_ACTIVATION_GRAD and isinstance(
            task.lineage.source, Partial
        ):
            beside = gemm_s.get((Phase.BACKWARD_WEIGHT_GRAD, op), 0.0)
            link = system.collective_time(LinkCollective(task.kind.value), task.bytes, tp_group)
            hidden_activation += min(link, beside)
        elif (
            task.phase is Phase.BACKWARD_WEIGHT_GRAD and task.purpose is CollectivePurpose.REGATHER
        ):
            beside = gemm_s.get((Phase.BACKWARD_ACTIVATION_GRAD, op), 0.0)
            link = system.collective_time(LinkCollective(task.kind.value), task.bytes, tp_group)
            hidden_weight += min(link, beside)
    return hidden_activation, hidden_weight


def _hide(phase: PhaseCost, hidden_s: float) -> PhaseCost:
    """``phase`` with ``hidden_s`` of its TP link time taken off the critical path."""
    if hidden_s == 0.0:
        return phase
    return PhaseCost(
        compute_s=phase.compute_s,
        comm_s=phase.comm_s,
        comm_exposed_s=max(0.0, phase.comm_exposed_s - hidden_s),
        flops=phase.flops,
        bytes_moved=phase.bytes_moved,
    )


def _compute_time(task: ComputeTask, system: SystemSpec, datatype: Datatype) -> float:
    """One compute task's time (module docstring)."""
    return work_time(task.work, task.gemm, system, datatype, task.attention)


def work_time(
    work: Work,
    gemm: GemmShape | None,
    system: SystemSpec,
    datatype: Datatype,
    attention: AttentionShape | None = None,
) -> float:
    """The time of one op's work on ``system``: matrix FLOPs at the GEMM shape's efficiency (a
    fused attention kernel's at its measured rate, ``SystemSpec.attention_time``) plus vector
    FLOPs, against its HBM traffic, combined by the system's processing mode. Training tasks and
    serving ops are costed by this one rule."""
    shape = (
        None if gemm is None else HardwareGemmShape(m=gemm.m, n=gemm.n, k=gemm.k, batch=gemm.batch)
    )
    if attention is None:
        flop_time = system.compute_time(work.matrix_flops, Engine.MATRIX, datatype, shape)
    else:
        s, d = attention.seq_length, attention.head_dim
        flop_time = system.attention_time(
            work.matrix_flops,
            seq_length=s,
            head_dim=d,
            datatype=datatype,
            gemm=HardwareGemmShape(m=s, n=d, k=s, batch=attention.batch_heads),
        )
    flop_time += system.compute_time(work.vector_flops, Engine.VECTOR, datatype)
    mem_time = system.memory_time(work.bytes_read + work.bytes_written)
    return system.processing_time(flop_time, mem_time)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyPortablePlan:
    """Re-checks PortablePlanIR's invariants (they also run at construction)."""

    name: ClassVar[str] = "verify-portable-plan"

    def run(self, ir: PortablePlanIR, ctx: PlanContext) -> PortablePlanIR:
        del ctx
        ir.verify()
        return ir


def build_portable_plan(ir: DistributedTaskIR, ctx: PlanContext) -> PortablePlanIR:
    """Cost then verify: the pipeline of this stage."""
    return VerifyPortablePlan().run(CostDistributedTasks().run(ir, ctx), ctx)
