"""Combined 1F1B (Megatron-Core ``combined_1f1b.py`` @d98e8a64) simulated in its op order on
grids: deadlock-freedom, the bubble, the peak in-flight chunks (one more than interleaving) and
the flush with unpaired warm-up / cool-down passes against their closed forms."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from blueprinting.analysis.memory import in_flight_microbatches
from blueprinting.analysis.pipeline_contract import combined_warmup
from blueprinting.errors import InvalidStrategyError, VerificationError
from blueprinting.mapping.transformer import (
    CombinedOneForwardOneBackward,
    InterleavedOneForwardOneBackward,
)
from blueprinting.simulator import ScheduleCosts, build_schedule, simulate
from blueprinting.simulator.analytic import interleaved_peak_inflight
from blueprinting.simulator.schedules import OpKind, combined_order

EXACT = 1e-9


def _costs(
    p: int, v: int, m: int, *, f: float, b: float, uf: float = 0.0, ub: float = 0.0
) -> ScheduleCosts:
    costs = ScheduleCosts.uniform(
        pipeline_degree=p, microbatch_count=m, virtual_stages=v, forward_s=f, backward_s=b
    )
    if uf == 0.0 and ub == 0.0:
        return costs

    def matrix(x: float) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(x for _ in range(v)) for _ in range(p))

    return replace(costs, unpaired_forward_s=matrix(uf), unpaired_backward_s=matrix(ub))


def _schedule(p: int, v: int, n: int | None = None) -> CombinedOneForwardOneBackward:
    # Megatron's interleaving needs p > 2, or p = 2 with overlap_p2p_comm
    return CombinedOneForwardOneBackward(
        virtual_stages=v, microbatch_group_size=n, overlap_p2p_comm=p == 2
    )


GRID = [(1, 1, m) for m in (1, 2, 5)] + [
    (p, v, m) for p in (2, 3, 4, 8) for v in (2, 3, 4) for m in sorted({p, 2 * p, 3 * p, 4 * p})
]


@pytest.mark.parametrize(("p", "v", "m"), GRID, ids=str)
@pytest.mark.parametrize(("f", "b"), [(1.0, 2.0), (1.0, 1.0), (0.7, 2.3)])
def test_bubble_and_peak_in_flight_against_the_closed_forms(
    p: int, v: int, m: int, f: float, b: float
) -> None:
    """With every pass at its co-scheduled time the bubble is interleaving's (p - 1)(f + b)
    (the extra warm-up forward moves no pass of the critical path), and every rank has one
    chunk forward more in flight than interleaved 1F1B: min(2(p-r-1) + (v-1)N + 2, m v). The
    memory model stores interleaving's count and one layer: a paired step runs its forward and
    backward layer by layer, freeing a layer as it stores one (``StageActivations.
    paired_forward``; the simulator counts whole chunks)."""
    result = simulate(build_schedule(_schedule(p, v), _costs(p, v, m, f=f, b=b)))
    assert result.bubble_s == pytest.approx((p - 1) * (f + b), abs=EXACT)
    assert result.pipeline_flush_s == pytest.approx((m * v + p - 1) * (f + b), abs=EXACT)
    expected = tuple(min(interleaved_peak_inflight(p, v, m, p, r) + 1, m * v) for r in range(p))
    assert result.peak_inflight_per_rank == expected
    for r in range(p):
        counts = in_flight_microbatches(_schedule(p, v), pipeline_degree=p, stage=r, microbatches=m)
        assert sum(counts) == interleaved_peak_inflight(p, v, m, p, r)


@pytest.mark.parametrize(("p", "v", "m"), GRID, ids=str)
@pytest.mark.parametrize(("uf", "ub"), [(0.5, 0.25), (1.0, 0.0), (0.0, 0.8)])
def test_unpaired_passes_add_p_v_of_each_to_the_flush(
    p: int, v: int, m: int, uf: float, ub: float
) -> None:
    """A pass alone in its step takes its unpaired extra: the flush grows by p v forward extras
    and p v backward extras (the fill and drain through the p v virtual stages run alone), and
    rank r's busy time by its warm-up count of each."""
    f, b = 1.0, 2.0
    result = simulate(build_schedule(_schedule(p, v), _costs(p, v, m, f=f, b=b, uf=uf, ub=ub)))
    assert result.pipeline_flush_s == pytest.approx(
        (m * v + p - 1) * (f + b) + p * v * (uf + ub), abs=EXACT
    )
    for r, busy in enumerate(result.busy_s_per_rank):
        warm = int(combined_warmup(p, v, m, p, r))
        assert busy == pytest.approx(m * v * (f + b) + warm * (uf + ub), abs=EXACT)


@pytest.mark.parametrize(("p", "v", "m", "n"), [(4, 2, 8, 4), (4, 2, 12, 6), (3, 3, 8, 4)])
def test_the_order_is_interleavings_with_one_more_warm_up_forward(
    p: int, v: int, m: int, n: int
) -> None:
    """The same schedule table, one more warm-up forward (``schedules.py`` l.966-970), steady
    steps of exactly one forward and one backward, and the cool-down backwards alone."""
    for r in range(p):
        order = combined_order(p, v, m, n, r)
        ops = np.asarray(order.ops)
        warm = min(2 * (p - r - 1) + (v - 1) * n + 1, m * v)
        assert int(combined_warmup(p, v, m, n, r)) == warm
        kinds = ops[:, 0].tolist()
        assert kinds[:warm] == [int(OpKind.FORWARD)] * warm
        steady = kinds[warm : len(kinds) - warm]
        assert steady == [int(OpKind.FORWARD), int(OpKind.BACKWARD)] * (m * v - warm)
        assert kinds[len(kinds) - warm :] == [int(OpKind.BACKWARD)] * warm
        starts = np.asarray(order.step_starts).tolist()
        assert len(starts) == 2 * warm + (m * v - warm)
    # deadlock-free with a group size N > p too
    result = simulate(
        build_schedule(_schedule(p, v, n), _costs(p, v, m, f=1.0, b=2.0, uf=0.3, ub=0.1))
    )
    assert result.pipeline_flush_s > 0.0


def test_one_more_chunk_forward_in_flight_than_interleaving_on_every_rank() -> None:
    p, v, m = 4, 2, 8
    costs = _costs(p, v, m, f=1.0, b=2.0)
    combined = simulate(build_schedule(_schedule(p, v), costs))
    interleaved = simulate(
        build_schedule(InterleavedOneForwardOneBackward(virtual_stages=v), costs)
    )
    assert [
        a - b
        for a, b in zip(
            combined.peak_inflight_per_rank, interleaved.peak_inflight_per_rank, strict=True
        )
    ] == [1] * p


def test_megatron_refuses_combined_pipelining_without_a_virtual_pipeline() -> None:
    with pytest.raises(InvalidStrategyError, match="combined_1f1b_virtual_pipeline"):
        build_schedule(
            CombinedOneForwardOneBackward(virtual_stages=1), _costs(4, 1, 8, f=1.0, b=2.0)
        )


def test_unpaired_costs_belong_to_combined_1f1b_only() -> None:
    with pytest.raises(VerificationError, match="unpaired pass costs"):
        build_schedule(
            InterleavedOneForwardOneBackward(virtual_stages=2),
            _costs(4, 2, 8, f=1.0, b=2.0, uf=0.5),
        )
