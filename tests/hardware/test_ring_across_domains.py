"""Ring collectives over a group spread across NVLink domains (several DGX nodes, several NVL72
racks): NCCL's rings cross each boundary through every member's NIC, so a rank with ``c`` group
members in its domain sends ``1/c`` of the ring's bytes over the NIC
(``SystemSpec.collective_time``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blueprinting.hardware.collectives import CollectiveKind, collective_link_time
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import CommGroup, LinkTier, ParallelDim

A100 = system_preset("dgx-a100-80gb")
H100 = system_preset("dgx-h100")
GB200 = system_preset("dgx-gb200")
GIB8 = 8 * 2**30


def _all_reduce_busbw(system_name: str, nodes: int) -> float:
    """nccl-tests' all-reduce busbw (GB/s) the model gives for 8 GiB over ``nodes`` DGX nodes of
    8 GPUs (one DP group of every GPU)."""
    system = system_preset(system_name)
    group = system.comm_group(ParallelDim.DATA, tensor=1, pipeline=1, data=8 * nodes)
    assert group.tier is LinkTier.SCALE_OUT and group.ranks_per_domain == 8
    n = group.size
    time = system.collective_time(CollectiveKind.ALL_REDUCE, GIB8, group)
    return GIB8 * 2 * (n - 1) / n / time / 1e9


@pytest.mark.parametrize(
    ("system_name", "measured"),
    [
        # DGX A100, 8 x 200 Gb/s IB per node: 192 GB/s all-reduce busbw (NVIDIA/nccl#812, a
        # maintainer; GTC24 S62129 and GTC25 S72583, 32 GPUs, the same 192):
        # shared/reference/microbenchmarks.md sections 4.1 and 4.5.
        ("dgx-a100-80gb", 192.0),
        # DGX H100, 8 x 400 Gb/s: 370 (GTC25, 32 GPUs) to 380 (GTC24), section 4.1.
        ("dgx-h100", 375.0),
    ],
)
def test_multi_node_all_reduce_busbw_is_the_nodes_nics_not_one(
    system_name: str, measured: float
) -> None:
    """Within 5% of nccl-tests across 4 nodes; the flat ring on one NIC gave 24 / 48 GB/s."""
    assert _all_reduce_busbw(system_name, 4) == pytest.approx(measured, rel=0.05)


def test_a100_figure_exactly() -> None:
    """A100: the NIC share binds (8 NICs x 25 GB/s x 0.96 = 192 GB/s; NVLink's 7/8 share runs
    at 234 x 8/7 = 267 GB/s): the scale-out latency plus 1/8 of the ring's bytes."""
    group = A100.comm_group(ParallelDim.DATA, tensor=1, pipeline=1, data=32)
    ring = GIB8 * 2 * 31 / 32
    expected = A100.scale_out.latency_s + ring / 8 / (25e9 * 0.96)
    assert A100.collective_time(CollectiveKind.ALL_REDUCE, GIB8, group) == pytest.approx(
        expected, rel=1e-12
    )


def test_two_gb200_racks_of_the_405b_fsdp_run() -> None:
    """Megatron-FSDP Llama 3.1 405B on 128 GB200 (t2, FSDP 64): two 64-GPU segments, 32 DP
    ranks in each; the 811 GB fp32 gradient reduce-scatter is NVLink-bound (31/32 of the ring's
    bytes at 612 GB/s), not 16 s on one NIC."""
    group = GB200.comm_group(ParallelDim.DATA, tensor=2, pipeline=1, data=64)
    assert group == CommGroup(
        size=64, tier=LinkTier.SCALE_OUT, ranks_per_node=2, ranks_per_domain=32
    )
    size = 811_715_067_904
    ring = size * 63 / 64
    nvlink = 17e-6 + ring * 31 / 32 / (900e9 * 0.68)
    assert GB200.collective_time(CollectiveKind.REDUCE_SCATTER, size, group) == pytest.approx(
        nvlink, rel=1e-12
    )
    flat = collective_link_time(CollectiveKind.REDUCE_SCATTER, size, 64, GB200.scale_out)
    assert flat > 16.0 > 12 * nvlink


@given(
    kind=st.sampled_from(
        [CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_GATHER]
    ),
    size=st.floats(min_value=0.0, max_value=1e12),
    domains=st.integers(min_value=2, max_value=64),
    per_domain=st.integers(min_value=1, max_value=8),
)
def test_never_slower_than_the_flat_ring_and_equal_at_one_per_node(
    kind: CollectiveKind, size: float, domains: int, per_domain: int
) -> None:
    n = domains * per_domain
    group = CommGroup(
        size=n, tier=LinkTier.SCALE_OUT, ranks_per_node=per_domain, ranks_per_domain=per_domain
    )
    flat = collective_link_time(kind, size, n, H100.scale_out)
    time = H100.collective_time(kind, size, group)
    if per_domain == 1:
        assert time == flat
    else:
        assert time <= flat * (1 + 1e-12)
        # and never faster than NVLink carrying its (c-1)/c share alone
        inside = collective_link_time(kind, size, n, H100.node.link)
        assert time >= inside * (per_domain - 1) / per_domain * (1 - 1e-12)


def test_p2p_and_intra_domain_groups_are_unchanged() -> None:
    group = CommGroup(size=16, tier=LinkTier.SCALE_OUT, ranks_per_node=8, ranks_per_domain=8)
    assert H100.collective_time(CollectiveKind.P2P, 1e9, group) == collective_link_time(
        CollectiveKind.P2P, 1e9, 16, H100.scale_out
    )
    inside = CommGroup(size=8, tier=LinkTier.INTRA_NODE, ranks_per_node=8, ranks_per_domain=8)
    assert H100.collective_time(CollectiveKind.ALL_GATHER, 1e9, inside) == collective_link_time(
        CollectiveKind.ALL_GATHER, 1e9, 8, H100.node.link
    )
