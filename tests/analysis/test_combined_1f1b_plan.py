"""Qwen3-30B-A3B on 32 H100 (t 1, p 4, v 3, EP 8, alltoall) with Megatron's EP overlap: the
plan runs combined 1F1B, its MoE layers at the co-scheduled steady state plus the unpaired
warm-up / cool-down passes, ``--delay-wgrad-compute`` hides part of the backward's exchanges,
and the figures follow exactly from the cost inputs (``plan --json`` ``ep_comm``)."""

from __future__ import annotations

import pytest

from blueprinting.analysis.report import IterationReport
from blueprinting.api import plan
from blueprinting.errors import InvalidStrategyError
from blueprinting.mapping.flat_keys import from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.transformer import CombinedOneForwardOneBackward
from blueprinting.simulator.from_plan import simulate_plan_all

EXACT = 1e-12

BASE: dict[str, object] = {
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 4,
    "num_virtual_stages_per_pipeline_rank": 3,
    "expert_model_parallel_size": 8,
    "micro_batch_size": 1,
    "global_batch_size": 256,
    "use_distributed_optimizer": True,
    "overlap_grad_reduce": True,
    "moe_token_dispatcher_type": "alltoall",
    "moe_grouped_gemm": True,
}
OVERLAP = {**BASE, "overlap_moe_expert_parallel_comm": True}
DELAYED = {**OVERLAP, "delay_wgrad_compute": True}


def _plan(settings: dict[str, object]) -> IterationReport:
    return plan(model="qwen3-30b-a3b", system="dgx-h100", gpus=32, settings=settings)


def test_the_ep_overlap_selects_combined_1f1b_and_the_flags_come_back() -> None:
    report = _plan(DELAYED)
    spec = report.spec
    assert spec.mapping.parallelism.pipeline.schedule == CombinedOneForwardOneBackward(
        virtual_stages=3, overlap_p2p_comm=True
    )
    assert str(spec.mapping.parallelism.pipeline.schedule) == "combined-1F1B x3"
    flat = to_mapping(spec)
    assert flat["overlap_moe_expert_parallel_comm"] is True
    assert flat["delay_wgrad_compute"] is True
    assert from_mapping(flat, model=spec.model).mapping == spec.mapping
    args = to_megatron_args(spec)
    assert "--overlap-moe-expert-parallel-comm" in args
    assert "--delay-wgrad-compute" in args
    assert args[args.index("--num-virtual-stages-per-pipeline-rank") + 1] == "3"


def test_delay_wgrad_without_the_ep_overlap_is_a_law() -> None:
    with pytest.raises(InvalidStrategyError) as raised:
        _plan({**BASE, "delay_wgrad_compute": True})
    laws = [v.law for v in raised.value.violations]
    assert laws == ["delay_wgrad_needs_ep_overlap"]


@pytest.mark.parametrize("settings", [OVERLAP, DELAYED], ids=["overlap", "delay-wgrad"])
def test_ep_comm_exposed_is_the_steady_state_plus_the_unpaired_passes(
    settings: dict[str, object],
) -> None:
    """ep_comm_exposed = m x MoE blocks x the MoE block's exposed exchanges (the pair's
    exposed part, split over forward and backward) + warm x MoE blocks / v x (unpaired forward
    + unpaired backward), warm = min(2(p-r-1) + (v-1)p + 1, m v) on the critical stage r."""
    report = _plan(settings)
    ir, timing = report.plan, report.plan.ep_overlap
    assert timing is not None and ir.moe_block is not None
    moe = ir.moe_block
    assert moe.forward.ep_comm_exposed_s == pytest.approx(timing.forward_exposed_s, abs=EXACT)
    assert moe.backward_activation.ep_comm_exposed_s + moe.backward_weight.ep_comm_exposed_s == (
        pytest.approx(timing.backward_exposed_s, abs=EXACT)
    )
    stage = ir.critical_stage()
    p, v, m = 4, 3, report.spec.mapping.microbatch_count
    assert m == 256 // 8
    warm = min(2 * (p - stage.index - 1) + (v - 1) * p + 1, m * v)
    unpaired = (
        warm * stage.moe_blocks / v * (timing.unpaired_forward_s + timing.unpaired_backward_s)
    )
    steady = m * stage.moe_blocks * timing.exposed_s
    assert report.breakdown.ep_comm_exposed == pytest.approx(steady + unpaired, rel=1e-12)
    ep = report.to_json_dict()["ep_comm"]
    assert isinstance(ep, dict)
    combined = ep["combined_1f1b"]
    assert isinstance(combined, dict)
    assert combined["unpaired_exposed_s"] == pytest.approx(unpaired, rel=1e-12)
    assert combined["pair_hidden_s"] == pytest.approx(timing.hidden_s, abs=EXACT)
    iteration = ep["iteration"]
    assert isinstance(iteration, dict)
    assert iteration["exposed_s"] == pytest.approx(report.breakdown.ep_comm_exposed, rel=1e-12)


