"""The numpy builder and wavefront engine against the seed's builder and event-driven engine
(``reference_engine.py``): the same commands, ids, dependencies and programs, and start and end
times equal bit for bit, on a grid of p, v, m and every schedule (ZB-H1, forward-only, interleaved
with and without overlap and with N > p, hypothetical schedules Megatron refuses), with random
per-chunk costs, P2P latency and DP buckets with and without overlap_grad_reduce."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from tests.simulator.reference_engine import (
    RefDag,
    reference_build_schedule,
    reference_simulate,
)

from blueprinting.errors import DeadlockError
from blueprinting.mapping.transformer import (
    ForwardOnly,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    PipelineSchedule,
    SingleStage,
    ZeroBubbleH1,
)
from blueprinting.simulator import DpBucket, ScheduleCosts, build_schedule, simulate
from blueprinting.simulator.engine import _compute_wavefront, _full_wavefront, simulate_many


def _schedules(p: int, v: int) -> list[PipelineSchedule]:
    if v == 1:
        return (
            [OneForwardOneBackward(), ZeroBubbleH1(), ForwardOnly()] if p > 1 else [SingleStage()]
        )
    return [
        InterleavedOneForwardOneBackward(
            virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=overlap
        )
        for overlap in (False, True)
        for group in (None, p + 1)
    ]


def _costs(p: int, v: int, m: int, *, overlap_grad_reduce: bool) -> ScheduleCosts:
    rng = np.random.default_rng(1000 * p + 10 * m + v)
    forward = tuple(tuple(float(x) for x in rng.uniform(0.5, 2.0, v)) for _ in range(p))
    backward = tuple(tuple(float(x) for x in rng.uniform(1.0, 3.0, v)) for _ in range(p))
    return ScheduleCosts(
        pipeline_degree=p,
        microbatch_count=m,
        forward_s=forward,
        backward_s=backward,
        weight_grad_s=tuple(tuple(0.3 * x for x in row) for row in backward),
        p2p_latency_s=0.05,
        dp_buckets=tuple(
            tuple(DpBucket(chunk=c, duration_s=0.7 + c) for c in range(v)) for _ in range(p)
        ),
        overlap_grad_reduce=overlap_grad_reduce,
        activation_bytes=tuple(tuple(float(1 + c + r) for c in range(v)) for r in range(p)),
    )


def _same_dag(dag_columns: tuple[list[int], ...], ref: RefDag) -> None:
    kind, rank, chunk, micro, peer = dag_columns
    assert kind == ref.kind
    assert rank == ref.rank
    assert chunk == ref.chunk
    assert micro == ref.microbatch
    assert peer == ref.peer


def _reference_peaks(ref: RefDag, p: int) -> list[int]:
    peaks = []
    for r in range(p):
        codes = [ref.kind[c] for c in ref.programs[2 * r]]
        release = 3 if 3 in codes else 1 if 1 in codes else -1
        held = peak = 0
        for code in codes:
            if code == 0:
                held += 1
                peak = max(peak, held)
                if release == -1:
                    held -= 1
            elif code == release:
                held -= 1
        peaks.append(peak)
    return peaks


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_builder_and_engine_equal_the_reference(p: int, v: int) -> None:
    checked = 0
    for m in (1, 2, 3, 4, 5, 7, 8, 9):
        for schedule in _schedules(p, v):
            for overlap in (False, True):
                costs = _costs(p, v, m, overlap_grad_reduce=overlap)
                ref = reference_build_schedule(schedule, costs, allow_megatron_refused=True)
                dag = build_schedule(schedule, costs, allow_megatron_refused=True)
                _same_dag(
                    (
                        dag.kind.tolist(),
                        dag.rank.tolist(),
                        dag.chunk.tolist(),
                        dag.microbatch.tolist(),
                        dag.peer.tolist(),
                    ),
                    ref,
                )
                assert dag.duration_s.tolist() == ref.duration_s
                assert [program.tolist() for program in dag.programs] == ref.programs
                assert [tuple(int(d) for d in row if d >= 0) for row in dag.deps] == ref.deps
                try:
                    start, end = reference_simulate(ref)
                except DeadlockError:
                    with pytest.raises(DeadlockError):
                        simulate(dag)
                    continue
                result = simulate(dag)
                assert result.start_s.tolist() == start
                assert result.end_s.tolist() == end
                flush = max((end[prog[-1]] for prog in ref.programs[0::2] if prog), default=0.0)
                assert result.pipeline_flush_s == flush
                assert result.makespan_s == max([0.0, *end])
                busy = [sum(ref.duration_s[c] for c in ref.programs[2 * r]) for r in range(p)]
                assert result.busy_s_per_rank == tuple(busy)
                assert result.idle_s_per_rank == tuple(flush - b for b in busy)
                assert result.bubble_s == min(flush - b for b in busy)
                assert list(result.peak_inflight_per_rank) == _reference_peaks(ref, p)
                checked += 1
    assert checked > 0


def test_several_duration_vectors_run_as_separate_simulations() -> None:
    p, v, m = 4, 2, 8
    costs = _costs(p, v, m, overlap_grad_reduce=True)
    dag = build_schedule(InterleavedOneForwardOneBackward(virtual_stages=v), costs)
    free = np.where(dag.kind >= 4, 0.0, dag.duration_s)
    runs = simulate_many(dag, [free, dag.duration_s])
    ref = reference_build_schedule(InterleavedOneForwardOneBackward(virtual_stages=v), costs)
    _, end_full = reference_simulate(ref)
    assert runs[1].end_s.tolist() == end_full
    ref_free = RefDag(
        schedule=ref.schedule,
        costs=ref.costs,
        kind=ref.kind,
        rank=ref.rank,
        chunk=ref.chunk,
        microbatch=ref.microbatch,
        duration_s=free.tolist(),
        deps=ref.deps,
        peer=ref.peer,
        programs=ref.programs,
    )
    _, end_free = reference_simulate(ref_free)
    assert runs[0].end_s.tolist() == end_free
    assert runs[0].bubble_s < runs[1].bubble_s
    assert math.isfinite(runs[1].makespan_s)


@pytest.mark.parametrize("latency", [0.0, 0.05, 5.0])
def test_compute_only_wavefront_is_exact_where_it_applies(latency: float) -> None:
    """The compute-only wavefront (transfers timed inline) equals the full one bit for bit
    wherever it answers, and answers for the common case: trailing DP buckets and transfers
    that never queue behind an earlier step's. A latency longer than the compute passes makes
    transfers queue, and overlap_grad_reduce interleaves buckets with transfers: then it
    declines (None) and simulate uses the full wavefront."""
    answered = declined = 0
    for p, v in ((4, 1), (4, 2), (3, 3)):
        for m in (4, 8, 9):
            for schedule in _schedules(p, v):
                for overlap in (False, True):
                    costs = replace(
                        _costs(p, v, m, overlap_grad_reduce=overlap), p2p_latency_s=latency
                    )
                    dag = build_schedule(schedule, costs, allow_megatron_refused=True)
                    durations = np.stack(
                        [np.where(dag.kind >= 4, 0.0, dag.duration_s), dag.duration_s], axis=1
                    )
                    try:
                        full = _full_wavefront(dag, durations)
                    except DeadlockError:
                        assert _compute_wavefront(dag, durations) is None
                        continue
                    fast = _compute_wavefront(dag, durations)
                    if fast is None:
                        declined += 1
                        continue
                    answered += 1
                    assert fast[0].tolist() == full[0].tolist()
                    assert fast[1].tolist() == full[1].tolist()
    assert declined > 0
    if latency < 1.0:
        assert answered > 0
