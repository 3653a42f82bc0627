"""SystemSpec's primitive costs and rank placement."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import ConfigError, UnsupportedError
from blueprinting.hardware.collectives import CollectiveKind
from blueprinting.hardware.efficiency import GemmShape
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import (
    CommGroup,
    Engine,
    FixedTiers,
    LinkTier,
    NodeSpec,
    ParallelDim,
    ProcessingMode,
    RankLayout,
    _enumerate_groups,
    _enumerate_groups_by_rank,
    place_group,
)
from blueprinting.mapping.model import Datatype

A100 = system_preset("dgx-a100-80gb")


def test_compute_time_of_a_large_gemm() -> None:
    shape = GemmShape(m=8192, n=8192, k=8192)
    # 0.75 (A100_GEMM_PEAK_FRACTION) * 8192 / (8192 + 128) of 312 TFLOP/s.
    expected = shape.flops / (312e12 * 0.75 / (1 + 128 / 8192))
    actual = A100.compute_time(shape.flops, Engine.MATRIX, Datatype.BF16, shape)
    assert actual == pytest.approx(expected, rel=1e-12)


def test_memory_and_processing_modes() -> None:
    flop_time = A100.compute_time(1e9, Engine.VECTOR, Datatype.BF16)
    mem_time = A100.memory_time(1e9)
    assert flop_time == pytest.approx(1e9 / (39e12 * 0.9), rel=1e-12)
    # HBM 0.83: BabelStream Triad 1,700 of 2,039 GB/s (presets.py).
    assert mem_time == pytest.approx(1e9 / (2039e9 * 0.83), rel=1e-12)
    assert A100.op_time(1e9, 1e9, Engine.VECTOR, Datatype.BF16) == max(flop_time, mem_time)
    summed = A100.__class__(
        name="sum",
        accelerator=A100.accelerator,
        node=A100.node,
        scale_out=A100.scale_out,
        processing_mode=ProcessingMode.NO_OVERLAP,
    )
    assert summed.op_time(1e9, 1e9, Engine.VECTOR, Datatype.BF16) == flop_time + mem_time


def test_zero_work_costs_nothing() -> None:
    assert A100.compute_time(0, Engine.MATRIX, Datatype.BF16) == 0.0
    assert A100.memory_time(0) == 0.0


def test_missing_datatype_is_unsupported() -> None:
    with pytest.raises(UnsupportedError, match="no float8 rate"):
        A100.compute_time(1e9, Engine.MATRIX, Datatype.FP8)


@pytest.mark.parametrize(
    ("dim", "expected"),
    [
        # Megatron GPT-3 175B on Selene: t=8, p=8, d=16, 8 GPUs per node.
        (
            ParallelDim.TENSOR,
            CommGroup(size=8, tier=LinkTier.INTRA_NODE, ranks_per_node=8, ranks_per_domain=8),
        ),
        (
            ParallelDim.DATA,
            CommGroup(size=16, tier=LinkTier.SCALE_OUT, ranks_per_node=1, ranks_per_domain=1),
        ),
        (
            ParallelDim.PIPELINE,
            CommGroup(size=8, tier=LinkTier.SCALE_OUT, ranks_per_node=1, ranks_per_domain=1),
        ),
    ],
)
def test_megatron_layout_with_full_node_tp(dim: ParallelDim, expected: CommGroup) -> None:
    assert A100.comm_group(dim, tensor=8, pipeline=8, data=16) == expected


def test_small_tp_leaves_dp_ranks_sharing_a_node() -> None:
    # t=2: a DP group's ranks are 2 apart, so 4 of them share a node.
    dp = place_group(
        RankLayout.TP_DP_PP, ParallelDim.DATA, tensor=2, pipeline=2, data=8, gpus_per_node=8
    )
    assert dp == CommGroup(size=8, tier=LinkTier.SCALE_OUT, ranks_per_node=4, ranks_per_domain=4)
    dp_small = place_group(
        RankLayout.TP_DP_PP, ParallelDim.DATA, tensor=2, pipeline=2, data=4, gpus_per_node=8
    )
    assert dp_small == CommGroup(
        size=4, tier=LinkTier.INTRA_NODE, ranks_per_node=4, ranks_per_domain=4
    )


def test_tp_larger_than_node_goes_scale_out() -> None:
    tp = place_group(
        RankLayout.TP_DP_PP, ParallelDim.TENSOR, tensor=16, pipeline=1, data=1, gpus_per_node=8
    )
    assert tp == CommGroup(size=16, tier=LinkTier.SCALE_OUT, ranks_per_node=8, ranks_per_domain=8)


def test_misaligned_groups_report_the_worst_one() -> None:
    # t=3 on 8-GPU nodes: TP group {6,7,8} straddles nodes 0 and 1.
    tp = place_group(
        RankLayout.TP_DP_PP, ParallelDim.TENSOR, tensor=3, pipeline=1, data=8, gpus_per_node=8
    )
    assert tp == CommGroup(size=3, tier=LinkTier.SCALE_OUT, ranks_per_node=1, ranks_per_domain=1)


def test_fixed_tiers_follow_calculon_assignment() -> None:
    calculon_like = A100.__class__(
        name="fixed",
        accelerator=A100.accelerator,
        node=A100.node,
        scale_out=A100.scale_out,
        network_assignment=FixedTiers(
            tensor=LinkTier.INTRA_NODE, pipeline=LinkTier.SCALE_OUT, data=LinkTier.INTRA_NODE
        ),
    )
    group = calculon_like.comm_group(ParallelDim.DATA, tensor=2, pipeline=8, data=4)
    assert group == CommGroup(
        size=4, tier=LinkTier.INTRA_NODE, ranks_per_node=4, ranks_per_domain=4
    )
    assert calculon_like.collective_time(CollectiveKind.ALL_REDUCE, 1e9, group) == pytest.approx(
        # NVLink: the A100 sweep fit, 47 us and 0.69 of 300 GB/s (presets.A100_NVLINK_FIT).
        47e-6 + 2 * 3 / 4 * 1e9 / (300e9 * 0.69),
        rel=1e-12,
    )


def _brute_force(
    layout: RankLayout, dim: ParallelDim, degrees: dict[ParallelDim, int], gpus_per_node: int
) -> CommGroup:
    order = layout.order_with_context
    world = (
        degrees[ParallelDim.TENSOR]
        * degrees[ParallelDim.PIPELINE]
        * degrees[ParallelDim.DATA]
        * degrees.get(ParallelDim.CONTEXT, 1)
    )
    degrees = {ParallelDim.CONTEXT: 1, **degrees}
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank in range(world):
        coords = []
        rest = rank
        for d in order:
            coords.append(rest % degrees[d])
            rest //= degrees[d]
        key = tuple(c for d, c in zip(order, coords, strict=True) if d != dim)
        groups.setdefault(key, []).append(rank)
    fewest = degrees[dim]
    spans = False
    for ranks in groups.values():
        nodes: dict[int, int] = {}
        for rank in ranks:
            nodes[rank // gpus_per_node] = nodes.get(rank // gpus_per_node, 0) + 1
        fewest = min(fewest, *nodes.values())
        spans = spans or len(nodes) > 1
    tier = LinkTier.SCALE_OUT if spans else LinkTier.INTRA_NODE
    return CommGroup(size=degrees[dim], tier=tier, ranks_per_node=fewest, ranks_per_domain=fewest)


@settings(max_examples=200, deadline=None)
@given(
    layout=st.sampled_from(list(RankLayout)),
    dim=st.sampled_from(list(ParallelDim)),
    tensor=st.integers(min_value=1, max_value=12),
    pipeline=st.integers(min_value=1, max_value=6),
    data=st.integers(min_value=1, max_value=12),
    context=st.integers(min_value=1, max_value=4),
    gpus_per_node=st.sampled_from([1, 2, 4, 6, 8, 16]),
)
def test_placement_matches_brute_force(
    *,
    layout: RankLayout,
    dim: ParallelDim,
    tensor: int,
    pipeline: int,
    data: int,
    context: int,
    gpus_per_node: int,
) -> None:
    """Every group, the cp one included (placed right after tp), against visiting ranks."""
    degrees = {
        ParallelDim.TENSOR: tensor,
        ParallelDim.PIPELINE: pipeline,
        ParallelDim.DATA: data,
        ParallelDim.CONTEXT: context,
    }
    expected = _brute_force(layout, dim, degrees, gpus_per_node)
    if degrees[dim] == 1:
        expected = CommGroup(size=1, tier=LinkTier.INTRA_NODE, ranks_per_node=1, ranks_per_domain=1)
    actual = place_group(
        layout,
        dim,
        tensor=tensor,
        pipeline=pipeline,
        data=data,
        context=context,
        gpus_per_node=gpus_per_node,
    )
    assert actual == expected


@given(
    size=st.integers(min_value=1, max_value=40),
    stride=st.integers(min_value=1, max_value=30),
    groups=st.integers(min_value=1, max_value=6),
    gpus_per_node=st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 16, 36, 72, 100, 1000]),
)
def test_group_placement_closed_form_matches_visiting_every_rank(
    size: int, stride: int, groups: int, gpus_per_node: int
) -> None:
    """Issue #18: the placement of a group no longer visits every rank of the world."""
    world = size * stride * groups
    assert _enumerate_groups(size, stride, world, gpus_per_node) == _enumerate_groups_by_rank(
        size, stride, world, gpus_per_node
    )


