"""Op orders against Megatron-LM's, as recorded in shared/reference/schedules.md section 2."""

from __future__ import annotations

import pytest

from blueprinting.errors import InvalidStrategyError
from blueprinting.mapping.transformer import (
    ForwardOnly,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    SingleStage,
)
from blueprinting.simulator import ScheduleCosts, build_schedule, megatron_violations, rank_orders
from blueprinting.simulator.schedules import RankOrder, interleaved_table

_NAMES = {0: "F", 1: "B", 2: "Bi", 3: "W"}


def _render(order: RankOrder, v: int) -> str:
    if v == 1:
        return " ".join(f"{_NAMES[k]}{j}" for k, _, j in order.ops)
    return " ".join(f"{_NAMES[k]}{j}.{c}" for k, c, j in order.ops)


def test_one_f_one_b_order_matches_megatron_p4_m8() -> None:
    orders = rank_orders(OneForwardOneBackward(), 4, 8, 1)
    assert _render(orders[0], 1) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    assert _render(orders[3], 1) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"


def test_interleaved_order_matches_megatron_p4_v2_m8_n4() -> None:
    orders = rank_orders(InterleavedOneForwardOneBackward(virtual_stages=2), 4, 8, 2)
    assert _render(orders[0], 2) == (
        "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 "
        "F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0"
    )
    assert _render(orders[3], 2) == (
        "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 "
        "F6.0 B2.0 F7.0 B3.0 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 B4.0 B5.0 B6.0 B7.0"
    )
    # Without overlap_p2p_comm every steady step (F, B) is one blocking P2P step.
    assert orders[3].step_starts is not None
    assert list(orders[3].step_starts[:7]) == [0, 1, 2, 3, 4, 6, 8]


def test_interleaved_table_last_group_takes_the_remainder() -> None:
    assert interleaved_table(7, 2, 4) == [
        (0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (2, 1), (3, 1),
        (4, 0), (5, 0), (6, 0), (4, 1), (5, 1), (6, 1),
    ]  # fmt: skip


def test_forward_only_runs_forwards_in_order() -> None:
    orders = rank_orders(ForwardOnly(), 3, 4, 1)
    assert all(_render(o, 1) == "F0 F1 F2 F3" for o in orders)


def test_megatron_rules_reported_all_at_once() -> None:
    schedule = InterleavedOneForwardOneBackward(virtual_stages=3, microbatch_group_size=5)
    laws = [v.law for v in megatron_violations(schedule, 2, 4, 2)]
    assert laws == ["chunk_count", "interleaving_degree", "microbatch_group_size_range"]
    laws = [v.law for v in megatron_violations(InterleavedOneForwardOneBackward(
        virtual_stages=2), 4, 6, 2)]  # fmt: skip
    assert laws == ["microbatch_group_remainder"]
    assert megatron_violations(SingleStage(), 1, 3, 1) == []
    assert [v.law for v in megatron_violations(SingleStage(), 2, 3, 1)] == ["single_stage_degree"]


def test_build_refuses_what_megatron_refuses_unless_allowed() -> None:
    costs = ScheduleCosts.uniform(
        pipeline_degree=4, microbatch_count=6, virtual_stages=2, forward_s=1.0, backward_s=2.0
    )
    schedule = InterleavedOneForwardOneBackward(virtual_stages=2)
    with pytest.raises(InvalidStrategyError, match="m % N = 2 introduces dependency bubbles"):
        build_schedule(schedule, costs)
    assert len(build_schedule(schedule, costs, allow_megatron_refused=True)) > 0
