"""Collective costs: the ring bandwidth terms and Calculon's (scalar, offset) form."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.hardware.collectives import (
    CollectiveCost,
    CollectiveKind,
    collective_link_time,
    ring_collective_costs,
)
from blueprinting.hardware.efficiency import ConstantEfficiency
from blueprinting.hardware.system import LinkSpec

NVLINK3 = LinkSpec(
    bandwidth_bytes_per_s=300e9, latency_s=10e-6, efficiency=ConstantEfficiency(fraction=0.8)
)


def test_ring_all_reduce_moves_two_n_minus_one_over_n() -> None:
    size = 2**30
    expected = 10e-6 + 2 * 7 / 8 * size / (300e9 * 0.8)
    assert collective_link_time(CollectiveKind.ALL_REDUCE, size, 8, NVLINK3) == pytest.approx(
        expected, rel=1e-12
    )


def test_reduce_scatter_and_all_gather_move_n_minus_one_over_n() -> None:
    size = 3e8
    expected = 10e-6 + 3 / 4 * size / (300e9 * 0.8)
    for kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_GATHER):
        assert collective_link_time(kind, size, 4, NVLINK3) == pytest.approx(expected, rel=1e-12)


def test_p2p_sends_once_whatever_the_group() -> None:
    assert collective_link_time(CollectiveKind.P2P, 1e9, 2, NVLINK3) == pytest.approx(
        10e-6 + 1e9 / 240e9, rel=1e-12
    )


def test_single_rank_group_costs_nothing() -> None:
    for kind in CollectiveKind:
        assert collective_link_time(kind, 1e9, 1, NVLINK3) == 0.0


def test_calculon_offset_form() -> None:
    # Calculon's NVLink tier: all_reduce (2.0, -1) == ring; its IB tier (1.0, 0): S once.
    link = LinkSpec(
        bandwidth_bytes_per_s=25e9,
        latency_s=2e-5,
        efficiency=ConstantEfficiency(fraction=0.9),
        costs=ring_collective_costs().__class__(
            all_reduce=CollectiveCost(scalar=1.0, offset=0.0),
            reduce_scatter=CollectiveCost(scalar=1.0, offset=0.0),
            all_gather=CollectiveCost(scalar=1.0, offset=0.0),
            p2p=CollectiveCost(scalar=1.0, offset=None),
        ),
    )
    assert collective_link_time(CollectiveKind.ALL_REDUCE, 45e9, 64, link) == pytest.approx(
        2e-5 + 2.0, rel=1e-12
    )


@settings(max_examples=200)
@given(
    size=st.floats(min_value=0, max_value=1e12),
    group=st.integers(min_value=2, max_value=4096),
)
def test_ring_all_reduce_is_reduce_scatter_plus_all_gather(size: float, group: int) -> None:
    reduce_scatter = collective_link_time(CollectiveKind.REDUCE_SCATTER, size, group, NVLINK3)
    all_gather = collective_link_time(CollectiveKind.ALL_GATHER, size, group, NVLINK3)
    all_reduce = collective_link_time(CollectiveKind.ALL_REDUCE, size, group, NVLINK3)
    # Same bytes on the wire; the split pays the latency twice.
    assert reduce_scatter + all_gather - NVLINK3.latency_s == pytest.approx(
        all_reduce, rel=1e-12, abs=1e-18
    )