def test_group_placement_of_a_huge_world_is_immediate() -> None:
    # d = 2**61 replicas of t = 3 (not aligned with 8 GPUs per node): the enumeration case.
    assert _enumerate_groups(2**61, 3, 3 * 2**61, 8) == (2, True)


# ---- NVLink domains larger than a node (GB200 NVL72: 18 trays of 4 GPUs) ------------------
GB200 = system_preset("dgx-gb200")
H100 = system_preset("dgx-h100")


@pytest.mark.parametrize(
    ("tensor", "data", "expected"),
    [
        # TP 8 = two trays of 4 in one rack: NVLink, 4 ranks per tray.
        (8, 9, CommGroup(size=8, tier=LinkTier.INTRA_NODE, ranks_per_node=4, ranks_per_domain=8)),
        # TP 16 on 64 GPUs: ranks 0-63, all in rack 0.
        (
            16,
            4,
            CommGroup(size=16, tier=LinkTier.INTRA_NODE, ranks_per_node=4, ranks_per_domain=16),
        ),
        # TP 72: exactly one rack.
        (
            72,
            2,
            CommGroup(size=72, tier=LinkTier.INTRA_NODE, ranks_per_node=4, ranks_per_domain=72),
        ),
        # TP 144: two racks, so the scale-out NICs.
        (
            144,
            1,
            CommGroup(size=144, tier=LinkTier.SCALE_OUT, ranks_per_node=4, ranks_per_domain=72),
        ),
        # TP 16 on 144 GPUs: the group of ranks 64-79 straddles racks 0 and 1 (72 is not a
        # multiple of 16), so the slowest TP group is on the scale-out link.
        (16, 9, CommGroup(size=16, tier=LinkTier.SCALE_OUT, ranks_per_node=4, ranks_per_domain=8)),
    ],
)
def test_tensor_groups_on_nvl72(*, tensor: int, data: int, expected: CommGroup) -> None:
    assert GB200.comm_group(ParallelDim.TENSOR, tensor=tensor, pipeline=1, data=data) == expected


