"""Work conservation, lineage, golden IR text and published FLOP formulas for the TP block."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import InvalidStrategyError, VerificationError
from blueprinting.mapping.model import (
    Datatype,
    EmbeddingTying,
    MlpActivation,
    Normalization,
    PositionEmbedding,
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import (
    AllReduce,
    ForwardOnly,
    FullRecompute,
    NoRecompute,
    PipelineParallel,
    RecomputePolicy,
    ReduceScatterAllGather,
    SelectiveRecompute,
    TransformerTrainingMappingSpec,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    ATTENTION_CORE,
    CollectiveKind,
    CollectivePurpose,
    SemanticOp,
    SemanticOpName,
    Work,
    activation_bytes,
    block_ops,
    eager_passes,
    first_stage_ops,
    global_dims,
    last_stage_ops,
)
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import (
    CollectiveTask,
    ComputeTask,
    DistributedTaskIR,
    Phase,
    TaskGroup,
)
from blueprinting.synthesizer.stages.distributed.passes import (
    PassContext,
    VerifyDistributedTasks,
    print_ir,
)
from tests.synthesizer.models import GPT3_175B, LLAMA2_70B, training_mapping

GOLDEN = Path(__file__).parent / "golden"
PHASE_WORK = (
    (Phase.FORWARD, "forward"),
    (Phase.BACKWARD_ACTIVATION_GRAD, "activation_grad"),
    (Phase.BACKWARD_WEIGHT_GRAD, "weight_grad"),
)


# --------------------------------------------------------------------------------------------
# Hypothesis strategies: valid (model, mapping) pairs
# --------------------------------------------------------------------------------------------
@st.composite
def valid_specs(draw: st.DrawFn) -> tuple[TransformerModelSpec, TransformerTrainingMappingSpec]:
    tp = draw(st.sampled_from([1, 2, 3, 4, 8]))
    sp = tp > 1 and draw(st.booleans())
    groups = tp * draw(st.integers(1, 3))
    heads = groups * draw(st.integers(1, 3))
    seq = draw(st.integers(1, 24)) * (tp if sp else 1) + (0 if sp else draw(st.integers(0, 7)))
    model = TransformerModelSpec(
        name="random",
        num_layers=draw(st.integers(1, 8)),
        hidden_size=draw(st.integers(1, 96)) * 8,
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=draw(st.sampled_from([8, 16, 32, 64])),
        ffn_hidden_size=tp * draw(st.integers(1, 64)),
        seq_length=seq,
        vocab_size=1000,
        padded_vocab_size=tp * draw(st.integers(1, 512)),
        activation=draw(st.sampled_from(MlpActivation)),
        normalization=draw(st.sampled_from(Normalization)),
        position_embedding=draw(st.sampled_from(PositionEmbedding)),
        embeddings=draw(st.sampled_from(EmbeddingTying)),
        add_bias_linear=draw(st.booleans()),
        datatype=draw(st.sampled_from(Datatype)),
    )
    policies: list[RecomputePolicy] = [NoRecompute(), SelectiveRecompute(), FullRecompute()]
    recompute = draw(st.sampled_from(policies))
    mapping = training_mapping(
        tp=tp,
        communication=ReduceScatterAllGather() if sp else AllReduce(),
        recompute=recompute,
        micro_batch=draw(st.integers(1, 4)),
    )
    return model, mapping


def _tasks_of(group: TaskGroup, op: SemanticOpName, phase: Phase) -> list[ComputeTask]:
    return [t for t in group.compute_tasks() if t.lineage.op is op and t.phase is phase]


def _phase_work(op_work: tuple[Work, Work, Work], phase: Phase) -> Work:
    index = [p for p, _ in PHASE_WORK].index(phase)
    return op_work[index]


def _check_conservation(group: TaskGroup, global_ops: tuple[SemanticOp, ...]) -> None:
    for op in global_ops:
        name = op.name
        works = (op.forward, op.activation_grad, op.weight_grad)
        for phase, _ in PHASE_WORK:
            expected = _phase_work(works, phase)
            tasks = _tasks_of(group, name, phase)
            if expected.flops == 0 and expected.bytes_read == 0:
                assert tasks == [], (name, phase)
                continue
            # every semantic op is covered by exactly one local task per phase
            assert len(tasks) == 1, (name, phase, tasks)
            task = tasks[0]
            shards = task.lineage.shards
            assert task.work.matrix_flops * shards == expected.matrix_flops, (name, phase)
            assert task.work.vector_flops * shards == expected.vector_flops, (name, phase)


@settings(max_examples=150, deadline=None)
@given(valid_specs())
def test_local_work_times_shards_equals_global_work(
    spec: tuple[TransformerModelSpec, TransformerTrainingMappingSpec],
) -> None:
    model, mapping = spec
    ir = derive_training_block(model, mapping)
    dims = global_dims(model, mapping.batch.micro_batch_size)
    eager = eager_passes(model, mapping.fusions)
    _check_conservation(ir.block, block_ops(model, dims, attention=mapping.attention, eager=eager))
    _check_conservation(ir.first_stage, first_stage_ops(model, dims))
    _check_conservation(ir.last_stage, last_stage_ops(model, dims))
    # no lineage points at an op that is not in the semantic block
    names = {op.name for op in block_ops(model, dims, attention=mapping.attention, eager=eager)}
    assert {t.lineage.op for t in ir.block.tasks} <= names


@settings(max_examples=150, deadline=None)
@given(valid_specs())
def test_boundaries_have_their_collectives_with_activation_bytes(
    spec: tuple[TransformerModelSpec, TransformerTrainingMappingSpec],
) -> None:
    model, mapping = spec
    ir = derive_training_block(model, mapping)
    tp, sp = mapping.tensor_degree, mapping.sequence_parallel
    size = activation_bytes(model, mapping.batch.micro_batch_size)
    assert size == (
        mapping.batch.micro_batch_size * model.seq_length * model.hidden_size * model.datatype.bytes
    )
    counts = Counter(
        (t.phase, t.kind, t.purpose)
        for t in ir.block.collective_tasks()
        if t.phase is not Phase.RECOMPUTE
    )
    fwd, agrad, wgrad = (
        Phase.FORWARD,
        Phase.BACKWARD_ACTIVATION_GRAD,
        Phase.BACKWARD_WEIGHT_GRAD,
    )
    boundary, regather = CollectivePurpose.BOUNDARY, CollectivePurpose.REGATHER
    ar, rs, ag = CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_GATHER
    if tp == 1:
        assert counts == Counter()
    elif sp:
        assert counts == Counter(
            {
                (fwd, ag, boundary): 2,
                (fwd, rs, boundary): 2,
                (agrad, rs, boundary): 2,
                (agrad, ag, boundary): 2,
                (wgrad, ag, regather): 2,
            }
        )
    else:
        assert counts == Counter({(fwd, ar, boundary): 2, (agrad, ar, boundary): 2})
    for task in ir.block.collective_tasks():
        assert task.bytes == size
        assert ir.mesh.size(task.axis) == tp
    # recompute: full re-runs the forward incl. its collectives, selective only the core
    fw_bytes = ir.block.collective_bytes(Phase.FORWARD)
    recompute_ops = {t.lineage.op for t in ir.block.compute_tasks() if t.phase is Phase.RECOMPUTE}
    match mapping.parallelism.recompute:
        case NoRecompute():
            assert recompute_ops == set()
        case SelectiveRecompute():
            forward = {t.lineage.op for t in ir.block.compute_tasks() if t.phase is Phase.FORWARD}
            # the unfused core's four ops, or the one fused kernel
            assert recompute_ops == forward & ATTENTION_CORE != set()
            assert ir.block.collective_bytes(Phase.RECOMPUTE) == 0
        case FullRecompute():
            assert ir.block.collective_bytes(Phase.RECOMPUTE) == fw_bytes
            assert ir.block.flops(Phase.RECOMPUTE) == ir.block.flops(Phase.FORWARD)
        case _:
            pytest.fail("unexpected recompute policy")
    selected = {t.lineage.op for t in ir.block.compute_tasks() if t.phase is Phase.RECOMPUTE}
    assert ir.block.flops(Phase.RECOMPUTE) == sum(
        t.flops
        for t in ir.block.compute_tasks()
        if t.phase is Phase.FORWARD and t.lineage.op in selected
    )


def test_dependencies_reference_earlier_tasks_only() -> None:
    ir = derive_training_block(
        GPT3_175B,
        training_mapping(tp=8, communication=ReduceScatterAllGather(), recompute=FullRecompute()),
    )
    for group in ir.groups:
        seen: set[str] = set()
        for task in group.tasks:
            assert set(task.deps) <= seen, task.id
            seen.add(task.id)
    # backward of the recomputed block starts after the recomputed forward
    first_backward = next(t for t in ir.block.tasks if t.phase is Phase.BACKWARD_ACTIVATION_GRAD)
    assert first_backward.deps == ("recomp.mlp_residual",)


def _without(ir: DistributedTaskIR, task_id: str) -> DistributedTaskIR:
    tasks = tuple(t for t in ir.block.tasks if t.id != task_id)
    block = TaskGroup(name="block", tasks=tuple(_drop_dep(t, task_id) for t in tasks))
    return DistributedTaskIR(
        mesh=ir.mesh,
        strategy=ir.strategy,
        model=ir.model,
        micro_batch=ir.micro_batch,
        seq_length=ir.seq_length,
        block=block,
        first_stage=ir.first_stage,
        last_stage=ir.last_stage,
    )


def _drop_dep(task: ComputeTask | CollectiveTask, dep: str) -> ComputeTask | CollectiveTask:
    from dataclasses import replace

    return replace(task, deps=tuple(d for d in task.deps if d != dep))


@pytest.mark.parametrize(
    ("communication", "missing", "message"),
    [
        (
            AllReduce(),
            "fwd.output_projection.all_reduce",
            "block/fwd.attention_residual: consumes R but the fwd chain holds P",
        ),
        (
            ReduceScatterAllGather(),
            "fwd.mlp_up.all_gather",
            "block/fwd.mlp_up: consumes R but the fwd chain holds S(seq)",
        ),
        (
            ReduceScatterAllGather(),
            "agrad.qkv_projection.reduce_scatter",
            "block/agrad.input_norm: consumes S(seq) but the agrad chain holds P",
        ),
    ],
)
def test_verifier_rejects_a_missing_boundary_collective(
    communication: AllReduce | ReduceScatterAllGather, missing: str, message: str
) -> None:
    ir = derive_training_block(GPT3_175B, training_mapping(tp=8, communication=communication))
    broken = _without(ir, missing)
    with pytest.raises(VerificationError) as info:
        VerifyDistributedTasks().run(broken, PassContext())
    assert str(info.value).splitlines()[1:] == [f"  - {message}"]


def test_verifier_rejects_unknown_dependency() -> None:
    ir = derive_training_block(GPT3_175B, training_mapping(tp=8))
    first = ir.block.tasks[0]
    assert isinstance(first, ComputeTask)
    from dataclasses import replace

    bad = replace(ir, block=TaskGroup(name="block", tasks=(replace(first, deps=("ghost",)),)))
    with pytest.raises(VerificationError, match="depends on unknown 'ghost'"):
        VerifyDistributedTasks().run(bad, PassContext())


def test_invalid_strategy_lists_every_violated_law() -> None:
    model = TransformerModelSpec(
        name="odd",
        num_layers=2,
        hidden_size=96,
        num_attention_heads=6,
        num_query_groups=3,
        kv_channels=16,
        ffn_hidden_size=102,
        seq_length=30,
        vocab_size=50,
        padded_vocab_size=50,
    )
    mapping = training_mapping(tp=4, communication=ReduceScatterAllGather())
    bad = TransformerTrainingMappingSpec(
        parallelism=type(mapping.parallelism)(
            tensor=mapping.parallelism.tensor,
            pipeline=PipelineParallel(degree=1, schedule=ForwardOnly()),
            data=mapping.parallelism.data,
        ),
        batch=mapping.batch,
    )
    with pytest.raises(InvalidStrategyError) as info:
        derive_training_block(model, bad)
    assert [v.law for v in info.value.violations] == [
        "training_schedule",
        "tp_divides_heads",
        "tp_divides_query_groups",
        "tp_divides_ffn",
        "tp_divides_padded_vocab",
        "sequence_parallel_divides_sequence",
    ]
    assert str(info.value).splitlines()[0] == ("checking local TP block of odd: 6 law(s) violated:")
    assert str(info.value).splitlines()[2] == (
        "  - [planner] tp_divides_heads: num_attention_heads=6 is not divisible by tensor_degree=4"
    )


# --------------------------------------------------------------------------------------------
# Golden IR text
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("filename", "communication"),
    [
        ("gpt3_175b_tp8_ar.txt", AllReduce()),
        ("gpt3_175b_tp8_sp.txt", ReduceScatterAllGather()),
    ],
)
def test_golden_ir_text(filename: str, communication: AllReduce | ReduceScatterAllGather) -> None:
    text = print_ir(
        derive_training_block(GPT3_175B, training_mapping(tp=8, communication=communication, pp=8))
    )
    path = GOLDEN / filename
    if os.environ.get("BLUEPRINTING_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


# --------------------------------------------------------------------------------------------
# Published FLOP formulas
# --------------------------------------------------------------------------------------------
def _training_matrix_flops(ir: DistributedTaskIR, model: TransformerModelSpec) -> int:
    """Whole-model matrix FLOPs of one microbatch over all tp ranks (no recompute)."""
    phases = [p for p, _ in PHASE_WORK]
    per_rank = model.num_layers * sum(ir.block.matrix_flops(p) for p in phases) + sum(
        ir.last_stage.matrix_flops(p) for p in phases
    )
    return per_rank * ir.tp


@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("batch", [1, 4])
def test_gpt3_matches_narayanan_equation_3_without_recompute(tp: int, batch: int) -> None:
    """Narayanan et al. 2021, Section 5.1, Eq. 3 counts 96 B s L h^2 (...) with recompute (4
    forward passes); without it (3 passes) it is 72 B s L h^2 (1 + s/6h + V/12Lh)."""
    m = GPT3_175B
    ir = derive_training_block(m, training_mapping(tp=tp, micro_batch=batch))
    b, s, layers, h, v = batch, m.seq_length, m.num_layers, m.hidden_size, m.padded_vocab_size
    expected = 72 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    assert _training_matrix_flops(ir, m) == pytest.approx(expected, rel=1e-14)


def test_gpt3_with_full_recompute_matches_equation_3() -> None:
    m = GPT3_175B
    ir = derive_training_block(m, training_mapping(tp=8, recompute=FullRecompute()))
    b, s, layers, h, v = 1, m.seq_length, m.num_layers, m.hidden_size, m.padded_vocab_size
    recompute = m.num_layers * ir.block.matrix_flops(Phase.RECOMPUTE) * ir.tp
    total = _training_matrix_flops(ir, m) + recompute
    # Eq. 3 as published: the blocks run 4 passes, the LM head 3 (its V/(16Lh) term).
    expected = 96 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))
    assert total == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("tp", [1, 8])
def test_llama2_70b_matches_6n_plus_attention(tp: int) -> None:
    """Kaplan et al. 2020 / Hoffmann et al. 2022: 6 N FLOPs per token for the matmul weights N
    (no embedding lookup, norms), plus the attention matmuls: 12 L s (heads * kv_channels) per
    token (two batched matmuls of 2 s d per head forward, times three passes)."""
    m = LLAMA2_70B
    ir = derive_training_block(m, training_mapping(tp=tp, communication=ReduceScatterAllGather()))
    tokens = m.seq_length
    matmul_params = (
        m.num_parameters - m.embedding_parameters - (2 * m.num_layers + 1) * m.norm_parameters
    )
    expected = tokens * (
        6 * matmul_params + 12 * m.num_layers * m.seq_length * m.query_projection_size
    )
    assert _training_matrix_flops(ir, m) == pytest.approx(expected, rel=1e-14)
    assert m.is_gqa


def test_llama_block_shapes() -> None:
    ir = derive_training_block(LLAMA2_70B, training_mapping(tp=8))
    shapes = {
        t.lineage.op: str(t.gemm)
        for t in ir.block.compute_tasks()
        if t.phase is Phase.FORWARD and t.gemm
    }
    assert shapes == {
        SemanticOpName.QKV_PROJECTION: "[4096,8192]x[8192,1280]",  # (8 q + 2 kv) heads x 128
        SemanticOpName.ATTENTION_SCORES: "8x[4096,128]x[128,4096]",
        SemanticOpName.ATTENTION_OVER_VALUES: "8x[4096,4096]x[4096,128]",
        SemanticOpName.OUTPUT_PROJECTION: "[4096,1024]x[1024,8192]",
        SemanticOpName.MLP_UP: "[4096,8192]x[8192,7168]",  # gate + up, 2 x 28672 / 8
        SemanticOpName.MLP_DOWN: "[4096,3584]x[3584,8192]",
    }
