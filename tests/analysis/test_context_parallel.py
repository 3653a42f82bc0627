"""Context parallelism end to end: flat keys, laws, the (tp, cp) task graph, its costs, memory
and the data-parallel group (issue 12, items 1-3). Expected values are recomputed here from
``shared/reference/modern_parallelism.md`` sections 1.2-1.6, not read back from the code."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings

from blueprinting.analysis.evaluate import PlanOptions, portable_plan
from blueprinting.analysis.iteration import BubbleSource
from blueprinting.analysis.memory import memory_per_stage
from blueprinting.api import build_spec, plan_spec
from blueprinting.errors import ConfigError, InvalidStrategyError
from blueprinting.hardware.collectives import CollectiveKind as LinkCollective
from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.flat_keys import from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.transformer import (
    AllGatherKV,
    ContextParallel,
    CpCommunication,
    HeadAllToAll,
    HierarchicalAllToAllRing,
    RingExchange,
    TrainingSpec,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    CollectivePurpose,
    SemanticOpName,
    block_ops,
    global_dims,
)
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import CollectiveTask, Phase
from blueprinting.synthesizer.stages.portable_plan.passes import PlanContext
from tests.strategies import lawful_training_specs

# Llama 3 8B shapes (32 heads, 8 KV groups, head dim 128, bf16) at s = 8192.
BASE = {
    "tensor_model_parallel_size": 2,
    "pipeline_model_parallel_size": 1,
    "global_batch_size": 8,
    "micro_batch_size": 1,
    "sequence_parallel": True,
}


def _spec(**keys: object) -> TrainingSpec:
    return build_spec(model="llama3-8b", gpus=keys.pop("gpus", 16), settings={**BASE, **keys})  # type: ignore[arg-type]


def _exchanges(spec: TrainingSpec) -> list[CollectiveTask]:
    ir = derive_training_block(spec.model, spec.mapping)
    return [
        t
        for t in ir.block.collective_tasks()
        if t.purpose is CollectivePurpose.KV_EXCHANGE and t.phase is not Phase.RECOMPUTE
    ]


# M_kv = b (s/cp) (n_kv/t) (d_k + d_v) bytes: 1 * 8192/4 * 4 * 256 * 2 at t = 2, cp = 4.
M_KV = 8192 // 4 * (8 // 2) * 2 * 128 * 2


# ------------------------------------------------------------------------------------------
# Flat keys
# ------------------------------------------------------------------------------------------
def test_flat_keys_read_every_comm_type_and_write_them_back() -> None:
    cases: dict[str, CpCommunication] = {
        "p2p": RingExchange(),
        "all_gather": AllGatherKV(),
        "allgather": AllGatherKV(),  # Megatron's help text; TE's spelling is emitted
        "a2a": HeadAllToAll(),
    }
    for text, expected in cases.items():
        spec = _spec(context_parallel_size=4, cp_comm_type=text)
        assert spec.mapping.parallelism.context == ContextParallel(degree=4, communication=expected)
        assert spec.mapping.data_degree == 2  # 16 / (t 2 * cp 4 * p 1)
        keys = to_mapping(spec)
        assert keys["context_parallel_size"] == 4
        assert keys["cp_comm_type"] == ("all_gather" if text == "allgather" else text)
        assert from_mapping(keys).mapping == spec.mapping
    args = to_megatron_args(_spec(context_parallel_size=4, cp_comm_type="allgather"))
    at = args.index("--context-parallel-size")
    assert args[at : at + 4] == ["--context-parallel-size", "4", "--cp-comm-type", "all_gather"]


def test_hierarchical_sizes_and_per_layer_lists() -> None:
    spec = _spec(
        context_parallel_size=4,
        cp_comm_type="a2a+p2p",
        hierarchical_context_parallel_sizes=[2, 2],
    )
    assert spec.mapping.parallelism.context.communication == HierarchicalAllToAllRing(
        a2a_size=2, p2p_size=2
    )
    args = to_megatron_args(spec)
    at = args.index("--hierarchical-context-parallel-sizes")
    assert args[at : at + 3] == ["--hierarchical-context-parallel-sizes", "2", "2"]
    # one value per layer (32 layers), all the same
    listed = _spec(context_parallel_size=4, cp_comm_type=["p2p"] * 32)
    assert listed.mapping.parallelism.context.communication == RingExchange()


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"cp_comm_type": "p2pp"}, "did you mean 'p2p'?"),
        ({"cp_comm_type": ["p2p"] * 31}, "needs one per layer (num_layers = 32)"),
        ({"cp_comm_type": ["p2p"] * 16 + ["a2a"] * 16}, "per-layer comm types are not modelled"),
        ({"cp_comm_type": "a2a+p2p"}, "needs hierarchical_context_parallel_sizes"),
        ({"hierarchical_context_parallel_sizes": "2 2"}, "is read only with cp_comm_type"),
        ({"hierarchical_context_parallel_sizes": "2 x", "cp_comm_type": "a2a+p2p"}, "'x'"),
    ],
)
def test_bad_cp_keys_are_refused_by_name(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        _spec(context_parallel_size=4, **keys)
    assert message in str(error.value)


def test_world_size_includes_cp() -> None:
    with pytest.raises(InvalidStrategyError) as error:
        _spec(gpus=20, context_parallel_size=4)  # 20 / (2 * 4 * 1) is not integral
    assert "world_size / (t * cp * p)" in str(error.value)


# ------------------------------------------------------------------------------------------
# Laws
# ------------------------------------------------------------------------------------------
def _violated(spec: TrainingSpec) -> set[str]:
    return {v.law for v in check_training(spec.model, spec.mapping)}


def test_cp_laws() -> None:
    assert _violated(_spec(context_parallel_size=4)) == set()
    split = build_spec(
        model="llama3-8b",
        gpus=16,
        settings={**BASE, "sequence_parallel": False, "context_parallel_size": 8},
    )
    assert _violated(split) == set()
    # 8 KV groups over t = 2 leave 4 KV heads per rank: a2a over 8 cp ranks cannot split them
    a2a = build_spec(
        model="llama3-8b",
        gpus=16,
        settings={**BASE, "context_parallel_size": 8, "cp_comm_type": "a2a"},
    )
    assert _violated(a2a) == {"cp_a2a_heads"}
    hier = build_spec(
        model="llama3-8b",
        gpus=16,
        settings={
            **BASE,
            "context_parallel_size": 8,
            "cp_comm_type": "a2a+p2p",
            "hierarchical_context_parallel_sizes": "2 2",
        },
    )
    assert _violated(hier) == {"cp_hierarchical_sizes"}
    unfused = _spec(context_parallel_size=4, attention_backend="unfused")
    assert _violated(unfused) == {"cp_needs_fused_attention"}


def test_the_2cp_split_and_the_sp_split_of_the_sequence() -> None:
    # s = 8200: 8200 mod (2 * 4) = 0 but 8200 / (t 2 * cp 4) = 1025 is integral too; 8196 is
    # neither a multiple of 8 nor of t * cp = 8
    assert _violated(_spec(context_parallel_size=4, seq_length=8200)) == set()
    assert _violated(_spec(context_parallel_size=4, seq_length=8196)) == {
        "cp_sequence_split",
        "local_sequence",
    }
    # without sequence parallelism only the 2cp split is required: 8196 = 8 * 1024 + 4
    plain = _spec(context_parallel_size=2, seq_length=8196, sequence_parallel=False)
    assert _violated(plain) == set()


# ------------------------------------------------------------------------------------------
# The task graph
# ------------------------------------------------------------------------------------------
def test_ring_exchange_tasks() -> None:
    tasks = _exchanges(_spec(context_parallel_size=4, cp_comm_type="p2p"))
    shapes = [(t.phase, str(t.kind), t.axis, t.bytes, t.steps) for t in tasks]
    assert shapes == [
        (Phase.FORWARD, "p2p", "cp", M_KV, 3),
        (Phase.BACKWARD_ACTIVATION_GRAD, "p2p", "cp", 2 * M_KV, 3),
    ]
    # 2 (cp - 1) M_kv in backward, (cp - 1) M_kv in forward
    assert sum(t.total_bytes for t in tasks) == 3 * M_KV + 6 * M_KV


def test_all_gather_and_all_to_all_tasks() -> None:
    gathered = _exchanges(_spec(context_parallel_size=4, cp_comm_type="all_gather"))
    assert [(t.phase, str(t.kind), t.bytes) for t in gathered] == [
        (Phase.FORWARD, "all_gather", 4 * M_KV),
        (Phase.BACKWARD_ACTIVATION_GRAD, "all_gather", 4 * M_KV),
        (Phase.BACKWARD_ACTIVATION_GRAD, "reduce_scatter", 4 * M_KV),
    ]
    spec = build_spec(
        model="llama3-8b",
        gpus=16,
        settings={**BASE, "context_parallel_size": 4, "cp_comm_type": "a2a"},
    )
    q = 8192 // 4 * (32 // 2) * 128 * 2  # b (s/cp) (n_q/t) d bytes
    swapped = _exchanges(spec)
    assert [(t.phase, str(t.kind), t.bytes) for t in swapped] == [
        (Phase.FORWARD, "all_to_all", q + M_KV),  # Q, K, V
        (Phase.FORWARD, "all_to_all", q),  # O
        (Phase.BACKWARD_ACTIVATION_GRAD, "all_to_all", q),  # dO
        (Phase.BACKWARD_ACTIVATION_GRAD, "all_to_all", q + M_KV),  # dQ, dK, dV
    ]


def test_hierarchical_exchange_runs_on_its_two_levels() -> None:
    spec = _spec(
        context_parallel_size=4,
        cp_comm_type="a2a+p2p",
        hierarchical_context_parallel_sizes="2 2",
    )
    ir = derive_training_block(spec.model, spec.mapping)
    assert str(ir.mesh) == "mesh(tp=2, cp=4, cp_a2a=2, cp_p2p=2)"
    tasks = _exchanges(spec)
    forward = [(str(t.kind), t.axis, t.steps) for t in tasks if t.phase is Phase.FORWARD]
    assert forward == [
        ("all_to_all", "cp_a2a", 1),
        ("p2p", "cp_p2p", 1),
        ("all_to_all", "cp_a2a", 1),
    ]


@settings(max_examples=60, deadline=None)
@given(lawful_training_specs())
def test_cp_rank_work_times_shards_equals_global_work(spec: TrainingSpec) -> None:
    """Each (tp, cp) rank does 1/cp of every op's work on the tp axis's split: local x tp
    shards x cp = global, exactly in integers, the causal attention included."""
    mapping = spec.mapping
    # the derivation splits whole KV groups (t > groups replicates them: not a cp concern)
    assume(spec.model.num_query_groups % mapping.tensor_degree == 0)
    ir = derive_training_block(spec.model, mapping)
    cp = mapping.context_degree
    dims = global_dims(spec.model, mapping.batch.micro_batch_size)
    for op in block_ops(spec.model, dims, attention=mapping.attention):
        for phase, work in (
            (Phase.FORWARD, op.forward),
            (Phase.BACKWARD_ACTIVATION_GRAD, op.activation_grad),
            (Phase.BACKWARD_WEIGHT_GRAD, op.weight_grad),
        ):
            tasks = [
                t for t in ir.block.compute_tasks() if t.lineage.op is op.name and t.phase is phase
            ]
            local = sum(t.work.matrix_flops * t.lineage.shards for t in tasks)
            assert local * cp == work.matrix_flops, (op.name, phase)


# ------------------------------------------------------------------------------------------
# Costs
# ------------------------------------------------------------------------------------------
def _attention_s(spec: TrainingSpec, phase: Phase) -> float:
    from blueprinting.synthesizer.stages.portable_plan.passes import work_time

    ir = derive_training_block(spec.model, spec.mapping)
    system = system_preset("dgx-h100")
    (task,) = [
        t
        for t in ir.block.compute_tasks()
        if t.lineage.op is SemanticOpName.CORE_ATTENTION and t.phase is phase
    ]
    return work_time(task.work, task.gemm, system, spec.model.datatype, task.attention)


@pytest.mark.parametrize(
    ("gpus", "ctas"), [(16, 32), (64, 8)]
)  # cp inside one node (NVLink peers: 32 blocks), and cp across nodes (2 x 4 network channels)
def test_cp_comm_exposed_follows_the_ring_overlap(gpus: int, ctas: int) -> None:
    """Each step exposes what its attention chunk does not hide, and the hidden rest slows the
    attention by the SMs NCCL's send / receive kernel holds: ctas / (132 - ctas) of it."""
    system = system_preset("dgx-h100")
    spec = _spec(gpus=gpus, context_parallel_size=4 if gpus == 16 else 16)
    cp = spec.mapping.context_degree
    group = PlanContext(spec=spec, system=system).context_groups()["cp"]
    assert group.size == cp
    assert system.p2p_ring_step_ctas(group) == ctas
    overhead = ctas / (132 - ctas)
    plan = portable_plan(spec, system)
    m_kv = 8192 // cp * 4 * 256 * 2
    expected = 0.0
    for phase, size, field in (
        (Phase.FORWARD, m_kv, plan.block.forward),
        (Phase.BACKWARD_ACTIVATION_GRAD, 2 * m_kv, plan.block.backward_activation),
    ):
        step = system.collective_time(LinkCollective.P2P, size, group)
        unhidden = (cp - 1) * max(0.0, step - _attention_s(spec, phase) / cp)
        exposed = unhidden + overhead * ((cp - 1) * step - unhidden)
        assert field.cp_comm_s == pytest.approx((cp - 1) * step, rel=1e-12)
        assert field.cp_comm_exposed_s == pytest.approx(exposed, rel=1e-12, abs=1e-15)
        expected += exposed
    report = plan_spec(spec, system, PlanOptions(bubble_source=BubbleSource.CONTRACT))
    m = spec.mapping.microbatch_count
    blocks = spec.model.num_layers
    assert report.breakdown.cp_comm_exposed == pytest.approx(m * blocks * expected, rel=1e-12)
    document = report.to_json_dict()
    terms, cp_json = document["time_breakdown_s"], document["cp_comm"]
    assert isinstance(terms, dict) and isinstance(cp_json, dict)
    assert terms["cp_comm_exposed"] == pytest.approx(m * blocks * expected, rel=1e-12)
    iteration = cp_json["iteration"]
    assert isinstance(iteration, dict)
    assert iteration["exposed_s"] == terms["cp_comm_exposed"]
    assert cp_json["degree"] == cp and cp_json["communication"] == "p2p"


