"""DualPipe and DualPipeV (deepseek-ai/DualPipe @3da1bbe) simulated in their op order, against
the README's closed forms on grids: bubble, peak in-flight activations, deadlock-freedom."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from blueprinting.errors import InvalidStrategyError
from blueprinting.mapping.transformer import DualPipe, DualPipeV
from blueprinting.simulator import (
    ScheduleCosts,
    build_schedule,
    dualpipe_bubble,
    dualpipe_peak_inflight,
    simulate,
)
from blueprinting.simulator.schedules import OpKind, dualpipe_order, dualpipev_order

EXACT = 1e-9


def _run(
    schedule: DualPipe | DualPipeV, p: int, m: int, *, f: float, b: float, w: float
) -> tuple[float, tuple[int, ...], float]:
    costs = ScheduleCosts.uniform(
        pipeline_degree=p,
        microbatch_count=m,
        virtual_stages=2,
        forward_s=f,
        backward_s=b,
        weight_grad_s=w,
    )
    result = simulate(build_schedule(schedule, costs))
    return result.bubble_s, result.peak_inflight_per_rank, result.pipeline_flush_s


def _stages(schedule: DualPipe | DualPipeV, p: int) -> int:
    return p if isinstance(schedule, DualPipe) else 2 * p


GRID = [
    (schedule, p, m)
    for schedule, p in [
        *((DualPipe(), p) for p in (2, 4, 6, 8, 16)),
        *((DualPipeV(), p) for p in (2, 3, 4, 5, 8, 16)),
    ]
    for m in sorted({2 * p, 2 * p + 2, 3 * p + p % 2, 4 * p})
]


@pytest.mark.parametrize(("schedule", "p", "m"), GRID, ids=str)
@pytest.mark.parametrize(("f", "w"), [(1.0, 1.0), (2.0, 1.0), (1.0, 0.5), (3.0, 2.5)])
def test_bubble_equals_the_closed_form_when_input_gradient_equals_forward(
    schedule: DualPipe | DualPipeV, p: int, m: int, f: float, w: float
) -> None:
    b = f + w  # B - W = F: the setting of the README's figure
    bubble, peaks, _ = _run(schedule, p, m, f=f, b=b, w=w)
    assert bubble == pytest.approx(dualpipe_bubble(_stages(schedule, p), f + b, b, w), abs=EXACT)
    assert set(peaks) == {dualpipe_peak_inflight(_stages(schedule, p))}


@pytest.mark.parametrize(
    ("schedule", "p", "costs"),
    [
        # Measured truth beside the formula where B - W != F (m = 4p; independent of m).
        (DualPipeV(), 4, (1.0, 2.0, 0.0, 14.0, 15.0)),
        (DualPipeV(), 4, (1.0, 1.0, 0.5, 6.5, 4.5)),
        (DualPipeV(), 4, (1.0, 1.0, 1.0, 7.0, 0.0)),
        (DualPipeV(), 8, (1.0, 2.0, 0.5, 23.5, 24.5)),
        (DualPipe(), 8, (1.0, 2.0, 0.5, 9.5, 10.5)),
        (DualPipe(), 6, (1.0, 3.0, 1.5, 4.0, 5.0)),
    ],
)
def test_bubble_off_the_closed_forms_setting(
    schedule: DualPipe | DualPipeV, p: int, costs: tuple[float, float, float, float, float]
) -> None:
    f, b, w, simulated, closed = costs
    bubble, peaks, _ = _run(schedule, p, 4 * p, f=f, b=b, w=w)
    assert bubble == pytest.approx(simulated, abs=EXACT)
    assert dualpipe_bubble(_stages(schedule, p), f + b, b, w) == pytest.approx(closed)
    assert set(peaks) == {dualpipe_peak_inflight(_stages(schedule, p))}


@pytest.mark.parametrize(("schedule", "p", "m"), GRID, ids=str)
def test_deadlock_free_with_latency_and_uneven_costs(
    schedule: DualPipe | DualPipeV, p: int, m: int
) -> None:
    rng = np.random.default_rng(p * 1000 + m)
    f = rng.uniform(0.5, 2.0, size=(p, 2))
    b = f * rng.uniform(1.5, 2.5, size=(p, 2))
    costs = ScheduleCosts(
        pipeline_degree=p,
        microbatch_count=m,
        forward_s=tuple(map(tuple, f.tolist())),
        backward_s=tuple(map(tuple, b.tolist())),
        weight_grad_s=tuple(map(tuple, (b / 2).tolist())),
        p2p_latency_s=0.3,
    )
    result = simulate(build_schedule(schedule, costs))
    work = (f + b).sum(axis=1) * (m // 2 if isinstance(schedule, DualPipe) else m)
    assert result.busy_s_per_rank == pytest.approx(tuple(work.tolist()))
    assert result.pipeline_flush_s >= max(result.busy_s_per_rank)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 20), (6, 14)])
def test_op_counts_and_split_backward(p: int, m: int) -> None:
    for order in (dualpipe_order(p, m, r) for r in range(p)):
        ops = np.asarray(order.ops)
        kinds = ops[:, 0]
        assert (kinds == OpKind.FORWARD).sum() == m
        grads = (kinds == OpKind.BACKWARD) | (kinds == OpKind.BACKWARD_INPUT)
        assert grads.sum() == m
        assert (kinds == OpKind.WEIGHT_GRAD).sum() == (kinds == OpKind.BACKWARD_INPUT).sum() > 0
    for order in (dualpipev_order(p, m, r) for r in range(p)):
        assert np.asarray(order.ops).shape[0] >= 4 * m


def test_dualpipev_turns_locally_on_the_last_rank() -> None:
    costs = ScheduleCosts.uniform(
        pipeline_degree=4, microbatch_count=8, virtual_stages=2, forward_s=1.0, backward_s=2.0
    )
    dag = build_schedule(DualPipeV(), costs)
    sends = [dag.command(i) for i in range(len(dag)) if dag.peer[i] >= 0]
    assert all(not (s.rank == 3 and s.peer == 3) for s in sends)
    # 2p - 2 P2P hops each way per microbatch: 6 forward and 6 backward messages, m = 8.
    assert len(sends) == 8 * 12


@pytest.mark.parametrize(
    ("schedule", "p", "m", "law"),
    [
        (DualPipe(), 3, 12, "dualpipe_even_ranks"),
        (DualPipe(), 4, 6, "dualpipe_microbatches"),
        (DualPipe(), 4, 9, "dualpipe_even_microbatches"),
        (DualPipeV(), 4, 7, "dualpipe_microbatches"),
    ],
)
def test_deepseeks_assertions_are_refused(
    schedule: DualPipe | DualPipeV, p: int, m: int, law: str
) -> None:
    costs = ScheduleCosts.uniform(
        pipeline_degree=p, microbatch_count=m, virtual_stages=2, forward_s=1.0, backward_s=2.0
    )
    with pytest.raises(InvalidStrategyError) as caught:
        build_schedule(schedule, costs)
    assert law in [v.law for v in caught.value.violations]


def test_grid_is_not_trivial() -> None:
    assert len(GRID) == len(set(itertools.starmap(lambda s, p, m: (str(s), p, m), GRID))) > 30
