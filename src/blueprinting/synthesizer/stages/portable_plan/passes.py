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
  exposed);
- with ``--tp-comm-overlap`` (:class:`~blueprinting.mapping.transformer.UserbufferOverlap`), each
  collective Transformer Engine overlaps is timed with its GEMM by :mod:`.tp_overlap` (the GEMM
  in chunks at the chunk shape's efficiency, the SMs the communication takes, the chunk that
  cannot hide), :func:`_userbuffer_overlap`; the async overlap above keeps the others.

The PP P2P message is one microbatch activation ``b*s*h`` (divided by t under sequence parallelism,
Megatron's scatter-gather optimization of Narayanan et al. 2021, Section 4.1) sent once per chunk
edge in forward and once in backward, on the PP group's link.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, TypeAlias, assert_never, final

from blueprinting.analysis.stage_layout import (
    chunk_layer_counts,
    chunk_layer_starts,
    fully_recomputed_blocks,
)
from blueprinting.errors import ConfigError, UnsupportedError
from blueprinting.hardware.collectives import CollectiveKind as LinkCollective
from blueprinting.hardware.collectives import ExchangeKernels
from blueprinting.hardware.efficiency import GemmShape as HardwareGemmShape
from blueprinting.hardware.efficiency import GemmShapeColumns, ShapeFigures
from blueprinting.hardware.ep_kernels import rates_for
from blueprinting.hardware.polymorphic import Column, Real, exact_column
from blueprinting.hardware.system import (
    CommGroup,
    Engine,
    LinkTier,
    ParallelDim,
    SystemSpec,
    held_sm_overhead,
)
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import (
    GemmFormat,
    HighPrecision,
    TrainingPrecision,
    gemm_format,
    high_precision_layers,
)
from blueprinting.mapping.transformer import (
    BulkOverlap,
    FullRecompute,
    HierarchicalAllToAllRing,
    NoRecompute,
    NoTpCommOverlap,
    PipelinedDgradReduceScatter,
    SelectiveRecompute,
    TpCommOverlap,
    TrainingSpec,
    UserbufferOverlap,
    delays_wgrad,
    dispatcher_overlaps,
    loss_stage,
    recomputed_modules,
    shared_expert_overlaps,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    COMBINE_SIDE_OPS,
    CP_A2A_AXIS,
    CP_AXIS,
    CP_P2P_AXIS,
    DISPATCH_SIDE_OPS,
    EP_AXIS,
    ETP_AXIS,
    ETP_EP_AXIS,
    ROUTED_EXPERT_OPS,
    TP_AXIS,
    AttentionShape,
    BatchedGemmCalls,
    CollectiveKind,
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
    Task,
    TaskGroup,
)
from blueprinting.synthesizer.stages.portable_plan import tp_overlap
from blueprinting.synthesizer.stages.portable_plan.ep_overlap import (
    CombinedLayerTiming,
    MoeLayerPasses,
    combined_layer_timing,
)
from blueprinting.synthesizer.stages.portable_plan.host_dispatch import (
    HostDispatch,
    host_ops,
    moe_layer_host_ops,
    moe_pass_synced,
    pass_host_exposed_s,
    training_host_dispatch,
)
from blueprinting.synthesizer.stages.portable_plan.ir import (
    NO_EXTRA,
    BlockCost,
    ExtraCost,
    PhaseCost,
    PortablePlanIR,
    StagePlan,
)
from blueprinting.synthesizer.stages.portable_plan.precision import (
    AMAX_BYTES,
    OpPrecision,
    reads_fp8_columnwise,
    sequence_shards,
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
            context=mapping.context_degree,
        )

    def gradient_group(self) -> CommGroup:
        """The d x cp group of the dense gradients (:meth:`SystemSpec.dense_gradient_group`)."""
        mapping = self.spec.mapping
        return self.system.dense_gradient_group(
            tensor=mapping.tensor_degree,
            pipeline=mapping.pipeline_degree,
            data=mapping.data_degree,
            context=mapping.context_degree,
        )

    def expert_gradient_group(self) -> CommGroup:
        """The expert-dp group of the routed experts' gradients: W / (etp ep p) ranks etp x ep
        apart (``parallel_state.py`` l.874-884; :func:`expert_groups` has the others)."""
        mapping = self.spec.mapping
        return self.system.strided_group(
            size=mapping.expert_data_degree,
            stride=mapping.expert_tensor_degree * mapping.expert_degree,
            world=mapping.world_size,
            like=ParallelDim.DATA,
        )

    def context_groups(self) -> dict[str, CommGroup]:
        """The communicator of each cp mesh axis of the DistributedTaskIR (none when cp = 1)."""
        return context_groups(self.spec, self.system)


def context_groups(spec: TrainingSpec, system: SystemSpec) -> dict[str, CommGroup]:
    """cp, and the two levels of a2a+p2p (the a2a level on consecutive cp ranks)."""
    mapping = spec.mapping
    context = mapping.parallelism.context
    if context.degree == 1:
        return {}

    def place(level: tuple[int, int] | None) -> CommGroup:
        return system.comm_group(
            ParallelDim.CONTEXT,
            tensor=mapping.tensor_degree,
            pipeline=mapping.pipeline_degree,
            data=mapping.data_degree,
            context=context.degree,
            level=level,
        )

    out = {CP_AXIS: place(None)}
    communication = context.communication
    if isinstance(communication, HierarchicalAllToAllRing):
        out[CP_A2A_AXIS] = place((communication.a2a_size, 1))
        out[CP_P2P_AXIS] = place((communication.p2p_size, communication.a2a_size))
    return out


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
    moe_block: BlockCost | None = None
    #: the MoE layer under combined 1F1B (``moe_block`` is then its steady state)
    ep_overlap: CombinedLayerTiming | None = None
    #: what a sliding-window dense / MoE layer changes against the full one
    #: (:func:`window_delta`; None: no windowed layer of that kind)
    window: BlockCost | None = None
    moe_window: BlockCost | None = None
    #: a windowed MoE layer under combined 1F1B (``ep_overlap`` is the full layer's)
    moe_window_ep_overlap: CombinedLayerTiming | None = None


def cost_task_groups(
    ir: DistributedTaskIR,
    system: SystemSpec,
    tp_group: CommGroup,
    precision: OpPrecision,
    overlap: TpCommOverlap | None = None,
    *,
    cp_groups: Mapping[str, CommGroup] | None = None,
    ep_groups: Mapping[str, CommGroup] | None = None,
    dispatch_overlap: bool = False,
    delay_wgrad: bool = False,
    shared_expert_overlap: bool = False,
    host: HostDispatch | None = None,
) -> TaskGroupCosts:
    """Time every task of the IR's groups and sum them per phase (module docstring);
    ``overlap`` is the strategy's userbuffer overlap (None: none); ``cp_groups`` /
    ``ep_groups`` the communicator of each cp / expert mesh axis (:func:`context_groups`,
    :func:`expert_groups`); ``dispatch_overlap``: ``--overlap-moe-expert-parallel-comm``
    (:func:`_overlapped_dispatch`), ``delay_wgrad``: ``--delay-wgrad-compute`` under it;
    ``shared_expert_overlap``: ``--moe-shared-expert-overlap`` (:func:`_shared_expert_overlap`);
    ``host``: what the host issues (:mod:`.host_dispatch`; None: no host time is charged)."""
    groups = {} if cp_groups is None else dict(cp_groups)
    experts = {} if ep_groups is None else dict(ep_groups)

    def phase(group: TaskGroup, *phases: Phase) -> PhaseCost:
        return _phase_cost(
            group, phases, system, tp_group, precision, cp_groups=groups, ep_groups=experts
        )

    backward = (Phase.BACKWARD_ACTIVATION_GRAD, Phase.BACKWARD_WEIGHT_GRAD)

    def block_cost(group: TaskGroup) -> BlockCost:
        ub = _userbuffer_overlap(
            group, system, tp_group, precision, NoTpCommOverlap() if overlap is None else overlap
        )
        hidden_activation, hidden_weight = (
            _async_backward_overlap(group, system, tp_group, precision, ub.handled)
            if system.async_tp_backward_comm
            else (0.0, 0.0)
        )

        def block_phase(one: Phase, async_hidden: float = 0.0) -> PhaseCost:
            return _hide(
                phase(group, one),
                async_hidden + ub.hidden_s.get(one, 0.0),
                ub.compute_delta_s.get(one, 0.0),
            )

        return BlockCost(
            forward=block_phase(Phase.FORWARD),
            backward_activation=block_phase(Phase.BACKWARD_ACTIVATION_GRAD, hidden_activation),
            backward_weight=block_phase(Phase.BACKWARD_WEIGHT_GRAD, hidden_weight),
            recompute=block_phase(Phase.RECOMPUTE),
        )

    def task_gpu_s(task: Task) -> float:
        return _task_gpu_s(task, system, tp_group, precision, cp_groups=groups, ep_groups=experts)

    def hosted(group: TaskGroup, cost: BlockCost, *, moe_layer: bool) -> BlockCost:
        if host is None:
            return cost
        return _with_host_exposure(
            group, cost, host, task_gpu_s, precision=precision, system=system, moe_layer=moe_layer
        )

    # the dense groups have no expert-axis task, so the expert communicators are not in the key
    memo = _system_memo(system)
    context_key = (tp_group, precision, tuple(sorted(groups.items())))

    def dense_block_cost(group: TaskGroup) -> BlockCost:
        key = (id(group), overlap, host.dense_key if host else None, *context_key)
        found = memo.blocks.get(key)
        if found is None or found[0] is not group:
            if len(memo.blocks) >= _MEMO_GROUPS:
                memo.blocks.clear()
            found = memo.blocks[key] = (group, hosted(group, block_cost(group), moe_layer=False))
        return found[1]

    def extra_cost(group: TaskGroup) -> ExtraCost:
        key = (id(group), *context_key)
        found = memo.extras.get(key)
        if found is None or found[0] is not group:
            cost = ExtraCost(forward=phase(group, Phase.FORWARD), backward=phase(group, *backward))
            if len(memo.extras) >= _MEMO_GROUPS:
                memo.extras.clear()
            found = memo.extras[key] = (group, cost)
        return found[1]

    def moe_cost(group: TaskGroup) -> tuple[BlockCost, CombinedLayerTiming | None]:
        """A MoE layer's cost, with combined 1F1B's steady state where it runs (and its
        timing), the shared experts' overlap and the host's issue time."""
        cost = block_cost(group)
        timing: CombinedLayerTiming | None = None
        if dispatch_overlap:
            passes = moe_layer_passes(group, cost, system, precision, experts)
            timing = combined_layer_timing(passes, delay_wgrad=delay_wgrad)
            cost = _overlapped_dispatch(cost, timing)
        if shared_expert_overlap:
            cost = _shared_expert_overlap(group, cost, task_gpu_s)
        return hosted(group, cost, moe_layer=True), timing

    block = dense_block_cost(ir.block)
    moe_block: BlockCost | None = None
    timing: CombinedLayerTiming | None = None
    if ir.moe_block is not None:
        moe_block, timing = moe_cost(ir.moe_block)
    window = moe_window = None
    window_timing: CombinedLayerTiming | None = None
    if ir.windowed_block is not None:
        window = window_delta(dense_block_cost(ir.windowed_block), block)
    if ir.windowed_moe_block is not None and moe_block is not None:
        windowed_moe, window_timing = moe_cost(ir.windowed_moe_block)
        moe_window = window_delta(windowed_moe, moe_block)
    return TaskGroupCosts(
        window=window,
        moe_window=moe_window,
        moe_window_ep_overlap=window_timing,
        ep_overlap=timing,
        block=block,
        embedding=extra_cost(ir.first_stage),
        lm_head=extra_cost(ir.last_stage),
        moe_block=moe_block,
    )


def _phase_delta(high: PhaseCost, low: PhaseCost, times: int) -> PhaseCost:
    """``times`` x (``high`` - ``low``): what running a block's phase at the base precision
    instead of the recipe's adds (a link-time term may be negative: longer GEMMs hide more)."""
    return PhaseCost(
        compute_s=times * (high.compute_s - low.compute_s),
        comm_s=times * (high.comm_s - low.comm_s),
        comm_exposed_s=times * (high.comm_exposed_s - low.comm_exposed_s),
        flops=times * (high.flops - low.flops),
        bytes_moved=times * (high.bytes_moved - low.bytes_moved),
        overlap_compute_s=times * (high.overlap_compute_s - low.overlap_compute_s),
        cp_comm_s=times * (high.cp_comm_s - low.cp_comm_s),
        cp_comm_exposed_s=times * (high.cp_comm_exposed_s - low.cp_comm_exposed_s),
        ep_comm_s=times * (high.ep_comm_s - low.ep_comm_s),
        ep_comm_exposed_s=times * (high.ep_comm_exposed_s - low.ep_comm_exposed_s),
        quantize_s=times * (high.quantize_s - low.quantize_s),
        host_exposed_s=times * (high.host_exposed_s - low.host_exposed_s),
    )


def window_delta(windowed: BlockCost, full: BlockCost) -> BlockCost:
    """A sliding-window layer's cost minus the full layer's, phase by phase, each costed whole
    (so the overlaps around the shorter attention core move with it: the host's issue time it
    no longer hides, the TP and CP exchanges, combined 1F1B's steady state). Added once per
    windowed layer of its kind to the chunk it sits in (``PortablePlanIR.window`` /
    ``moe_window``); mostly negative (the window's band is a fraction of the causal
    triangle), with the exposures it uncovers positive."""
    return BlockCost(
        forward=_phase_delta(windowed.forward, full.forward, 1),
        backward_activation=_phase_delta(windowed.backward_activation, full.backward_activation, 1),
        backward_weight=_phase_delta(windowed.backward_weight, full.backward_weight, 1),
        recompute=_phase_delta(windowed.recompute, full.recompute, 1),
    )


def _sum_phases(*phases: PhaseCost) -> PhaseCost:
    return PhaseCost(
        compute_s=sum(ph.compute_s for ph in phases),
        comm_s=sum(ph.comm_s for ph in phases),
        comm_exposed_s=sum(ph.comm_exposed_s for ph in phases),
        flops=sum(ph.flops for ph in phases),
        bytes_moved=sum(ph.bytes_moved for ph in phases),
        overlap_compute_s=sum(ph.overlap_compute_s for ph in phases),
        cp_comm_s=sum(ph.cp_comm_s for ph in phases),
        cp_comm_exposed_s=sum(ph.cp_comm_exposed_s for ph in phases),
        ep_comm_s=sum(ph.ep_comm_s for ph in phases),
        ep_comm_exposed_s=sum(ph.ep_comm_exposed_s for ph in phases),
        quantize_s=sum(ph.quantize_s for ph in phases),
        host_exposed_s=sum(ph.host_exposed_s for ph in phases),
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BaseLayerRun:
    """A run of consecutive decoder layers kept at the base precision (Megatron-LM's
    ``--first-last-layers-bf16``): the virtual chunk holding them all, ``(stage, chunk)``,
    and how many of them are MoE layers and recompute their forward."""

    stage: int
    chunk: int
    dense: int
    moe: int
    dense_recomputed: int
    moe_recomputed: int


def base_layer_runs(spec: TrainingSpec) -> tuple[BaseLayerRun | None, BaseLayerRun | None]:
    """Where the first n and the last k decoder layers of ``high_precision_layers`` run (None
    for a count of 0). Each run must lie in one virtual chunk (with a flexible layout that need
    not be the embedding's or the loss's: Megatron-Bridge's DeepSeek-V3 layout
    ``Et|(tt|)*30mL`` puts the last layer on the rank before the loss's); one that spans chunks is
    refused rather than costed on one rank. A chunk recomputes its first
    :func:`recomputed_blocks` blocks (as :func:`stage_plans` counts them)."""
    model, pipeline = spec.model, spec.mapping.parallelism.pipeline
    start, end = high_precision_layers(spec.mapping.precision)
    counts = chunk_layer_counts(model, pipeline)
    starts = chunk_layer_starts(model, pipeline)
    total = model.num_layers

    def run(first: int, n: int) -> BaseLayerRun | None:
        if n == 0:
            return None
        for stage, (row, row_starts) in enumerate(zip(counts, starts, strict=True)):
            for chunk, (count, at) in enumerate(zip(row, row_starts, strict=True)):
                if count and at <= first and first + n <= at + count:
                    recomputed = recomputed_blocks(spec, count)
                    # the chunk's recomputed layers are at .. at + recomputed - 1
                    kept_from = max(first, at)
                    rec = max(0, min(first + n, at + recomputed) - kept_from)
                    moe = model.moe_layers_in(first, n)
                    moe_rec = model.moe_layers_in(kept_from, rec) if rec else 0
                    return BaseLayerRun(
                        stage=stage,
                        chunk=chunk,
                        dense=n - moe,
                        moe=moe,
                        dense_recomputed=rec - moe_rec,
                        moe_recomputed=moe_rec,
                    )
        raise UnsupportedError(
            f"num_layers_at_start_in_bf16 = {start} / num_layers_at_end_in_bf16 = {end}: "
            f"decoder layers {first} .. {first + n - 1} span more than one virtual pipeline "
            "stage; base-precision layers split across virtual stages are not modelled"
        )

    return run(0, start), run(total - end, end)


def high_precision_layer_extras(
    costs: TaskGroupCosts, base: TaskGroupCosts | None, ctx: PlanContext
) -> tuple[ExtraCost, ExtraCost]:
    """Megatron-LM's ``--first-last-layers-bf16``: the first n and last k decoder layers run
    every GEMM at the base precision. Costed as extras of the virtual chunk holding each run
    (:func:`base_layer_runs`): its dense layers x (base block - recipe block) and its MoE
    layers x (base MoE block - recipe MoE block), the recompute phase for the ones that
    recompute. ``base`` is the block costed at the base precision (None: no such layers)."""
    first_run, last_run = base_layer_runs(ctx.spec)
    if base is None or (first_run is None and last_run is None):
        return NO_EXTRA, NO_EXTRA
    low, high = costs.block, base.block
    low_moe = costs.moe_block if costs.moe_block is not None else low
    high_moe = base.moe_block if base.moe_block is not None else high

    def extra(run: BaseLayerRun | None) -> ExtraCost:
        if run is None:
            return NO_EXTRA
        return ExtraCost(
            forward=_sum_phases(
                _phase_delta(high.forward, low.forward, run.dense),
                _phase_delta(high_moe.forward, low_moe.forward, run.moe),
            ),
            backward=_sum_phases(
                _phase_delta(high.backward_activation, low.backward_activation, run.dense),
                _phase_delta(high.backward_weight, low.backward_weight, run.dense),
                _phase_delta(high.recompute, low.recompute, run.dense_recomputed),
                _phase_delta(high_moe.backward_activation, low_moe.backward_activation, run.moe),
                _phase_delta(high_moe.backward_weight, low_moe.backward_weight, run.moe),
                _phase_delta(high_moe.recompute, low_moe.recompute, run.moe_recomputed),
            ),
        )

    return extra(first_run), extra(last_run)


def stage_plans(spec: TrainingSpec) -> tuple[StagePlan, ...]:
    """The pipeline stages of ``spec``: blocks per virtual chunk, how many of them recompute,
    how many are MoE layers, the extras. Reads only the model and the pipeline and recompute
    choices (no cost), so the vectorized search calls it once per layout."""
    model, pipeline = spec.model, spec.mapping.parallelism.pipeline
    counts = chunk_layer_counts(model, pipeline)
    starts = chunk_layer_starts(model, pipeline)

    def moe_in(start: int, count: int) -> int:
        return model.moe_layers_in(start, count)

    windows = model.windowed_layers_in(0, model.num_layers) > 0

    def windowed_split(start: int, count: int) -> tuple[int, int]:
        """(dense, MoE) sliding-window layers among ``start .. start + count - 1``."""
        moe = model.windowed_moe_layers_in(start, count)
        return model.windowed_layers_in(start, count) - moe, moe

    first_run, last_run = base_layer_runs(spec)

    def stage_plan(index: int, per_chunk: tuple[int, ...]) -> StagePlan:
        recomputed = tuple(recomputed_blocks(spec, blocks) for blocks in per_chunk)
        moe: tuple[int, ...] = ()
        moe_recomputed: tuple[int, ...] = ()
        if model.moe is not None:
            # recompute re-runs the first r blocks of a chunk (all of them but under
            # recompute_method=block, fully_recomputed_blocks)
            moe = tuple(moe_in(a, n) for a, n in zip(starts[index], per_chunk, strict=True))
            moe_recomputed = tuple(
                moe_in(a, r) for a, r in zip(starts[index], recomputed, strict=True)
            )
        windowed: tuple[int, ...] = ()
        windowed_recomputed: tuple[int, ...] = ()
        moe_windowed: tuple[int, ...] = ()
        moe_windowed_recomputed: tuple[int, ...] = ()
        if windows:
            # a chunk's windowed layers by kind, and those among the first r it recomputes
            held = [windowed_split(a, n) for a, n in zip(starts[index], per_chunk, strict=True)]
            rerun = [windowed_split(a, r) for a, r in zip(starts[index], recomputed, strict=True)]
            windowed = tuple(dense for dense, _ in held)
            moe_windowed = tuple(moe for _, moe in held)
            windowed_recomputed = tuple(dense for dense, _ in rerun)
            moe_windowed_recomputed = tuple(moe for _, moe in rerun)
        return StagePlan(
            index=index,
            blocks_per_chunk=per_chunk,
            recomputed_blocks_per_chunk=recomputed,
            windowed_blocks_per_chunk=windowed,
            windowed_recomputed_per_chunk=windowed_recomputed,
            moe_windowed_per_chunk=moe_windowed,
            moe_windowed_recomputed_per_chunk=moe_windowed_recomputed,
            has_embedding=index == 0,
            has_lm_head=index == loss_stage(pipeline.schedule, len(counts)),
            moe_blocks_per_chunk=moe,
            moe_recomputed_per_chunk=moe_recomputed,
            first_layers_chunk=(
                first_run.chunk if first_run is not None and first_run.stage == index else None
            ),
            last_layers_chunk=(
                last_run.chunk if last_run is not None and last_run.stage == index else None
            ),
        )

    return tuple(stage_plan(index, per_chunk) for index, per_chunk in enumerate(counts))


def mtp_extra(costs: TaskGroupCosts, ctx: PlanContext) -> ExtraCost:
    """What the ``mtp_num_layers`` multi-token-prediction depths add on the loss's stage per
    micro-batch (Megatron-Core ``MultiTokenPredictionLayer``; the default placement, shared
    reference section 2.11): each runs one decoder layer of the last layer's kind and one more
    LM head and loss, forward and backward. Its ``eh_proj`` (a 2h -> h GEMM per token, about
    1/30 of a DeepSeek-V3 MoE layer's FLOPs) and norms are not costed."""
    model = ctx.spec.model
    n = model.mtp_num_layers
    if n == 0:
        return NO_EXTRA
    last_moe = model.mtp_layer_is_moe and costs.moe_block is not None
    layer = costs.moe_block if last_moe and costs.moe_block is not None else costs.block
    forward = _sum_phases(layer.forward, costs.lm_head.forward)
    backward = _sum_phases(layer.backward_activation, layer.backward_weight, costs.lm_head.backward)
    return ExtraCost(forward=forward.scaled(n), backward=backward.scaled(n))


def assemble_plan(
    costs: TaskGroupCosts, ctx: PlanContext, base: TaskGroupCosts | None = None
) -> PortablePlanIR:
    """Lay the costed block out over the typed program's pipeline stages and add the P2P;
    ``base``: the block at the base precision, for the layers a recipe keeps there."""
    p2p_bytes, p2p_s = p2p_message(ctx)
    first_layers, last_layers = high_precision_layer_extras(costs, base, ctx)
    stages = stage_plans(ctx.spec)
    return PortablePlanIR(
        window=costs.window,
        moe_window=costs.moe_window,
        moe_window_ep_overlap=costs.moe_window_ep_overlap,
        moe_block=costs.moe_block,
        ep_overlap=costs.ep_overlap,
        mtp=mtp_extra(costs, ctx),
        block=costs.block,
        embedding=costs.embedding,
        lm_head=costs.lm_head,
        first_layers=first_layers,
        last_layers=last_layers,
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
        def costed(recipe: TrainingPrecision) -> TaskGroupCosts:
            return cost_task_groups(
                ir,
                ctx.system,
                ctx.group(ParallelDim.TENSOR),
                OpPrecision(
                    datatype=ctx.spec.model.datatype,
                    recipe=recipe,
                    sequence_shards=sequence_shards(ctx.spec.mapping.parallelism.tensor),
                    recomputed=recomputed_modules(ctx.spec.mapping.parallelism.recompute),
                ),
                ctx.spec.mapping.tp_comm_overlap,
                cp_groups=ctx.context_groups(),
                ep_groups=expert_groups(ctx.spec, ctx.system),
                dispatch_overlap=dispatcher_overlaps(
                    ctx.spec.mapping.parallelism.experts.dispatcher
                ),
                delay_wgrad=delays_wgrad(ctx.spec.mapping.parallelism.experts.dispatcher),
                shared_expert_overlap=shared_expert_overlaps(
                    ctx.spec.mapping.parallelism.experts.dispatcher
                ),
                host=training_host_dispatch(
                    ctx.spec.model,
                    ctx.spec.mapping.cuda_graphs,
                    ctx.system,
                    dispatcher=ctx.spec.mapping.parallelism.experts.dispatcher,
                ),
            )

        precision = ctx.spec.mapping.precision
        base = costed(HighPrecision()) if any(high_precision_layers(precision)) else None
        return assemble_plan(costed(precision), ctx, base)


def _phase_cost(
    group: TaskGroup,
    phases: tuple[Phase, ...],
    system: SystemSpec,
    tp_group: CommGroup,
    precision: OpPrecision,
    *,
    cp_groups: Mapping[str, CommGroup],
    ep_groups: Mapping[str, CommGroup] | None = None,
) -> PhaseCost:
    experts = {} if ep_groups is None else ep_groups
    compute_s = comm_s = cp_s = cp_exposed_s = ep_s = quantize_s = 0.0
    memo = _system_memo(system)
    flops = moved = 0
    attention_s: dict[Phase, float] = {}
    for task in group.tasks:
        if task.phase not in phases or not isinstance(task, ComputeTask):
            continue
        if task.lineage.op is SemanticOpName.CORE_ATTENTION:
            attention_s[task.phase] = (
                attention_s.get(task.phase, 0.0) + _compute_row(task, memo, precision)[0]
            )
    for task in group.tasks:
        if task.phase not in phases:
            continue
        match task:
            case ComputeTask(work=work):
                time, quantized = _compute_row(task, memo, precision)
                comm_s += _amax_reduction_s(task, system, tp_group, precision)
                compute_s += time
                flops += work.matrix_flops + work.vector_flops
                moved += work.bytes_read + work.bytes_written
                if quantized:
                    quantize = precision.quantize_time(system, quantized)
                    compute_s += quantize
                    quantize_s += quantize
                    moved += round(quantized)
            case CollectiveTask(axis=axis) if axis in experts:
                ep_s += _dispatch_time(task, system, experts[axis])
            case CollectiveTask(axis=axis) if axis in cp_groups:
                link, exposed = _exchange_time(
                    task, system, cp_groups[axis], attention_s.get(task.phase, 0.0)
                )
                cp_s += link
                cp_exposed_s += exposed
            case CollectiveTask():
                comm_s += _tp_link_s(task, system, tp_group, precision)
            case _ as unreachable:
                assert_never(unreachable)
    return PhaseCost(
        compute_s=compute_s,
        comm_s=comm_s,
        comm_exposed_s=comm_s,
        flops=flops,
        bytes_moved=moved,
        cp_comm_s=cp_s,
        cp_comm_exposed_s=cp_exposed_s,
        ep_comm_s=ep_s,
        ep_comm_exposed_s=ep_s,
        quantize_s=quantize_s,
    )


def _tp_link_s(
    task: CollectiveTask, system: SystemSpec, tp_group: CommGroup, precision: OpPrecision
) -> float:
    """A TP collective's link time, at the bytes the recipe moves
    (:meth:`OpPrecision.collective_bytes`): what every costing of a TP collective reads."""
    return system.collective_time(
        LinkCollective(task.kind.value), precision.collective_bytes(task), tp_group
    )


def _amax_reduction_s(
    task: ComputeTask, system: SystemSpec, tp_group: CommGroup, precision: OpPrecision
) -> float:
    """The TP amax all-reduces a TE linear's cast waits for (:meth:`OpPrecision.
    amax_reductions`): latency-bound collectives of one fp32, on the critical path."""
    if task.gemm is None or task.attention is not None:
        return 0.0
    count = precision.amax_reductions(task.lineage.op, task.phase)
    if count == 0:
        return 0.0
    return count * system.collective_time(LinkCollective.ALL_REDUCE, AMAX_BYTES, tp_group)


def _task_gpu_s(
    task: Task,
    system: SystemSpec,
    tp_group: CommGroup,
    precision: OpPrecision,
    *,
    cp_groups: Mapping[str, CommGroup],
    ep_groups: Mapping[str, CommGroup],
) -> float:
    """One task's time on the GPU, by the formulas :func:`_phase_cost` sums (a collective's
    whole link time; the host model scales the pass to its critical path)."""
    match task:
        case ComputeTask():
            time, quantized = _compute_row(task, _system_memo(system), precision)
            if quantized:
                time += system.memory_time(quantized)
            return time + _amax_reduction_s(task, system, tp_group, precision)
        case CollectiveTask(axis=axis) if axis in ep_groups:
            return _dispatch_time(task, system, ep_groups[axis])
        case CollectiveTask(axis=axis) if axis in cp_groups:
            return _exchange_time(task, system, cp_groups[axis], 0.0)[0]
        case CollectiveTask():
            return _tp_link_s(task, system, tp_group, precision)
        case _ as unreachable:
            assert_never(unreachable)


def _with_host_exposure(
    group: TaskGroup,
    cost: BlockCost,
    host: HostDispatch,
    task_gpu_s: Callable[[Task], float],
    *,
    precision: OpPrecision,
    system: SystemSpec,
    moe_layer: bool,
) -> BlockCost:
    """``cost`` with the host issue time each pass exposes (:mod:`.host_dispatch`): the
    forward, the backward (its data- and weight-gradient phases issued as one pass, booked on
    the data-gradient phase) and the recompute. A MoE layer's tasks issue the kernels
    :func:`moe_layer_host_ops` counts, the grouped GEMMs' per-split casts where the same
    :meth:`OpPrecision.quantized_bytes` that times them says they quantize."""
    memo = _system_memo(system)

    def quantized(task: ComputeTask) -> bool:
        # the bytes the phase costs read (_compute_row), so one rule says which GEMM casts
        return _compute_row(task, memo, precision)[1] > 0

    task_ops = (
        moe_layer_host_ops(group, host.moe, quantized)
        if moe_layer and host.moe is not None
        else host_ops
    )

    def exposed(phases: tuple[Phase, ...], gpu_s: float) -> float:
        tasks = [t for t in group.tasks if t.phase in phases]
        synced = moe_layer and moe_pass_synced(group, phases[0], host)
        return pass_host_exposed_s(
            tasks, gpu_s, task_gpu_s, host, moe_layer=moe_layer, synced=synced, task_ops=task_ops
        )

    fw, agrad, wgrad, recompute = (
        cost.forward,
        cost.backward_activation,
        cost.backward_weight,
        cost.recompute,
    )
    backward = exposed(
        (Phase.BACKWARD_ACTIVATION_GRAD, Phase.BACKWARD_WEIGHT_GRAD),
        agrad.critical_path_s + wgrad.critical_path_s,
    )
    return BlockCost(
        forward=replace(fw, host_exposed_s=exposed((Phase.FORWARD,), fw.critical_path_s)),
        backward_activation=replace(agrad, host_exposed_s=backward),
        backward_weight=wgrad,
        recompute=replace(
            recompute,
            host_exposed_s=exposed((Phase.RECOMPUTE,), recompute.critical_path_s),
        ),
    )


def _dispatch_time(task: CollectiveTask, system: SystemSpec, group: CommGroup) -> float:
    """A MoE layer's dispatch / combine: a flex library's exchange inside one NVLink domain at
    its measured rate (:func:`_measured_flex_time`), else all-to-alls with the hierarchical cost
    (:meth:`SystemSpec.all_to_all_time`; forwarded once per remote NVLink domain under DeepEP,
    :meth:`SystemSpec.forwarded_all_to_all_time`), the etp / etp x ep gathers on the
    ring model."""
    if task.kind is CollectiveKind.ALL_TO_ALL:
        measured = _measured_flex_time(task, system, group)
        if measured is not None:
            return measured
        if task.forwarding is not None:
            return system.forwarded_all_to_all_time(
                task.bytes,
                group,
                fanout=task.forwarding.fanout,
                replicas=task.forwarding.replicas,
            )
        # a flex dispatcher's library moves its bytes, the alltoall dispatcher NCCL's p2p
        kernels = ExchangeKernels.NCCL if task.flex is None else ExchangeKernels.LIBRARY
        return system.all_to_all_time(task.bytes, group, kernels)
    return system.collective_time(LinkCollective(task.kind.value), task.bytes, group)


def _measured_flex_time(task: CollectiveTask, system: SystemSpec, group: CommGroup) -> float | None:
    """A flex dispatcher's exchange inside one NVLink domain, at its library's measured rate
    for the group's size (:class:`~blueprinting.hardware.ep_kernels.EpKernelRates`: bytes one
    rank receives over the measured algorithm bandwidth); None where the node has no table for
    the library, the group is smaller than the smallest measured one, or it leaves the domain
    (the link model then times it)."""
    if task.flex is None or group.size == 1 or group.tier is not LinkTier.INTRA_NODE:
        return None
    rates = rates_for(system.node.ep_kernels, task.flex.backend)
    if rates is None or not rates.covers(group.size):
        return None
    return task.bytes / rates.bytes_per_s(task.flex.leg, group.size)


def expert_groups(spec: TrainingSpec, system: SystemSpec) -> dict[str, CommGroup]:
    """The communicator of each expert mesh axis (none for a dense model): etp, ep and etp x ep
    on the expert grid's strides (:meth:`SystemSpec.strided_group`)."""
    mapping = spec.mapping
    if spec.model.moe is None:
        return {}
    u, e, world = mapping.expert_tensor_degree, mapping.expert_degree, mapping.world_size
    return {
        ETP_AXIS: system.strided_group(size=u, stride=1, world=world, like=ParallelDim.TENSOR),
        EP_AXIS: system.strided_group(size=e, stride=u, world=world, like=ParallelDim.DATA),
        ETP_EP_AXIS: system.strided_group(size=u * e, stride=1, world=world, like=ParallelDim.DATA),
    }


#: the lineage of the exchanges that deliver the experts' input (the first op after them)
_DISPATCH_LINEAGE = frozenset({SemanticOpName.MOE_SORT_CHUNKS, SemanticOpName.EXPERT_FC1})


def moe_layer_passes(
    group: TaskGroup,
    block: BlockCost,
    system: SystemSpec,
    precision: OpPrecision,
    ep_groups: Mapping[str, CommGroup],
) -> MoeLayerPasses:
    """A costed MoE layer split into combined 1F1B's nodes (:mod:`.ep_overlap`): the routed
    experts' GEMMs and activation are the ``mlp`` node; the exchanges whose lineage is the
    first expert GEMM the dispatch, the others (and the unpermute) the combine; everything else
    of the phase's critical path (shared experts included: their weight gradient runs in the
    attention node's ``backward_dw``, ``models/common/utils.py`` l.400-411 @d98e8a64) the
    ``pre_dispatch_computation`` node, the recompute with the backward's."""
    experts: dict[Phase, float] = {}
    unpermute: dict[Phase, float] = {}
    dispatch: dict[Phase, float] = {}
    combine: dict[Phase, float] = {}
    held = max(
        (
            task.flex.sms
            for task in group.tasks
            if isinstance(task, CollectiveTask) and task.flex is not None and task.flex.sms
        ),
        default=0,
    )
    nccl_exchange = any(
        isinstance(task, CollectiveTask)
        and task.axis in ep_groups
        and task.flex is None
        and task.kind is CollectiveKind.ALL_TO_ALL
        for task in group.tasks
    )
    if nccl_exchange:
        # the alltoall dispatcher's exchange: NCCL's send / receive kernel's thread blocks
        held = max(held, system.runtime.nccl_p2p_ctas or 0)
    sm_count = system.accelerator.sm_count
    if sm_count is not None and held >= sm_count:
        who = "NCCL's all-to-all" if nccl_exchange else "the flex dispatcher's"
        raise ConfigError(
            [
                f"{who} kernels hold {held} SMs, {system.accelerator.name} has "
                f"{sm_count}: nothing would be left for the compute they overlap"
            ]
        )
    for task in group.tasks:
        match task:
            case ComputeTask(lineage=lineage) if lineage.op in ROUTED_EXPERT_OPS:
                experts[task.phase] = experts.get(task.phase, 0.0) + _compute_time(
                    task, system, precision
                )
            case ComputeTask(lineage=lineage) if lineage.op is SemanticOpName.MOE_UNPERMUTE:
                unpermute[task.phase] = unpermute.get(task.phase, 0.0) + _compute_time(
                    task, system, precision
                )
            case CollectiveTask(axis=axis) if axis in ep_groups:
                side = dispatch if task.lineage.op in _DISPATCH_LINEAGE else combine
                side[task.phase] = side.get(task.phase, 0.0) + _dispatch_time(
                    task, system, ep_groups[axis]
                )
            case ComputeTask() | CollectiveTask():
                pass
            case _ as unreachable:
                assert_never(unreachable)
    fw, agrad, wgrad = Phase.FORWARD, Phase.BACKWARD_ACTIVATION_GRAD, Phase.BACKWARD_WEIGHT_GRAD

    def attention(cost: PhaseCost, phase: Phase) -> float:
        rest = experts.get(phase, 0.0) + unpermute.get(phase, 0.0)
        return max(0.0, cost.critical_path_s - cost.ep_comm_exposed_s - rest)

    return MoeLayerPasses(
        forward_attention_s=attention(block.forward, fw),
        forward_dispatch_s=dispatch.get(fw, 0.0),
        forward_experts_s=experts.get(fw, 0.0),
        forward_combine_s=combine.get(fw, 0.0) + unpermute.get(fw, 0.0),
        backward_combine_s=combine.get(agrad, 0.0)
        + combine.get(wgrad, 0.0)
        + unpermute.get(agrad, 0.0)
        + unpermute.get(wgrad, 0.0),
        backward_experts_dgrad_s=experts.get(agrad, 0.0),
        backward_experts_wgrad_s=experts.get(wgrad, 0.0),
        backward_dispatch_s=dispatch.get(agrad, 0.0) + dispatch.get(wgrad, 0.0),
        backward_attention_dgrad_s=attention(block.backward_activation, agrad)
        + block.recompute.critical_path_s,
        backward_attention_wgrad_s=attention(block.backward_weight, wgrad),
        exchange_sm_share=0.0 if sm_count is None else held / sm_count,
    )


def _overlapped_dispatch(block: BlockCost, timing: CombinedLayerTiming) -> BlockCost:
    """``--overlap-moe-expert-parallel-comm`` (Megatron-Core ``combined_1f1b.py``): the MoE
    layer in combined 1F1B's steady state, one micro-batch's forward co-scheduled with
    another's backward in Megatron's op order (:func:`.ep_overlap.combined_layer_timing`); the
    exposed part of the exchanges is booked in the forward and the backward in proportion to
    their link time (the backward's over its two phases the same way). The warm-up forwards
    and cool-down backwards, which run alone, are iteration analysis's
    (``iteration.unpaired_ep_exposed``)."""
    fw, agrad, wgrad = block.forward, block.backward_activation, block.backward_weight
    bw_ep = agrad.ep_comm_exposed_s + wgrad.ep_comm_exposed_s
    fw_exposed = timing.forward_exposed_s
    bw_exposed = timing.backward_exposed_s
    share = agrad.ep_comm_exposed_s / bw_ep if bw_ep > 0 else 1.0
    return BlockCost(
        forward=replace(fw, ep_comm_exposed_s=fw_exposed),
        backward_activation=replace(agrad, ep_comm_exposed_s=bw_exposed * share),
        backward_weight=replace(wgrad, ep_comm_exposed_s=bw_exposed * (1.0 - share)),
        recompute=block.recompute,
    )


#: The shared experts' compute tasks, which ``--moe-shared-expert-overlap`` issues on a side
#: stream.
SHARED_EXPERT_OPS: frozenset[SemanticOpName] = frozenset(
    {
        SemanticOpName.SHARED_EXPERT_UP,
        SemanticOpName.SHARED_EXPERT_ACTIVATION,
        SemanticOpName.SHARED_EXPERT_DOWN,
    }
)


def _shared_expert_overlap(
    group: TaskGroup, block: BlockCost, task_gpu_s: Callable[[Task], float]
) -> BlockCost:
    """``--moe-shared-expert-overlap`` (Megatron-LM ``moe/shared_experts.py`` and
    ``moe/token_dispatcher.py`` @d98e8a64): the shared experts run on their own stream, FC1 and
    the activation beside the dispatch all-to-all, FC2 beside the combine; in the backward
    autograd runs them on that stream again, ordered so that the exchanges launch first
    (``_BackwardStreamWait``, ``set_tensor_grad_fn_sequence_sr``): FC2's backward beside the
    combine's (``dcombine``), FC1's and the activation's beside the dispatch's (``ddispatch``).
    Each pair hides ``min(its shared compute, its exchange)`` of the exchange, within the
    phase's exposed exchange time (the backward's over both backward phases, the activation
    gradient's first); the compute stays on the critical path. Not modelled: the shared
    experts' own TP all-gather and reduce-scatter, which Megatron issues on the same stream
    (priced as Transformer Engine's)."""
    fc2 = frozenset({SemanticOpName.SHARED_EXPERT_DOWN})
    fc1 = SHARED_EXPERT_OPS - fc2

    def shared_s(phases: tuple[Phase, ...], ops: frozenset[SemanticOpName]) -> float:
        return sum(
            task_gpu_s(task)
            for task in group.compute_tasks()
            if task.phase in phases and task.lineage.op in ops
        )

    def exchange_s(phases: tuple[Phase, ...], side: frozenset[SemanticOpName]) -> float:
        return sum(
            task_gpu_s(task)
            for task in group.collective_tasks()
            if task.phase in phases
            and task.purpose is CollectivePurpose.TOKEN_DISPATCH
            and task.lineage.op in side
        )

    def hidden(phases: tuple[Phase, ...]) -> float:
        return min(shared_s(phases, fc1), exchange_s(phases, DISPATCH_SIDE_OPS)) + min(
            shared_s(phases, fc2), exchange_s(phases, COMBINE_SIDE_OPS)
        )

    forward, agrad, wgrad = block.forward, block.backward_activation, block.backward_weight
    hidden_fw = min(hidden((Phase.FORWARD,)), forward.ep_comm_exposed_s)
    backward_exposed = agrad.ep_comm_exposed_s + wgrad.ep_comm_exposed_s
    hidden_bw = min(
        hidden((Phase.BACKWARD_ACTIVATION_GRAD, Phase.BACKWARD_WEIGHT_GRAD)), backward_exposed
    )
    hidden_agrad = min(hidden_bw, agrad.ep_comm_exposed_s)
    return BlockCost(
        forward=replace(forward, ep_comm_exposed_s=forward.ep_comm_exposed_s - hidden_fw),
        backward_activation=replace(
            agrad, ep_comm_exposed_s=agrad.ep_comm_exposed_s - hidden_agrad
        ),
        backward_weight=replace(
            wgrad, ep_comm_exposed_s=wgrad.ep_comm_exposed_s - (hidden_bw - hidden_agrad)
        ),
        recompute=block.recompute,
    )


def _exchange_time(
    task: CollectiveTask, system: SystemSpec, group: CommGroup, attention_s: float
) -> tuple[float, float]:
    """(link time, exposed time) of one context-parallel exchange.

    A ring of P2P steps (``p2p``, and the ring level of ``a2a+p2p``) runs step i's send /
    receive on a side stream while the attention of the chunk already held computes: with the
    phase's attention split evenly over the ring's ``steps + 1`` chunks, each step exposes
    ``max(0, step link - step attention)`` (TE ``context_parallel.py`` l.1698-1720; the
    derivation in ``shared/reference/modern_parallelism.md`` section 1.3). All-gathers,
    reduce-scatters and all-to-alls are exposed whole (TE: "the all-gather is not async"; the
    a2a's cp stream overlaps only re-ordering). The hidden part of a ring step still holds NCCL's
    send / receive thread blocks (:meth:`SystemSpec.p2p_ring_step_ctas`), so the attention
    beside it runs on the other SMs: ``f / (1 - f)`` x the hidden time is exposed too, the rule
    of the data-parallel collectives (:func:`blueprinting.analysis.data_parallel.
    sm_contention_s`)."""
    step = system.collective_time(LinkCollective(task.kind.value), task.bytes, group)
    link = task.steps * step
    if task.kind is CollectiveKind.P2P:
        per_chunk = attention_s / (task.steps + 1)
        unhidden = task.steps * max(0.0, step - per_chunk)
        return link, unhidden + _ring_sm_overhead(system, group) * (link - unhidden)
    return link, link


def _ring_sm_overhead(system: SystemSpec, group: CommGroup) -> float:
    """``f / (1 - f)``, ``f`` the SMs a CP ring step's NCCL kernel holds; 0 where unknown."""
    return held_sm_overhead(system.p2p_ring_step_ctas(group), system.accelerator.sm_count)


def p2p_message(ctx: PlanContext) -> tuple[int, float]:
    """The PP activation message (bytes) and its time on the PP link (module docstring)."""
    mapping = ctx.spec.mapping
    if mapping.pipeline_degree == 1:
        return 0, 0.0
    model = ctx.spec.model
    size = activation_bytes(model, mapping.batch.micro_batch_size, mapping.context_degree)
    if mapping.sequence_parallel:
        size //= mapping.tensor_degree
    group = ctx.group(ParallelDim.PIPELINE)
    return size, ctx.system.collective_time(LinkCollective.P2P, size, group)


#: The four linears whose TP collectives Transformer Engine's userbuffers carry (Megatron
#: ``ub_name`` qkv, proj, fc1, fc2; ``megatron/core/extensions/transformer_engine.py``
#: l.1176-1186 @d98e8a64): column-parallel and row-parallel.
_UB_COLUMN = frozenset({SemanticOpName.QKV_PROJECTION, SemanticOpName.MLP_UP})
_UB_ROW = frozenset({SemanticOpName.OUTPUT_PROJECTION, SemanticOpName.MLP_DOWN})


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class UserbufferCosts:
    """What the userbuffer overlap changes per phase: the link time it hides, the change of the
    GEMMs' time (chunking and SM share), and the collectives it took over (by task id)."""

    hidden_s: dict[Phase, float]
    compute_delta_s: dict[Phase, float]
    handled: frozenset[str]


def _userbuffer_overlap(
    group: TaskGroup,
    system: SystemSpec,
    tp_group: CommGroup,
    precision: OpPrecision,
    overlap: TpCommOverlap,
) -> UserbufferCosts:
    """Each collective of the block that ``overlap`` hands to TE's userbuffers, timed with its
    GEMM by :mod:`.tp_overlap` (TE ``module/base.py`` l.336-396 @d0067d0d per GEMM class):

    - forward and recompute: the all-gather before qkv / fc1 as a ring exchange in t chunks
      (``all_gather``), the reduce-scatter after proj / fc2 pipelined (``reduce_scatter``);
    - activation gradient: the all-gather of the output gradient before the proj / fc2 dgrad as
      a ring exchange (``all_gather``); the reduce-scatter of the qkv / fc1 input gradient bulk
      beside their wgrad GEMM (``BulkOverlap.wgrad``) or pipelined behind their dgrad GEMM
      (``PipelinedDgradReduceScatter``);
    - weight gradient: the re-gather of the qkv / fc1 input bulk beside their dgrad GEMM
      (``BulkOverlap.dgrad``).

    A GEMM's chunk is its work and its row count m divided by the chunk count, timed by
    :func:`work_time` at that shape. The hidden link time is booked in the collective's phase,
    the GEMM's change in the GEMM's phase.
    """
    empty = UserbufferCosts(hidden_s={}, compute_delta_s={}, handled=frozenset())
    match overlap:
        case NoTpCommOverlap():
            return empty
        case UserbufferOverlap():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    gemms: dict[tuple[Phase, SemanticOpName], ComputeTask] = {
        (task.phase, task.lineage.op): task
        for task in group.tasks
        if isinstance(task, ComputeTask) and task.gemm is not None
    }
    t = tp_group.size
    sm_count = system.accelerator.sm_count
    ring_u = tp_overlap.sm_fraction(tp_overlap.RING_EXCHANGE_SMS, sm_count)
    pipe_u = tp_overlap.sm_fraction(tp_overlap.PIPELINE_SMS, sm_count)
    column = overlap.column_backward
    hidden: dict[Phase, float] = {}
    delta: dict[Phase, float] = {}
    handled: set[str] = set()
    for task in group.tasks:
        if not isinstance(task, CollectiveTask) or task.axis != TP_AXIS:
            continue
        op, phase = task.lineage.op, task.phase
        kind, purpose = task.kind, task.purpose
        method: Callable[[ComputeTask, float], tp_overlap.OverlappedTime] | None = None
        gemm_phase = phase
        forward = phase in (Phase.FORWARD, Phase.RECOMPUTE)
        gather = kind is CollectiveKind.ALL_GATHER
        scatter = kind is CollectiveKind.REDUCE_SCATTER
        boundary = purpose is CollectivePurpose.BOUNDARY
        if forward and boundary and gather and op in _UB_COLUMN and overlap.all_gather:
            method = _ring(system, precision, t, ring_u)
        elif forward and boundary and scatter and op in _UB_ROW and overlap.reduce_scatter:
            method = _pipelined(system, precision, overlap.reduce_scatter_splits, pipe_u)
        elif phase is Phase.BACKWARD_ACTIVATION_GRAD and boundary and op in _UB_ROW and gather:
            method = _ring(system, precision, t, ring_u) if overlap.all_gather else None
        elif phase is Phase.BACKWARD_ACTIVATION_GRAD and boundary and op in _UB_COLUMN and scatter:
            match column:
                case BulkOverlap(wgrad=wgrad):
                    gemm_phase = Phase.BACKWARD_WEIGHT_GRAD
                    method = _bulk(system, precision, pipe_u) if wgrad else None
                case PipelinedDgradReduceScatter(splits=splits):
                    method = _pipelined(system, precision, splits, pipe_u)
                case _ as unreachable_column:
                    assert_never(unreachable_column)
        elif (
            phase is Phase.BACKWARD_WEIGHT_GRAD
            and purpose is CollectivePurpose.REGATHER
            and op in _UB_COLUMN
            and isinstance(column, BulkOverlap)
            and column.dgrad
        ):
            gemm_phase = Phase.BACKWARD_ACTIVATION_GRAD
            method = _bulk(system, precision, pipe_u)
        gemm = gemms.get((gemm_phase, op))
        if method is None or gemm is None:
            continue
        link = _tp_link_s(task, system, tp_group, precision)
        timed = method(gemm, link)
        handled.add(task.id)
        hidden[phase] = hidden.get(phase, 0.0) + link - timed.exposed_s
        plain = _compute_time(gemm, system, precision)
        delta[gemm_phase] = delta.get(gemm_phase, 0.0) + timed.compute_s - plain
        if phase is Phase.BACKWARD_ACTIVATION_GRAD and gather:
            delta[phase] = delta.get(phase, 0.0) + _userbuffer_recast_s(gemm, system, precision)
    return UserbufferCosts(hidden_s=hidden, compute_delta_s=delta, handled=frozenset(handled))


def _userbuffer_recast_s(gemm: ComputeTask, system: SystemSpec, precision: OpPrecision) -> float:
    """The second cast pass an MXFP8 output gradient takes when userbuffers gather it: TE
    quantizes it rowwise only for the dgrad all-gather (one usage at a time through
    userbuffers) and quantizes the high-precision gradient again, columnwise, into the wgrad
    buffer ("we can't convert row-scaled MXFP8 to column-scaled"; TransformerEngine@d0067d0d
    ``pytorch/module/linear.py`` l.905-910 and l.1185-1210). Both usages' writes are the cast's
    own (:meth:`.precision.OpPrecision.quantized_bytes`); this is the second read of the rank's
    rows, the elements that cast covers (:meth:`.precision.OpPrecision.quantized_elements`).
    0 for every other recipe (per-tensor FP8 transposes its gathered rowwise copy)."""
    if gemm_format(precision.recipe) is not GemmFormat.MXFP8 or gemm.gemm is None:
        return 0.0
    rows = precision.quantized_elements(gemm.lineage.op, gemm.phase, gemm.gemm)
    return precision.quantize_time(system, rows * precision.datatype.bytes)


def chunk_time(task: ComputeTask, chunks: int, system: SystemSpec, precision: OpPrecision) -> float:
    """One of ``chunks`` equal row-chunks of a GEMM task: its work and m divided by ``chunks``,
    at the chunk shape's efficiency."""
    gemm = task.gemm
    assert gemm is not None  # only GEMM tasks are chunked (_userbuffer_overlap selects them)
    w = task.work
    part = Work(
        matrix_flops=w.matrix_flops // chunks,
        vector_flops=w.vector_flops // chunks,
        bytes_read=w.bytes_read // chunks,
        bytes_written=w.bytes_written // chunks,
    )
    shape = replace(gemm, m=max(1, gemm.m // chunks))
    return work_time(
        part,
        shape,
        system,
        precision.datatype,
        gemm_format=precision.gemm_format(task.lineage.op, is_gemm=True),
    )


def _ring(
    system: SystemSpec, precision: OpPrecision, chunks: int, u: float
) -> Callable[[ComputeTask, float], tp_overlap.OverlappedTime]:
    def timed(gemm: ComputeTask, link: float) -> tp_overlap.OverlappedTime:
        chunk = chunk_time(gemm, chunks, system, precision)
        return tp_overlap.ring_exchange(chunk_s=chunk, link_s=link, chunks=chunks, sm_fraction=u)

    return timed


def _pipelined(
    system: SystemSpec, precision: OpPrecision, splits: int, u: float
) -> Callable[[ComputeTask, float], tp_overlap.OverlappedTime]:
    def timed(gemm: ComputeTask, link: float) -> tp_overlap.OverlappedTime:
        chunk = chunk_time(gemm, splits, system, precision)
        return tp_overlap.pipelined_reduce_scatter(
            chunk_s=chunk, link_s=link, splits=splits, sm_fraction=u
        )

    return timed


def _bulk(
    system: SystemSpec, precision: OpPrecision, u: float
) -> Callable[[ComputeTask, float], tp_overlap.OverlappedTime]:
    def timed(gemm: ComputeTask, link: float) -> tp_overlap.OverlappedTime:
        return tp_overlap.bulk(
            gemm_s=_compute_time(gemm, system, precision), link_s=link, sm_fraction=u
        )

    return timed


def _async_backward_overlap(
    group: TaskGroup,
    system: SystemSpec,
    tp_group: CommGroup,
    precision: OpPrecision,
    handled: frozenset[str] = frozenset(),
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
            gemm_s[key] = gemm_s.get(key, 0.0) + _compute_time(task, system, precision)
    hidden_activation = hidden_weight = 0.0
    for task in group.tasks:
        if not isinstance(task, CollectiveTask) or task.id in handled or task.axis != TP_AXIS:
            continue
        op = task.lineage.op
        if task.phase is Phase.BACKWARD_ACTIVATION_GRAD and isinstance(
            task.lineage.source, Partial
        ):
            beside = gemm_s.get((Phase.BACKWARD_WEIGHT_GRAD, op), 0.0)
            link = _tp_link_s(task, system, tp_group, precision)
            hidden_activation += min(link, beside)
        elif (
            task.phase is Phase.BACKWARD_WEIGHT_GRAD and task.purpose is CollectivePurpose.REGATHER
        ):
            beside = gemm_s.get((Phase.BACKWARD_ACTIVATION_GRAD, op), 0.0)
            link = _tp_link_s(task, system, tp_group, precision)
            hidden_weight += min(link, beside)
    return hidden_activation, hidden_weight


def _hide(phase: PhaseCost, hidden_s: float, compute_delta_s: float = 0.0) -> PhaseCost:
    """``phase`` with ``hidden_s`` of its TP link time taken off the critical path and its
    compute changed by ``compute_delta_s`` (what overlapping costs the GEMMs)."""
    if hidden_s == 0.0 and compute_delta_s == 0.0:
        return phase
    return PhaseCost(
        compute_s=phase.compute_s + compute_delta_s,
        comm_s=phase.comm_s,
        comm_exposed_s=max(0.0, phase.comm_exposed_s - hidden_s),
        flops=phase.flops,
        bytes_moved=phase.bytes_moved,
        overlap_compute_s=compute_delta_s,
        cp_comm_s=phase.cp_comm_s,
        cp_comm_exposed_s=phase.cp_comm_exposed_s,
        ep_comm_s=phase.ep_comm_s,
        ep_comm_exposed_s=phase.ep_comm_exposed_s,
        quantize_s=phase.quantize_s,
        host_exposed_s=phase.host_exposed_s,
    )


def _compute_time(task: ComputeTask, system: SystemSpec, precision: OpPrecision) -> float:
    """One compute task's time (module docstring); a Transformer Engine linear's GEMM at the
    recipe's low-precision rate (:mod:`.precision`).

    Memoized per system (:func:`_system_memo`): a search costs the same op on thousands of
    block configurations, and :func:`work_time` is a pure function of its arguments. (Serving
    calls :func:`work_time` directly: its decode ops, one per context length, rarely repeat.)"""
    return _compute_row(task, _system_memo(system), precision)[0]


def _compute_row(task: ComputeTask, memo: _SystemMemo, precision: OpPrecision) -> _TaskRow:
    """(:func:`_compute_time`, the bytes the task's GEMM quantizes in its own pass:
    :meth:`OpPrecision.quantized_bytes`, 0 for a task that is no TE GEMM) on ``memo``'s system.
    """
    # a task is timed by several passes of one costing (the phases, the host model, the TP
    # overlaps), and a span's task by every block configuration that shares the span
    # (distributed.passes._SPANS): by identity first, without hashing its work again
    seen = memo.tasks.get(id(task))
    # (each costing builds its own OpPrecision: an equal one times the task the same)
    if seen is not None and seen[0] is task and (seen[1] is precision or seen[1] == precision):
        return seen[2]
    system = memo.system
    is_gemm = task.gemm is not None and task.attention is None
    gemm_format = precision.gemm_format(task.lineage.op, is_gemm=is_gemm)
    times = memo.times
    key = (task.work, task.gemm, precision.datatype, task.attention, gemm_format)
    found = times.get(key)
    if found is None:
        if len(times) >= _MEMO_ENTRIES:
            times.clear()
        found = times[key] = work_time(
            task.work,
            task.gemm,
            system,
            precision.datatype,
            task.attention,
            gemm_format=gemm_format,
        )
    quantized = 0.0
    if task.gemm is not None and task.attention is None:
        quantized = precision.quantized_bytes(
            task.lineage.op,
            task.phase,
            task.gemm,
            native_columnwise_fp8=reads_fp8_columnwise(system),
        )
    row = (found, quantized)
    if len(memo.tasks) >= _MEMO_ENTRIES:
        memo.tasks.clear()
    memo.tasks[id(task)] = (task, precision, row)
    return row


#: (time, quantized bytes) of a compute task (:func:`_compute_row`)
_TaskRow: TypeAlias = tuple[float, float]


@dataclass(slots=True)
class _SystemMemo:
    """Pure functions of one system, memoized: a training task's time (:func:`_compute_time`)
    by the arguments of :func:`work_time`, and the costs of a dense task group
    (:func:`cost_task_groups`) by the group's identity (the lowering shares one group object
    among the plans that differ only in the expert grid) and the communicators, precision and
    overlap it is costed with. An entry holds its group, so the group's id cannot be reused by
    another object while the entry lives."""

    system: SystemSpec
    times: dict[tuple[object, ...], float] = field(default_factory=dict)
    #: the last time and quantized bytes of each task object by its id (the entry holds the
    #: task, so the id is not reused while it lives) with the precision it was timed under
    tasks: dict[int, tuple[ComputeTask, OpPrecision, _TaskRow]] = field(default_factory=dict)
    blocks: dict[tuple[object, ...], tuple[TaskGroup, BlockCost]] = field(default_factory=dict)
    extras: dict[tuple[object, ...], tuple[TaskGroup, ExtraCost]] = field(default_factory=dict)


_SYSTEM_MEMOS: dict[int, _SystemMemo] = {}
#: systems memoized at once, task times and costed groups per system, before a table is
#: dropped (a bound on memory only: a dropped entry is recomputed to the same value; a group
#: entry holds its group's tasks, a search has a few hundred distinct dense groups)
_MEMO_SYSTEMS, _MEMO_ENTRIES, _MEMO_GROUPS = 64, 1 << 16, 4096


def _system_memo(system: SystemSpec) -> _SystemMemo:
    """The memo of ``system``, found by identity: hashing a ``SystemSpec`` per op would cost
    as much as the op's time. The entry holds the system, so its id cannot be reused by another
    object while the entry lives."""
    memo = _SYSTEM_MEMOS.get(id(system))
    if memo is None or memo.system is not system:
        if len(_SYSTEM_MEMOS) >= _MEMO_SYSTEMS:
            _SYSTEM_MEMOS.clear()
        memo = _SystemMemo(system=system)
        _SYSTEM_MEMOS[id(system)] = memo
    return memo


def _gemm_calls(gemm: GemmShape | None) -> tuple[int, HardwareGemmShape | None]:
    """(calls, the shape each call's efficiency is looked up at): one call at the whole shape,
    or, for a grouped GEMM issued one member at a time (:class:`BatchedGemmCalls`), ``batch``
    calls at one member's shape, each paying the efficiency's per-call term."""
    if gemm is None:
        return 1, None
    match gemm.calls:
        case BatchedGemmCalls.ONE_CALL:
            return 1, HardwareGemmShape(m=gemm.m, n=gemm.n, k=gemm.k, batch=gemm.batch)
        case BatchedGemmCalls.CALL_PER_MEMBER:
            return gemm.batch, HardwareGemmShape(m=gemm.m, n=gemm.n, k=gemm.k)
        case _ as unreachable:
            assert_never(unreachable)


def work_time(
    work: Work,
    gemm: GemmShape | None,
    system: SystemSpec,
    datatype: Datatype,
    attention: AttentionShape | None = None,
    *,
    gemm_format: GemmFormat | None = None,
) -> float:
    """The time of one op's work on ``system``: matrix FLOPs at the GEMM shape's efficiency (a
    fused attention kernel's at its measured rate, ``SystemSpec.attention_time``) plus vector
    FLOPs, against its HBM traffic, combined by the system's processing mode. Training tasks and
    serving ops are costed by this one rule (:func:`_work_time`; :func:`work_times` on a
    column of ops)."""
    calls, shape = _gemm_calls(gemm)
    if attention is None or gemm_format is not None:
        flop_time = _matrix_time(
            work.matrix_flops, calls, shape, system, datatype, gemm_format=gemm_format
        )
    else:
        flop_time = system.attention_time(
            work.matrix_flops,
            seq_length=attention.seq_length,
            head_dim=attention.head_dim,
            datatype=datatype,
            gemm=_attention_gemm(attention),
        )
    return _work_time(
        flop_time, work.vector_flops, work.bytes_read + work.bytes_written, system, datatype
    )


def _attention_gemm(attention: AttentionShape) -> HardwareGemmShape:
    """The matrix products a fused attention kernel is timed as where no rate is measured."""
    s, d = attention.seq_length, attention.head_dim
    return HardwareGemmShape(m=s, n=d, k=s, batch=attention.batch_heads)


def _matrix_time(
    matrix_flops: Real,
    calls: Real,
    shape: ShapeFigures[Real] | None,
    system: SystemSpec,
    datatype: Datatype,
    *,
    gemm_format: GemmFormat | None,
) -> Real:
    """``calls`` GEMM calls of ``matrix_flops / calls`` each at the shape's efficiency (the
    recipe's low-precision rate under ``gemm_format``)."""
    if gemm_format is not None:
        return calls * system.low_precision_gemm_time(matrix_flops / calls, gemm_format, shape)
    return calls * system.compute_time(matrix_flops / calls, Engine.MATRIX, datatype, shape)


def _work_time(
    flop_time: Real, vector_flops: Real, traffic_bytes: Real, system: SystemSpec, datatype: Datatype
) -> Real:
    """The matrix time plus the vector FLOPs' time, against the HBM traffic's."""
    flop_time = flop_time + system.compute_time(vector_flops, Engine.VECTOR, datatype)
    return system.processing_time(flop_time, system.memory_time(traffic_bytes))


def work_times(
    works: Sequence[Work],
    gemms: Sequence[GemmShape | None],
    system: SystemSpec,
    datatype: Datatype,
    attentions: Sequence[AttentionShape | None] | None = None,
    *,
    gemm_format: GemmFormat | None = None,
) -> Column | None:
    """:func:`work_time` of each op (``works[i]``, ``gemms[i]``, ``attentions[i]``) by one call
    of the same rule on columns: equal element by element to the scalar call. None where the
    column cannot be: ops with and without a GEMM shape (or a fused attention kernel) together,
    attention kernels of different head dimensions, or a count not exact in float64
    (:mod:`blueprinting.hardware.polymorphic`)."""
    import numpy as np

    if not works or len(works) != len(gemms):
        return None
    kernels = [a for a in attentions or () if a is not None]
    if attentions is not None and len(attentions) != len(works):
        return None
    numbers = [
        exact_column(values)
        for values in (
            [work.matrix_flops for work in works],
            [work.vector_flops for work in works],
            [work.bytes_read + work.bytes_written for work in works],
        )
    ]
    matrix, vector, traffic = numbers
    if matrix is None or vector is None or traffic is None:
        return None
    flop_time: Column
    if kernels and gemm_format is None:
        seq = exact_column([a.seq_length for a in kernels])
        figures = GemmShapeColumns.of([_attention_gemm(a) for a in kernels])
        head_dims = {a.head_dim for a in kernels}
        if len(kernels) != len(works) or len(head_dims) != 1 or seq is None or figures is None:
            return None
        flop_time = system.attention_time(
            matrix, seq_length=seq, head_dim=head_dims.pop(), datatype=datatype, gemm=figures
        )
    else:
        calls_shapes = [_gemm_calls(gemm) for gemm in gemms]
        hardware_shapes = [shape for _, shape in calls_shapes if shape is not None]
        calls = exact_column([calls for calls, _ in calls_shapes])
        shape: GemmShapeColumns | None = None
        if hardware_shapes:
            shape = GemmShapeColumns.of(hardware_shapes)
            if len(hardware_shapes) != len(works) or shape is None:
                return None
        if calls is None:
            return None
        return gemm_work_times(
            matrix,
            vector,
            traffic,
            calls=calls,
            shape=shape,
            system=system,
            datatype=datatype,
            gemm_format=gemm_format,
        )
    return np.asarray(_work_time(flop_time, vector, traffic, system, datatype), dtype=np.float64)


def gemm_work_times(
    matrix_flops: Column,
    vector_flops: Column,
    traffic_bytes: Column,
    *,
    calls: Column,
    shape: GemmShapeColumns | None,
    system: SystemSpec,
    datatype: Datatype,
    gemm_format: GemmFormat | None = None,
) -> Column:
    """:func:`work_time` of a column of ops without a fused attention kernel, given as its
    figures (float64 columns, each count at most 2**53): ``calls`` GEMM calls at ``shape``
    (None: no GEMM shape), as :func:`_gemm_calls` splits a shape. :func:`work_times` ends here;
    a caller that derives the figures on columns (serving's decode attention) skips building
    one op object per element."""
    import numpy as np

    flop_time = _matrix_time(matrix_flops, calls, shape, system, datatype, gemm_format=gemm_format)
    return np.asarray(
        _work_time(flop_time, vector_flops, traffic_bytes, system, datatype), dtype=np.float64
    )


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
