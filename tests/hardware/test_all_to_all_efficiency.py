"""NCCL's all-to-all rate against NVIDIA's measured all-to-all busbw (GTC25 S72583, carried in
``shared/reference/microbenchmarks.md`` section 4.1; the figures are restated here so the test
runs without ``../shared``), and the flex libraries keeping the links' ring rate.

busbw is what nccl-tests' ``alltoall_perf`` prints: algbw (n-1)/n, the bytes a rank sends over
the time, NVLink's and the NIC's together."""

from __future__ import annotations

import pytest

from blueprinting.errors import ConfigError
from blueprinting.hardware.collectives import CollectiveKind, ExchangeKernels, link_efficiency
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import LinkTier, ParallelDim, SystemSpec
from blueprinting.hardware.system_mapping import system_from_mapping, system_to_mapping

#: bytes per rank: large enough that the 10-20 us latencies are under 0.1% of the time
SIZE = 16e9


def _busbw(system: SystemSpec, ranks: int, world: int, kernels: ExchangeKernels) -> float:
    group = system.strided_group(size=ranks, stride=1, world=world, like=ParallelDim.DATA)
    return SIZE * (ranks - 1) / ranks / system.all_to_all_time(SIZE, group, kernels)


@pytest.mark.parametrize(
    ("preset", "ranks", "world", "measured_gbps"),
    [
        ("dgx-a100-80gb", 8, 8, 210.0),  # NVLink3 (A100), 8 GPUs
        ("dgx-h100", 8, 8, 320.0),  # NVLink4 (H100), 8 GPUs
        ("dgx-b200", 8, 8, 640.0),  # NVLink5 (B200), 8 GPUs
        ("dgx-gb200", 32, 64, 640.0),  # NVLink5 (GB200 NVL72), 32 GPUs of one domain
        ("dgx-h100", 32, 32, 48.0),  # 8x 400Gb RDMA (DGX H100), 32 GPUs on 4 nodes
        ("dgx-a100-80gb", 32, 32, 24.0),  # 8x 200Gb RDMA (DGX A100), 32 GPUs on 4 nodes
    ],
)
def test_nccl_all_to_all_reproduces_the_measured_busbw(
    preset: str, ranks: int, world: int, measured_gbps: float
) -> None:
    # the presets round each fraction to 0.01: within 1.5% of the slide's figure
    busbw = _busbw(system_preset(preset), ranks, world, ExchangeKernels.NCCL)
    assert busbw / 1e9 == pytest.approx(measured_gbps, rel=0.015)


def test_the_scale_out_figure_is_the_nics_share() -> None:
    """On 4 DGX H100 a rank sends 31/32 of its buffer, 24/32 over its NIC: busbw 48 GB/s is the
    NIC at 48 x 24/31 = 37.2 GB/s, 0.74 of its 50, where the ring collectives reach 0.96."""
    h100 = system_preset("dgx-h100")
    group = h100.strided_group(size=32, stride=1, world=32, like=ParallelDim.DATA)
    assert group.tier is LinkTier.SCALE_OUT and group.ranks_per_domain == 8
    nic_rate = SIZE * 24 / 32 / h100.all_to_all_time(SIZE, group)
    assert nic_rate / 1e9 == pytest.approx(0.74 * 50, rel=1e-3)


@pytest.mark.parametrize(("preset", "ring"), [("dgx-h100", 0.82), ("dgx-b200", 0.76)])
def test_a_library_exchange_keeps_the_rings_rate(preset: str, ring: float) -> None:
    """DeepEP / HybridEP move their bytes with their own kernels: the link's ring efficiency, not
    NCCL's all-to-all figure (H100: 0.82 x 450 = 369 GB/s against NCCL's 320)."""
    system = system_preset(preset)
    library = _busbw(system, 8, 8, ExchangeKernels.LIBRARY)
    assert library / 1e9 == pytest.approx(
        ring * system.node.link.bandwidth_bytes_per_s / 1e9, rel=1e-3
    )
    assert library > _busbw(system, 8, 8, ExchangeKernels.NCCL)