def test_data_groups_span_trays_on_nvlink() -> None:
    # t = 4 fills a tray; DP 18 over the 18 trays of one rack stays on NVLink, DP 36 does not.
    assert GB200.comm_group(ParallelDim.DATA, tensor=4, pipeline=1, data=18) == CommGroup(
        size=18, tier=LinkTier.INTRA_NODE, ranks_per_node=1, ranks_per_domain=18
    )
    assert GB200.comm_group(ParallelDim.DATA, tensor=4, pipeline=1, data=36) == CommGroup(
        size=36, tier=LinkTier.SCALE_OUT, ranks_per_node=1, ranks_per_domain=18
    )


def test_sixteen_ranks_leave_a_dgx_h100() -> None:
    assert H100.comm_group(ParallelDim.TENSOR, tensor=16, pipeline=1, data=1) == CommGroup(
        size=16, tier=LinkTier.SCALE_OUT, ranks_per_node=8, ranks_per_domain=8
    )
    assert H100.comm_group(ParallelDim.TENSOR, tensor=8, pipeline=1, data=2) == CommGroup(
        size=8, tier=LinkTier.INTRA_NODE, ranks_per_node=8, ranks_per_domain=8
    )


def test_nvlink_domain_collective_uses_nvlink_bandwidth() -> None:
    group = GB200.comm_group(ParallelDim.TENSOR, tensor=72, pipeline=1, data=1)
    # Ring all-reduce of 1 GB over 72 ranks at 900 GB/s x 0.68 per direction, 17 us latency
    # (presets.GB200_NVLINK_FIT).
    assert GB200.collective_time(CollectiveKind.ALL_REDUCE, 1e9, group) == pytest.approx(
        17e-6 + 2 * 71 / 72 * 1e9 / (900e9 * 0.68), rel=1e-12
    )


