"""The whole pipeline for one training strategy: laws -> derivation -> DistributedTaskIR ->
PortablePlanIR -> iteration analysis -> IterationReport.

Each stage is called once, in order; nothing reaches back into an earlier stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import assert_never, final

from blueprinting.analysis.data_parallel import OverlapWindows, data_parallel_cost
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
from blueprinting.analysis.memory import memory_per_stage, precision_recipe, stage_parameters
from blueprinting.analysis.optimizer_step import adam_step_cost
from blueprinting.analysis.report import IterationReport
from blueprinting.hardware.system import Engine, ParallelDim, SystemSpec
from blueprinting.mapping.transformer import (
    DistributedOptimizer,
    NoOptimizerSharding,
    ShardedGradients,
    ShardedParameters,
    TrainingSpec,
)
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.portable_plan.ir import PortablePlanIR
from blueprinting.synthesizer.stages.portable_plan.passes import PlanContext, build_portable_plan


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PlanOptions:
    """Choices of the analysis, not of the strategy."""

    flops_convention: FlopsConvention = FlopsConvention.MEGATRON_LEGACY
    bubble_source: BubbleSource = BubbleSource.CONTRACT
    megatron_rules: bool = True
    extra_flags: tuple[str, ...] = field(default=())


def portable_plan(spec: TrainingSpec, system: SystemSpec) -> PortablePlanIR:
    """Derive and cost the local block of ``spec`` on ``system``."""
    ir = derive_training_block(spec.model, spec.mapping)
    return build_portable_plan(ir, PlanContext(spec=spec, system=system))


def _owned_parameters(spec: TrainingSpec, stage_params: int) -> int:
    """Parameters whose optimizer state this GPU updates."""
    d = spec.mapping.data_degree
    match spec.mapping.parallelism.data.optimizer_sharding:
        case NoOptimizerSharding():
            return stage_params
        case DistributedOptimizer() | ShardedGradients() | ShardedParameters():
            return -(-stage_params // d)
        case _ as unreachable:
            assert_never(unreachable)


def _chosen_bubble(source: BubbleSource, contract_s: float, simulated_s: float | None) -> float:
    match source:
        case BubbleSource.CONTRACT:
            return contract_s
        case BubbleSource.SIMULATED:
            return contract_s if simulated_s is None else simulated_s
        case _ as unreachable:
            assert_never(unreachable)


def evaluate_plan(
    spec: TrainingSpec,
    system: SystemSpec,
    options: PlanOptions,
    *,
    strategy_keys: dict[str, int | bool | str],
    megatron_args: tuple[str, ...],
    bubble_simulated_s: float | None = None,
) -> IterationReport:
    """Evaluate a strategy that already satisfies the laws (callers check them first)."""
    mapping = spec.mapping
    plan = portable_plan(spec, system)
    m = mapping.microbatch_count
    critical = plan.critical_stage()
    contract = bubble_contract(plan, m)
    bubble_s = _chosen_bubble(options.bubble_source, contract.bubble_s, bubble_simulated_s)
    recipe = precision_recipe(spec.model.datatype)
    params = stage_parameters(spec.model, mapping, critical.index).total
    windows = OverlapWindows(
        blocks_per_chunk=plan.max_blocks_per_chunk,
        virtual_stages=plan.virtual_stages,
        pipeline_degree=plan.pipeline_degree,
        block_backward_s=plan.block.backward_s,
        chunk_backward_s=plan.backward_chunk_s(),
        stage_forward_s=critical.blocks * plan.block.forward_s,
        microbatch_count=m,
    )
    dp = data_parallel_cost(
        data=mapping.parallelism.data,
        stage_parameters=params,
        param_bytes=recipe.param,
        grad_bytes=recipe.grad,
        group=system.comm_group(
            ParallelDim.DATA,
            tensor=mapping.tensor_degree,
            pipeline=mapping.pipeline_degree,
            data=mapping.data_degree,
        ),
        system=system,
        windows=windows,
    )
    optimizer = adam_step_cost(
        parameters=_owned_parameters(spec, params),
        param_bytes=recipe.param,
        grad_bytes=recipe.grad,
        datatype=spec.model.datatype,
        system=system,
    )
    breakdown = compose_breakdown(
        mapping=mapping,
        plan=plan,
        bubble_s=bubble_s,
        dp_exposed_s=dp.exposed_s,
        optimizer_s=optimizer.time_s,
    )
    capacity = int(system.accelerator.hbm.capacity_bytes)
    per_stage = memory_per_stage(spec.model, mapping, capacity_bytes=capacity)
    worst = max(per_stage, key=lambda breakdown: (breakdown.total, -breakdown.stage))
    peak = system.accelerator.engine(Engine.MATRIX).rate(spec.model.datatype).peak_flop_per_s
    return IterationReport(
        spec=spec,
        system=system,
        plan=plan,
        breakdown=breakdown,
        bubble=contract,
        bubble_simulated_s=bubble_simulated_s,
        bubble_source=options.bubble_source,
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
        strategy_keys=strategy_keys,
        megatron_args=megatron_args,
    )
