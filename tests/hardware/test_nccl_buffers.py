"""NCCL's device buffers by transport (issue 19): ``RuntimeMemory.nccl_bytes`` on communicators
whose bytes are derived here by hand from the constants of NVIDIA/nccl v2.27.7-1 @593de54e
(src/init.cc buffer sizes, src/include/comm.h CUDA_IPC_MIN, src/transport/p2p.cc, net.cc,
nvls.cc) and checked against the allocation sizes NVIDIA/nccl #1685 logs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blueprinting.analysis.memory import (
    ExpertGrid,
    communicators,
    nccl_buffer_bytes,
    pipeline_chunks,
)
from blueprinting.errors import ConfigError
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import (
    NCCL_LL128_BUFFSIZE,
    NCCL_LL_BUFFSIZE,
    NCCL_NET_RECV_BYTES,
    NCCL_NET_SEND_BYTES,
    NCCL_P2P_RECV_BYTES,
    NCCL_P2P_SEND_BYTES,
    BulkCollectives,
    Communicator,
    NcclByTransport,
    NcclPerCommunicator,
    PeerSends,
    RuntimeMemory,
    ScalarCollectives,
    members_in_domain,
)
from blueprinting.hardware.system_mapping import system_from_mapping, system_to_mapping
from blueprinting.mapping.transformer import (
    AllGatherKV,
    CombinedOneForwardOneBackward,
    CpCommunication,
    DispatcherType,
    DualPipe,
    HeadAllToAll,
    HierarchicalAllToAllRing,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    RingExchange,
)

MIB = 2**20
H100 = RuntimeMemory(
    nccl=NcclByTransport(ring_channels=24, p2p_channels_per_peer=32, nvls_channels=16)
)


def test_connection_sizes_are_nccls_buffers_rounded_to_cuda_ipc_min() -> None:
    # LL: 8 lines x 512 threads x 8 steps x 16 bytes; LL128: 120 x 640 x 8 x 8 bytes.
    assert NCCL_LL_BUFFSIZE == 524_288
    assert NCCL_LL128_BUFFSIZE == 4_915_200
    # Receiver: 4096 (ncclRecvMem) + LL + LL128 + 4 MiB SIMPLE = 9,637,888 -> 5 x 2 MiB; sender:
    # its 4096-byte ncclSendMem -> 2 MiB. NVIDIA/nccl #1685 logs exactly these two sizes.
    assert 4096 + 524_288 + 4_915_200 + 4 * MIB == 9_637_888
    assert NCCL_P2P_RECV_BYTES == 10_485_760
    assert NCCL_P2P_SEND_BYTES == 2_097_152
    # Network with GPUDirect RDMA: LL128 + SIMPLE on the sender (9,109,504), all three on the
    # receiver (9,633,792), both -> 10 MiB.
    assert NCCL_NET_SEND_BYTES == NCCL_NET_RECV_BYTES == 10 * MIB


def test_h100_tensor_parallel_group_in_one_node() -> None:
    tp8 = Communicator(size=8, in_domain=8, use=BulkCollectives())
    ring = 24 * (2 + 10) * MIB
    # NVLS: 16 channels x 8 heads x (reduce + broadcast) 2 x 128 KiB x 8 steps = 256 MiB, and
    # the credits 16 x 2 x 64 x 8 = 16,384 bytes rounded to 2 MiB.
    nvls = 16 * 8 * 2 * 128 * 1024 * 8 + 2 * MIB
    assert nvls == 258 * MIB
    assert H100.nccl_bytes(tp8) == ring + nvls == 572_522_496
    # NCCL_NVLS_ENABLE=0 (nccl_nvls_channels = 0): the ring alone.
    no_nvls = RuntimeMemory(nccl=NcclByTransport(nvls_channels=0))
    assert no_nvls.nccl_bytes(tp8) == 288 * MIB
    # Scalar collectives never set NVLS up; two ranks never have it (ncclNvlsInit).
    assert H100.nccl_bytes(Communicator(size=8, in_domain=8, use=ScalarCollectives())) == ring
    assert H100.nccl_bytes(Communicator(size=2, in_domain=2, use=BulkCollectives())) == ring


def test_ring_leaving_its_domain_uses_network_connections() -> None:
    # 16 ranks over two 8-GPU nodes: ceil(24 / 8) = 3 of a rank's channels leave the node.
    world = Communicator(size=16, in_domain=8, use=ScalarCollectives())
    assert H100.nccl_bytes(world) == (21 * 12 + 3 * 20) * MIB == 312 * MIB
    # One rank per node: every channel over the network.
    dp = Communicator(size=16, in_domain=1, use=ScalarCollectives())
    assert H100.nccl_bytes(dp) == 24 * 20 * MIB


def test_pipeline_neighbours() -> None:
    # A middle stage's two neighbours in its node: 2 x 32 channels x (2 + 10) MiB.
    inside = Communicator(size=8, in_domain=8, use=PeerSends(peers=2))
    assert H100.nccl_bytes(inside) == 2 * 32 * 12 * MIB == 768 * MIB
    # Both on other nodes: the two network P2P pools, pow2(24) = 32 channels x 16 steps x
    # 128 KiB each, whatever the number of remote peers.
    outside = Communicator(size=8, in_domain=1, use=PeerSends(peers=2))
    assert H100.nccl_bytes(outside) == 2 * 32 * 16 * 128 * 1024 == 128 * MIB
    edge = Communicator(size=8, in_domain=2, use=PeerSends(peers=2))
    assert H100.nccl_bytes(edge) == 32 * 12 * MIB + 128 * MIB


def test_intra_node_all_to_all_against_nccl_1685() -> None:
    # 8 x H100, all_to_all_single: every other rank a peer over 32 channels: 7 x 32 x 12 MiB.
    a2a = Communicator(size=8, in_domain=8, use=PeerSends(peers=7))
    assert H100.nccl_bytes(a2a) == 2_818_572_288
    # #1685: "NV 1.06 GB before the 1st all_to_all_single, 4.34 GB after" (read as 10^9
    # bytes): a 3.28 GB step. The buffers are 14% short of it (the rest: what NCCL's debug log
    # does not list as connection buffers); stated tolerance 15%.
    measured = (4.34 - 1.06) * 1e9
    assert abs(H100.nccl_bytes(a2a) - measured) / measured < 0.15


def test_every_allocation_is_a_multiple_of_cuda_ipc_min() -> None:
    @given(
        size=st.integers(2, 4096),
        share=st.floats(0.0, 1.0),
        ring=st.integers(1, 64),
        nvls=st.integers(0, 32),
        peers=st.integers(1, 7),
    )
    def check(size: int, share: float, ring: int, nvls: int, peers: int) -> None:
        runtime = RuntimeMemory(
            nccl=NcclByTransport(ring_channels=ring, p2p_channels_per_peer=32, nvls_channels=nvls)
        )
        in_domain = max(1, round(share * size))
        uses = (ScalarCollectives(), BulkCollectives(), PeerSends(peers=min(peers, size - 1)))
        values = [
            runtime.nccl_bytes(Communicator(size=size, in_domain=in_domain, use=use))
            for use in uses
        ]
        assert all(value > 0 and value % (2 * MIB) == 0 for value in values)
        # NVLS only adds: bulk collectives hold at least the scalar ones' ring.
        assert values[1] >= values[0]
        off = RuntimeMemory(nccl=NcclByTransport(ring_channels=ring, nvls_channels=0))
        bulk = Communicator(size=size, in_domain=in_domain, use=BulkCollectives())
        assert off.nccl_bytes(bulk) == values[0]

    check()


def test_members_in_domain() -> None:
    assert members_in_domain(size=8, stride=1, world=8, domain=8) == 8
    assert members_in_domain(size=16, stride=8, world=128, domain=8) == 1
    assert members_in_domain(size=4, stride=2, world=64, domain=8) == 4
    assert members_in_domain(size=8, stride=2, world=64, domain=8) == 4
    assert members_in_domain(size=1, stride=64, world=64, domain=8) == 1


def test_communicators_of_a_tensor_parallel_job_on_one_node() -> None:
    found = communicators(tensor=8, pipeline=1, data=1, stage=0, tied=True, nvlink_domain=8)
    assert found == (
        Communicator(size=8, in_domain=8, use=ScalarCollectives()),  # the world
        Communicator(size=8, in_domain=8, use=BulkCollectives()),  # TP
    )
    # The tutorial's run 281 on dgx-h100: world ring 288 MiB, TP ring + NVLS 546 MiB.
    runtime = system_preset("dgx-h100").runtime
    assert (
        nccl_buffer_bytes(
            runtime, tensor=8, pipeline=1, data=1, stage=0, tied=True, nvlink_domain=8
        )
        == (288 + 546) * MIB
    )
    # One GPU: no communicator at all.
    assert communicators(tensor=1, pipeline=1, data=1, stage=0, tied=True) == ()


def test_pipeline_stage_neighbours_by_position() -> None:
    def pp(stage: int) -> Communicator:
        found = communicators(tensor=1, pipeline=4, data=2, stage=stage, tied=False)
        return next(comm for comm in found if isinstance(comm.use, PeerSends))

    assert pp(0).use == PeerSends(peers=1)
    assert pp(1).use == PeerSends(peers=2)
    assert pp(3).use == PeerSends(peers=1)
    # Interleaved: the last stage hands the next chunk to the first, so the ends have two peers.
    found = communicators(tensor=1, pipeline=4, data=2, stage=0, tied=False, virtual_stages=3)
    assert Communicator(size=4, in_domain=4, use=PeerSends(peers=2)) in found
    # p = 2: one peer whatever the chunks.
    found = communicators(tensor=1, pipeline=2, data=1, stage=0, tied=False, virtual_stages=3)
    assert Communicator(size=2, in_domain=2, use=PeerSends(peers=1)) in found


def test_pipeline_chunks_by_schedule() -> None:
    assert pipeline_chunks(InterleavedOneForwardOneBackward(virtual_stages=3)) == 3
    assert pipeline_chunks(CombinedOneForwardOneBackward(virtual_stages=2)) == 2
    assert pipeline_chunks(OneForwardOneBackward()) == 1
    assert pipeline_chunks(DualPipe()) == 1


def _transport(name: str) -> NcclByTransport:
    nccl = system_preset(name).runtime.nccl
    assert isinstance(nccl, NcclByTransport)
    return nccl


def test_presets_nvls_channels() -> None:
    assert _transport("dgx-h100").nvls_channels == 16
    assert _transport("dgx-h200").nvls_channels == 16
    assert _transport("dgx-a100-80gb").nvls_channels == 0
    assert system_preset("dgx-h800").runtime == RuntimeMemory(
        nccl=NcclByTransport(ring_channels=16, p2p_channels_per_peer=16, nvls_channels=0)
    )
    assert _transport("dgx-gb200").nvls_channels == 24
    assert _transport("dgx-b200").ring_channels == 32


def test_system_key_turns_nvls_off() -> None:
    system = system_from_mapping({"preset": "dgx-h100", "runtime": {"nccl_nvls_channels": 0}})
    # the preset's other channel counts stay
    assert system.runtime.nccl == NcclByTransport(
        ring_channels=24, p2p_channels_per_peer=32, nvls_channels=0
    )


def test_measured_per_communicator_keys_still_read() -> None:
    """The keys before the transport count keep their meaning (a public contract): a measured
    figure per communicator replaces the count, the preset's channel keys then unread."""
    system = system_from_mapping(
        {"preset": "dgx-h100", "runtime": {"nccl_bytes_per_communicator": 700_000_000}}
    )
    assert system.runtime.nccl == NcclPerCommunicator(bytes_per_communicator=700_000_000)
    runtime = system.runtime
    assert runtime.nccl_bytes(Communicator(size=8, in_domain=8, use=BulkCollectives())) == (
        700_000_000
    )
    # the pair figure at NVIDIA/nccl #964's 544 MB; one rank runs no communicator
    assert runtime.nccl_bytes(Communicator(size=2, in_domain=2, use=PeerSends(peers=1))) == (
        544_000_000
    )
    assert runtime.nccl_bytes(Communicator(size=1, in_domain=1, use=ScalarCollectives())) == 0
    # and the system writes itself back with the measured keys, not the channels
    back = system_to_mapping(system)["runtime"]
    assert isinstance(back, dict)
    assert back["nccl_bytes_per_pair_communicator"] == 544_000_000
    assert "nccl_ring_channels" not in back
    assert system_from_mapping(system_to_mapping(system)).runtime == runtime