def test_delay_wgrad_hides_the_backward_exchanges_of_the_unpaired_backwards() -> None:
    """Qwen3's MoE layer hides all its exchanges in a pair already (its experts outlast the
    all-to-alls): what the pair exposes is only NCCL's 32 of the H100's 132 SMs taken from the
    compute beside the exchanges, f / (1 - f) = 32/100 of their time, with or without the
    delayed wgrad. So the delayed wgrad changes only the cool-down backwards: their dispatch
    runs beside the expert wgrad, and the plan is faster by exactly that."""
    overlap, delayed = _plan(OVERLAP), _plan(DELAYED)
    t0, t1 = overlap.plan.ep_overlap, delayed.plan.ep_overlap
    assert t0 is not None and t1 is not None
    lengthening = 32 / 100 * (t0.forward_exchange_s + t0.backward_exchange_s)
    assert t0.exposed_s == pytest.approx(lengthening, rel=1e-9)
    assert t1.exposed_s == pytest.approx(lengthening, rel=1e-9)
    assert t1.unpaired_forward_s == pytest.approx(t0.unpaired_forward_s, rel=1e-12)
    assert t1.backward_alone_s < t0.backward_alone_s
    stage = overlap.plan.critical_stage()
    warm = min(2 * (4 - stage.index - 1) + 2 * 4 + 1, 32 * 3)
    saved = warm * stage.moe_blocks / 3 * (t0.unpaired_backward_s - t1.unpaired_backward_s)
    assert saved > 0.0
    assert overlap.breakdown.ep_comm_exposed - delayed.breakdown.ep_comm_exposed == pytest.approx(
        saved, rel=1e-9
    )
    # without the EP overlap every exchange is exposed
    plain = _plan(BASE)
    assert plain.plan.ep_overlap is None
    assert plain.breakdown.ep_comm_exposed > overlap.breakdown.ep_comm_exposed


@pytest.mark.parametrize("settings", [OVERLAP, DELAYED], ids=["overlap", "delay-wgrad"])
def test_plan_and_simulation_agree_on_the_pipeline(settings: dict[str, object]) -> None:
    """The plan's pipeline terms (work, exposed communication, bubble, P2P) equal the simulated
    flush without DP buckets: the simulator runs the same co-scheduled pairs and gives the
    unpaired passes the same extras (the remaining plan-simulate difference is the named DP
    terms of ``simulate``)."""
    report = _plan(settings)
    run = simulate_plan_all(report.plan, report.spec, report.system)
    b = report.breakdown
    pipeline = (
        b.forward
        + b.backward
        + b.recompute
        + b.pipeline_bubble
        + b.tp_comm_exposed
        + b.cp_comm_exposed
        + b.ep_comm_exposed
        + b.host_exposed
        + b.pp_comm_exposed
    )
    assert pipeline == pytest.approx(run.pipeline.pipeline_flush_s, rel=1e-9)