def test_only_nccls_all_to_all_reads_the_measured_figure() -> None:
    link = system_preset("dgx-h100").node.link
    assert link.all_to_all_efficiency is not None
    assert link_efficiency(link, CollectiveKind.ALL_TO_ALL) is link.all_to_all_efficiency
    assert (
        link_efficiency(link, CollectiveKind.ALL_TO_ALL, ExchangeKernels.LIBRARY) is link.efficiency
    )
    for kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER, CollectiveKind.P2P):
        assert link_efficiency(link, kind) is link.efficiency


def test_a_link_without_a_measurement_uses_its_ring_efficiency() -> None:
    """MI300X's RCCL and H800's NVLink have no all-to-all figure: their link's efficiency."""
    for preset, link in (
        ("mi300x-8", system_preset("mi300x-8").node.link),
        ("dgx-h800", system_preset("dgx-h800").node.link),
    ):
        assert link.all_to_all_efficiency is None, preset
        assert link_efficiency(link, CollectiveKind.ALL_TO_ALL) is link.efficiency


def test_a_system_file_sets_and_round_trips_the_all_to_all_efficiency() -> None:
    base = system_to_mapping(system_preset("dgx-h100"))
    assert base["intra_node"]["all_to_all_efficiency"] == 0.71  # type: ignore[index]
    mapping = {"preset": "dgx-h100", "intra_node": {"all_to_all_efficiency": 0.5}}
    system = system_from_mapping(mapping)
    assert system.node.link.all_to_all_efficiency is not None
    assert _busbw(system, 8, 8, ExchangeKernels.NCCL) / 1e9 == pytest.approx(0.5 * 450, rel=1e-3)
    assert system_from_mapping(system_to_mapping(system)) == system


def test_a_bad_all_to_all_efficiency_is_reported_by_name() -> None:
    mapping = {"preset": "dgx-h100", "scale_out": {"all_to_all_efficiency": 1.5}}
    with pytest.raises(ConfigError) as raised:
        system_from_mapping(mapping)
    assert "scale_out.all_to_all_efficiency" in str(raised.value)


@pytest.mark.parametrize(
    ("preset", "ctas"),
    [
        ("dgx-a100-80gb", 32),
        ("dgx-h100", 32),
        ("dgx-h800", 16),
        ("dgx-b200", 32),
        ("dgx-gb200", 32),
    ],
)
def test_nccls_send_receive_kernel_runs_one_block_per_p2p_channel(preset: str, ctas: int) -> None:
    """``p2pnChannels``: the ring's channels (24 on A100 / H100, 16 on H800, 32 on Blackwell)
    rounded up to a power of two, at most 64 (NCCL ``ncclTopoComputeP2pChannels``)."""
    assert system_preset(preset).runtime.nccl_p2p_ctas == ctas


def test_a_measured_nccl_figure_has_no_channel_count() -> None:
    from blueprinting.hardware.system import NcclPerCommunicator, RuntimeMemory

    runtime = RuntimeMemory(
        nccl=NcclPerCommunicator(
            bytes_per_communicator=688_000_000, bytes_per_pair_communicator=544_000_000
        )
    )
    assert runtime.nccl_p2p_ctas is None


def test_a_bad_all_to_all_efficiency_is_reported_with_the_links_other_problems() -> None:
    mapping = {
        "preset": "dgx-h100",
        "intra_node": {"all_to_all_efficiency": 0.0, "costs": {"p2p": [-1.0]}},
    }
    with pytest.raises(ConfigError) as raised:
        system_from_mapping(mapping)
    text = str(raised.value)
    assert "intra_node.all_to_all_efficiency" in text
    assert "intra_node.costs.p2p" in text


@pytest.mark.parametrize(
    ("preset", "world", "ctas"),
    [
        ("dgx-h100", 8, 32),  # NVLink peers: 2 x 18 links, capped at p2pnChannels 32
        ("dgx-h100", 16, 8),  # network peers: ceil(50 / 14) = 4 each, two peers
        ("dgx-b300", 16, 16),  # ConnectX-8, 100 GB/s: ceil(100 / 14) = 8 -> 8 each
        ("dgx-h800", 8, 16),  # p2pnChannels 16 (16 ring channels)
    ],
)
def test_a_cp_ring_steps_thread_blocks_follow_its_transport(
    preset: str, world: int, ctas: int
) -> None:
    system = system_preset(preset)
    group = system.strided_group(size=world, stride=1, world=world, like=ParallelDim.DATA)
    assert system.p2p_ring_step_ctas(group) == ctas
