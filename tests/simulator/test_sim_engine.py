"""Simulated schedules against the closed forms of shared/reference/schedules.md (sections 4-6)
and the seed's analytic contract; exact where the math is exact (durations are small dyadic
rationals, so float sums are exact)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blueprinting.errors import ConfigError, DeadlockError, VerificationError
from blueprinting.mapping.transformer import (
    ForwardOnly,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    PipelineSchedule,
    SingleStage,
    ZeroBubbleH1,
)
from blueprinting.simulator import (
    DpBucket,
    ScheduleCosts,
    SimulationResult,
    analytic_contract_bubble,
    build_from_orders,
    build_schedule,
    interleaved_p2p_exposed,
    interleaved_peak_inflight,
    megatron_violations,
    one_f_one_b_p2p_exposed,
    one_f_one_b_peak_inflight,
    plot_timeline,
    simulate,
    write_chrome_trace,
)
from blueprinting.simulator.schedules import RankOrder

TF, TB = 1.0, 2.0


def _run(
    schedule: PipelineSchedule,
    p: int,
    m: int,
    v: int = 1,
    *,
    tw: float = 0.0,
    c: float = 0.0,
    allow: bool = False,
) -> SimulationResult:
    costs = ScheduleCosts.uniform(
        pipeline_degree=p,
        microbatch_count=m,
        virtual_stages=v,
        forward_s=TF,
        backward_s=TB,
        weight_grad_s=tw,
        p2p_latency_s=c,
    )
    return simulate(build_schedule(schedule, costs, allow_megatron_refused=allow))


def _legal_interleaved(p: int, v: int, m: int) -> list[InterleavedOneForwardOneBackward]:
    out = []
    for overlap in (False, True):
        for n in range(p, m + 1):
            schedule = InterleavedOneForwardOneBackward(
                virtual_stages=v, microbatch_group_size=n, overlap_p2p_comm=overlap
            )
            if not megatron_violations(schedule, p, m, v):
                out.append(schedule)
    return out


@pytest.mark.parametrize("p", range(1, 9))
def test_one_f_one_b_bubble_and_peaks(p: int) -> None:
    for m in range(1, 4 * p + 4):
        result = _run(OneForwardOneBackward(), p, m)
        assert result.bubble_s == (p - 1) * (TF + TB)
        assert result.makespan_s == (m + p - 1) * (TF + TB)
        assert result.busy_s_per_rank == (m * (TF + TB),) * p
        expected = tuple(one_f_one_b_peak_inflight(p, m, r) for r in range(p))
        assert result.peak_inflight_per_rank == expected


@pytest.mark.parametrize("p", range(2, 9))
def test_interleaved_bubble_and_peaks_on_every_legal_configuration(p: int) -> None:
    cases = 0
    for v in range(2, 5):
        for m in range(1, 4 * p + 4):
            for schedule in _legal_interleaved(p, v, m):
                n = schedule.microbatch_group_size
                assert n is not None
                result = _run(schedule, p, m, v)
                assert result.bubble_s == (p - 1) * (TF + TB), (v, m, schedule)
                expected = tuple(interleaved_peak_inflight(p, v, m, n, r) for r in range(p))
                assert result.peak_inflight_per_rank == expected, (v, m, schedule)
                cases += 1
    assert cases > 0


def test_single_stage_and_forward_only() -> None:
    result = _run(SingleStage(), 1, 5)
    assert result.bubble_s == 0.0
    assert result.makespan_s == 5 * (TF + TB)
    result = _run(ForwardOnly(), 4, 6)
    assert result.bubble_s == 3 * TF
    assert result.peak_inflight_per_rank == (1, 1, 1, 1)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_one_f_one_b_p2p_latency_closed_form(p: int) -> None:
    c = 0.0625
    for m in range(2, 4 * p + 4):
        exposed = _run(OneForwardOneBackward(), p, m, c=c).makespan_s - (m + p - 1) * (TF + TB)
        assert exposed == pytest.approx(one_f_one_b_p2p_exposed(p, m, c), abs=1e-9)


@pytest.mark.parametrize("p", [3, 4, 8])
def test_interleaved_overlapped_p2p_latency_closed_form(p: int) -> None:
    c = 0.0625
    for v in (2, 3, 4):
        for m in (p, 2 * p, 4 * p):
            schedule = InterleavedOneForwardOneBackward(virtual_stages=v, overlap_p2p_comm=True)
            base = _run(schedule, p, m, v).makespan_s
            exposed = _run(schedule, p, m, v, c=c).makespan_s - base
            assert exposed == pytest.approx(interleaved_p2p_exposed(p, v, c), abs=1e-9)
            # A group size N > p warms up longer and hides part of the fill latency.
            if m >= p + 1:
                wide = InterleavedOneForwardOneBackward(
                    virtual_stages=v, microbatch_group_size=m, overlap_p2p_comm=True
                )
                hidden = _run(wide, p, m, v, c=c).makespan_s - _run(wide, p, m, v).makespan_s
                assert hidden <= interleaved_p2p_exposed(p, v, c) + 1e-9


def test_analytic_contract_formula() -> None:
    assert analytic_contract_bubble(4, 1, 8, TF, TB) == 9.0
    assert analytic_contract_bubble(4, 2, 8, TF, TB) == 9.0
    assert analytic_contract_bubble(4, 2, 6, TF, TB) == (3 + 1 * 2) * 3.0
    assert (
        analytic_contract_bubble(4, 3, 9, TF, TB, imbalance_correction=1.5)
        == (3 + 2 * 3) * 3.0 - 1.5
    )


@pytest.mark.parametrize("p", [3, 4, 5, 8])
def test_contract_overestimates_legal_interleaving_when_m_mod_p_nonzero(p: int) -> None:
    """Megatron runs m mod p != 0 only with N > p; the simulated bubble stays (p-1)(tf+tb) and
    the contract overestimates it by exactly (v-1)(p - m mod p)(tf+tb)."""
    checked = 0
    for v in (2, 3, 4):
        for m in range(p + 1, 4 * p + 4):
            if m % p == 0:
                continue
            for schedule in _legal_interleaved(p, v, m):
                simulated = _run(schedule, p, m, v).bubble_s
                contract = analytic_contract_bubble(p, v, m, TF, TB)
                assert contract - simulated == (v - 1) * (p - m % p) * (TF + TB)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("p", [3, 4, 5, 8])
def test_contract_extra_term_is_exact_for_refused_single_short_group(p: int) -> None:
    """v >= 2 with m < p (one short group, Megatron refuses N > m): the extra term holds."""
    for v in (2, 3, 4):
        for m in range(1, p):
            schedule = InterleavedOneForwardOneBackward(virtual_stages=v)
            simulated = _run(schedule, p, m, v, allow=True).bubble_s
            assert simulated == analytic_contract_bubble(p, v, m, TF, TB)


@pytest.mark.parametrize("p", range(2, 9))
def test_zero_bubble_h1(p: int) -> None:
    """Qi et al. 2023, Section 3.1: bubble (p-1)(T_F + T_B - T_W) with T_B the input-gradient
    pass only; with tb the full backward (T_B = tb - tw) that is (p-1)(tf + tb - 2 tw)."""
    for tw in (0.0, 0.25, 0.5, 1.0):
        for m in range(p, 3 * p + 2):
            result = _run(ZeroBubbleH1(), p, m, tw=tw)
            assert result.bubble_s == (p - 1) * (TF + (TB - tw) - tw), (tw, m)
            assert result.peak_inflight_per_rank == (p,) * p
            assert result.busy_s_per_rank == (m * (TF + TB),) * p


def test_dp_buckets_overlapped_and_not() -> None:
    p, m = 4, 8
    base = ScheduleCosts.uniform(pipeline_degree=p, microbatch_count=m, forward_s=TF, backward_s=TB)
    buckets = tuple((DpBucket(chunk=0, duration_s=1.5),) for _ in range(p))

    def with_buckets(overlap: bool) -> ScheduleCosts:
        return ScheduleCosts(
            pipeline_degree=p,
            microbatch_count=m,
            forward_s=base.forward_s,
            backward_s=base.backward_s,
            dp_buckets=buckets,
            overlap_grad_reduce=overlap,
        )

    plain = simulate(build_schedule(OneForwardOneBackward(), with_buckets(False)))
    flush = (m + p - 1) * (TF + TB)
    assert plain.pipeline_flush_s == flush
    assert plain.makespan_s == flush + 1.5
    # One bucket per stage, ready at the stage's last backward: overlapping cannot help here.
    overlapped = simulate(build_schedule(OneForwardOneBackward(), with_buckets(True)))
    assert overlapped.makespan_s == flush + 1.5
    assert overlapped.comm_busy_s_per_rank == (1.5,) * p


def test_uneven_first_and_last_stage() -> None:
    """schedules.md section 4 example: p=4, stage blocks 2,1,1,1, f=1, b=2 per block; the
    simulated rank-0 bubble is 3."""
    f = ((2.0,), (1.0,), (1.0,), (1.0,))
    b = ((4.0,), (2.0,), (2.0,), (2.0,))
    costs = ScheduleCosts(pipeline_degree=4, microbatch_count=4, forward_s=f, backward_s=b)
    result = simulate(build_schedule(OneForwardOneBackward(), costs))
    assert result.busy_s_per_rank == (24.0, 12.0, 12.0, 12.0)
    assert result.bubble_s == result.idle_s_per_rank[0] == 3.0


def test_deadlock_is_reported_with_stuck_commands() -> None:
    costs = ScheduleCosts.uniform(pipeline_degree=2, microbatch_count=2, forward_s=1, backward_s=2)
    # Rank 0 waits for B1 before it sends F1, which rank 1 needs to produce B1.
    orders = [
        RankOrder(ops=[(0, 0, 0), (1, 0, 0), (1, 0, 1), (0, 0, 1)]),
        RankOrder(ops=[(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1)]),
    ]
    with pytest.raises(VerificationError, match="backward before its forward"):
        build_from_orders(OneForwardOneBackward(), costs, orders)
    # Legal per rank, but rank 1 runs microbatch 1 first: rank 0's B0 waits for rank 1's B0,
    # which comes after rank 1's F1, which needs rank 0's F1, which comes after B0.
    orders[0] = RankOrder(ops=[(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1)])
    orders[1] = RankOrder(ops=[(0, 0, 1), (1, 0, 1), (0, 0, 0), (1, 0, 0)])
    dag = build_from_orders(OneForwardOneBackward(), costs, orders)
    with pytest.raises(DeadlockError) as caught:
        simulate(dag)
    assert caught.value.stuck == (
        "rank 0 B0.0",
        "rank 0 send_fwd mb 1 chunk 0 -> rank 1",
        "rank 1 F1.0",
        "rank 1 send_bwd mb 1 chunk 0 -> rank 0",
    )
    assert str(caught.value).startswith("simulating 1F1B: 4 stream(s) stuck")


def test_costs_report_every_problem() -> None:
    with pytest.raises(ConfigError) as caught:
        ScheduleCosts(
            pipeline_degree=2,
            microbatch_count=2,
            forward_s=((1.0,), (-1.0,)),
            backward_s=((1.0,),),
            p2p_latency_s=-1.0,
        )
    assert caught.value.problems == (
        "forward_s entries must be finite and non-negative",
        "backward_s must be a 2 x 1 matrix [stage][chunk]",
        "p2p_latency_s must be finite and non-negative, got -1.0",
    )


def test_chrome_trace_has_one_event_per_command(tmp_path: Path) -> None:
    result = _run(InterleavedOneForwardOneBackward(virtual_stages=2), 4, 8, 2, c=0.125)
    path = write_chrome_trace(result, tmp_path / "trace.json")
    document = json.loads(path.read_text())
    complete = [e for e in document["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(result.dag)
    assert {e["pid"] for e in complete} == {0, 1, 2, 3}
    assert {e["tid"] for e in complete} == {0, 1}
    first = min(complete, key=lambda e: (e["pid"], e["ts"]))
    assert first["name"] == "F0.0"
    assert first["dur"] == 1e6


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_timeline_writes_a_picture(tmp_path: Path, suffix: str) -> None:
    result = _run(ZeroBubbleH1(), 4, 8, tw=0.5)
    path = plot_timeline(result, tmp_path / f"timeline{suffix}")
    assert path.stat().st_size > 1000
