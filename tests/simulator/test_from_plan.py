"""PortablePlanIR -> ScheduleCosts -> simulation, on the GPT-3 175B example (TP8 PP8 v3, m = 96,
examples/gpt3-175b-selene.toml), and the plan path that uses the simulated bubble.

Exact identities (sums of the same floats) are checked to 1e-12 relative; closed forms of
shared/reference/schedules.md section 4-6 to 1e-9 relative (the simulation adds the same chunk
times in a different order).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.simulator.reference_engine import reference_build_schedule, reference_simulate

from blueprinting.analysis.bubble_comparison import compare_bubble
from blueprinting.analysis.evaluate import PlanOptions, portable_plan
from blueprinting.analysis.iteration import BubbleSource
from blueprinting.api import plan_spec
from blueprinting.hardware.system import SystemSpec
from blueprinting.hardware.system_mapping import system_from_mapping
from blueprinting.mapping.config_file import load_config
from blueprinting.mapping.transformer import (
    OneForwardOneBackward,
    PipelineSchedule,
    SingleStage,
    TrainingSpec,
    ZeroBubbleH1,
)
from blueprinting.simulator import (
    build_schedule,
    interleaved_p2p_exposed,
    one_f_one_b_p2p_exposed,
    simulate,
)
from blueprinting.simulator.from_plan import (
    MAX_SIMULATED_PASSES,
    schedule_costs,
    simulate_plan,
    simulate_plan_all,
    simulated_bubble,
    simulation_obstacle,
)
from blueprinting.synthesizer.stages.portable_plan.ir import NO_EXTRA, PortablePlanIR

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt3-175b-selene.toml"
EXACT = 1e-12
MODEL = 1e-9


@pytest.fixture(scope="module")
def gpt3() -> tuple[TrainingSpec, SystemSpec]:
    config = load_config(EXAMPLE)
    assert config.training is not None
    return config.training, system_from_mapping(dict(config.system), source=config.source)


def _with_schedule(spec: TrainingSpec, schedule: PipelineSchedule) -> TrainingSpec:
    pipeline = replace(spec.mapping.parallelism.pipeline, schedule=schedule)
    parallelism = replace(spec.mapping.parallelism, pipeline=pipeline)
    return replace(spec, mapping=replace(spec.mapping, parallelism=parallelism))


def _bare(plan: PortablePlanIR) -> PortablePlanIR:
    """The plan without first/last-stage extras: every chunk costs the same."""
    return replace(plan, embedding=NO_EXTRA, lm_head=NO_EXTRA)


def _chunk_compute(plan: PortablePlanIR) -> tuple[float, float, float]:
    """(tf, tb, tw) of the largest chunk, P2P excluded (tb includes recompute)."""
    tf = plan.forward_chunk_s() - plan.p2p_forward_s
    tb = plan.backward_chunk_s() - plan.p2p_backward_s
    tw = plan.max_blocks_per_chunk * plan.block.backward_weight.critical_path_s
    return tf, tb, tw


def test_costs_have_plan_shapes_and_sums(gpt3: tuple[TrainingSpec, SystemSpec]) -> None:
    spec, system = gpt3
    plan = portable_plan(spec, system)
    costs = schedule_costs(plan, spec, system)
    p, v, m = 8, 3, 96
    assert (costs.pipeline_degree, costs.virtual_stages, costs.microbatch_count) == (p, v, m)
    assert costs.weight_grad_s is not None
    block = plan.block
    for stage in plan.stages:
        r = stage.index
        assert stage.blocks_per_chunk == (4, 4, 4)
        forward = stage.blocks * block.forward_s
        backward = stage.blocks * block.backward_s
        backward += stage.recomputed_blocks * block.recompute.critical_path_s
        if r == 0:
            forward += plan.embedding.forward.critical_path_s
            backward += plan.embedding.backward.critical_path_s
        if r == p - 1:
            forward += plan.lm_head.forward.critical_path_s
            backward += plan.lm_head.backward.critical_path_s
        assert math.isclose(sum(costs.forward_s[r]), forward, rel_tol=EXACT)
        assert math.isclose(sum(costs.backward_s[r]), backward, rel_tol=EXACT)
        assert math.isclose(
            sum(costs.weight_grad_s[r]),
            stage.blocks * block.backward_weight.critical_path_s,
            rel_tol=EXACT,
        )
        # Per microbatch, forward + backward of a stage is PortablePlanIR's stage critical path.
        assert math.isclose(
            sum(costs.forward_s[r]) + sum(costs.backward_s[r]),
            plan.stage_microbatch_compute_s(stage),
            rel_tol=EXACT,
        )
    # The extras sit on virtual stage 0 (rank 0, chunk 0) and p*v - 1 (rank p-1, chunk v-1).
    middle = costs.forward_s[3][1]
    assert costs.forward_s[0][0] > middle == costs.forward_s[0][1]
    assert costs.forward_s[p - 1][v - 1] > middle == costs.forward_s[p - 1][0]


def test_p2p_time_is_the_plans(gpt3: tuple[TrainingSpec, SystemSpec]) -> None:
    spec, system = gpt3
    plan = portable_plan(spec, system)
    costs = schedule_costs(plan, spec, system)
    # 2048 x 12288 bf16 activations, sequence-parallel over t = 8.
    assert costs.p2p_bytes == plan.p2p_bytes == 2048 * 12288 * 2 // 8
    assert costs.p2p_latency_s > 0.0
    assert math.isclose(costs.p2p_time_s, plan.p2p_forward_s, rel_tol=EXACT)


def test_dp_buckets_split_the_stage_reduction(gpt3: tuple[TrainingSpec, SystemSpec]) -> None:
    spec, system = gpt3
    report = plan_spec(spec, system, PlanOptions(bubble_source=BubbleSource.CONTRACT))
    costs = schedule_costs(report.plan, spec, system)
    assert len(costs.dp_buckets) == 8
    assert all([b.chunk for b in buckets] == [0, 1, 2] for buckets in costs.dp_buckets)
    assert costs.overlap_grad_reduce is spec.mapping.parallelism.data.overlap_grad_reduce
    # The report's DP figure is the critical stage's; its buckets add up to it.
    critical = report.plan.critical_stage().index
    total = sum(b.duration_s for b in costs.dp_buckets[critical])
    assert math.isclose(total, report.data_parallel.grad_sync_s, rel_tol=EXACT)
    # Middle stages hold 12 equal blocks in 3 chunks: equal buckets.
    middle = [b.duration_s for b in costs.dp_buckets[3]]
    assert middle[0] == middle[1] == middle[2]
    assert not schedule_costs(report.plan, spec, system, with_dp=False).dp_buckets


def test_even_interleaved_bubble_is_p_minus_1_chunks(
    gpt3: tuple[TrainingSpec, SystemSpec],
) -> None:
    """schedules.md section 4: every schedule Megatron accepts has bubble (p-1)(tf+tb) for
    uniform chunks and free P2P; with overlapped P2P, 2(pv-1)c of P2P delay."""
    spec, system = gpt3
    plan = _bare(portable_plan(spec, system))
    tf, tb, _ = _chunk_compute(plan)
    simulated = simulated_bubble(plan, spec, system)
    assert math.isclose(simulated.bubble_s, 7 * (tf + tb), rel_tol=MODEL)
    c = plan.p2p_forward_s
    assert math.isclose(simulated.p2p_exposed_s, interleaved_p2p_exposed(8, 3, c), rel_tol=MODEL)
    # The same through the full costs with P2P zeroed.
    costs = replace(
        schedule_costs(plan, spec, system, with_dp=False),
        p2p_latency_s=0.0,
        p2p_bytes=0.0,
    )
    result = simulate(build_schedule(spec.mapping.parallelism.pipeline.schedule, costs))
    assert math.isclose(result.bubble_s, 7 * (tf + tb), rel_tol=MODEL)
    assert result.peak_inflight_per_rank == tuple(2 * (8 - r - 1) + 2 * 8 + 1 for r in range(8))


def test_non_interleaved_and_zero_bubble(gpt3: tuple[TrainingSpec, SystemSpec]) -> None:
    spec, system = gpt3
    one_f = _with_schedule(spec, OneForwardOneBackward())
    plan = _bare(portable_plan(one_f, system))
    tf, tb, tw = _chunk_compute(plan)
    c = plan.p2p_forward_s
    simulated = simulated_bubble(plan, one_f, system)
    assert math.isclose(simulated.bubble_s, 7 * (tf + tb), rel_tol=MODEL)
    assert math.isclose(simulated.p2p_exposed_s, one_f_one_b_p2p_exposed(8, 96, c), rel_tol=MODEL)
    # ZB-H1 (Qi et al. 2023, Section 3.1): (p-1)(T_F + T_B - T_W) with T_B = tb - tw.
    zb = _with_schedule(spec, ZeroBubbleH1())
    plan = _bare(portable_plan(zb, system))
    assert tw <= min(tf, tb - tw)
    simulated = simulated_bubble(plan, zb, system)
    assert math.isclose(simulated.bubble_s, 7 * (tf + (tb - tw) - tw), rel_tol=MODEL)


def test_real_plan_bubble_and_comparison(gpt3: tuple[TrainingSpec, SystemSpec]) -> None:
    """With the extras the busiest rank (the LM head's) idles a little longer than
    (p-1)(tf+tb); the comparison's terms add up to contract - simulated."""
    spec, system = gpt3
    report = plan_spec(spec, system)
    plan = report.plan
    tf, tb, _ = _chunk_compute(plan)
    simulated = simulated_bubble(plan, spec, system)
    extras = plan.lm_head.total_s
    assert 7 * (tf + tb) < simulated.bubble_s < 7 * (tf + tb) + 7 * extras
    comparison = compare_bubble(plan, report.bubble, simulated.bubble_s)
    assert comparison.extra_interleaving_chunks == 0
    parts = (
        comparison.interleaving_term_s
        + comparison.p2p_in_chunk_s
        - comparison.imbalance_correction_s
        + comparison.schedule_residual_s
    )
    assert math.isclose(parts, comparison.difference_s, rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(comparison.p2p_in_chunk_s, 7 * 2 * plan.p2p_forward_s, rel_tol=EXACT)


def test_plan_path_uses_the_simulation(gpt3: tuple[TrainingSpec, SystemSpec]) -> None:
    spec, system = gpt3
    report = plan_spec(spec, system)
    simulated = simulated_bubble(report.plan, spec, system)
    bubble = report.to_json_dict()["bubble"]
    assert isinstance(bubble, dict)
    assert bubble["used"] == "simulated"
    assert bubble["simulated_s"] == simulated.bubble_s
    assert bubble["simulated_p2p_exposed_s"] == simulated.p2p_exposed_s
    b = report.breakdown
    assert b.pipeline_bubble == simulated.bubble_s
    assert b.pp_comm_exposed == simulated.p2p_exposed_s
    # The pipeline part of the total is the simulated flush of the critical (busiest) rank.
    pipeline = (
        b.forward
        + b.backward
        + b.recompute
        + b.tp_comm_exposed
        + b.pipeline_bubble
        + b.pp_comm_exposed
    )
    assert math.isclose(pipeline, simulated.pipeline_flush_s, rel_tol=EXACT)

    contract = plan_spec(spec, system, PlanOptions(bubble_source=BubbleSource.CONTRACT))
    json_contract = contract.to_json_dict()["bubble"]
    assert isinstance(json_contract, dict)
    assert json_contract["used"] == "contract"
    assert json_contract["simulated_s"] == simulated.bubble_s
    assert contract.breakdown.pipeline_bubble == contract.bubble.bubble_s


def test_plan_path_falls_back_when_megatron_refuses(
    gpt3: tuple[TrainingSpec, SystemSpec],
) -> None:
    spec, system = gpt3
    batch = replace(spec.mapping.batch, global_batch_size=97 * 16)
    odd = replace(spec, mapping=replace(spec.mapping, batch=batch))
    report = plan_spec(odd, system, PlanOptions(megatron_rules=False))
    bubble = report.to_json_dict()["bubble"]
    assert isinstance(bubble, dict)
    assert bubble["used"] == "contract"
    assert bubble["simulated_s"] is None
    note = bubble["simulation_note"]
    assert isinstance(note, str)
    assert note.startswith("not simulated: Megatron-LM refuses to run 1F1B x3 with p=8, v=3, m=97")
    assert note.endswith("total falls back to the contract")
    assert report.breakdown.pipeline_bubble == report.bubble.bubble_s
    assert report.megatron_args == ()


def test_obstacles(gpt3: tuple[TrainingSpec, SystemSpec]) -> None:
    spec, system = gpt3
    plan = portable_plan(spec, system)
    schedule = spec.mapping.parallelism.pipeline.schedule
    assert simulation_obstacle(schedule, plan, 96) is None
    assert simulation_obstacle(schedule, plan, 192) is None
    big = simulation_obstacle(schedule, plan, 96 * 1024)
    assert big is not None
    assert big.startswith("4,718,592 compute passes exceed the plan path's simulation limit")


def test_single_stage(gpt3: tuple[TrainingSpec, SystemSpec]) -> None:
    spec, system = gpt3
    pipeline = replace(spec.mapping.parallelism.pipeline, degree=1, schedule=SingleStage())
    data = replace(spec.mapping.parallelism.data, degree=128)
    parallelism = replace(spec.mapping.parallelism, pipeline=pipeline, data=data)
    single = replace(spec, mapping=replace(spec.mapping, parallelism=parallelism))
    plan = portable_plan(single, system)
    m = single.mapping.microbatch_count
    simulated = simulated_bubble(plan, single, system)
    assert simulated.bubble_s == 0.0
    assert simulated.p2p_exposed_s == 0.0
    result = simulate_plan(plan, single, system)
    assert result.bubble_s == 0.0
    assert math.isclose(
        result.busy_s_per_rank[0],
        m * plan.stage_microbatch_compute_s(plan.stages[0]),
        rel_tol=EXACT,
    )
    assert result.makespan_s > result.pipeline_flush_s  # DP reduction after the flush


@settings(max_examples=25, deadline=None)
@given(
    groups=st.integers(min_value=1, max_value=8),
    interleaved=st.booleans(),
)
def test_bubble_conservation_over_batch_sizes(groups: int, interleaved: bool) -> None:
    """For every legal m = 8k: the bare plan's simulated bubble is (p-1)(tf+tb), and the plan
    path's pipeline terms add up to the simulated flush of the real plan."""
    config = load_config(EXAMPLE)
    assert config.training is not None
    system = system_from_mapping(dict(config.system), source=config.source)
    spec = config.training
    if not interleaved:
        spec = _with_schedule(spec, OneForwardOneBackward())
    batch = replace(spec.mapping.batch, global_batch_size=16 * 8 * groups)
    spec = replace(spec, mapping=replace(spec.mapping, batch=batch))
    plan = portable_plan(spec, system)
    tf, tb, _ = _chunk_compute(_bare(plan))
    bare = simulated_bubble(_bare(plan), spec, system)
    assert math.isclose(bare.bubble_s, 7 * (tf + tb), rel_tol=MODEL)
    report = plan_spec(spec, system)
    b = report.breakdown
    work = b.forward + b.backward + b.recompute + b.tp_comm_exposed
    real = simulated_bubble(plan, spec, system)
    assert math.isclose(work, real.busiest_rank_busy_s, rel_tol=EXACT)
    assert math.isclose(
        work + b.pipeline_bubble + b.pp_comm_exposed, real.pipeline_flush_s, rel_tol=EXACT
    )


def test_one_dag_three_runs_equal_the_seeds_separate_simulations(
    gpt3: tuple[TrainingSpec, SystemSpec],
) -> None:
    """The plan path's one DAG (DP buckets included, zero-duration in the pipeline-only runs)
    gives bit for bit what the seed's engine gave on its separate DAGs: two without DP buckets
    (with and without P2P) and the full one."""
    spec, system = gpt3
    plan = portable_plan(spec, system)
    schedule = spec.mapping.parallelism.pipeline.schedule
    costs = schedule_costs(plan, spec, system)
    pipeline = schedule_costs(plan, spec, system, with_dp=False)
    free = replace(pipeline, p2p_latency_s=0.0, p2p_bytes=0.0, p2p_bandwidth_bytes_per_s=math.inf)
    runs = simulate_plan_all(plan, spec, system)
    for ran, expected_costs in ((runs.full, costs), (runs.pipeline, pipeline), (runs.free, free)):
        _, end = reference_simulate(reference_build_schedule(schedule, expected_costs))
        compute = [c for c in range(len(end)) if runs.full.dag.kind[c] <= 3]
        assert [float(ran.end_s[c]) for c in compute] == [end[c] for c in compute]
    _, full_end = reference_simulate(reference_build_schedule(schedule, costs))
    assert runs.full.end_s.tolist() == full_end
    assert runs.full.makespan_s == max(full_end)
    bubble = runs.bubble
    assert bubble.bubble_s == runs.free.bubble_s
    assert bubble.p2p_exposed_s == runs.pipeline.pipeline_flush_s - runs.free.pipeline_flush_s


def test_plan_path_simulates_p64_v4_m1024_and_simulate_reuses_it() -> None:
    """Every Megatron-runnable schedule up to the benchmark's size is simulated on the plan
    path (524,288 compute passes, under MAX_SIMULATED_PASSES), and ``simulate`` reuses that
    simulation instead of building the schedule again."""
    from blueprinting.analysis.simulation_report import simulation_report

    config = load_config(
        EXAMPLE.parents[1] / "benchmarks" / "configs" / "deep-256l-p64-v4-m1024.toml"
    )
    assert MAX_SIMULATED_PASSES >= 64 * 4 * 1024 * 2
    assert config.training is not None
    spec = config.training
    system = system_from_mapping(dict(config.system), source=config.source)
    report = plan_spec(spec, system)
    assert report.bubble_source == BubbleSource.SIMULATED
    assert report.simulation is not None
    simulated = simulation_report(report)
    assert simulated.result is report.simulation.full
    assert simulated.result.makespan_s > simulated.result.pipeline_flush_s
