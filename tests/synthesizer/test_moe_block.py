"""The MoE layer and MLA in the block algebra, the DistributedTaskIR and the plan: exact work,
dispatch bytes per dispatcher, conservation over tp, EP exposure and overlap, memory parts."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.analysis.evaluate import PlanOptions
from blueprinting.analysis.report import IterationReport
from blueprinting.api import plan_spec
from blueprinting.hardware.collectives import (
    CollectiveKind,
    ExchangeKernels,
    collective_link_time,
)
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import CommGroup, LinkTier
from blueprinting.mapping.model import DenseFeedForward, TransformerModelSpec
from blueprinting.mapping.transformer import (
    AllGatherDispatcher,
    AllReduce,
    AllToAllDispatcher,
    BatchSpec,
    DataParallel,
    DistributedOptimizer,
    ExpertParallel,
    FlexBackend,
    FlexDispatcher,
    OneForwardOneBackward,
    PipelineParallel,
    ReduceScatterAllGather,
    SingleStage,
    TensorParallel,
    TrainingSpec,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    dispatcher_overlaps,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    CollectivePurpose,
    DomainForwarding,
    SemanticOpName,
    distinct_destinations,
)
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import (
    CollectiveTask,
    ComputeTask,
    DistributedTaskIR,
    Phase,
)
from tests.strategies import with_ep_overlap
from tests.synthesizer.moe_models import deepseek_like, mixtral_like


def _mapping(
    *,
    tp: int = 1,
    ep: int = 1,
    etp: int = 1,
    pp: int = 1,
    dp: int = 1,
    dispatcher: AllToAllDispatcher | AllGatherDispatcher | FlexDispatcher | None = None,
    gbs: int = 1,
) -> TransformerTrainingMappingSpec:
    return TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(
                degree=tp, communication=ReduceScatterAllGather() if tp > 1 else AllReduce()
            ),
            pipeline=PipelineParallel(
                degree=pp,
                schedule=with_ep_overlap(
                    OneForwardOneBackward() if pp > 1 else SingleStage(),
                    dispatcher is not None and dispatcher_overlaps(dispatcher),
                ),
            ),
            data=DataParallel(degree=dp, optimizer_sharding=DistributedOptimizer()),
            experts=ExpertParallel(
                degree=ep,
                tensor_degree=etp,
                dispatcher=AllToAllDispatcher() if dispatcher is None else dispatcher,
            ),
        ),
        batch=BatchSpec(global_batch_size=gbs, micro_batch_size=1),
    )


_CHUNK_SORTS = (SemanticOpName.MOE_SORT_CHUNKS, SemanticOpName.MOE_UNSORT_CHUNKS)


def _moe(ir: DistributedTaskIR) -> tuple[ComputeTask | CollectiveTask, ...]:
    assert ir.moe_block is not None
    return ir.moe_block.tasks


def _flops(ir: DistributedTaskIR, op: SemanticOpName, phase: Phase) -> int:
    return sum(
        t.work.matrix_flops
        for t in _moe(ir)
        if isinstance(t, ComputeTask) and t.lineage.op is op and t.phase is phase
    )


def _dispatch(ir: DistributedTaskIR) -> list[CollectiveTask]:
    return [
        t
        for t in _moe(ir)
        if isinstance(t, CollectiveTask) and t.purpose is CollectivePurpose.TOKEN_DISPATCH
    ]


def test_expert_gemm_flops_are_top_k_routed_tokens_exactly() -> None:
    """2 k T h (2F) for FC1 (SwiGLU), 2 k T F h for FC2, per phase; T = b s tokens at t = 1;
    the grouped GEMM's 32 local experts at ep 8 each take k T / 32 rows."""
    model = mixtral_like()
    ir = derive_training_block(model, _mapping(ep=8, dp=8))
    tokens, k, h, f = 4096, 2, 4096, 14336
    assert _flops(ir, SemanticOpName.EXPERT_FC1, Phase.FORWARD) == 2 * k * tokens * h * 2 * f
    assert _flops(ir, SemanticOpName.EXPERT_FC2, Phase.FORWARD) == 2 * k * tokens * f * h
    assert _flops(ir, SemanticOpName.EXPERT_FC1, Phase.BACKWARD_WEIGHT_GRAD) == (
        2 * k * tokens * h * 2 * f
    )
    # the router: a replicated h x E GEMM on the rank's tokens
    assert _flops(ir, SemanticOpName.ROUTER, Phase.FORWARD) == 2 * tokens * h * 8


