"""From a costed plan to the simulator's input, and the simulated bubble of a plan.

Data flows one way: :class:`~blueprinting.synthesizer.stages.portable_plan.ir.PortablePlanIR`
(per-block critical paths, the stage layout, the P2P message) + the typed program + the system
-> :class:`~blueprinting.simulator.costs.ScheduleCosts` -> :func:`simulate`. Nothing here reaches
back into iteration analysis (``analysis/evaluate.py`` calls this module, never the reverse).

Mapping (times are critical paths: compute plus exposed TP communication, as in PortablePlanIR):

- the block terms below are ``PortablePlanIR.chunk_forward_s`` / ``chunk_backward_s``: each
  chunk's dense and MoE blocks at their own costs, plus each sliding-window block's change
  (``PortablePlanIR.window`` / ``moe_window``).
- ``forward_s[r][c]``  = blocks(r, c) x block forward, plus the embedding forward on virtual
  stage 0 (rank 0, chunk 0) and the LM head + loss forward on the last virtual stage
  (rank p-1, chunk v-1): Megatron places the embedding before the first chunk and the output
  layer after the last one (Narayanan et al. 2021, Section 2.2.2, virtual stage c*p + r).
- ``backward_s[r][c]`` = blocks(r, c) x block backward (activation + weight gradients)
  + recomputed blocks(r, c) x block recompute (Korthikanti et al. 2022, Section 5: the recomputed
  forward runs inside the backward) + the extras' backward on the same two virtual stages.
- ``weight_grad_s[r][c]`` = blocks(r, c) x block weight-gradient pass: the W pass ZB-H1 defers
  (Qi et al. 2023, Section 2.1). The extras' backward stays in B (their weight gradient is not
  split out by PortablePlanIR).
- P2P: alpha-beta on the PP group's link, ``latency + bytes x wire factor / (bandwidth x
  efficiency)`` (Calculon's ``Network.time``, Isaev et al. SC'23, Section 3.2); it equals
  PortablePlanIR's ``p2p_forward_s`` by construction, and :func:`schedule_costs` checks that.
- combined 1F1B (``--overlap-moe-expert-parallel-comm``): the chunk times are the MoE layers'
  steady state (a forward co-scheduled with a backward, PortablePlanIR's ``moe_block``), and
  ``unpaired_forward_s[r][c]`` / ``unpaired_backward_s[r][c]`` = MoE blocks(r, c) x what a
  MoE layer's pass alone adds (``PortablePlanIR.ep_overlap``), which the DAG gives the passes
  that run without a partner.
- DP buckets: each stage's gradient reduction (``analysis/data_parallel.py``, the same collective
  for that stage's parameters) split over its chunks in proportion to the chunk's parameters
  (Megatron-core keeps one gradient buffer per model chunk, ``distributed_data_parallel.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import final

import numpy as np

from blueprinting.analysis.data_parallel import OverlapWindows, stage_data_parallel_cost
from blueprinting.analysis.memory import stage_parameters, training_recipe
from blueprinting.errors import UnsupportedError, VerificationError
from blueprinting.hardware.collectives import CollectiveKind, collective_alpha_beta
from blueprinting.hardware.system import ParallelDim, SystemSpec
from blueprinting.mapping.transformer import (
    CombinedOneForwardOneBackward,
    DualPipe,
    DualPipeV,
    PipelineSchedule,
    TrainingSpec,
    ZeroBubbleH1,
)
from blueprinting.simulator.commands import _DP, _SEND_F, FloatArray, build_schedule
from blueprinting.simulator.costs import DpBucket, Matrix, ScheduleCosts
from blueprinting.simulator.engine import SimulationResult, simulate_many
from blueprinting.simulator.schedules import megatron_violations
from blueprinting.synthesizer.stages.portable_plan.ir import NO_BLOCK_CHANGE, PortablePlanIR
from blueprinting.synthesizer.stages.portable_plan.passes import PlanContext

MAX_SIMULATED_PASSES = 1_048_576
"""Compute passes (p x v x m x passes per microbatch-chunk) above which the plan path does not
simulate. The plan path builds one DAG and runs its three duration vectors in one numpy
wavefront (:func:`simulate_plan_all`), whose steps follow the longest chain of commands rather
than the count: p = 64, v = 4, m = 1024 (524,288 passes, about a million commands) adds about
0.8 s of CPU to ``plan`` on the shared 2-core machine (``benchmarks/bench_simulator.py``: 1.44 to
1.56 s against 0.70 s for ``plan --no-simulate``). The limit is twice that size, so every
Megatron-runnable schedule up to it is simulated; p = 8, v = 3, m = 192 is 9,216 passes."""

P2P_TOLERANCE = 1e-9
"""Relative agreement required between the simulator's P2P time and PortablePlanIR's."""


def simulation_passes(schedule: PipelineSchedule, plan: PortablePlanIR, microbatches: int) -> int:
    """Compute passes one iteration runs: p x v x m x (2, or 3 with split backward)."""
    per_chunk = 3 if isinstance(schedule, ZeroBubbleH1 | DualPipe | DualPipeV) else 2
    return plan.pipeline_degree * plan.virtual_stages * microbatches * per_chunk


def simulated_chunks(schedule: PipelineSchedule, plan: PortablePlanIR) -> int:
    """Chunks per rank the simulator runs: the plan's v, and 2 for DualPipe (its two
    directions' copies of one stage)."""
    return 2 if isinstance(schedule, DualPipe) else plan.virtual_stages


