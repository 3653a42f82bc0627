"""Iteration composition, DP cost and optimizer step pinned to hand-computed values.

The system below has round numbers and constant efficiencies so that every figure can be worked
out on paper; the arithmetic is written next to each assertion.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from blueprinting.analysis.data_parallel import (
    DataParallelCost,
    OverlapWindows,
    collective_sm_overhead,
    data_parallel_cost,
)
from blueprinting.analysis.iteration import (
    bubble_contract,
    compose_breakdown,
    pipeline_p2p_exposed,
    stage_work,
)
from blueprinting.analysis.optimizer_step import adam_step_cost
from blueprinting.hardware.efficiency import ConstantEfficiency
from blueprinting.hardware.system import (
    AcceleratorSpec,
    CommGroup,
    ComputeEngineSpec,
    DatatypeRate,
    LinkSpec,
    LinkTier,
    MemorySpec,
    NodeSpec,
    ProcessingMode,
    SystemSpec,
)
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.transformer import (
    BatchSpec,
    DataParallel,
    DistributedOptimizer,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    OneForwardOneBackward,
    PipelineParallel,
    ShardedParameters,
    TensorParallel,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
)
from blueprinting.synthesizer.stages.portable_plan.ir import (
    BlockCost,
    ExtraCost,
    PhaseCost,
    PortablePlanIR,
    StagePlan,
)

ONE = ConstantEfficiency(fraction=1.0)


def _system() -> SystemSpec:
    """100 TFLOP/s matrix, 10 TFLOP/s vector, 1 TB/s HBM, 100 GB/s links with no latency."""
    link = LinkSpec(bandwidth_bytes_per_s=100e9, latency_s=0.0, efficiency=ONE)
    return SystemSpec(
        name="paper",
        accelerator=AcceleratorSpec(
            name="paper-gpu",
            matrix=ComputeEngineSpec(
                rates=(
                    DatatypeRate(datatype=Datatype.BF16, peak_flop_per_s=100e12, efficiency=ONE),
                )
            ),
            vector=ComputeEngineSpec(
                rates=(DatatypeRate(datatype=Datatype.BF16, peak_flop_per_s=10e12, efficiency=ONE),)
            ),
            hbm=MemorySpec(capacity_bytes=80e9, bandwidth_bytes_per_s=1e12, efficiency=ONE),
        ),
        node=NodeSpec(gpus_per_node=8, link=link),
        scale_out=link,
        processing_mode=ProcessingMode.NO_OVERLAP,
    )


def _plan(p: int, v: int, blocks_per_chunk: int) -> PortablePlanIR:
    """Block: forward 1.0 s compute + 0.1 s TP; backward 1.5 + 0.5 s compute + 0.2 s TP;
    recompute 0.25 s. Embedding 0.01 + 0.02 s, LM head 0.3 + 0.6 s, P2P 0.05 s each way."""
    block = BlockCost(
        forward=PhaseCost(compute_s=1.0, comm_s=0.1, comm_exposed_s=0.1),
        backward_activation=PhaseCost(compute_s=1.5, comm_s=0.2, comm_exposed_s=0.2),
        backward_weight=PhaseCost(compute_s=0.5),
        recompute=PhaseCost(compute_s=0.25),
    )
    stages = tuple(
        StagePlan(
            index=i,
            blocks_per_chunk=(blocks_per_chunk,) * v,
            recomputed_blocks_per_chunk=(0,) * v,
            has_embedding=i == 0,
            has_lm_head=i == p - 1,
        )
        for i in range(p)
    )
    return PortablePlanIR(
        block=block,
        embedding=ExtraCost(forward=PhaseCost(compute_s=0.01), backward=PhaseCost(compute_s=0.02)),
        lm_head=ExtraCost(forward=PhaseCost(compute_s=0.3), backward=PhaseCost(compute_s=0.6)),
        stages=stages,
        p2p_forward_s=0.05,
        p2p_backward_s=0.05,
        p2p_bytes=1000,
    )


def _mapping(p: int, v: int, m: int) -> TransformerTrainingMappingSpec:
    schedule = (
        OneForwardOneBackward() if v == 1 else InterleavedOneForwardOneBackward(virtual_stages=v)
    )
    return TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(degree=1),
            pipeline=PipelineParallel(degree=p, schedule=schedule),
            data=DataParallel(degree=1),
        ),
        batch=BatchSpec(global_batch_size=m),
    )


def test_chunk_critical_paths_include_one_p2p() -> None:
    plan = _plan(p=4, v=2, blocks_per_chunk=3)
    # forward chunk: 3 x (1.0 + 0.1) + 0.05; backward: 3 x (1.5 + 0.2 + 0.5) + 0.05
    assert plan.forward_chunk_s() == pytest.approx(3.35)
    assert plan.backward_chunk_s() == pytest.approx(6.65)


def test_bubble_contract_uses_one_virtual_chunk() -> None:
    plan = _plan(p=4, v=2, blocks_per_chunk=3)
    contract = bubble_contract(plan, microbatches=8)
    # (p - 1) x (3.35 + 6.65) with m mod p = 0
    assert contract.n_bubble == 3
    assert contract.bubble_s == pytest.approx(30.0)
    # m = 6: extra (v - 1)(p - m mod p) = 1 x 2 chunks
    assert bubble_contract(plan, microbatches=6).n_bubble == 5


def test_stage_work_and_critical_stage_include_extras() -> None:
    plan = _plan(p=4, v=2, blocks_per_chunk=3)
    last = plan.stages[-1]
    assert plan.critical_stage() == last  # LM head (0.9 s) outweighs the embedding (0.03 s)
    work = stage_work(plan, last, microbatches=8)
    # per microbatch: forward 6 x 1.0 + 0.3; backward 6 x 2.0 + 0.6; TP 6 x 0.3
    assert work.forward == pytest.approx(8 * 6.3)
    assert work.backward == pytest.approx(8 * 12.6)
    assert work.recompute == 0.0
    assert work.tp_comm_exposed == pytest.approx(8 * 1.8)


def test_pp_exposure_blocking_and_overlapped() -> None:
    plan = _plan(p=4, v=2, blocks_per_chunk=3)
    # blocking: m x v x (0.05 + 0.05) = 8 x 2 x 0.1
    assert pipeline_p2p_exposed(
        InterleavedOneForwardOneBackward(virtual_stages=2), plan, 8
    ) == pytest.approx(1.6)
    # overlapped: (p v - 1) x 0.1 = 7 x 0.1
    assert pipeline_p2p_exposed(
        InterleavedOneForwardOneBackward(virtual_stages=2, overlap_p2p_comm=True), plan, 8
    ) == pytest.approx(0.7)


def test_breakdown_sums_exactly_to_the_total() -> None:
    plan = _plan(p=4, v=2, blocks_per_chunk=3)
    mapping = _mapping(p=4, v=2, m=8)
    breakdown = compose_breakdown(
        mapping=mapping, plan=plan, bubble_s=30.0, dp_exposed_s=0.5, optimizer_s=0.25
    )
    parts = breakdown.as_dict()
    assert sum(parts.values()) == breakdown.total_s
    assert breakdown.total_s == pytest.approx(8 * 6.3 + 8 * 12.6 + 8 * 1.8 + 30 + 1.6 + 0.75)


def _windows(m: int = 8) -> OverlapWindows:
    return OverlapWindows(
        blocks_per_chunk=4,
        virtual_stages=1,
        pipeline_degree=4,
        block_backward_s=0.01,
        chunk_backward_s=0.04,
        stage_forward_s=0.02,
        microbatch_count=m,
    )


def _dp(data: DataParallel, system: SystemSpec | None = None) -> DataParallelCost:
    """1e9 parameters on a 4-way DP group across nodes, bf16 params (2 B) and fp32 grads (4 B),
    8 microbatches (the paper system gives no SM count: no SM contention)."""
    return data_parallel_cost(
        data=data,
        stage_parameters=10**9,
        param_bytes=2,
        grad_bytes=4,
        group=CommGroup(size=4, tier=LinkTier.SCALE_OUT, ranks_per_node=1, ranks_per_domain=1),
        system=_system() if system is None else system,
        windows=_windows(m=8),
    )


def test_dp_all_reduce_hand_value() -> None:
    # 1e9 params x 4 B grads = 4 GB; ring all-reduce 2 (n-1)/n = 1.5 -> 6 GB at 100 GB/s = 0.06 s
    cost = _dp(DataParallel(degree=4, optimizer_sharding=NoOptimizerSharding()))
    assert cost.grad_sync_s == pytest.approx(0.06)
    assert cost.exposed_s == pytest.approx(0.06)


def test_dp_overlap_window_hand_value() -> None:
    cost = _dp(DataParallel(degree=4, overlap_grad_reduce=True))
    # per block 0.06 / 4 = 0.015; the last block's bucket is exposed (0.015) plus what the other
    # three (0.045) do not hide behind three block backwards (0.03): 0.015 + 0.015
    assert cost.exposed_s == pytest.approx(0.03)


def test_distributed_optimizer_reduce_scatter_and_gather() -> None:
    cost = _dp(DataParallel(degree=4, optimizer_sharding=DistributedOptimizer()))
    # RS: 4 GB x 3/4 / 100 GB/s = 0.03; AG: 2 GB x 3/4 / 100 GB/s = 0.015
    assert cost.grad_sync_s == pytest.approx(0.03)
    assert cost.param_gather_s == pytest.approx(0.015)
    assert cost.exposed_s == pytest.approx(0.045)


def test_zero3_gathers_params_twice_per_microbatch() -> None:
    cost = _dp(DataParallel(degree=4, optimizer_sharding=ShardedParameters()))
    # 8 microbatches x (2 x AG 0.015 + RS 0.03)
    assert cost.param_gather_s == pytest.approx(8 * 0.03)
    assert cost.grad_sync_s == pytest.approx(8 * 0.03)


def test_adam_step_hand_value() -> None:
    # 1e9 params: 11 GFLOP at 10 TFLOP/s = 1.1 ms; bytes 4 + 8 + 16 + 2 = 30 GB at 1 TB/s = 30 ms
    cost = adam_step_cost(
        parameters=10**9, param_bytes=2, grad_bytes=4, datatype=Datatype.BF16, system=_system()
    )
    assert cost.flops == 11 * 10**9
    assert cost.bytes_moved == 30 * 10**9
    assert cost.time_s == pytest.approx(0.0011 + 0.030)


def test_zero3_overlapped_reduce_scatter_hides_per_microbatch() -> None:
    cost = _dp(
        DataParallel(degree=4, optimizer_sharding=ShardedParameters(), overlap_grad_reduce=True)
    )
    # Per microbatch RS 0.03 s = 4 blocks x 0.0075; the last block's bucket (0.0075) is exposed
    # and the other three (0.0225) hide behind three block backwards (0.03): 8 x 0.0075 exposed,
    # plus the 16 all-gathers of 0.015 s each (no prefetch).
    assert cost.exposed_s == pytest.approx(8 * 0.0075 + 16 * 0.015)


def test_hidden_dp_collectives_slow_the_compute_by_the_sms_they_hold() -> None:
    """NCCL's ring kernel on 24 of 124 SMs (the default 24 ring channels): the compute beside a
    hidden collective runs on the other 100, 24/100 = 0.24 of the hidden time longer. The window
    example above hides 0.03 s of the 0.06 s all-reduce: 0.03 + 0.24 x 0.03 exposed."""
    base = _system()
    system = replace(base, accelerator=replace(base.accelerator, sm_count=124))
    assert collective_sm_overhead(system) == pytest.approx(0.24)
    cost = _dp(DataParallel(degree=4, overlap_grad_reduce=True), system)
    assert cost.sm_contention_s == pytest.approx(0.24 * 0.03)
    assert cost.exposed_s == pytest.approx(0.03 + 0.24 * 0.03)
    assert cost.grad_sync_exposed_s == pytest.approx(0.03)
    # not overlapped: nothing hidden, nothing slowed
    plain = _dp(DataParallel(degree=4), system)
    assert plain.sm_contention_s == 0.0 and plain.exposed_s == pytest.approx(0.06)


@pytest.mark.parametrize(
    ("preset", "overhead"),
    [("dgx-h100", 24 / (132 - 24)), ("dgx-b200", 32 / (148 - 32)), ("dgx-h800", 16 / 116)],
)
def test_the_presets_ring_sm_overhead(preset: str, overhead: float) -> None:
    from blueprinting.hardware.presets import system_preset

    assert collective_sm_overhead(system_preset(preset)) == pytest.approx(overhead)