def test_mla_projection_flops_are_twice_its_gemm_parameters_per_token() -> None:
    """Shared reference section 2.10: forward FLOPs per token = 2 x the Q, KV and O
    projection parameters (the latent norms are not GEMMs)."""
    model = deepseek_like()
    ir = derive_training_block(model, _mapping())
    tokens = 4096
    gemm_params = model.attention_parameters - (1536 + 512)  # minus the two latent norms
    assert gemm_params == 187_107_328 - 2048
    projections = sum(
        _flops(ir, op, Phase.FORWARD)
        for op in (
            SemanticOpName.MLA_DOWN_PROJECTION,
            SemanticOpName.MLA_UP_PROJECTION,
            SemanticOpName.OUTPUT_PROJECTION,
        )
    )
    assert projections == 2 * gemm_params * tokens


def test_alltoall_sends_k_copies_per_token_four_times() -> None:
    """alltoall at ep 8, etp 1: dispatch + combine forward, their mirrors backward, each
    k T h bytes (bf16) per rank; etp 2 adds an all-gather and a reduce-scatter of the
    received rows (k T etp h bytes) each way. Beside them: the E int64 token counts
    all-gathered over etp x ep before the dispatch, and the k T fp32 routing probabilities
    all-to-all over ep with the tokens (gathered over etp beside them), their gradients back."""
    model = mixtral_like()
    tokens, k, h = 4096, 2, 4096
    ir = derive_training_block(model, _mapping(ep=8, dp=8))
    dispatch = _dispatch(ir)
    rows = [t for t in dispatch if t.bytes == k * tokens * h * 2]
    small = [(t.phase, t.kind.value, t.axis, t.bytes) for t in dispatch if t not in rows]
    assert [t.kind.value for t in rows] == ["all_to_all"] * 4
    assert {t.axis for t in rows} == {"ep"}
    assert sorted(small) == sorted(
        [
            (Phase.FORWARD, "all_gather", "etp_ep", 8 * 8 * 8),
            (Phase.FORWARD, "all_to_all", "ep", k * tokens * 4),
            (Phase.BACKWARD_ACTIVATION_GRAD, "all_to_all", "ep", k * tokens * 4),
        ]
    )
    ir2 = derive_training_block(model, _mapping(ep=4, etp=2, dp=8))
    gathers = [t for t in _dispatch(ir2) if t.axis == "etp"]
    tokens_etp = [t for t in gathers if t.bytes == k * tokens * 2 * h * 2]
    assert sorted(t.kind.value for t in tokens_etp) == ["all_gather"] * 2 + ["reduce_scatter"] * 2
    probs = sorted((t.kind.value, t.bytes) for t in gathers if t not in tokens_etp)
    assert probs == [("all_gather", k * tokens * 2 * 4), ("reduce_scatter", k * tokens * 2 * 4)]


def test_allgather_and_flex_bytes() -> None:
    """allgather: T h (etp ep) gathered, independent of k; flex: one copy per distinct
    destination rank, e (1 - (1 - 1/e)^k) (DeepSeek-V3 k 8: 7.6 at e 64, 5.25 at e 8)."""
    assert distinct_destinations(64, 8) == pytest.approx(7.6, abs=0.05)
    assert distinct_destinations(8, 8) == pytest.approx(5.25, abs=0.01)
    model = mixtral_like()
    tokens, h = 4096, 4096
    gathered = derive_training_block(model, _mapping(ep=8, dp=8, dispatcher=AllGatherDispatcher()))
    assert {t.bytes for t in _dispatch(gathered)} == {tokens * 8 * h * 2}
    flex = derive_training_block(model, _mapping(ep=8, dp=8, dispatcher=FlexDispatcher()))
    copies = math.ceil(tokens * distinct_destinations(8, 2))
    assert {t.bytes for t in _dispatch(flex)} == {copies * h * 2}
    assert {t.axis for t in _dispatch(flex)} == {"etp_ep"}