def simulation_obstacle(
    schedule: PipelineSchedule, plan: PortablePlanIR, microbatches: int
) -> str | None:
    """Why the plan path cannot simulate this schedule (None when it can): a configuration
    Megatron-LM refuses at start-up (there is no execution to simulate), or one too big to
    simulate cheaply."""
    p, v = plan.pipeline_degree, simulated_chunks(schedule, plan)
    violations = megatron_violations(schedule, p, microbatches, v)
    if violations:
        rules = "; ".join(violation.message for violation in violations)
        return (
            f"Megatron-LM refuses to run {schedule} with p={p}, v={v}, m={microbatches} ({rules})"
        )
    passes = simulation_passes(schedule, plan, microbatches)
    if passes > MAX_SIMULATED_PASSES:
        return (
            f"{passes:,} compute passes exceed the plan path's simulation limit of "
            f"{MAX_SIMULATED_PASSES:,} (run `blueprinting simulate` for the full simulation)"
        )
    return None


def _chunk_matrices(plan: PortablePlanIR) -> tuple[Matrix, Matrix, Matrix]:
    block = plan.block
    moe_block = block if plan.moe_block is None else plan.moe_block
    window = NO_BLOCK_CHANGE if plan.window is None else plan.window
    moe_window = NO_BLOCK_CHANGE if plan.moe_window is None else plan.moe_window
    v = plan.virtual_stages
    forward: list[tuple[float, ...]] = []
    backward: list[tuple[float, ...]] = []
    weight: list[tuple[float, ...]] = []
    for stage in plan.stages:
        f_row: list[float] = []
        b_row: list[float] = []
        w_row: list[float] = []
        for c, (blocks, recomputed) in enumerate(
            zip(stage.blocks_per_chunk, stage.recomputed_blocks_per_chunk, strict=True)
        ):
            del blocks, recomputed
            f = plan.chunk_forward_s(stage, c)
            b = plan.chunk_backward_s(stage, c)
            if stage.has_embedding and c == 0:
                f += plan.embedding.forward.critical_path_s
                b += plan.embedding.backward.critical_path_s
            if stage.first_layers_chunk == c:
                f += plan.first_layers.forward.critical_path_s
                b += plan.first_layers.backward.critical_path_s
            if stage.has_lm_head and c == v - 1:
                f += plan.lm_head.forward.critical_path_s + plan.mtp.forward.critical_path_s
                b += plan.lm_head.backward.critical_path_s + plan.mtp.backward.critical_path_s
            if stage.last_layers_chunk == c:
                f += plan.last_layers.forward.critical_path_s
                b += plan.last_layers.backward.critical_path_s
            f_row.append(f)
            b_row.append(b)
            moe, _ = stage.chunk_moe(c)
            windowed, _, moe_windowed, _ = stage.chunk_windowed(c)
            w_row.append(
                (stage.blocks_per_chunk[c] - moe) * block.backward_weight.critical_path_s
                + moe * moe_block.backward_weight.critical_path_s
                + windowed * window.backward_weight.critical_path_s
                + moe_windowed * moe_window.backward_weight.critical_path_s
            )
        forward.append(tuple(f_row))
        backward.append(tuple(b_row))
        weight.append(tuple(w_row))
    return tuple(forward), tuple(backward), tuple(weight)


