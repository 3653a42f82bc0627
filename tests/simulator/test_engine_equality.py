"""The fast engine (compute-only wavefront on one-dimensional lanes, transfers and DP buckets
timed afterwards) against the seed's event-driven engine (``reference_engine.reference_simulate``,
which the wavefront engine before this rewrite matched bit for bit) on every schedule, DualPipe
and DualPipeV included: start and end of every command, makespan, pipeline flush, busy, idle and
bubble per rank, peak in-flight microbatches and bytes, and the Chrome trace, all equal exactly,
on a grid of p, v, m with uneven per-(rank, chunk) costs, P2P latency and DP buckets, for each
of the plan path's three duration vectors run in one wavefront."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from tests.simulator.reference_engine import RefDag, reference_simulate

from blueprinting.errors import InvalidStrategyError
from blueprinting.mapping.transformer import (
    DualPipe,
    DualPipeV,
    ForwardOnly,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    PipelineSchedule,
    ZeroBubbleH1,
)
from blueprinting.simulator import (
    CommandDag,
    DpBucket,
    ScheduleCosts,
    build_schedule,
    chrome_trace_events,
)
from blueprinting.simulator.engine import _compute_wavefront, simulate_many

_F, _B, _W = 0, 1, 3


def _schedules(p: int, v: int) -> list[PipelineSchedule]:
    if v == 1:
        return [OneForwardOneBackward(), ZeroBubbleH1(), ForwardOnly()]
    out: list[PipelineSchedule] = [
        InterleavedOneForwardOneBackward(
            virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=overlap
        )
        for overlap in (False, True)
        for group in (None, p + 1)
    ]
    if v == 2:
        out += [DualPipe(), DualPipeV()]
    return out


def _costs(p: int, v: int, m: int, *, seed: int, overlap_grad_reduce: bool) -> ScheduleCosts:
    """Every (rank, chunk) its own forward, backward and weight-gradient time (first and last
    stages heavier, as the embedding and the loss make them), activation sizes and DP buckets."""
    rng = np.random.default_rng(seed)
    forward = rng.uniform(0.5, 2.0, (p, v))
    forward[0, 0] += 0.7
    forward[p - 1, v - 1] += 1.3
    backward = forward * rng.uniform(1.5, 2.5, (p, v))
    weight = backward * rng.uniform(0.2, 0.45, (p, v))

    def matrix(x: np.ndarray) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(float(y) for y in row) for row in x)

    return ScheduleCosts(
        pipeline_degree=p,
        microbatch_count=m,
        forward_s=matrix(forward),
        backward_s=matrix(backward),
        weight_grad_s=matrix(weight),
        p2p_latency_s=float(rng.uniform(0.01, 0.2)),
        dp_buckets=tuple(
            tuple(DpBucket(chunk=c, duration_s=float(rng.uniform(0.1, 1.0))) for c in range(v))
            for _ in range(p)
        ),
        overlap_grad_reduce=overlap_grad_reduce,
        activation_bytes=matrix(rng.uniform(1.0, 5.0, (p, v))),
    )


def _reference(dag: CommandDag, duration: np.ndarray) -> tuple[list[float], list[float]]:
    ref = RefDag(
        schedule=dag.schedule,
        costs=dag.costs,
        kind=dag.kind.tolist(),
        rank=dag.rank.tolist(),
        chunk=dag.chunk.tolist(),
        microbatch=dag.microbatch.tolist(),
        duration_s=duration.tolist(),
        deps=[tuple(int(d) for d in row if d >= 0) for row in dag.deps],
        peer=dag.peer.tolist(),
        programs=[program.tolist() for program in dag.programs],
    )
    return reference_simulate(ref)


def _reference_peaks(dag: CommandDag) -> tuple[list[int], list[float]]:
    """In flight: +1 per forward, -1 per full backward or weight-gradient pass; forward-only
    programs hold one microbatch at a time."""
    act = dag.costs.activation_bytes
    assert act is not None
    peaks: list[int] = []
    peak_bytes: list[float] = []
    for r in range(dag.pipeline_degree):
        codes = [int(dag.kind[c]) for c in dag.programs[2 * r]]
        sizes = [act[r][int(dag.chunk[c])] for c in dag.programs[2 * r]]
        if _B not in codes and _W not in codes:
            peaks.append(int(_F in codes))
            peak_bytes.append(max([s for k, s in zip(codes, sizes, strict=True) if k == _F]))
            continue
        held = peak = 0
        held_bytes = peak_b = 0.0
        for code, size in zip(codes, sizes, strict=True):
            if code == _F:
                held, held_bytes = held + 1, held_bytes + size
            elif code in (_B, _W):
                held, held_bytes = held - 1, held_bytes - size
            peak, peak_b = max(peak, held), max(peak_b, held_bytes)
        peaks.append(peak)
        peak_bytes.append(peak_b)
    return peaks, peak_bytes


# m a multiple of p (every schedule runs), and a few that some schedules refuse.
GRID = [
    (p, v, m)
    for p, v in ((2, 1), (4, 1), (4, 2), (6, 2), (3, 3), (4, 3))
    for m in (2 * p, 3 * p, *((4 * p + 1,) if v == 1 else ()))
]


@pytest.mark.parametrize(("p", "v", "m"), GRID)
def test_fast_engine_equals_the_event_engine(p: int, v: int, m: int) -> None:
    checked = fast = 0
    kinds: set[type] = set()
    for schedule, overlap_grad_reduce in itertools.product(_schedules(p, v), (False, True)):
        costs = _costs(p, v, m, seed=100 * p + 10 * v + m, overlap_grad_reduce=overlap_grad_reduce)
        try:
            dag = build_schedule(schedule, costs)
        except InvalidStrategyError:
            continue  # a configuration Megatron (or DeepSeek) refuses at start-up
        full = dag.duration_s
        vectors = [
            np.where(dag.kind >= 4, 0.0, full),  # P2P and DP free
            np.where(dag.kind == 6, 0.0, full),  # DP free
            full,
        ]
        fast += _compute_wavefront(dag, np.stack(vectors, axis=1)) is not None
        runs = simulate_many(dag, vectors)
        peaks, peak_bytes = _reference_peaks(dag)
        for run, duration in zip(runs, vectors, strict=True):
            start, end = _reference(dag, duration)
            assert run.start_s.tolist() == start
            assert run.end_s.tolist() == end
            last = [end[int(prog[-1])] for prog in dag.programs[0::2] if prog.shape[0]]
            flush = max(last, default=0.0)
            assert run.pipeline_flush_s == flush
            assert run.makespan_s == max([0.0, *end])
            busy = [sum(duration[dag.programs[2 * r]].tolist()) for r in range(p)]
            comm = [sum(duration[dag.programs[2 * r + 1]].tolist()) for r in range(p)]
            assert run.busy_s_per_rank == tuple(busy)
            assert run.comm_busy_s_per_rank == tuple(comm)
            assert run.idle_s_per_rank == tuple(flush - b for b in busy)
            assert run.bubble_s == min(flush - b for b in busy)
            assert list(run.peak_inflight_per_rank) == peaks
            assert list(run.peak_activation_bytes_per_rank) == peak_bytes
            as_reference = replace(run, start_s=np.array(start), end_s=np.array(end))
            assert chrome_trace_events(run) == chrome_trace_events(as_reference)
        checked += 1
        kinds.add(type(schedule))
    assert checked > 0
    if v == 2:
        assert {DualPipe, DualPipeV} <= kinds
    if v == 1:
        assert {OneForwardOneBackward, ZeroBubbleH1, ForwardOnly} <= kinds
    # The compute-only wavefront answers for the common case (trailing DP buckets).
    assert fast > 0


@pytest.mark.parametrize(("p", "v", "m"), GRID)
def test_zero_time_buckets_between_transfers_take_the_fast_engine(p: int, v: int, m: int) -> None:
    """With overlap_grad_reduce the buckets sit between transfers; the plan path's P2P-free and
    pipeline-only runs give them no time, so the compute-only wavefront applies (the full run
    with its buckets' times does not) and equals the event engine bit for bit."""
    interleaved = fast = 0
    for schedule in _schedules(p, v):
        costs = _costs(p, v, m, seed=7 * p + 3 * v + m, overlap_grad_reduce=True)
        try:
            dag = build_schedule(schedule, costs)
        except InvalidStrategyError:
            continue
        full = dag.duration_s
        vectors = [np.where(dag.kind >= 4, 0.0, full), np.where(dag.kind == 6, 0.0, full)]
        programs = dag.programs[1::2]
        between = any(
            (dag.kind[prog] == 6).any()
            and not (dag.kind[prog][int(np.argmax(dag.kind[prog] == 6)) :] == 6).all()
            for prog in programs
        )
        if between:
            interleaved += 1
            fast += _compute_wavefront(dag, np.stack(vectors, axis=1)) is not None
            assert _compute_wavefront(dag, np.stack([full], axis=1)) is None
        for run, duration in zip(simulate_many(dag, vectors), vectors, strict=True):
            start, end = _reference(dag, duration)
            assert run.start_s.tolist() == start
            assert run.end_s.tolist() == end
    if v > 1:  # one chunk: its last backward is the stage's last pass, the buckets trail
        assert interleaved > 0
        assert fast > 0