def test_nvlink_domain_must_be_a_positive_multiple_of_the_node() -> None:
    link = GB200.node.link
    with pytest.raises(ConfigError) as raised:
        NodeSpec(gpus_per_node=4, link=link, nvlink_domain_size=70)
    assert raised.value.problems == (
        "NodeSpec.nvlink_domain_size must be a multiple of gpus_per_node (4), got 70",
    )
    with pytest.raises(ConfigError) as raised:
        NodeSpec(gpus_per_node=0, link=link, nvlink_domain_size=-8)
    assert raised.value.problems == (
        "NodeSpec.gpus_per_node must be a positive integer, got 0",
        "NodeSpec.nvlink_domain_size must be a positive integer, got -8",
    )
    assert NodeSpec(gpus_per_node=8, link=link).domain_size == 8


@settings(max_examples=200, deadline=None)
@given(
    layout=st.sampled_from(list(RankLayout)),
    dim=st.sampled_from(list(ParallelDim)),
    tensor=st.integers(1, 12),
    pipeline=st.integers(1, 6),
    data=st.integers(1, 12),
    per_node=st.sampled_from([1, 2, 4, 8]),
    nodes_per_domain=st.integers(1, 9),
)
def test_domain_placement_matches_brute_force(
    *,
    layout: RankLayout,
    dim: ParallelDim,
    tensor: int,
    pipeline: int,
    data: int,
    per_node: int,
    nodes_per_domain: int,
) -> None:
    """The tier is the brute-force one with domains as the unit; ranks per node are unchanged."""
    domain = per_node * nodes_per_domain
    actual = place_group(
        layout,
        dim,
        tensor=tensor,
        pipeline=pipeline,
        data=data,
        gpus_per_node=per_node,
        nvlink_domain_size=domain,
    )
    degrees = {
        ParallelDim.TENSOR: tensor,
        ParallelDim.PIPELINE: pipeline,
        ParallelDim.DATA: data,
        ParallelDim.CONTEXT: 1,
    }
    by_node = _brute_force(layout, dim, degrees, per_node)
    by_domain = _brute_force(layout, dim, degrees, domain)
    if degrees[dim] == 1:
        assert actual == CommGroup(
            size=1, tier=LinkTier.INTRA_NODE, ranks_per_node=1, ranks_per_domain=1
        )
    else:
        assert actual.ranks_per_node == by_node.ranks_per_node
        assert actual.tier == by_domain.tier


def test_a_huge_node_is_placed_at_once_or_refused() -> None:
    """Fuzz seed 1302 case 59509: a 2**31 - 1 GPU node made the placement build a set of about
    4e9 node numbers (the worker ran out of memory). Offsets are examined, not nodes, and a
    node or NVLink domain above ``MAX_GPUS_PER_DOMAIN`` is refused with the limit."""
    from blueprinting.limits import MAX_GPUS_PER_DOMAIN

    world = 3 * 7 * 2**40
    assert _enumerate_groups(7, 3, world, MAX_GPUS_PER_DOMAIN) == (1, True)
    # one node holds every block: no group leaves it
    assert _enumerate_groups(7, 3, 21 * 1024, MAX_GPUS_PER_DOMAIN) == (7, False)
    with pytest.raises(ConfigError) as raised:
        NodeSpec(gpus_per_node=2**31 - 1, link=system_preset("dgx-h100").node.link)
    assert raised.value.problems == (
        "NodeSpec.gpus_per_node = 2147483647 exceeds the limit of 1,048,576 GPUs in one node "
        "or NVLink domain (MAX_GPUS_PER_DOMAIN)",
    )