def _mirrored(matrix: Matrix) -> Matrix:
    return tuple((row[0], mirror[0]) for row, mirror in zip(matrix, reversed(matrix), strict=True))


def _p2p_link(
    plan: PortablePlanIR, spec: TrainingSpec, system: SystemSpec
) -> tuple[float, float, float]:
    """(latency, bytes, effective bandwidth) of one P2P message on the PP group's link."""
    if plan.pipeline_degree == 1 or plan.p2p_bytes == 0:
        return 0.0, 0.0, math.inf
    if not math.isclose(plan.p2p_forward_s, plan.p2p_backward_s, rel_tol=P2P_TOLERANCE):
        raise UnsupportedError(
            "simulating a plan: the simulator models one P2P time for both directions, the plan "
            f"has forward {plan.p2p_forward_s} s and backward {plan.p2p_backward_s} s"
        )
    group = PlanContext(spec=spec, system=system).group(ParallelDim.PIPELINE)
    size = float(plan.p2p_bytes)
    latency, bandwidth = collective_alpha_beta(
        CollectiveKind.P2P, size, group.size, system.link(group.tier)
    )
    time = latency + size / bandwidth
    if not math.isclose(time, plan.p2p_forward_s, rel_tol=P2P_TOLERANCE):
        raise VerificationError(
            f"simulating a plan: P2P time {time} s on the {group.tier} link differs from "
            f"PortablePlanIR's p2p_forward_s {plan.p2p_forward_s} s"
        )
    return latency, size, bandwidth


def _dp_buckets(
    plan: PortablePlanIR, spec: TrainingSpec, system: SystemSpec
) -> tuple[tuple[DpBucket, ...], ...]:
    mapping = spec.mapping
    if mapping.dense_gradient_degree == 1:  # d x cp ranks share the dense gradients
        return ()
    recipe = training_recipe(spec.model, spec.mapping)
    context = PlanContext(spec=spec, system=system)
    groups = (context.gradient_group(), context.expert_gradient_group())
    v = plan.virtual_stages
    # The longest chunk's backward over every stage: one value for the whole pipeline.
    chunk_backward_s = plan.backward_chunk_s()
    out: list[tuple[DpBucket, ...]] = []
    for stage in plan.stages:
        params = stage_parameters(spec.model, mapping, stage.index)
        windows = OverlapWindows(
            blocks_per_chunk=max(stage.blocks_per_chunk),
            virtual_stages=v,
            pipeline_degree=plan.pipeline_degree,
            block_backward_s=plan.stage_block_backward_s(stage),
            chunk_backward_s=chunk_backward_s,
            stage_forward_s=sum(
                plan.chunk_forward_s(stage, c) for c in range(len(stage.blocks_per_chunk))
            ),
            microbatch_count=mapping.microbatch_count,
        )
        sync_s = stage_data_parallel_cost(
            data=mapping.parallelism.data,
            parameters=(params.dense_total, params.expert_total),
            param_bytes=recipe.param,
            grad_bytes=recipe.grad,
            groups=groups,
            system=system,
            windows=windows,
        ).grad_sync_s
        moe_block = params.moe_dense_parameters + params.expert_parameters
        shares = [
            (blocks - moe) * params.block_parameters + moe * moe_block
            for blocks, (moe, _) in zip(
                stage.blocks_per_chunk,
                (stage.chunk_moe(c) for c in range(len(stage.blocks_per_chunk))),
                strict=True,
            )
        ]
        shares[0] += params.embedding
        shares[v - 1] += params.output_layer + params.final_norm
        total = sum(shares)
        out.append(
            tuple(
                DpBucket(chunk=c, duration_s=sync_s * share / total if total else 0.0)
                for c, share in enumerate(shares)
            )
        )
    return tuple(out)