@settings(max_examples=20, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), ep=st.sampled_from([1, 2, 4, 8]))
def test_moe_work_is_conserved_over_tp(tp: int, ep: int) -> None:
    """Every MoE-layer task's local work x its lineage shards is the same global work at any
    t and ep (the routed path is token-sharded under sequence parallelism). The chunk sort of
    the alltoall dispatcher (more than one local expert) has no GEMM work and is left out."""
    model = mixtral_like()
    base = derive_training_block(model, _mapping(ep=1, dp=8))
    ir = derive_training_block(model, _mapping(tp=tp, ep=ep, dp=8))

    def global_work(x: DistributedTaskIR) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for t in _moe(x):
            if isinstance(t, ComputeTask) and t.lineage.op not in _CHUNK_SORTS:
                key = (t.lineage.op.value, t.phase.value)
                out[key] = out.get(key, 0) + t.work.matrix_flops * t.lineage.shards
        return out

    assert global_work(ir) == global_work(base)


def _plan(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec, system: str = "dgx-h100"
) -> IterationReport:
    return plan_spec(
        TrainingSpec(model=model, mapping=mapping),
        system,
        PlanOptions(megatron_rules=False, simulate=False),
    )


def test_ep_comm_is_its_own_term_and_overlap_hides_it() -> None:
    model = mixtral_like()
    one = _plan(model, _mapping(ep=1, dp=8, gbs=16))
    assert one.breakdown.ep_comm_exposed == 0.0
    plain = _plan(model, _mapping(ep=8, dp=8, gbs=16))
    assert plain.breakdown.ep_comm_exposed > 0.0
    moe = plain.plan.moe_block
    assert moe is not None
    # exposed whole without the EP overlap: the term is m x MoE layers x the block's link time
    link = moe.forward.ep_comm_s + moe.backward_activation.ep_comm_s + moe.backward_weight.ep_comm_s
    m = plain.spec.mapping.microbatch_count
    assert plain.breakdown.ep_comm_exposed == pytest.approx(m * 4 * link, rel=1e-12)
    overlapped = _plan(
        model, _mapping(ep=8, dp=8, gbs=16, dispatcher=AllToAllDispatcher(overlap=True))
    )
    assert overlapped.breakdown.ep_comm_exposed < plain.breakdown.ep_comm_exposed
    assert overlapped.breakdown.forward == pytest.approx(plain.breakdown.forward, rel=1e-12)