def test_all_gather_is_exposed_whole() -> None:
    system = system_preset("dgx-h100")
    spec = _spec(context_parallel_size=4, cp_comm_type="all_gather")
    group = PlanContext(spec=spec, system=system).context_groups()["cp"]
    plan = portable_plan(spec, system)
    gather = system.collective_time(LinkCollective.ALL_GATHER, 4 * M_KV, group)
    scatter = system.collective_time(LinkCollective.REDUCE_SCATTER, 4 * M_KV, group)
    assert plan.block.forward.cp_comm_exposed_s == pytest.approx(gather, rel=1e-12)
    assert plan.block.backward_activation.cp_comm_exposed_s == pytest.approx(
        gather + scatter, rel=1e-12
    )


def test_dense_gradients_reduce_over_d_times_cp() -> None:
    system = system_preset("dgx-h100")
    # d = 1: only cp ranks share the gradients, and they still reduce them
    spec = _spec(gpus=8, context_parallel_size=4, use_distributed_optimizer=True)
    assert spec.mapping.data_degree == 1
    group = PlanContext(spec=spec, system=system).gradient_group()
    assert group.size == 4
    report = plan_spec(spec, system, PlanOptions(bubble_source=BubbleSource.CONTRACT))
    assert report.data_parallel.link_s > 0.0
    memory = memory_per_stage(
        spec.model, spec.mapping, capacity_bytes=10**12, runtime=system.runtime
    )[0]
    without = _spec(gpus=2, use_distributed_optimizer=True)
    plain = memory_per_stage(
        without.model, without.mapping, capacity_bytes=10**12, runtime=system.runtime
    )[0]
    # the distributed optimizer's 12 bytes per parameter shard over d x cp = 4
    assert memory.optimizer_states == -(-plain.optimizer_states // 4)
    assert memory.weights == plain.weights


def test_activations_are_those_of_the_cp_rank_tokens() -> None:
    system = system_preset("dgx-h100")
    # p = 2: stage 0 holds no logits, so its transient is the block backward's working set
    spec = _spec(gpus=16, context_parallel_size=4, pipeline_model_parallel_size=2)
    short = _spec(gpus=4, seq_length=8192 // 4, pipeline_model_parallel_size=2)
    cp_stage = memory_per_stage(
        spec.model, spec.mapping, capacity_bytes=10**12, runtime=system.runtime
    )[0]
    short_stage = memory_per_stage(
        short.model, short.mapping, capacity_bytes=10**12, runtime=system.runtime
    )[0]
    assert cp_stage.activations == short_stage.activations
    # the ring keeps every received K/V chunk of one layer: cp M_kv on top of the working set
    assert cp_stage.transient - short_stage.transient == 4 * M_KV


def test_selective_norm_and_attention_recompute_verifies_under_cp() -> None:
    """Found by the contract test: at t 2 / cp 2, recomputing core_attn and layernorm made the
    verifier read the recomputed attention (fed by the re-gathered K/V, stored) as continuing
    the norm's chain ("consumes S(heads) but the recomp chain holds R"); it starts its own."""
    from blueprinting.api import build_spec, plan_spec

    spec = build_spec(
        model="llama2-7b",
        gpus=4,
        settings={
            "tensor_model_parallel_size": 2,
            "context_parallel_size": 2,
            "recompute_granularity": "selective",
            "recompute_modules": "core_attn layernorm",
            "global_batch_size": 8,
        },
    )
    from blueprinting.synthesizer.dialects.transformer.training_derivation import (
        derive_training_block,
    )
    from blueprinting.synthesizer.stages.distributed.ir import Phase

    block = derive_training_block(spec.model, spec.mapping).block
    # layernorm re-runs both norms; core_attn re-runs the attention behind its K/V ring
    assert [t.id for t in block.tasks if t.phase is Phase.RECOMPUTE] == [
        "recomp.input_norm",
        "recomp.core_attention.cp.p2p.kv",
        "recomp.core_attention",
        "recomp.post_attention_norm",
    ]
    report = plan_spec(spec, "dgx-h100")
    assert report.breakdown.recompute > 0.0