def test_misspelt_runtime_keys_are_refused_by_name() -> None:
    with pytest.raises(ConfigError) as caught:
        system_from_mapping({"preset": "dgx-h100", "runtime": {"nccl_nvls_chanels": 0}})
    text = str(caught.value)
    assert "unknown key 'nccl_nvls_chanels' (did you mean 'nccl_nvls_channels'?)" in text


def test_channel_counts_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"ring_channels must be a positive integer"):
        NcclByTransport(ring_channels=0)
    with pytest.raises(ConfigError, match=r"nvls_channels must be a non-negative integer"):
        NcclByTransport(nvls_channels=-1)
    with pytest.raises(ConfigError) as caught:
        system_from_mapping(
            {
                "preset": "dgx-h100",
                "runtime": {"nccl_ring_channels": -1, "nccl_p2p_channels_per_peer": 0},
            }
        )
    text = str(caught.value)
    # every violated rule at once, each naming the key and the value
    assert "system.runtime.nccl_ring_channels must be a positive integer, got -1" in text
    assert "system.runtime.nccl_p2p_channels_per_peer must be a positive integer, got 0" in text


def test_both_nccl_models_in_one_table_are_refused() -> None:
    """A preset's channel keys give way to a measured figure (above); a table that names both
    itself is ambiguous and refused, naming the keys."""
    full = system_to_mapping(system_preset("dgx-h100"))
    runtime = full["runtime"]
    assert isinstance(runtime, dict)
    full["runtime"] = {**runtime, "nccl_bytes_per_communicator": 700_000_000}
    with pytest.raises(ConfigError) as caught:
        system_from_mapping(full)
    assert (
        "system.runtime: NCCL's buffers are counted either by transport (nccl_ring_channels, "
        "nccl_p2p_channels_per_peer, nccl_nvls_channels) or as a measured figure per "
        "communicator (nccl_bytes_per_communicator), not both"
    ) in str(caught.value)
    # a runtime table with channel keys only counts by transport, the other keys at defaults
    measured = system_from_mapping(
        {"preset": "dgx-h100", "runtime": {"nccl_bytes_per_pair_communicator": 1}}
    )
    back = system_from_mapping(
        {**system_to_mapping(measured), "runtime": {"nccl_ring_channels": 8}}
    )
    assert back.runtime.nccl == NcclByTransport(ring_channels=8)


