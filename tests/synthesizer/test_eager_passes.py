"""The eager PyTorch chains Megatron runs where no fused kernel applies (issue 13): the unfused
RoPE of a YaRN model, the clamp before GPT-OSS's GLU and the experts' per-expert FC2 bias
loop (``training.eager_passes``). Byte counts are the docstrings' per-element counts on the
gpt-oss-120b preset at micro-batch 1, s = 4096, EP 8 (16 local experts of 1,024 rows)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from blueprinting.analysis.evaluate import PlanOptions
from blueprinting.analysis.memory import moe_ffn_activation_bytes
from blueprinting.api import plan_spec
from blueprinting.errors import ConfigError
from blueprinting.mapping.flat_keys import from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.model import PositionEmbedding
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AllToAllDispatcher,
    BatchSpec,
    DataParallel,
    DistributedOptimizer,
    ExpertParallel,
    FlexBackend,
    FlexDispatcher,
    KernelFusions,
    NoRecompute,
    PipelineParallel,
    RecomputeModule,
    SelectiveRecompute,
    SingleStage,
    TensorParallel,
    TrainingSpec,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    CLAMP_LAUNCHES,
    ROPE_LAUNCHES,
    EagerPasses,
    SemanticOp,
    SemanticOpName,
    block_ops,
    eager_passes,
    expert_dims,
    local_dims,
)
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import ComputeTask, Phase
from blueprinting.synthesizer.stages.portable_plan.host_dispatch import host_ops
from blueprinting.validation.modern_moe import load_moe_runs

GPT_OSS = model_preset("gpt-oss-120b")
S = 4096
E = 2  # bf16
ALL = EagerPasses(rope=True, activation_clamp=True, expert_bias=True)


def _mapping(
    *, fusions: KernelFusions | None = None, modules: frozenset[RecomputeModule] = frozenset()
) -> TransformerTrainingMappingSpec:
    return TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(degree=1),
            pipeline=PipelineParallel(degree=1, schedule=SingleStage()),
            data=DataParallel(degree=8, optimizer_sharding=DistributedOptimizer()),
            experts=ExpertParallel(degree=8, dispatcher=AllToAllDispatcher()),
            recompute=SelectiveRecompute(modules=modules) if modules else NoRecompute(),
        ),
        batch=BatchSpec(global_batch_size=8, micro_batch_size=1),
        fusions=fusions or KernelFusions(),
    )


def _ops(experts: ExpertParallel | None = None) -> dict[SemanticOpName, SemanticOp]:
    dims = local_dims(GPT_OSS, 1, tp=1, sequence_parallel=False)
    ex = expert_dims(GPT_OSS, dims, experts or ExpertParallel(degree=8), tp=1)
    ops = block_ops(GPT_OSS, dims, attention=_mapping().attention, experts=ex, eager=ALL)
    return {op.name: op for op in ops}


# ---- Megatron's rules ----------------------------------------------------------------------
def test_gpt_oss_runs_all_three_chains_and_the_op_fuser_keeps_only_rope() -> None:
    assert GPT_OSS.position_embedding is PositionEmbedding.YARN
    assert GPT_OSS.activation_func_clamp_value == 7.0
    assert eager_passes(GPT_OSS, KernelFusions()) == ALL
    # apply_rope_fusion = true does not help YaRN (Megatron turns it off unless rope)
    fuser = KernelFusions(apply_rope_fusion=True, use_transformer_engine_op_fuser=True)
    assert eager_passes(GPT_OSS, fuser) == EagerPasses(rope=True)


def test_rope_models_run_the_fused_kernel_unless_told_not_to() -> None:
    llama = model_preset("llama3-70b")
    assert eager_passes(llama, KernelFusions()) == EagerPasses()
    assert eager_passes(llama, KernelFusions(apply_rope_fusion=False)) == EagerPasses(rope=True)
    # MLA applies its rotary part in its up projection: no separate op
    deepseek = model_preset("deepseek-v3")
    assert eager_passes(deepseek, KernelFusions(apply_rope_fusion=False)) == EagerPasses()
    # a clamp needs a GLU and the bias loop linear biases
    plain = replace(GPT_OSS, add_bias_linear=False, activation_func_clamp_value=None)
    assert eager_passes(plain, KernelFusions()) == EagerPasses(rope=True)


# ---- the byte counts -----------------------------------------------------------------------
def test_the_rotary_op_moves_the_counted_bytes_of_q_and_k() -> None:
    op = _ops()[SemanticOpName.ROTARY_EMBEDDING]
    n = S * (64 + 8) * 64  # Q and K elements
    assert (op.forward.bytes_read, op.forward.bytes_written) == (13 * n, 11 * n)  # x e/2, e=2
    assert (op.activation_grad.bytes_read, op.activation_grad.bytes_written) == (15 * n, 13 * n)
    assert op.launches == (2 * ROPE_LAUNCHES[0], 2 * ROPE_LAUNCHES[1]) == (24, 14)


def test_the_clamp_moves_the_fc1_output_four_times_forward() -> None:
    op = _ops()[SemanticOpName.EXPERT_ACTIVATION_CLAMP]
    n = 16 * 1024 * 2880  # per half of the [R, 2F] FC1 output
    assert (op.forward.bytes_read, op.forward.bytes_written) == (4 * n * E, 4 * n * E)
    assert op.activation_grad.bytes_read == n * (7 * E + 4)
    assert op.activation_grad.bytes_written == n * (4 * E + 4)
    assert op.launches == CLAMP_LAUNCHES == (3, 9)


def test_the_bias_loop_runs_per_expert_and_fc2_adds_no_bias() -> None:
    ops = _ops()
    op = ops[SemanticOpName.EXPERT_BIAS]
    rows, g, h = 16 * 1024, 16, 2880
    n = rows * h
    assert op.forward.bytes_read == (3 * n + g * h + rows) * E
    assert op.forward.bytes_written == 3 * n * E
    assert op.activation_grad.bytes_read == (5 * n + 2 * rows) * E
    assert op.activation_grad.bytes_written == (3 * n + g * h + 2 * rows) * E
    assert op.launches == (2 * g + 1, 4 * g + 2) == (33, 66)
    # skip_bias_add: the grouped GEMM neither adds nor reads the bias
    fc2 = ops[SemanticOpName.EXPERT_FC2]
    assert fc2.forward.vector_flops == 0 and fc2.weight_grad.vector_flops == 0
    assert ops[SemanticOpName.EXPERT_FC1].forward.vector_flops == rows * 2 * 2880


def test_the_flex_dispatchers_fp32_probabilities_promote_the_bias_loop() -> None:
    """HybridEP / DeepEP / NCCL-EP cast the routing probabilities to fp32 (Megatron-LM
    @d98e8a64 ``moe/token_dispatcher.py`` l.1135-1141, 1312-1318, 1715-1718): ``t + b * p`` runs
    in fp32 and ``.to`` casts the output back. Forward 28 N bytes (14 N read, 14 N written)
    against 12 N, backward 40 N against 16 N (N = rows x h elements; plus the bias and the
    probabilities), one more launch forward, 1 + g backward."""
    op = _ops(ExpertParallel(degree=8, dispatcher=FlexDispatcher(backend=FlexBackend.HYBRIDEP)))[
        SemanticOpName.EXPERT_BIAS
    ]
    rows, g, h = 16 * 1024, 16, 2880
    n = rows * h
    assert op.forward.bytes_read == 14 * n + g * h * E + rows * 4
    assert op.forward.bytes_written == 14 * n
    assert op.activation_grad.bytes_read == 24 * n + 2 * rows * 4
    assert op.activation_grad.bytes_written == 16 * n + g * h * E + 2 * rows * 4
    assert op.launches == (34, 83)
    # the alltoall dispatcher's probabilities are the router's bf16: no promotion
    assert _ops()[SemanticOpName.EXPERT_BIAS].forward.bytes_written == 3 * n * E


# ---- lowering, host, recompute, memory -----------------------------------------------------
def test_the_host_issues_one_op_per_kernel_of_a_chain() -> None:
    moe_block = derive_training_block(GPT_OSS, _mapping()).moe_block
    assert moe_block is not None

    def task(op: SemanticOpName, phase: Phase) -> ComputeTask:
        (found,) = [t for t in moe_block.compute_tasks() if t.lineage.op is op and t.phase is phase]
        return found

    bias = SemanticOpName.EXPERT_BIAS
    assert host_ops(task(bias, Phase.FORWARD)) == 33
    assert host_ops(task(bias, Phase.BACKWARD_ACTIVATION_GRAD)) == 66
    rope = SemanticOpName.ROTARY_EMBEDDING
    assert host_ops(task(rope, Phase.FORWARD)) == 24
    assert host_ops(task(SemanticOpName.EXPERT_ACTIVATION, Phase.FORWARD)) == 1


def test_moe_act_recomputes_the_clamp_with_the_activation() -> None:
    ir = derive_training_block(GPT_OSS, _mapping(modules=frozenset({RecomputeModule.MOE_ACT})))
    assert ir.moe_block is not None
    again = [t.lineage.op for t in ir.moe_block.compute_tasks() if t.phase is Phase.RECOMPUTE]
    assert again == [SemanticOpName.EXPERT_ACTIVATION_CLAMP, SemanticOpName.EXPERT_ACTIVATION]


def test_the_clamp_stores_a_second_fc1_output_unless_moe_act_is_recomputed() -> None:
    def stored(eager: EagerPasses, recomputed: frozenset[RecomputeModule]) -> int:
        return moe_ffn_activation_bytes(
            GPT_OSS,
            micro_batch=1,
            tensor_degree=1,
            sequence_parallel=False,
            experts=ExpertParallel(degree=8),
            activation_bytes=E,
            recomputed=recomputed,
            eager=eager,
        )

    received = 4 * S  # k T rows, balanced
    none: frozenset[RecomputeModule] = frozenset()
    act = frozenset({RecomputeModule.MOE_ACT})
    assert stored(ALL, none) - stored(EagerPasses(), none) == received * 2 * 2880 * E
    assert stored(ALL, act) == stored(EagerPasses(), act)


# ---- keys ----------------------------------------------------------------------------------
_KEYS = {
    "world_size": 8,
    "expert_model_parallel_size": 8,
    "micro_batch_size": 1,
    "global_batch_size": 8,
    "use_distributed_optimizer": True,
}


def test_the_keys_round_trip_and_reach_megatrons_flags() -> None:
    spec = from_mapping(
        {
            **_KEYS,
            "apply_rope_fusion": False,
            "use_transformer_engine_op_fuser": True,
            "activation_func_clamp_value": 5.5,
        },
        model=GPT_OSS,
    )
    assert spec.mapping.fusions == KernelFusions(
        apply_rope_fusion=False, use_transformer_engine_op_fuser=True
    )
    assert spec.model.activation_func_clamp_value == 5.5
    keys = to_mapping(spec)
    assert keys["apply_rope_fusion"] is False
    assert keys["use_transformer_engine_op_fuser"] is True
    assert keys["activation_func_clamp_value"] == 5.5
    assert keys["position_embedding_type"] == "yarn"
    assert from_mapping(keys) == spec
    args = " ".join(to_megatron_args(spec))
    assert "--no-rope-fusion" in args and "--use-transformer-engine-op-fuser" in args
    assert "--activation-func-clamp-value 5.5" in args
    assert "--position-embedding-type yarn" in args
    # the defaults are written nowhere
    default = from_mapping(_KEYS, model=GPT_OSS)
    assert default.mapping.fusions == KernelFusions()
    assert "apply_rope_fusion" not in to_mapping(default)
    assert "use_transformer_engine_op_fuser" not in to_mapping(default)


@pytest.mark.parametrize("value", [0, -7.0, float("inf")])
def test_a_clamp_value_must_be_a_positive_number(value: float) -> None:
    with pytest.raises(ConfigError, match="activation_func_clamp_value"):
        from_mapping({**_KEYS, "activation_func_clamp_value": value}, model=GPT_OSS)


def test_the_op_fuser_saves_the_clamp_and_bias_time_on_a_26_04_row() -> None:
    """GB200, EP64, moe_act recompute, HybridEP (the 26.04 recipe): the clamp (run twice
    forward) and the bias loop, in fp32 beside HybridEP's fp32 probabilities, cost 0.61 s of the
    3.12 s predicted iteration (0.42 s of 3.02 s with the alltoall dispatcher's bf16
    probabilities); a model (HBM roofline), so a stated band."""
    run_id = "mbridge_26.04_pretrain_gpt_oss_120b_gb200_n64_bf16_gbs1280"
    run = next(r for r in load_moe_runs() if r.id == run_id)
    spec = run.training_spec()
    fusions = replace(spec.mapping.fusions, use_transformer_engine_op_fuser=True)
    fused = replace(spec, mapping=replace(spec.mapping, fusions=fusions))

    def time(s: TrainingSpec) -> float:
        # the recipe's TE cross-entropy breaks a Megatron-LM rule it waives (the fixture)
        return plan_spec(s, run.system, PlanOptions(megatron_rules=False)).iteration_time_s

    saved = time(spec) - time(fused)
    assert 0.5 <= saved <= 0.7