def test_expert_optimizer_states_shard_over_expert_dp() -> None:
    """12 bytes per routed-expert parameter over expert-dp = W/(etp ep p) with the
    distributed optimizer; the dense part over d x cp."""
    model = mixtral_like()
    report = _plan(model, _mapping(ep=4, dp=8, gbs=16), "dgx-h100")
    memory = report.memory
    experts = 4 * model.routed_expert_parameters // 4  # 4 MoE layers, E/ep of the experts
    assert memory.expert_weights == experts * 2
    assert memory.expert_optimizer_states == -(-experts * 12 // 2)  # expert-dp = 8/(1*4*1)
    dense_params = (memory.weights - memory.expert_weights) // 2
    assert memory.optimizer_states - memory.expert_optimizer_states == -(-dense_params * 12 // 8)


def test_first_dense_layers_cost_as_dense_blocks() -> None:
    """DeepSeek's first-k-dense: the stage holding them runs dense blocks, the others MoE."""
    model = deepseek_like(layers=4, dense=2)
    report = _plan(model, _mapping(pp=2, ep=8, dp=8, gbs=16))
    stages = report.plan.stages
    assert [s.moe_blocks for s in stages] == [0, 2]
    assert [s.dense_blocks for s in stages] == [2, 0]


def test_hierarchical_all_to_all_sends_only_the_remote_share_over_the_nic() -> None:
    """16 ranks on 2 nodes: the flat model sends 15/16 of the buffer over the NIC, the
    hierarchical one 8/16 there (and 7/16 over NVLink at the same time, faster)."""
    system = system_preset("dgx-h100")
    group = CommGroup(size=16, tier=LinkTier.SCALE_OUT, ranks_per_node=8, ranks_per_domain=8)
    size = 1e9
    flat = collective_link_time(CollectiveKind.ALL_TO_ALL, size, 16, system.scale_out)
    latency = system.scale_out.latency_s
    hierarchical = system.all_to_all_time(size, group)
    assert hierarchical - latency == pytest.approx((flat - latency) * 8 / 15, rel=1e-9)
    # every NCCL all-to-all takes the hierarchical path: context parallelism's a2a too
    assert system.collective_time(CollectiveKind.ALL_TO_ALL, size, group) == hierarchical


def test_dense_models_have_no_moe_block() -> None:
    model = replace(mixtral_like(), feed_forward=DenseFeedForward())
    ir = derive_training_block(model, _mapping())
    assert ir.moe_block is None
    assert [a.name for a in ir.mesh.axes] == ["tp"]
    moe = derive_training_block(mixtral_like(), _mapping(ep=4, etp=2, dp=8))
    assert [(a.name, a.size) for a in moe.mesh.axes] == [
        ("tp", 1),
        ("etp", 2),
        ("ep", 4),
        ("etp_ep", 8),
    ]


def test_mtp_depth_adds_one_layer_and_one_lm_head_on_the_loss_stage() -> None:
    """DeepSeek-V3's MTP 1 (shared reference section 2.11): per micro-batch the loss's stage
    runs one more MoE layer and one more LM head and loss, forward and backward."""
    with_mtp = replace(deepseek_like(layers=4, dense=1), mtp_num_layers=1)
    without = replace(with_mtp, mtp_num_layers=0)
    mapping = _mapping(pp=2, ep=8, dp=8, gbs=16)
    a, b = _plan(with_mtp, mapping), _plan(without, mapping)
    moe, lm = a.plan.moe_block, a.plan.lm_head
    assert moe is not None
    m = mapping.microbatch_count
    expected = m * (moe.forward.compute_s + lm.forward.compute_s)
    assert a.breakdown.forward - b.breakdown.forward == pytest.approx(expected, rel=1e-9)
    assert a.plan.stages[0].has_embedding and not a.plan.stages[0].has_lm_head
    assert a.plan.mtp.forward.flops == moe.forward.flops + lm.forward.flops


def test_deepep_crosses_the_nic_once_per_remote_node() -> None:
    """32 ranks on 4 nodes, top-8: a token reaches 32 (1 - (31/32)^8) = 7.18 distinct ranks, 5.38
    of them on the 3 other nodes; DeepEP sends it once to each remote node it touches,
    3 (1 - (3/4)^8) = 2.70 times, and fans it out there over NVLink. The NIC time is the plain
    hierarchical one's scaled by 2.70 / 7.18 over its 24/32 share (NVLink, 31/32 of the buffer,
    is faster here)."""
    system = system_preset("dgx-b200")
    group = CommGroup(size=32, tier=LinkTier.SCALE_OUT, ranks_per_node=8, ranks_per_domain=8)
    size = 1e9
    latency = system.scale_out.latency_s
    # DeepEP's own kernels: the links' ring rate, against the same kernels' plain exchange
    plain = system.all_to_all_time(size, group, ExchangeKernels.LIBRARY) - latency
    forwarded = system.forwarded_all_to_all_time(size, group, fanout=8) - latency
    distinct = 32 * (1 - (31 / 32) ** 8)
    remote_nodes = 3 * (1 - (3 / 4) ** 8)
    assert distinct == pytest.approx(7.18, abs=0.01) and remote_nodes == pytest.approx(
        2.70, abs=0.01
    )
    assert forwarded == pytest.approx(plain * (remote_nodes / distinct) / (24 / 32), rel=1e-9)
    # one node: nothing crosses the NIC, the plain intra-node all-to-all
    node = CommGroup(size=8, tier=LinkTier.INTRA_NODE, ranks_per_node=8, ranks_per_domain=8)
    assert system.forwarded_all_to_all_time(size, node, fanout=8) == system.all_to_all_time(
        size, node, ExchangeKernels.LIBRARY
    )


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(2, 32),
    per_node=st.sampled_from([4, 8]),
    fanout=st.integers(1, 16),
)
def test_forwarding_never_sends_more_over_the_nic(nodes: int, per_node: int, fanout: int) -> None:
    """Every remote node a token touches holds at least one of the ranks it touches, so
    DeepEP's NIC traffic (one copy per remote node) never exceeds the plain all-to-all's (one
    per remote rank): with an NVLink faster than the NIC the forwarded time is never longer."""
    system = system_preset("dgx-h100")
    n = nodes * per_node
    group = CommGroup(
        size=n, tier=LinkTier.SCALE_OUT, ranks_per_node=per_node, ranks_per_domain=per_node
    )
    size = float(n) * 1e6
    plain = system.all_to_all_time(size, group, ExchangeKernels.LIBRARY)
    forwarded = system.forwarded_all_to_all_time(size, group, fanout=fanout)
    nvlink_all = system.all_to_all_time(
        size * (n - 1) / n * per_node / (per_node - 1),
        CommGroup(
            size=per_node,
            tier=LinkTier.INTRA_NODE,
            ranks_per_node=per_node,
            ranks_per_domain=per_node,
        ),
        ExchangeKernels.LIBRARY,
    )
    assert forwarded <= max(plain, nvlink_all) * (1 + 1e-9)


def test_only_deepep_forwards_per_node() -> None:
    """The flex dispatcher's DeepEP exchanges carry the forwarding (top-k, etp); HybridEP's and
    the alltoall dispatcher's do not (no source states their per-node deduplication)."""
    model = mixtral_like()
    deepep = derive_training_block(model, _mapping(ep=8, dp=8, dispatcher=FlexDispatcher()))
    assert {t.forwarding for t in _dispatch(deepep)} == {DomainForwarding(fanout=2, replicas=1)}
    hybrid = derive_training_block(
        model,
        _mapping(ep=8, dp=8, dispatcher=FlexDispatcher(backend=FlexBackend.HYBRIDEP)),
    )
    assert {t.forwarding for t in _dispatch(hybrid)} == {None}
    alltoall = derive_training_block(model, _mapping(ep=8, dp=8))
    assert {t.forwarding for t in _dispatch(alltoall)} == {None}


def test_flex_exchanges_run_at_their_librarys_measured_rate_inside_the_domain() -> None:
    """A flex dispatch / combine whose group lies in one NVLink domain is its bytes over the
    node's measured rate for the library at the group's size (DeepEP's Hybrid-EP README; the
    dispatch kernel for the forward dispatch and the backward of the combine, the combine
    kernel for the other two); the alltoall dispatcher keeps NCCL's link model, and so does a
    library the node has no table for (H100) or a group that leaves the domain."""
    from blueprinting.hardware.ep_kernels import GB200_HYBRIDEP, EpLeg
    from blueprinting.synthesizer.dialects.transformer.training import FlexExchange
    from blueprinting.synthesizer.stages.portable_plan.passes import _dispatch_time

    model = mixtral_like()
    hybrid = FlexDispatcher(backend=FlexBackend.HYBRIDEP)
    ir = derive_training_block(model, _mapping(ep=8, dp=8, dispatcher=hybrid))
    legs = {(t.phase, t.lineage.op): t.flex for t in _dispatch(ir)}
    # Megatron-Core's default moe_hybridep_num_sms = 16 rides with each exchange
    to_experts = FlexExchange(backend=FlexBackend.HYBRIDEP, leg=EpLeg.DISPATCH, sms=16)
    back = FlexExchange(backend=FlexBackend.HYBRIDEP, leg=EpLeg.COMBINE, sms=16)
    assert legs == {
        (Phase.FORWARD, SemanticOpName.EXPERT_FC1): to_experts,
        (Phase.FORWARD, SemanticOpName.EXPERT_FC2): back,
        (Phase.BACKWARD_ACTIVATION_GRAD, SemanticOpName.EXPERT_FC2): to_experts,
        (Phase.BACKWARD_ACTIVATION_GRAD, SemanticOpName.EXPERT_FC1): back,
    }
    gb200, h100 = system_preset("dgx-gb200"), system_preset("dgx-h100")
    library = ExchangeKernels.LIBRARY
    rack = CommGroup(size=8, tier=LinkTier.INTRA_NODE, ranks_per_node=4, ranks_per_domain=8)
    for task in _dispatch(ir):
        assert task.flex is not None
        rate = {EpLeg.DISPATCH: 545.71e9, EpLeg.COMBINE: 568.94e9}[task.flex.leg]
        assert _dispatch_time(task, gb200, rack) == pytest.approx(task.bytes / rate, rel=1e-12)
        node = CommGroup(size=8, tier=LinkTier.INTRA_NODE, ranks_per_node=8, ranks_per_domain=8)
        # no table for H100, or a group off the domain: the link model at the links' ring rate
        assert _dispatch_time(task, h100, node) == h100.all_to_all_time(task.bytes, node, library)
        spread = CommGroup(size=8, tier=LinkTier.SCALE_OUT, ranks_per_node=4, ranks_per_domain=4)
        assert _dispatch_time(task, gb200, spread) == gb200.all_to_all_time(
            task.bytes, spread, library
        )
    # a group below the smallest measured one (EP2 on a B200 node) keeps the link model
    b200 = system_preset("dgx-b200")
    ep2 = derive_training_block(model, _mapping(ep=2, dp=8, dispatcher=hybrid))
    pair = CommGroup(size=2, tier=LinkTier.INTRA_NODE, ranks_per_node=2, ranks_per_domain=2)
    for task in _dispatch(ep2):
        assert _dispatch_time(task, b200, pair) == b200.all_to_all_time(task.bytes, pair, library)
    # between and beyond the measured group sizes: linear, then the largest one's rate
    assert GB200_HYBRIDEP.bytes_per_s(EpLeg.DISPATCH, 20) == pytest.approx(515.40e9, rel=1e-12)
    assert GB200_HYBRIDEP.bytes_per_s(EpLeg.COMBINE, 64) == 447.89e9
    assert GB200_HYBRIDEP.bytes_per_s(EpLeg.COMBINE, 2) == 568.94e9
    alltoall = derive_training_block(model, _mapping(ep=8, dp=8))
    assert {t.flex for t in _dispatch(alltoall)} == {None}
    for task in _dispatch(alltoall):
        if task.kind.value == CollectiveKind.ALL_TO_ALL.value:
            # the alltoall dispatcher: NCCL's all-to-all, at its own measured rate
            assert _dispatch_time(task, gb200, rack) == gb200.all_to_all_time(task.bytes, rack)


def test_ep_kernel_tables_are_checked() -> None:
    from blueprinting.errors import ConfigError
    from blueprinting.hardware.ep_kernels import GB200_HYBRIDEP, EpKernelRates
    from blueprinting.hardware.system import NodeSpec

    with pytest.raises(ConfigError) as error:
        EpKernelRates(
            backend=FlexBackend.DEEPEP,
            source="",
            sms=0,
            ranks=(16, 8),
            dispatch_bytes_per_s=(1.0,),
            combine_bytes_per_s=(1.0, -1.0),
        )
    problems = " | ".join(error.value.problems)
    for part in (
        "ranks must increase strictly",
        "sms must be a positive integer",
        "dispatch_bytes_per_s has 1 values for 2 group sizes",
        "combine_bytes_per_s must be positive numbers",
        "source must name the measurement",
    ):
        assert part in problems
    with pytest.raises(ConfigError) as infinite:
        EpKernelRates(
            backend=FlexBackend.DEEPEP,
            source="x",
            sms=8,
            ranks=(8,),
            dispatch_bytes_per_s=(float("inf"),),
            combine_bytes_per_s=(1.0,),
        )
    assert "dispatch_bytes_per_s must be positive numbers" in str(infinite.value)
    link = system_preset("dgx-gb200").node.link
    with pytest.raises(ConfigError) as twice:
        NodeSpec(gpus_per_node=4, link=link, ep_kernels=(GB200_HYBRIDEP, GB200_HYBRIDEP))
    assert "ep_kernels lists a backend twice" in str(twice.value)


def test_shared_expert_overlap_hides_the_exchanges_under_the_shared_experts() -> None:
    """``--moe-shared-expert-overlap``: the shared experts run on their own stream, FC1 and the
    activation beside the dispatch, FC2 beside the combine; backward, FC2's gradients beside the
    combine's (dcombine), FC1's and the activation's beside the dispatch's (ddispatch). Each
    shared-expert task timed 1 s (forward: FC1, activation, FC2; backward: 2 s on FC2's side,
    3 s on FC1's), the exchanges: forward dispatch 0.5 s, combine 2.5 s; backward dcombine 4 s,
    ddispatch 0.5 s. Pairs hide min(2, 0.5) + min(1, 2.5) = 1.5 s of the forward's 3 s (pooled
    they would hide all 3) and min(2, 4) + min(3, 0.5) = 2.5 s of the backward's 4.5 s, from the
    activation-gradient phase first; the compute is unchanged."""
    from blueprinting.synthesizer.stages.portable_plan.ir import BlockCost, PhaseCost
    from blueprinting.synthesizer.stages.portable_plan.passes import (
        SHARED_EXPERT_OPS,
        _shared_expert_overlap,
    )

    model = deepseek_like()
    ir = derive_training_block(model, _mapping(ep=8, dp=8))
    assert ir.moe_block is not None
    exchanges = {"dispatch": 0.5, "combine": 2.5, "dcombine": 4.0, "ddispatch": 0.5}

    def timed(task: object) -> float:
        if isinstance(task, ComputeTask):
            return 1.0 if task.lineage.op in SHARED_EXPERT_OPS else 0.0
        assert isinstance(task, CollectiveTask)
        return exchanges.get(task.id.rsplit(".", 1)[-1], 0.0)

    shared = {
        phase: sum(
            1
            for t in ir.moe_block.compute_tasks()
            if t.lineage.op in SHARED_EXPERT_OPS and t.phase is phase
        )
        for phase in Phase
    }
    assert shared[Phase.FORWARD] == 3
    backward = shared[Phase.BACKWARD_ACTIVATION_GRAD] + shared[Phase.BACKWARD_WEIGHT_GRAD]
    assert backward == 5
    assert {t.id.rsplit(".", 1)[-1] for t in ir.moe_block.collective_tasks() if timed(t)} == set(
        exchanges
    )
    block = BlockCost(
        forward=PhaseCost(compute_s=7.0, ep_comm_s=3.0, ep_comm_exposed_s=3.0),
        backward_activation=PhaseCost(compute_s=9.0, ep_comm_s=4.5, ep_comm_exposed_s=4.5),
        backward_weight=PhaseCost(compute_s=5.0),
    )
    got = _shared_expert_overlap(ir.moe_block, block, timed)
    assert got.forward.ep_comm_exposed_s == 1.5
    assert got.backward_activation.ep_comm_exposed_s == 2.0
    assert got.backward_weight.ep_comm_exposed_s == 0.0
    assert got.forward.compute_s == 7.0 and got.backward_weight.compute_s == 5.0
    assert got.forward.ep_comm_s == 3.0