def test_expert_grid_communicators_by_dispatcher() -> None:
    def grid(dispatcher: DispatcherType) -> tuple[Communicator, ...]:
        return communicators(
            tensor=1,
            pipeline=1,
            data=8,
            stage=0,
            tied=False,
            nvlink_domain=8,
            experts=ExpertGrid(tensor=1, expert=8, dispatcher=dispatcher),
        )

    world = Communicator(size=8, in_domain=8, use=ScalarCollectives())
    dp = Communicator(size=8, in_domain=8, use=BulkCollectives())
    # etp 1 and expert-dp 8 / (1 x 8) = 1 hold no communicator; the all-to-all's 7 peers do.
    assert grid(DispatcherType.ALLTOALL) == (
        world,
        dp,
        Communicator(size=8, in_domain=8, use=PeerSends(peers=7)),
    )
    assert grid(DispatcherType.ALLGATHER) == (world, dp, dp)
    assert grid(DispatcherType.FLEX) == (world, dp)
    # On dgx-h100: world 288 MiB, DP 546, the all-to-all 7 x 32 x 12 = 2,688 MiB.
    runtime = system_preset("dgx-h100").runtime
    assert (
        nccl_buffer_bytes(
            runtime,
            tensor=1,
            pipeline=1,
            data=8,
            stage=0,
            tied=False,
            nvlink_domain=8,
            experts=ExpertGrid(tensor=1, expert=8, dispatcher=DispatcherType.ALLTOALL),
        )
        == (288 + 546 + 2688) * MIB
    )


def test_context_parallel_communicator_by_exchange() -> None:
    def cp(communication: CpCommunication) -> tuple[Communicator, ...]:
        found = communicators(
            tensor=2,
            pipeline=1,
            data=1,
            stage=0,
            tied=False,
            context=4,
            cp_communication=communication,
        )
        # world, TP, d x cp, then the cp exchange's groups
        return found[3:]

    assert cp(RingExchange()) == (Communicator(size=4, in_domain=4, use=PeerSends(peers=2)),)
    assert cp(AllGatherKV()) == (Communicator(size=4, in_domain=4, use=BulkCollectives()),)
    assert cp(HeadAllToAll()) == (Communicator(size=4, in_domain=4, use=PeerSends(peers=3)),)
    assert cp(HierarchicalAllToAllRing(a2a_size=2, p2p_size=2)) == (
        Communicator(size=2, in_domain=2, use=PeerSends(peers=1)),
        Communicator(size=2, in_domain=2, use=PeerSends(peers=1)),
    )
    # On dgx-h100 (8 GPUs): the p2p ring's two peers, 2 x 32 x 12 MiB.
    assert H100.nccl_bytes(cp(RingExchange())[0]) == 768 * MIB
