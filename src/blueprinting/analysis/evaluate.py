"""The whole pipeline for one training strategy: laws -> derivation -> DistributedTaskIR ->
PortablePlanIR -> iteration analysis -> IterationReport.

Each stage is called once, in order; nothing reaches back into an earlier stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import assert_never, final

from blueprinting.analysis.data_parallel import OverlapWindows, stage_data_parallel_cost
from blueprinting.analysis.flops import (
    FlopsConvention,
    hardware_flops_per_iteration,
    model_flops_per_iteration,
)
from blueprinting.analysis.iteration import (
    BubbleSource,
    bubble_contract,
    compose_breakdown,
)
from blueprinting.analysis.memory import (
    memory_per_stage,
    most_loaded,
    stage_param_gather_bytes,
    stage_parameters,
    training_recipe,
)
from blueprinting.analysis.offload import offload_cost
from blueprinting.analysis.optimizer_step import adam_step_cost, owned_parameters
from blueprinting.analysis.report import IterationReport
from blueprinting.errors import ConfigError
from blueprinting.hardware.system import CommGroup, Engine, ParallelDim, SystemSpec
from blueprinting.limits import stage_limit_problem
from blueprinting.mapping.cuda_graphs import CudaGraphs
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.precision import HighPrecision, TrainingPrecision, high_precision_layers
from blueprinting.mapping.transformer import (
    AttentionKernel,
    BatchSpec,
    ContextParallel,
    DataParallel,
    DistributedOptimizer,
    ExpertParallel,
    KernelFusions,
    NoOptimizerSharding,
    PipelineParallel,
    RecomputePolicy,
    ReduceScatterAllGather,
    ShardedGradients,
    ShardedParameters,
    SingleStage,
    TensorParallel,
    TrainingSpec,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    delays_wgrad,
    dispatcher_overlaps,
    recomputed_modules,
    shared_expert_overlaps,
)
from blueprinting.simulator.from_plan import (
    PlanSimulation,
    simulate_plan_all,
    simulation_obstacle,
)
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import DistributedTaskIR
from blueprinting.synthesizer.stages.portable_plan.host_dispatch import training_host_dispatch
from blueprinting.synthesizer.stages.portable_plan.ir import PortablePlanIR
from blueprinting.synthesizer.stages.portable_plan.passes import (
    PlanContext,
    TaskGroupCosts,
    VerifyPortablePlan,
    assemble_plan,
    cost_task_groups,
    expert_groups,
)
from blueprinting.synthesizer.stages.portable_plan.precision import (
    OpPrecision,
    sequence_shards,
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PlanOptions:
    """Choices of the analysis, not of the strategy.

    ``bubble_source``: SIMULATED (default) runs the concrete schedule
    (:mod:`blueprinting.simulator`) and uses its bubble and exposed P2P time in the total
    wherever Megatron-LM would run the schedule; elsewhere the total falls back to the seed's
    contract and the report says why (``bubble.simulation_note``).
    """

    flops_convention: FlopsConvention = FlopsConvention.MEGATRON_LEGACY
    bubble_source: BubbleSource = BubbleSource.SIMULATED
    megatron_rules: bool = True
    train_tokens: int = 300_000_000_000
    """Tokens for the report's time-to-train figure (default: GPT-3's 300B, Brown et al. 2020)."""
    simulate: bool = True
    """Run the concrete schedule at all. Off, the report is purely analytic (the contract bubble,
    ``bubble.simulated_s`` null): what a sweep needs when it wants microseconds per plan."""


@lru_cache(maxsize=512)
def _local_block(
    model: TransformerModelSpec,
    tensor: TensorParallel,
    recompute: RecomputePolicy,
    micro_batch: int,
    attention: AttentionKernel,
    *,
    context: ContextParallel,
    experts: ExpertParallel,
    fusions: KernelFusions,
) -> DistributedTaskIR:
    """The local TP block depends only on the model, the TP variant, the recompute policy, the
    micro batch, the attention kernel, the CP and expert grids and the kernel fusions
    (training_derivation.derive_block_plan reads nothing else), so strategies
    that differ in PP, DP or batch share it. The derivation runs on a canonical single-stage
    mapping with exactly those choices."""
    canonical = TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=tensor,
            pipeline=PipelineParallel(degree=1, schedule=SingleStage()),
            data=DataParallel(degree=1),
            recompute=recompute,
            context=context,
            experts=experts,
        ),
        batch=BatchSpec(global_batch_size=micro_batch, micro_batch_size=micro_batch),
        attention=attention,
        fusions=fusions,
    )
    return derive_training_block(model, canonical)


@lru_cache(maxsize=512)
def _local_block_costs(
    *,
    model: TransformerModelSpec,
    tensor: TensorParallel,
    recompute: RecomputePolicy,
    micro_batch: int,
    attention: AttentionKernel,
    system: SystemSpec,
    tp_group: CommGroup,
    context: ContextParallel,
    cp_groups: tuple[tuple[str, CommGroup], ...],
    precision: TrainingPrecision,
    experts: ExpertParallel,
    ep_groups: tuple[tuple[str, CommGroup], ...],
    cuda_graphs: CudaGraphs,
    fusions: KernelFusions,
) -> TaskGroupCosts:
    """The costed local block, shared like :func:`_local_block` by strategies that differ only
    in PP, DP or batch (the costs read nothing else)."""
    ir = _local_block(
        model,
        tensor,
        recompute,
        micro_batch,
        attention,
        context=context,
        experts=experts,
        fusions=fusions,
    )
    overlap = (
        tensor.communication.overlap
        if isinstance(tensor.communication, ReduceScatterAllGather)
        else None
    )
    return cost_task_groups(
        ir,
        system,
        tp_group,
        OpPrecision(
            datatype=model.datatype,
            recipe=precision,
            sequence_shards=sequence_shards(tensor),
            recomputed=recomputed_modules(recompute),
        ),
        overlap,
        cp_groups=dict(cp_groups),
        ep_groups=dict(ep_groups),
        dispatch_overlap=dispatcher_overlaps(experts.dispatcher),
        delay_wgrad=delays_wgrad(experts.dispatcher),
        shared_expert_overlap=shared_expert_overlaps(experts.dispatcher),
        host=training_host_dispatch(model, cuda_graphs, system, dispatcher=experts.dispatcher),
    )


def portable_plan(spec: TrainingSpec, system: SystemSpec) -> PortablePlanIR:
    """Derive and cost the local block of ``spec`` on ``system``: the same values as running
    derive_training_block then build_portable_plan (tests/analysis checks it), with the
    block-level stages memoized."""
    parallelism = spec.mapping.parallelism
    ctx = PlanContext(spec=spec, system=system)

    def costed(precision: TrainingPrecision) -> TaskGroupCosts:
        return _local_block_costs(
            model=spec.model,
            tensor=parallelism.tensor,
            recompute=parallelism.recompute,
            micro_batch=spec.mapping.batch.micro_batch_size,
            attention=spec.mapping.attention,
            system=system,
            tp_group=ctx.group(ParallelDim.TENSOR),
            context=parallelism.context,
            cp_groups=tuple(sorted(ctx.context_groups().items())),
            precision=precision,
            experts=parallelism.experts,
            ep_groups=tuple(sorted(expert_groups(spec, system).items())),
            cuda_graphs=spec.mapping.cuda_graphs,
            fusions=spec.mapping.fusions,
        )

    recipe = spec.mapping.precision
    base = costed(HighPrecision()) if any(high_precision_layers(recipe)) else None
    return VerifyPortablePlan().run(assemble_plan(costed(recipe), ctx, base), ctx)


def _owned_parameters(spec: TrainingSpec, stage_params: int, *, degree: int | None = None) -> int:
    """Parameters whose optimizer state this GPU updates (the distributed optimizer shards over
    d x cp, Megatron's ``intra_dp_cp_group``; routed experts over expert-dp, ``degree``)."""
    d = spec.mapping.dense_gradient_degree if degree is None else degree
    sharded: bool
    match spec.mapping.parallelism.data.optimizer_sharding:
        case NoOptimizerSharding():
            sharded = False
        case DistributedOptimizer() | ShardedGradients() | ShardedParameters():
            sharded = True
        case _ as unreachable:
            assert_never(unreachable)
    return owned_parameters(stage_params, degree=d, sharded=sharded)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _BubbleChoice:
    bubble_s: float
    pp_comm_exposed_s: float | None
    source: BubbleSource
    simulated_s: float | None
    simulated_p2p_exposed_s: float | None
    note: str | None
    simulation: PlanSimulation | None


def _choose_bubble(
    *,
    spec: TrainingSpec,
    system: SystemSpec,
    plan: PortablePlanIR,
    source: BubbleSource,
    contract_s: float,
    given_simulated_s: float | None,
    simulate: bool,
) -> _BubbleChoice:
    """The bubble (and, when simulated, the exposed P2P time) the total uses.

    The schedule is simulated whenever Megatron-LM would run it and it is small enough
    (:func:`~blueprinting.simulator.from_plan.simulation_obstacle`), so the report shows both
    figures; ``source`` picks the one the total uses, falling back to the contract with a note
    where there is no simulation. A simulated bubble passed in by the caller is used as it is,
    beside the analytic P2P term."""
    schedule = spec.mapping.parallelism.pipeline.schedule
    simulation: PlanSimulation | None = None
    if given_simulated_s is not None:
        simulated_s: float | None = given_simulated_s
        p2p_s: float | None = None
        note = "simulated bubble supplied by the caller; P2P term analytic"
    else:
        obstacle = (
            simulation_obstacle(schedule, plan, spec.mapping.microbatch_count)
            if simulate
            else "simulation turned off (PlanOptions.simulate / --no-simulate)"
        )
        if obstacle is None:
            simulation = simulate_plan_all(plan, spec, system)
            simulated = simulation.bubble
            simulated_s, p2p_s = simulated.bubble_s, simulated.p2p_exposed_s
            note = (
                f"simulated {schedule} (p={plan.pipeline_degree}, v={plan.virtual_stages}, "
                f"m={spec.mapping.microbatch_count})"
            )
        else:
            simulated_s, p2p_s = None, None
            note = f"not simulated: {obstacle}"
    contract = _BubbleChoice(
        bubble_s=contract_s,
        pp_comm_exposed_s=None,
        source=BubbleSource.CONTRACT,
        simulated_s=simulated_s,
        simulated_p2p_exposed_s=p2p_s,
        note=note,
        simulation=simulation,
    )
    match source:
        case BubbleSource.CONTRACT:
            return replace(contract, note=f"{note}; total uses the contract as asked")
        case BubbleSource.SIMULATED:
            if simulated_s is None:
                return replace(contract, note=f"{note}; total falls back to the contract")
            return replace(
                contract,
                bubble_s=simulated_s,
                pp_comm_exposed_s=p2p_s,
                source=BubbleSource.SIMULATED,
                note=(
                    f"{note}; total uses it"
                    + ("" if p2p_s is None else " and the simulated P2P delay as pp_comm_exposed")
                ),
            )
        case _ as unreachable:
            assert_never(unreachable)


def evaluate_plan(
    spec: TrainingSpec,
    system: SystemSpec,
    options: PlanOptions,
    *,
    strategy_keys: dict[str, int | bool | str | float],
    megatron_args: tuple[str, ...],
    megatron_refusals: tuple[str, ...] = (),
    bubble_simulated_s: float | None = None,
) -> IterationReport:
    """Evaluate a strategy that already satisfies the laws (callers check them first).

    Refuses (``ConfigError``) more than ``MAX_PIPELINE_STAGES`` stages or
    ``MAX_PIPELINE_CHUNKS`` model chunks: each is evaluated."""
    mapping = spec.mapping
    too_many = stage_limit_problem(mapping.pipeline_degree, mapping.virtual_stages)
    if too_many is not None:
        raise ConfigError([too_many])
    plan = portable_plan(spec, system)
    m = mapping.microbatch_count
    critical = plan.critical_stage()
    contract = bubble_contract(plan, m)
    chosen = _choose_bubble(
        spec=spec,
        system=system,
        plan=plan,
        source=options.bubble_source,
        contract_s=contract.bubble_s,
        given_simulated_s=bubble_simulated_s,
        simulate=options.simulate,
    )
    recipe = training_recipe(spec.model, spec.mapping)
    critical_params = stage_parameters(spec.model, mapping, critical.index)
    windows = OverlapWindows(
        blocks_per_chunk=plan.max_blocks_per_chunk,
        virtual_stages=plan.virtual_stages,
        pipeline_degree=plan.pipeline_degree,
        block_backward_s=plan.stage_block_backward_s(critical),
        chunk_backward_s=plan.backward_chunk_s(),
        stage_forward_s=sum(
            plan.chunk_forward_s(critical, c) for c in range(len(critical.blocks_per_chunk))
        ),
        microbatch_count=m,
    )
    dense_params, expert_params = critical_params.dense_total, critical_params.expert_total
    context = PlanContext(spec=spec, system=system)
    dp = stage_data_parallel_cost(
        data=mapping.parallelism.data,
        parameters=(dense_params, expert_params),
        param_bytes=recipe.param,
        grad_bytes=recipe.grad,
        groups=(context.gradient_group(), context.expert_gradient_group()),
        system=system,
        windows=windows,
        param_gather_sizes=stage_param_gather_bytes(
            spec.model, mapping, critical_params, recipe.param
        ),
    )
    optimizer = adam_step_cost(
        parameters=_owned_parameters(spec, dense_params)
        + _owned_parameters(spec, expert_params, degree=mapping.expert_data_degree),
        param_bytes=recipe.param,
        grad_bytes=recipe.grad,
        datatype=spec.model.datatype,
        system=system,
    )
    offload = offload_cost(spec, system, plan, critical)
    breakdown = compose_breakdown(
        mapping=mapping,
        plan=plan,
        bubble_s=chosen.bubble_s,
        pp_comm_exposed_s=chosen.pp_comm_exposed_s,
        dp_exposed_s=dp.exposed_s,
        optimizer_s=optimizer.time_s,
        critical=critical,
        offload_exposed_s=0.0 if offload is None else m * offload.exposed_s,
    )
    capacity = int(system.accelerator.hbm.capacity_bytes)
    per_stage = memory_per_stage(
        spec.model,
        mapping,
        capacity_bytes=capacity,
        runtime=system.runtime,
        nvlink_domain=system.node.placed_domain_size(mapping.world_size),
    )
    worst = most_loaded(per_stage)
    peak = system.accelerator.engine(Engine.MATRIX).rate(spec.model.datatype).peak_flop_per_s
    return IterationReport(
        spec=spec,
        system=system,
        plan=plan,
        breakdown=breakdown,
        bubble=contract,
        bubble_simulated_s=chosen.simulated_s,
        bubble_simulated_p2p_exposed_s=chosen.simulated_p2p_exposed_s,
        bubble_simulation_note=chosen.note,
        simulation=chosen.simulation,
        bubble_source=chosen.source,
        flops_convention=options.flops_convention,
        model_flops_per_iteration=model_flops_per_iteration(
            spec.model, mapping.batch.global_batch_size, options.flops_convention
        ),
        hardware_flops_per_iteration=hardware_flops_per_iteration(
            spec.model, mapping, options.flops_convention
        ),
        peak_flops_per_gpu=peak,
        memory=worst,
        memory_per_stage=per_stage,
        data_parallel=dp,
        optimizer=optimizer,
        offload=offload,
        strategy_keys=strategy_keys,
        megatron_args=megatron_args,
        megatron_refusals=megatron_refusals,
        train_tokens=options.train_tokens,
    )
