"""NVLink domains larger than a host (GB200 / GB300 NVL72: 18 trays of 4 GPUs): where a job's
ranks sit in the racks (``DomainPlacement``) and the all-to-all that crosses them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blueprinting.errors import ConfigError
from blueprinting.hardware.collectives import CollectiveKind, link_efficiency
from blueprinting.hardware.efficiency import efficiency_fraction
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import (
    CommGroup,
    DomainPlacement,
    LinkTier,
    ParallelDim,
    _enumerate_groups_by_rank,
)
from blueprinting.hardware.system_mapping import system_from_mapping, system_to_mapping

GB200 = system_preset("dgx-gb200")
PACKED = replace(GB200, node=replace(GB200.node, domain_placement=DomainPlacement.PACKED))
H100 = system_preset("dgx-h100")


@pytest.mark.parametrize(
    ("world", "segmented"),
    [
        (8, 8),  # 2 trays: one segment of 2
        (64, 64),  # 16 trays, one rack
        (72, 72),  # a full rack
        (144, 72),  # 36 trays: 2 segments of 18
        (256, 64),  # 64 trays: 18, 17 do not divide 64, 16 does
        (512, 64),  # 128 trays: 16
        (1152, 72),  # 288 trays: 18
        (76, 4),  # 19 trays, a prime above 18: segments of one tray
    ],
)
def test_segments_follow_megatron_bridge_sbatch_segment(world: int, segmented: int) -> None:
    assert GB200.node.placed_domain_size(world) == segmented
    assert PACKED.node.placed_domain_size(world) == 72


@given(world=st.integers(min_value=1, max_value=4096))
def test_a_domain_that_is_the_node_places_every_job_by_node(world: int) -> None:
    assert H100.node.placed_domain_size(world) == 8


def test_ep64_of_a_256_gpu_job_stays_on_nvlink() -> None:
    """DeepSeek-V3 on 256 GB200 (EP64, etp 1): each EP group is one 64-GPU segment, so the
    dispatch is NVLink only, exactly the intra-domain collective."""
    ep = GB200.strided_group(size=64, stride=1, world=256, like=ParallelDim.DATA)
    assert ep == CommGroup(size=64, tier=LinkTier.INTRA_NODE, ranks_per_node=4, ranks_per_domain=64)
    size = 462e6
    assert GB200.all_to_all_time(size, ep) == GB200.collective_time(
        CollectiveKind.ALL_TO_ALL, size, ep
    )


def test_a_group_straddling_two_packed_racks_splits_nvlink_and_nic() -> None:
    """Packed 72-GPU racks: the EP group of ranks 64-127 has 8 members in rack 0 and 56 in rack
    1, so its worst rank reaches 7 peers over NVLink and 56 over the NIC at the same time."""
    ep = PACKED.strided_group(size=64, stride=1, world=256, like=ParallelDim.DATA)
    assert ep == CommGroup(size=64, tier=LinkTier.SCALE_OUT, ranks_per_node=4, ranks_per_domain=8)
    size = 1e9
    nic, nvlink = PACKED.scale_out, PACKED.node.link
    # the NIC carries 56/64 of the buffer, NVLink 7/64, each at its link's all-to-all rate
    a2a = CollectiveKind.ALL_TO_ALL
    remote = nic.latency_s + size * 56 / 64 / (
        nic.bandwidth_bytes_per_s * efficiency_fraction(link_efficiency(nic, a2a), size)
    )
    local = nvlink.latency_s + size * 7 / 64 / (
        nvlink.bandwidth_bytes_per_s * efficiency_fraction(link_efficiency(nvlink, a2a), size)
    )
    assert PACKED.all_to_all_time(size, ep) == pytest.approx(max(remote, local), rel=1e-12)
    assert remote > local


@given(
    size=st.sampled_from([2, 4, 8, 16, 32, 64]),
    stride=st.sampled_from([1, 2, 4, 8]),
    world_nodes=st.integers(min_value=1, max_value=80),
    placement=st.sampled_from(list(DomainPlacement)),
)
def test_ranks_per_domain_match_visiting_every_rank(
    size: int, stride: int, world_nodes: int, placement: DomainPlacement
) -> None:
    """ranks_per_domain and the tier are the brute-force counts over the placed domains."""
    world = 4 * world_nodes
    if world % (size * stride):
        return
    system = replace(GB200, node=replace(GB200.node, domain_placement=placement))
    group = system.strided_group(size=size, stride=stride, world=world, like=ParallelDim.DATA)
    domain = system.node.placed_domain_size(world)
    fewest, spans = _enumerate_groups_by_rank(size, stride, world, domain)
    assert group.ranks_per_domain == fewest
    assert group.tier is (LinkTier.SCALE_OUT if spans else LinkTier.INTRA_NODE)
    assert group.ranks_per_node == _enumerate_groups_by_rank(size, stride, world, 4)[0]


def test_dense_groups_use_the_placed_domains() -> None:
    """TP 4 x DP 64 on 256 GB200: a DP group's ranks are 4 apart; 16 of them share a segment."""
    dp = GB200.comm_group(ParallelDim.DATA, tensor=4, pipeline=1, data=64)
    assert dp == CommGroup(size=64, tier=LinkTier.SCALE_OUT, ranks_per_node=1, ranks_per_domain=16)


def test_comm_group_checks_its_counts() -> None:
    with pytest.raises(ConfigError, match="ranks_per_node <= ranks_per_domain <= size"):
        CommGroup(size=8, tier=LinkTier.SCALE_OUT, ranks_per_node=4, ranks_per_domain=2)


def test_the_placement_round_trips_through_a_system_file() -> None:
    assert "nvlink_domain_placement" not in system_to_mapping(GB200)
    assert system_to_mapping(PACKED)["nvlink_domain_placement"] == "packed"
    packed = system_from_mapping({"preset": "dgx-gb200", "nvlink_domain_placement": "packed"})
    assert packed.node.domain_placement is DomainPlacement.PACKED
    with pytest.raises(ConfigError) as raised:
        system_from_mapping({"preset": "dgx-gb200", "nvlink_domain_placement": "pakced"})
    assert "nvlink_domain_placement" in str(raised.value)