def _unpaired(plan: PortablePlanIR, spec: TrainingSpec) -> tuple[Matrix | None, Matrix | None]:
    timing = plan.ep_overlap
    if timing is None or not isinstance(
        spec.mapping.parallelism.pipeline.schedule, CombinedOneForwardOneBackward
    ):
        return None, None
    moe = [[stage.chunk_moe(c)[0] for c in range(plan.virtual_stages)] for stage in plan.stages]
    windowed = [
        [stage.chunk_windowed(c)[2] for c in range(plan.virtual_stages)] for stage in plan.stages
    ]
    window_forward, window_backward = plan.unpaired_window_change_s()

    def matrix(per_layer: float, window_change: float) -> Matrix:
        return tuple(
            tuple(n * per_layer + w * window_change for n, w in zip(row, wrow, strict=True))
            for row, wrow in zip(moe, windowed, strict=True)
        )

    return (
        matrix(timing.unpaired_forward_s, window_forward),
        matrix(timing.unpaired_backward_s, window_backward),
    )


def schedule_costs(
    plan: PortablePlanIR, spec: TrainingSpec, system: SystemSpec, *, with_dp: bool = True
) -> ScheduleCosts:
    """The simulator's costs of ``plan`` (module docstring); ``with_dp=False`` leaves out the
    data-parallel buckets (the plan path's pipeline-only runs)."""
    forward, backward, weight = _chunk_matrices(plan)
    buckets = _dp_buckets(plan, spec, system) if with_dp else ()
    if isinstance(spec.mapping.parallelism.pipeline.schedule, DualPipe):
        # Chunk 1 of rank r is stage p - 1 - r of the reverse direction: the same costs.
        forward, backward, weight = (_mirrored(x) for x in (forward, backward, weight))
        # Each copy reduces its own gradients over DP (the two copies' sum is not modelled).
        buckets = tuple(
            (
                *(DpBucket(chunk=0, duration_s=b.duration_s) for b in own),
                *(DpBucket(chunk=1, duration_s=b.duration_s) for b in mirror),
            )
            for own, mirror in zip(buckets, reversed(buckets), strict=True)
        )
    latency, size, bandwidth = _p2p_link(plan, spec, system)
    unpaired_forward, unpaired_backward = _unpaired(plan, spec)
    return ScheduleCosts(
        unpaired_forward_s=unpaired_forward,
        unpaired_backward_s=unpaired_backward,
        pipeline_degree=plan.pipeline_degree,
        microbatch_count=spec.mapping.microbatch_count,
        forward_s=forward,
        backward_s=backward,
        weight_grad_s=weight,
        p2p_latency_s=latency,
        p2p_bytes=size,
        p2p_bandwidth_bytes_per_s=bandwidth,
        dp_buckets=buckets,
        overlap_grad_reduce=spec.mapping.parallelism.data.overlap_grad_reduce,
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedBubble:
    """What the plan path reads from its pipeline-only runs (DP buckets free).

    ``bubble_s``: idle time of the busiest rank with P2P free, the schedule's own bubble (the
    figure the seed's contract estimates). ``p2p_exposed_s``: how much real P2P transfers delay
    the pipeline flush. The busiest rank's work + ``bubble_s`` + ``p2p_exposed_s`` is the
    simulated pipeline flush ``pipeline_flush_s``.
    """

    bubble_s: float
    p2p_exposed_s: float
    pipeline_flush_s: float
    busiest_rank_busy_s: float


@final
@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PlanSimulation:
    """One DAG of a plan's iteration (compute, P2P, DP buckets) run three ways: ``free`` with
    P2P and DP free (the schedule's own bubble), ``pipeline`` with DP free (the pipeline flush
    the plan's total uses) and ``full`` with every cost (``blueprinting simulate``).

    ``full`` runs when first read where DP buckets interleave with transfers
    (``overlap_grad_reduce``): the other two runs then take the compute-only wavefront and the
    full one the wavefront over every command, which the plan path (its bubble) never needs."""

    free: SimulationResult
    pipeline: SimulationResult
    full_durations: FloatArray
    _full: list[SimulationResult] = field(default_factory=list)

    @property
    def full(self) -> SimulationResult:
        if not self._full:
            self._full.append(simulate_many(self.pipeline.dag, [self.full_durations])[0])
        return self._full[0]

    @property
    def bubble(self) -> SimulatedBubble:
        return SimulatedBubble(
            bubble_s=self.free.bubble_s,
            p2p_exposed_s=self.pipeline.pipeline_flush_s - self.free.pipeline_flush_s,
            pipeline_flush_s=self.pipeline.pipeline_flush_s,
            busiest_rank_busy_s=max(self.pipeline.busy_s_per_rank),
        )


def simulate_plan_all(
    plan: PortablePlanIR,
    spec: TrainingSpec,
    system: SystemSpec,
    *,
    allow_megatron_refused: bool = False,
) -> PlanSimulation:
    """Build ``plan``'s DAG once and run it with P2P and DP free, with DP free, and in full.

    A zero-duration DP bucket never delays anything (the transfer behind it waits for a later
    compute command of the same rank anyway), so the first two runs equal simulations without
    buckets. Raises :class:`~blueprinting.errors.InvalidStrategyError` for a schedule Megatron
    refuses unless ``allow_megatron_refused`` (then it may deadlock:
    :class:`~blueprinting.errors.DeadlockError`)."""
    schedule = spec.mapping.parallelism.pipeline.schedule
    dag = build_schedule(
        schedule,
        schedule_costs(plan, spec, system),
        allow_megatron_refused=allow_megatron_refused,
    )
    full = dag.duration_s
    pipeline = np.where(dag.kind == _DP, 0.0, full)
    free = np.where(dag.kind >= _SEND_F, 0.0, full)
    if dag.costs.overlap_grad_reduce:
        runs = simulate_many(dag, [free, pipeline])
        return PlanSimulation(free=runs[0], pipeline=runs[1], full_durations=full)
    runs = simulate_many(dag, [free, pipeline, full])
    return PlanSimulation(free=runs[0], pipeline=runs[1], full_durations=full, _full=[runs[2]])


def simulated_bubble(
    plan: PortablePlanIR,
    spec: TrainingSpec,
    system: SystemSpec,
    *,
    allow_megatron_refused: bool = False,
) -> SimulatedBubble:
    """The bubble of :func:`simulate_plan_all` (raises like it)."""
    return simulate_plan_all(
        plan, spec, system, allow_megatron_refused=allow_megatron_refused
    ).bubble


def simulate_plan(
    plan: PortablePlanIR,
    spec: TrainingSpec,
    system: SystemSpec,
    *,
    allow_megatron_refused: bool = False,
) -> SimulationResult:
    """The full simulation of one iteration of ``plan``: compute, P2P and DP buckets.

    ``allow_megatron_refused`` simulates a schedule Megatron-LM refuses at start-up as the
    hypothetical it is (it may deadlock: :class:`~blueprinting.errors.DeadlockError`)."""
    return simulate_plan_all(plan, spec, system, allow_megatron_refused=allow_megatron_refused).full
